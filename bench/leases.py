#!/usr/bin/env python3
"""Leases: what a hot subject costs Redis and the proxy with `lease` on,
beside `lease: off` and the embedded store, and whether a leased limit is
still exact.

One Redis, one nginx upstream, three sidecars on the Redis store and one on
the embedded store, all on loopback; sluice alone on CPU 1, load, upstream
and Redis on CPU 0 (as bench/harness.py pins them). Every figure below is
a ratio of runs made side by side in this one session, interleaved, a few
rounds, median — the machine is shared and noisy, so absolute req/s mean
little.

1. Redis calls per allowed request, one hot subject (`subject: global`, a
   token bucket no load reaches), through the three sidecars at once: three
   wrk processes, one per sidecar, paced by a Lua `delay()` to about 10k
   req/s in all (wrk's pacing is per connection after each answer, so the
   achieved rate is reported). FCALLs (+ EVALSHA/EVAL) from `INFO
   commandstats` after `CONFIG RESETSTAT` ÷ allowed requests (the
   `allowed` outcome of `sluice_requests_total`); lease on (target ≤ 0.01)
   and lease off (1.0 expected), interleaved.
2. Throughput, one hot subject, one sidecar (`server.workers: 1`),
   closed-loop `wrk -t1 -c32`: Redis with leases ÷ the embedded store on
   the same policy without `lease` (target ≥ 0.95).
3. sluice's CPU per request (utime + stime from /proc) in the same runs:
   Redis with leases ÷ memory (target ≤ 1.05).
4. redis-server CPU per allowed request (INFO cpu used_cpu_sys +
   used_cpu_user) in the same runs: lease on ÷ lease off (target ≤ 0.05).
5. Exactness: a global fixed window of L per hour, lease on, three
   sidecars; an asyncio client offers 3L at once (exact count of every
   status): admitted must be ≤ L (over-admission 0), early refusals are
   L − admitted; then, 0.6 s later (leases ended and given back), more is
   offered until refused, again after each 0.6 s, until a pass admits
   nothing: the total admitted must be exactly L, and so must Redis's own
   count of the window.

Every run also records, from each sidecar's `/metrics`, the leases granted
and returned (by result), the units returned, the units held and the
outcomes.

    python3 bench/leases.py --sluice /tmp/sluice-lease [--quick] [--keep]

Writes bench/results/leases.md and leases.json and prints the table. Load
only ever targets 127.0.0.1; every process started here is stopped by PID
when the script ends, however it ends. Python 3 standard library, wrk,
nginx and redis-server.
"""

import argparse
import asyncio
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "results")

CPU_PROXY = 1
CPU_REST = 0
BUDGET_MS = 50
CONNS = 32
SIDECARS = 3
LIMIT = 3000  # the fixed window of test 5, per hour
LEASE = "{ ttl: 200ms, max_share: 20% }"
# Test 1's pacing: per sidecar PACE_CONNS connections, each waiting a few
# ms after every answer; the longest wait of PACE_DELAYS_MS that reaches
# about TARGET_RATE in all, found for lease on and off each (answers
# through Redis are slower); the achieved rate is reported.
PACE_CONNS = 10
PACE_DELAYS_MS = (3, 2, 1, 0)
TARGET_RATE = 10_000
# A round of tests 2–4 is "quiet" when other work on the machine took less
# than this many CPUs during each of the runs compared.
QUIET_CPUS = 0.25

HOT = ("algorithm: token-bucket, capacity: 1000000000, refill_tokens: 1000000000, "
       "refill_every: 1s")

REDIS_CONFIG = """version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  workers: 1
  shutdown_delay: 0s
upstream:
  url: http://127.0.0.1:{upstream}
store:
  kind: redis
  url: redis://127.0.0.1:{redis}
  budget: {budget}ms
identity:
  pseudonym_key: bench-pseudonym-key-not-a-secret
policies:
  hot: {{ {hot}, lease: {lease} }}
  hot-off: {{ {hot}, lease: off }}
{fixed}
routes:
  - {{ name: hot, match: {{ path_prefix: /hot }}, subject: global, policy: hot }}
  - {{ name: off, match: {{ path_prefix: /off }}, subject: global, policy: hot-off }}
{fixed_routes}
default: {{ policy: none }}
"""

# The same hot policy on the embedded store, which refuses `lease`.
MEMORY_CONFIG = """version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  workers: 1
  shutdown_delay: 0s
upstream:
  url: http://127.0.0.1:{upstream}
store:
  kind: memory
  budget: {budget}ms
identity:
  pseudonym_key: bench-pseudonym-key-not-a-secret
policies:
  hot: {{ {hot} }}
routes:
  - {{ name: hot, match: {{ path_prefix: /hot }}, subject: global, policy: hot }}
default: {{ policy: none }}
"""

PACED_LUA = """-- bench/leases.py: each connection waits `delay` ms after every answer.
local pause = 0
function init(args) pause = tonumber(args[1] or "0") or 0 end
function delay() return pause end
"""


# Every process this script started (filled in by `session`).
OUR_PIDS = []


def cpu_split():
    """(busy CPU seconds of the whole machine, CPU seconds of this script,
    the processes it started and its reaped children such as wrk) so far:
    the difference over a run is what other work on the machine took."""
    import resource
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    ours = 0.0
    for pid in OUR_PIDS:
        try:
            ours += tools.cpu_seconds(pid)
        except OSError:
            pass
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        ours += ru.ru_utime + ru.ru_stime
    return (sum(v) - idle) / tools.CLK_TCK, ours


