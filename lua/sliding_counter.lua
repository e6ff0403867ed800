#!lua
-- sluice sliding-counter (approximate). KEYS, ARGV and the reply:
-- lua/README.md. Validate every argument, read everything, decide, and
-- only then write: Redis never rolls a script back.

-- @common (lua/common.lua is spliced in here)

-- One key, the subject's hash: state and remembered ids alike. Per band:
-- limit, window_us (a whole number of milliseconds).
local args = band_args(2, 2)
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

-- State: t = last write (us); s<b> = window start, c<b> = current window's
-- count, p<b> = previous window's count.
local replayed = replay()
if replayed then
  return replayed
end

local fields = {'t'}
local first = 1
for b = 1, bands do
  fields[first + 3 * b - 2] = format('s%d', b)
  fields[first + 3 * b - 1] = format('c%d', b)
  fields[first + 3 * b] = format('p%d', b)
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local now, skew = decision_time(stored(state[first], 't') or 0)
if not now then
  return clock_unsafe(skew)
end
local now_text = format('%d', now)

local verdicts, writes = {}, {'t', now_text}
for b = 1, bands do
  local s, c, p = first + 3 * b - 2, first + 3 * b - 1, first + 3 * b
  local start = stored(state[s], fields[s])
  local cur = stored(state[c], fields[c]) or 0
  local prev = stored(state[p], fields[p]) or 0
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
  local e_ms = math.floor((now - ws) / 1000)
  local est = cur + math.floor(prev * (w_ms - e_ms) / w_ms)
  local allowed = est + cost <= l
  local remaining = allowed and l - est - cost or math.max(l - est, 0)
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
  verdicts[b] = {allowed, remaining, reset, retry}
  writes[6 * b - 3] = fields[s]
  writes[6 * b - 2] = format('%d', ws)
  writes[6 * b - 1] = fields[c]
  writes[6 * b] = format('%d', cur_after)
  writes[6 * b + 1] = fields[p]
  writes[6 * b + 2] = format('%d', prev)
end

local decision = bind(verdicts)
-- A denied request writes nothing to any band.
if decision[1] == 1 then
  redis.call('HSET', KEYS[1], unpack(writes))
  redis.call('PEXPIRE', KEYS[1], P_TTL_TEXT)
end
remember(decision, now)
return reply(decision, skew)
