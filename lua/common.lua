-- The part every sluice library shares: argument checks, the clock,
-- de-duplication, band binding and the reply. It is not a library on its
-- own: sluice puts it at the top of each library (after the `#!lua name=`
-- line), where Redis runs it once, when the library loads. Every function
-- here is made then, once, and called by the policy's function on every
-- call: they take what they need as parameters (a function has no KEYS or
-- ARGV of its own), and read the policy's numbers from nothing.
local REPLY_VERSION = 1
-- Whether a decision that wrote its record answers with the record's text
-- (`reply`, below). The library of several limits reads each limit's
-- decision as a table, and turns this off when it loads.
local TEXT_REPLIES = true
-- Lua numbers are doubles: every integer the libraries handle stays at or
-- below 2^53 - 1, where doubles are exact and math.floor(a / b) is exact.
local MAX_EXACT = 9007199254740991

-- Most of what an evaluation costs Redis is this Lua, run anew for every
-- request: each conversion between text and number (a C call: tonumber,
-- string.format, or a number concatenated), each table grown an element at
-- a time. Hence the library functions in locals, tables built whole, and
-- numbers formatted once. A library's load sees only `redis` (Redis 7.0:
-- no `string`, no `tonumber`), so these locals are filled on the first call
-- (`arguments`, below) and kept for every call after it.
local function standard()
  return string.format, string.match, tonumber, unpack, string.find, string.sub
end
local format, match, tonumber, unpack, find, sub

local function fail(message)
  error({err = 'ERR sluice: ' .. message})
end

-- A whole number within [min, 2^53 - 1], or nil. The value is what is
-- checked (tonumber also reads '1e3' or '0x10'; NaN fails every
-- comparison, infinities the range).
local function whole(raw, min)
  local value = tonumber(raw)
  if value and value >= min and value <= MAX_EXACT and value % 1 == 0 then
    return value
  end
  return nil
end

local function int_arg(ARGV, index, min)
  return whole(ARGV[index], min) or fail('ARGV[' .. index .. '] is not an integer in range')
end

-- A stored integer, or nil when absent. Anything else is refused before a
-- single write, so a corrupt key is reported rather than half-updated.
local function stored(raw, what)
  if not raw then
    return nil
  end
  return whole(raw, 0) or fail('corrupt state: ' .. what)
end

