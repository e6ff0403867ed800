#!/usr/bin/env python3
"""Two sluice builds' memory at 1,000 busy connections, side by side.

What `bench/run.sh` reads once per run for sluice-memory (VmRSS and its
anonymous part, `RssAnon`, while 1,000 connections keep `/allowed` of
the memory store busy), read here for two builds in alternating rounds of
one session, so that a change's effect on memory is not compared across
runs of a machine that moves:

    python3 bench/rss_ab.py --a OLD/sluice --b target/release/sluice
        [--label-a X] [--label-b Y] [--rounds 4] [--seconds 8]

Writes bench/results/rss-ab.md and rss-ab.json, and prints the table.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import tools  # noqa: E402
from tools import Processes  # noqa: E402

MANY_CONNS = harness.MANY_CONNS


def one(procs, workdir, binary, name, upstream_port, seconds):
    """Peak VmRSS and RssAnon (kB) of a fresh sidecar while MANY_CONNS
    connections keep `/allowed` busy, and the requests a second."""
    server = harness.start_sluice(procs, workdir, binary, name, "sluice-memory.yaml",
                                  UPSTREAM_PORT=upstream_port)
    if server.reason:
        raise SystemExit(f"{name}: {server.reason}")
    try:
        with tools.RssSampler(server.pid) as rss:
            run = tools.run_wrk(f"http://127.0.0.1:{server.port}/allowed", MANY_CONNS, seconds,
                                harness.CPU_REST, timeout_s=10)
    finally:
        procs.stop(server.proc)
    if run["non_2xx"] or run["socket_errors"]:
        raise SystemExit(f"{name}: {run['non_2xx']} non-2xx, {run['socket_errors']} socket errors")
    return {"rss_kb": rss.max_kb, "anon_kb": rss.max_anon_kb, "rps": run["rps"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="the build to compare against")
    ap.add_argument("--b", required=True, help="the build under test")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8)
    args = ap.parse_args()

    builds = [("a", args.a), ("b", args.b)]
    runs = {b: [] for b, _ in builds}
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-rss-ab-")
    try:
        upstream = harness.start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", 0)
        if upstream.reason:
            raise SystemExit(upstream.reason)
        for r in range(args.rounds):
            order = builds if r % 2 == 0 else builds[::-1]
            for build, binary in order:
                m = one(procs, workdir, binary, f"sluice-{build}-{r}", upstream.port, args.seconds)
                runs[build].append(m)
                print(f"round {r + 1} {build}: VmRSS {m['rss_kb']} kB, RssAnon {m['anon_kb']} kB, "
                      f"{m['rps']:.0f} req/s", flush=True)
    finally:
        procs.stop_all()

    def median(build, key):
        return statistics.median(m[key] for m in runs[build])

    lines = [
        "# Two builds' memory at 1,000 busy connections (bench/rss_ab.py)",
        "",
        f"A: {args.label_a}  ",
        f"B: {args.label_b}  ",
        f"{args.rounds} rounds, alternating order; each a fresh sidecar (memory store) with "
        f"{MANY_CONNS:,} connections busy on `/allowed` for {args.seconds:g} s; medians over rounds.",
        "",
        "| | A | B | B − A |",
        "|---|---:|---:|---:|",
    ]
    for key, what in (("rss_kb", "VmRSS (MB)"), ("anon_kb", "RssAnon (MB)")):
        a, b = median("a", key) / 1024, median("b", key) / 1024
        lines.append(f"| {what} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    a, b = median("a", "rps"), median("b", "rps")
    lines.append(f"| requests a second | {a:,.0f} | {b:,.0f} | |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = os.path.join(harness.BENCH, "results")
    with open(os.path.join(out, "rss-ab.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "rss-ab.json"), "w") as f:
        json.dump({"a": args.label_a, "b": args.label_b, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
