#!/usr/bin/env python3
"""The soak: sluice on Redis under mixed traffic for ten minutes, with a
FUNCTION FLUSH and a Redis kill halfway, then back to its baseline.

    python3 bench/soak.py [--sluice target/release/sluice] [--seconds N] [--keep]

SOAK_SECONDS (default 600) and SOAK_WARMUP (default 30) set the lengths.
One sluice (release build, `server.workers: 1`, fail closed) in front of
nginx `return 200`, on a redis-server this script starts. All at once, for
the whole run:

- allowed traffic: wrk on /allowed, a limit never reached;
- denied traffic: wrk on /blocked, one subject long past its limit;
- many subjects: wrk on /subjects, a new X-Subject value per request;
- malformed traffic: raw sockets, each on its own connection: a bad Host,
  a bare-LF header line, Content-Length with Transfer-Encoding, a broken
  chunk size, a connection cut mid-head.

Halfway, FUNCTION FLUSH on Redis; ten seconds later Redis is killed
(SIGKILL) and restarted on the same port five seconds after that.

Every second: sluice's VmRSS, open FDs, threads (/proc) and live runtime
tasks (`sluice_runtime_alive_tasks` from /metrics). The baseline is the
same figures after a warm-up with the same traffic; after the soak the
figures are polled until each is back within ±5% of it (FDs, threads and
tasks: ±5% or ±2, the larger). The report goes to results/soak.md and
results/soak.json.

Load only ever targets 127.0.0.1. Every process is started here, pinned
with taskset (sluice alone on CPU 1; wrk, nginx and Redis on CPU 0) and
stopped by its PID when the script ends, however it ends.
"""

import argparse
import datetime
import json
import os
import random
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

BENCH = harness.BENCH
ROOT = harness.ROOT
CPU_PROXY = harness.CPU_PROXY
CPU_REST = harness.CPU_REST
BUDGET_MS = harness.BUDGET_MS
WRK_DIR = os.path.join(BENCH, "wrk")

# Connections per load generator: 32 in all, as in the benchmark.
LOADS = {
    "allowed": {"path": "/allowed", "conns": 16},
    "blocked": {"path": "/blocked", "conns": 8},
    "subjects": {"path": "/subjects", "conns": 8, "subjects": True},
}
MALFORMED_PER_S = 100
FLUSH_TO_KILL_S = 10
KILL_TO_RESTART_S = 5
TOLERANCE = 0.05
TOLERANCE_ABS = 2  # FDs, threads, tasks: small counts cannot move by 5%
SETTLE_TARGET_S = 10
SETTLE_POLL_S = 60

log = harness.log


# --- malformed traffic -------------------------------------------------------

MALFORMED = {
    "bad_host": b"GET /allowed HTTP/1.1\r\nHost: a b\r\n\r\n",
    "bare_lf": b"GET /allowed HTTP/1.1\r\nHost: app\n\r\n",
    "cl_and_te": (b"POST /allowed HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    "bad_chunk": (b"POST /chunk HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"zz\r\nhello\r\n0\r\n\r\n"),
    "cut_mid_head": b"GET /allowed HTTP/1.1\r\nHost: app\r\nX-Cut: ",
}


