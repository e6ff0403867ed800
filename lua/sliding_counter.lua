-- sluice sliding-counter (approximate). KEYS, ARGV and the reply:
-- lua/README.md. Validate every argument, read everything, decide, and
-- only then write: Redis never rolls a script back.

-- The policy's function: sluice registers it (lua/README.md, "Libraries"),
-- with the policy's numbers, the `P_` locals, written above this file.
-- `redis` is Redis, or a read-only (lua/peek.lua) or deferring
-- (lua/several.lua) stand-in for it.
local function decide(redis, KEYS, ARGV)
  local id, cost, record_key, record_life, first, overtakable = arguments(KEYS, ARGV)
  local bands = P_BANDS

  -- Per band: limit, window_us (a whole number of milliseconds).
  local args = band_args(KEYS, 2, 2, P_BAND_ARGS, bands)
  for b = 1, bands do
    local limit, w = args[2 * b - 1], args[2 * b]
    if w % 1000 ~= 0 then
      fail('window is not whole milliseconds')
    end
    -- prev * window_ms must stay exact.
    if limit * (w / 1000) > MAX_EXACT then
      fail('limit * window_ms exceeds 2^53')
    end
    if cost > limit then
      fail('cost above the policy maximum')
    end
  end

  -- State, one string: `t:s1:c1:p1:s2:c2:p2...`; t = last write (us), s<b> =
  -- window start, c<b> = current window's count, p<b> = previous window's
  -- count.
  local per_band = 3
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
    local s, c, p = 3 * b - 1, 3 * b, 3 * b + 1
    local start = state[s]
    local cur = state[c] or 0
    local prev = state[p] or 0
    local l, w = args[2 * b - 1], args[2 * b]
    local ws = now - now % w
    if start == ws then
      -- same window: keep both counts
    elseif start == ws - w then
      prev = cur
      cur = 0
    else
      prev = 0
      cur = 0
    end
    local w_ms = w / 1000
    -- (`%` floors as math.floor does, without a C call.)
    local e_ms = (now - ws - (now - ws) % 1000) / 1000
    local est = cur + math.floor(prev * (w_ms - e_ms) / w_ms)
    local allowed = est + cost <= l
    local remaining = allowed and l - est - cost or (l > est and l - est or 0)
    local cur_after = allowed and cur + cost or cur
    local reset = 0
    if cur_after > 0 then
      reset = ws + 2 * w - now
    elseif prev > 0 then
      reset = ws + w - now
    end
    local retry = 0
    if not allowed then
      -- The first whole millisecond at which the fading window's weight
      -- leaves room for this cost: later in this window, or in the next.
      local room, base, fading
      if cur + cost <= l then
        room, base, fading = l - cur - cost, ws, prev
      else
        room, base, fading = l - cost, ws + w, cur
      end
      local e2 = 0
      if fading > 0 then
        e2 = math.max(0, w_ms - math.floor(((room + 1) * w_ms - 1) / fading))
      end
      retry = base + e2 * 1000 - now
    end
    decision = verdict(verdicts, b, allowed, remaining, reset, retry)
    state[s] = ws
    state[c] = cur_after
    state[p] = prev
  end

  -- The record, and the state when admitted (lua/state.lua, `settle`): a
  -- denied request writes nothing to any band, and a first send its own
  -- retry overtook replays that one's decision.
  return settle(redis, KEYS[1], record_key, first, overtakable, id,
    decision or bind(verdicts), now, skew, state, n, raw, at, expires,
    record_life or P_DEDUPE_WINDOW_TEXT, P_STATE_FORMATS, P_TTL_TEXT)
end
