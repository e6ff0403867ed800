#!/usr/bin/env python3
"""Where the Redis path's tail latency comes from: one session, several
set-ups side by side.

    python3 bench/tail.py --sluice target/release/sluice --oha ~/.cache/sluice-bench/bin/oha \
        [--rate 13474] [--seconds 5] [--rounds 3] [--realtime] [--setups a,b,...] [--keep]

Every run is the harness's open-loop latency run (oha, 32 connections,
`--latency-correction`, on CPU 0 beside the nginx upstream) at one rate for
all, and reads, for the same run:

- the end-to-end p50 / p99 / p99.9 (oha) and, for sluice, its own
  `sluice_decision_duration_seconds{source="store"}` histogram (admin
  `/metrics`, before and after): how long the decision took inside
  sluice, Redis's round trip and sluice's reply handling included;
- Redis's own FCALL execution time (`INFO latencystats`, reset before the
  run): the script alone, no network, no queueing;
- a PING every 2 ms from this script (on CPU 0) over its own connection:
  how long Redis takes to answer anyone, its scheduling on its CPU
  included;
- each CPU's busy share (`/proc/stat`) and sluice's CPU per request.

Set-ups (rounds interleaved, A…Z then Z…A):
  direct            oha → upstream (the floor every figure is taken against)
  memory            sluice, memory store (`server.workers: 1`, CPU 1)
  redis             sluice on Redis, Redis on CPU 0 with oha and the upstream (bench/run.sh's layout)
  redis-cpu1        the same sluice, Redis moved to CPU 1 beside sluice (CPU 0: oha and the upstream only)
  redis-w2          sluice on Redis with `server.workers: 2` (both threads on CPU 1), Redis on CPU 0
  redis-half        `redis` at half the rate
  redis-noexpire    `redis` with Redis's active expiry off for the run (`DEBUG SET-ACTIVE-EXPIRE 0`):
                    no expiry cycle deleting the decisions' retry records (`PX 5s`, one per decision)
  redis-hz100       `redis` with `hz 100`: the expiry cycle runs ten times as often, each run a tenth as long

Writes bench/results/tail-run.md and tail-run.json (`--stem`). With
`--realtime` every process of the run is SCHED_RR: other work on a shared
machine then waits for the run instead of the run for it (the processes of
the run still share their CPUs with each other as they would, each running
until it blocks).
"""

import argparse
import datetime
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tools  # noqa: E402
from harness import BENCH, BUDGET_MS, CONNS, CPU_PROXY, CPU_REST, ROOT, Server, start_nginx  # noqa: E402
from tools import Processes, Redis  # noqa: E402

SETUPS = ["direct", "memory", "redis", "redis-noexpire", "redis-hz100", "redis-cpu1", "redis-w2", "redis-half"]


