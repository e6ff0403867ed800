#!/usr/bin/env python3
"""What one sluice decision costs Redis, beside the baseline INCR + EXPIRE fixed-window script.

For each algorithm, sluice's real call is captured from a running sluice
(MONITOR while it decides one request), then replayed with redis-benchmark
at saturation (32 connections) against a Redis pinned alone on one CPU,
with a fresh evaluation id per call: once on one hot subject, once on many
subjects. The baseline INCR + EXPIRE fixed-window script is replayed the same way, right
after, on the same Redis. Redis CPU per call comes from /proc (utime +
stime of redis-server over the run), so the ratio compares what Redis
spent, not what the client saw.

    python3 bench/redis_cost.py --sluice target/release/sluice [--calls N]
        [--before OTHER/sluice]

The call is replayed as sluice sends it on a first send: since decisions
say whether they are a first attempt (ARGV[1], lua/README.md), that is `1`,
and the script does not look for a record (a re-send, `0`, adds one GET).
With --before, a second binary's calls (an earlier version) are captured
too and replayed beside these, algorithm by algorithm on the same Redis,
each against the same baseline: the table then shows both, side by side.
With --denied, every limit is 1 and only the hot subject is replayed:
every call after the first is a denial (the baseline's too), and the
results go to redis-cost-denied.md and .json.

Writes bench/results/redis-cost.md and redis-cost.json, and prints the table.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

# Redis alone on CPU 1; sluice (for the capture) and redis-benchmark on CPU 0.
CPU_REDIS = "1"
CPU_CLIENT = "0"

BASELINE = """local count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
if count > tonumber(ARGV[2]) then
  return 0
end
return 1"""

# One route per algorithm; limits no replay reaches (a denial is cheaper
# and would flatter sluice).
CONFIG = """version: 1
server:
  listen: 127.0.0.1:0
  workers: 1
upstream:
  url: http://127.0.0.1:{upstream}
store:
  kind: redis
  url: redis://127.0.0.1:{redis}
  budget: 1s
  deny_cache_entries: 0
identity:
  pseudonym_key: bench-pseudonym-key-not-a-secret
policies:
  fixed-window: {{ algorithm: fixed-window, limit: 1000000000, window: 1h, lease: off }}
  sliding-counter: {{ algorithm: sliding-counter, limit: 1000000000, window: 1h, lease: off }}
  sliding-log: {{ algorithm: sliding-log, limit: 1000000000, window: 10s }}
  token-bucket: {{ algorithm: token-bucket, capacity: 1000000, refill_tokens: 1000000, refill_every: 1s, lease: off }}
  gcra: {{ algorithm: gcra, limit: 1000000, window: 1s, burst: 1000000, lease: off }}
routes:
  - {{ name: fw, match: {{ path: /fixed-window }}, subject: client_ip, policy: fixed-window }}
  - {{ name: sc, match: {{ path: /sliding-counter }}, subject: client_ip, policy: sliding-counter }}
  - {{ name: sl, match: {{ path: /sliding-log }}, subject: client_ip, policy: sliding-log }}
  - {{ name: tb, match: {{ path: /token-bucket }}, subject: client_ip, policy: token-bucket }}
  - {{ name: gc, match: {{ path: /gcra }}, subject: client_ip, policy: gcra }}
"""

ALGORITHMS = ["fixed-window", "sliding-counter", "sliding-log", "token-bucket", "gcra"]

# CONFIG's routes, every limit 1 and every window an hour (--denied): on
# one hot subject, every call after the first is a denial.
DENIED_CONFIG = re.sub(r"(window|refill_every): [0-9]+[a-z]+", r"\1: 1h",
                       re.sub(r"(limit|capacity|refill_tokens|burst): [0-9]+", r"\1: 1", CONFIG))


def log(msg):
    print(f"[redis-cost] {msg}", flush=True)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def start_redis(procs, workdir):
    port = tools.free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--dir", workdir]
    proc = procs.start("redis", argv, CPU_REDIS, os.path.join(workdir, "redis.log"))
    if not tools.wait_tcp(port, proc):
        raise SystemExit("redis-server did not start")
    return proc, port


def start_upstream(procs, workdir):
    """A tiny upstream for the capture: nginx answering 200."""
    port = tools.free_port()
    conf = os.path.join(workdir, "up.conf")
    os.makedirs(os.path.join(workdir, "up-tmp"), exist_ok=True)
    with open(conf, "w") as f:
        f.write(f"""worker_processes 1; daemon off; pid {workdir}/up.pid;
