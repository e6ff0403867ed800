-- Reading a subject's compact state: put by sluice at the top of every
-- library, after lua/common.lua, so the function is made once, when the
-- library loads; the compact-state algorithms call it after their record
-- was looked up.
--
-- The state is one string, its numbers joined by ':' in a fixed order: `t`
-- (the last write, us) first, then the bands' numbers, band after band
-- (`per_band` each, which the algorithm sets). One GET reads it (`raw`),
-- and the algorithm writes it back, TTL included, with one SET ... PX.
--
-- sluice compiles in the pattern that reads them all in one match and the
-- format that writes them in one call (`P_STATE_PATTERN`, `P_STATE_FORMAT`).
--
-- Returns the numbers, each checked to be an integer in [0, 2^53 - 1] (a
-- corrupt state is refused before a single write), or an empty table when
-- the subject has none (`raw` false). `n` is how many a whole state has:
-- 1 + bands x per_band.
local function read_state(raw, n, per_band, pattern)
  local state = {}
  if not raw then
    return state
  end
  -- One match, one capture per number (false past Lua's 32 captures).
  if pattern then
    state = {match(raw, pattern)}
  end
  if not state[1] then
    -- The rare path: a state of another length, written with another
    -- number of bands (a policy whose explicit revision kept its counters
    -- across a change of bands), or too long for one pattern. It must be
    -- numbers joined by ':', a whole number of bands; the bands it has are
    -- read, the others start afresh, as a hash's missing fields once did.
    if (not match(raw, '^%d+$') and not match(raw, '^%d+:[%d:]*%d$'))
      or string.find(raw, '::', 1, true) then
      fail('corrupt state')
    end
    local k = 0
    for v in string.gmatch(raw, '%d+') do
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
  return state
end
