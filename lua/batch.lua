-- sluice: several evaluations of one policy in one call, each decided as
-- if it were its own call, in order. KEYS, ARGV and the reply: lua/README.md,
-- "Several evaluations in one call".
--
-- The call's first argument says whether it is a first attempt, for every
-- evaluation in it (sluice sends, and re-sends, a batch whole). Then each
-- evaluation brings its two keys (state, record) and three arguments (id,
-- cost, record life or '' for the policy's dedupe window). Each runs
-- the policy's own `decide` under `pcall`: an evaluation that fails (its
-- checks come before any write of its own) answers its own error reply,
-- and the others are decided as they would have been alone. Redis never
-- rolls back, so nothing of an evaluation decided before it is undone,
-- exactly as for separate calls.
-- The one evaluation's KEYS and ARGV, refilled for each: `decide` only
-- reads them, and a table made per evaluation costs Redis more than the
-- call it spares.
local one_keys, one_args = {}, {}
local function batch(KEYS, ARGV)
  local n = #KEYS / 2
  if n < 1 or #KEYS ~= 2 * n or #ARGV ~= 1 + 3 * n then
    fail('expects first attempt or not, then 2 keys and 3 arguments per evaluation')
  end
  local replies = {}
  one_args[1] = ARGV[1]
  for i = 1, n do
    one_keys[1], one_keys[2] = KEYS[2 * i - 1], KEYS[2 * i]
    one_args[2], one_args[3] = ARGV[3 * i - 1], ARGV[3 * i]
    local life = ARGV[3 * i + 1]
    if life == '' then
      one_args[4] = nil
    else
      one_args[4] = life
    end
    local ok, reply = pcall(decide, redis, one_keys, one_args)
    if ok then
      replies[i] = reply
    elseif type(reply) == 'table' and reply.err then
      replies[i] = reply
    else
      replies[i] = {err = 'ERR sluice: ' .. tostring(reply)}
    end
  end
  return replies
end
