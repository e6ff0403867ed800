#!/usr/bin/env python3
"""Connection floods: does sluice give its memory back once a flood of
half-open connections has ended, and which glibc malloc setting makes it?

    python3 bench/connflood.py [--sluice target/release/sluice] [--cycles 13]
        [--conns 3000] [--variants a,b,c,d,e,f,g] [--idle 30] [--keep]

One sluice (memory store, `server.workers: 0` = one worker per core,
`max_connections: 10000`, `max_connections_per_ip: 10000` so this one
client may open them all (left out for a build that predates the key),
`header_read_timeout: 10s`) in front of nginx
`return 200`. For each variant of the malloc environment, in turn, on a
fresh sluice:

- warm-up: wrk on /allowed (32 connections, a limit never reached), then
  the idle figures (median of 3 readings);
- N cycles of: open `--conns` TCP connections that each send a partial
  request head (`GET /allowed HTTP/1.1\\r\\nHost: x\\r\\n` and nothing more)
  and hold them ~2 s; meanwhile `--complete` whole requests, each on a
  connection of its own, 20 at a time (fewer than the warm-up's 32, so the
  upstream pool, which keeps idle connections 90 s, does not grow past
  what the idle figures already hold); then every connection is closed;
  then the script waits until sluice's client connections, open FDs and
  live runtime tasks are back near the idle figures (the upstream
  connections its pool keeps idle for 90 s aside: one FD and one task
  each) and reads VmRSS and /proc/PID/smaps_rollup;
- `--idle` seconds with no load, and the figures again;
- then, with gdb when it can attach: `malloc_stats()` (what the allocator
  holds against what is in use, arena by arena) and `malloc_trim(0)`, and
  the figures once more: what a trim in sluice would give back.

Variants: (a) the default environment; (b) `MALLOC_ARENA_MAX=2`;
(c) `MALLOC_TRIM_THRESHOLD_=131072`; (d) `GLIBC_TUNABLES=
glibc.malloc.trim_threshold=131072:glibc.malloc.arena_max=2` (the tunables
spelling of both; glibc reads the `MALLOC_*_` variables as aliases of the
same tunables); (e) (d) with `glibc.malloc.top_pad=0` (MALLOC_TOP_PAD_=0);
(f) `MALLOC_ARENA_MAX=1` (every thread on the main arena); and (g), not a
setting but a stand-in for sluice calling `malloc_trim(0)` itself: a
thread calling it every second, from a shared object this script compiles
(gcc) into its work directory and preloads (LD_PRELOAD). Any MALLOC_*,
GLIBC_TUNABLES or LD_PRELOAD in this script's own environment is removed
for every variant.

Then a rough closed-loop throughput check (wrk, 32 connections, `--tput-s`
seconds, rounds alternating) of (a) against the variant with the smallest
margin over its idle RSS, with sluice's CPU per request (utime + stime ÷
requests), steadier than req/s on a shared machine.

Placement: sluice on CPUs 0,1 (`--sluice-cpus`), so `workers: 0` gives the
default two workers of this 2-core machine (pinned to one CPU it would
start one, and fewer threads mean fewer malloc arenas); nginx, wrk and this
script (the flood client) on CPU 0. RSS is not sensitive to the sharing;
req/s is.

Load only ever targets 127.0.0.1. Every process is started here and
stopped by its PID when the script ends, however it ends. The report goes
to results/connflood.md and results/connflood.json.
"""

import argparse
import concurrent.futures
import contextlib
import datetime
import errno
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import soak  # noqa: E402
import tools  # noqa: E402
from tools import Processes  # noqa: E402

BENCH = harness.BENCH
ROOT = harness.ROOT
CPU_REST = harness.CPU_REST
log = harness.log

