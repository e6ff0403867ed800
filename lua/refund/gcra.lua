-- gcra: each band's theoretical arrival time moves back by the cost's
-- emission intervals, exactly what the charge moved it forward by. A time
-- that ends up in the past reads as an idle subject, as it would have.
local fields = {}
for b = 1, P_BANDS do
  fields[b] = format('a%d', b)
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local writes = {}
for b = 1, P_BANDS do
  local l, w = args[3 * b - 2], args[3 * b - 1]
  local interval = math.floor((w + l - 1) / l)
  local tat = stored(state[b])
  if tat then
    writes[#writes + 1] = fields[b]
    writes[#writes + 1] = format('%d', math.max(tat - cost * interval, 0))
  end
end
if #writes > 0 then
  redis.call('HSET', KEYS[1], unpack(writes))
end
