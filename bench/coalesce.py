#!/usr/bin/env python3
"""Coalesced decisions (`store.coalesce`): what a decision costs Redis and
the sidecar, one call per decision (off) beside batches (on), in one run.

Two sidecars of one binary, `store.coalesce: off` and `on`, both on CPU 0
(taskset, `server.workers: 1`), share one Redis alone on CPU 1; wrk
(closed loop, bench/wrk/subjects.lua: a subject never sent before on
every request) and the upstream (nginx) run on CPU 0 too. For each connection
count, each sidecar in turn gets the same load; measured over the run:

- Redis CPU per decision: redis-server's used_cpu_sys + used_cpu_user
  (INFO cpu) delta / decisions, networking included; and the `FCALL`s'
  own time (INFO commandstats usec) / decisions;
- sidecar CPU per decision: utime + stime from /proc/PID/stat;
- calls: `FCALL`s per decision (commandstats), and the batches the
  sidecar counted (sluice_redis_batches_total, ..._batched_decisions_total);
- latency p50 / p99 (wrk --latency), throughput.

The baseline one-line INCR + EXPIRE script (bench/redis_cost.py) is
replayed on the same Redis with redis-benchmark (32 connections, many
subjects): the ratio is Redis's whole CPU per decision over the
baseline's per call.

    python3 bench/coalesce.py --sluice target/release/sluice [--seconds 4] [--rounds 3]

With `--instructions`, it also replays the fixed-window call as sluice
sends it (captured, a fresh subject and evaluation id per decision) alone
and in batches of 4, 16 and 64 against a redis-server under callgrind,
and counts redis-server's instructions per decision beside the baseline
script's per call: the noise-free figure of what batching spares Redis.

Writes bench/results/coalesce.md and coalesce.json, and prints the table.
"""

import argparse
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redis_cost  # noqa: E402
import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
WRK_SCRIPT = os.path.join(HERE, "wrk", "subjects.lua")

# Redis alone on CPU 1, as bench/redis_cost.py measures its baseline: a
# core shared with wrk and the upstream inflates its CPU time per call.
# The sidecar, wrk and the upstream share CPU 0 (each process's own CPU
# time is what is counted).
CPU_REDIS = "1"
CPU_SIDECAR = "0"
CPU_REST = "0"
CONNECTIONS = [1, 8, 32, 128]

CONFIG = """version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  workers: 1
upstream:
  url: http://127.0.0.1:{upstream}
store:
  kind: redis
  url: redis://127.0.0.1:{redis}
  budget: 1s
  coalesce: {coalesce}
  deny_cache_entries: 0
identity:
  pseudonym_key: bench-pseudonym-key-not-a-secret
policies:
  wide: {{ algorithm: fixed-window, limit: 1000000000, window: 1h }}
routes:
  - {{ name: api, match: {{ path_prefix: / }}, subject: header:X-Subject, policy: wide }}
"""


def start_upstream(procs, workdir):
    """nginx answering 200, on CPU 1, with room for every connection."""
    port = tools.free_port()
    conf = os.path.join(workdir, "up.conf")
    os.makedirs(os.path.join(workdir, "up-tmp"), exist_ok=True)
    with open(conf, "w") as f:
        f.write(f"""worker_processes 1; daemon off; pid {workdir}/up.pid;
error_log {workdir}/up.error.log; events {{ worker_connections 4096; }}
http {{ access_log off; client_body_temp_path {workdir}/up-tmp;
proxy_temp_path {workdir}/up-tmp; fastcgi_temp_path {workdir}/up-tmp;
uwsgi_temp_path {workdir}/up-tmp; scgi_temp_path {workdir}/up-tmp;
server {{ listen 127.0.0.1:{port}; keepalive_requests 1000000;
location / {{ return 200 "ok"; }} }} }}
""")
    proc = procs.start("upstream", ["nginx", "-p", workdir, "-c", conf], CPU_REST,
                       os.path.join(workdir, "up.log"))
    if not tools.wait_tcp(port, proc):
        raise SystemExit("the upstream did not start")
    return port


