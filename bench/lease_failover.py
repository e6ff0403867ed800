#!/usr/bin/env python3
"""Lease failover: what a Redis failover that loses writes lets through,
with `lease: on` and with `lease: off`.

Each round starts its own Redis primary, one replica and three Sentinels
(quorum 2), three sidecars following them (`topology: sentinel`,
`on_failure: deny`) and one global fixed window of L per hour, leased or
not. A paced client offers a fixed rate through the sidecars, well over L
in all. Once the primary has counted about CUT_SHARE of L, the replica's
link is cut (`CONFIG SET masterauth` to a wrong password, then `CLIENT
KILL TYPE master`: the replica stays a replica of the primary, whose writes
no longer reach it). The primary goes on deciding for LOSS_S; then its
writes are paused (`CLIENT PAUSE … WRITE`: every FCALL waits), its count of
the window is read and it is killed (SIGKILL). The replica's count is read
(a replica with its link down: nothing writes to it), and `SENTINEL
FAILOVER` promotes it. So exactly

    units lost = the primary's count at the kill − the promoted replica's count

(with the lease, grants are counted in it: units charged for a block, spent
or not). The load goes on past the failover until the limit is spent
everywhere; after it, more is offered until every sidecar refuses
(leases ended and given back first). Then

    admitted = what the upstream saw (and the client's 200s)
    over-admission = admitted − L

and the requirement is over-admission ≤ units lost, with the lease as
without it.

    python3 bench/lease_failover.py --sluice /tmp/sluice-leases-bin [--rounds 3] [--keep]

Writes bench/results/lease_failover.md and lease_failover.json. Everything
binds 127.0.0.1 on free ports below 55536; every process started here is
stopped by PID when the script ends, however it ends. Python 3 standard
library, redis-server 7 (and its Sentinel mode).
"""

import argparse
import asyncio
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import leases  # noqa: E402
import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "results")

CPU_PROXY = leases.CPU_PROXY
CPU_REST = leases.CPU_REST
SIDECARS = 3
LIMIT = 2000           # the global fixed window, per hour (never rolls in a round)
RATE = 1200            # requests/s offered in all, split evenly over the sidecars
LOAD_S = 6.0           # how long the paced load runs (7,200 offered: 3.6 L)
CUT_SHARE = 0.35       # the replica's link is cut once the primary counted this share of L
LOSS_S = 0.5           # how long the primary decides alone before it is killed
WORKERS = 48           # connections per sidecar of the paced client
BUDGET_MS = 50
MASTER = "mymaster"
MAX_PORT = 55535
PATH = "/fw"

CONFIG = """version: 1
server:
  listen: 127.0.0.1:{listen}
  admin: 127.0.0.1:{admin}
  workers: 1
  shutdown_delay: 0s
upstream:
  url: http://127.0.0.1:{upstream}
store:
  kind: redis
  topology: sentinel
  sentinel: {{ master: {master}, nodes: [{nodes}] }}
  budget: {budget}ms
  on_failure: deny
identity:
  pseudonym_key: bench-pseudonym-key-not-a-secret
policies:
  fw: {{ algorithm: fixed-window, limit: {limit}, window: 1h, lease: {lease} }}
routes:
  - {{ name: fw, match: {{ path_prefix: {path} }}, subject: global, policy: fw }}
default: {{ policy: none }}
"""

SENTINEL_CONF = """port {port}
bind 127.0.0.1
dir {dir}
logfile {dir}/sentinel.log
sentinel resolve-hostnames no
sentinel monitor {master} 127.0.0.1 {primary} 2
sentinel down-after-milliseconds {master} 1000
sentinel failover-timeout {master} 5000
sentinel parallel-syncs {master} 1
"""