-- The policy's and the store's numbers are not arguments: sluice writes
-- them into each policy's library as literals (the `P_` locals), from a
-- configuration already validated. Converting a dozen arguments from text
-- on every call cost more than the rest of the prologue (measured: about
-- 2.5 us of 9.5). Only whether the call is a first attempt, the evaluation
-- id and the cost change from call to call: checked here, first thing in
-- every call, with the record's key (de-duplication, below).
--
-- ARGV[1] is `1` on a call's first send, when this id cannot have been
-- applied yet (ids are random, one per evaluation); `0` on a re-send of a
-- call first sent as `1`, which may yet reach Redis after it; and `2`
-- where no send is marked first (Redis Cluster, whose client re-sends by
-- itself; several limits in one call). Only on `0` and `2` is the record
-- looked for; only on `0` does a compact state say until when a late
-- first send should look for it too (lua/state.lua, `settle`).
--
-- A fourth argument, when present, is how long the record lives (ms, at
-- most a day) instead of dedupe_window: a charge reserved before a request
-- is forwarded is settled when the app's answer comes, by a refund that
-- needs the record (lua/refund.lua).
local function arguments(KEYS, ARGV)
  if not format then
    format, match, tonumber, unpack, find, sub = standard()
  end
  local n = #ARGV
  if n < 2 or n > 4 then
    fail('expects 2 to 4 arguments: first attempt or not, the evaluation id, the cost '
      .. '(1 when left out) and the record life')
  end
  local first = ARGV[1]
  if first ~= '1' and first ~= '0' and first ~= '2' then
    fail('ARGV[1] is not 1 (a first attempt), 0 (perhaps a re-send of one) or 2 '
      .. '(never a first attempt)')
  end
  local id = ARGV[2]
  -- `find`, not `match`: nothing captured, no string made of the match.
  if #id ~= 32 or not find(id, '^%x*$') then
    fail('ARGV[2] is not an evaluation id')
  end
  -- nil: the policy's P_DEDUPE_WINDOW_TEXT (declared after this file).
  local record_life = nil
  if n == 4 then
    local life = int_arg(ARGV, 4, 1)
    if life > 86400000 then
      fail('ARGV[4] is not a record life in range')
    end
    record_life = format('%d', life)
  end
  -- Most requests cost 1, and are sent without it: each argument is an
  -- element of a table Redis makes for the call (about 1,600 instructions
  -- an argument). A `1` sent is compared, not converted: Redis's strings
  -- are interned, so comparing is a pointer's compare, where converting is
  -- a `strtod`.
  local cost = 1
  if n > 2 and ARGV[3] ~= '1' then
    cost = int_arg(ARGV, 3, 1)
  end
  return id, cost, KEYS[#KEYS], record_life, first == '1', first == '0'
end

-- Checks the number of keys and of band parameters (`args`, the policy's
-- `P_BAND_ARGS`), and returns the parameters, band after band.
local function band_args(KEYS, keys, per_band, args, bands)
  if #KEYS ~= keys then
    fail('expects ' .. keys .. ' keys')
  end
  if #args ~= bands * per_band then
    fail('expects ' .. per_band .. ' parameters per band')
  end
  return args
end

-- The time to decide at, given the key's last write. A small step back of
-- the Redis clock (at most `max_regression` us) counts as no time passing;
-- a larger one is refused (nil, with how far back it went).
local function decision_time(last, max_regression)
  local t = redis.call('TIME')
  -- Arithmetic reads TIME's digits as `tonumber` would, without a call of
  -- it for each (about 1k instructions in Redis apiece).
  local clock = t[1] * 1000000 + t[2]
  if last <= clock then
    return clock, 0
  end
  local skew = last - clock
  if skew > max_regression then
    return nil, skew
  end
  return last, skew
end

local function clock_unsafe(skew)
  return {REPLY_VERSION, 2, 0, 0, 0, 0, 0, skew}
end

-- A decision is its reply but for the skew (`reply`, below):
-- {REPLY_VERSION, outcome (1 admitted, 0 denied), remaining,
-- reset_after_us, retry_after_us, band (from 0), 0, skew}. One table from
-- the band's verdict to the reply: each table a call makes is an
-- allocation in Redis.
local function decision_of(outcome, remaining, reset, retry, band)
  return {REPLY_VERSION, outcome, remaining, reset, retry, band, 0, 0}
end

-- Band `b`'s verdict: into `verdicts`, as `bind` reads it; or, when
-- `verdicts` is nil (a policy of one band: most are), the decision
-- itself, as `bind` would make it of that one verdict: one table, not
-- the list, the verdict in it and the decision.
local function verdict(verdicts, b, allowed, remaining, reset, retry)
  if verdicts then
    verdicts[b] = {allowed, remaining, reset, retry}
    return nil
  end
  -- `decision_of`, written out: a Lua call is not free either.
  if allowed then
    return {REPLY_VERSION, 1, remaining, reset, retry > 0 and retry or 0, 0, 0, 0}
  end
  return {REPLY_VERSION, 0, remaining, reset, retry, 0, 0, 0}
end

-- verdicts[b] = {allowed, remaining, reset_after_us, retry_after_us}.
-- Admitted: the band with the least remaining binds; denied: the denying
-- band with the largest retry_after. Lowest index on ties.
local function bind(verdicts)
  local least, longest, wait = nil, nil, 0
  for b = 1, #verdicts do
    local v = verdicts[b]
    if v[1] then
      if not least or v[2] < verdicts[least][2] then
        least = b
      end
      -- An admission's retry is its delay (gcra): the longest band's.
      wait = math.max(wait, v[4])
    elseif not longest or v[4] > verdicts[longest][4] then
      longest = b
    end
  end
  if longest then
    local v = verdicts[longest]
    return decision_of(0, v[2], v[3], v[4], longest - 1)
  end
  local v = verdicts[least]
  return decision_of(1, v[2], v[3], wait, least - 1)
end

-- De-duplication. An evaluation leaves one record of its own: the last
-- key, `<state key>:e:<id>` under the subject's hash tag, holding the
-- decision for dedupe_window; or, for a compact state's first send, the
-- state itself when it holds no live record (lua/state.lua, `settle`). A
-- retry can only come within the budget of the first attempt, so records
-- live that long and no longer; finding one is a GET at most, leaving one
-- a SET at most, however hot the subject.
--
-- A first send (ARGV[1] = 1) does not look: its id is new. Its denial
-- leaves no record: it charged nothing, so a retry decided afresh charges
-- the request at most once (if it admits), and nothing else reads a
-- denial's record (a refund gives back only what a record says was
-- admitted). Its admission claims the record before charging (`record`,
-- below, or the state's place). A re-send (0) looks first, and records
-- whatever it decides.

-- The decision this id already got, if it was applied before: a retry
-- after an ambiguous failure must not charge twice.
local function replay_text(recorded)
  local o, r, reset, retry, band = match(recorded, '^(%d+):(%d+):(%d+):(%d+):(%d+):%d+$')
  if not o then
    fail('corrupt state: dedupe record')
  end
  return {REPLY_VERSION, tonumber(o), tonumber(r), tonumber(reset), tonumber(retry),
    tonumber(band), 1, 0}
end

local function replay(record_key)
  local recorded = redis.call('GET', record_key)
  if not recorded then
    return nil
  end
  return replay_text(recorded)
end

-- Leaves the record of `decision`, before any other write: nil and the
-- record's text, or, when a first send finds its record already there,
-- the decision to replay.
--
-- A first send (`first`) records an admission only, with `SET … NX`: its
-- id is fresh, so the record can only be there if its own retry, sent
-- on another connection after this one failed, reached Redis first (a
-- packet delayed, a proxy's queue) and was decided. Then this send
-- replays that decision and writes nothing: charging it would charge the
-- request twice. A re-send (`0`) records its denial as well as an
-- admission, so that a first send it overtook, arriving later, replays the
-- denial instead of charging a request that was refused.
--
-- `now` is the time the decision was made at: a refund (lua/refund.lua)
-- needs it to find the window that was charged. `server` is the policy
-- function's `redis` (a read-only or deferring one, lua/peek.lua and
-- lua/several.lua: they drop or queue the SET, which answers false; the
-- GET behind it then finds nothing, and the decision stands).
local function record(server, first, record_key, decision, now, window_text)
  if first and decision[2] ~= 1 then
    return nil
  end
  -- An admission's outcome written in the format: a number formatted is a
  -- `sprintf`.
  local text
  if decision[2] == 1 and decision[5] == 0 and decision[6] == 0 then
    -- Most admissions: no retry, the first band. Each number formatted is
    -- a `sprintf`, about 1,600 instructions in Redis.
    text = format('1:%d:%d:0:0:%d', decision[3], decision[4], now)
  elseif decision[2] == 1 then
    text = format('1:%d:%d:%d:%d:%d', decision[3], decision[4], decision[5], decision[6], now)
  else
    text = format('%d:%d:%d:%d:%d:%d', decision[2], decision[3], decision[4], decision[5],
      decision[6], now)
  end
  if not first then
    server.call('SET', record_key, text, 'PX', window_text)
    return nil, text
  end
  if server.call('SET', record_key, text, 'PX', window_text, 'NX') then
    return nil, text
  end
  return replay(record_key)
end

-- The reply to `decision` (lua/README.md, "Reply"): `text`, when the
-- decision wrote its record in it (a record of its own, or a state whose
-- tail holds it, the record last) and saw no clock skew; else the table.
-- Redis turns a table of eight integers into its reply for about 7,000
-- instructions, a string it already holds for about 200: most admissions
-- wrote their record, and answer with it.
local function reply(decision, skew, text)
  if text and skew == 0 and TEXT_REPLIES then
    return text
  end
  decision[8] = skew
  return decision
end
