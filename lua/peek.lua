-- Read-only evaluation, for POST /explain. Spliced in before the common
-- part of a policy's script, it shadows `redis` for everything after it:
-- the algorithm runs unchanged, its reads go to Redis, and every other
-- command is dropped before it is sent, so the script returns the decision
-- a request would get now and writes nothing. The script is also flagged
-- `no-writes`, so Redis itself would refuse a write that got through.
local redis = (function(server)
  local call = server.call
  local reads = {TIME = true, GET = true, ZRANGE = true, ZCOUNT = true, ZRANGEBYSCORE = true}
  return {call = function(command, ...)
    if reads[command] then
      return call(command, ...)
    end
    return false
  end}
end)(redis)
