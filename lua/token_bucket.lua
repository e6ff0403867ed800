-- sluice token-bucket (exact, whole-period refill). KEYS, ARGV and the
-- reply: lua/README.md. Validate every argument, read everything, decide,
-- and only then write: Redis never rolls a script back.

-- Whole numbers below 2^53 and b > 0: `n % b` floors as math.floor does,
-- without a C call (about 500 instructions in Redis each).
local function ceil_div(a, b)
  local n = a + b - 1
  return (n - n % b) / b
end

-- The policy's function: sluice registers it (lua/README.md, "Libraries"),
-- with the policy's numbers, the `P_` locals, written above this file.
-- `redis` is Redis, or a read-only (lua/peek.lua) or deferring
-- (lua/several.lua) stand-in for it.
local function decide(redis, KEYS, ARGV)
  local id, cost, record_key, record_life, first, overtakable = arguments(KEYS, ARGV)
  local bands = P_BANDS

  -- Per band: capacity, refill_tokens, refill_every_us, max_wait_us (the
  -- policy's delay).
  local args = band_args(KEYS, 2, 4, P_BAND_ARGS, bands)
  for b = 1, bands do
    local capacity, period = args[4 * b - 3], args[4 * b - 1]
    -- Bounds last + periods * period while the bucket is not full.
    if capacity * period > MAX_EXACT then
      fail('capacity * refill_every exceeds 2^53')
    end
    if cost > capacity then
      fail('cost above the policy maximum')
    end
  end

  -- State, one string: `t:k1:l1:k2:l2...`; t = last write (us), k<b> =
  -- tokens, l<b> = time of the last whole refill period.
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
    local k, l = 2 * b, 2 * b + 1
    local c, r, p, wait = args[4 * b - 3], args[4 * b - 2], args[4 * b - 1], args[4 * b]
    local tokens = state[k]
    local last = state[l]
    if not tokens or not last then
      tokens, last = c, now
    end
    -- A stamp past now (tokens taken ahead) refills nothing until then.
    local since = now > last and now - last or 0
    local periods = (since - since % p) / p
    -- periods * r may pass 2^53 and lose precision, but only when it is far
    -- beyond the capacity, which the cap absorbs.
    tokens = tokens + periods * r
    if tokens > c then
      tokens = c
    end
    if tokens == c then
      last = now
    else
      last = last + periods * p
    end
    -- With a delay, tokens that come within `wait` are taken ahead: the
    -- stamp moves past now and the request waits for them.
    local enough = tokens >= cost
    local ahead = 0
    if not enough then
      ahead = ceil_div(cost - tokens, r)
    end
    local ready = last + ahead * p - now
    if ready < 0 then
      ready = 0
    end
    local filled = tokens + ahead * r
    if filled > c then
      filled = c
    end
    local taken_ahead = not enough and wait > 0 and ready <= wait and filled >= cost
    local allowed = enough or taken_ahead
    if taken_ahead then
      tokens = filled
      last = last + ahead * p
    end
    local after = allowed and tokens - cost or tokens
    local reset = 0
    if after < c then
      reset = last + ceil_div(c - after, r) * p - now
    end
    -- Without a delay nothing is taken ahead: a stamp past now is a clock
    -- gone back, and waits for nothing.
    local retry = 0
    if not allowed then
      retry = ready > wait and ready - wait or 0
    elseif wait > 0 then
      retry = ready
    end
    decision = verdict(verdicts, b, allowed, after, reset, retry)
    state[k] = after
    state[l] = last
  end

  -- The record, and the state when admitted (lua/state.lua, `settle`): a
  -- denied request writes nothing to any band, and a first send its own
  -- retry overtook replays that one's decision.
  return settle(redis, KEYS[1], record_key, first, overtakable, id,
    decision or bind(verdicts), now, skew, state, n, raw, at, expires,
    record_life or P_DEDUPE_WINDOW_TEXT, P_STATE_FORMATS, P_TTL_TEXT)
end
