-- wrk script: statuses.lua's counting, and every request with a subject
-- header never sent before:  wrk ... -s subjects.lua URL -- HEADER PREFIX LIMIT SEED
--   HEADER: PREFIX-<counter, hex>-<random, hex>
-- PREFIX is random per run (the caller picks it), so two runs never share
-- a subject either. With LIMIT > 0, requests after the LIMIT-th all carry
-- PREFIX-done: exactly LIMIT + 1 subjects however long wrk runs (the
-- caller stops it with SIGINT once sluice has counted LIMIT).
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "statuses.lua")

local counter = 0

function request()
  counter = counter + 1
  local value
  if limit > 0 and counter > limit then
    value = prefix .. "-done"
  else
    value = string.format("%s-%x-%08x", prefix, counter, math.random(0, 0x7fffffff))
  end
  return wrk.format(nil, nil, { [header] = value })
end