def log(msg):
    print(f"[tail {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def config(template, workers, **values):
    with open(os.path.join(BENCH, "configs", template)) as f:
        text = f.read()
    text = text.replace("workers: 1", f"workers: {workers}")
    for k, v in dict(values, BUDGET_MS=BUDGET_MS).items():
        text = text.replace(f"@@{k}@@", str(v))
    return text


def pin(pid, cpu):
    """Moves every thread of `pid` to `cpu`."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass


def cpu_times():
    """{cpu index: (busy, total, process time)} jiffies from /proc/stat;
    process time leaves out interrupts (loopback TCP is mostly softirq,
    charged to no process)."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            m = re.match(r"cpu(\d+) (.*)", line)
            if m:
                v = [int(x) for x in m.group(2).split()]
                idle = v[3] + v[4]
                out[int(m.group(1))] = (sum(v[:8]) - idle, sum(v[:8]), v[0] + v[1] + v[2])
    return out


def busy_share(before, after):
    return {cpu: (after[cpu][0] - before[cpu][0]) / max(1, after[cpu][1] - before[cpu][1]) for cpu in after}


def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def latencystats(redis):
    """Redis's own FCALL execution time percentiles (µs)."""
    line = redis.info("latencystats").get("latency_percentiles_usec_fcall")
    if not line:
        return {}
    return {k: float(v) for k, v in (kv.split("=") for kv in line.split(","))}


def run(setup, servers, redis, redis_proc, oha, rate, seconds):
    url_of = {
        "direct": (servers["upstream"], "/"),
        "memory": (servers["memory"], "/allowed"),
        "redis": (servers["redis"], "/allowed"),
        "redis-cpu1": (servers["redis"], "/allowed"),
        "redis-w2": (servers["redis-w2"], "/allowed"),
        "redis-half": (servers["redis"], "/allowed"),
        "redis-noexpire": (servers["redis"], "/allowed"),
        "redis-hz100": (servers["redis"], "/allowed"),
    }
    srv, path = url_of[setup]
    if setup == "redis-half":
        rate = rate // 2
    pin(redis_proc.pid, CPU_PROXY if setup == "redis-cpu1" else CPU_REST)
    if setup == "redis-noexpire":
        redis.cmd("DEBUG", "SET-ACTIVE-EXPIRE", "0")
    if setup == "redis-hz100":
        redis.cmd("CONFIG", "SET", "hz", "100")
    redis.cmd("CONFIG", "RESETSTAT")
    redis.cmd("LATENCY", "RESET")
    expired0 = int(redis.info("stats").get("expired_keys", 0))
    admin = srv.get("admin")
    before = tools.decision_buckets(admin) if admin else None
    sluice_cpu0 = tools.cpu_seconds(srv["pid"]) if admin else None
    redis_cpu0 = redis.cpu_seconds()
    upstream_cpu0 = tools.cpu_seconds(servers["upstream"]["pid"])
    ours = [p for p in (srv.get("pid"), redis_proc.pid, servers["upstream"]["pid"]) if p]
    ours0 = sum(tools.cpu_seconds(p) for p in set(ours)) + children_cpu()
    oha0 = children_cpu()
    cpus0 = cpu_times()
    t0 = time.monotonic()
    port = redis.sock.getpeername()[1]
    # Redis's round trip seen from the load generator's CPU and from
    # sluice's (where sluice's own connection waits for its replies).
    with tools.Pinger(port, CPU_REST) as pinger, tools.Pinger(port, CPU_PROXY) as pinger1:
        res = tools.run_oha(oha, f"http://127.0.0.1:{srv['port']}{path}", rate, seconds, CONNS, CPU_REST)
    cpus_after = cpu_times()
    wall = time.monotonic() - t0
    cpus = busy_share(cpus0, cpus_after)
    busy = sum(cpus_after[c][2] - cpus0[c][2] for c in cpus_after) / tools.CLK_TCK
    # What the rest of the machine did meanwhile, in CPUs: process time
    # less this run's own processes (oha counted as a child of this
    # script; this script's own PING thread is in it, about 0.02).
    others = (busy - (sum(tools.cpu_seconds(p) for p in set(ours)) + children_cpu() - ours0)) / wall
    answered = sum(res["statuses"].values()) or 1
    out = {
        "setup": setup, "rate": rate, "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"],
        "p999_ms": res["p999_ms"], "max_ms": res["max_ms"], "statuses": res["statuses"],
        "errors": res["errors"], "cpu_busy": cpus, "others_cpus": max(0.0, others),
        "oha_cpu_share": (children_cpu() - oha0) / wall,
        "redis_cpu_us_per_req": (redis.cpu_seconds() - redis_cpu0) * 1e6 / answered,
        "redis_cpu_share": (redis.cpu_seconds() - redis_cpu0) / wall,
        "upstream_cpu_share": (tools.cpu_seconds(servers["upstream"]["pid"]) - upstream_cpu0) / wall,
        "ping_p50_ms": pct(pinger.rtts, 0.5), "ping_p99_ms": pct(pinger.rtts, 0.99),
        "ping_max_ms": max(pinger.rtts) if pinger.rtts else None, "pings": len(pinger.rtts),
        "ping1_p50_ms": pct(pinger1.rtts, 0.5), "ping1_p99_ms": pct(pinger1.rtts, 0.99),
        "ping1_max_ms": max(pinger1.rtts) if pinger1.rtts else None,
        "redis_stall_seconds": None,
    }
    if admin:
        after = tools.decision_buckets(admin)
        out["decision"] = tools.decision_summary(before, after)
        out["sluice_cpu_us_per_req"] = (tools.cpu_seconds(srv["pid"]) - sluice_cpu0) * 1e6 / answered
    # Redis's own stalls of 1 ms or more (latency monitor): the event
    # loop, the expiry cycle, commands.
    out["redis_events"] = {e[0]: {"latest_ms": e[2], "max_ms": e[3]} for e in (redis.cmd("LATENCY", "LATEST") or [])}
    out["redis_event_samples"] = {
        name: [[s[0], s[1]] for s in (redis.cmd("LATENCY", "HISTORY", name) or [])] for name in out["redis_events"]}
    out["redis_stall_seconds"] = len({t for v in out["redis_event_samples"].values() for t, _ in v})
    out["expired_keys"] = int(redis.info("stats").get("expired_keys", 0)) - expired0
    if setup.startswith("redis"):
        out["fcall_usec"] = latencystats(redis)
    pin(redis_proc.pid, CPU_REST)
    if setup == "redis-hz100":
        redis.cmd("CONFIG", "SET", "hz", "10")
    if setup == "redis-noexpire":
        # The records kept meanwhile expire now, all at once (the expiry
        # cycle then runs its full 25 ms per tick): let that backlog pass
        # before the next run; with no load, every record is gone 5 s on.
        redis.cmd("DEBUG", "SET-ACTIVE-EXPIRE", "1")
        deadline = time.monotonic() + 20
        while redis.cmd("DBSIZE") > 100 and time.monotonic() < deadline:
            time.sleep(0.2)
        out["backlog_left"] = redis.cmd("DBSIZE")
    return out


