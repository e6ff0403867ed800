-- token-bucket: the tokens taken go back into each band's bucket, never
-- past its capacity. Refills since are counted from the same period as
-- before, so the bucket ends where it would be had the request not come.
local fields = {}
for b = 1, P_BANDS do
  fields[b] = format('k%d', b)
end
local state = redis.call('HMGET', KEYS[1], unpack(fields))
local writes = {}
for b = 1, P_BANDS do
  local capacity = args[3 * b - 2]
  local tokens = stored(state[b])
  if tokens then
    writes[#writes + 1] = fields[b]
    writes[#writes + 1] = format('%d', math.min(tokens + cost, capacity))
  end
end
if #writes > 0 then
  redis.call('HSET', KEYS[1], unpack(writes))
end
