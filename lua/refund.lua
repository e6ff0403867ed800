-- sluice: gives back what one evaluation charged, when another limit of the
-- same request refused it and the two could not be decided in one call
-- (Redis Cluster, their keys in different slots). KEYS, ARGV and the reply:
-- lua/README.md, "Refunds".
--
-- Only an evaluation this key's record says was admitted is refunded, and
-- its record then says denied: a refund runs at most once per evaluation,
-- however often it is sent, and a refund of an evaluation that never ran
-- (or whose record has expired) changes nothing.
--
-- sluice puts this file after lua/common.lua and the policy's numbers (the
-- `P_` locals).

-- A stored integer, or nil when absent or not one (a refund never refuses:
-- it gives back what it can read and leaves the rest, unlike common.lua's
-- `stored`, which this shadows).
local function stored(raw)
  local value = tonumber(raw)
  if value and value >= 0 and value <= MAX_EXACT and value % 1 == 0 then
    return value
  end
  return nil
end

-- The compact state (every algorithm but the sliding log keeps one string
-- of numbers, `t` first, then each band's: lua/README.md, "State"), as a
-- list of its numbers as text, or nil when the key is gone; and written
-- back whole, its TTL kept.
local function read_numbers(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  local numbers = {}
  for v in string.gmatch(raw, '[^:]+') do
    numbers[#numbers + 1] = v
  end
  return numbers
end

local function write_numbers(key, numbers)
  redis.call('SET', key, table.concat(numbers, ':'), 'KEEPTTL')
end

-- Two arguments: the evaluation id and the units to give back. Unlike a
-- decision's (lua/common.lua), no first-attempt flag (a refund always reads
-- the record: it is what decides) and no record life (the record keeps its
-- TTL).
local function refund_arguments(KEYS, ARGV)
  if not format then
    format, match, tonumber, unpack = standard()
  end
  if #ARGV ~= 2 then
    fail('expects 2 arguments: the evaluation id and the units to give back')
  end
  local id = ARGV[1]
  if #id ~= 32 or not match(id, '^%x+$') then
    fail('ARGV[1] is not an evaluation id')
  end
  return id, int_arg(ARGV, 2, 1), KEYS[#KEYS]
end

local function refund(KEYS, ARGV)
  local id, cost, record_key = refund_arguments(KEYS, ARGV)
  if #KEYS ~= 2 then
    fail('expects 2 keys')
  end
  local args = P_BAND_ARGS

  local recorded = redis.call('GET', record_key)
  if not recorded then
    return {REPLY_VERSION, 0}
  end
  local admitted, rest, at = match(recorded, '^(%d+)(:%d+:%d+:%d+:%d+:)(%d+)$')
  if not admitted then
    fail('corrupt state: dedupe record')
  end
  if admitted ~= '1' then
    return {REPLY_VERSION, 0}
  end
  -- The time the evaluation was decided at.
  at = tonumber(at)

  -- The algorithm's part: for the compact-state algorithms it sets `state`
  -- (read_numbers) and, where it changed a number, `changed`; the state is
  -- then written back once, below.
  local state, changed = nil, false
  -- @undo (the algorithm's part, lua/refund/<algorithm>.lua, is spliced in here)
  if changed then
    write_numbers(KEYS[1], state)
  end

  redis.call('SET', record_key, '0' .. rest .. format('%d', at), 'KEEPTTL')
  return {REPLY_VERSION, 1}
end
