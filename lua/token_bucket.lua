#!lua
-- sluice token-bucket (exact, whole-period refill). KEYS, ARGV and the
-- reply: lua/README.md. Validate every argument, read everything, decide,
-- and only then write: Redis never rolls a script back.

-- common:begin (the same in every script; a test keeps the copies identical)
local REPLY_VERSION = 1
-- Lua numbers are doubles: every integer the scripts handle stays at or
-- below 2^53 - 1, where doubles are exact and math.floor(a / b) is exact.
local MAX_EXACT = 9007199254740991

local function fail(message)
  error({err = 'ERR sluice: ' .. message})
end

-- Integers go back to Redis through '%d': concatenating a number would
-- format it with 14 significant digits and silently round a timestamp.
local function str(n)
  return string.format('%d', n)
end

local function int_arg(index, min)
  local raw = ARGV[index]
  if type(raw) ~= 'string' or not string.match(raw, '^%d+$') then
    fail('ARGV[' .. index .. '] is not an integer')
  end
  local value = tonumber(raw)
  if value < min or value > MAX_EXACT then
    fail('ARGV[' .. index .. '] is out of range')
  end
  return value
end

-- A stored integer, or nil when absent. Anything else is refused before a
-- single write, so a corrupt key is reported rather than half-updated.
local function stored(raw, what)
  if not raw then
    return nil
  end
  local value = tonumber(raw)
  if not value or value < 0 or value > MAX_EXACT or value ~= math.floor(value) then
    fail('corrupt state: ' .. what)
  end
  return value
end

if #KEYS ~= 3 then
  fail('expects 3 keys')
end
local id = ARGV[1]
if type(id) ~= 'string' or #id ~= 32 or not string.match(id, '^%x+$') then
  fail('ARGV[1] is not an evaluation id')
end
local cost = int_arg(2, 1)
local ttl_ms = int_arg(3, 1)
local max_regression = int_arg(4, 0)
local dedupe_window_ms = int_arg(5, 1)
local dedupe_max = int_arg(6, 1)
local bands = int_arg(7, 1)

local function expect_params(per_band)
  if #ARGV ~= 7 + bands * per_band then
    fail('expects ' .. per_band .. ' arguments per band')
  end
end

-- The decision this id already got, if it was applied before: a retry
-- after an ambiguous failure must not charge twice.
local function replay()
  local recorded = redis.call('HGET', KEYS[3], id)
  if not recorded then
    return nil
  end
  local o, r, reset, retry, band = string.match(recorded, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  if not o then
    fail('corrupt state: dedupe record')
  end
  return {REPLY_VERSION, tonumber(o), tonumber(r), tonumber(reset), tonumber(retry),
    tonumber(band), 1, 0}
end

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The time to decide at, given the key's last write. A small step back of
-- the Redis clock counts as no time passing; a large one is refused
-- (nil, with how far back it went).
local function decision_time(last)
  local clock = redis_now()
  if last <= clock then
    return clock, 0
  end
  local skew = last - clock
  if skew > max_regression then
    return nil, skew
  end
  return last, skew
end

local function clock_unsafe(skew)
  return {REPLY_VERSION, 2, 0, 0, 0, 0, 0, skew}
end

-- verdicts[b] = {allowed, remaining, reset_after_us, retry_after_us}.
-- Admitted: the band with the least remaining binds; denied: the denying
-- band with the largest retry_after. Lowest index on ties.
local function bind(verdicts)
  local least, longest = nil, nil
  for b = 1, #verdicts do
    local v = verdicts[b]
    if v[1] then
      if not least or v[2] < verdicts[least][2] then
        least = b
      end
    elseif not longest or v[4] > verdicts[longest][4] then
      longest = b
    end
  end
  local pick = longest or least
  local v = verdicts[pick]
  return {v[1] and 1 or 0, v[2], v[3], v[4], pick - 1}
end

-- Reads what recording needs (so a wrong key type fails before any write)
-- and returns how many of the oldest ids to forget: those past the window,
-- and enough to keep at most dedupe_max once this id is added.
local function dedupe_excess(now)
  local cutoff = now - dedupe_window_ms * 1000
  local stale = redis.call('ZCOUNT', KEYS[2], '-inf', str(cutoff))
  local over = redis.call('ZCARD', KEYS[2]) + 1 - dedupe_max
  return math.max(stale, over)
end

local function each_chunk(list, size, fn)
  local i = 1
  while i <= #list do
    fn(unpack(list, i, math.min(i + size - 1, #list)))
    i = i + size
  end
end

local function record(now, excess, decision)
  if excess > 0 then
    local old = redis.call('ZRANGE', KEYS[2], 0, excess - 1)
    redis.call('ZREMRANGEBYRANK', KEYS[2], 0, excess - 1)
    each_chunk(old, 1000, function(...)
      redis.call('HDEL', KEYS[3], ...)
    end)
  end
  redis.call('ZADD', KEYS[2], now, id)
  redis.call('HSET', KEYS[3], id, str(decision[1]) .. ':' .. str(decision[2]) .. ':'
    .. str(decision[3]) .. ':' .. str(decision[4]) .. ':' .. str(decision[5]))
  redis.call('PEXPIRE', KEYS[2], dedupe_window_ms)
  redis.call('PEXPIRE', KEYS[3], dedupe_window_ms)
end

local function reply(decision, skew)
  return {REPLY_VERSION, decision[1], decision[2], decision[3], decision[4], decision[5], 0, skew}
end
-- common:end

-- Per band: capacity, refill_tokens, refill_every_us.
expect_params(3)
local capacity, refill, period = {}, {}, {}
for b = 1, bands do
  capacity[b] = int_arg(5 + 3 * b, 1)
  refill[b] = int_arg(6 + 3 * b, 1)
  period[b] = int_arg(7 + 3 * b, 1)
  -- Bounds last + periods * period while the bucket is not full.
  if capacity[b] * period[b] > MAX_EXACT then
    fail('capacity * refill_every exceeds 2^53')
  end
  if cost > capacity[b] then
    fail('cost above the policy maximum')
  end
end

local replayed = replay()
if replayed then
  return replayed
end

-- State: t = last write (us); k<b> = tokens, l<b> = time of the last whole
-- refill period.
local fields = {'t'}
for b = 1, bands do
  fields[#fields + 1] = 'k' .. b
  fields[#fields + 1] = 'l' .. b
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local now, skew = decision_time(stored(state[1], 't') or 0)
if not now then
  return clock_unsafe(skew)
end
local excess = dedupe_excess(now)

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

local verdicts, writes = {}, {'t', str(now)}
for b = 1, bands do
  local c, r, p = capacity[b], refill[b], period[b]
  local tokens = stored(state[2 * b], 'k' .. b)
  local last = stored(state[2 * b + 1], 'l' .. b)
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
  writes[#writes + 1] = 'k' .. b
  writes[#writes + 1] = str(after)
  writes[#writes + 1] = 'l' .. b
  writes[#writes + 1] = str(last)
end

local decision = bind(verdicts)
if decision[1] == 1 then
  redis.call('HSET', KEYS[1], unpack(writes))
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end
record(now, excess, decision)
return reply(decision, skew)