def log(msg):
    print(f"[lease-failover {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def low_port(taken=()):
    """A free 127.0.0.1 port below 55536 (the kernel's picks go to 60999)."""
    for _ in range(500):
        port = tools.free_port()
        if port <= MAX_PORT and port not in taken:
            return port
    raise SystemExit("no free port below 55536")


def wait_until(what, timeout, check, every=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")


def redis_do(port, *args, timeout=2.0):
    r = Redis(port, timeout=timeout)
    try:
        return r.cmd(*args)
    finally:
        r.close()


# --- the counting upstream (a process of its own) -------------------------------


def serve_upstream(port):
    """Answers every request 200 `ok`, keep-alive; counts those whose path
    starts with PATH. `GET /__count` answers the count (not counted)."""
    count = [0]

    async def handle(reader, writer):
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                parts = line.split()
                target = parts[1].decode("latin-1") if len(parts) > 1 else "/"
                length = 0
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v.strip())
                if length:
                    await reader.readexactly(length)
                if target.startswith("/__count"):
                    body = json.dumps({"count": count[0]}).encode()
                else:
                    if target.startswith(PATH):
                        count[0] += 1
                    body = b"ok\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def upstream_count(port):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/__count")
        return json.loads(conn.getresponse().read())["count"]
    finally:
        conn.close()


# --- one round's Redis: primary, replica, three Sentinels ------------------------


def start_redis_node(procs, workdir, name, replica_of=None):
    port = low_port()
    node_dir = os.path.join(workdir, name)
    os.makedirs(node_dir, exist_ok=True)
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--dir", node_dir]
    if replica_of:
        argv += ["--replicaof", "127.0.0.1", str(replica_of)]
    logf = os.path.join(node_dir, "redis.log")
    proc = procs.start(name, argv, CPU_REST, logf)
    if not tools.wait_tcp(port, proc):
        raise SystemExit(f"{name}: redis-server did not start: {tools.tail(logf) or 'no output'}")
    return port, proc


def start_sentinel(procs, workdir, name, primary):
    port = low_port()
    sdir = os.path.join(workdir, name)
    os.makedirs(sdir, exist_ok=True)
    conf = os.path.join(sdir, "sentinel.conf")
    with open(conf, "w") as f:
        f.write(SENTINEL_CONF.format(port=port, dir=sdir, master=MASTER, primary=primary))
    proc = procs.start(name, ["redis-server", conf, "--sentinel"], CPU_REST, os.path.join(sdir, "stdout.log"))
    if not tools.wait_tcp(port, proc):
        raise SystemExit(f"{name} did not start: {tools.tail(os.path.join(sdir, 'sentinel.log'))}")
    return port


def info_field(port, section, key):
    for line in redis_do(port, "INFO", section).splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return None


def start_topology(procs, workdir):
    primary, primary_proc = start_redis_node(procs, workdir, "redis-primary")
    replica, _ = start_redis_node(procs, workdir, "redis-replica", replica_of=primary)
    wait_until("the replica to sync", 20,
               lambda: info_field(replica, "replication", "master_link_status") == "up")
    sentinels = [start_sentinel(procs, workdir, f"sentinel-{i}", primary) for i in range(3)]

    def agreed():
        for s in sentinels:
            if not redis_do(s, "SENTINEL", "REPLICAS", MASTER):
                return False
            if len(redis_do(s, "SENTINEL", "SENTINELS", MASTER)) != 2:
                return False
        return True

    wait_until("the Sentinels to agree", 30, agreed, every=0.2)
    return {"primary": primary, "primary_proc": primary_proc, "replica": replica, "sentinels": sentinels}


def window_count(port):
    """Redis's count of the window on the node at `port` (leases.window_count
    over leases.redis_window), or 0 when the key does not exist yet."""
    r = Redis(port, timeout=2)
    try:
        keys = leases.redis_window(r, "fw")
    finally:
        r.close()
    return leases.window_count(keys) or 0, keys


def window_starts(keys):
    """The window start of each state key (`t:s1:c1`)."""
    return sorted({v.split(":")[1] for k, v in keys.items() if k.startswith("sluice:") and isinstance(v, str)
                   and v.count(":") == 2})


# --- the paced client --------------------------------------------------------------


