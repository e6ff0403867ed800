#!lua
-- sluice: every rate limit of one request in one call, all or nothing.
-- KEYS, ARGV and the reply: lua/README.md, "Several limits in one call".
--
-- Each limit's own script (the one a route with that limit alone runs,
-- byte for byte after its first line) is spliced in below as a function
-- of its own `redis`, KEYS and ARGV. It reads Redis as usual, but its
-- writes wait in a queue: only when no limit blocks are all the queues
-- applied, so a request one limit refuses consumes nothing of any.
-- Deferring changes no decision: no script reads a key after writing it,
-- and the limits' keys are distinct.
local call, unpack = redis.call, unpack
-- The commands the limit scripts write with (a state's and a record's SET,
-- with their PX, queued whole); every other one only reads.
local WRITES = {PEXPIRE = true, SET = true, ZADD = true, ZREMRANGEBYSCORE = true}

local function deferring(queue)
  return {call = function(command, ...)
    if WRITES[command] then
      queue[#queue + 1] = {command, ...}
      return false
    end
    return call(command, ...)
  end}
end

local LIMITS, SHADOW = {}, {}
-- @limits (sluice splices each limit's script in here, in the route's order)

local n = #LIMITS
if #KEYS ~= 2 * n then
  error({err = 'ERR sluice: expects ' .. 2 * n .. ' keys'})
end
if #ARGV ~= 1 + n then
  error({err = 'ERR sluice: expects the evaluation id and ' .. n .. ' costs'})
end
local replies, queues = {}, {}
for i = 1, n do
  local queue = {}
  local reply = LIMITS[i](deferring(queue), {KEYS[2 * i - 1], KEYS[2 * i]}, {ARGV[1], ARGV[1 + i]})
  for f = 1, 8 do
    replies[#replies + 1] = reply[f]
  end
  -- Outcome 2 is clock unsafe; 0 is denied, which blocks unless shadow.
  if reply[2] == 2 or (reply[2] == 0 and not SHADOW[i]) then
    return replies
  end
  queues[i] = queue
end
for i = 1, n do
  local queue = queues[i]
  for w = 1, #queue do
    call(unpack(queue[w]))
  end
end
return replies
