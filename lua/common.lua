-- The part every sluice script shares: argument checks, the clock,
-- de-duplication, band binding and the reply. It is not a script on its own:
-- sluice splices it into each algorithm's script where that script says
-- `-- @common`, once at start, before computing the script's SHA-1.
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
