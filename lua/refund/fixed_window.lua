-- fixed-window: each band's count goes down by the cost if the band is
-- still in the window that was charged; a window since ended needs nothing.
local fields = {}
for b = 1, P_BANDS do
  fields[2 * b - 1] = format('s%d', b)
  fields[2 * b] = format('c%d', b)
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local writes = {}
for b = 1, P_BANDS do
  local w = args[2 * b]
  local start, count = stored(state[2 * b - 1]), stored(state[2 * b])
  if start and count and start == at - at % w then
    writes[#writes + 1] = fields[2 * b]
    writes[#writes + 1] = format('%d', math.max(count - cost, 0))
  end
end
if #writes > 0 then
  redis.call('HSET', KEYS[1], unpack(writes))
end