def malformed_once(port, name):
    """One malformed request on its own connection: the status sluice
    answered and whether it closed, as 'STATUS closed|open', or 'cut' for
    the connection this side cuts, 'no answer' / 'error: …' otherwise."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(MALFORMED[name])
            if name == "cut_mid_head":
                return "cut"
            data = b""
            closed = False
            while True:
                try:
                    chunk = s.recv(4096)
                except socket.timeout:
                    break
                if not chunk:
                    closed = True
                    break
                data += chunk
                if closed or (b"\r\n\r\n" in data and len(data) > 4096):
                    break
            if not data.startswith(b"HTTP/1.1 "):
                return "closed, no answer" if closed else "no answer"
            status = data[9:12].decode("ascii", "replace")
            return f"{status} {'closed' if closed else 'open'}"
    except OSError as e:
        return f"error: {type(e).__name__}"


class Malformed:
    """MALFORMED_PER_S malformed requests a second, the cases in turn."""

    def __init__(self, port):
        self.port = port
        self.counts = {name: {} for name in MALFORMED}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()

    def _run(self):
        names = list(MALFORMED)
        i = 0
        period = 1.0 / MALFORMED_PER_S
        next_at = time.monotonic()
        while not self._stop.is_set():
            name = names[i % len(names)]
            i += 1
            got = malformed_once(self.port, name)
            self.counts[name][got] = self.counts[name].get(got, 0) + 1
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_at = time.monotonic()


# --- load --------------------------------------------------------------------


def start_wrk(procs, workdir, tag, key, url, conns, seconds, subjects):
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{int(seconds)}s", "--timeout=5s"]
    if subjects:
        prefix = "%08x" % random.getrandbits(32)
        argv += ["-s", os.path.join(WRK_DIR, "subjects.lua"), url, "--", "X-Subject", prefix, "0",
                 str(random.getrandbits(24))]
    else:
        argv += ["-s", os.path.join(WRK_DIR, "statuses.lua"), url]
    logf = os.path.join(workdir, f"wrk-{tag}-{key}.log")
    return procs.start(f"wrk-{key}", argv, CPU_REST, logf), logf


def parse_wrk(logf):
    """{'per_second': {second: {status: n}}, 'statuses': {status: n},
    'errors': {...}, 'requests': n}"""
    per_second, statuses, errors, requests = {}, {}, None, None
    with open(logf, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split()
            if line.startswith("STATUS ") and len(parts) == 4:
                sec, status, n = int(parts[1]), parts[2], int(parts[3])
                per_second.setdefault(sec, {})
                per_second[sec][status] = per_second[sec].get(status, 0) + n
                statuses[status] = statuses.get(status, 0) + n
            elif line.startswith("ERRORS ") and len(parts) == 6:
                errors = dict(zip(("connect", "read", "write", "status", "timeout"), map(int, parts[1:])))
            elif "requests in" in line and parts and parts[0].isdigit():
                requests = int(parts[0])
    if errors is None:
        raise RuntimeError(f"wrk did not finish: {tools.tail(logf)}")
    return {"per_second": per_second, "statuses": statuses, "errors": errors, "requests": requests}


def run_mix(procs, workdir, port, seconds, tag, during=None):
    """Every kind of traffic at once for `seconds`; `during(t0)` runs on
    this thread meanwhile. Returns the parsed wrk results and the
    malformed counts."""
    wrks = {}
    for key, spec in LOADS.items():
        wrks[key] = start_wrk(procs, workdir, tag, key, f"http://127.0.0.1:{port}{spec['path']}",
                              spec["conns"], seconds, spec.get("subjects", False))
    mal = Malformed(port)
    mal.start()
    t0 = time.monotonic()
    try:
        if during:
            during(t0)
        for key, (proc, _) in wrks.items():
            remaining = seconds + 30 - (time.monotonic() - t0)
            try:
                proc.wait(timeout=max(1, remaining))
            except Exception:  # noqa: BLE001 - a stuck wrk is stopped, and reported
                procs.stop(proc, sig=signal.SIGINT)
    finally:
        mal.stop()
        for proc, _ in wrks.values():
            procs.stop(proc, sig=signal.SIGINT)
    return {key: parse_wrk(logf) for key, (_, logf) in wrks.items()}, mal.counts


# --- readings ----------------------------------------------------------------


def parse_metrics(text):
    """[(name, {label: value}, value)] from the Prometheus text format."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            head, value = line.rsplit(" ", 1)
            value = float(value)
        except ValueError:
            continue
        labels = {}
        if "{" in head:
            name, rest = head.split("{", 1)
            for part in rest.rstrip("}").split(","):
                if "=" in part:
                    k, v = part.split("=", 1)
                    labels[k.strip()] = v.strip().strip('"')
        else:
            name = head
        out.append((name, labels, value))
    return out


def scrape(admin_port):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=2)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        return parse_metrics(resp.read().decode("utf-8", "replace"))
    finally:
        conn.close()


def metric_sum(metrics, name, **match):
    return sum(v for (n, labels, v) in metrics if n == name and all(labels.get(k) == w for k, w in match.items()))


def by_label(metrics, name, *keys):
    out = {}
    for n, labels, v in metrics:
        if n == name:
            k = "/".join(labels.get(x, "") for x in keys)
            out[k] = out.get(k, 0) + v
    return out


