-- Reading and writing a subject's compact state: put by sluice at the top
-- of every library, after lua/common.lua, so the functions are made once,
-- when the library loads; the compact-state algorithms call `read_state`
-- first and `settle` last.
--
-- The state is one string, its numbers joined by ':' in a fixed order: `t`
-- (the last write, us) first, then the bands' numbers, band after band
-- (`per_band` each, which the algorithm sets). After the numbers may come
-- a tail, `|<expires>|<resent>` or `|<expires>|<resent>|<id>|<record>`: a
-- first send's admission's record, kept in the state instead of a key of
-- its own until it expires, and until when a first send may find a
-- re-send's record before it (lua/README.md, "Records"). One GET reads it all (`raw`), and the
-- algorithm writes it back, TTL included, with one SET ... PX.
--
-- sluice compiles in the pattern that reads the numbers in one match, and
-- where they end, and the format that writes them in one call
-- (`P_STATE_PATTERN`, `P_STATE_FORMAT`).
--
-- Returns the numbers, each checked to be an integer in [0, 2^53 - 1] (a
-- corrupt state is refused before a single write), or, when the subject
-- has none (`raw` false), `blank()`: every number false, with room for
-- all `settle` writes (`P_STATE_BLANK`); where the tail starts in `raw`,
-- or nil; and its first number as text, when the record it holds expires
-- (us; 0: none), or nil. `n` is how many numbers a whole state has:
-- 1 + bands x per_band.
local function read_state(raw, n, per_band, pattern, blank)
  if not raw then
    return blank(), nil, nil
  end
  local state = {}
  local tail, expires = nil, nil
  -- One match: one capture per number, then where they end and the first
  -- number after them, if a tail opens there (false past Lua's 32
  -- captures). The numbers end at the end, or where a tail opens with `|`
  -- and a number; anything else (more numbers than `n`) is for the
  -- general path. Nothing is copied out of the tail here: a denial never
  -- reads it.
  if pattern then
    state = {match(raw, pattern)}
    local ends, first = state[n + 1], state[n + 2]
    if ends then
      state[n + 1], state[n + 2] = nil, nil
      if first ~= '' then
        tail, expires = ends, first
      elseif ends <= #raw then
        state = {}
      end
    end
  end
  if not state[1] then
    -- The rare path: a state of another length, written with another
    -- number of bands (a policy whose explicit revision kept its counters
    -- across a change of bands), or too long for one pattern. It must be
    -- numbers joined by ':', a whole number of bands; the bands it has are
    -- read, the others start afresh, as a hash's missing fields once did.
    local numbers = raw
    tail = find(raw, '|', 1, true)
    if tail then
      numbers = sub(raw, 1, tail - 1)
      expires = match(raw, '^|(%d+)|', tail)
      if not expires then
        fail('corrupt state: record')
      end
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
  return state, tail, expires
end

-- Until when a re-send's record may be asked for (us; 0: none), from the
-- tail of `raw` at `at` (nil: none).
local function tail_resent(raw, at)
  if not at then
    return 0
  end
  local resent = match(raw, '^|%d+|(%d+)', at)
  if not resent then
    fail('corrupt state: record')
  end
  return resent + 0
end

-- The whole tail of `raw` at `at`: its two times, then the held record's
-- id and text, or nil when it holds none.
local function read_tail(raw, at)
  local expires, resent, id, text = match(raw,
    '^|(%d+)|(%d+)|(%x+)|(%d+:%d+:%d+:%d+:%d+:%d+)$', at)
  if expires then
    return expires + 0, resent + 0, id, text
  end
  expires, resent = match(raw, '^|(%d+)|(%d+)$', at)
  if not expires then
    fail('corrupt state: record')
  end
  return expires + 0, resent + 0, nil, nil
end

-- The decision a re-send's id already got: from the state's tail, when
-- the record there is its own, or from its record's key.
local function recorded(raw, at, id, record_key)
  if at then
    local _, _, held, text = read_tail(raw, at)
    if held == id then
      return replay_text(text)
    end
  end
  return replay(record_key)
end

-- Writes a state's new numbers (`state`, `n` of them) and `tail` after
-- them, with the state's TTL (`formats[3]`: the numbers' format and `%s`).
local function write_state(server, key, state, n, tail, formats, ttl)
  state[n + 1] = tail
  server.call('SET', key, format(formats[3], unpack(state, 1, n + 1)), 'PX', ttl)
