#!lua
-- sluice token-bucket (exact, whole-period refill). KEYS, ARGV and the
-- reply: lua/README.md. Validate every argument, read everything, decide,
-- and only then write: Redis never rolls a script back.

-- @common (lua/common.lua is spliced in here)

-- One key, the subject's hash: state and remembered ids alike. Per band:
-- capacity, refill_tokens, refill_every_us.
local args = band_args(2, 3)
for b = 1, bands do
  local capacity, period = args[3 * b - 2], args[3 * b]
  -- Bounds last + periods * period while the bucket is not full.
  if capacity * period > MAX_EXACT then
    fail('capacity * refill_every exceeds 2^53')
  end
  if cost > capacity then
    fail('cost above the policy maximum')
  end
end

-- State: t = last write (us); k<b> = tokens, l<b> = time of the last whole
-- refill period.
local replayed = replay()
if replayed then
  return replayed
end

local fields = {'t'}
local first = 1
for b = 1, bands do
  fields[first + 2 * b - 1] = format('k%d', b)
  fields[first + 2 * b] = format('l%d', b)
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local now, skew = decision_time(stored(state[first], 't') or 0)
if not now then
  return clock_unsafe(skew)
end
local now_text = format('%d', now)

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

local verdicts, writes = {}, {'t', now_text}
for b = 1, bands do
  local k, l = first + 2 * b - 1, first + 2 * b
  local c, r, p = args[3 * b - 2], args[3 * b - 1], args[3 * b]
  local tokens = stored(state[k], fields[k])
  local last = stored(state[l], fields[l])
  if not tokens or not last then
    tokens, last = c, now
  end
  local periods = math.floor((now - last) / p)
  -- periods * r may pass 2^53 and lose precision, but only when it is far
  -- beyond the capacity, which the min absorbs.
  tokens = math.min(c, tokens + periods * r)
  if tokens == c then
    last = now
  else
    last = last + periods * p
  end
  local allowed = tokens >= cost
  local after = allowed and tokens - cost or tokens
  local reset = 0
  if after < c then
    reset = last + ceil_div(c - after, r) * p - now
  end
  local retry = 0
  if not allowed then
    retry = last + ceil_div(cost - tokens, r) * p - now
  end
  verdicts[b] = {allowed, after, reset, retry}
  writes[4 * b - 1] = fields[k]
  writes[4 * b] = format('%d', after)
  writes[4 * b + 1] = fields[l]
  writes[4 * b + 2] = format('%d', last)
end

local decision = bind(verdicts)
-- A denied request writes nothing to any band.
if decision[1] == 1 then
  redis.call('HSET', KEYS[1], unpack(writes))
  redis.call('PEXPIRE', KEYS[1], P_TTL_TEXT)
end
remember(decision, now)
return reply(decision, skew)