class PacedLoad:
    """`rate` requests/s in all, the k-th to sidecar k % n at t0 + k/rate,
    for `seconds`, from WORKERS connections per sidecar (a request whose
    time came while every connection was busy goes as soon as one is free:
    counted as late). Every answer is kept as (time sent, status)."""

    def __init__(self, servers, rate, seconds):
        self.servers, self.rate, self.seconds = servers, rate, seconds
        self.answers = []  # (sidecar index, time sent, status)
        self.late = 0
        self.t0 = None
        self.error = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        while self.t0 is None and self._thread.is_alive():
            time.sleep(0.005)

    def join(self):
        self._thread.join(self.seconds + 30)

    def _run(self):
        try:
            asyncio.run(self._main())
        except Exception as e:  # noqa: BLE001 - reported by the round
            self.error = repr(e)

    async def _main(self):
        n = len(self.servers)
        per = self.rate / n
        total = int(self.rate * self.seconds) // n
        nexts = [0] * n
        self.t0 = time.monotonic()

        async def worker(i):
            client = leases.Client(self.servers[i].port, PATH)
            reader = writer = None
            while nexts[i] < total:
                k = nexts[i]
                nexts[i] += 1
                due = self.t0 + k / per + i / self.rate
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                elif wait < -0.005:
                    self.late += 1
                sent = time.monotonic()
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection("127.0.0.1", self.servers[i].port)
                    status, close = await asyncio.wait_for(client._one(reader, writer), 5)
                except (OSError, ConnectionError, ValueError, IndexError, asyncio.TimeoutError,
                        asyncio.IncompleteReadError):
                    status, close = "error", True
                self.answers.append((i, sent, str(status)))
                if close and writer is not None:
                    writer.close()
                    reader = writer = None
            if writer is not None:
                writer.close()

        await asyncio.gather(*(worker(i) for i in range(n) for _ in range(WORKERS)))

    def statuses(self, start=None, end=None):
        out = {}
        for _, t, s in self.answers:
            if (start is None or t >= start) and (end is None or t < end):
                out[s] = out.get(s, 0) + 1
        return dict(sorted(out.items()))


# --- one round ---------------------------------------------------------------------


def sidecar_metrics(servers):
    out = []
    for s in servers:
        try:
            out.append(leases.metrics(s))
        except OSError:
            out.append({})
    return out


def held_now(servers):
    return int(sum(sum(m.get("sluice_lease_units_held", {}).values()) for m in sidecar_metrics(servers)))