error_log {workdir}/up.error.log; events {{ worker_connections 64; }}
http {{ access_log off; client_body_temp_path {workdir}/up-tmp;
proxy_temp_path {workdir}/up-tmp; fastcgi_temp_path {workdir}/up-tmp;
uwsgi_temp_path {workdir}/up-tmp; scgi_temp_path {workdir}/up-tmp;
server {{ listen 127.0.0.1:{port}; location / {{ return 200 "ok"; }} }} }}
""")
    proc = procs.start("upstream", ["nginx", "-p", workdir, "-c", conf], CPU_CLIENT,
                       os.path.join(workdir, "up.log"))
    if not tools.wait_tcp(port, proc):
        raise SystemExit("the capture upstream did not start")
    return port


def capture(procs, workdir, sluice, redis_port, upstream=None, config=None):
    """Each algorithm's call as sluice sends it (FCALL; EVALSHA from versions
    before Redis Functions), read off MONITOR. `upstream`: the capture
    upstream's port, started here when not given; `config`: CONFIG unless
    given (the same routes, other limits)."""
    if upstream is None:
        upstream = start_upstream(procs, workdir)
    conf = os.path.join(workdir, "sluice.yaml")
    with open(conf, "w") as f:
        f.write((config or CONFIG).format(upstream=upstream, redis=redis_port))
    logf = os.path.join(workdir, "sluice.log")
    proc = procs.start("sluice", [sluice, "run", "--config", conf], CPU_CLIENT, logf)
    addr = None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not addr:
        with open(logf) as f:
            for line in f:
                m = re.search(r'"traffic_addr":"([0-9.:]+)"', line)
                if m:
                    addr = m.group(1)
        time.sleep(0.05)
    if not addr:
        raise SystemExit("sluice did not start: " + tools.tail(logf))
    monitor = subprocess.Popen(["redis-cli", "-p", str(redis_port), "monitor"],
                               stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    import urllib.error
    import urllib.request
    for a in ALGORITHMS:
        # The first call may find the scripts still loading: ask twice.
        for _ in range(2):
            try:
                with urllib.request.urlopen(f"http://{addr}/{a}", timeout=5) as r:
                    r.read()
            except urllib.error.HTTPError as e:
                # A 429 is a decision too (a capture of denials).
                if e.code != 429:
                    raise
    time.sleep(0.3)
    monitor.terminate()
    out, _ = monitor.communicate(timeout=5)
    procs.stop(proc)
    calls = {}
    for line in out.splitlines():
        m = re.match(r'^[0-9.]+ \[[^]]*\] (.*)$', line)
        if not m:
            continue
        args = shlex.split(m.group(1))
        if not args or args[0].upper() not in ("FCALL", "EVALSHA"):
            continue
        key = args[3]
        policy = key.split("{", 1)[1].split(":", 1)[0]
        calls[policy] = args
    missing = [a for a in ALGORITHMS if a not in calls]
    if missing:
        raise SystemExit(f"no FCALL (or EVALSHA) captured for {missing}")
    return calls


def id_at(args):
    """Where the evaluation id is: ARGV[1], or ARGV[2] after the first-attempt
    flag (`1` or `0`) of versions that send one."""
    numkeys = int(args[2])
    first = 3 + numkeys
    return first + 1 if args[first] in ("0", "1") else first


def fresh(args, many):
    """The captured call with a fresh evaluation id per call (20 zeros and
    redis-benchmark's 12-digit __rand_int__: 32 hex digits) and, for many
    subjects, a fresh subject too."""
    out = list(args)
    numkeys = int(out[2])
    fresh_id = "0" * 20 + "__rand_int__"
    for k in range(3, 3 + numkeys):
        if many:
            out[k] = re.sub(r"v1:[^}]*\}", "v1:__rand_int__}", out[k])
        # The record's key names the id too: a captured one would be found
        # on every call after the first, and replayed.
        out[k] = re.sub(r":e:[0-9a-f]{32}$", ":e:" + fresh_id, out[k])
    out[id_at(out)] = fresh_id
    return out


def script_usec(r, command="evalsha"):
    """Microseconds per call of `command` (FCALL or EVALSHA: the function or
    script and every command inside it), from INFO commandstats since the
    last CONFIG RESETSTAT."""
    raw = r.info("commandstats").get(f"cmdstat_{command}", "")
    m = re.search(r"usec_per_call=([0-9.]+)", raw)
    return float(m.group(1)) if m else None


# redis-benchmark reads -r with atoi: 10^12 overflowed, every __rand_int__
# then stayed one value, and every call after the first replayed the first
# one's record (one GET). 10^9 fits, still written as 12 digits.
KEYSPACE = 1_000_000_000


def replay(redis_pid, r, port, args, calls, clients):
    """redis-benchmark at saturation: the script's own µs per call
    (commandstats) and Redis's whole CPU per call, networking included."""
    r.cmd("CONFIG", "RESETSTAT")
    before = cpu_seconds(redis_pid)
    cmd = ["taskset", "-c", CPU_CLIENT, "redis-benchmark", "-p", str(port), "-c", str(clients),
           "-n", str(calls), "-r", str(KEYSPACE), "-q", "--csv", *args]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    cpu = cpu_seconds(redis_pid) - before
    if out.returncode != 0:
        raise SystemExit(f"redis-benchmark failed: {out.stderr[-400:]}")
    # Each decided call reads TIME once; a replayed record does not.
    time_raw = r.info("commandstats").get("cmdstat_time", "")
    m = re.search(r"calls=([0-9]+)", time_raw)
    return {"script_us_per_call": script_usec(r, args[0].lower()), "cpu_us_per_call": cpu * 1e6 / calls,
            "calls_per_s": calls / wall, "decided": (int(m.group(1)) if m else 0) / calls}


def measure(redis_pid, r, port, call_args, many, calls, clients, name):
    call = replay(redis_pid, r, port, fresh(call_args, many), calls, clients)
    if call["decided"] < 0.99:
        raise SystemExit(f"{name}: only {call['decided']:.1%} of the calls decided "
                         "afresh (the rest replayed a record)")
    return call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="target/release/sluice")
    ap.add_argument("--before", default=None,
                    help="another sluice binary (an earlier version), measured beside --sluice")
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--denied", action="store_true",
                    help="limits of 1, the hot subject only: what a denial costs")
    args = ap.parse_args()
    config = DENIED_CONFIG if args.denied else None
    limit = "1" if args.denied else "1000000000"
    stem = "redis-cost-denied" if args.denied else "redis-cost"
    procs = Processes()
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-redis-cost-") as workdir:
            redis_proc, port = start_redis(procs, workdir)
            r = Redis(port)
            baseline_sha = r.cmd("SCRIPT", "LOAD", BASELINE)
            upstream = start_upstream(procs, workdir)
            log("capturing each algorithm's call from a running sluice")
            captured = capture(procs, workdir, args.sluice, port, upstream, config)
            for a in ALGORITHMS:
                at = id_at(captured[a])
                flag = captured[a][at - 1] if at > 3 + int(captured[a][2]) else "none"
                log(f"{a}: first-attempt argument {flag}")
            before = None
            if args.before:
                log(f"capturing each algorithm's call from {args.before}")
                before = capture(procs, workdir, args.before, port, upstream, config)
            rows = []
            for many in (False,) if args.denied else (False, True):
                label = "many subjects" if many else "one hot subject"
                if args.denied:
                    label = "one hot subject, denied"
                r.cmd("FLUSHALL")
                for a in ALGORITHMS:
                    row = {"algorithm": a, "subjects": label}
                    if before:
                        old = measure(redis_proc.pid, r, port, before[a], many, args.calls,
                                      args.clients, f"{a} (before)")
                        r.cmd("FLUSHALL")
                    call = measure(redis_proc.pid, r, port, captured[a], many, args.calls,
                                   args.clients, a)
                    key = "seed:__rand_int__" if many else "seed:hot"
                    seed = replay(redis_proc.pid, r, port,
                                  ["EVALSHA", baseline_sha, "1", key, "3600", limit],
                                  args.calls, args.clients)
                    ratio = call["script_us_per_call"] / seed["script_us_per_call"]
                    cpu_ratio = call["cpu_us_per_call"] / seed["cpu_us_per_call"]
                    row.update({"sluice": call, "baseline": seed, "ratio": ratio,
                                "cpu_ratio": cpu_ratio})
                    if before:
                        row["before"] = old
                        row["before_ratio"] = old["script_us_per_call"] / seed["script_us_per_call"]
                        row["before_cpu_ratio"] = old["cpu_us_per_call"] / seed["cpu_us_per_call"]
                        log(f"{a:16} {label:16} before: script {old['script_us_per_call']:6.2f} µs, "
                            f"whole CPU {old['cpu_us_per_call']:.1f} µs ({row['before_cpu_ratio']:.2f}×)")
                    rows.append(row)
                    log(f"{a:16} {label:16} script {call['script_us_per_call']:6.2f} µs vs baseline "
                        f"{seed['script_us_per_call']:5.2f} µs: {ratio:.2f}×; whole Redis CPU "
                        f"{call['cpu_us_per_call']:.1f} vs {seed['cpu_us_per_call']:.1f} µs: {cpu_ratio:.2f}×")
                    r.cmd("FLUSHALL")
            r.close()
    finally:
        procs.stop_all()
    os.makedirs(RESULTS, exist_ok=True)
    result = {"generated_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "calls": args.calls, "clients": args.clients, "rows": rows,
              "captured": {a: captured[a] for a in ALGORITHMS}}
    if before:
        result["captured_before"] = {a: before[a] for a in ALGORITHMS}
    with open(os.path.join(RESULTS, stem + ".json"), "w") as f:
        json.dump(result, f, indent=2)
    lines = [
        "# Redis CPU per decision, beside the baseline INCR + EXPIRE fixed-window script",
        "",
        f"{result['generated_at']}; redis-benchmark, {args.clients} connections, {args.calls} calls "
        "each, a fresh evaluation id per call, sent as a first attempt where the version says so; "
        "Redis alone on one CPU. Script µs: INFO "
        "commandstats `usec_per_call` of FCALL (the function and the commands inside it; EVALSHA "
        "for the baseline script and versions before Redis Functions), the "
        "ratio's basis. Whole CPU: redis-server's utime + stime per call from /proc, networking "
        "included (the same for both, so it narrows the ratio)."
        + (" Every limit 1 (the baseline's too): each call after the first is a denial."
           if args.denied else ""),
        "",
    ]
    if before:
        lines += [
            "Before: the calls of the version given with `--before`, replayed in the same run, "
            "on the same Redis, just before this version's and the baseline's.",
            "",
            "| algorithm | subjects | script µs, before → now | baseline script µs | ratio, before → now | "
            "whole CPU µs, before → now | baseline whole CPU µs | ratio, before → now |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            b, n, s = row["before"], row["sluice"], row["baseline"]
            lines.append(
                f"| {row['algorithm']} | {row['subjects']} | {b['script_us_per_call']:.2f} → "
                f"{n['script_us_per_call']:.2f} | {s['script_us_per_call']:.2f} | "
                f"{row['before_ratio']:.2f} → {row['ratio']:.2f} | {b['cpu_us_per_call']:.1f} → "
                f"{n['cpu_us_per_call']:.1f} | {s['cpu_us_per_call']:.1f} | "
                f"{row['before_cpu_ratio']:.2f} → {row['cpu_ratio']:.2f} |")
        lines.append("")
    lines += [
        "| algorithm | subjects | sluice script µs | baseline script µs | ratio | target | whole CPU µs, sluice / baseline | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        target = "≤ 2.5" if row["algorithm"] == "sliding-log" else "≤ 1.5"
        lines.append(f"| {row['algorithm']} | {row['subjects']} | {row['sluice']['script_us_per_call']:.2f} | "
                     f"{row['baseline']['script_us_per_call']:.2f} | {row['ratio']:.2f} | {target} | "
                     f"{row['sluice']['cpu_us_per_call']:.1f} / {row['baseline']['cpu_us_per_call']:.1f} | "
                     f"{row['cpu_ratio']:.2f} |")
    with open(os.path.join(RESULTS, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