def reading(pid, admin_port):
    """VmRSS (kB), open FDs, threads, live runtime tasks, and the metrics."""
    r = {"rss_kb": tools.rss_kb(pid), "fds": len(os.listdir(f"/proc/{pid}/fd")),
         "threads": len(os.listdir(f"/proc/{pid}/task")), "tasks": None, "metrics": None}
    try:
        m = scrape(admin_port)
        r["metrics"] = m
        if any(n == "sluice_runtime_alive_tasks" for n, _, _ in m):
            r["tasks"] = int(metric_sum(m, "sluice_runtime_alive_tasks"))
    except OSError:
        pass
    return r


class Sampler:
    """One reading a second on a thread, with the per-second outcome counts."""

    def __init__(self, pid, admin_port, t0):
        self.pid, self.admin_port, self.t0 = pid, admin_port, t0
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while True:
            try:
                r = reading(self.pid, self.admin_port)
            except OSError:
                r = None
            if r:
                m = r.pop("metrics") or []
                r["t"] = round(time.monotonic() - self.t0, 2)
                r["unix"] = time.time()
                r["outcomes"] = by_label(m, "sluice_requests_total", "route", "outcome")
                r["refused"] = metric_sum(m, "sluice_requests_refused_total")
                r["store_errors"] = metric_sum(m, "sluice_store_errors_total")
                r["breaker_open"] = metric_sum(m, "sluice_store_breaker_open")
                self.samples.append(r)
            if self._stop.wait(1.0):
                return


