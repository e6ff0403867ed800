-- wrk script for bench/soak.py and bench/cardinality.py: counts every
-- answer by second (os.time) and status, and prints them when wrk ends:
--   STATUS <unix second> <status> <count>
--   ERRORS <connect> <read> <write> <status> <timeout>
-- Arguments (`-- HEADER PREFIX LIMIT SEED`) are read by subjects.lua,
-- which loads this file.

counts = {}
local threads = {}
header, prefix, limit = nil, nil, 0

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  header, prefix = args[1], args[2]
  limit = tonumber(args[3] or "0") or 0
  math.randomseed(os.time() + (tonumber(args[4] or "0") or 0))
end

function response(status, headers, body)
  local key = os.time() .. " " .. status
  counts[key] = (counts[key] or 0) + 1
end

function done(summary, latency, requests)
  for _, t in ipairs(threads) do
    local c = t:get("counts")
    for k, v in pairs(c) do
      io.write("STATUS ", k, " ", v, "\n")
    end
  end
  local e = summary.errors
  io.write("ERRORS ", e.connect, " ", e.read, " ", e.write, " ", e.status, " ", e.timeout, "\n")
end
