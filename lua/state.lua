-- Reading a subject's compact state: spliced by sluice where a script says
-- `-- @state`, after its record was looked up. Inline rather than a
-- function: a function defined here would be made anew on every call, by
-- every script, and that costs more than these lines (measured).
--
-- The state is one string, its numbers joined by ':' in a fixed order: `t`
-- (the last write, us) first, then the bands' numbers, band after band
-- (`per_band` each, which the script sets). One GET reads it, and the script
-- writes it back, TTL included, with one SET ... PX.
--
-- sluice compiles in the pattern that reads them all in one match and the
-- format that writes them in one call (`P_STATE_PATTERN`, `P_STATE_FORMAT`).
--
-- Gives `state`: the numbers, each checked to be an integer in
-- [0, 2^53 - 1] (a corrupt state is refused before a single write), or an
-- empty table when the subject has none; `n`, how many there are.
local n = 1 + bands * per_band
local state = {}
local raw = redis.call('GET', KEYS[1])
if raw then
  -- One match, one capture per number (false past Lua's 32 captures).
  if P_STATE_PATTERN then
    state = {match(raw, P_STATE_PATTERN)}
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
end