def log(msg):
    print(f"[coalesce] {msg}", flush=True)


def scrape(admin_port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def fcall_stats(r):
    raw = r.info("commandstats").get("cmdstat_fcall", "")
    calls = re.search(r"calls=(\d+)", raw)
    usec = re.search(r"usec=(\d+)", raw)
    return (int(calls.group(1)) if calls else 0, int(usec.group(1)) if usec else 0)


def to_ms(value, unit):
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(port, conns, seconds):
    prefix = "%08x" % random.getrandbits(32)
    argv = ["taskset", "-c", CPU_REST, "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout=5s",
            "--latency", "-s", WRK_SCRIPT, f"http://127.0.0.1:{port}/api", "--", "X-Subject", prefix,
            "0", str(random.getrandbits(24))]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    text = out.stdout
    m_req = re.search(r"(\d+) requests in", text)
    if out.returncode != 0 or not m_req:
        raise SystemExit("wrk failed: " + (out.stderr.strip() or text.strip())[-400:])
    statuses = {}
    for m in re.finditer(r"^STATUS \d+ (\d+) (\d+)$", text, re.M):
        statuses[m.group(1)] = statuses.get(m.group(1), 0) + int(m.group(2))
    pct = {p: to_ms(v, u) for p, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)$", text, re.M)}
    errors = re.search(r"^ERRORS (\d+) (\d+) (\d+) (\d+) (\d+)$", text, re.M)
    return {"requests": int(m_req.group(1)), "statuses": statuses,
            "p50_ms": pct.get("50"), "p99_ms": pct.get("99"),
            "errors": sum(int(x) for x in errors.groups()) if errors else 0}


BATCH_SIZES = [1, 4, 16, 64]


def batch_call(single, n):
    """`single` (an FCALL captured and made fresh) as one call of the
    library's batch function deciding `n` evaluations; `single` itself
    for 1."""
    if n == 1:
        return single
    keys, rest = single[3:5], single[5:]
    call = ["FCALL", single[1] + "_batch", str(2 * n)]
    for _ in range(n):
        call += keys
    # Versions whose calls say whether they are a first attempt (ARGV[1],
    # `1` or `0`) say it once for a whole batch.
    if rest[0] in ("0", "1"):
        call.append(rest[0])
        rest = rest[1:]
    for _ in range(n):
        call += [rest[0], rest[1], ""]
    return call


def instructions(sluice, calls):
    """redis-server instructions per decision under callgrind: the baseline
    script per call, and sluice's fixed-window decision alone and batched."""
    procs = Processes()
    out_rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-coalesce-instr-") as workdir:
            port = tools.free_port()
            out = os.path.join(workdir, "callgrind.out")
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={out}.%p", "redis-server", "--port", str(port),
                    "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--daemonize", "no", "--dir", workdir]
            redis = procs.start("redis", argv, None, os.path.join(workdir, "redis.log"))
            if not tools.wait_tcp(port, redis, timeout=60):
                raise SystemExit("redis-server did not start under valgrind")
            r = Redis(port)
            sha = r.cmd("SCRIPT", "LOAD", redis_cost.BASELINE)
            captured = redis_cost.capture(procs, workdir, sluice, port)

            def control(*what):
                subprocess.run(["callgrind_control", *what, str(redis.pid)],
                               capture_output=True, check=True)

            def count(call, n):
                r.cmd("FLUSHALL")
                control("-z")
                control("-i", "on")
                subprocess.run(["redis-benchmark", "-p", str(port), "-c", "4", "-n", str(n),
                                "-r", str(redis_cost.KEYSPACE), "-q", *call],
                               capture_output=True, check=True, timeout=1800)
                control("-i", "off")
                before = set(glob.glob(out + ".*"))
                control("-d")
                time.sleep(0.3)
                dumps = sorted(set(glob.glob(out + ".*")) - before, key=os.path.getmtime)
                with open(dumps[-1]) as f:
                    total = int(re.search(r"^totals: (\d+)", f.read(), re.M).group(1))
                for d in dumps:
                    os.unlink(d)
                return total / n

            base = count(["EVALSHA", sha, "1", "seed:__rand_int__", "3600", "1000000000"], calls)
            single = redis_cost.fresh(captured["fixed-window"], True)
            for n in BATCH_SIZES:
                per = count(batch_call(single, n), max(calls // n, 20)) / n
                out_rows.append({"batch": n, "instructions": per, "baseline": base,
                                 "ratio": per / base})
                log(f"batch of {n:2}: {per:,.0f} instructions per decision, "
                    f"{per / base:.2f}× the baseline's {base:,.0f}")
            r.close()
    finally:
        procs.stop_all()
    return out_rows


def median(runs):
    """The run whose Redis CPU per decision is the median of `runs`."""
    ordered = sorted(runs, key=lambda row: row["redis_cpu_us"])
    return dict(ordered[len(ordered) // 2])


def measure(r, sidecar, conns, seconds):
    proc, port, admin = sidecar
    r.cmd("CONFIG", "RESETSTAT")
    redis_before = r.cpu_seconds()
    sidecar_before = tools.cpu_seconds(proc.pid)
    batches_before = scrape(admin, "sluice_redis_batches_total")
    batched_before = scrape(admin, "sluice_redis_batched_decisions_total")
    t0 = time.monotonic()
    load = wrk(port, conns, seconds)
    wall = time.monotonic() - t0
    redis_cpu = r.cpu_seconds() - redis_before
    sidecar_cpu = tools.cpu_seconds(proc.pid) - sidecar_before
    calls, usec = fcall_stats(r)
    batches = scrape(admin, "sluice_redis_batches_total") - batches_before
    batched = scrape(admin, "sluice_redis_batched_decisions_total") - batched_before
    decisions = load["statuses"].get("200", 0)
    if decisions == 0 or decisions != load["requests"] or load["errors"]:
        raise SystemExit(f"not every request was decided and allowed: {load}")
    return {
        "connections": conns, "decisions": decisions, "rps": decisions / wall,
        "redis_cpu_us": redis_cpu * 1e6 / decisions, "fcall_us": usec / decisions,
        "sidecar_cpu_us": sidecar_cpu * 1e6 / decisions,
        "fcalls": calls, "decisions_per_call": decisions / calls if calls else None,
        "batches": batches, "mean_batch": batched / batches if batches else None,
        "batched_share": batched / decisions,
        "p50_ms": load["p50_ms"], "p99_ms": load["p99_ms"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="target/release/sluice")
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--baseline-calls", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of each (connections, coalesce), alternating; the median is kept")
    ap.add_argument("--instructions", action="store_true",
                    help="also count redis-server instructions per decision by batch size (callgrind)")
    ap.add_argument("--instr-calls", type=int, default=2000)
    args = ap.parse_args()
    procs = Processes()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-coalesce-") as workdir:
            redis_cost.CPU_REDIS = CPU_REDIS
            redis_cost.CPU_CLIENT = CPU_REST
            redis_proc, redis_port = redis_cost.start_redis(procs, workdir)
            r = Redis(redis_port)
            upstream = start_upstream(procs, workdir)
            sidecars = {}
            for mode in ("off", "on"):
                text = CONFIG.format(upstream=upstream, redis=redis_port, coalesce=mode)
                proc, port, admin, _ = tools.start_sluice(procs, workdir, args.sluice, text,
                                                          f"sluice-{mode}", cpu=CPU_SIDECAR)
                sidecars[mode] = (proc, port, admin)
                # Scripts loaded, connections open.
                wrk(port, 8, 1)
            runs = {}
            for _ in range(args.rounds):
                for conns in CONNECTIONS:
                    for mode in ("off", "on"):
                        row = measure(r, sidecars[mode], conns, args.seconds)
                        row["coalesce"] = mode
                        runs.setdefault((conns, mode), []).append(row)
                        log(f"{conns:4} conns coalesce {mode:3}: Redis {row['redis_cpu_us']:5.1f} µs/decision "
                            f"(FCALL {row['fcall_us']:5.1f}), sidecar {row['sidecar_cpu_us']:5.1f} µs, "
                            f"{row['decisions_per_call'] or 0:5.1f} decisions/call, {row['rps']:7.0f}/s, "
                            f"p50 {row['p50_ms']} p99 {row['p99_ms']} ms")
                        r.cmd("FLUSHALL")
            for conns in CONNECTIONS:
                for mode in ("off", "on"):
                    row = median(runs[(conns, mode)])
                    row["runs"] = runs[(conns, mode)]
                    rows.append(row)
            r.cmd("FLUSHALL")
            sha = r.cmd("SCRIPT", "LOAD", redis_cost.BASELINE)
            redis_cost.CPU_CLIENT = CPU_SIDECAR
            baseline = redis_cost.replay(redis_proc.pid, r, redis_port,
                                         ["EVALSHA", sha, "1", "seed:__rand_int__", "3600", "1000000000"],
                                         args.baseline_calls, 32)
            log(f"baseline INCR + EXPIRE script: {baseline['cpu_us_per_call']:.1f} µs of Redis CPU per call")
            r.close()
    finally:
        procs.stop_all()
    instr = instructions(args.sluice, args.instr_calls) if args.instructions else []
    base = baseline["cpu_us_per_call"]
    for row in rows:
        row["ratio"] = row["redis_cpu_us"] / base
    result = {"generated_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "seconds": args.seconds, "rounds": args.rounds, "instructions": instr, "baseline_cpu_us_per_call": base, "rows": rows}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "coalesce.json"), "w") as f:
        json.dump(result, f, indent=2)

    def num(v, fmt):
        return "—" if v is None else format(v, fmt)

    lines = [
        "# Coalesced decisions: Redis and sidecar CPU per decision, coalesce off → on",
        "",
        f"{result['generated_at']}; `bench/coalesce.py`, {args.seconds} s of closed-loop wrk per run, "
        f"{args.rounds} rounds alternating off and on, the run of median Redis CPU shown; a "
        "subject never sent before on every request (fixed-window, no over-limit cache); one sidecar "
        "at a time on CPU 0 (`server.workers: 1`) with wrk and the upstream, Redis alone on CPU 1. Redis CPU: "
        "used_cpu_sys + used_cpu_user per decision, networking included; FCALL: commandstats usec per "
        "decision. Ratio: Redis CPU per decision over the one-line INCR + EXPIRE script's per call "
        f"({base:.1f} µs, redis-benchmark, 32 connections, many subjects, same Redis).",
        "",
        "| connections | coalesce | decisions/s | Redis CPU µs/decision | FCALL µs/decision | sidecar CPU µs/decision | decisions per FCALL | mean batch | p50 ms | p99 ms | ratio to INCR+EXPIRE |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['connections']} | {row['coalesce']} | {row['rps']:.0f} | {row['redis_cpu_us']:.1f} | "
            f"{row['fcall_us']:.1f} | {row['sidecar_cpu_us']:.1f} | {num(row['decisions_per_call'], '.1f')} | "
            f"{num(row['mean_batch'], '.1f')} | {num(row['p50_ms'], '.2f')} | {num(row['p99_ms'], '.2f')} | "
            f"{row['ratio']:.2f} |")
    if instr:
        lines += [
            "",
            "redis-server instructions per decision (callgrind, redis-benchmark with 4 connections, the "
            "fixed-window call as sluice sends it, a fresh subject and evaluation id per decision), alone "
            "and in batches, beside the one-line INCR + EXPIRE script's per call:",
            "",
            "| decisions per call | instructions per decision | baseline per call | ratio |",
            "|---|---|---|---|",
        ]
        for row in instr:
            lines.append(f"| {row['batch']} | {row['instructions']:,.0f} | {row['baseline']:,.0f} | "
                         f"{row['ratio']:.2f} |")
    with open(os.path.join(RESULTS, "coalesce.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
