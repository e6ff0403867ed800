#!/usr/bin/env python3
"""Instructions per request, by stage, for each of sluice's paths.

    python3 bench/profile.py [--sluice target/release/sluice] [--seconds 6] [--keep]
        [--label TEXT] [--stem profile] [--cache-sim] [--only none,blocked,browser,several,cluster]

Runs one sluice (release build, `server.workers: 1`) under
`valgrind --tool=callgrind` in front of nginx `return 200`, with Redis on
loopback, and for each path (`/none`, `/memory`, `/redis`, `/blocked`) turns
instrumentation on, sends closed-loop load with wrk, turns it off and dumps.
Instruction counts do not move with the machine's noise, so two builds can
be compared on a shared box; wall-clock figures from this run mean nothing
(valgrind is ~50x slower).

For each path it prints instructions per request in total and, inclusive,
for the stages of the request path: the self cost of every function, grouped
by where its code lives (sluice's modules, the crates), so the stages add
up to the total. Written to
`bench/results/profile.md` and `.json` (`--stem NAME`: `NAME.md` and
`NAME.json`, to keep a committed profile while measuring another build).

`--cache-sim` has callgrind model the caches and branch predictors as well
(its L1 is this machine's): L1 instruction and data misses and mispredicted
branches per request, in a table of their own. Two builds a few percent
apart in instructions can be further apart in time by these, and they are
as steady as the instructions.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tools  # noqa: E402
from harness import BENCH, ROOT, render, start_nginx, start_redis, start_redis_cluster  # noqa: E402
from tools import Processes  # noqa: E402

PATHS = ["/none", "/memory", "/redis", "/blocked"]

# A browser's request head: twelve fields beside Host, about 500 bytes.
# wrk sends Host alone, which leaves out everything a proxy does per field
# (the framing watch, the checks, the rewrite, the resend copy); `/none`
# and the floor are profiled with these too.
BROWSER_HEAD = [
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "Accept-Language: en-US,en;q=0.9",
    "Accept-Encoding: gzip, deflate, br",
    "Cookie: session=abcdef0123456789; theme=dark",
    "Referer: https://example.com/page",
    "Sec-Fetch-Dest: document",
    "Sec-Fetch-Mode: navigate",
    "Sec-Fetch-Site: same-origin",
    'Sec-Ch-Ua: "Chromium";v="120"',
    "Upgrade-Insecure-Requests: 1",
    "Cache-Control: max-age=0",
]
BROWSER = ", browser head"
# `/blocked` on the Redis store: refused by the over-limit cache.
REDIS_BLOCKED = "/blocked, redis"

# Where each instruction's code lives → the stage it is counted under.
# Self costs (not inclusive) are grouped, so the stages add up to the total;
# code inlined into a function counts with that function. First match wins.
SLUICE_STAGES = [
    ("src/proxy/headers", "request checks (headers, Host, overrides)"),
    ("src/proxy/overrides", "request checks (headers, Host, overrides)"),
    ("src/path", "path normalize"),
    ("src/route", "route"),
    ("src/subject", "subject + pseudonym"),
    ("src/limit", "store: memory (+ algorithm steps)"),
    ("src/store/memory", "store: memory (+ algorithm steps)"),
    ("src/store/redis", "store: redis, sluice side"),
    ("src/store", "store: shared (over-limit cache, breaker)"),
    ("src/proxy/respond", "respond (429/503, RateLimit fields)"),
    ("src/proxy/upstream", "forward (sluice side)"),
    ("src/proxy", "service (sluice side)"),
    ("src/server", "listener (sluice side)"),
    ("src/telemetry", "metrics"),
]
CRATE_STAGES = {
    "hyper": "hyper (HTTP/1 server and client)",
    "httparse": "hyper (HTTP/1 server and client)",
    "http": "hyper (HTTP/1 server and client)",
    "h2": "hyper (HTTP/1 server and client)",
    "hyper-util": "hyper-util (server glue, connector)",
    "tokio": "tokio (scheduler, timers, I/O)",
    "mio": "tokio (scheduler, timers, I/O)",
    "redis": "redis client (redis-rs, combine)",
    "combine": "redis client (redis-rs, combine)",
    "tokio-util": "redis client (redis-rs, combine)",
    "sha2": "subject + pseudonym",
    "hmac": "subject + pseudonym",
    "digest": "subject + pseudonym",
    "block-buffer": "subject + pseudonym",
    "base64": "subject + pseudonym",
    "ring": "subject + pseudonym",
    "metrics": "metrics",
    "metrics-util": "metrics",
    "metrics-exporter-prometheus": "metrics",
    "futures-util": "futures, bytes",
    "futures-core": "futures, bytes",
    "futures-channel": "futures, bytes",
    "bytes": "futures, bytes",
    # The hyper floor's own code (bench/floor/): its service function.
    "hyper-floor": "service (sluice side)",
}
STAGE_ORDER = [
    "hyper (HTTP/1 server and client)",
    "hyper-util (server glue, connector)",
    "tokio (scheduler, timers, I/O)",
    "listener (sluice side)",
    "request checks (headers, Host, overrides)",
    "path normalize",
    "route",
    "subject + pseudonym",
    "store: memory (+ algorithm steps)",
    "store: shared (over-limit cache, breaker)",
    "store: redis, sluice side",
    "redis client (redis-rs, combine)",
    "respond (429/503, RateLimit fields)",
    "forward (sluice side)",
    "service (sluice side)",
    "metrics",
    "futures, bytes",
    "std (collections, formatting, sync)",
    "libc (malloc, memcpy, syscall stubs)",
    "other",
]


def stage_of(function, binary):
    """The stage of one function: by the crate and module its symbol names
    (a generic instantiated for another crate's type counts where the
    generic is defined; drop glue where the dropped type is)."""
    sym = function
    for lead in ("core::ptr::drop_in_place<", "<"):
        while sym.startswith(lead):
            sym = sym[len(lead):]
    crate, _, rest = sym.partition("::")
    if crate == "sluice":
        module = "src/" + "/".join(rest.split("::")[:2])
        for prefix, stage in SLUICE_STAGES:
            if module.startswith(prefix):
                return stage
        return "service (sluice side)"
    if crate in ("core", "alloc", "std"):
        return "std (collections, formatting, sync)"
    # ring's assembly (the pseudonym's SHA-256) has C names, no `::`.
    if crate.startswith("ring_core_"):
        return "subject + pseudonym"
    if crate.startswith("__rust") or "libc.so" in binary or "ld-linux" in binary:
        return "libc (malloc, memcpy, syscall stubs)"
    return CRATE_STAGES.get(crate.replace("_", "-"), "other")


CONFIG = """\
version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  workers: 1
upstream:
  url: http://127.0.0.1:@@UPSTREAM_PORT@@
