-- sliding-log: the evaluation's own entries leave the log (their members
-- are the evaluation id and the unit index).
local members = {}
for unit = 1, cost do
  members[unit] = id .. ':' .. unit
end
-- unpack puts every element on the Lua stack: a large cost goes in chunks.
for i = 1, #members, 1000 do
  redis.call('ZREM', KEYS[1], unpack(members, i, math.min(i + 999, #members)))
end