def one_round(args, workdir, upstream_port, lease, n):
    rdir = os.path.join(workdir, f"round-{n}-lease-{lease}")
    os.makedirs(rdir)
    procs = Processes()
    try:
        topo = start_topology(procs, rdir)
        nodes = ", ".join(f"redis://127.0.0.1:{p}" for p in topo["sentinels"])
        servers = []
        for i in range(SIDECARS):
            text = CONFIG.format(listen=low_port(), admin=low_port(), upstream=upstream_port, master=MASTER,
                                 nodes=nodes, budget=BUDGET_MS, limit=LIMIT, lease=lease, path=PATH)
            servers.append(leases.start_sluice(procs, rdir, args.sluice, f"sluice-{i}", text))
        for s in servers:  # the upstream connection, off the limited route
            if tools.http_status(s.port, "/warm") != 200:
                raise SystemExit(f"{s.name}: /warm did not answer 200")
        up0 = upstream_count(upstream_port)
        before = sidecar_metrics(servers)
        primary, replica = topo["primary"], topo["replica"]
        preader = Redis(primary, timeout=2)
        rec = {"round": n, "lease": lease}
        load = PacedLoad(servers, args.rate, args.load_s)
        load.start()
        try:
            # 1. The replica's link is cut once the primary counted CUT_SHARE of L.
            cut_at = int(CUT_SHARE * LIMIT)
            deadline = time.monotonic() + args.load_s
            count = 0
            while time.monotonic() < deadline:
                count = leases.window_count(leases.redis_window(preader, "fw")) or 0
                if count >= cut_at:
                    break
                time.sleep(0.005)
            else:
                raise SystemExit(f"round {n}: the primary counted only {count} of {cut_at} before the cut")
            redis_do(replica, "CONFIG", "SET", "masterauth", "not-the-primary-password")
            redis_do(replica, "CLIENT", "KILL", "TYPE", "master")
            t_cut = time.monotonic()
            rec["primary_count_at_cut"] = leases.window_count(leases.redis_window(preader, "fw")) or 0
            rec["replica_count_at_cut"], _ = window_count(replica)
            rec["held_at_cut"] = held_now(servers)
            time.sleep(0.05)
            rec["replica_link_after_cut"] = info_field(replica, "replication", "master_link_status")
            # 2. The primary decides alone, then stops writing, is read and killed.
            time.sleep(max(0.0, args.loss_s - (time.monotonic() - t_cut)))
            preader.cmd("CLIENT", "PAUSE", 3000, "WRITE")
            t_pause = time.monotonic()
            p_kill, p_keys = leases.window_count(leases.redis_window(preader, "fw")) or 0, \
                leases.redis_window(preader, "fw")
            time.sleep(0.02)
            p_kill_again = leases.window_count(leases.redis_window(preader, "fw")) or 0
            p_offset = int(info_field(primary, "replication", "master_repl_offset"))
            os.kill(topo["primary_proc"].pid, signal.SIGKILL)
            topo["primary_proc"].wait(5)
            t_kill = time.monotonic()
            rec["held_at_kill"] = held_now(servers)
            # 3. The replica's count (its link down since the cut: nothing wrote to it).
            r_count, r_keys = window_count(replica)
            r_offset = int(info_field(replica, "replication", "slave_repl_offset") or 0)
            rec.update({"primary_count_at_kill": p_kill, "primary_count_after_pause": p_kill_again,
                        "replica_count_at_promotion": r_count, "units_lost": p_kill - r_count,
                        "primary_repl_offset": p_offset, "replica_repl_offset": r_offset,
                        "bytes_not_replicated": p_offset - r_offset,
                        "window_starts": {"primary": window_starts(p_keys), "replica": window_starts(r_keys)}})
            # 4. Promotion.
            redis_do(topo["sentinels"][0], "SENTINEL", "FAILOVER", MASTER)
            wait_until("the replica to be promoted", 20,
                       lambda: redis_do(replica, "ROLE")[0] == "master", every=0.005)
            t_promoted = time.monotonic()
            rec["replica_count_just_promoted"], _ = window_count(replica)
            wait_until("the Sentinels to name the new primary", 20,
                       lambda: int(redis_do(topo["sentinels"][0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                            MASTER)[1]) == replica, every=0.01)
            t_named = time.monotonic()
        finally:
            load.join()
            preader.close()
        if load.error:
            raise SystemExit(f"round {n}: the client failed: {load.error}")
        t_end = time.monotonic()
        # 5. Leases end and go back; then more until every sidecar refuses.
        time.sleep(0.6)
        rec["held_after_load"] = held_now(servers)
        later = leases.until_refused(servers, PATH)
        time.sleep(0.6)
        later2 = leases.until_refused(servers, PATH)
        after = sidecar_metrics(servers)
        up = upstream_count(upstream_port) - up0
        final_count, final_keys = window_count(replica)
        statuses = load.statuses()
        ok_client = statuses.get("200", 0) + later.get("200", 0) + later2.get("200", 0)
        t0 = load.t0
        rec.update({
            "offered": len(load.answers), "late": load.late,
            "statuses": statuses,
            "phases": {
                "before_cut": load.statuses(None, t_cut),
                "cut_to_kill": load.statuses(t_cut, t_kill),
                "kill_to_promotion": load.statuses(t_kill, t_promoted),
                "after_promotion": load.statuses(t_promoted, None),
            },
            "times_s": {"cut": t_cut - t0, "pause": t_pause - t0, "kill": t_kill - t0,
                        "promoted": t_promoted - t0, "sentinels_name_it": t_named - t0, "load_end": t_end - t0},
            "later_passes": [later, later2],
            "admitted_upstream": up, "admitted_client": ok_client,
            "over_admission": up - LIMIT,
            "final_count_new_primary": final_count,
            "final_window_starts": window_starts(final_keys),
            "metrics": leases.lease_figures(before, after, "fw"),
        })
        # When the failover's 503s ended, after the kill (sent time of the last one).
        t503 = [t for _, t, st in load.answers if st == "503" and t >= t_kill]
        rec["last_503_after_kill_ms"] = (max(t503) - t_kill) * 1000 if t503 else None
        rec["bounded"] = rec["over_admission"] <= rec["units_lost"]
        rec["sidecars_alive"] = all(s.alive() for s in servers)
        rec["sidecar_log_warnings"] = log_warnings(rdir, servers)
        return rec
    finally:
        leases.stop_sidecars(procs)
        procs.stop_all()


def log_warnings(rdir, servers):
    out = {}
    for s in servers:
        counts = {}
        try:
            with open(os.path.join(rdir, s.name + ".log"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    level = str(r.get("level", "")).upper()
                    if level in ("WARN", "ERROR"):
                        msg = r.get("message") or (r.get("fields") or {}).get("message")
                        key = f"{level} {msg}"
                        counts[key] = counts.get(key, 0) + 1
        except OSError:
            pass
        if counts:
            out[s.name] = counts
    return out


# --- the report ----------------------------------------------------------------------


def med(values):
    return leases.med(values)


def rng(m, fmt="{:.0f}"):
    if not m:
        return "—"
    if m["min"] == m["max"]:
        return fmt.format(m["median"])
    return f"{fmt.format(m['median'])} ({fmt.format(m['min'])}–{fmt.format(m['max'])})"


def summarize(rounds):
    out = {}
    for lease in ("on", "off"):
        rs = [r for r in rounds if r["lease"] == lease]
        out[lease] = {
            "rounds": len(rs),
            "units_lost": med([r["units_lost"] for r in rs]),
            "admitted": med([r["admitted_upstream"] for r in rs]),
            "over_admission": med([r["over_admission"] for r in rs]),
            "over_minus_lost": med([r["over_admission"] - r["units_lost"] for r in rs]),
            "share_of_lost": med([r["over_admission"] / r["units_lost"] for r in rs if r["units_lost"] > 0]),
            "held_at_kill": med([r["held_at_kill"] for r in rs]),
            "failover_503": med([r["statuses"].get("503", 0) for r in rs]),
            "promotion_after_kill_ms": med([(r["times_s"]["promoted"] - r["times_s"]["kill"]) * 1000 for r in rs]),
            "last_503_after_kill_ms": med([r["last_503_after_kill_ms"] for r in rs]),
            "sentinels_after_promotion_ms": med([(r["times_s"]["sentinels_name_it"] - r["times_s"]["promoted"]) * 1000
                                                 for r in rs]),
            "bounded_rounds": sum(1 for r in rs if r["bounded"]),
        }
    return out


def markdown(result):
    s = result["summary"]
    st = result["settings"]
    lines = [
        "# Lease failover: writes lost in a Redis failover",
        "",
        f"Generated {result['generated_at']} by `bench/lease_failover.py` "
        f"(sluice `{result['sluice']}`, commit {result['machine']['commit']}, "
        f"{result['machine']['nproc']} CPUs, load average {result['machine']['loadavg_at_start'][0]:.2f} "
        "at the start).",
        "",
        f"Per round: a fresh Redis primary, one replica and three Sentinels, {SIDECARS} sidecars "
        f"(`topology: sentinel`, `on_failure: deny`, `budget: {BUDGET_MS}ms`), one global fixed window "
        f"of L = {st['limit']} per hour with `lease: on` (ttl 250 ms, max_share 10%) or `lease: off`, "
        f"{st['rate']} req/s offered for {st['load_s']:.0f} s ({int(st['rate'] * st['load_s'])} in all). "
        f"Once the primary counted {int(CUT_SHARE * st['limit'])}, the replica's link is cut; the primary "
        f"decides alone for {st['loss_s'] * 1000:.0f} ms, its writes are paused, its count read, and it is "
        "killed; the replica's count is read and `SENTINEL FAILOVER` promotes it. Units lost = primary's "
        "count at the kill − promoted replica's count. After the load, more is offered until every sidecar "
        "refuses. Admitted = what the upstream saw.",
        "",
        "| | lease on | lease off |",
        "|---|---:|---:|",
    ]

    def row(label, key, fmt="{:.0f}"):
        lines.append(f"| {label} | {rng(s['on'][key], fmt)} | {rng(s['off'][key], fmt)} |")

    row("units lost in the failover", "units_lost")
    row(f"admitted (upstream), L = {st['limit']}", "admitted")
    row("over-admission (admitted − L)", "over_admission")
    row("over-admission − units lost (≤ 0: bounded)", "over_minus_lost")
    row("over-admission ÷ units lost", "share_of_lost", "{:.2f}")
    row("units held in leases at the kill (all sidecars)", "held_at_kill")
    row("503s during the run", "failover_503")
    row("kill to promotion (ms)", "promotion_after_kill_ms")
    row("promotion to the Sentinels naming it (ms)", "sentinels_after_promotion_ms")
    row("kill to the last 503 (ms)", "last_503_after_kill_ms")
    lines.append(f"| rounds with over-admission ≤ units lost | {s['on']['bounded_rounds']} of {s['on']['rounds']} "
                 f"| {s['off']['bounded_rounds']} of {s['off']['rounds']} |")
    lines += ["", "Median (min–max) over the rounds. Every round:", "",
              "| round | lease | primary at cut / at kill | replica at promotion | lost | held at kill "
              "| admitted (upstream / client) | over-admission | ≤ lost | 503 | new primary's count at the end |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in result["rounds"]:
        lines.append(
            f"| {r['round']} | {r['lease']} | {r['primary_count_at_cut']} / {r['primary_count_at_kill']} "
            f"| {r['replica_count_at_promotion']} | {r['units_lost']} | {r['held_at_kill']} "
            f"| {r['admitted_upstream']} / {r['admitted_client']} | {r['over_admission']} "
            f"| {'yes' if r['bounded'] else '**no**'} | {r['statuses'].get('503', 0)} "
            f"| {r['final_count_new_primary']} |")
    lines += ["", "Notes:", ""]
    for note in result["notes"]:
        lines.append(f"- {note}")
    lines.append("")
    return "\n".join(lines)


def notes_for(rounds):
    notes = []
    for lease in ("on", "off"):
        rs = [r for r in rounds if r["lease"] == lease]
        if not rs:
            continue
        gap = med([r["phases"]["kill_to_promotion"].get("200", 0) for r in rs])
        unspent = med([r["units_lost"] - r["over_admission"] for r in rs])
        notes.append(f"lease {lease}: admitted between the kill and the promotion (no primary at all): "
                     f"{rng(gap)}; units lost but never admitted (lost − over-admission): {rng(unspent)}")
    for r in rounds:
        if r["primary_count_after_pause"] != r["primary_count_at_kill"]:
            notes.append(f"round {r['round']} lease {r['lease']}: the primary's count moved during the "
                         f"write pause ({r['primary_count_at_kill']} → {r['primary_count_after_pause']}): "
                         "units lost may be off by that much")
        if r["replica_count_just_promoted"] != r["replica_count_at_promotion"]:
            notes.append(f"round {r['round']} lease {r['lease']}: the replica's count moved between the kill "
                         f"and its promotion ({r['replica_count_at_promotion']} → "
                         f"{r['replica_count_just_promoted']})")
        if r["replica_count_at_cut"] != r["replica_count_at_promotion"]:
            notes.append(f"round {r['round']} lease {r['lease']}: the replica applied writes after the cut "
                         f"(its count {r['replica_count_at_cut']} at the cut, {r['replica_count_at_promotion']} "
                         "at the promotion): in flight when the link was closed; they are not lost")
        starts = set(r["window_starts"]["primary"]) | set(r["window_starts"]["replica"]) | \
            set(r["final_window_starts"])
        if len(starts) > 1:
            notes.append(f"round {r['round']} lease {r['lease']}: the window rolled during the round "
                         f"({sorted(starts)}): its figures do not compare")
        if not r["bounded"]:
            notes.append(f"round {r['round']} lease {r['lease']}: over-admission {r['over_admission']} exceeds "
                         f"the {r['units_lost']} units lost")
        other = {k: v for k, v in r["statuses"].items() if k not in ("200", "429", "503")}
        if other:
            notes.append(f"round {r['round']} lease {r['lease']}: other answers {other}")
        if r["admitted_client"] != r["admitted_upstream"]:
            notes.append(f"round {r['round']} lease {r['lease']}: the client counted {r['admitted_client']} "
                         f"200s, the upstream {r['admitted_upstream']}")
        if r["late"]:
            notes.append(f"round {r['round']} lease {r['lease']}: {r['late']} requests went more than 5 ms "
                         "after their time (every connection busy)")
    # What the sidecars logged at WARN or above, in how many rounds.
    logged = {}
    for r in rounds:
        flat = {}
        for per in r["sidecar_log_warnings"].values():
            for k, v in per.items():
                flat[k] = flat.get(k, 0) + v
        for k, v in flat.items():
            seen = logged.setdefault(k, {"rounds": 0, "times": 0})
            seen["rounds"] += 1
            seen["times"] += v
    for k, seen in logged.items():
        notes.append(f"in {seen['rounds']} of {len(rounds)} rounds the sidecars logged: {k} "
                     f"({seen['times']} times in all)")
    notes.append("the 503s are the failover itself, alike with and without the lease: no primary from "
                 "the kill to the promotion, then until the Sentinels name the promoted replica; the "
                 "sidecars' breaker, open since soon after the kill, probes once per `breaker_cooldown` "
                 "(1 s), and the first probe after the Sentinels name the new primary closes it. The "
                 "times are in the table above, every round's in lease_failover.json (`times_s`).")
    return notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--rounds", type=int, default=3, help="rounds per setting (lease on, off)")
    ap.add_argument("--rate", type=int, default=RATE)
    ap.add_argument("--load-s", type=float, default=LOAD_S)
    ap.add_argument("--loss-s", type=float, default=LOSS_S)
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs)")
    ap.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    if not os.access(args.sluice, os.X_OK):
        raise SystemExit(f"no sluice binary at {args.sluice}")
    if args.rate * args.load_s < 2 * LIMIT:
        raise SystemExit("offer well over L: rate × load-s must be at least 2 L")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    harness.raise_fd_limit()
    started = time.monotonic()
    info = harness.machine_info(args.sluice, "oha")
    workdir = tempfile.mkdtemp(prefix="sluice-lease-failover-")
    procs = Processes()
    rounds = []
    try:
        up_port = low_port()
        up = procs.start("upstream", [sys.executable, os.path.abspath(__file__), "--serve-upstream", str(up_port)],
                         CPU_REST, os.path.join(workdir, "upstream.log"))
        if not tools.wait_tcp(up_port, up):
            raise SystemExit(f"the upstream did not start: {tools.tail(os.path.join(workdir, 'upstream.log'))}")
        for n in range(1, args.rounds + 1):
            order = ("on", "off") if n % 2 else ("off", "on")
            for lease in order:
                if time.monotonic() - started > 480:
                    log("stopping early: the run has taken 8 minutes")
                    break
                log(f"round {n}, lease {lease}")
                rec = one_round(args, workdir, up_port, lease, n)
                rounds.append(rec)
                log(f"  lost {rec['units_lost']} (primary {rec['primary_count_at_kill']}, replica "
                    f"{rec['replica_count_at_promotion']}), held at kill {rec['held_at_kill']}, admitted "
                    f"{rec['admitted_upstream']}, over-admission {rec['over_admission']}, "
                    f"bounded {rec['bounded']}, statuses {rec['statuses']}, "
                    f"promoted {1000 * (rec['times_s']['promoted'] - rec['times_s']['kill']):.0f} ms after the kill")
    finally:
        procs.stop_all()
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "sluice": args.sluice,
        "machine": {"nproc": info["nproc"], "cpu_model": info["cpu_model"], "kernel": info["kernel"],
                    "loadavg_at_start": info["loadavg_at_start"], "loadavg_at_end": os.getloadavg(),
                    "commit": info["tools"]["sluice_commit"],
                    "redis": subprocess.run(["redis-server", "--version"], capture_output=True,
                                            text=True).stdout.strip()},
        "settings": {"limit": LIMIT, "window": "1h", "sidecars": SIDECARS, "rate": args.rate,
                     "load_s": args.load_s, "cut_share": CUT_SHARE, "loss_s": args.loss_s,
                     "budget_ms": BUDGET_MS, "workers_per_sidecar": WORKERS, "rounds": args.rounds,
                     "lease_on": "on (ttl 250ms, max_share 10%)",
                     "sentinel": "quorum 2, down-after 1000 ms, promotion by SENTINEL FAILOVER"},
        "summary": summarize(rounds),
        "notes": notes_for(rounds),
        "rounds": rounds,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    md = markdown(result)
    with open(os.path.join(args.out, "lease_failover.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "lease_failover.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"written: {os.path.join(args.out, 'lease_failover.md')} and lease_failover.json "
        f"({result['elapsed_s']} s)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); every started process was stopped")
        sys.exit(130)
