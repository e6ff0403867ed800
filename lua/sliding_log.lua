#!lua
-- sluice sliding-log (exact). KEYS, ARGV and the reply: lua/README.md.
-- Validate every argument, read everything, decide, and only then write:
-- Redis never rolls a script back, so an error must come before any write.

-- common:begin (the same in every script; a test keeps the copies identical)
local REPLY_VERSION = 1
-- Lua numbers are doubles: every integer the scripts handle stays at or
-- below 2^53 - 1, where doubles are exact and math.floor(a / b) is exact.
local MAX_EXACT = 9007199254740991
-- Most of what an evaluation costs Redis is this Lua, run anew for every
-- request: each conversion between text and number (a C call: tonumber,
-- string.format, or a number concatenated), each table grown an element
-- at a time, each function defined here. Hence the library functions in
-- locals, tables built whole, and numbers formatted once.
local format, match, tonumber, unpack = string.format, string.match, tonumber, unpack

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

local function int_arg(index, min)
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

local id = ARGV[1]
if not id or #id ~= 32 or not match(id, '^%x+$') then
  fail('ARGV[1] is not an evaluation id')
end
local cost = int_arg(2, 1)
local ttl_ms = int_arg(3, 1)
local max_regression = int_arg(4, 0)
local dedupe_window_ms = int_arg(5, 1)
local dedupe_max = int_arg(6, 1)
local bands = int_arg(7, 1)

-- Checks the number of keys and of arguments, and returns the per-band
-- arguments, band after band, as integers of at least 1.
local function band_args(keys, per_band)
  if #KEYS ~= keys then
    fail('expects ' .. keys .. ' keys')
  end
  if #ARGV ~= 7 + bands * per_band then
    fail('expects ' .. per_band .. ' arguments per band')
  end
  local args = {unpack(ARGV, 8)}
  for k = 1, #args do
    args[k] = int_arg(7 + k, 1)
  end
  return args
end

-- The time to decide at, given the key's last write. A small step back of
-- the Redis clock counts as no time passing; a large one is refused
-- (nil, with how far back it went).
local function decision_time(last)
  local t = redis.call('TIME')
  local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
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

-- verdicts[b] = {allowed, remaining, reset_after_us, retry_after_us}.
-- Admitted: the band with the least remaining binds; denied: the denying
-- band with the largest retry_after. Lowest index on ties.
local function bind(verdicts)
  local least, longest = nil, nil
  for b = 1, #verdicts do
    local v = verdicts[b]
    if v[1] then
      if not least or v[2] < verdicts[least][2] then
        least = b
      end
    elseif not longest or v[4] > verdicts[longest][4] then
      longest = b
    end
  end
  local pick = longest or least
  local v = verdicts[pick]
  return {v[1] and 1 or 0, v[2], v[3], v[4], pick - 1}
end

