#!/usr/bin/env python3
"""redis-server instructions per sluice decision, beside the baseline INCR + EXPIRE script.

The same calls as redis_cost.py (each algorithm's FCALL, or EVALSHA from a
version before Redis Functions, captured from a
running sluice, a fresh evaluation id per call, one hot subject or many),
replayed against a redis-server running under `valgrind --tool=callgrind`
with instrumentation on only while each replay runs. Instruction counts do
not move with the machine's noise, so this is the figure to compare two
versions by: give one sluice binary per version; all run against the one
Redis, their scripts and libraries loaded side by side.

    python3 bench/redis_instr.py [LABEL=]SLUICE [[LABEL=]OTHER_SLUICE ...] [--calls N]
        [--denied]

Writes bench/results/redis-instr.md and prints the table. With --denied,
every limit is 1 and only the hot subject is replayed: after its first
call, every call is a denial, and the table (bench/results/
redis-instr-denied.md) is what a denial costs. Needs valgrind
(callgrind_control), redis-server and redis-benchmark, and nginx for the
capture.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redis_cost  # noqa: E402
import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sluice", nargs="+")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--denied", action="store_true",
                    help="limits of 1, the hot subject only: what a denial costs")
    args = ap.parse_args()
    config = None
    if args.denied:
        config = redis_cost.DENIED_CONFIG
    labels = [s.split("=", 1)[0] if "=" in s else s for s in args.sluice]
    binaries = [s.split("=", 1)[1] if "=" in s else s for s in args.sluice]
    procs = Processes()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-redis-instr-") as workdir:
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
            baseline_sha = r.cmd("SCRIPT", "LOAD", redis_cost.BASELINE)
            captured = [redis_cost.capture(procs, workdir, s, port, config=config)
                        for s in binaries]

            def control(*what):
                subprocess.run(["callgrind_control", *what, str(redis.pid)],
                               capture_output=True, check=True)

            def instructions(call):
                control("-z")
                control("-i", "on")
                subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(args.clients),
                                "-n", str(args.calls), "-r", str(redis_cost.KEYSPACE), "-q", *call],
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
                return total / args.calls

            for many in (False,) if args.denied else (False, True):
                label = "many subjects" if many else "one hot subject"
                if args.denied:
                    label = "one hot subject, denied"
                for a in redis_cost.ALGORITHMS:
                    per = []
                    for calls in captured:
                        r.cmd("FLUSHALL")
                        per.append(instructions(redis_cost.fresh(calls[a], many)))
                    r.cmd("FLUSHALL")
                    key = "seed:__rand_int__" if many else "seed:hot"
                    limit = "1" if args.denied else "1000000000"
                    seed = instructions(["EVALSHA", baseline_sha, "1", key, "3600", limit])
                    rows.append((a, label, per, seed))
                    print(f"[redis-instr] {a:16} {label:16} seed {seed:8.0f} " +
                          " ".join(f"{p:8.0f} ({p / seed:.2f}x)" for p in per), flush=True)
            r.close()
    finally:
        procs.stop_all()
    heads = " | ".join(f"{s} | ÷ seed" for s in labels)
    lines = [
        "# redis-server instructions per decision, beside the baseline INCR + EXPIRE fixed-window script",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; callgrind, instrumentation on "
        f"only during each replay; redis-benchmark, {args.clients} connections, {args.calls} "
        "calls each, a fresh evaluation id per call. Everything redis-server ran per call: "
        "networking, the script and the commands inside it."
        + (" Every limit 1 (the baseline's too): each call after the first is a denial."
           if args.denied else ""),
        "",
        f"| algorithm | subjects | baseline | {heads} |",
        "|---|---|---|" + "---|---|" * len(labels),
    ]
    for a, label, per, seed in rows:
        cells = " | ".join(f"{p:,.0f} | {p / seed:.2f}" for p in per)
        lines.append(f"| {a} | {label} | {seed:,.0f} | {cells} |")
    os.makedirs(RESULTS, exist_ok=True)
    name = "redis-instr-denied.md" if args.denied else "redis-instr.md"
    with open(os.path.join(RESULTS, name), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
