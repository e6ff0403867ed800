#!/usr/bin/env python3
"""Where leases pay: Redis calls per request for one subject sending a
steady rate to one sidecar, with the default `lease: auto` beside
`lease: off`, at several rates, interleaved in one run.

One sluice on a fresh redis-server, a plain keep-alive upstream, one
global token bucket far from its limit (capacity 10^6, refilled 10^6 a
second), two routes: `/auto` (no `lease` key) and `/off` (`lease: off`).
For each rate, each route is offered `--seconds` of requests spaced
evenly on one connection; the figure is Redis's `FCALL` count (INFO
commandstats: grants, top-ups, returns and decisions alike) ÷ requests
answered 200. `lease: off` is one call per request by construction; the
rate at which `auto` drops below it is where a lease pays.

    python3 bench/lease_rates.py [--sluice target/release/sluice] [--seconds 3]

Writes bench/results/lease_rates.md and lease_rates.json. Python 3
standard library and redis-server; everything stops when the script ends.
"""

import argparse
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "results")
RATES = [2, 4, 8, 16, 32, 64, 256, 1024]

CONFIG = """version: 1
server: {{ listen: 127.0.0.1:0, admin: 127.0.0.1:0, workers: 1 }}
upstream: {{ url: http://127.0.0.1:{upstream} }}
store: {{ kind: redis, url: redis://127.0.0.1:{redis}, budget: 200ms }}
identity: {{ pseudonym_key: bench-pseudonym-key-not-a-secret }}
policies:
  auto: {{ algorithm: token-bucket, capacity: 1000000, refill_tokens: 1000000, refill_every: 1s }}
  off: {{ algorithm: token-bucket, capacity: 1000000, refill_tokens: 1000000, refill_every: 1s, lease: off }}
routes:
  - {{ name: auto, match: {{ path: /auto }}, subject: global, policy: auto }}
  - {{ name: off, match: {{ path: /off }}, subject: global, policy: off }}
"""


def paced(port, path, rate, seconds):
    """Requests `rate` a second, evenly spaced, on one keep-alive
    connection, for `seconds`: how many were answered 200."""
    sock = socket.create_connection(("127.0.0.1", port))
    reader = sock.makefile("rb")
    request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
    ok = 0
    start = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        sock.sendall(request)
        status = reader.readline()
        length = 0
        while True:
            line = reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        reader.read(length)
        if b" 200 " in status:
            ok += 1
    sock.close()
    return ok


def fcalls(redis):
    return redis.commandstats().get("fcall", 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    procs = Processes()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="lease-rates-") as work:
            redis_port = tools.free_port()
            rproc = procs.start("redis", ["redis-server", "--port", str(redis_port), "--save", "",
                                          "--appendonly", "no"], None, os.path.join(work, "redis.log"))
            if not tools.wait_tcp(redis_port, rproc):
                raise SystemExit("redis-server did not start")
            upstream_port = tools.free_port()
            up = multiprocessing.Process(target=tools.serve_ok, args=(upstream_port,), daemon=True)
            up.start()

            class Alive:
                def poll(self):
                    return None if up.is_alive() else 1

            if not tools.wait_tcp(upstream_port, Alive()):
                raise SystemExit("the upstream did not start")
            text = CONFIG.format(upstream=upstream_port, redis=redis_port)
            _, port, _, _ = tools.start_sluice(procs, work, args.sluice, text, "sluice")
            redis = Redis(redis_port)
            for rate in RATES:
                row = {"rate": rate}
                for path in ("/auto", "/off"):
                    # A quiet gap: the last rate's leases end and go back.
                    time.sleep(0.6)
                    before = fcalls(redis)
                    ok = paced(port, path, rate, args.seconds)
                    time.sleep(0.6)
                    calls = fcalls(redis) - before
                    row[path[1:]] = {"ok": ok, "fcalls": calls,
                                     "per_request": calls / ok if ok else None}
                print(f"{rate:>5}/s  auto {row['auto']['per_request']:.3f}  "
                      f"off {row['off']['per_request']:.3f} calls per request", flush=True)
                rows.append(row)
            up.terminate()
    finally:
        procs.stop_all()
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "lease_rates.json"), "w") as f:
        json.dump({"seconds": args.seconds, "rows": rows}, f, indent=1)
    lines = [
        "# Where leases pay: Redis calls per request by a subject's rate at one sidecar",
        "",
        f"`bench/lease_rates.py`, {time.strftime('%Y-%m-%d')}, one sidecar, one subject "
        f"(`subject: global`), a token bucket far from its limit, {args.seconds:g} s per "
        "rate and route, one connection, requests evenly spaced. `FCALL`s counted by Redis "
        "(decisions, grants, top-ups and returns alike), including the returns after the run.",
        "",
        "| requests a second | `lease: auto` (default) calls per request | `lease: off` |",
        "|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(f"| {row['rate']} | {row['auto']['per_request']:.3f} | "
                     f"{row['off']['per_request']:.3f} |")
    with open(os.path.join(RESULTS, "lease_rates.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
