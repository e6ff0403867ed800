-- sluice: every rate limit of one request in one call, all or nothing.
-- KEYS, ARGV and the reply: lua/README.md, "Several limits in one call".
--
-- Each limit's own `decide` (the function a route with that limit alone
-- runs, its numbers included) is put in below, in a block of its own. It
-- reads Redis as usual, but its writes wait in a queue: only when no limit
-- blocks are all the queues applied, so a request one limit refuses
-- consumes nothing of any. Deferring changes no decision: no limit reads a
-- key after writing it, and the limits' keys are distinct.
--
-- The commands the limits write with (a state's and a record's SET, with
-- their PX, queued whole); every other one only reads.
local WRITES = {PEXPIRE = true, SET = true, ZADD = true, ZREMRANGEBYSCORE = true}
-- Each limit's decision is read here as a table (lua/common.lua, `reply`).
TEXT_REPLIES = false
-- The queue of the limit running now: one stand-in for `redis`, made once,
-- for every limit of every call (they run one after the other).
local queue = nil
local DEFERRING = {call = function(command, ...)
  if WRITES[command] then
    queue[#queue + 1] = {command, ...}
    return false
  end
  return redis.call(command, ...)
end}

local LIMITS, SHADOW = {}, {}
-- @limits (sluice puts each limit's decide in here, in the route's order)

local function several(KEYS, ARGV)
  local n = #LIMITS
  if #KEYS ~= 2 * n then
    fail('expects ' .. 2 * n .. ' keys')
  end
  -- `2` (never a first send) and the evaluation id, for every limit; each
  -- limit's cost; then, optionally, one record life for every limit
  -- (lua/common.lua). Never a first send's `1`: a first send claims its
  -- record before it charges (common.lua, `record`), which writes queued
  -- until every limit has decided cannot do. So each limit looks for its
  -- record, and records its denial too.
  if #ARGV ~= 2 + n and #ARGV ~= 3 + n then
    fail('expects 2, the evaluation id, ' .. n .. ' costs and perhaps a record life')
  end
  if ARGV[1] ~= '2' then
    fail('ARGV[1] is not 2: several limits are never sent as a first attempt')
  end
  local life = ARGV[3 + n]
  local replies, queues = {}, {}
  for i = 1, n do
    queue = {}
    local reply = LIMITS[i](DEFERRING, {KEYS[2 * i - 1], KEYS[2 * i]},
      {ARGV[1], ARGV[2], ARGV[2 + i], life})
    for f = 1, 8 do
      replies[#replies + 1] = reply[f]
    end
    -- Outcome 2 is clock unsafe; 0 is denied, which blocks unless shadow.
    if reply[2] == 2 or (reply[2] == 0 and not SHADOW[i]) then
      return replies
    end
    queues[i] = queue
  end
  local call = redis.call
  for i = 1, n do
    local writes = queues[i]
    for w = 1, #writes do
      call(unpack(writes[w]))
    end
  end
  return replies
end
