#!/usr/bin/env python3
"""The Redis stall of `bench/run.sh` alone, two builds alternated.

    python3 bench/stall_ab.py --a /tmp/sluice-before --b target/release/sluice [--rounds 3]

One nginx upstream and one redis-server; for each round, each build in turn
(the order alternates by round) serves `/allowed` on
`bench/configs/sluice-redis.yaml`, warmed for 2 s, then Redis is paused
(`CLIENT PAUSE`) under 2 s of open-loop load at 1,000 requests a second,
as `bench/run.sh` does. Prints each round's worst latency, p50, p99 and
answers: whether a stall's figure in a full run is the build's or the
machine's. Needs oha where `bench/run.sh` installs it. Load only targets
127.0.0.1; every process is stopped by PID.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tools  # noqa: E402
from harness import CPU_REST, start_nginx, start_redis, start_sluice, redis_stall  # noqa: E402
from tools import Processes  # noqa: E402

OHA = os.path.expanduser("~/.cache/sluice-bench/bin/oha")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--oha", default=OHA)
    args = ap.parse_args()
    settings = {"stall_s": 2, "oha": args.oha}
    procs = Processes()
    with tempfile.TemporaryDirectory() as workdir:
        try:
            upstream = start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", 0)
            redis = start_redis(procs, workdir)
            if upstream.reason or redis.reason:
                raise RuntimeError(upstream.reason or redis.reason)
            builds = [("a", args.a), ("b", args.b)]
            for r in range(args.rounds):
                for label, binary in builds if r % 2 == 0 else builds[::-1]:
                    sidecar = start_sluice(procs, workdir, binary, f"sluice-{label}", "sluice-redis.yaml",
                                           UPSTREAM_PORT=upstream.port, REDIS_PORT=redis.port)
                    if sidecar.reason:
                        raise RuntimeError(sidecar.reason)
                    try:
                        tools.run_wrk(f"http://127.0.0.1:{sidecar.port}/allowed", 8, 2, CPU_REST)
                        res = redis_stall(settings, sidecar, redis, 1000)
                    finally:
                        procs.stop(sidecar.proc)
                    shown = {k: res[k] for k in ("max_ms", "p50_ms", "p99_ms", "statuses", "reason") if k in res}
                    print(f"round {r + 1} {label}: {json.dumps(shown)}", flush=True)
                    time.sleep(1)
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