def log(msg):
    print(f"[leases {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def med(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# --- sidecars and their metrics ---------------------------------------------


def start_sluice(procs, workdir, sluice, name, text):
    conf = os.path.join(workdir, f"{name}.yaml")
    with open(conf, "w") as f:
        f.write(text)
    check = subprocess.run([sluice, "check", "--config", conf], capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"{name}: `sluice check` refused the config: "
                         f"{(check.stderr.strip() or check.stdout.strip())[-400:]}")
    logf = os.path.join(workdir, f"{name}.log")
    proc = procs.start(name, [sluice, "run", "--config", conf, "--log-format", "json"], CPU_PROXY, logf)
    deadline = time.monotonic() + 20
    rec = None
    while time.monotonic() < deadline and proc.poll() is None and not rec:
        rec = harness.listening_line(logf)
        time.sleep(0.05)
    if not rec:
        raise SystemExit(f"{name} did not start: {tools.tail(logf) or 'no output'}")
    server = harness.Server(name, proc, harness.port_of(rec["traffic_addr"]))
    server.admin_port = harness.port_of(rec["admin_addr"])
    while time.monotonic() < deadline:
        try:
            if tools.http_status(server.admin_port, "/readyz", timeout=2) == 200:
                return server
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{name}: /readyz never answered 200: {tools.tail(logf)}")


METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metrics(server):
    """{name: {labels: value}} from the admin listener's /metrics."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.admin_port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode("utf-8", "replace")
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = METRIC.match(line)
        if not m or not m.group(1).startswith("sluice_"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.setdefault(m.group(1), {})[m.group(2) or ""] = value
    return out


def lease_figures(before, after, route=None):
    """What changed between two /metrics snapshots (lists, one per sidecar):
    leases granted, returned by result, units returned, held now, outcomes
    of `route`."""
    def total(snap, name, match=None):
        return sum(v for labels, v in snap.get(name, {}).items() if match is None or match(labels))

    out = {"granted": 0, "admitted_from_lease": 0, "returned": {}, "units_returned": 0,
           "units_held_after": 0, "outcomes": {}}
    for b, a in zip(before, after):
        out["granted"] += total(a, "sluice_leases_granted_total") - total(b, "sluice_leases_granted_total")
        out["admitted_from_lease"] += (total(a, "sluice_lease_admitted_total")
                                       - total(b, "sluice_lease_admitted_total"))
        out["units_returned"] += (total(a, "sluice_lease_units_returned_total")
                                  - total(b, "sluice_lease_units_returned_total"))
        out["units_held_after"] += total(a, "sluice_lease_units_held")
        for labels in set(a.get("sluice_leases_returned_total", {})) | set(b.get("sluice_leases_returned_total", {})):
            res = re.search(r'result="([^"]*)"', labels)
            key = res.group(1) if res else labels
            d = a.get("sluice_leases_returned_total", {}).get(labels, 0) - \
                b.get("sluice_leases_returned_total", {}).get(labels, 0)
            out["returned"][key] = out["returned"].get(key, 0) + d
        for labels in set(a.get("sluice_requests_total", {})):
            if route is not None and f'route="{route}"' not in labels:
                continue
            oc = re.search(r'outcome="([^"]*)"', labels)
            key = oc.group(1) if oc else labels
            d = a["sluice_requests_total"][labels] - b.get("sluice_requests_total", {}).get(labels, 0)
            out["outcomes"][key] = out["outcomes"].get(key, 0) + d
    for k in ("granted", "admitted_from_lease", "units_returned", "units_held_after"):
        out[k] = int(out[k])
    out["returned"] = {k: int(v) for k, v in sorted(out["returned"].items())}
    out["outcomes"] = {k: int(v) for k, v in sorted(out["outcomes"].items()) if v}
    return out


def redis_calls(calls):
    """Client calls that decide or refund: FCALL (and EVALSHA/EVAL, from
    versions before Redis Functions)."""
    return sum(v for k, v in calls.items() if k.startswith(("fcall", "evalsha", "eval")))


# --- load ---------------------------------------------------------------------


def wrk_argv(url, conns, seconds, cpu, script=None, script_args=()):
    argv = ["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s",
            "--timeout=5s"]
    if script:
        argv += ["-s", script]
    argv.append(url)
    if script_args:
        argv += ["--", *[str(a) for a in script_args]]
    return argv


def parse_wrk(out, err, rc):
    m_req = re.search(r"(\d+) requests in", out)
    m_rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if rc != 0 or not m_req or not m_rps:
        raise RuntimeError("wrk failed: " + (err.strip() or out.strip())[-300:])
    m_non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    m_err = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {"requests": int(m_req.group(1)), "rps": float(m_rps.group(1)),
            "non_2xx": int(m_non2xx.group(1)) if m_non2xx else 0,
            "socket_errors": sum(int(x) for x in m_err.groups()) if m_err else 0}


def paced_three(servers, path, seconds, script, pace):
    """One paced wrk per sidecar, all at once; their results. `pace` is
    (connections per sidecar, ms each waits after every answer)."""
    conns, delay_ms = pace
    running = []
    for s in servers:
        argv = wrk_argv(f"http://127.0.0.1:{s.port}{path}", conns, seconds, CPU_REST,
                        script, [delay_ms])
        running.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True))
    results = []
    try:
        for p in running:
            out, err = p.communicate(timeout=seconds + 60)
            results.append(parse_wrk(out, err, p.returncode))
    finally:
        for p in running:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
    return results


def calibrate(servers, path, script):
    """The longest wait after each answer (from PACE_DELAYS_MS) at which
    the three wrk reach about TARGET_RATE in all; the fastest when none does."""
    tried = []
    for delay_ms in PACE_DELAYS_MS:
        rate = sum(w["rps"] for w in paced_three(servers, path, 1, script, (PACE_CONNS, delay_ms)))
        tried.append({"delay_ms": delay_ms, "rps": rate})
        time.sleep(0.5)
        if rate >= 0.95 * TARGET_RATE:
            break
    return (PACE_CONNS, tried[-1]["delay_ms"]), tried


class Client:
    """Exact counting of every answer's status: asyncio, HTTP/1.1 keep-alive."""

    def __init__(self, port, path):
        self.port, self.path = port, path
        self.req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()

    async def _one(self, reader, writer):
        writer.write(self.req)
        line = await reader.readline()
        if not line:
            raise ConnectionError("closed")
        status = int(line.split()[1])
        length, chunked, close = 0, False, False
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            k, v = k.strip().lower(), v.strip().lower()
            if k == "content-length":
                length = int(v)
            elif k == "transfer-encoding" and "chunked" in v:
                chunked = True
            elif k == "connection" and v == "close":
                close = True
        if chunked:
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
        elif length:
            await reader.readexactly(length)
        return status, close

    async def run(self, n, conns, counts):
        """`n` requests over `conns` connections; statuses into `counts`."""
        left = [n]

        async def worker():
            reader = writer = None
            while left[0] > 0:
                left[0] -= 1
                for attempt in range(3):
                    try:
                        if writer is None:
                            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                        status, close = await self._one(reader, writer)
                        break
                    except (OSError, ConnectionError, ValueError, IndexError,
                            asyncio.IncompleteReadError):
                        status, close = "error", True
                        if writer is not None:
                            writer.close()
                        reader = writer = None
                        if attempt == 2:
                            break
                    # a request that failed to send is sent again
                counts[str(status)] = counts.get(str(status), 0) + 1
                if close and writer is not None:
                    writer.close()
                    reader = writer = None
            if writer is not None:
                writer.close()

        await asyncio.gather(*(worker() for _ in range(conns)))


def offer(servers, path, per_sidecar, conns):
    """`per_sidecar` requests to each sidecar at once; {status: count} in all
    and per sidecar."""
    per = [dict() for _ in servers]

    async def go():
        await asyncio.gather(*(Client(s.port, path).run(per_sidecar, conns, c) for s, c in zip(servers, per)))

    asyncio.run(go())
    total = {}
    for c in per:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total, per


def until_refused(servers, path, chunk=20):
    """More offered, `chunk` requests to each sidecar at a time, until a
    whole chunk is refused everywhere; {status: count}."""
    total = {}
    for _ in range(1000):
        got, _ = offer(servers, path, chunk, 1)
        for k, v in got.items():
            total[k] = total.get(k, 0) + v
        if got.get("200", 0) == 0:
            break
    return total


def redis_window(r, policy):
    """The keys of `policy` in Redis: its state key (`t:window_start:count`
    for one band, lua/state.lua) with its value, and how many retry records
    (`:e:<id>`) live."""
    keys = []
    cursor = "0"
    while True:
        cursor, batch = r.cmd("SCAN", cursor, "MATCH", f"*{policy}*", "COUNT", 1000)
        keys += batch
        if cursor == "0":
            break
    out = {"retry_records": sum(1 for k in keys if ":e:" in k)}
    for k in sorted(k for k in keys if ":e:" not in k):
        kind = r.cmd("TYPE", k)
        if kind == "string":
            out[k] = r.cmd("GET", k)
        elif kind == "hash":
            out[k] = r.cmd("HGETALL", k)
        else:
            out[k] = kind
    return out


def window_count(keys):
    """Redis's count of the window: the last number of the state key
    (`t:window_start:count`, one band)."""
    counts = [int(v.rsplit(":", 1)[1]) for k, v in keys.items()
              if k.startswith("sluice:") and isinstance(v, str) and re.fullmatch(r"\d+:\d+:\d+", v)]
    return sum(counts) if counts else None


# --- the tests ----------------------------------------------------------------


def test_calls(servers, redis, settings, script):
    """Test 1: FCALLs per allowed request through three sidecars, lease on and off."""
    runs = {"on": [], "off": [], "pace": {}}
    log(f"1. three sidecars, paced wrk ({PACE_CONNS} conns each): finding the pace for ~{TARGET_RATE} req/s")
    paces = {}
    for key, path in (("on", "/hot"), ("off", "/off")):
        paces[key], tried = calibrate(servers, path, script)
        runs["pace"][key] = {"connections_per_sidecar": paces[key][0], "delay_ms": paces[key][1],
                             "tried": tried}
        log(f"  lease {key}: {paces[key][1]} ms after each answer ({tried})")
    for r in range(settings["rounds"]):
        order = [("on", "/hot", "hot"), ("off", "/off", "off")]
        if r % 2:
            order.reverse()
        for key, path, route in order:
            before = [metrics(s) for s in servers]
            redis.cmd("CONFIG", "RESETSTAT")
            wrks = paced_three(servers, path, settings["paced_s"], script, paces[key])
            calls = redis.commandstats()
            after = [metrics(s) for s in servers]
            figs = lease_figures(before, after, route)
            allowed = figs["outcomes"].get("allowed", 0)
            fcalls = redis_calls(calls)
            run = {"round": r + 1, "pace_delay_ms": paces[key][1], "wrk": wrks, "rps_total": sum(w["rps"] for w in wrks),
                   "requests": sum(w["requests"] for w in wrks),
                   "non_2xx": sum(w["non_2xx"] for w in wrks),
                   "socket_errors": sum(w["socket_errors"] for w in wrks),
                   "allowed": allowed, "redis_fcalls": fcalls, "redis_commandstats": calls,
                   "fcalls_per_allowed": fcalls / allowed if allowed else None,
                   # FCALLs neither a grant nor a refund: requests the store
                   # decided alone (no lease held here, or one being asked for).
                   "fcalls_plain": fcalls - figs["granted"] - sum(figs["returned"].values()),
                   "metrics": figs}
            runs[key].append(run)
            log(f"  round {r + 1} lease {key:<3} {run['rps_total']:>8.0f} req/s, "
                f"{fcalls} FCALLs / {allowed} allowed = {_f(run['fcalls_per_allowed'], 4)}, "
                f"granted {figs['granted']}, returned {figs['returned']}, plain {run['fcalls_plain']}, "
                f"outcomes {figs['outcomes']}")
            time.sleep(0.5)  # the leases end and go back between runs
    return runs


def measure_one(server, path, route, redis, seconds):
    before = metrics(server)
    redis.cmd("CONFIG", "RESETSTAT")
    rcpu0 = redis.cpu_seconds()
    cpu0 = tools.cpu_seconds(server.pid)
    busy0, ours0 = cpu_split()
    t0 = time.monotonic()
    wrk = tools.run_wrk(f"http://127.0.0.1:{server.port}{path}", CONNS, seconds, CPU_REST)
    wall = time.monotonic() - t0
    busy1, ours1 = cpu_split()
    cpu = tools.cpu_seconds(server.pid) - cpu0
    rcpu = redis.cpu_seconds() - rcpu0
    calls = redis.commandstats()
    figs = lease_figures([before], [metrics(server)], route)
    allowed = figs["outcomes"].get("allowed", 0)
    n = max(1, wrk["requests"])
    return dict(wrk, cpu_s=cpu, cpu_us_per_req=cpu * 1e6 / n, redis_cpu_s=rcpu,
                # CPUs' worth of other work on the machine during the run.
                others_cpus=max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall,
                loadavg=os.getloadavg()[0],
                allowed=allowed, redis_cpu_us_per_allowed=rcpu * 1e6 / allowed if allowed else None,
                redis_fcalls=redis_calls(calls), metrics=figs)


def test_single(red, mem, redis, settings):
    """Tests 2–4: one sidecar, closed loop, Redis+lease vs memory vs Redis lease off."""
    scenarios = [("redis-lease", red, "/hot", "hot"), ("memory", mem, "/hot", "hot"),
                 ("redis-off", red, "/off", "off")]
    runs = {k: [] for k, *_ in scenarios}
    log(f"2–4. one sidecar, wrk -t1 -c{CONNS}: warm-up")
    for key, server, path, route in scenarios:
        measure_one(server, path, route, redis, settings["warmup_s"])
    for r in range(settings["single_rounds"]):
        order = scenarios if r % 2 == 0 else list(reversed(scenarios))
        for key, server, path, route in order:
            run = measure_one(server, path, route, redis, settings["closed_s"])
            run["round"] = r + 1
            runs[key].append(run)
            log(f"  round {r + 1} {key:<12} {run['rps']:>8.0f} req/s, sluice {run['cpu_us_per_req']:.1f} µs/req, "
                f"redis {_f(run['redis_cpu_us_per_allowed'], 2)} µs/allowed, {run['redis_fcalls']} FCALLs, "
                f"others {run['others_cpus']:.2f} CPUs, outcomes {run['metrics']['outcomes']}")
            time.sleep(0.3)
    n = settings["single_rounds"]
    ratios = {
        "throughput_lease_over_memory": med([runs["redis-lease"][i]["rps"] / runs["memory"][i]["rps"]
                                             for i in range(n)]),
        "cpu_lease_over_memory": med([runs["redis-lease"][i]["cpu_us_per_req"] / runs["memory"][i]["cpu_us_per_req"]
                                      for i in range(n)]),
        "redis_cpu_lease_over_off": med([
            runs["redis-lease"][i]["redis_cpu_us_per_allowed"] / runs["redis-off"][i]["redis_cpu_us_per_allowed"]
            for i in range(n)
            if runs["redis-lease"][i]["redis_cpu_us_per_allowed"] is not None
            and runs["redis-off"][i]["redis_cpu_us_per_allowed"]]),
        "throughput_off_over_memory": med([runs["redis-off"][i]["rps"] / runs["memory"][i]["rps"]
                                           for i in range(n)]),
        "cpu_off_over_memory": med([runs["redis-off"][i]["cpu_us_per_req"] / runs["memory"][i]["cpu_us_per_req"]
                                    for i in range(n)]),
    }
    # The same within the rounds where the machine was quiet around both
    # runs of the pair (other work under QUIET_CPUS): reported beside the
    # all-rounds figure, which the verdict is on.
    def quiet(*keys):
        return [i for i in range(n) if all(runs[k][i]["others_cpus"] < QUIET_CPUS for k in keys)]

    q = quiet("redis-lease", "memory")
    ratios["quiet_rounds_lease_memory"] = [i + 1 for i in q]
    ratios["quiet_throughput_lease_over_memory"] = med([runs["redis-lease"][i]["rps"] / runs["memory"][i]["rps"]
                                                        for i in q])
    ratios["quiet_cpu_lease_over_memory"] = med([
        runs["redis-lease"][i]["cpu_us_per_req"] / runs["memory"][i]["cpu_us_per_req"] for i in q])
    q = quiet("redis-lease", "redis-off")
    ratios["quiet_rounds_lease_off"] = [i + 1 for i in q]
    ratios["quiet_redis_cpu_lease_over_off"] = med([
        runs["redis-lease"][i]["redis_cpu_us_per_allowed"] / runs["redis-off"][i]["redis_cpu_us_per_allowed"]
        for i in q if runs["redis-lease"][i]["redis_cpu_us_per_allowed"] is not None
        and runs["redis-off"][i]["redis_cpu_us_per_allowed"]])
    return runs, ratios


def test_exact(servers, redis, settings, rounds):
    """Test 5: a global fixed window of LIMIT, offered 3 × LIMIT at once."""
    out = []
    for r in range(rounds):
        policy = f"fw-{r + 1}"
        path = f"/{policy}"
        before = [metrics(s) for s in servers]
        t0 = time.monotonic()
        burst, per = offer(servers, path, LIMIT, settings["exact_conns"])
        burst_s = time.monotonic() - t0
        at_burst = [metrics(s) for s in servers]
        held = lease_figures(before, at_burst, policy)["units_held_after"]
        keys_burst = redis_window(redis, policy)
        admitted = burst.get("200", 0)
        passes = []
        total = admitted
        for _ in range(10):
            time.sleep(0.6)
            got = until_refused(servers, path)
            passes.append(got)
            total += got.get("200", 0)
            if got.get("200", 0) == 0:
                break
        after = [metrics(s) for s in servers]
        keys_end = redis_window(redis, policy)
        run = {
            "round": r + 1, "policy": policy, "limit": LIMIT, "offered": LIMIT * len(servers),
            "burst_s": burst_s, "burst_statuses": burst, "burst_per_sidecar": per,
            "admitted_in_burst": admitted, "over_admission_burst": max(0, admitted - LIMIT),
            "early_refusals": LIMIT - admitted, "units_held_after_burst": held,
            "redis_keys_after_burst": keys_burst, "redis_count_after_burst": window_count(keys_burst),
            "later_passes": passes, "total_admitted": total, "over_admission_total": max(0, total - LIMIT),
            "redis_keys_end": keys_end, "redis_count_end": window_count(keys_end),
            "metrics_burst": lease_figures(before, at_burst, policy),
            "metrics": lease_figures(before, after, policy),
        }
        out.append(run)
        log(f"5. round {r + 1}: burst of {run['offered']} in {burst_s:.2f} s: {burst}; admitted {admitted} "
            f"(early refusals {run['early_refusals']}, units held {held}); after {len(passes)} more "
            f"pass(es) total {total} of {LIMIT}; Redis count {run['redis_count_end']}")
    return out


def _f(v, digits=2):
    return "—" if v is None else f"{v:.{digits}f}"


# --- report ---------------------------------------------------------------------


def markdown(res):
    s = res["summary"]
    lines = [
        "# Leases: Redis calls, throughput, CPU and exactness of a hot subject",
        "",
        f"{res['generated_at']}; the checkout at commit `{res['machine']['commit']}`, the binary measured "
        f"`{res['sluice']}` (built apart: its source may be older than that commit); "
        f"{res['machine']['nproc']} CPUs ({res['machine']['cpu_model']}), load average at start "
        f"{', '.join(f'{x:.2f}' for x in res['machine']['loadavg_at_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in res['machine']['loadavg_at_end'])}. Shared, noisy virtual "
        "machine: figures are ratios of runs made side by side in this session, interleaved, "
        f"{res['settings']['rounds']} rounds (tests 2–4: {res['settings']['single_rounds']}), median (min–max); "
        "absolute req/s are not claims. "
        f"`lease: {LEASE}`, `store.budget: {BUDGET_MS}ms`, `server.workers: 1`; sluice on CPU 1, "
        "load, upstream nginx and Redis on CPU 0." + (" **Quick mode: not for numbers.**"
                                                       if res["settings"]["quick"] else ""),
        "",
        "| # | figure | measured | target | |",
        "|---|---|---:|---|---|",
    ]
    for row in s["rows"]:
        lines.append(f"| {row['n']} | {row['figure']} | {row['measured']} | {row['target']} | "
                     f"{row['verdict']} |")
    lines += ["", "Leases (from the sidecars' `/metrics`, summed over the measured runs):", "",
              "| run | leases granted | returned (by result) | units returned | admitted from a lease |",
              "|---|---:|---|---:|---:|"]
    for name, m in s["lease_metrics"].items():
        ret = ", ".join(f"{k} {v}" for k, v in m["returned"].items()) or "0"
        lines.append(f"| {name} | {m['granted']} | {ret} | {m['units_returned']} | {m['admitted_from_lease']} |")
    lines += ["", "Notes:", ""]
    lines += [f"- {n}" for n in s["notes"]]
    return "\n".join(lines) + "\n"


def sum_metrics(figs):
    out = {"granted": 0, "returned": {}, "units_returned": 0, "admitted_from_lease": 0}
    for f in figs:
        out["granted"] += f["granted"]
        out["units_returned"] += f["units_returned"]
        out["admitted_from_lease"] += f["admitted_from_lease"]
        for k, v in f["returned"].items():
            out["returned"][k] = out["returned"].get(k, 0) + v
    return out


def rng(m, digits=2):
    if not m:
        return "—"
    return f"{m['median']:.{digits}f} ({m['min']:.{digits}f}–{m['max']:.{digits}f})"


def quiet_label(rounds):
    return (f"… only the rounds with under {QUIET_CPUS} CPUs of other work on the machine "
            f"(rounds {', '.join(map(str, rounds)) or 'none'})")


def summarize(calls, single, ratios, exact):
    rows, notes = [], []
    on = med([r["fcalls_per_allowed"] for r in calls["on"]])
    off = med([r["fcalls_per_allowed"] for r in calls["off"]])
    rate_on = med([r["rps_total"] for r in calls["on"]])
    rate_off = med([r["rps_total"] for r in calls["off"]])

    def verdict(ok):
        return "—" if ok is None else ("**met**" if ok else "**missed**")

    rows.append({"n": 1, "figure": f"Redis calls (FCALL) per allowed request, 3 sidecars, lease on "
                                   f"(achieved {rate_on['median']:.0f} req/s in all, paced wrk, "
                                   f"{PACE_CONNS} conns per sidecar)",
                 "measured": rng(on, 4), "target": "≤ 0.01",
                 "verdict": verdict(on and on["median"] <= 0.01)})
    rows.append({"n": "1", "figure": f"… lease off (achieved {rate_off['median']:.0f} req/s)",
                 "measured": rng(off, 4), "target": "1.0 expected", "verdict": "reference"})
    t = ratios["throughput_lease_over_memory"]
    rows.append({"n": 2, "figure": "throughput, 1 sidecar, wrk -c32: Redis + lease ÷ memory (all rounds)",
                 "measured": rng(t, 3), "target": "≥ 0.95", "verdict": verdict(t and t["median"] >= 0.95)})
    t = ratios["throughput_off_over_memory"]
    rows.append({"n": "2", "figure": quiet_label(ratios["quiet_rounds_lease_memory"]),
                 "measured": rng(ratios["quiet_throughput_lease_over_memory"], 3), "target": "≥ 0.95",
                 "verdict": "reported"})
    rows.append({"n": "2", "figure": "… Redis, lease off ÷ memory (reference)", "measured": rng(t, 3),
                 "target": "—", "verdict": "reference"})
    c = ratios["cpu_lease_over_memory"]
    rows.append({"n": 3, "figure": "sluice CPU per request: Redis + lease ÷ memory (all rounds)",
                 "measured": rng(c, 3),
                 "target": "≤ 1.05", "verdict": verdict(c and c["median"] <= 1.05)})
    c = ratios["cpu_off_over_memory"]
    rows.append({"n": "3", "figure": quiet_label(ratios["quiet_rounds_lease_memory"]),
                 "measured": rng(ratios["quiet_cpu_lease_over_memory"], 3), "target": "≤ 1.05",
                 "verdict": "reported"})
    rows.append({"n": "3", "figure": "… Redis, lease off ÷ memory (reference)", "measured": rng(c, 3),
                 "target": "—", "verdict": "reference"})
    rc = ratios["redis_cpu_lease_over_off"]
    lease_us = med([r["redis_cpu_us_per_allowed"] for r in single["redis-lease"]])
    off_us = med([r["redis_cpu_us_per_allowed"] for r in single["redis-off"]])
    rows.append({"n": 4, "figure": f"redis-server CPU per allowed request: lease on ÷ off "
                                   f"({_f(lease_us and lease_us['median'], 2)} vs {_f(off_us and off_us['median'], 1)} µs)",
                 "measured": rng(rc, 4), "target": "≤ 0.05", "verdict": verdict(rc and rc["median"] <= 0.05)})
    rows.append({"n": "4", "figure": quiet_label(ratios["quiet_rounds_lease_off"]),
                 "measured": rng(ratios["quiet_redis_cpu_lease_over_off"], 4), "target": "≤ 0.05",
                 "verdict": "reported"})
    over_burst = max(r["over_admission_burst"] for r in exact)
    over_total = max(r["over_admission_total"] for r in exact)
    adm = [r["admitted_in_burst"] for r in exact]
    early = [r["early_refusals"] for r in exact]
    held = [r["units_held_after_burst"] for r in exact]
    totals = [r["total_admitted"] for r in exact]
    redis_end = [r["redis_count_end"] for r in exact]
    rows.append({"n": 5, "figure": f"admitted in a burst of 3L = {3 * LIMIT}, 3 sidecars, L = {LIMIT}/1h "
                                   f"(per round)", "measured": " / ".join(map(str, adm)),
                 "target": f"≤ {LIMIT}", "verdict": verdict(all(a <= LIMIT for a in adm))})
    rows.append({"n": "5", "figure": "over-admission (burst, and in all)", "measured": f"{over_burst}, {over_total}",
                 "target": "0", "verdict": verdict(over_burst == 0 and over_total == 0)})
    rows.append({"n": "5", "figure": "early refusals L − admitted / units held in leases right after the burst",
                 "measured": " / ".join(f"{e} vs {h}" for e, h in zip(early, held)), "target": "—",
                 "verdict": "reported"})
    rows.append({"n": "5", "figure": "total admitted once leases were back (0.6 s, then until refused)",
                 "measured": " / ".join(map(str, totals)), "target": f"= {LIMIT}",
                 "verdict": verdict(all(t == LIMIT for t in totals))})
    rows.append({"n": "5", "figure": "Redis's count of the window at the end", "measured": " / ".join(map(str, redis_end)),
                 "target": f"= {LIMIT}", "verdict": verdict(all(x == LIMIT for x in redis_end))})

    # Anything else a run saw: non-2xx where none should be, socket errors.
    for key in ("on", "off"):
        bad = {}
        for r in calls[key]:
            for k, v in r["metrics"]["outcomes"].items():
                if k != "allowed":
                    bad[k] = bad.get(k, 0) + v
        n2 = sum(r["non_2xx"] for r in calls[key])
        se = sum(r["socket_errors"] for r in calls[key])
        if bad or n2 or se:
            notes.append(f"test 1, lease {key}: outcomes other than allowed {bad or 'none'}, "
                         f"{n2} non-2xx, {se} socket errors")
    for key, runs in single.items():
        bad = {}
        for r in runs:
            for k, v in r["metrics"]["outcomes"].items():
                if k != "allowed":
                    bad[k] = bad.get(k, 0) + v
        n2 = sum(r["non_2xx"] for r in runs)
        se = sum(r["socket_errors"] for r in runs)
        if bad or n2 or se:
            notes.append(f"tests 2–4, {key}: outcomes other than allowed {bad or 'none'}, "
                         f"{n2} non-2xx, {se} socket errors")
    for r in exact:
        other = {k: v for k, v in r["burst_statuses"].items() if k not in ("200", "429")}
        for p in r["later_passes"]:
            for k, v in p.items():
                if k not in ("200", "429"):
                    other[k] = other.get(k, 0) + v
        if other:
            notes.append(f"test 5 round {r['round']}: statuses other than 200/429: {other}")
    for key, rate in (("on", rate_on), ("off", rate_off)):
        if rate["median"] < 0.9 * TARGET_RATE:
            notes.append(f"test 1, lease {key}: reached {rate['median']:.0f} req/s in all, short of the "
                         f"{TARGET_RATE} aimed at (wrk paced by `delay()`, {PACE_CONNS} connections per "
                         f"sidecar, {calls['pace'][key]['delay_ms']} ms, on the one CPU it shares with "
                         "nginx and Redis; no oha here)")
    plain = med([r["fcalls_plain"] / r["allowed"] for r in calls["on"] if r["allowed"]])
    grants = med([(r["metrics"]["granted"] + sum(r["metrics"]["returned"].values())) / r["allowed"]
                  for r in calls["on"] if r["allowed"]])
    notes.append(f"test 1, lease on, FCALLs per allowed request by kind: grants + refunds "
                 f"{_f(grants and grants['median'], 4)}, plain decisions (no lease held, or one being "
                 f"asked for) {_f(plain and plain['median'], 4)}.")
    others = med([r["others_cpus"] for runs in single.values() for r in runs])
    if others:
        notes.append(f"other work on the machine during tests 2–4 (busy CPU from /proc/stat less this "
                     f"script's processes): median {others['median']:.2f} CPUs, "
                     f"{others['min']:.2f}–{others['max']:.2f}; each round's figure is in leases.json "
                     "(`others_cpus`).")
    notes.append("test 1's pacing is wrk's Lua `delay()` (each connection waits after every answer), "
                 "so it is paced closed loop, not a true open loop.")
    notes.append("test 4's lease-on figure divides a small CPU delta (INFO cpu, about 1 ms resolution "
                 "in practice) by many requests; its min–max shows how noisy it is.")
    lease_metrics = {
        "1. 3 sidecars, lease on": sum_metrics([r["metrics"] for r in calls["on"]]),
        "1. 3 sidecars, lease off": sum_metrics([r["metrics"] for r in calls["off"]]),
        "2–4. 1 sidecar, lease on": sum_metrics([r["metrics"] for r in single["redis-lease"]]),
        "2–4. 1 sidecar, lease off": sum_metrics([r["metrics"] for r in single["redis-off"]]),
        "5. fixed window, burst + later passes": sum_metrics([r["metrics"] for r in exact]),
    }
    return {"rows": rows, "notes": notes, "lease_metrics": lease_metrics}


def session(procs, workdir, args, settings):
    upstream = harness.start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", CPU_REST)
    if upstream.reason:
        raise SystemExit(upstream.reason)
    redis_srv = harness.start_redis(procs, workdir)
    if redis_srv.reason:
        raise SystemExit(redis_srv.reason)
    rounds5 = settings["rounds"]
    fixed = "\n".join(f"  fw-{i}: {{ algorithm: fixed-window, limit: {LIMIT}, window: 1h, lease: {LEASE} }}"
                      for i in range(1, rounds5 + 1))
    fixed_routes = "\n".join(
        f"  - {{ name: fw-{i}, match: {{ path_prefix: /fw-{i} }}, subject: global, policy: fw-{i} }}"
        for i in range(1, rounds5 + 1))
    text = REDIS_CONFIG.format(upstream=upstream.port, redis=redis_srv.port, budget=BUDGET_MS, hot=HOT,
                               lease=LEASE, fixed=fixed, fixed_routes=fixed_routes)
    log(f"starting {SIDECARS} sidecars on Redis and one on the embedded store")
    servers = [start_sluice(procs, workdir, args.sluice, f"sluice-redis-{i}", text) for i in range(SIDECARS)]
    mem = start_sluice(procs, workdir, args.sluice, "sluice-memory",
                       MEMORY_CONFIG.format(upstream=upstream.port, budget=BUDGET_MS, hot=HOT))
    for s in servers + [mem]:
        status = tools.http_status(s.port, "/hot")
        if status != 200:
            raise SystemExit(f"{s.name}: /hot answered {status}, expected 200")
    OUR_PIDS[:] = [p.pid for _, p in procs._procs]
    redis = Redis(redis_srv.port)
    script = os.path.join(workdir, "paced.lua")
    with open(script, "w") as f:
        f.write(PACED_LUA)
    try:
        calls = test_calls(servers, redis, settings, script)
        single, ratios = test_single(servers[0], mem, redis, settings)
        exact = test_exact(servers, redis, settings, rounds5)
        for s in servers + [mem]:
            if not s.alive():
                raise SystemExit(f"{s.name} exited during the run: {tools.tail(os.path.join(workdir, s.name + '.log'))}")
    finally:
        redis.close()
    # Errors and warnings the sidecars logged.
    logged = {}
    for s in servers + [mem]:
        try:
            with open(os.path.join(workdir, s.name + ".log"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    level = str(rec.get("level", "")).upper()
                    if level in ("WARN", "ERROR"):
                        msg = rec.get("message") or (rec.get("fields") or {}).get("message")
                        logged.setdefault(s.name, []).append(f"{level} {msg}")
        except OSError:
            pass
    return calls, single, ratios, exact, logged


def stop_sidecars(procs):
    """SIGTERM to every sidecar at once (each gives its leases back and
    drains), then a wait; Processes.stop_all kills whatever is left."""
    sidecars = [p for name, p in procs._procs if name.startswith("sluice-")]
    for p in sidecars:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for p in sidecars:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--quick", action="store_true", help="1 round of short runs")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="first wait up to S seconds for a 1-minute load average ≤ 0.5")
    args = ap.parse_args()
    if not os.access(args.sluice, os.X_OK):
        raise SystemExit(f"no sluice binary at {args.sluice}")
    settings = {
        "quick": args.quick,
        "rounds": 1 if args.quick else 3,
        "warmup_s": 1 if args.quick else 2,
        "single_rounds": 1 if args.quick else 10,
        "closed_s": 2 if args.quick else 3,
        "paced_s": 2 if args.quick else 5,
        "exact_conns": 8,
        "connections": CONNS,
        "pace": {"connections_per_sidecar": PACE_CONNS, "delays_ms_tried": PACE_DELAYS_MS,
                 "target_rps": TARGET_RATE},
        "budget_ms": BUDGET_MS,
        "lease": LEASE,
        "limit": LIMIT,
    }

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    harness.raise_fd_limit()
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-leases-")
    started = time.monotonic()
    if args.wait_quiet:
        deadline = time.monotonic() + args.wait_quiet
        while os.getloadavg()[0] > 0.5 and time.monotonic() < deadline:
            log(f"waiting for a quieter machine (load average {os.getloadavg()[0]:.2f})")
            time.sleep(15)
    info = harness.machine_info(args.sluice, "oha")
    try:
        calls, single, ratios, exact, logged = session(procs, workdir, args, settings)
    finally:
        stop_sidecars(procs)
        procs.stop_all()
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(calls, single, ratios, exact)
    for name, lines in logged.items():
        counts = {}
        for line in lines:
            counts[line] = counts.get(line, 0) + 1
        summary["notes"].append(f"{name} logged: " + "; ".join(f"{k} ×{v}" for k, v in counts.items()))
    result = {
        "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "sluice": args.sluice,
        "machine": {"nproc": info["nproc"], "cpu_model": info["cpu_model"], "kernel": info["kernel"],
                    "loadavg_at_start": info["loadavg_at_start"], "loadavg_at_end": os.getloadavg(),
                    "commit": info["tools"]["sluice_commit"],
                    "tools": {k: v for k, v in info["tools"].items() if k != "oha"}},
        "settings": settings,
        "pinning": {"sluice_cpu": CPU_PROXY, "load_upstream_redis_cpu": CPU_REST},
        "summary": summary,
        "ratios": ratios,
        "runs": {"calls_three_sidecars": calls, "single_sidecar": single, "exact": exact},
        "sidecar_log_warnings": logged,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    md = markdown(result)
    with open(os.path.join(args.out, "leases.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "leases.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"written: {os.path.join(args.out, 'leases.md')} and leases.json ({result['elapsed_s']} s)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); every started process was stopped")
        sys.exit(130)
