-- sluice gcra (exact). KEYS, ARGV and the reply: lua/README.md.
-- Validate every argument, read everything, decide, and only then write:
-- Redis never rolls a script back, so an error must come before any write.

-- The policy's function: sluice registers it (lua/README.md, "Libraries"),
-- with the policy's numbers, the `P_` locals, written above this file.
-- `redis` is Redis, or a read-only (lua/peek.lua) or deferring
-- (lua/several.lua) stand-in for it.
--
-- Per band, the emission interval, the tolerance and the delay (us) follow
-- from the policy's numbers alone: worked out on the library's first call
-- and kept for every call after it (three tables a call cost Redis about
-- 3% of a decision).
local intervals, tolerances, waits = nil, nil, nil

local function decide(redis, KEYS, ARGV)
  local id, cost, record_key, record_life, first, overtakable = arguments(KEYS, ARGV)
  local bands = P_BANDS

  -- Per band: limit, window_us, burst, max_wait_us (the policy's delay).
  local args = band_args(KEYS, 2, 4, P_BAND_ARGS, bands)
  if not intervals then
    -- Kept only once whole: a failure leaves nothing half made.
    local interval, tolerance, wait = {}, {}, {}
    for b = 1, bands do
      local l, w, burst = args[4 * b - 3], args[4 * b - 2], args[4 * b - 1]
      wait[b] = args[4 * b]
      -- Rounded up: rounding can only ever admit less. (`%` floors as
      -- math.floor does, without a C call: whole numbers below 2^53.)
      local span = w + l - 1
      interval[b] = (span - span % l) / l
      if burst * interval[b] > MAX_EXACT then
        fail('burst * emission interval exceeds 2^53')
      end
      tolerance[b] = burst * interval[b]
    end
    intervals, tolerances, waits = interval, tolerance, wait
  end
  local interval, tolerance, wait = intervals, tolerances, waits
  for b = 1, bands do
    if cost > args[4 * b - 1] then
      fail('cost above the policy maximum')
    end
  end

  -- State, one string: `t:a1:a2...`; t = last write (us), a<b> = theoretical
  -- arrival time (us).
  local per_band = 1
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
    local t, tau = interval[b], tolerance[b]
    local tat0 = state[1 + b] or now
    if tat0 < now then
      tat0 = now
    end
    local new_tat = tat0 + cost * t
    -- Past the burst but within the delay: admitted, told to wait. What is
    -- left is the room under the tolerance, in whole intervals.
    local allowed = new_tat - now <= tau + wait[b]
    local room = tau - ((allowed and new_tat or tat0) - now)
    if room < 0 then
      room = 0
    end
    local remaining = (room - room % t) / t
    if allowed then
      local delay = new_tat - now - tau
      decision = verdict(verdicts, b, true, remaining, new_tat - now, delay > 0 and delay or 0)
    else
      decision = verdict(verdicts, b, false, remaining, tat0 - now, new_tat - now - tau - wait[b])
    end
    state[1 + b] = new_tat
  end

  -- The record, and the state when admitted (lua/state.lua, `settle`): a
  -- denied request writes nothing to any band, and a first send its own
  -- retry overtook replays that one's decision.
  return settle(redis, KEYS[1], record_key, first, overtakable, id,
    decision or bind(verdicts), now, skew, state, n, raw, at, expires,
    record_life or P_DEDUPE_WINDOW_TEXT, P_STATE_FORMATS, P_TTL_TEXT)
end
