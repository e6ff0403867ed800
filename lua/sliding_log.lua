-- sluice sliding-log (exact). KEYS, ARGV and the reply: lua/README.md.
-- Validate every argument, read everything, decide, and only then write:
-- Redis never rolls a script back, so an error must come before any write.

-- The policy's function: sluice registers it (lua/README.md, "Libraries"),
-- with the policy's numbers, the `P_` locals, written above this file.
-- `redis` is Redis, or a read-only (lua/peek.lua) or deferring
-- (lua/several.lua) stand-in for it.
local function decide(redis, KEYS, ARGV)
  local id, cost, record_key, record_life, first = arguments(KEYS, ARGV)
  local bands = P_BANDS

  -- Two keys: the log, a sorted set for every band, and this evaluation's
  -- record (common.lua). Per band: limit, window_us.
  local args = band_args(KEYS, 2, 2, P_BAND_ARGS, bands)
  local widest = 0
  for b = 1, bands do
    local w = args[2 * b]
    widest = w > widest and w or widest
    if cost > args[2 * b - 1] then
      fail('cost above the policy maximum')
    end
  end

  -- A first attempt has no record to find (lua/common.lua, "De-duplication").
  if not first then
    local replayed = replay(record_key)
    if replayed then
      return replayed
    end
  end

  -- State: one member per admitted unit of cost, scored by its time (us).
  -- Members are the evaluation id and the unit index: two requests of the
  -- same microsecond never collapse.
  local newest_entry = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local newest = stored(newest_entry[2], 'newest entry')
  local now, skew = decision_time(newest or 0, P_MAX_REGRESSION_US)
  if not now then
    return clock_unsafe(skew)
  end

  -- A band whose window the newest entry has left counts nothing: no need
  -- to ask.
  -- One band (most policies): its count in a local, not a table.
  local counts, count1, all_admit = bands > 1 and {} or nil, 0, true
  for b = 1, bands do
    local since = now - args[2 * b]
    local count = newest and newest > since
      and redis.call('ZCOUNT', KEYS[1], format('(%d', since), '+inf') or 0
    if counts then
      counts[b] = count
    else
      count1 = count
    end
    if count + cost > args[2 * b - 1] then
      all_admit = false
    end
  end

  local verdicts = bands > 1 and {} or nil
  local decision = nil
  for b = 1, bands do
    local l, w = args[2 * b - 1], args[2 * b]
    local count = counts and counts[b] or count1
    if all_admit then
      decision = verdict(verdicts, b, true, l - count - cost, w, 0)
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
      decision = verdict(verdicts, b, fits, l - count > 0 and l - count or 0, reset, retry)
    end
  end

  decision = decision or bind(verdicts)
  -- The record first (a first send's denial leaves none; common.lua): a
  -- first send its own retry overtook replays that one's decision here.
  local replayed, text = record(redis, first, record_key, decision, now,
    record_life or P_DEDUPE_WINDOW_TEXT)
  if replayed then
    return replayed
  end
  local now_text = format('%d', now)
  if decision[2] == 1 then
    if cost == 1 then
      -- One unit (most requests): no list to build, no number to write.
      redis.call('ZADD', KEYS[1], now_text, id .. ':1')
    else
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
    end
    -- Entries no band can count any more (none in a log that was empty).
    if newest then
      redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', format('%d', now - widest))
    end
    redis.call('PEXPIRE', KEYS[1], P_TTL_TEXT)
  end
  return reply(decision, skew, text)
end