end

-- Leaves what a compact state's evaluation leaves, and returns its reply
-- (lua/common.lua, `reply`: the text `decision` was recorded in, or
-- `decision`), or the decision to replay.
--
-- A first send's admission keeps its record in the state it writes,
-- which costs Redis no key, no expiry and no command of its own, when the
-- state holds no live record already. While it holds one (the subject
-- was admitted less than a record's life ago), the record goes to its own
-- key, claimed with `SET ... NX` before the state is written, as the
-- sliding log's always do (lua/common.lua, `record`), and the state keeps
-- the one it has. Where its slot is free, a first send that a re-send of
-- its id may have overtaken (the state says until when) looks for that
-- one's record first, and replays it if found.
--
-- A first send's denial writes nothing. A re-send records whatever it
-- decides in its own key. When its call was first sent as a first send
-- (`overtakable`: ARGV[1] is 0), it also raises the state's `resent`, so
-- that first send, should it arrive later, looks there: the state is
-- written for that even on a denial (its numbers as they were, its TTL
-- kept); with no state, there is nothing to write it in (lua/README.md,
-- "Records"). A call never sent as a first send (ARGV[1] is 2) has no
-- late first send to warn.
--
-- `raw`, `at` and `expires` are what `read_state` read; `life` is the
-- new record's life, ms as text; `formats` the state's format
-- (`P_STATE_FORMAT`), the same with a record after it, with a tail after
-- it, with a record resent nothing before, and the last and the second
-- with the record's retry and band written `0` (`P_STATE_FORMATS`);
-- `ttl` the state's, ms as text.
local function settle(server, key, record_key, first, overtakable, id, decision, now,
    skew, state, n, raw, at, expires, life, formats, ttl)
  local d = decision
  local admitted = d[2] == 1
  if first and not admitted then
    return reply(decision, skew)
  end
  expires = expires and expires + 0 or 0
  if first and expires <= now then
    local resent = tail_resent(raw, at)
    if resent > now then
      local replayed = replay(record_key)
      if replayed then
        return replayed
      end
    else
      resent = 0
    end
    -- The held record's outcome is an admission's, 1: written in the
    -- format, as a `resent` of 0 is in `formats[4]` (most first sends
    -- find nothing resent), and, in `formats[5]` and `[6]`, a retry of 0
    -- and the first band (most admissions). Each number formatted is a
    -- `sprintf`, about 1,600 instructions in Redis.
    local held, which = n + 2, 4
    if resent ~= 0 then
      state[held] = resent
      held, which = held + 1, 2
    end
    state[n + 1] = now + (life + 0) * 1000
    state[held], state[held + 1], state[held + 2] = id, d[3], d[4]
    local last = held + 3
    if d[5] == 0 and d[6] == 0 then
      state[last] = now
      which = which == 4 and 5 or 6
    else
      state[last], state[last + 1], state[last + 2] = d[5], d[6], now
      last = last + 2
    end
    -- The state ends with the record: the reply's text.
    local text = format(formats[which], unpack(state, 1, last))
    server.call('SET', key, text, 'PX', ttl)
    return reply(decision, skew, text)
  end
  if first then
    local replayed, text = record(server, true, record_key, decision, now, life)
    if replayed then
      return replayed
    end
    write_state(server, key, state, n, sub(raw, at), formats, ttl)
    return reply(decision, skew, text)
  end
  local _, text = record(server, false, record_key, decision, now, life)
  if not overtakable then
    if admitted then
      write_state(server, key, state, n, at and sub(raw, at) or '', formats, ttl)
    end
    return reply(decision, skew, text)
  end
  local resent = math.max(tail_resent(raw, at), now + (life + 0) * 1000)
  local kept = format('|0|%d', resent)
  if expires > now then
    local _, _, held, text = read_tail(raw, at)
    kept = format('|%d|%d|%s|%s', expires, resent, held, text)
  end
  if admitted then
    write_state(server, key, state, n, kept, formats, ttl)
  elseif raw then
    server.call('SET', key, (at and sub(raw, 1, at - 1) or raw) .. kept, 'KEEPTTL')
  end
  return reply(decision, skew, text)
end
