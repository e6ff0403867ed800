#!/usr/bin/env python3
"""Does the breaker open when sluice, not Redis, is slow? Several builds
side by side in one run.

    python3 bench/breaker_load.py --sluice before=/work/before/target/release/sluice \\
        --sluice after=target/release/sluice [--rounds 3] [--seconds 10]

Per round and build: one healthy redis-server, three sidecars of the build
sharing it (the Redis store, `store.budget: 25ms`, the default breaker),
one fixed window by `client_ip` on every path, `--limit` a minute
(default 10^9: never reached, so every request is a Redis call; with 100,
nearly every one is refused from the over-limit cache instead),
and three `wrk -t1 -c64` at once for `--seconds`, one on each sidecar, on
the 2 cores everything shares. In front of an upstream of this script's
own that answers 200 at once. Read from each sidecar's `/metrics` after
the load: requests by outcome, times its breaker opened, Redis errors by
kind.

The report goes to stdout and `bench/results/<stem>.md`.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tools  # noqa: E402


CONFIG = """version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: http://127.0.0.1:{upstream}
store:
  kind: redis
  url: redis://127.0.0.1:{redis}
  budget: 25ms
identity:
  pseudonym_key: "0123456789abcdef0123456789abcdef"
policies:
  api: {{ algorithm: fixed-window, limit: {limit}, window: 1m, lease: off }}
routes: []
default: {{ policy: api, subject: client_ip }}
"""


def metrics(admin):
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10).read().decode()
    out = {"outcomes": {}, "opened": 0.0, "errors": {}}
    for line in text.splitlines():
        if line.startswith("sluice_requests_total{"):
            m = re.search(r'outcome="([^"]+)"', line)
            out["outcomes"][m.group(1)] = out["outcomes"].get(m.group(1), 0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("sluice_store_breaker_opened_total"):
            out["opened"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("sluice_store_errors_total{"):
            m = re.search(r'kind="([^"]+)"', line)
            out["errors"][m.group(1)] = out["errors"].get(m.group(1), 0) + float(line.rsplit(" ", 1)[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--stem", default="breaker-load")
    ap.add_argument("--limit", type=int, default=10**9)
    ap.add_argument("--serve-upstream", type=int)
    args = ap.parse_args()
    if args.serve_upstream:
        tools.serve_ok(args.serve_upstream)
        return
    builds = [s.split("=", 1) if "=" in s else (s, s) for s in args.sluice]
    procs = tools.Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-breaker-")
    runs = {name: [] for name, _ in builds}
    try:
        up = tools.free_port()
        proc = procs.start("upstream", [sys.executable, os.path.abspath(__file__), "--serve-upstream", str(up)],
                           None, os.path.join(workdir, "up.log"))
        if not tools.wait_tcp(up, proc):
            raise SystemExit("breaker_load: the upstream did not start")
        for _ in range(args.rounds):
            for name, binary in builds:
                rport = tools.free_port()
                redis = procs.start("redis", ["redis-server", "--port", str(rport), "--save", "",
                                              "--appendonly", "no"], None, os.path.join(workdir, "redis.log"))
                tools.wait_tcp(rport, redis)
                config = CONFIG.format(upstream=up, redis=rport, limit=args.limit)
                sidecars = [tools.start_sluice(procs, workdir, binary, config, f"{name}-{n}")[:3]
                            for n in range(3)]
                for _, port, _ in sidecars:
                    deadline = time.time() + 10
                    while time.time() < deadline and tools.http_status(port, "/warm") not in (200, 429):
                        time.sleep(0.1)
                wrks = [subprocess.Popen(["wrk", "-t1", "-c64", f"-d{args.seconds}s", "--timeout=5s",
                                          f"http://127.0.0.1:{port}/x"], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL) for _, port, _ in sidecars]
                for w in wrks:
                    w.wait(timeout=args.seconds + 60)
                run = {"outcomes": {}, "opened": 0.0, "errors": {}, "opened_sidecars": 0}
                for sproc, _, admin in sidecars:
                    m = metrics(admin)
                    for k, v in m["outcomes"].items():
                        run["outcomes"][k] = run["outcomes"].get(k, 0) + v
                    for k, v in m["errors"].items():
                        run["errors"][k] = run["errors"].get(k, 0) + v
                    run["opened"] += m["opened"]
                    run["opened_sidecars"] += 1 if m["opened"] > 0 else 0
                    procs.stop(sproc)
                procs.stop(redis)
                runs[name].append(run)
                print(name, json.dumps(run), flush=True)
    finally:
        procs.stop_all()

    lines = [
        "# The breaker under load against a healthy Redis",
        "",
        f"`python3 bench/breaker_load.py {' '.join('--sluice ' + s for s in args.sluice)} --rounds {args.rounds} "
        f"--seconds {args.seconds}`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, release builds; three "
        f"sidecars of each build on one Redis, three `wrk -c64` at once, a limit of {args.limit:,} a minute by "
        "client. One line per round.",
        "",
        "| build | round | requests | decided (200 or 429) | 503 (no decision) | sidecars whose breaker opened | breaker openings | Redis errors by kind |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, _ in builds:
        for i, r in enumerate(runs[name], 1):
            o = r["outcomes"]
            total = sum(o.values())
            unavailable = sum(v for k, v in o.items() if k not in ("allowed", "denied", "shadow_denied"))
            errors = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["errors"].items()) if v) or "none"
            lines.append(f"| {name} | {i} | {total:,.0f} | {o.get('allowed', 0) + o.get('denied', 0):,.0f} | {unavailable:,.0f} "
                         f"| {r['opened_sidecars']} | {r['opened']:.0f} | {errors} |")
    report = "\n".join(lines) + "\n"
    print(report)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{args.stem}.md")
    with open(out, "w") as f:
        f.write(report)


if __name__ == "__main__":
    main()
