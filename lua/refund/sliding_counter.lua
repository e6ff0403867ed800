-- sliding-counter: the charged window's count goes down by the cost: the
-- current count while the band is still in that window, the previous count
-- once it has moved one window on; further on, it no longer counts.
local fields = {}
for b = 1, P_BANDS do
  fields[3 * b - 2] = format('s%d', b)
  fields[3 * b - 1] = format('c%d', b)
  fields[3 * b] = format('p%d', b)
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local writes = {}
for b = 1, P_BANDS do
  local w = args[2 * b]
  local charged = at - at % w
  local start = stored(state[3 * b - 2])
  local field
  if start == charged then
    field = 3 * b - 1
  elseif start == charged + w then
    field = 3 * b
  end
  local count = field and stored(state[field])
  if count then
    writes[#writes + 1] = fields[field]
    writes[#writes + 1] = format('%d', math.max(count - cost, 0))
  end
end
if #writes > 0 then
  redis.call('HSET', KEYS[1], unpack(writes))
end
