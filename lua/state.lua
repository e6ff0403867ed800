-- Reading and writing a subject's compact state: put by sluice at the top
-- of every library, after lua/common.lua, so the functions are made once,
-- when the library loads; the compact-state algorithms call `read_state`
-- first and `settle` last.
--
-- The state is one string, its numbers joined by ':' in a fixed order: `t`
-- (the last write, us) first, then the bands' numbers, band after band
-- (`per_band` each, which the algorithm sets). After the numbers may come
-- a tail, `|<resent>` or `|<resent>|<id>|<expires>|<record>`: the record of
-- the last admission a first send made, in the state instead of a key of
-- its own, and until when a first send may find a re-send's record before
-- it (lua/README.md, "Records"). One GET reads it all (`raw`), and the
-- algorithm writes it back, TTL included, with one SET ... PX.
--
-- sluice compiles in the pattern that reads the numbers in one match, and
-- where they end, and the format that writes them in one call
-- (`P_STATE_PATTERN`, `P_STATE_FORMAT`).
--
-- Returns the numbers, each checked to be an integer in [0, 2^53 - 1] (a
-- corrupt state is refused before a single write), or an empty table when
-- the subject has none (`raw` false); and where the tail starts in `raw`,
-- or nil. `n` is how many numbers a whole state has: 1 + bands x per_band.
local function read_state(raw, n, per_band, pattern)
  local state = {}
  if not raw then
    return state, nil
  end
  local tail = nil
  -- One match, one capture per number and one for where they end (false
  -- past Lua's 32 captures). They end at the end, or where a tail opens.
  if pattern then
    state = {match(raw, pattern)}
    local ends = state[n + 1]
    if ends then
      state[n + 1] = nil
      if ends <= #raw then
        if byte(raw, ends) == 124 then
          tail = ends
        else
          state = {}
        end
      end
    end
  end
  if not state[1] then
    -- The rare path: a state of another length, written with another
    -- number of bands (a policy whose explicit revision kept its counters
    -- across a change of bands), or too long for one pattern. It must be
    -- numbers joined by ':', a whole number of bands; the bands it has are
    -- read, the others start afresh, as a hash's missing fields once did.
    tail = find(raw, '|', 1, true)
    local numbers = raw
    if tail then
      numbers = sub(raw, 1, tail - 1)
    end
    if (not match(numbers, '^%d+$') and not match(numbers, '^%d+:[%d:]*%d$'))
      or find(numbers, '::', 1, true) then
      fail('corrupt state')
    end
    local k = 0
    for v in string.gmatch(numbers, '%d+') do
      k = k + 1
      if k <= n then
        state[k] = v
      end
    end
    if (k - 1) % per_band ~= 0 then
      fail('corrupt state')
    end
  end
  -- Digits only (the patterns): `v + 0` converts without calling tonumber.
  for i = 1, #state do
    local v = state[i] + 0
    if v > MAX_EXACT then
      fail('corrupt state')
    end
    state[i] = v
  end
  return state, tail
end

-- The tail of `raw` from `at`: until when a re-send's record may be
-- found (0: none), then, if the state holds one, the record's id, when it
-- expires (us) and its text (lua/common.lua, `record`, has its form).
local function read_tail(raw, at)
  local resent, id, expires, text = match(raw,
    '^|(%d+)|(%x+)|(%d+)|(%d+:%d+:%d+:%d+:%d+:%d+)$', at)
  if resent then
    return resent + 0, id, expires + 0, text
  end
  resent = match(raw, '^|(%d+)$', at)
  if not resent then
    fail('corrupt state: record')
  end
  return resent + 0, nil, 0, nil
end

-- The decision a re-send's id already got: from the state's tail, when
-- the record there is its own, or from its record's key.
local function recorded(raw, at, id, record_key)
  if at then
    local _, held, _, text = read_tail(raw, at)
    if held == id then
      return replay_text(text)
    end
  end
  return replay(record_key)
end

-- Leaves what a compact state's evaluation leaves, and returns its reply:
-- `decision`, or the one to replay.
--
-- A first send's admission keeps its record in the state it writes,
-- which costs Redis no key, no expiry and no command of its own. The
-- record it replaces, while it may still be asked for, moves to its own
-- key for what is left of its life. Before that, a first send that a
-- re-send of its id may have overtaken (the state says until when) looks
-- for that one's record, and replays it if found.
--
-- A first send's denial writes nothing. A re-send records whatever it
-- decides in its own key, as before, and raises the state's `resent`, so
-- a first send it overtook, arriving later, looks there: the state is
-- written for that even on a denial (its numbers as they were, its TTL
-- kept); with no state, there is nothing to overtake that could be
-- charged twice.
--
-- `life` is the record's life, ms as text; `formats` the state's format
-- (`P_STATE_FORMAT`) and the same with a held record after it; `ttl` the
-- state's, ms as text.
local function settle(server, key, record_key, first, id, decision, now, skew,
    state, n, raw, at, life, formats, ttl)
  local resent, held, expires, text = 0, nil, 0, nil
  if at then
    resent, held, expires, text = read_tail(raw, at)
  end
  if resent <= now then
    resent = 0
  end
  local d = decision
  local admitted = d[1] == 1
  local life_us = (life + 0) * 1000
  if first then
    if not admitted then
      return reply(decision, skew)
    end
    if resent > 0 then
      local replayed = replay(record_key)
      if replayed then
        return replayed
      end
    end
    if held and expires > now then
      server.call('SET', key .. ':e:' .. held, text, 'PX',
        format('%d', math.floor((expires - now + 999) / 1000)))
    end
    state[n + 1], state[n + 2], state[n + 3] = resent, id, now + life_us
    state[n + 4], state[n + 5], state[n + 6], state[n + 7] = d[1], d[2], d[3], d[4]
    state[n + 8], state[n + 9] = d[5], now
    server.call('SET', key, format(formats[2], unpack(state, 1, n + 9)), 'PX', ttl)
    return reply(decision, skew)
  end
  server.call('SET', record_key, format('%d:%d:%d:%d:%d:%d', d[1], d[2], d[3], d[4], d[5], now),
    'PX', life)
  resent = math.max(resent, now + life_us)
  local tail = format('|%d', resent)
  if held and expires > now then
    tail = format('|%d|%s|%d|%s', resent, held, expires, text)
  end
  if admitted then
    server.call('SET', key, format(formats[1], unpack(state, 1, n)) .. tail, 'PX', ttl)
  elseif raw then
    server.call('SET', key, (at and sub(raw, 1, at - 1) or raw) .. tail, 'KEEPTTL')
  end
  return reply(decision, skew)
end
