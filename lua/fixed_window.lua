-- sluice fixed-window. KEYS, ARGV and the reply: lua/README.md.
-- Validate every argument, read everything, decide, and only then write:
-- Redis never rolls a script back, so an error must come before any write.

-- The policy's function: sluice registers it (lua/README.md, "Libraries"),
-- with the policy's numbers, the `P_` locals, written above this file.
-- `redis` is Redis, or a read-only (lua/peek.lua) or deferring
-- (lua/several.lua) stand-in for it.
local function decide(redis, KEYS, ARGV)
  local id, cost, record_key, record_life, first, overtakable = arguments(KEYS, ARGV)
  local bands = P_BANDS

  -- Per band: limit, window_us.
  local args = band_args(KEYS, 2, 2, P_BAND_ARGS, bands)
  for b = 1, bands do
    if cost > args[2 * b - 1] then
      fail('cost above the policy maximum')
    end
  end

  -- State, one string: `t:s1:c1:s2:c2...`; t = last write (us), s<b> =
  -- window start, c<b> = count.
  local per_band = 2
  local n = 1 + bands * per_band
  local raw = redis.call('GET', KEYS[1])
  local state, at, expires = read_state(raw, n, per_band, P_STATE_PATTERN, P_STATE_BLANK)
  -- A first attempt has no record to find (lua/common.lua, "De-duplication").
  if not first then
    local replayed = recorded(raw, at, id, record_key)
    if replayed then
      return replayed
    end
  end
  local now, skew = decision_time(state[1] or 0, P_MAX_REGRESSION_US)
  if not now then
    return clock_unsafe(skew)
  end

  -- The new state is written over the old, in place, in order.
  state[1] = now
  local verdicts = bands > 1 and {} or nil
  local decision = nil
  for b = 1, bands do
    local s, c = 2 * b, 2 * b + 1
    local start = state[s]
    local count = state[c] or 0
    local limit, w = args[2 * b - 1], args[2 * b]
    local ws = now - now % w
    if start ~= ws then
      count = 0
    end
    local allowed = count + cost <= limit
    local after = allowed and count + cost or count
    local reset = ws + w - now
    -- A count above the limit is a limit lowered under a kept count.
    decision = verdict(verdicts, b, allowed, limit > after and limit - after or 0, reset,
      allowed and 0 or reset)
    state[s] = ws
    state[c] = after
  end

  -- The record, and the state when admitted (lua/state.lua, `settle`): a
  -- denied request writes nothing to any band, and a first send its own
  -- retry overtook replays that one's decision.
  return settle(redis, KEYS[1], record_key, first, overtakable, id,
    decision or bind(verdicts), now, skew, state, n, raw, at, expires,
    record_life or P_DEDUPE_WINDOW_TEXT, P_STATE_FORMATS, P_TTL_TEXT)
end