def baseline_of(pid, admin_port, n=5):
    rs = []
    for _ in range(n):
        rs.append(reading(pid, admin_port))
        time.sleep(1)
    out = {}
    for k in ("rss_kb", "fds", "threads", "tasks"):
        vals = [r[k] for r in rs if r[k] is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def within(value, base, key):
    if value is None or base is None:
        return True
    slack = base * TOLERANCE
    if key != "rss_kb":
        slack = max(slack, TOLERANCE_ABS)
    return abs(value - base) <= slack


def settle(pid, admin_port, base, load_end):
    """Polls every 0.5 s from the end of the load until every figure is
    within tolerance of the baseline (and stays so for three readings)."""
    polls = []
    first_ok = None
    streak = 0
    while time.monotonic() - load_end < SETTLE_POLL_S:
        r = reading(pid, admin_port)
        r.pop("metrics", None)
        r["t"] = round(time.monotonic() - load_end, 2)
        r["ok"] = {k: within(r[k], base[k], k) for k in ("rss_kb", "fds", "threads", "tasks")}
        polls.append(r)
        if all(r["ok"].values()):
            streak += 1
            if first_ok is None:
                first_ok = r["t"]
            if streak >= 3:
                break
        else:
            streak = 0
            first_ok = None
        time.sleep(0.5)
    return {"settled_after_s": first_ok, "polls": polls, "final": polls[-1] if polls else None}


# --- Redis -------------------------------------------------------------------


def start_redis_on(procs, workdir, port, n):
    logf = os.path.join(workdir, f"redis-{n}.log")
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--dir", workdir]
    proc = procs.start(f"redis-{n}", argv, CPU_REST, logf)
    if not tools.wait_tcp(port, proc):
        raise SystemExit(f"soak: redis-server did not start: {tools.tail(logf)}")
    return proc


def redis_cmd(port, *args):
    r = Redis(port)
    try:
        return r.cmd(*args)
    finally:
        r.close()


# --- the run -----------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--seconds", type=int, default=int(os.environ.get("SOAK_SECONDS", "600")))
    ap.add_argument("--warmup", type=int, default=int(os.environ.get("SOAK_WARMUP", "30")))
    ap.add_argument("--out", default=os.path.join(BENCH, "results"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs)")
    args = ap.parse_args()
    if not os.access(args.sluice, os.X_OK):
        raise SystemExit(f"soak: no sluice binary at {args.sluice} (cargo build --release)")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    harness.raise_fd_limit()
    # This script (the malformed client, the sampler) stays off sluice's CPU.
    try:
        os.sched_setaffinity(0, {CPU_REST})
    except OSError:
        pass
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-soak-")
    started = time.monotonic()
    try:
        result = session(procs, workdir, args)
    finally:
        procs.stop_all()
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    os.makedirs(args.out, exist_ok=True)
    md = markdown(result)
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "soak.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"written: results/soak.md and soak.json ({result['elapsed_s']} s)")


def session(procs, workdir, args):
    info = harness.machine_info(args.sluice, os.path.expanduser("~/.cache/sluice-bench/bin/oha"))
    seconds, warmup = args.seconds, args.warmup
    upstream = harness.start_nginx(procs, workdir, "upstream", "soak-upstream.nginx.conf", CPU_REST)
    if upstream.reason:
        raise SystemExit(f"soak: {upstream.reason}")
    access_log = os.path.join(workdir, "upstream.access.log")
    redis_port = tools.free_port()
    redis_procs = [start_redis_on(procs, workdir, redis_port, 1)]
    sl = harness.start_sluice(procs, workdir, args.sluice, "sluice-soak", "sluice-soak.yaml",
                              UPSTREAM_PORT=upstream.port, REDIS_PORT=redis_port)
    if sl.reason:
        raise SystemExit(f"soak: {sl.reason}")
    pid, port, admin = sl.pid, sl.port, sl.admin_port
    log(f"sluice pid {pid} on :{port} (admin :{admin}), redis :{redis_port}, upstream :{upstream.port}")

    idle = reading(pid, admin)
    idle.pop("metrics", None)

    log(f"warm-up: {warmup} s of the same mix")
    warm, warm_mal = run_mix(procs, workdir, port, warmup, "warmup")
    time.sleep(5)
    base = baseline_of(pid, admin)
    log(f"baseline: {base}")
    time.sleep(2)  # nginx flushes its access log every second
    log_offset = os.path.getsize(access_log) if os.path.exists(access_log) else 0
    before = scrape(admin)

    events = {}
    probes = {}

    def disturb(t0):
        """FUNCTION FLUSH halfway, then the kill and the restart."""
        half = t0 + seconds / 2
        time.sleep(max(0, half - time.monotonic()))
        events["script_flush"] = {"t": round(time.monotonic() - t0, 2), "unix": time.time(),
                                  "reply": redis_cmd(redis_port, "FUNCTION", "FLUSH")}
        log("FUNCTION FLUSH")
        time.sleep(FLUSH_TO_KILL_S)
        os.kill(redis_procs[-1].pid, signal.SIGKILL)
        redis_procs[-1].wait(timeout=5)
        events["redis_killed"] = {"t": round(time.monotonic() - t0, 2), "unix": time.time()}
        log("redis killed (SIGKILL)")
        restart_at = time.monotonic() + KILL_TO_RESTART_S
        # Probe the allowed path through the outage, every 100 ms.
        restarted = False
        while True:
            if not restarted and time.monotonic() >= restart_at:
                redis_procs.append(start_redis_on(procs, workdir, redis_port, 2))
                events["redis_restarted"] = {"t": round(time.monotonic() - t0, 2), "unix": time.time()}
                log("redis restarted on the same port")
                restarted = True
            try:
                status = str(tools.http_status(port, "/allowed", timeout=2))
            except OSError as e:
                status = f"error: {type(e).__name__}"
            probes[status] = probes.get(status, 0) + 1
            if restarted and status == "200":
                events["allowed_again"] = {"t": round(time.monotonic() - t0, 2), "unix": time.time()}
                log("allowed path answers 200 again")
                break
            if time.monotonic() - restart_at > 60:
                break
            time.sleep(0.1)

    log(f"soak: {seconds} s of allowed, denied, malformed and many-subject traffic")
    t0 = time.monotonic()
    with Sampler(pid, admin, t0) as sampler:
        soak, soak_mal = run_mix(procs, workdir, port, seconds, "soak", during=disturb)
        load_end = time.monotonic()
        log("load stopped; polling until back to the baseline")
        settled = settle(pid, admin, base, load_end)
    log(f"settled after {settled['settled_after_s']} s")
    after = scrape(admin)
    time.sleep(max(0, 3 - (time.monotonic() - load_end)))

    # What reached nginx during the soak, from its access log.
    upstream_counts = {}
    with open(access_log, "rb") as f:
        f.seek(log_offset)
        for line in f:
            k = line.decode("ascii", "replace").strip()
            upstream_counts[k] = upstream_counts.get(k, 0) + 1
    try:
        dbsize = redis_cmd(redis_port, "DBSIZE")
        used_memory = int(Redis(redis_port).info("memory")["used_memory"])
    except OSError:
        dbsize = used_memory = None

    def delta(name, *keys):
        a, b = by_label(before, name, *keys), by_label(after, name, *keys)
        return {k: int(b.get(k, 0) - a.get(k, 0)) for k in sorted(set(a) | set(b)) if b.get(k, 0) - a.get(k, 0)}

    sluice_counts = {
        "requests": delta("sluice_requests_total", "route", "outcome"),
        "refused": delta("sluice_requests_refused_total", "reason"),
        "upstream_responses": delta("sluice_upstream_responses_total", "route", "status_class"),
        "store_errors": delta("sluice_store_errors_total", "kind"),
        "store_events": delta("sluice_store_events_total", "kind"),
        "script_loads": delta("sluice_store_script_loads_total"),
        "breaker_opened": delta("sluice_store_breaker_opened_total"),
        "forwarded_without_decision": int(metric_sum(after, "sluice_forwarded_without_decision_total")),
    }
    return {
        "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": info,
        "settings": {"seconds": seconds, "warmup_s": warmup, "loads": LOADS, "malformed_per_s": MALFORMED_PER_S,
                     "flush_to_kill_s": FLUSH_TO_KILL_S, "kill_to_restart_s": KILL_TO_RESTART_S,
                     "budget_ms": BUDGET_MS, "tolerance": TOLERANCE, "tolerance_abs": TOLERANCE_ABS,
                     "settle_target_s": SETTLE_TARGET_S,
                     "pinning": {"sluice_cpu": CPU_PROXY, "load_upstream_redis_cpu": CPU_REST}},
        "idle": idle,
        "baseline": base,
        "settle": settled,
        "events": events,
        "outage_probes": probes,
        "warmup": {"wrk": {k: {x: v[x] for x in ("statuses", "errors", "requests")} for k, v in warm.items()},
                   "malformed": warm_mal},
        "soak": {"wrk": soak, "malformed": soak_mal},
        "sluice_counts": sluice_counts,
        "upstream_counts": upstream_counts,
        "redis_after": {"dbsize": dbsize, "used_memory": used_memory},
        "samples": sampler.samples,
        "summary": summarize(soak, soak_mal, probes, events, sluice_counts, upstream_counts, base, settled,
                             sampler.samples, seconds),
    }


# --- summary and report ------------------------------------------------------


def window_statuses(wrk, lo, hi):
    """Statuses of whole seconds lo..hi (unix) of one wrk run."""
    out = {}
    for sec, st in wrk["per_second"].items():
        if lo <= sec <= hi:
            for k, v in st.items():
                out[k] = out.get(k, 0) + v
    return out


def share(st, status):
    total = sum(st.values())
    return None if not total else st.get(status, 0) / total


def summarize(soak, mal, probes, events, counts, upstream_counts, base, settled, samples, seconds):
    s = {}
    s["statuses"] = {k: v["statuses"] for k, v in soak.items()}
    s["errors"] = {k: v["errors"] for k, v in soak.items()}
    s["rps"] = {k: round(sum(v["statuses"].values()) / seconds) for k, v in soak.items()}
    s["malformed"] = mal
    if "redis_killed" in events and "allowed_again" in events:
        lo, hi = int(events["redis_killed"]["unix"]), int(events["allowed_again"]["unix"])
        s["outage"] = {
            "seconds": round(events["allowed_again"]["unix"] - events["redis_killed"]["unix"], 2),
            "window_unix": [lo, hi],
            "statuses": {k: window_statuses(v, lo, hi) for k, v in soak.items()},
        }
        s["outage"]["share_503"] = {k: share(st, "503") for k, st in s["outage"]["statuses"].items()}
        # The seconds fully inside the outage (the kill's and recovery's own
        # seconds carry answers from before and after).
        inner = {k: window_statuses(v, lo + 1, hi - 1) for k, v in soak.items()}
        s["outage"]["inner_statuses"] = inner
        s["outage"]["inner_share_503"] = {k: share(st, "503") for k, st in inner.items()}
    if "outage" in s:
        lo, hi = s["outage"]["window_unix"]
        s["outside_outage_503"] = {k: v["statuses"].get("503", 0) - s["outage"]["statuses"][k].get("503", 0)
                                   for k, v in soak.items()}
        s["outside_outage_503_seconds"] = sorted(
            {int(sec) for v in soak.values() for sec, st in v["per_second"].items()
             if st.get("503") and not lo <= int(sec) <= hi})
    if "script_flush" in events:
        f = int(events["script_flush"]["unix"])
        s["script_flush"] = {"statuses": {k: window_statuses(v, f - 1, f + 2) for k, v in soak.items()}}
    # What nginx answered 200, path by path, against what sluice forwarded
    # and got back (exact, both server side) and what the clients counted
    # (short by the requests in flight when each wrk stopped, at most its
    # connections).
    client_200 = {k: v["statuses"].get("200", 0) for k, v in soak.items()}
    client_200["allowed"] += probes.get("200", 0)
    up_200 = {k: upstream_counts.get(f"200 {LOADS[k]['path']}", 0) for k in LOADS}
    sluice_2xx = {k: counts["upstream_responses"].get(f"{k}/2xx", 0) for k in LOADS}
    other = {k: v for k, v in upstream_counts.items()
             if k not in {f"200 {spec['path']}" for spec in LOADS.values()}}
    s["upstream_vs_clients"] = {
        "client_200": client_200, "upstream_200": up_200, "sluice_forwarded_2xx": sluice_2xx,
        "upstream_other": other,
        "upstream_equals_sluice": up_200 == sluice_2xx,
        "clients_within_in_flight": all(0 <= up_200[k] - client_200[k] <= LOADS[k]["conns"] + 1 for k in LOADS),
    }
    s["forwarded_without_decision"] = counts["forwarded_without_decision"]
    peaks = {k: max((x[k] for x in samples if x.get(k) is not None), default=None)
             for k in ("rss_kb", "fds", "threads", "tasks")}
    s["peak_during_soak"] = peaks
    s["baseline"] = base
    s["settled_after_s"] = settled["settled_after_s"]
    at10 = None
    for p in settled["polls"]:
        if p["t"] <= SETTLE_TARGET_S:
            at10 = p
    s["after"] = settled["final"]
    s["at_target"] = at10
    return s


def _n(v):
    return "—" if v is None else f"{v:,}"


def _mb(kb):
    return "—" if kb is None else f"{kb / 1024:.1f} MB"


def _pct(v):
    return "—" if v is None else f"{100 * v:.1f}%"


def _st(st):
    total = sum(st.values())
    if not total:
        return "—"
    return ", ".join(f"{k}×{v:,}" for k, v in sorted(st.items()))


def markdown(r):
    s = r["summary"]
    m = r["machine"]
    st = r["settings"]
    tools_ = m["tools"]
    lines = [
        f"# sluice soak — {r['generated_at']}",
        "",
        f"**Machine:** {m['cpu_model']}, nproc {m['nproc']}, {m['memory_gib']} GiB, Linux {m['kernel']}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}.  ",
        f"**Software:** {tools_['sluice']} (commit {tools_['sluice_commit']}), {tools_['nginx']}, "
        f"{(tools_['redis'] or '').split(' sha=')[0]}, {tools_['wrk'].split(' Copyright')[0] if tools_['wrk'] else 'wrk'}.  ",
        f"**Method:** one sluice on Redis (`server.workers: 1`, fail closed, budget {st['budget_ms']} ms) in front of "
        f"nginx `return 200`; sluice alone on CPU {st['pinning']['sluice_cpu']}, wrk, nginx, Redis and the malformed "
        f"client on CPU {st['pinning']['load_upstream_redis_cpu']}. {st['warmup_s']} s warm-up with the same mix, "
        f"then {st['seconds']} s of: wrk on /allowed ({LOADS['allowed']['conns']} connections, a limit never "
        f"reached), on /blocked ({LOADS['blocked']['conns']}, one subject past its limit), on /subjects "
        f"({LOADS['subjects']['conns']}, a new X-Subject per request, keys expiring after 6 s), and "
        f"{st['malformed_per_s']} malformed requests a second on their own connections. Halfway `FUNCTION FLUSH`, "
        f"{st['flush_to_kill_s']} s later Redis killed (SIGKILL), restarted on the same port "
        f"{st['kill_to_restart_s']} s after that. Whole run {r.get('elapsed_s', '—')} s.",
        "",
        "Throughput depends on what else runs on the machine (two cores, other builds beside it); "
        "RSS, FDs, threads and tasks do not.",
        "",
        "## Back to baseline",
        "",
        "Baseline: the median of 5 readings, one a second, starting 5 s after the warm-up's load stopped. "
        "After the soak's load stops, readings every 0.5 s until every figure is within ±5% of it "
        "(FDs, threads, tasks: ±5% or ±2, the larger) for three readings in a row. "
        "Tasks are `sluice_runtime_alive_tasks` (tokio's live task count, read at each `/metrics` scrape).",
        "",
        "| figure | idle (start) | baseline | peak during soak | after | within tolerance |",
        "|---|---:|---:|---:|---:|---|",
    ]
    after = s["after"] or {}
    for key, label in (("rss_kb", "RSS"), ("fds", "open FDs"), ("threads", "threads"), ("tasks", "runtime tasks")):
        fmt = _mb if key == "rss_kb" else _n
        base = s["baseline"].get(key)
        ok = after.get("ok", {}).get(key)
        lines.append(f"| {label} | {fmt(r['idle'].get(key))} | {fmt(base)} | {fmt(s['peak_during_soak'].get(key))} | "
                     f"{fmt(after.get(key))} (at {after.get('t', '—')} s) | {'yes' if ok else 'no'} |")
    sa = s["settled_after_s"]
    lines += ["", f"Back within tolerance **{'%.1f s' % sa if sa is not None else 'not within ' + str(SETTLE_POLL_S) + ' s'}** "
              f"after the load stopped (target ≤ {SETTLE_TARGET_S} s).", ""]

    lines += ["## Answers over the soak", "",
              "| traffic | answers | req/s | socket errors |", "|---|---|---:|---|"]
    for k in LOADS:
        errs = s["errors"][k]
        e = ", ".join(f"{n} {v}" for n, v in errs.items() if v) or "0"
        lines.append(f"| {k} (`{LOADS[k]['path']}`) | {_st(s['statuses'][k])} | {_n(s['rps'][k])} | {e} |")
    for name, got in s["malformed"].items():
        lines.append(f"| malformed: {name} | {_st(got)} | — | — |")
    sc = r["sluice_counts"]
    lines += ["", "sluice's own counts over the soak (`/metrics` deltas):", "",
              f"- decisions (route/outcome): {_st(sc['requests'])}",
              f"- refused before routing (reason): {_st(sc['refused']) if sc['refused'] else '0'}",
              f"- store errors: {_st(sc['store_errors']) if sc['store_errors'] else '0'}; "
              f"store events: {_st(sc['store_events']) if sc['store_events'] else '0'}; "
              f"script loads: {sum(sc['script_loads'].values())}; "
              f"breaker opened: {sum(sc['breaker_opened'].values())}",
              f"- `sluice_forwarded_without_decision_total`: **{sc['forwarded_without_decision']}**", ""]
    uv = s["upstream_vs_clients"]
    lines += ["200s by path: what nginx logged, what sluice forwarded and got back "
              "(`sluice_upstream_responses_total`, 2xx), and what the clients counted (a client stopping "
              "leaves up to one request per connection answered upstream but not counted by it):", "",
              "| path | nginx's 200s | sluice's forwarded 2xx | clients' 200s |", "|---|---:|---:|---:|"]
    for k in LOADS:
        lines.append(f"| `{LOADS[k]['path']}` | {_n(uv['upstream_200'][k])} | {_n(uv['sluice_forwarded_2xx'][k])} | "
                     f"{_n(uv['client_200'][k])} |")
    lines += ["", f"Anything else nginx logged: {_st(uv['upstream_other']) if uv['upstream_other'] else 'nothing'} "
              "(`/chunk` is where the broken chunked bodies go: the head is valid, so it may be forwarded "
              "before the body breaks).", ""]

    lines += ["## FUNCTION FLUSH and the Redis kill", ""]
    ev = r["events"]
    if "script_flush" in s:
        lines.append(f"`FUNCTION FLUSH` at {ev['script_flush']['t']} s; answers in the seconds around it "
                     f"(−1 … +2 s): " + "; ".join(f"{k}: {_st(v)}" for k, v in s["script_flush"]["statuses"].items())
                     + ".")
        lines.append("")
    if "outage" in s:
        o = s["outage"]
        lines.append(f"Redis killed at {ev['redis_killed']['t']} s, restarted at {ev['redis_restarted']['t']} s; "
                     f"the allowed path answered 200 again at {ev['allowed_again']['t']} s "
                     f"(**{o['seconds']} s** after the kill). Probes of `/allowed` every 100 ms through it: "
                     f"{_st(r['outage_probes'])}.")
        lines += ["", "| traffic | answers during the outage (whole seconds, kill … recovery) | 503 share | "
                  "503 share, seconds wholly inside |", "|---|---|---:|---:|"]
        for k in LOADS:
            lines.append(f"| {k} | {_st(o['statuses'][k])} | {_pct(o['share_503'][k])} | "
                         f"{_pct(o['inner_share_503'][k])} |")
        lines += ["", "`/blocked` keeps answering 429 from the local over-limit cache while the store is gone; "
                  "the checked paths answer 503 (fail closed).", ""]
        out = s.get("outside_outage_503", {})
        secs = s.get("outside_outage_503_seconds", [])
        t0u = r["samples"][0]["unix"] - r["samples"][0]["t"] if r["samples"] else 0
        lines += [f"503s outside the outage: {', '.join(f'{k} {_n(v)}' for k, v in out.items())}, in "
                  f"{len(secs)} of the {st['seconds']} seconds"
                  + (f" (at {', '.join(str(round(x - t0u)) for x in secs[:40])}{' …' if len(secs) > 40 else ''} s)"
                     if secs else "")
                  + ". Each is the store breaker open after a run of store calls over the budget "
                  "(`sluice_store_errors_total` above: timeouts, budget_spent), on a machine whose second core "
                  "also carries the load generators, nginx, Redis and other work: it answers 503 for its "
                  "cooldown (1 s), then probes.", ""]
    else:
        lines += ["The outage was not measured.", ""]

    lines += ["## Targets", "", "| metric | target | measured | |", "|---|---|---|---|"]
    ok_settle = sa is not None and sa <= SETTLE_TARGET_S
    lines.append(f"| RSS, open FDs, tasks back to baseline | ±5% (FDs/tasks ±5% or ±2) within {SETTLE_TARGET_S} s | "
                 f"{'%.1f s' % sa if sa is not None else 'not settled'}: RSS {_mb(after.get('rss_kb'))} vs "
                 f"{_mb(s['baseline'].get('rss_kb'))}, FDs {_n(after.get('fds'))} vs {_n(s['baseline'].get('fds'))}, "
                 f"threads {_n(after.get('threads'))} vs {_n(s['baseline'].get('threads'))}, "
                 f"tasks {_n(after.get('tasks'))} vs {_n(s['baseline'].get('tasks'))} | "
                 f"{'met' if ok_settle else 'missed'} |")
    fwd = sc["forwarded_without_decision"]
    lines.append(f"| forwarded without a decision | 0 | {fwd} | {'met' if fwd == 0 else 'missed'} |")
    ok = uv["upstream_equals_sluice"] and uv["clients_within_in_flight"]
    lines.append("| every 200 nginx gave went through a decision | nginx's 200s = sluice's forwarded 2xx; "
                 "clients' 200s short by at most the connections | "
                 + ", ".join(f"{k} {_n(uv['upstream_200'][k])} / {_n(uv['sluice_forwarded_2xx'][k])} / "
                             f"{_n(uv['client_200'][k])}" for k in LOADS)
                 + f" | {'met' if ok else 'missed'} |")
    if "outage" in s:
        sh = s["outage"]["inner_share_503"]
        checked = [sh[k] for k in ("allowed", "subjects") if sh[k] is not None]
        ok = checked and all(x == 1.0 for x in checked)
        lines.append(f"| answers on checked paths while Redis is gone | every one 503 | allowed "
                     f"{_pct(sh['allowed'])}, subjects {_pct(sh['subjects'])} (seconds wholly inside) | "
                     f"{'met' if ok else 'missed'} |")
    def mal_fine(name, answer):
        if name == "cut_mid_head":
            return answer == "cut"
        # A broken chunk follows a valid head: the decision comes first, so
        # while the store cannot decide it is a 503, closed.
        return answer == "400 closed" or (name == "bad_chunk" and answer == "503 closed")

    mal_ok = all(mal_fine(name, k) for name, got in s["malformed"].items() for k in got)
    lines.append(f"| malformed requests | 400 and closed every time (a broken chunk: 400, or 503 when the store "
                 f"cannot decide on its valid head) | {'as expected' if mal_ok else 'see the table above'} | "
                 f"{'met' if mal_ok else 'missed'} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); every started process was stopped")
        sys.exit(130)