-- De-duplication. A hash remembers the evaluation ids applied (the state
-- hash itself, or the sliding log's `:dec` hash) in fields read by the
-- same HMGET as the state and written by the same HSET:
--   e:<id> = '<outcome>:<remaining>:<reset_us>:<retry_us>:<band>'
--   q:<n>  = '<time_us>:<id>', the n-th id remembered (n counts up from 0)
--   q:h    = the next n;  q:t = the oldest n still remembered
--   q:o, q:i = the time and id of entry q:<q:t>
-- Forgetting more ids than the oldest has to read their entries first
-- (one more HMGET), so it is done in batches: once in many evaluations.
-- The batch a full queue drops at once, and the most one evaluation drops
-- (after dedupe_max was lowered, the excess goes a little at a time).
local BATCH = dedupe_max < 512 and math.ceil(dedupe_max / 8) or 64
local DROP_MAX = 1024

-- The fields an HMGET starts with: this id's record, then the queue.
local function dedupe_fields(...)
  return {'e:' .. id, 'q:h', 'q:t', 'q:o', 'q:i', ...}
end

-- The decision this id already got, if it was applied before: a retry
-- after an ambiguous failure must not charge twice.
local function replay(read)
  local recorded = read[1]
  if not recorded then
    return nil
  end
  local o, r, reset, retry, band = match(recorded, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  if not o then
    fail('corrupt state: dedupe record')
  end
  return {REPLY_VERSION, tonumber(o), tonumber(r), tonumber(reset), tonumber(retry),
    tonumber(band), 1, 0}
end

-- Reads `count` entries from q:<tail>, the oldest first.
local function dedupe_entries(key, tail, count)
  local names = {}
  for k = 1, count do
    names[k] = format('q:%d', tail + k - 1)
  end
  local raw = redis.call('HMGET', key, unpack(names))
  local times, ids = {}, {}
  for k = 1, count do
    local at, old = match(raw[k] or '', '^(%d+):(%x+)$')
    if not at then
      fail('corrupt state: dedupe entry ' .. names[k])
    end
    times[k], ids[k] = tonumber(at), old
  end
  return names, times, ids
end

-- Given read, the HMGET that started with dedupe_fields(), reads whatever
-- else forgetting needs. Returns the fields to delete and the fields to
-- write (then `...`, appended). Dropped, oldest first: enough ids to hold
-- at most dedupe_max with this one (a batch at a time), and those older
-- than the window: the oldest alone as soon as it is, several once the
-- oldest is two windows old. now_text is now, formatted.
local function dedupe(key, read, now, now_text, decision, ...)
  local head = stored(read[2], 'q:h') or 0
  local tail = stored(read[3], 'q:t') or 0
  local oldest = stored(read[4], 'q:o') or 0
  local oldest_id = read[5]
  local live, kept = head - tail, tail
  if live < 0 or (live > 0 and not oldest_id) then
    fail('corrupt state: dedupe queue')
  end
  local window = dedupe_window_ms * 1000
  local must = live + 1 - dedupe_max
  local dropped = {}
  if live == 1 and (must > 0 or now - oldest >= window) then
    dropped = {format('q:%d', tail), 'e:' .. oldest_id}
    tail = head
  elseif live > 1 and (must > 0 or now - oldest >= 2 * window) then
    local want = must > BATCH and must or BATCH
    want = want < DROP_MAX and want or DROP_MAX
    if must > 0 then
      must = want
    end
    local names, times, ids = dedupe_entries(key, tail, want < live and want + 1 or live)
    for k = 1, #names do
      if k > want or (k > must and now - times[k] < window) then
        oldest, oldest_id = times[k], ids[k]
        break
      end
      dropped[#dropped + 1] = names[k]
      dropped[#dropped + 1] = 'e:' .. ids[k]
      tail = tail + 1
    end
  end
  if tail == head then
    oldest, oldest_id = now, id
  end
  -- Unchanged, the queue's oldest end is written back as read (no
  -- conversion).
  local tail_text, oldest_text = read[3], read[4]
  if tail ~= kept or tail == head then
    tail_text, oldest_text = format('%d', tail), format('%d', oldest)
  end
  return dropped, {
    'e:' .. id,
    format('%d:%d:%d:%d:%d', decision[1], decision[2], decision[3], decision[4], decision[5]),
    format('q:%d', head), now_text .. ':' .. id,
    'q:h', format('%d', head + 1),
    'q:t', tail_text,
    'q:o', oldest_text,
    'q:i', oldest_id,
    ...
  }
end

local function reply(decision, skew)
  return {REPLY_VERSION, decision[1], decision[2], decision[3], decision[4], decision[5], 0, skew}
end
-- common:end

-- Two keys: the log, a sorted set for every band, and the `:dec` hash
-- that remembers evaluation ids. Per band: limit, window_us.
local args = band_args(2, 2)
local widest = 0
for b = 1, bands do
  local w = args[2 * b]
  widest = w > widest and w or widest
  if cost > args[2 * b - 1] then
    fail('cost above the policy maximum')
  end
end

local read = redis.call('HMGET', KEYS[2], unpack(dedupe_fields()))
local replayed = replay(read)
if replayed then
  return replayed
end

-- State: one member per admitted unit of cost, scored by its time (us).
-- Members are the evaluation id and the unit index: two requests of the
-- same microsecond never collapse.
local newest_entry = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local newest = stored(newest_entry[2], 'newest entry')
local now, skew = decision_time(newest or 0)
if not now then
  return clock_unsafe(skew)
end

-- A band whose window the newest entry has left counts nothing: no need
-- to ask.
local counts, all_admit = {}, true
for b = 1, bands do
  local since = now - args[2 * b]
  counts[b] = newest and newest > since
    and redis.call('ZCOUNT', KEYS[1], format('(%d', since), '+inf') or 0
  if counts[b] + cost > args[2 * b - 1] then
    all_admit = false
  end
end

local verdicts = {}
for b = 1, bands do
  local l, w, count = args[2 * b - 1], args[2 * b], counts[b]
  if all_admit then
    verdicts[b] = {true, l - count - cost, w, 0}
  else
    local fits = count + cost <= l
    local reset = 0
    if count > 0 then
      reset = newest + w - now
    end
    local retry = 0
    if not fits then
      -- The k-th oldest entry inside this band's window leaves it first
      -- enough room for this cost.
      local k = count + cost - l
      local kth = redis.call('ZRANGEBYSCORE', KEYS[1], format('(%d', now - w), '+inf',
        'WITHSCORES', 'LIMIT', k - 1, 1)
      local at = stored(kth[2], 'entry') or newest
      retry = at + w - now
    end
    verdicts[b] = {fits, l - count > 0 and l - count or 0, reset, retry}
  end
end

local decision = bind(verdicts)
local now_text = format('%d', now)
local dropped, remember = dedupe(KEYS[2], read, now, now_text, decision)
if decision[1] == 1 then
  local entries = {}
  for unit = 1, cost do
    entries[2 * unit - 1] = now_text
    entries[2 * unit] = id .. ':' .. unit
  end
  -- unpack puts every element on the Lua stack: a large cost goes in
  -- chunks.
  for i = 1, #entries, 1000 do
    redis.call('ZADD', KEYS[1], unpack(entries, i, math.min(i + 999, #entries)))
  end
  -- Entries no band can count any more (none in a log that was empty).
  if newest then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', format('%d', now - widest))
  end
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end
if #dropped > 0 then
  redis.call('HDEL', KEYS[2], unpack(dropped))
end
redis.call('HSET', KEYS[2], unpack(remember))
redis.call('PEXPIRE', KEYS[2], dedupe_window_ms)
return reply(decision, skew)
