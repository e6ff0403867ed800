#!/usr/bin/env python3
"""Two sluice builds on the Redis path at several connection counts, side by side.

    python3 bench/ab_conns.py --a /tmp/sluice-before --b target/release/sluice \
        [--conns 8,32,128] [--rounds 3] [--seconds 5] [--path /allowed]

`bench/ab.py` compares throughput and CPU at one connection count and
stops at the first unexpected answer. This one shows the trade a change of
how decisions are sent can make between throughput, CPU and latency: for
each round (the builds' order alternating), each build in turn on
`bench/configs/sluice-redis.yaml` (sidecar on CPU 1; nginx upstream,
redis-server and `wrk -t1 --latency` on CPU 0), closed-loop load at each
connection count: requests per second, the sidecar's CPU per request, wrk's
p50 and p99, and the answers that were not 2xx (a decision past the 25 ms
budget is a 503; they are counted, not fatal). Medians over rounds; written
to `bench/results/ab-conns.md`.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tools  # noqa: E402
from ab import sidecar_of  # noqa: E402
from harness import BENCH, CPU_REST, start_upstream_and_redis  # noqa: E402
from tools import Processes  # noqa: E402


def wrk(url, conns, seconds, latency):
    argv = ["taskset", "-c", str(CPU_REST), "wrk", "-t1", f"-c{conns}", f"-d{seconds}s"]
    if latency:
        argv.append("--latency")
    return subprocess.run(argv + [url], capture_output=True, text=True).stdout


def ms(out, percentile):
    m = re.search(rf"\s{percentile}%\s+([\d.]+)(us|ms|s)\b", out)
    value = float(m.group(1))
    return {"us": value / 1000, "ms": value, "s": value * 1000}[m.group(2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the build to compare against")
    ap.add_argument("--b", required=True, help="the build under test")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--conns", default="8,32,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--path", default="/allowed")
    args = ap.parse_args()
    builds = {args.label_a: args.a, args.label_b: args.b}
    conns_list = [int(c) for c in args.conns.split(",")]

    workdir = tempfile.mkdtemp(prefix="sluice-ab-conns-")
    procs = Processes()
    results = {}
    try:
        upstream, redis = start_upstream_and_redis(procs, workdir)
        for round_ in range(args.rounds):
            order = list(builds) if round_ % 2 == 0 else list(builds)[::-1]
            for label in order:
                sidecar = sidecar_of(
                    procs, workdir, builds[label], f"sluice-{round_}-{label}", upstream, redis
                )
                url = f"http://127.0.0.1:{sidecar.port}{args.path}"
                for conns in conns_list:
                    wrk(url, conns, 1, False)  # warm-up
                    before = tools.cpu_seconds(sidecar.proc.pid)
                    out = wrk(url, conns, args.seconds, True)
                    cpu = tools.cpu_seconds(sidecar.proc.pid) - before
                    requests = int(re.search(r"(\d+) requests in", out).group(1))
                    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
                    row = {
                        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
                        "cpu_us": cpu / requests * 1e6,
                        "p50": ms(out, 50),
                        "p99": ms(out, 99),
                        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
                    }
                    results.setdefault((label, conns), []).append(row)
                    print(f"round {round_ + 1} {label} {conns} conns: {row}", flush=True)
                procs.stop(sidecar.proc)
    finally:
        procs.stop_all()

    lines = [
        "# Two builds at several connection counts (bench/ab_conns.py)",
        "",
        f"{args.label_a}: `{args.a}`  ",
        f"{args.label_b}: `{args.b}`  ",
        f"{args.rounds} rounds, alternating order, {args.seconds} s of `wrk -t1` on `{args.path}`"
        " each; medians over rounds.",
        "",
        "| build | connections | req/s | µs CPU/req | p50 ms | p99 ms | not 2xx |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for conns in conns_list:
        for label in builds:
            rows = results[(label, conns)]
            med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
            lines.append(
                f"| {label} | {conns} | {med('rps'):,.0f} | {med('cpu_us'):.1f} | {med('p50'):.2f}"
                f" | {med('p99'):.2f} | {sum(r['non_2xx'] for r in rows)} |"
            )
    text = "\n".join(lines) + "\n"
    with open(os.path.join(BENCH, "results", "ab-conns.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