VARIANTS = {
    "a": ("default", {}),
    "b": ("MALLOC_ARENA_MAX=2", {"MALLOC_ARENA_MAX": "2"}),
    "c": ("MALLOC_TRIM_THRESHOLD_=131072", {"MALLOC_TRIM_THRESHOLD_": "131072"}),
    "d": ("GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072:glibc.malloc.arena_max=2",
          {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072:glibc.malloc.arena_max=2"}),
    "e": ("(d) + MALLOC_TOP_PAD_=0",
          {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072:glibc.malloc.arena_max=2:glibc.malloc.top_pad=0"}),
    "f": ("MALLOC_ARENA_MAX=1", {"MALLOC_ARENA_MAX": "1"}),
    # Not a setting: a stand-in for sluice calling malloc_trim(0) itself
    # (LD_PRELOAD of TRIM_SHIM, compiled here; LD_PRELOAD is filled in then).
    "g": ("malloc_trim(0) every 1 s (LD_PRELOAD stand-in)", {"CONNFLOOD_TRIM_MS": "1000"}),
}
SHIM_VARIANTS = {"g"}

# A thread calling malloc_trim(0) every CONNFLOOD_TRIM_MS: what sluice would
# do with a periodic trim, without changing sluice. It never allocates, so
# it takes no arena of its own.
TRIM_SHIM = r"""
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Every 10 trims, to stderr (sluice's log): how many, their total and
   longest duration (each holds an arena's lock while it walks it). */
static void *trimmer(void *arg) {
    long ms = (long) arg, n = 0, total = 0, longest = 0;
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    char line[128];
    for (;;) {
        nanosleep(&ts, NULL);
        long t0 = now_ns();
        malloc_trim(0);
        long d = now_ns() - t0;
        n++;
        total += d;
        if (d > longest) longest = d;
        if (n % 10 == 0) {
            int len = snprintf(line, sizeof line, "connflood-trim: n=%ld total_us=%ld max_us=%ld\n",
                               n, total / 1000, longest / 1000);
            if (write(2, line, len) < 0) {}
        }
    }
    return NULL;
}

__attribute__((constructor)) static void start_trimmer(void) {
    const char *e = getenv("CONNFLOOD_TRIM_MS");
    long ms = e ? atol(e) : 1000;
    pthread_t t;
    pthread_attr_t a;
    if (ms <= 0) return;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &a, trimmer, (void *) ms);
}
"""


def build_shim(workdir):
    """The trim shim as a shared object, or (None, why not)."""
    if not shutil.which("gcc"):
        return None, "no gcc to build the malloc_trim shim"
    src = os.path.join(workdir, "trim_shim.c")
    so = os.path.join(workdir, "trim_shim.so")
    with open(src, "w") as f:
        f.write(TRIM_SHIM)
    out = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", so, src, "-lpthread"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None, "gcc failed: " + out.stderr.strip()[-200:]
    return so, None

PARTIAL = b"GET /allowed HTTP/1.1\r\nHost: x\r\n"
COMPLETE = b"GET /allowed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
COMPLETE_CONCURRENCY = 20
WARMUP_CONNS = 32
HOLD_S = 2.0
FD_SLACK = 5  # "near baseline": FDs and tasks at most this many above idle
SETTLE_TIMEOUT_S = 30
AFTER_SETTLE_S = 1.5  # then the reading (longer than the trim stand-in's period)
SMAPS_KEYS = ("Rss", "Pss", "Private_Dirty", "Anonymous")

CONFIG = """\
# Written by bench/connflood.py: sluice on the embedded store, every
# connection bound wide enough for one client to hold a flood.
version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  workers: 0
  max_connections: 10000
@@PER_IP@@  header_read_timeout: 10s
upstream:
  url: http://127.0.0.1:@@UPSTREAM_PORT@@
store:
  kind: memory
  budget: @@BUDGET_MS@@ms
identity:
  pseudonym_key: bench-pseudonym-key-not-a-secret
policies:
  open:
    algorithm: fixed-window
    limit: 1000000000
    window: 1s
routes:
  - name: allowed
    match: { path: /allowed }
    subject: client_ip
    policy: open
default: { policy: none }
"""


# --- starting sluice with a malloc environment --------------------------------


def is_malloc_env(k):
    return k.startswith(("MALLOC_", "CONNFLOOD_")) or k in ("GLIBC_TUNABLES", "LD_PRELOAD")


@contextlib.contextmanager
def sluice_env(env, cpus):
    """os.environ as a variant wants it (children inherit it), and
    harness.start_sluice's CPU set, for the duration of one start."""
    saved_env = dict(os.environ)
    saved_cpu = harness.CPU_PROXY
    for k in list(os.environ):
        if is_malloc_env(k):
            del os.environ[k]
    os.environ.update(env)
    harness.CPU_PROXY = cpus
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        harness.CPU_PROXY = saved_cpu


PER_IP_LINE = "  max_connections_per_ip: 10000\n"


def per_ip_line(sluice, workdir):
    """The `max_connections_per_ip` line, or "" for a build older than the
    key (it then has no per-address bound, and `max_connections` alone
    lets one client open them all)."""
    conf = os.path.join(workdir, "connflood-check.yaml")
    harness.render(os.path.join(workdir, "connflood.yaml.in"), conf, UPSTREAM_PORT=1, BUDGET_MS=harness.BUDGET_MS,
                   PER_IP=PER_IP_LINE)
    check = subprocess.run([sluice, "check", "--config", conf], capture_output=True, text=True)
    if check.returncode != 0 and "unknown key `max_connections_per_ip`" in check.stderr + check.stdout:
        return ""
    return PER_IP_LINE


def write_template(workdir):
    with open(os.path.join(workdir, "connflood.yaml.in"), "w") as f:
        f.write(CONFIG)


def start(procs, workdir, sluice, name, env, cpus, upstream_port, per_ip):
    conf = os.path.join(workdir, "connflood.yaml.in")
    with sluice_env(env, cpus):
        # An absolute template path: harness.render joins it unchanged.
        srv = harness.start_sluice(procs, workdir, sluice, name, conf, UPSTREAM_PORT=upstream_port,
                                   PER_IP=per_ip)
    if srv.reason:
        raise SystemExit(f"connflood: {srv.reason}")
    return srv


def proc_environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for it in items:
        k, _, v = it.decode("utf-8", "replace").partition("=")
        if is_malloc_env(k):
            out[k] = v
    return out


# --- readings ----------------------------------------------------------------


def smaps_rollup(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[0][:-1] in SMAPS_KEYS:
                    out[parts[0][:-1] + "_kb"] = int(parts[1])
    except OSError:
        pass
    return out


def sockets(pid, port, upstream_port):
    """sluice's TCP sockets by side: (client connections on the traffic
    port, connections to the upstream). The upstream pool keeps idle
    connections 90 s, so FDs alone do not say the flood is gone."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    down = up = 0
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[9] not in inodes or parts[3] == "0A":  # 0A: LISTEN
                        continue
                    if int(parts[1].rsplit(":", 1)[1], 16) == port:
                        down += 1
                    elif int(parts[2].rsplit(":", 1)[1], 16) == upstream_port:
                        up += 1
        except OSError:
            pass
    return down, up


def read_all(pid, admin, port=None, upstream_port=None):
    r = soak.reading(pid, admin)
    r.pop("metrics", None)
    r.update(smaps_rollup(pid))
    if port:
        r["client_conns"], r["upstream_conns"] = sockets(pid, port, upstream_port)
    return r


def idle_figures(srv, upstream_port, n=3):
    rs = []
    for _ in range(n):
        rs.append(read_all(srv.pid, srv.admin_port, srv.port, upstream_port))
        time.sleep(1)
    out = {}
    for k in rs[0]:
        vals = [r[k] for r in rs if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def settle(srv, upstream_port, base):
    """Polls until sluice's client connections, FDs and live tasks are at
    most FD_SLACK above idle, not counting the upstream connections the
    pool holds beyond idle (one FD and one task each, kept 90 s); then one
    full reading, AFTER_SETTLE_S later."""
    pid, admin = srv.pid, srv.admin_port
    t0 = time.monotonic()
    while time.monotonic() - t0 < SETTLE_TIMEOUT_S:
        r = read_all(pid, admin, srv.port, upstream_port)
        extra_up = max(0, r["upstream_conns"] - base["upstream_conns"])
        ok = (r["client_conns"] <= base["client_conns"] + FD_SLACK
              and r["fds"] <= base["fds"] + extra_up + FD_SLACK
              and (r["tasks"] is None or base.get("tasks") is None
                   or r["tasks"] <= base["tasks"] + extra_up + FD_SLACK))
        if ok:
            waited = time.monotonic() - t0
            time.sleep(AFTER_SETTLE_S)
            r = read_all(pid, admin, srv.port, upstream_port)
            r["settled_after_s"] = round(waited, 2)
            return r
        time.sleep(0.25)
    r = read_all(pid, admin, srv.port, upstream_port)
    r["settled_after_s"] = None
    return r


# --- the flood client ----------------------------------------------------------


def open_half_open(port, n, pid, base_fds, in_flight=256, timeout=30.0):
    """`n` connections, each having sent PARTIAL and nothing more; returns
    (sockets, connect failures, seconds until sluice holds ≥ 98% of them)."""
    addr = ("127.0.0.1", port)
    ep = select.epoll()
    pending = {}
    socks = []
    failed = 0
    started = 0
    t0 = time.monotonic()
    try:
        while (started < n or pending) and time.monotonic() - t0 < timeout:
            while started < n and len(pending) < in_flight:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                err = s.connect_ex(addr)
                started += 1
                if err not in (0, errno.EINPROGRESS):
                    failed += 1
                    s.close()
                    continue
                ep.register(s.fileno(), select.EPOLLOUT)
                pending[s.fileno()] = s
            for fd, _ in ep.poll(0.5):
                s = pending.pop(fd)
                ep.unregister(fd)
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    failed += 1
                    s.close()
                    continue
                try:
                    s.send(PARTIAL)
                except OSError:
                    failed += 1
                    s.close()
                    continue
                socks.append(s)
    finally:
        for s in pending.values():
            failed += 1
            s.close()
        ep.close()
    # Connected is not yet accepted: wait until sluice holds them.
    want = base_fds + int(0.98 * len(socks))
    held_after = None
    while time.monotonic() - t0 < timeout:
        if len(os.listdir(f"/proc/{pid}/fd")) >= want:
            held_after = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.05)
    return socks, failed, held_after


def closed_by_peer(socks):
    """How many of the held connections sluice has already closed (readable:
    EOF or an answer)."""
    n = 0
    ep = select.epoll()
    try:
        for s in socks:
            ep.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
        n = len(ep.poll(0))
    finally:
        ep.close()
    return n


def one_request(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(COMPLETE)
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        if data.startswith(b"HTTP/1.1 "):
            return data[9:12].decode("ascii", "replace")
        return "no answer"
    except OSError as e:
        return f"error: {type(e).__name__}"


def complete_requests(port, n):
    statuses = {}
    with concurrent.futures.ThreadPoolExecutor(COMPLETE_CONCURRENCY) as ex:
        for st in ex.map(lambda _: one_request(port), range(n)):
            statuses[st] = statuses.get(st, 0) + 1
    return statuses


def cycle(srv, upstream_port, base, conns, complete):
    pid, port = srv.pid, srv.port
    c = {}
    with tools.RssSampler(pid) as peak:
        t0 = time.monotonic()
        socks, failed, held_after = open_half_open(port, conns, pid, base["fds"])
        c["opened"] = len(socks)
        c["connect_failed"] = failed
        c["held_after_s"] = held_after
        c["fds_held"] = len(os.listdir(f"/proc/{pid}/fd"))
        c["client_conns_held"] = sockets(pid, port, upstream_port)[0]
        try:
            time.sleep(max(0.0, HOLD_S - (time.monotonic() - t0)) if held_after is None else HOLD_S)
            c["statuses"] = complete_requests(port, complete)
            c["fds_before_close"] = len(os.listdir(f"/proc/{pid}/fd"))
            c["closed_by_sluice_before_close"] = closed_by_peer(socks)
            c["held_s"] = round(time.monotonic() - t0, 2)
        finally:
            for s in socks:
                s.close()
        after = settle(srv, upstream_port, base)
    c["peak_rss_kb"] = peak.max_kb
    c["after"] = after
    return c


# --- allocator statistics (gdb) -----------------------------------------------


def gdb_malloc(pid, logf):
    """malloc_stats() into sluice's stderr (its log) and malloc_trim(0), from
    gdb; returns the parsed stats, or {'reason': ...}."""
    if not shutil.which("gdb"):
        return {"reason": "no gdb"}
    offset = os.path.getsize(logf)
    argv = ["gdb", "-nx", "-batch", "-p", str(pid),
            "-ex", "call (void) malloc_stats()",
            "-ex", "call (int) malloc_trim(0)",
            "-ex", "detach"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"reason": "gdb timed out"}
    with open(logf, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    arenas = []
    for m in re.finditer(r"Arena (\d+):\s*system bytes\s*=\s*(\d+)\s*in use bytes\s*=\s*(\d+)", text):
        arenas.append({"arena": int(m.group(1)), "system": int(m.group(2)), "in_use": int(m.group(3))})
    total = re.search(r"Total \(incl\. mmap\):\s*system bytes\s*=\s*(\d+)\s*in use bytes\s*=\s*(\d+)", text)
    mmap = re.search(r"max mmap regions\s*=\s*(\d+)\s*max mmap bytes\s*=\s*(\d+)", text)
    trim = re.search(r"\$\d+ = (\d+)", out.stdout)
    if not total:
        return {"reason": "no malloc_stats output: " + (out.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return {"arenas": arenas, "system": int(total.group(1)), "in_use": int(total.group(2)),
            "max_mmap_regions": int(mmap.group(1)) if mmap else None,
            "max_mmap_bytes": int(mmap.group(2)) if mmap else None,
            "trim_returned": int(trim.group(1)) if trim else None}


def trim_counts(logf):
    """The trim stand-in's last tally from sluice's log, or None."""
    last = None
    try:
        with open(logf, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.match(r"connflood-trim: n=(\d+) total_us=(\d+) max_us=(\d+)", line)
                if m:
                    last = {"n": int(m.group(1)), "total_us": int(m.group(2)), "max_us": int(m.group(3))}
    except OSError:
        pass
    return last


# --- one variant -----------------------------------------------------------------


def variant_env(key, args):
    label, env = VARIANTS[key]
    env = dict(env)
    if key in SHIM_VARIANTS:
        env["LD_PRELOAD"] = args.shim
    return label, env


TUNABLES = ("trim_threshold", "arena_max", "top_pad", "mmap_threshold")


def tunables_in_effect(env):
    """What glibc makes of `env`: `ld.so --list-tunables` under it (the
    values malloc starts with; /proc/PID/environ is no check, since glibc
    cuts GLIBC_TUNABLES at its first ':' in place while parsing it)."""
    ldso = next((p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1") if os.path.exists(p)), None)
    if not ldso:
        return None
    clean = {k: v for k, v in os.environ.items() if not is_malloc_env(k)}
    clean.update({k: v for k, v in env.items() if k != "LD_PRELOAD"})
    try:
        out = subprocess.run([ldso, "--list-tunables"], capture_output=True, text=True, env=clean, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    got = {}
    for line in out.stdout.splitlines():
        m = re.match(r"glibc\.malloc\.(\w+): (\S+)", line)
        if m and m.group(1) in TUNABLES:
            got[m.group(1)] = int(m.group(2), 0)
    return got or None


def run_variant(procs, workdir, args, key, upstream_port):
    label, env = variant_env(key, args)
    log(f"variant ({key}) {label}")
    srv = start(procs, workdir, args.sluice, f"sluice-{key}", env, args.sluice_cpus, upstream_port, args.per_ip)
    pid = srv.pid
    v = {"label": label, "env": env, "env_seen": proc_environ(pid), "tunables": tunables_in_effect(env),
         "start": read_all(pid, srv.admin_port, srv.port, upstream_port)}
    try:
        tools.run_wrk(f"http://127.0.0.1:{srv.port}/allowed", WARMUP_CONNS, args.warmup, CPU_REST)
        time.sleep(2)
        base = idle_figures(srv, upstream_port)
        v["idle"] = base
        log(f"  idle: RSS {base['rss_kb']} kB, fds {base['fds']} (client {base['client_conns']}, upstream "
            f"{base['upstream_conns']}), threads {base['threads']}, tasks {base['tasks']}")
        v["cycles"] = []
        for i in range(args.cycles):
            c = cycle(srv, upstream_port, base, args.conns, args.complete)
            v["cycles"].append(c)
            a = c["after"]
            log(f"  cycle {i + 1}: held {c['client_conns_held']} (+{c['connect_failed']} failed), "
                f"peak {c['peak_rss_kb']} kB, after {a['rss_kb']} kB (fds {a['fds']}, client conns "
                f"{a['client_conns']}, upstream {a['upstream_conns']}, tasks {a['tasks']}, "
                f"settled {a['settled_after_s']} s), {c['statuses']}")
        log(f"  {args.idle} s idle")
        cpu0 = tools.cpu_seconds(pid)
        time.sleep(args.idle)
        v["idle_cpu_s"] = round(tools.cpu_seconds(pid) - cpu0, 3)
        v["final"] = read_all(pid, srv.admin_port, srv.port, upstream_port)
        v["trims"] = trim_counts(os.path.join(workdir, f"sluice-{key}.log"))
        log(f"  final: {v['final']['rss_kb']} kB")
        v["malloc"] = gdb_malloc(pid, os.path.join(workdir, f"sluice-{key}.log"))
        time.sleep(0.5)
        v["after_trim"] = read_all(pid, srv.admin_port, srv.port, upstream_port)
        log(f"  malloc_stats: {({k: x for k, x in v['malloc'].items() if k != 'arenas'})}; "
            f"after malloc_trim(0): {v['after_trim']['rss_kb']} kB")
    finally:
        procs.stop(srv.proc)
    return v


def margin_kb(v):
    posts = [c["after"]["rss_kb"] for c in v["cycles"]] + [v["final"]["rss_kb"]]
    return max(posts) - v["idle"]["rss_kb"]


# --- throughput ------------------------------------------------------------------


def throughput(procs, workdir, args, keys, upstream_port):
    runs = {k: [] for k in keys}
    for r in range(args.tput_rounds):
        order = keys if r % 2 == 0 else list(reversed(keys))
        for key in order:
            label, env = variant_env(key, args)
            srv = start(procs, workdir, args.sluice, f"sluice-tput-{key}-{r}", env, args.sluice_cpus,
                        upstream_port, args.per_ip)
            try:
                url = f"http://127.0.0.1:{srv.port}/allowed"
                tools.run_wrk(url, WARMUP_CONNS, 2, CPU_REST)
                cpu0 = tools.cpu_seconds(srv.pid)
                w = tools.run_wrk(url, WARMUP_CONNS, args.tput_s, CPU_REST)
                w["cpu_us_per_req"] = (tools.cpu_seconds(srv.pid) - cpu0) * 1e6 / max(1, w["requests"])
                w["loadavg"] = os.getloadavg()[0]
                runs[key].append(w)
                log(f"  throughput ({key}) round {r + 1}: {w['rps']:.0f} req/s, "
                    f"{w['cpu_us_per_req']:.1f} µs CPU/req, non-2xx {w['non_2xx']}, errors {w['socket_errors']}")
            finally:
                procs.stop(srv.proc)
    out = {}
    for k, rs in runs.items():
        out[k] = {"runs": rs,
                  "rps_median": statistics.median(x["rps"] for x in rs),
                  "cpu_us_per_req_median": statistics.median(x["cpu_us_per_req"] for x in rs)}
    return out


# --- report ----------------------------------------------------------------------


def mb(kb):
    return "—" if kb is None else f"{kb / 1024:.1f}"


def summary_lines(r):
    vs = r["variants"]
    out = []

    def one(k):
        v = vs[k]
        worst = max([c["after"]["rss_kb"] for c in v["cycles"]] + [v["final"]["rss_kb"]])
        text = (f"({k}) {v['label']}: idle {mb(v['idle']['rss_kb'])} MB, worst after a flood {mb(worst)} MB, "
                f"after {r['settings']['idle_s']} s idle {mb(v['final']['rss_kb'])} MB: margin **+{mb(margin_kb(v))} MB**")
        mal = v.get("malloc") or {}
        if "system" in mal:
            text += (f"; at the end malloc has {mb(mal['system'] / 1024)} MB mapped of which "
                     f"{mb(mal['in_use'] / 1024)} MB in use, and `malloc_trim(0)` takes RSS to "
                     f"{mb(v['after_trim']['rss_kb'])} MB")
        return text + "."

    settings = [k for k in vs if k not in SHIM_VARIANTS]
    if "a" in vs:
        out.append("- " + one("a"))
    best_setting = min(settings, key=lambda k: margin_kb(vs[k])) if settings else None
    if best_setting and best_setting != "a":
        out.append("- Best allocator setting by margin: " + one(best_setting))
    for k in vs:
        if k in SHIM_VARIANTS:
            t = vs[k].get("trims")
            out.append("- " + one(k) + (f" Its trims: {t['n']}, mean {t['total_us'] / t['n'] / 1000:.1f} ms, longest "
                                        f"{t['max_us'] / 1000:.1f} ms (each holds an arena's lock while it walks it)."
                                        if t else ""))
    base_ok = all(max(c["after"]["client_conns"] for c in v["cycles"]) <= v["idle"]["client_conns"] + FD_SLACK
                  for v in vs.values())
    out.append(f"- After every cycle of every variant sluice's client connections, FDs and live tasks were back at "
               f"idle (beyond the upstream pool's idle connections): {'yes' if base_ok else 'no, see below'}.")
    return out


def markdown(r):
    st = r["settings"]
    vs = r["variants"]
    keys = list(vs)
    m = r["machine"]
    lines = [
        f"# sluice connection flood: RSS after the flood — {r['generated_at']}",
        "",
        f"**Machine:** {m['cpu_model']}, nproc {m['nproc']}, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"{r['glibc']}; load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])} "
        f"(shared with builds and other benchmarks).  ",
        f"**Binary:** `{st['sluice']}` ({m['tools']['sluice']}, built {st.get('sluice_mtime', '?')}; the work tree "
        f"was at commit {m['tools']['sluice_commit']} when this ran, which may be newer).  ",
        f"**Command:** `{r['command']}`; whole run {r.get('elapsed_s', '—')} s.",
        "",
        f"**Method:** sluice (memory store, `server.workers: 0`, `max_connections: 10000`, "
        + ("`max_connections_per_ip: 10000`, " if st.get("per_ip_line") else
           "no `max_connections_per_ip` (the build predates it: see the notes), ")
        + f"`header_read_timeout: 10s`) in front of nginx `return 200`, "
        f"on CPUs {st['sluice_cpus']} (so `workers: 0` starts {vs[keys[0]]['idle']['threads']} threads in all here); "
        f"nginx, wrk and the flood client on CPU {CPU_REST}. Per variant a fresh sluice: {st['warmup_s']} s of wrk "
        f"({WARMUP_CONNS} connections) on /allowed, then the idle figures (median of 3 readings). Then "
        f"{st['cycles']} cycles of: {st['conns']:,} connections each sending `GET /allowed HTTP/1.1\\r\\nHost: x\\r\\n` "
        f"and nothing more, held ~{HOLD_S:.0f} s; meanwhile {st['complete']} complete requests, each on its own "
        f"connection, {COMPLETE_CONCURRENCY} at a time; then every connection closed; when sluice's client "
        f"connections (its sockets on the traffic port, from /proc/PID/net/tcp), open FDs and live runtime tasks "
        f"(`sluice_runtime_alive_tasks`) are back within {FD_SLACK} of idle (FDs and tasks: plus the upstream "
        f"connections the pool holds beyond idle, kept 90 s), +{AFTER_SETTLE_S} s, the figures are read. "
        f"After the last cycle {st['idle_s']} s without load, the figures again; then, through gdb, `malloc_stats()` and `malloc_trim(0)`, and the figures once more.",
        "",
        "## Summary",
        "",
    ] + summary_lines(r) + [
        "",
        "## RSS (VmRSS, MB) after each cycle, FDs and tasks back at idle",
        "",
        "| | " + " | ".join(f"({k}) {vs[k]['label']}" for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
        "| idle after warm-up | " + " | ".join(mb(vs[k]["idle"]["rss_kb"]) for k in keys) + " |",
    ]
    for i in range(st["cycles"]):
        lines.append(f"| after cycle {i + 1} | "
                     + " | ".join(mb(vs[k]["cycles"][i]["after"]["rss_kb"]) if i < len(vs[k]["cycles"]) else "—"
                                  for k in keys) + " |")
    lines += [
        f"| **after {st['idle_s']} s idle** | " + " | ".join(f"**{mb(vs[k]['final']['rss_kb'])}**" for k in keys) + " |",
        "| peak (during a cycle, 100 ms samples) | "
        + " | ".join(mb(max(c["peak_rss_kb"] or 0 for c in vs[k]["cycles"])) for k in keys) + " |",
        "| margin: worst after-flood − idle | " + " | ".join(f"+{mb(margin_kb(vs[k]))}" for k in keys) + " |",
        "| then `malloc_trim(0)` (gdb) | " + " | ".join(mb(vs[k]["after_trim"]["rss_kb"]) for k in keys) + " |",
        "",
        "## What the process holds at the end",
        "",
        "| | " + " | ".join(f"({k})" for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]

    def row(label, fn):
        vals = []
        for k in keys:
            try:
                vals.append(fn(vs[k]))
            except (KeyError, TypeError, ValueError):
                vals.append("—")
        lines.append(f"| {label} | " + " | ".join(vals) + " |")

    row("open FDs: idle / worst after a cycle / final",
        lambda v: f"{v['idle']['fds']:.0f} / {max(c['after']['fds'] for c in v['cycles'])} / {v['final']['fds']}")
    row("live tasks: idle / worst after a cycle / final",
        lambda v: f"{v['idle']['tasks']:.0f} / {max(c['after']['tasks'] for c in v['cycles'])} / {v['final']['tasks']}")
    row("threads (idle / final)", lambda v: f"{v['idle']['threads']:.0f} / {v['final']['threads']}")
    row("client connections: idle / worst after a cycle / final",
        lambda v: f"{v['idle']['client_conns']:.0f} / {max(c['after']['client_conns'] for c in v['cycles'])} / "
                  f"{v['final']['client_conns']}")
    row("upstream pool connections: idle / worst after a cycle / final",
        lambda v: f"{v['idle']['upstream_conns']:.0f} / {max(c['after']['upstream_conns'] for c in v['cycles'])} / "
                  f"{v['final']['upstream_conns']}")
    row("cycles not settled within 30 s", lambda v: str(sum(c["after"]["settled_after_s"] is None for c in v["cycles"])))
    row("client connections held per cycle (min)", lambda v: str(min(c["client_conns_held"] for c in v["cycles"])))
    row("closed by sluice before the client closed (max)",
        lambda v: str(max(c["closed_by_sluice_before_close"] for c in v["cycles"])))
    row("Private_Dirty MB: idle / final", lambda v: f"{mb(v['idle']['Private_Dirty_kb'])} / {mb(v['final']['Private_Dirty_kb'])}")
    row("Anonymous MB: idle / final", lambda v: f"{mb(v['idle']['Anonymous_kb'])} / {mb(v['final']['Anonymous_kb'])}")
    row("malloc: arenas", lambda v: str(len(v["malloc"]["arenas"])))
    row(f"sluice CPU s over the {st['idle_s']} s idle", lambda v: f"{v['idle_cpu_s']:.2f}")
    row("trim stand-in: trims, mean / longest µs",
        lambda v: (f"{v['trims']['n']}, {v['trims']['total_us'] / v['trims']['n']:.0f} / {v['trims']['max_us']}"
                   if v.get("trims") else "—"))
    row("malloc: system MB (mapped by malloc; a trimmed page stays mapped, not resident)",
        lambda v: mb(v["malloc"]["system"] / 1024))
    row("malloc: in use MB (live allocations)", lambda v: mb(v["malloc"]["in_use"] / 1024))
    row("malloc: held but free MB", lambda v: mb((v["malloc"]["system"] - v["malloc"]["in_use"]) / 1024))
    row("complete requests' answers (all cycles)",
        lambda v: ", ".join(f"{s}×{n}" for s, n in sorted(
            {s: sum(c["statuses"].get(s, 0) for c in v["cycles"]) for c in v["cycles"] for s in c["statuses"]}.items())))
    row("environment set", lambda v: ", ".join(f"`{a}={b}`" for a, b in v["env"].items()
                                                if a != "LD_PRELOAD") + (", `LD_PRELOAD=trim_shim.so`"
                                                                         if "LD_PRELOAD" in v["env"] else "") or "none")
    row("glibc tunables in effect (`ld.so --list-tunables` under that environment; 0: not set, glibc's built-in "
        "default: trim threshold 128 KiB, raised when an mmapped chunk is freed; 8 arenas per core): "
        "trim_threshold / arena_max / top_pad",
        lambda v: "{} / {} / {}".format(*(v["tunables"].get(t) for t in ("trim_threshold", "arena_max", "top_pad"))))
    lines.append("")

    t = r.get("throughput")
    if t:
        lines += [
            f"## Throughput (rough: 2 cores shared with other work)",
            "",
            f"wrk `-t1 -c{WARMUP_CONNS}` on /allowed for {st['tput_s']} s after 2 s of warm-up, fresh sluice per run, "
            f"{st['tput_rounds']} rounds alternating; sluice CPU per request = utime + stime ÷ requests.",
            "",
            "| variant | req/s (median; runs) | CPU µs/request (median; runs) |",
            "|---|---|---|",
        ]
        for k, x in t.items():
            lines.append(f"| ({k}) {VARIANTS[k][0]} | {x['rps_median']:,.0f} ("
                         + ", ".join(f"{w['rps']:,.0f}" for w in x["runs"]) + f") | {x['cpu_us_per_req_median']:.1f} ("
                         + ", ".join(f"{w['cpu_us_per_req']:.1f}" for w in x["runs"]) + ") |")
        lines.append("")
    if r.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in r["notes"]] + [""]
    return "\n".join(lines)


# --- the run ---------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--cycles", type=int, default=13)
    ap.add_argument("--conns", type=int, default=3000)
    ap.add_argument("--complete", type=int, default=300, help="complete requests per cycle")
    ap.add_argument("--variants", default="a,b,c,d,e,f,g")
    ap.add_argument("--warmup", type=int, default=3, help="seconds of wrk before the idle figures")
    ap.add_argument("--idle", type=int, default=30, help="seconds idle after the last cycle")
    ap.add_argument("--sluice-cpus", default="0,1")
    ap.add_argument("--tput-s", type=int, default=10)
    ap.add_argument("--tput-rounds", type=int, default=3, help="0: no throughput check")
    ap.add_argument("--out", default=os.path.join(BENCH, "results"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs)")
    args = ap.parse_args()
    keys = [k.strip() for k in args.variants.split(",") if k.strip()]
    for k in keys:
        if k not in VARIANTS:
            raise SystemExit(f"connflood: unknown variant {k!r} (known: {', '.join(VARIANTS)})")
    if not os.access(args.sluice, os.X_OK):
        raise SystemExit(f"connflood: no sluice binary at {args.sluice} (cargo build --release)")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    harness.raise_fd_limit()
    try:
        os.sched_setaffinity(0, {CPU_REST})
    except OSError:
        pass
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-connflood-")
    started = time.monotonic()
    try:
        result = session(procs, workdir, args, keys)
    finally:
        procs.stop_all()
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "connflood.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    md = markdown(result)
    with open(os.path.join(args.out, "connflood.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"written: results/connflood.md and connflood.json ({result['elapsed_s']} s)")


def session(procs, workdir, args, keys):
    info = harness.machine_info(args.sluice, os.path.expanduser("~/.cache/sluice-bench/bin/oha"))
    glibc = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    notes = []
    write_template(workdir)
    args.per_ip = per_ip_line(args.sluice, workdir)
    if not args.per_ip:
        notes.append("This build does not know `server.max_connections_per_ip` (it predates the key, so it has no "
                     "per-address bound); the line is left out and `max_connections: 10000` alone lets this one "
                     "client open every connection.")
        log("note: " + notes[-1])
    upstream = harness.start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", CPU_REST)
    if upstream.reason:
        raise SystemExit(f"connflood: {upstream.reason}")
    args.shim = None
    if SHIM_VARIANTS & set(keys):
        args.shim, why = build_shim(workdir)
        if why:
            notes.append(f"Variant(s) {', '.join(sorted(SHIM_VARIANTS & set(keys)))} not run: {why}.")
            log("note: " + notes[-1])
            keys = [k for k in keys if k not in SHIM_VARIANTS]
    variants = {}
    for key in keys:
        variants[key] = run_variant(procs, workdir, args, key, upstream.port)
    tput = None
    best = min(keys, key=lambda k: margin_kb(variants[k]))
    if args.tput_rounds > 0:
        tkeys = ["a", best] if best != "a" and "a" in keys else [best]
        log(f"throughput: {', '.join(tkeys)}")
        tput = throughput(procs, workdir, args, tkeys, upstream.port)
    return {
        "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 bench/connflood.py " + " ".join(sys.argv[1:]),
        "machine": info,
        "glibc": glibc[0] if glibc else None,
        "settings": {"sluice": args.sluice,
                     "sluice_mtime": datetime.datetime.fromtimestamp(
                         os.path.getmtime(args.sluice), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                     "cycles": args.cycles, "conns": args.conns,
                     "complete": args.complete, "complete_concurrency": COMPLETE_CONCURRENCY,
                     "hold_s": HOLD_S, "warmup_s": args.warmup, "idle_s": args.idle,
                     "sluice_cpus": args.sluice_cpus, "per_ip_line": bool(args.per_ip), "rest_cpu": CPU_REST, "fd_slack": FD_SLACK,
                     "tput_s": args.tput_s, "tput_rounds": args.tput_rounds},
        "variants": variants,
        "best_by_margin": best,
        "throughput": tput,
        "notes": notes,
    }


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); every started process was stopped")
        sys.exit(130)