store:
  kind: @@STORE@@
@@STORE_EXTRA@@
identity:
  pseudonym_key: bench-pseudonym-key-not-a-secret
policies:
  open:
    algorithm: fixed-window
    limit: 1000000000
    window: 1s
    lease: off  # one decision per request, as before leases were on by default
  closed:
    algorithm: fixed-window
    limit: 1
    window: 1h
@@SEVERAL_POLICY@@routes:
  - name: none
    match: { path: /none }
    policy: none
  - name: open
    match: { path: /@@STORE@@ }
    subject: client_ip
    policy: open
  - name: blocked
    match: { path: /blocked }
    subject: client_ip
    policy: closed
@@SEVERAL_ROUTE@@default: { policy: none }
"""

# `--only several`: a route of two limits on one subject, decided on Redis
# in one call (the script of several limits). Only then, so that the
# route table of every other path stays as it was.
SEVERAL_POLICY = """\
  also_open:
    algorithm: fixed-window
    limit: 1000000000
    window: 1h
    lease: off
"""
SEVERAL_ROUTE = """\
  - name: several
    match: { path: /several }
    limits:
      - { policy: open, subject: client_ip }
      - { policy: also_open, subject: client_ip }
"""


# `valgrind` with callgrind, instrumentation off until a path's run; with
# `--cache-sim` also its model of the caches and branch predictors.
VALGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
SIMULATED = ("I1mr", "D1mr", "D1mw", "Bcm", "Bim")


def callgrind(argv, **kw):
    return subprocess.run(["callgrind_control"] + argv, capture_output=True, text=True, **kw)


def start_sluice_under_valgrind(procs, workdir, sluice, name, store, upstream_port, redis_port,
                                several=False):
    """`store` is `memory`, `redis` or `cluster` (the Redis store on a
    Redis Cluster whose seed node is `redis_port`; its route's path is
    `/redis` as well)."""
    extra = {
        "redis": f"  url: redis://127.0.0.1:{redis_port}\n  budget: 250ms",
        "cluster": f"  topology: cluster\n  nodes: [redis://127.0.0.1:{redis_port}]\n  budget: 250ms",
    }.get(store, "  max_entries: 100000")
    store = "redis" if store == "cluster" else store
    conf = os.path.join(workdir, f"{name}.yaml")
    with open(conf, "w") as f:
        f.write(
            CONFIG.replace("@@UPSTREAM_PORT@@", str(upstream_port))
            .replace("@@STORE_EXTRA@@", extra)
            .replace("@@STORE@@", store)
            .replace("@@SEVERAL_POLICY@@", SEVERAL_POLICY if several else "")
            .replace("@@SEVERAL_ROUTE@@", SEVERAL_ROUTE if several else "")
        )
    out = os.path.join(workdir, f"{name}.callgrind")
    logf = os.path.join(workdir, f"{name}.log")
    argv = [
        *VALGRIND, f"--callgrind-out-file={out}.%p",
        sluice, "run", "--config", conf, "--log-format", "json",
    ]
    proc = procs.start(name, argv, 1, logf)
    deadline = time.monotonic() + 60
    port = None
    while time.monotonic() < deadline and proc.poll() is None:
        with open(logf, errors="replace") as f:
            for line in f:
                m = re.search(r'"traffic_addr":"[^"]*:(\d+)"', line)
                if m:
                    port = int(m.group(1))
        if port:
            break
        time.sleep(0.2)
    if not port:
        raise RuntimeError(f"sluice did not start: {tools.tail(logf)}")
    return proc, port, out


def stage_costs(dump):
    """Total instructions, and self instructions grouped by stage."""
    ann = subprocess.run(
        ["callgrind_annotate", "--threshold=100", "--show=Ir", dump],
        capture_output=True, text=True, check=True,
    ).stdout
    total = None
    stages = dict.fromkeys(STAGE_ORDER, 0)
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+PROGRAM TOTALS", line)
        if m:
            total = int(m.group(1).replace(",", ""))
            continue
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+([^:\s]*):(.*?)(?: \[(.*)\])?$", line)
        if m:
            ir = int(m.group(1).replace(",", ""))
            stages[stage_of(m.group(3), m.group(4) or "")] += ir
    if total is not None:
        stages["other"] += total - sum(stages.values())
    return total, stages


def simulated(dump, requests):
    """Per request, what callgrind's cache and branch model counted in
    `dump` (taken with `--cache-sim`): L1 instruction misses, L1 data read
    and write misses, mispredicted conditional and indirect branches.
    Empty for a dump taken without it."""
    ann = subprocess.run(
        ["callgrind_annotate", "--threshold=100", "--show=" + ",".join(SIMULATED), dump],
        capture_output=True, text=True,
    )
    for line in ann.stdout.splitlines():
        if "PROGRAM TOTALS" in line:
            cells = re.sub(r"\(\s*[\d.]+%\)", "", line.split("PROGRAM TOTALS")[0]).split()
            counts = [0 if c == "." else int(c.replace(",", "")) for c in cells]
            if len(counts) == len(SIMULATED):
                return {e: round(n / requests) for e, n in zip(SIMULATED, counts)}
    return {}


def profile_floor(procs, workdir, floor, upstream_port, seconds, conns):
    """The hyper floor (`bench/floor/`) under callgrind, the same load as
    `/none` and `/blocked`: what the stack costs with nothing of sluice's
    own, forwarding (`/none`) and refusing (`/blocked`, a fixed 429)."""
    out = os.path.join(workdir, "floor.callgrind")
    logf = os.path.join(workdir, "floor.log")
    argv = [*VALGRIND, f"--callgrind-out-file={out}.%p",
            floor, f"http://127.0.0.1:{upstream_port}"]
    proc = procs.start("floor-callgrind", argv, 1, logf)
    deadline = time.monotonic() + 60
    port = None
    while time.monotonic() < deadline and proc.poll() is None and not port:
        with open(logf, errors="replace") as f:
            for line in f:
                m = re.match(r"listening \S+:(\d+)$", line.strip())
                if m:
                    port = int(m.group(1))
        time.sleep(0.2)
    if not port:
        raise RuntimeError(f"hyper-floor did not start: {tools.tail(logf)}")
    figures = {}
    for path, label, head in (("/none", "hyper floor", ()), ("/blocked", "hyper floor /blocked", ()),
                              ("/none", "hyper floor" + BROWSER, BROWSER_HEAD)):
        url = f"http://127.0.0.1:{port}{path}"
        tools.run_wrk(url, conns, 1, 0, timeout_s=10, headers=head)  # warm-up, uncounted
        callgrind(["-z", str(proc.pid)])
        callgrind(["-i", "on", str(proc.pid)])
        run = tools.run_wrk(url, conns, seconds, 0, timeout_s=10, headers=head)
        callgrind(["-i", "off", str(proc.pid)])
        callgrind(["-d", label.replace(", ", "-").replace(" ", "-").replace("/", ""), str(proc.pid)])
        time.sleep(0.5)
        used = {f["dump"] for f in figures.values()}
        dump = [d for d in sorted((os.path.join(workdir, f) for f in os.listdir(workdir)
                                   if f.startswith("floor.callgrind.")), key=os.path.getmtime)
                if d not in used][-1]
        total, stages = stage_costs(dump)
        requests = run["requests"]
        print(f"{label}: {requests} requests, {round(total / requests)} instructions each", file=sys.stderr)
        figures[label] = {
            "requests": requests,
            "non_2xx": run["non_2xx"],
            "instructions_per_request": round(total / requests),
            "stages": {k: round(v / requests) for k, v in stages.items()},
            "simulated": simulated(dump, requests),
            "dump": dump,
        }
    procs.stop(proc, grace=20)
    return figures


def profile_nginx(procs, workdir, upstream_port, seconds, conns):
    """nginx `proxy_pass` (and `limit_req` refusing) under callgrind, the
    same way: instructions per request, the reference for `/none` and
    `/blocked`."""
    port = tools.free_port()
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(os.path.join(workdir, "proxy-tmp", sub), exist_ok=True)
    conf = render("proxy.nginx.conf", os.path.join(workdir, "proxy.nginx.conf"),
                  DIR=workdir, PORT=port, UPSTREAM_PORT=upstream_port)
    out = os.path.join(workdir, "nginx.callgrind")
    argv = [*VALGRIND, f"--callgrind-out-file={out}.%p",
            "nginx", "-p", workdir, "-c", conf, "-e", os.path.join(workdir, "proxy.error.log")]
    proc = procs.start("nginx-callgrind", argv, 1, os.path.join(workdir, "nginx-callgrind.log"))
    if not tools.wait_tcp(port, proc, timeout=60):
        raise RuntimeError("nginx under valgrind did not start")
    figures = {}
    for path, label in (("/", "nginx /"), ("/blocked", "nginx /blocked")):
        url = f"http://127.0.0.1:{port}{path}"
        tools.run_wrk(url, conns, 1, 0, timeout_s=10)
        callgrind(["-z", str(proc.pid)])
        callgrind(["-i", "on", str(proc.pid)])
        run = tools.run_wrk(url, conns, seconds, 0, timeout_s=10)
        callgrind(["-i", "off", str(proc.pid)])
        callgrind(["-d", str(proc.pid)])
        time.sleep(0.5)
        dumps = sorted((os.path.join(workdir, f) for f in os.listdir(workdir)
                        if f.startswith("nginx.callgrind.") and f.count(".") == 3),
                       key=os.path.getmtime)
        used = {v["dump"] for v in figures.values()}
        dump = [d for d in dumps if d not in used][-1]
        total, _ = stage_costs(dump)
        figures[label] = {"requests": run["requests"], "instructions_per_request": round(total / run["requests"]),
                          "simulated": simulated(dump, run["requests"]), "dump": dump}
        print(f"{label}: {run['requests']} requests, {round(total / run['requests'])} instructions each",
              file=sys.stderr)
    procs.stop(proc, grace=20)
    return figures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--floor", default=os.path.join(ROOT, "target", "release", "hyper-floor"),
                    help="the hyper floor (bench/floor/); profiled against /none unless --no-floor")
    ap.add_argument("--no-floor", action="store_true")
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--label", default="")
    ap.add_argument("--stem", default="profile", help="write bench/results/STEM.md and STEM.json")
    ap.add_argument("--only", default="",
                    help="comma-separated paths to profile (none, memory, blocked, browser, redis, "
                         "blocked-redis, several: a route of two limits on Redis, cluster: /redis "
                         "on a Redis Cluster of three primaries; the last two only when asked), "
                         "the floor and nginx left out: a quicker look at one change, not a profile "
                         "to commit")
    ap.add_argument("--cache-sim", action="store_true",
                    help="also count callgrind's simulated cache misses and mispredicted branches")
    args = ap.parse_args()
    if args.cache_sim:
        VALGRIND.extend(["--cache-sim=yes", "--branch-sim=yes"])

    workdir = tempfile.mkdtemp(prefix="sluice-profile-")
    procs = Processes()
    results = {"paths": {}, "label": args.label}
    try:
        upstream = start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", 0)
        if upstream.reason:
            raise RuntimeError(upstream.reason)
        redis = start_redis(procs, workdir)
        if redis.reason:
            raise RuntimeError(redis.reason)
        memory_paths = [(p, p, ()) for p in ("/none", "/memory", "/blocked")]
        memory_paths.append(("/none", "/none" + BROWSER, BROWSER_HEAD))
        redis_paths = [("/redis", "/redis", ()), ("/blocked", REDIS_BLOCKED, ())]
        only = [label for label in args.only.split(",") if label]
        several = "several" in only
        if several:
            redis_paths.append(("/several", "/several", ()))
        stores = [("memory", memory_paths), ("redis", redis_paths)]
        if "cluster" in only:
            cluster = start_redis_cluster(procs, workdir)
            if cluster.reason:
                raise RuntimeError(cluster.reason)
            stores.append(("cluster", [("/redis", "/cluster", ())]))
        if only:
            def key(label):
                if label.endswith(BROWSER):
                    return "browser"
                return "blocked-redis" if label == REDIS_BLOCKED else label.strip("/")
            stores = [(store, [p for p in paths if key(p[1]) in only]) for store, paths in stores]
            stores = [(store, paths) for store, paths in stores if paths]
            args.no_floor = True
        for store, paths in stores:
            proc, port, out = start_sluice_under_valgrind(
                procs, workdir, args.sluice, f"sluice-{store}", store, upstream.port,
                cluster.port if store == "cluster" else redis.port,
                several and store == "redis",
            )
            for path, label, head in paths:
                url = f"http://127.0.0.1:{port}{path}"
                tools.run_wrk(url, args.conns, 1, 0, timeout_s=10, headers=head)  # warm-up, uncounted
                callgrind(["-z", str(proc.pid)])
                callgrind(["-i", "on", str(proc.pid)])
                run = tools.run_wrk(url, args.conns, args.seconds, 0, timeout_s=10, headers=head)
                callgrind(["-i", "off", str(proc.pid)])
                callgrind(["-d", label.strip("/").replace(", ", "-").replace(" ", "-"), str(proc.pid)])
                time.sleep(0.5)
                used = {r["dump"] for r in results["paths"].values()}
                dumps = sorted(
                    (os.path.join(workdir, f) for f in os.listdir(workdir)
                     if f.startswith(os.path.basename(out) + ".")),
                    key=os.path.getmtime,
                )
                dumps = [d for d in dumps if d not in used]
                dump = dumps[-1]
                total, stages = stage_costs(dump)
                requests = run["requests"]
                results["paths"][label] = {
                    "requests": requests,
                    "non_2xx": run["non_2xx"],
                    "instructions_per_request": round(total / requests),
                    "stages": {k: round(v / requests) for k, v in stages.items()},
                    "simulated": simulated(dump, requests),
                    "dump": dump,
                }
                print(f"{label}: {requests} requests, {round(total / requests)} instructions each", file=sys.stderr)
            procs.stop(proc, grace=20)
        if not args.no_floor:
            results["paths"].update(profile_floor(
                procs, workdir, args.floor, upstream.port, args.seconds, args.conns))
        if not only:
            results["nginx"] = profile_nginx(procs, workdir, upstream.port, args.seconds, args.conns)
    finally:
        procs.stop_all()
    write(results, args.stem)
    if not args.keep:
        subprocess.run(["rm", "-rf", workdir])


def ratios(results):
    """The comparisons the paths are judged by: `/none` against the hyper
    floor (the same stack, nothing of sluice's own; target ≤ 1.05), and
    each side against nginx."""
    paths = results["paths"]
    nginx = results.get("nginx") or {}

    def ipr(fig):
        return fig["instructions_per_request"] if fig else None

    pairs = [
        ("sluice `/none` ÷ hyper floor (target ≤ 1.05)", ipr(paths.get("/none")), ipr(paths.get("hyper floor"))),
        ("sluice `/none` ÷ hyper floor, a browser's head (12 fields)", ipr(paths.get("/none" + BROWSER)),
         ipr(paths.get("hyper floor" + BROWSER))),
        ("sluice `/none` ÷ nginx `proxy_pass`", ipr(paths.get("/none")), ipr(nginx.get("nginx /"))),
        ("hyper floor ÷ nginx `proxy_pass`", ipr(paths.get("hyper floor")), ipr(nginx.get("nginx /"))),
        ("sluice `/blocked` ÷ nginx `/blocked` (`limit_req` refusing)", ipr(paths.get("/blocked")),
         ipr(nginx.get("nginx /blocked"))),
        ("sluice `/blocked` on Redis (the over-limit cache refusing) ÷ nginx `/blocked`",
         ipr(paths.get(REDIS_BLOCKED)), ipr(nginx.get("nginx /blocked"))),
        ("sluice `/blocked` ÷ hyper floor `/blocked` (a fixed 429)", ipr(paths.get("/blocked")),
         ipr(paths.get("hyper floor /blocked"))),
        ("hyper floor `/blocked` ÷ nginx `/blocked`", ipr(paths.get("hyper floor /blocked")),
         ipr(nginx.get("nginx /blocked"))),
    ]
    rows = [f"| {label} | {a:,} | {b:,} | {a / b:.2f} |" for label, a, b in pairs if a and b]
    if not rows:
        return []
    return ["", "| comparison | instructions | against | ratio |", "|---|---:|---:|---:|"] + rows


def simulated_table(results):
    """With `--cache-sim`: per request, the misses callgrind's model
    counted beside the instructions. Real time follows these as much as
    the instructions: an L1 miss costs several instructions' time."""
    figures = dict(results["paths"])
    figures.update(results.get("nginx") or {})
    rows = [(label, fig) for label, fig in figures.items() if fig.get("simulated")]
    if not rows:
        return []
    lines = ["", "callgrind's cache and branch model (`--cache-sim`), per request:", "",
             "| path | instructions | L1i misses | L1d misses (read + write) | mispredicted branches |",
             "|---|---:|---:|---:|---:|"]
    for label, fig in rows:
        sim = fig["simulated"]
        lines.append(f"| {label} | {fig['instructions_per_request']:,} | {sim['I1mr']:,} | "
                     f"{sim['D1mr'] + sim['D1mw']:,} | {sim['Bcm'] + sim['Bim']:,} |")
    return lines


def write(results, stem="profile"):
    lines = ["# Instructions per request, by stage (callgrind)", ""]
    if results["label"]:
        lines += [f"Build: {results['label']}", ""]
    paths = list(results["paths"])
    lines.append("| stage | " + " | ".join(paths) + " |")
    lines.append("|---|" + "---:|" * len(paths))
    lines.append("| **total** | " + " | ".join(f"{results['paths'][p]['instructions_per_request']:,}" for p in paths) + " |")
    for stage in STAGE_ORDER:
        cells = []
        for p in paths:
            v = results["paths"][p]["stages"].get(stage)
            cells.append(f"{v:,}" if v else "—")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    if results.get("nginx"):
        lines += ["", "nginx under callgrind, the same load (`proxy_pass`; `limit_req` refusing):", ""]
        lines.append("| nginx | instructions per request |")
        lines.append("|---|---:|")
        for label, fig in results["nginx"].items():
            lines.append(f"| {label} | {fig['instructions_per_request']:,} |")
    lines += ratios(results)
    lines += simulated_table(results)
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    with open(os.path.join(BENCH, "results", stem + ".md"), "w") as f:
        f.write(text)
    with open(os.path.join(BENCH, "results", stem + ".json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
