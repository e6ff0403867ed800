#!lua
-- sluice gcra (exact). KEYS, ARGV and the reply: lua/README.md.
-- Validate every argument, read everything, decide, and only then write:
-- Redis never rolls a script back, so an error must come before any write.

-- @common (lua/common.lua is spliced in here)

-- One key, the subject's hash: state and remembered ids alike. Per band:
-- limit, window_us, burst.
local args = band_args(2, 3)
local interval, tolerance = {}, {}
for b = 1, bands do
  local l, w, burst = args[3 * b - 2], args[3 * b - 1], args[3 * b]
  -- Rounded up: rounding can only ever admit less.
  interval[b] = math.floor((w + l - 1) / l)
  if burst * interval[b] > MAX_EXACT then
    fail('burst * emission interval exceeds 2^53')
  end
  tolerance[b] = burst * interval[b]
  if cost > burst then
    fail('cost above the policy maximum')
  end
end

-- State: t = last write (us); a<b> = theoretical arrival time (us).
local replayed = replay()
if replayed then
  return replayed
end

local fields = {'t'}
local first = 1
for b = 1, bands do
  fields[first + b] = format('a%d', b)
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local now, skew = decision_time(stored(state[first], 't') or 0)
if not now then
  return clock_unsafe(skew)
end
local now_text = format('%d', now)

local verdicts, writes = {}, {'t', now_text}
for b = 1, bands do
  local t, tau = interval[b], tolerance[b]
  local tat0 = math.max(stored(state[first + b], fields[first + b]) or now, now)
  local new_tat = tat0 + cost * t
  local allowed = new_tat - now <= tau
  if allowed then
    verdicts[b] = {true, math.floor((tau - (new_tat - now)) / t), new_tat - now, 0}
  else
    verdicts[b] = {false, math.floor(math.max(tau - (tat0 - now), 0) / t), tat0 - now,
      new_tat - now - tau}
  end
  writes[2 * b + 1] = fields[first + b]
  writes[2 * b + 2] = format('%d', new_tat)
end

local decision = bind(verdicts)
-- A denied request writes nothing to any band.
if decision[1] == 1 then
  redis.call('HSET', KEYS[1], unpack(writes))
  redis.call('PEXPIRE', KEYS[1], P_TTL_TEXT)
end
remember(decision, now)
return reply(decision, skew)
