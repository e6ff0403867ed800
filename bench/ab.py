#!/usr/bin/env python3
"""Two sluice builds side by side, in one run, on the same paths.

    python3 bench/ab.py --a /tmp/sluice-before --b target/release/sluice \
        [--paths /allowed,/none] [--rounds 4] [--seconds 5] [--conns 8] [--cluster]

Starts one nginx upstream and one redis-server (CPU 0), then for each round
and each path runs build A, then build B (the order alternates by round, so
neither always runs on a warmer machine), one sidecar at a time on CPU 1 with
`bench/configs/sluice-redis.yaml`, under closed-loop `wrk -t1` on CPU 0.
With `--cluster`, a Redis Cluster of three primaries (CPU 0) instead, and
`bench/configs/sluice-redis-cluster.yaml`.
Reports, per build and path, the median over rounds of requests per second
and of the sidecar's CPU (utime + stime from /proc) per request, and B ÷ A.
With `--rss`, each round also holds 1,000 busy connections on `/none` to
each build and reads the sidecar's peak VmRSS (as `bench/run.sh` does).
On two shared cores req/s moves with the neighbours; CPU per request and
its ratio are the steadier figures. Written to `bench/results/ab.md` and
`.json`. Load only targets 127.0.0.1; every process is stopped by PID.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tools  # noqa: E402
from harness import (  # noqa: E402
    BENCH, CPU_REST, MANY_CONNS, start_nginx, start_redis_cluster, start_sluice, start_upstream_and_redis,
)
from tools import Processes  # noqa: E402


# The sidecars' configuration: `--cluster` sets the cluster's.
CONFIG = "sluice-redis.yaml"


def sidecar_of(procs, workdir, binary, name, upstream, redis):
    """A fresh sidecar of `binary` on `configs/sluice-redis.yaml` (on a
    cluster, `configs/sluice-redis-cluster.yaml`, `redis` its seed)."""
    sidecar = start_sluice(
        procs, workdir, binary, name, CONFIG,
        UPSTREAM_PORT=upstream.port, REDIS_PORT=redis.port,
    )
    if sidecar.reason:
        raise RuntimeError(sidecar.reason)
    return sidecar


def measure(procs, workdir, binary, name, upstream, redis, path, seconds, conns):
    sidecar = sidecar_of(procs, workdir, binary, name, upstream, redis)
    try:
        url = f"http://127.0.0.1:{sidecar.port}{path}"
        tools.run_wrk(url, conns, 1, CPU_REST)  # warm-up: connections, the library
        cpu_before = tools.cpu_seconds(sidecar.proc.pid)
        run = tools.run_wrk(url, conns, seconds, CPU_REST)
        cpu = tools.cpu_seconds(sidecar.proc.pid) - cpu_before
    finally:
        procs.stop(sidecar.proc)
    # `/blocked` is refused on every request: each answer must be a 429.
    refused = path == "/blocked"
    wrong = run["requests"] - run["non_2xx"] if refused else run["non_2xx"]
    if wrong or run["socket_errors"]:
        raise RuntimeError(f"{name} {path}: {wrong} unexpected answers, {run['socket_errors']} socket errors")
    return {"rps": run["rps"], "cpu_us": cpu / run["requests"] * 1e6}


def rss_at_many(procs, workdir, binary, name, upstream, redis, seconds):
    """Peak VmRSS (kB) of a fresh sidecar while MANY_CONNS connections are
    open and busy on `/none`, and its VmRSS idle before them."""
    sidecar = sidecar_of(procs, workdir, binary, name, upstream, redis)
    try:
        idle = tools.rss_kb(sidecar.proc.pid)
        with tools.RssSampler(sidecar.proc.pid) as rss:
            run = tools.run_wrk(f"http://127.0.0.1:{sidecar.port}/none", MANY_CONNS, seconds, CPU_REST,
                                timeout_s=10)
    finally:
        procs.stop(sidecar.proc)
    if run["non_2xx"] or run["socket_errors"]:
        raise RuntimeError(f"{name}: {run['non_2xx']} non-2xx, {run['socket_errors']} socket errors")
    return {"idle_kb": idle, "many_kb": rss.max_kb}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="the build to compare against")
    ap.add_argument("--b", required=True, help="the build under test")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--paths", default="/allowed,/none",
                    help="any of /none, /allowed (Redis), /blocked (refused, every answer a 429)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--cluster", action="store_true",
                    help="the Redis store on a Redis Cluster of three primaries")
    ap.add_argument("--rss", action="store_true",
                    help=f"also read each build's VmRSS idle and with {MANY_CONNS} busy connections")
    args = ap.parse_args()
    paths = args.paths.split(",")
    builds = [("a", args.a), ("b", args.b)]
    runs = {(b, p): [] for b, _ in builds for p in paths}
    rss = {b: [] for b, _ in builds}
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-ab-")
    try:
        if args.cluster:
            global CONFIG
            CONFIG = "sluice-redis-cluster.yaml"
            upstream = start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", CPU_REST)
            redis = start_redis_cluster(procs, workdir)
            for server in (upstream, redis):
                if server.reason:
                    raise RuntimeError(server.reason)
        else:
            upstream, redis = start_upstream_and_redis(procs, workdir)
        for r in range(args.rounds):
            order = builds if r % 2 == 0 else builds[::-1]
            for path in paths:
                for build, binary in order:
                    m = measure(procs, workdir, binary, f"sluice-{build}", upstream, redis,
                                path, args.seconds, args.conns)
                    runs[(build, path)].append(m)
                    print(f"round {r + 1} {build} {path}: {m['rps']:.0f} req/s, {m['cpu_us']:.1f} µs CPU/request",
                          flush=True)
            for build, binary in order if args.rss else ():
                m = rss_at_many(procs, workdir, binary, f"sluice-{build}", upstream, redis, args.seconds)
                rss[build].append(m)
                print(f"round {r + 1} {build} VmRSS: idle {m['idle_kb']} kB, {MANY_CONNS} connections "
                      f"{m['many_kb']} kB", flush=True)
    finally:
        procs.stop_all()

    med = {k: {f: statistics.median(m[f] for m in v) for f in ("rps", "cpu_us")} for k, v in runs.items()}
    lines = [
        "# Two builds side by side (bench/ab.py)",
        "",
        f"A: {args.label_a}  ",
        f"B: {args.label_b}  ",
        f"{args.rounds} rounds, alternating order, {args.seconds:g} s of `wrk -t1 -c{args.conns}` each"
        f"{' (Redis Cluster, three primaries)' if args.cluster else ''}; "
        "medians over rounds; load average at start "
        f"{os.getloadavg()[0]:.2f}.",
        "",
        "| path | A req/s | B req/s | B ÷ A | A µs CPU/req | B µs CPU/req | B ÷ A |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in paths:
        a, b = med[("a", p)], med[("b", p)]
        lines.append(
            f"| `{p}` | {a['rps']:,.0f} | {b['rps']:,.0f} | {b['rps'] / a['rps']:.2f} "
            f"| {a['cpu_us']:.1f} | {b['cpu_us']:.1f} | {b['cpu_us'] / a['cpu_us']:.2f} |"
        )
    if args.rss:
        a_idle, b_idle = (statistics.median(m["idle_kb"] for m in rss[b]) / 1024 for b in ("a", "b"))
        a_many, b_many = (statistics.median(m["many_kb"] for m in rss[b]) / 1024 for b in ("a", "b"))
        lines += [
            "",
            f"VmRSS, medians over rounds (MB): idle A {a_idle:.1f}, B {b_idle:.1f}; "
            f"{MANY_CONNS:,} busy connections on `/none` A {a_many:.1f}, B {b_many:.1f} "
            f"(B − A {b_many - a_many:+.1f} MB).",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = os.path.join(BENCH, "results")
    with open(os.path.join(out, "ab.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "ab.json"), "w") as f:
        json.dump({"a": args.label_a, "b": args.label_b,
                   "runs": {f"{b} {p}": v for (b, p), v in runs.items()}, "rss": rss, "medians":
                   {f"{b} {p}": v for (b, p), v in med.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
