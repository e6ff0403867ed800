-- Read-only evaluation, for POST /explain. Put at the top of the policy's
-- read-only library, it makes the stand-in for `redis` that the library's
-- function passes to the policy's own `decide`: the algorithm runs
-- unchanged, its reads go to Redis, and every other command is dropped
-- before it is sent, so the function returns the decision a request would
-- get now and writes nothing. The function is also registered `no-writes`,
-- so Redis itself would refuse a write that got through.
local PEEK_READS = {TIME = true, GET = true, ZRANGE = true, ZCOUNT = true, ZRANGEBYSCORE = true}
local READ_ONLY = {call = function(command, ...)
  if PEEK_READS[command] then
    return redis.call(command, ...)
  end
  return false
end}
