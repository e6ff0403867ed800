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

-- The compact state's numbers (every algorithm but the sliding log keeps
-- one string of numbers, `t` first, then each band's: lua/README.md,
-- "State"), as a list of their text, or nil when the key is gone
-- (`tail`: where a tail starts in `raw`, if anywhere); and written back
-- whole, with `tail`, the text that follows them, its TTL kept.
local function read_numbers(raw, tail)
  if not raw then
    return nil
  end
  if tail then
    raw = sub(raw, 1, tail - 1)
  end
  local numbers = {}
  for v in string.gmatch(raw, '[^:]+') do
    numbers[#numbers + 1] = v
  end
  return numbers
end

local function write_numbers(key, numbers, tail)
  redis.call('SET', key, table.concat(numbers, ':') .. tail, 'KEEPTTL')
end

-- Two arguments: the evaluation id and the units to give back. Unlike a
-- decision's (lua/common.lua), no first-attempt flag (a refund always reads
-- the record: it is what decides) and no record life (the record keeps its
-- TTL).
local function refund_arguments(KEYS, ARGV)
  if not format then
    format, match, tonumber, unpack, find, sub = standard()
  end
  if #ARGV ~= 2 then
    fail('expects 2 arguments: the evaluation id and the units to give back')
  end
  local id = ARGV[1]
  if #id ~= 32 or not find(id, '^%x*$') then
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

  -- The record: in the compact state's tail when the state holds it (a
  -- first send's admission, lua/state.lua), else in its own key.
  local raw, tail, expires, resent, held = false, nil, 0, 0, nil
  local recorded = nil
  if P_STATE_FORMAT then
    raw = redis.call('GET', KEYS[1])
    tail = raw and find(raw, '|', 1, true)
    if tail then
      local text
      expires, resent, held, text = read_tail(raw, tail)
      if held == id then
        recorded = text
      end
    end
  end
  local in_state = recorded ~= nil
  if not in_state then
    recorded = redis.call('GET', record_key)
  end
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
  local refunded = '0' .. rest .. at
  -- The time the evaluation was decided at.
  at = tonumber(at)

  -- The algorithm's part: for the compact-state algorithms it sets `state`
  -- (read_numbers) and, where it changed a number, `changed`; the state is
  -- then written back once, below, its record marked refunded when it
  -- holds it.
  local state, changed = nil, false
  -- @undo (the algorithm's part, lua/refund/<algorithm>.lua, is spliced in here)
  if in_state then
    state = state or read_numbers(raw, tail)
    write_numbers(KEYS[1], state,
      format('|%d|%d|%s|%s', expires, resent, held, refunded))
  else
    if changed then
      write_numbers(KEYS[1], state, tail and sub(raw, tail) or '')
    end
    redis.call('SET', record_key, refunded, 'KEEPTTL')
  end
  return {REPLY_VERSION, 1}
end