def start_redis_debug(procs, workdir):
    """The harness's Redis, with `DEBUG` allowed from loopback (for
    `DEBUG SET-ACTIVE-EXPIRE`)."""
    port = tools.free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--dir", workdir, "--enable-debug-command", "local"]
    proc = procs.start("redis", argv, CPU_REST, os.path.join(workdir, "redis.log"))
    if not tools.wait_tcp(port, proc):
        return Server("redis", reason=f"redis-server did not start: {tools.tail(os.path.join(workdir, 'redis.log'))}")
    return Server("redis", proc, port)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--oha", default=shutil.which("oha") or "oha")
    ap.add_argument("--rate", type=int, default=13474, help="open-loop req/s (default: the last full run's)")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--stem", default="tail-run")
    ap.add_argument("--realtime", action="store_true",
                    help="run this script and every process it starts under SCHED_RR (priority 10): on a "
                         "machine shared with other work, only this run's processes then compete for the CPUs")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--wait-quiet", type=float, default=0,
                    help="first wait up to this many seconds for 5 s in which the machine is ≥ 85%% idle")
    args = ap.parse_args()
    if args.realtime:
        # Inherited by every process started from here on.
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(10))
    deadline = time.monotonic() + args.wait_quiet
    while time.monotonic() < deadline:
        before = cpu_times()
        time.sleep(5)
        if sum(busy_share(before, cpu_times()).values()) <= 0.3:
            break
    setups = args.setups.split(",")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    # This script's own threads (the pinger) run beside the load generator.
    os.sched_setaffinity(0, {CPU_REST})
    loadavg = os.getloadavg()
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-tail-")
    runs = []
    try:
        upstream = start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", CPU_REST)
        redis_srv = start_redis_debug(procs, workdir)
        for s in (upstream, redis_srv):
            if s.reason:
                raise SystemExit(s.reason)
        servers = {"upstream": {"port": upstream.port, "pid": upstream.pid}}
        for name, template, workers in (("memory", "sluice-memory.yaml", 1), ("redis", "sluice-redis.yaml", 1),
                                        ("redis-w2", "sluice-redis.yaml", 2)):
            text = config(template, workers, UPSTREAM_PORT=upstream.port, REDIS_PORT=redis_srv.port)
            proc, port, admin, _ = tools.start_sluice(procs, workdir, args.sluice, text, name, CPU_PROXY)
            servers[name] = {"port": port, "admin": admin, "pid": proc.pid}
        redis = Redis(redis_srv.port)
        redis.cmd("CONFIG", "SET", "latency-monitor-threshold", "1")
        log(f"warm-up, then {args.rounds} rounds of {args.seconds} s at {args.rate} req/s: {' '.join(setups)}")
        for s in setups:
            run(s, servers, redis, redis_srv.proc, args.oha, args.rate, 1)
        for r in range(args.rounds):
            order = setups if r % 2 == 0 else list(reversed(setups))
            for s in order:
                out = run(s, servers, redis, redis_srv.proc, args.oha, args.rate, args.seconds)
                out["round"] = r + 1
                runs.append(out)
                d = out.get("decision") or {}
                log(f"round {r + 1} {s:<11} p50 {out['p50_ms']:.3f} p99 {out['p99_ms']:.3f} "
                    f"p99.9 {out['p999_ms']:.3f} ms; decision p99 {_f(d.get('p99_ms'))} ms; "
                    f"ping p99 {_f(out['ping_p99_ms'])} ms; cpu0 {out['cpu_busy'][0]:.0%} cpu1 {out['cpu_busy'][1]:.0%}; "
                    f"others {out['others_cpus']:.2f} CPUs; redis events {out['redis_events']}; expired {out['expired_keys']}")
        redis.close()
    finally:
        procs.stop_all()
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "rate": args.rate, "seconds": args.seconds, "rounds": args.rounds, "loadavg": loadavg,
        "realtime": args.realtime,
        "runs": runs,
    }
    with open(os.path.join(BENCH, "results", args.stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    md = render(result, setups)
    with open(os.path.join(BENCH, "results", args.stem + ".md"), "w") as f:
        f.write(md)
    print(md)


def _f(v, digits=3):
    return "—" if v is None else f"{v:.{digits}f}"


def render(result, setups):
    """One row per set-up: medians over rounds; added = minus direct's in the same round."""
    by = {}
    for r in result["runs"]:
        by.setdefault(r["setup"], []).append(r)
    direct = {r["round"]: r for r in by.get("direct", [])}

    def med(rows, get):
        vals = [v for v in (get(r) for r in rows) if v is not None]
        return statistics.median(vals) if vals else None

    lines = [
        f"# Tail latency on the Redis path, set-ups side by side — {result['generated_at']}", "",
        ("Every process of the run under SCHED_RR (`--realtime`). " if result.get("realtime") else ""),
        f"Commit {result['commit']}; open loop {result['rate']} req/s (`redis-half`: half), "
        f"{result['seconds']} s, {result['rounds']} rounds interleaved, oha 32 connections with latency "
        f"correction on CPU 0; load average at start {', '.join(f'{x:.2f}' for x in result['loadavg'])}. "
        "Medians over rounds; *added* is minus `direct` in the same round.", "",
        "| set-up | added p50 / p99 / p99.9 (ms) | decision p50 / p99 / p99.9 (ms) | decisions > 1 ms | "
        "Redis FCALL p50 / p99 / p99.9 (µs) | PING from CPU 0, p50 / p99 / max (ms) | PING from CPU 1, p50 / p99 / max (ms) | Redis stalls ≥ 1 ms: worst (ms), seconds with one | CPU 0 / CPU 1 busy | oha / upstream / Redis CPU | other work (CPUs) | sluice µs/req | answers |",
        "|---|---|---|---:|---|---|---|---|---|---|---:|---:|---|",
    ]
    for s in setups:
        rows = by.get(s, [])
        if not rows:
            continue

        def added(key):
            if s == "direct":
                return med(rows, lambda r: r[key])
            return med(rows, lambda r: r[key] - direct[r["round"]][key] if r["round"] in direct else None)

        lat = " / ".join(_f(added(k)) for k in ("p50_ms", "p99_ms", "p999_ms"))
        if s == "direct":
            lat += " (absolute)"
        dec = " / ".join(_f(med(rows, lambda r, k=k: (r.get("decision") or {}).get(k))) for k in
                         ("p50_ms", "p99_ms", "p999_ms")) if rows[0].get("decision") else "—"
        over = med(rows, lambda r: (r.get("decision") or {}).get("over_1ms"))
        fc = " / ".join(_f(med(rows, lambda r, k=k: (r.get("fcall_usec") or {}).get(k)), 0) for k in
                        ("p50", "p99", "p99.9")) if rows[0].get("fcall_usec") else "—"
        ping = " / ".join(_f(med(rows, lambda r, k=k: r[k])) for k in ("ping_p50_ms", "ping_p99_ms", "ping_max_ms"))
        ping1 = " / ".join(_f(med(rows, lambda r, k=k: r.get(k))) for k in
                           ("ping1_p50_ms", "ping1_p99_ms", "ping1_max_ms"))
        worst = max((e["max_ms"] for r in rows for e in r.get("redis_events", {}).values()), default=0)
        stall = f"{worst} / {med(rows, lambda r: r.get('redis_stall_seconds')) or 0:.0f}"
        cpu = f"{med(rows, lambda r: r['cpu_busy'][0]):.0%} / {med(rows, lambda r: r['cpu_busy'][1]):.0%}"
        shares = " / ".join(f"{med(rows, lambda r, k=k: r.get(k)) or 0:.0%}" for k in
                            ("oha_cpu_share", "upstream_cpu_share", "redis_cpu_share"))
        statuses = {}
        for r in rows:
            for k, v in r["statuses"].items():
                statuses[k] = statuses.get(k, 0) + v
        ans = ", ".join(f"{k}×{v}" for k, v in sorted(statuses.items()))
        lines.append(f"| {s} | {lat} | {dec} | {_f(over * 100, 2) + '%' if over is not None else '—'} | {fc} | "
                     f"{ping} | {ping1} | {stall} | {cpu} | {shares} | {_f(med(rows, lambda r: r.get('others_cpus')), 2)} | {_f(med(rows, lambda r: r.get('sluice_cpu_us_per_req')), 1)} | {ans} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); every started process was stopped")
        sys.exit(130)
