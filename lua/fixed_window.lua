#!lua
-- sluice fixed-window. KEYS, ARGV and the reply: lua/README.md.
-- Validate every argument, read everything, decide, and only then write:
-- Redis never rolls a script back, so an error must come before any write.

-- @common (lua/common.lua is spliced in here)

-- One key, the subject's hash: state and remembered ids alike. Per band:
-- limit, window_us.
local args = band_args(2, 2)
for b = 1, bands do
  if cost > args[2 * b - 1] then
    fail('cost above the policy maximum')
  end
end

-- State: t = last write (us); s<b> = window start, c<b> = count.
local replayed = replay()
if replayed then
  return replayed
end

local fields = {'t'}
local first = 1
for b = 1, bands do
  fields[first + 2 * b - 1] = format('s%d', b)
  fields[first + 2 * b] = format('c%d', b)
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local now, skew = decision_time(stored(state[first], 't') or 0)
if not now then
  return clock_unsafe(skew)
end
local now_text = format('%d', now)

local verdicts, writes = {}, {'t', now_text}
for b = 1, bands do
  local s, c = first + 2 * b - 1, first + 2 * b
  local start = stored(state[s], fields[s])
  local count = stored(state[c], fields[c]) or 0
  local limit, w = args[2 * b - 1], args[2 * b]
  local ws = now - now % w
  if start ~= ws then
    count = 0
  end
  local allowed = count + cost <= limit
  local after = allowed and count + cost or count
  local reset = ws + w - now
  verdicts[b] = {allowed, limit - after, reset, allowed and 0 or reset}
  writes[4 * b - 1] = fields[s]
  writes[4 * b] = format('%d', ws)
  writes[4 * b + 1] = fields[c]
  writes[4 * b + 2] = format('%d', after)
end

local decision = bind(verdicts)
-- A denied request writes nothing to any band.
if decision[1] == 1 then
  redis.call('HSET', KEYS[1], unpack(writes))
  redis.call('PEXPIRE', KEYS[1], P_TTL_TEXT)
end
remember(decision, now)
return reply(decision, skew)
