#!/usr/bin/env python3
"""sluice side by side with nginx, in one session, interleaved.

Started by bench/run.sh (which installs the tools and builds sluice); can be
run directly once they exist:

    python3 bench/harness.py [--quick] [--sluice target/release/sluice] [--oha PATH]

Load only ever targets 127.0.0.1. Every process started here is stopped by
PID when the harness ends, however it ends. A scenario whose server does not
start, or answers its probe wrongly, is reported as `not run: <reason>` and
the others go on.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402
import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)

# Two CPUs: the proxy under test alone on one, everything else on the other.
CPU_PROXY = 1
CPU_REST = 0
BUDGET_MS = 25
# Seconds each instance is watched idle for its CPU.
IDLE_CPU_S = 5
CONNS = 32
MANY_CONNS = 1000


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Server:
    """One process that scenarios send load to; `reason` is set when it is unusable."""

    def __init__(self, name, proc=None, port=None, reason=None):
        self.name, self.proc, self.port, self.reason = name, proc, port, reason
        self.admin_port = None
        self.idle_rss_kb = None
        self.idle_anon_kb = None
        # CPU ms a second with no request (timers, monitors): paid by
        # every sidecar of a fleet all day.
        self.idle_cpu_ms = None
        self.rss_32_kb = None
        self.rss_many = None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


class Scenario:
    def __init__(self, key, server, path, *, proxy, redis=False, blocked=False):
        self.key, self.server, self.path = key, server, path
        self.proxy = proxy  # the server's own CPU and syscalls are the proxy's
        self.redis = redis
        self.blocked = blocked
        self.reason = None
        self.closed = []  # one dict per measured round
        self.open = []
        self.syscalls = None  # from its own pass: perf slows what it watches

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.port}{self.path}"

    def runnable(self):
        return self.reason is None


def render(template, out_path, **values):
    with open(os.path.join(BENCH, "configs", template)) as f:
        text = f.read()
    for k, v in values.items():
        text = text.replace(f"@@{k}@@", str(v))
    with open(out_path, "w") as f:
        f.write(text)
    return out_path


# --- starting the servers ----------------------------------------------------


def start_nginx(procs, workdir, name, template, cpu, **values):
    port = tools.free_port()
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(os.path.join(workdir, f"{name}-tmp", sub), exist_ok=True)
    conf = render(template, os.path.join(workdir, f"{name}.nginx.conf"), DIR=workdir, PORT=port, **values)
    logf = os.path.join(workdir, f"{name}.log")
    argv = ["nginx", "-p", workdir, "-c", conf, "-e", os.path.join(workdir, f"{name}.error.log")]
    proc = procs.start(name, argv, cpu, logf)
    if not tools.wait_tcp(port, proc):
        reason = tools.tail(os.path.join(workdir, f"{name}.error.log")) or tools.tail(logf)
        procs.stop(proc)
        return Server(name, reason=f"{name} nginx did not start: {reason or 'no output'}")
    return Server(name, proc, port)


def start_redis(procs, workdir):
    port = tools.free_port()
    logf = os.path.join(workdir, "redis.log")
    argv = [
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--daemonize", "no", "--dir", workdir,
        # Its own stalls of 1 ms or more are recorded (LATENCY LATEST),
        # and reported beside sluice-redis's tail.
        "--latency-monitor-threshold", "1",
    ]
    proc = procs.start("redis", argv, CPU_REST, logf)
    if not tools.wait_tcp(port, proc):
        reason = tools.tail(logf)
        procs.stop(proc)
        return Server("redis", reason=f"redis-server did not start: {reason or 'no output'}")
    return Server("redis", proc, port)


def start_upstream_and_redis(procs, workdir):
    """The nginx upstream and a redis-server, both on CPU 0, for a side-by-side
    run of sidecars on `configs/sluice-redis.yaml`; raises with the reason
    when either does not start."""
    upstream = start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", CPU_REST)
    redis = start_redis(procs, workdir)
    for server in (upstream, redis):
        if server.reason:
            raise RuntimeError(server.reason)
    return upstream, redis


def bus_port():
    """A free port below 55536 whose cluster bus (port + 10000) is free too."""
    for _ in range(200):
        port = tools.free_port()
        if port >= 55536:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    return None


def start_redis_cluster(procs, workdir, masters=3):
    """Three cluster primaries (no replicas) on loopback, slots spread by
    `redis-cli --cluster create`; the seed port, or a reason."""
    ports = []
    first = None
    for i in range(masters):
        port = bus_port()
        if port is None:
            return Server("redis-cluster", reason="no free port pair for a cluster node")
        node_dir = os.path.join(workdir, f"cluster-{i}")
        os.makedirs(node_dir, exist_ok=True)
        logf = os.path.join(node_dir, "redis.log")
        argv = [
            "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--dir", node_dir,
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
        ]
        proc = procs.start(f"redis-cluster-{i}", argv, CPU_REST, logf)
        if not tools.wait_tcp(port, proc):
            return Server("redis-cluster", reason=f"cluster node did not start: {tools.tail(logf) or 'no output'}")
        first = first or proc
        ports.append(port)
    create = subprocess.run(
        ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
         "--cluster-replicas", "0", "--cluster-yes"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if create.returncode != 0:
        return Server("redis-cluster", reason=f"redis-cli --cluster create failed: {create.stdout[-300:]}{create.stderr[-300:]}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            r = Redis(ports[0])
            ok = "cluster_state:ok" in r.cmd("CLUSTER", "INFO")
            r.close()
        except OSError:
            ok = False
        if ok:
            return Server("redis-cluster", first, ports[0])
        time.sleep(0.1)
    return Server("redis-cluster", reason="the cluster never reached cluster_state:ok")


def many_routes(n):
    """`n` prefix routes `/r0000` … on the `open` limit, as YAML list items."""
    return "\n".join(
        f"  - {{ name: r{i:04d}, match: {{ path_prefix: /r{i:04d} }}, subject: client_ip, policy: open }}"
        for i in range(n)
    )


def listening_line(path):
    """The `listening` record of sluice's JSON log, flattened, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        flat = dict(rec)
        if isinstance(rec.get("fields"), dict):
            flat.update(rec["fields"])
        if flat.get("message") == "listening":
            return flat
    return None


def port_of(addr):
    return int(str(addr).rsplit(":", 1)[1])


def start_floor(procs, workdir, floor, upstream_port):
    """The hyper floor (`bench/floor/`): a bare hyper proxy with sluice's
    runtime settings, on the proxy's CPU like sluice."""
    if not os.access(floor, os.X_OK):
        return Server("hyper-floor", reason=f"no hyper-floor binary at {floor} (bench/run.sh builds it)")
    logf = os.path.join(workdir, "hyper-floor.log")
    proc = procs.start("hyper-floor", [floor, f"http://127.0.0.1:{upstream_port}"], CPU_PROXY, logf)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        with open(logf, errors="replace") as f:
            for line in f:
                if line.startswith("listening "):
                    server = Server("hyper-floor", proc, port_of(line.split()[1]))
                    server.idle_rss_kb = tools.rss_kb(proc.pid)
                    server.idle_anon_kb = tools.rss_kb(proc.pid, "RssAnon")
                    return server
        time.sleep(0.05)
    reason = f"hyper-floor did not start: {tools.tail(logf) or 'no output'}"
    procs.stop(proc)
    return Server("hyper-floor", reason=reason)


def start_sluice(procs, workdir, sluice, name, template, **values):
    conf = render(template, os.path.join(workdir, f"{name}.yaml"), BUDGET_MS=BUDGET_MS, **values)
    check = subprocess.run([sluice, "check", "--config", conf], capture_output=True, text=True)
    if check.returncode != 0:
        first = (check.stderr.strip() or check.stdout.strip()).splitlines()[:2]
        return Server(name, reason=f"`sluice check` refused the config: {' / '.join(first)}")
    logf = os.path.join(workdir, f"{name}.log")
    proc = procs.start(name, [sluice, "run", "--config", conf, "--log-format", "json"], CPU_PROXY, logf)
    deadline = time.monotonic() + 20
    rec = None
    while time.monotonic() < deadline and proc.poll() is None:
        rec = listening_line(logf)
        if rec:
            break
        time.sleep(0.05)
    if not rec:
        code = proc.poll()
        why = f"exited with code {code}" if code is not None else "no `listening` line within 20 s"
        reason = f"sluice {why}: {tools.tail(logf) or 'no output'}"
        procs.stop(proc)
        return Server(name, reason=reason)
    try:
        server = Server(name, proc, port_of(rec["traffic_addr"]))
        if rec.get("admin_addr"):
            server.admin_port = port_of(rec["admin_addr"])
    except (KeyError, ValueError, IndexError):
        procs.stop(proc)
        return Server(name, reason=f"unreadable `listening` line: {rec}")
    if server.admin_port:
        status = None
        while time.monotonic() < deadline:
            try:
                status = tools.http_status(server.admin_port, "/readyz", timeout=2)
            except OSError as e:
                status = str(e)
            if status == 200:
                break
            time.sleep(0.1)
        if status != 200:
            procs.stop(proc)
            return Server(name, reason=f"/readyz answered {status}: {tools.tail(logf)}")
    time.sleep(0.2)
    server.idle_rss_kb = tools.rss_kb(proc.pid)
    server.idle_anon_kb = tools.rss_kb(proc.pid, "RssAnon")
    return server


# --- measuring ---------------------------------------------------------------


def probe(scn):
    """Checks the scenario answers what it claims: 200 on an allowed path;
    on a blocked path the first request spends the one allowed, the next
    must be 429."""
    if scn.reason:
        return
    if scn.server.reason:
        scn.reason = scn.server.reason
        return
    want = 429 if scn.blocked else 200
    try:
        status = tools.http_status(scn.server.port, scn.path)
        if scn.blocked:
            status = tools.http_status(scn.server.port, scn.path)
    except OSError as e:
        scn.reason = f"probe failed: {e}"
        return
    if status != want:
        scn.reason = f"probe answered {status}, expected {want}"


def measure_closed(procs, workdir, scn, seconds, redis, perf_ok, tag):
    """One closed-loop run, with the proxy's CPU, syscalls and RSS and Redis's work."""
    pid = scn.server.pid if scn.proxy else None
    stats = redis if (scn.redis and redis) else None
    if stats:
        stats.cmd("CONFIG", "RESETSTAT")
        redis_cpu0 = stats.cpu_seconds()
    cpu0 = tools.cpu_seconds(pid) if pid else None
    perf = None
    if pid and perf_ok:
        perf = tools.PerfSyscalls(procs, pid, os.path.join(workdir, f"perf-{scn.key}-{tag}.txt"), CPU_REST)
        perf.__enter__()
    try:
        with tools.RssSampler(pid or scn.server.pid) as rss:
            wrk = tools.run_wrk(scn.url, CONNS, seconds, CPU_REST)
    finally:
        if perf:
            perf.__exit__(None, None, None)
    result = dict(wrk)
    n = max(1, wrk["requests"])
    result["cpu_us_per_req"] = (tools.cpu_seconds(pid) - cpu0) * 1e6 / n if pid else None
    result["syscalls_per_req"] = perf.count / n if perf and perf.count is not None else None
    result["rss_kb"] = rss.max_kb if pid else None
    if stats:
        calls = stats.commandstats()
        result["redis_calls"] = calls
        result["redis_cmds_per_req"] = {k: v / n for k, v in sorted(calls.items())}
        result["redis_cpu_us_per_req"] = (stats.cpu_seconds() - redis_cpu0) * 1e6 / n
    return result


def run_scenario(procs, workdir, scn, settings, redis, rate, tag, measured):
    if not scn.server.alive():
        code = scn.server.proc.poll() if scn.server.proc else None
        scn.reason = f"{scn.server.name} exited during the run (code {code})"
        return None
    try:
        closed = measure_closed(procs, workdir, scn, settings["closed_s"] if measured else settings["warmup_s"],
                                redis, False, tag)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        scn.reason = f"failed in {tag}: {e}"
        return None
    if closed["requests"] == 0:
        scn.reason = f"no answer in {tag} (socket errors: {closed['socket_errors']})"
        return None
    if measured:
        scn.closed.append(closed)
        # sluice's own decision time over the same run, to set beside the
        # end-to-end percentiles (its tail is inside the decision or not).
        admin = scn.server.admin_port if not scn.blocked else None
        stalls = redis if (scn.redis and redis) else None
        try:
            before = tools.decision_buckets(admin) if admin else None
            if stalls:
                stalls.cmd("LATENCY", "RESET")
            if stalls:
                # Redis's round trip for anyone on the load generator's
                # CPU, over the same run: the floor of the decision's.
                with tools.Pinger(stalls.sock.getpeername()[1], CPU_REST) as pinger:
                    run = tools.run_oha(settings["oha"], scn.url, rate, settings["open_s"], CONNS, CPU_REST)
                run["redis_ping_p99_ms"] = tools.percentile(pinger.rtts, 0.99)
            else:
                run = tools.run_oha(settings["oha"], scn.url, rate, settings["open_s"], CONNS, CPU_REST)
            if before is not None:
                run["decision"] = tools.decision_summary(before, tools.decision_buckets(admin))
            if stalls:
                run["redis_stalls_max_ms"] = {e[0]: e[3] for e in (stalls.cmd("LATENCY", "LATEST") or [])}
            scn.open.append(run)
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
            scn.reason = f"open-loop run failed in {tag}: {e}"
            return None
    log(f"  {tag:<8} {scn.key:<22} {closed['rps']:>10.0f} req/s")
    return closed


def count_syscalls(procs, workdir, scn, settings, redis):
    """One closed-loop run with perf attached to the proxy, for syscalls only."""
    if not scn.proxy or not scn.runnable() or not scn.server.alive():
        return
    try:
        closed = measure_closed(procs, workdir, scn, settings["closed_s"], redis, True, "syscalls")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        log(f"  syscalls {scn.key}: {e}")
        return
    scn.syscalls = closed["syscalls_per_req"]
    log(f"  syscalls {scn.key:<22} {_num(scn.syscalls)} per request")


def _num(v):
    return "—" if v is None else f"{v:.2f}"


def many_connections(server, path, seconds):
    """RSS while MANY_CONNS connections are open and busy."""
    if server.reason or not server.alive():
        return
    try:
        with tools.RssSampler(server.pid) as rss:
            wrk = tools.run_wrk(f"http://127.0.0.1:{server.port}{path}", MANY_CONNS, seconds, CPU_REST, timeout_s=10)
        server.rss_many = {"rss_kb": rss.max_kb, "anon_kb": rss.max_anon_kb, "rps": wrk["rps"],
                           "socket_errors": wrk["socket_errors"],
                           "non_2xx": wrk["non_2xx"]}
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        server.rss_many = {"error": str(e)}


def redis_stall(settings, server, redis_srv, rate):
    """CLIENT PAUSE longer than the budget while an open-loop load runs."""
    if server.reason or redis_srv.reason:
        return {"reason": server.reason or redis_srv.reason}
    if not server.alive():
        return {"reason": "sluice-redis exited during the run"}
    seconds = settings["stall_s"]
    pause_ms = seconds * 1000 + 1500
    rate = int(min(rate, 1000))
    conns = 100
    r = Redis(redis_srv.port)
    try:
        r.cmd("CLIENT", "PAUSE", pause_ms, "ALL")
        paused_at = time.monotonic()
        try:
            res = tools.run_oha(settings["oha"], f"http://127.0.0.1:{server.port}/allowed", rate, seconds, conns, CPU_REST)
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
            return {"reason": f"oha failed: {e}"}
        remaining = pause_ms / 1000 - (time.monotonic() - paused_at)
        if remaining > 0:
            time.sleep(remaining + 0.1)
    finally:
        r.close()
    # After the pause: how long until the allowed path answers 200 again.
    recovered = None
    start = time.monotonic()
    while time.monotonic() - start < 10:
        try:
            if tools.http_status(server.port, "/allowed", timeout=2) == 200:
                recovered = time.monotonic() - start
                break
        except OSError:
            pass
        time.sleep(0.05)
    res.update({"pause_ms": pause_ms, "rate": rate, "seconds": seconds, "connections": conns,
                "budget_ms": BUDGET_MS, "recovered_after_s": recovered})
    return res


# --- the session -------------------------------------------------------------


def machine_info(sluice, oha):
    def first_line(argv):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return ((out.stdout or out.stderr).strip().splitlines() or [""])[0]
        except (OSError, subprocess.TimeoutExpired):
            return None

    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kb = None
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    rev = first_line(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1) if mem_kb else None,
        "loadavg_at_start": os.getloadavg(),
        "tools": {
            "sluice": first_line([sluice, "--version"]),
            "sluice_commit": rev,
            "nginx": first_line(["nginx", "-v"]),
            "redis": first_line(["redis-server", "--version"]),
            "wrk": first_line(["wrk", "--version"]),
            "oha": first_line([oha, "--version"]),
            "perf": first_line(["perf", "--version"]),
        },
    }


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), max(hard, want)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def settings_for(args):
    quick = args.quick or os.environ.get("BENCH_QUICK") == "1"
    s = {
        "quick": quick,
        "rounds": 1 if quick else 3,
        "warmup_s": 1 if quick else 2,
        "closed_s": 2 if quick else 3,
        "open_s": 1 if quick else 3,
        "stall_s": 1 if quick else 2,
        "connections": CONNS,
        "many_connections": MANY_CONNS,
        "budget_ms": BUDGET_MS,
        "oha": args.oha,
    }
    if os.environ.get("BENCH_ROUNDS"):
        s["rounds"] = max(1, int(os.environ["BENCH_ROUNDS"]))
    if os.environ.get("BENCH_SECONDS"):
        s["closed_s"] = s["open_s"] = max(1, int(os.environ["BENCH_SECONDS"]))
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round of short runs (also BENCH_QUICK=1)")
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--oha", default=shutil.which("oha") or "oha")
    ap.add_argument("--floor", default=os.path.join(ROOT, "target", "release", "hyper-floor"),
                    help="the hyper floor binary (bench/floor/)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs)")
    args = ap.parse_args()
    settings = settings_for(args)
    if (os.cpu_count() or 1) < 2:
        log("warning: fewer than 2 CPUs; pinning puts everything on CPU 0")

    # A signal becomes an exception, so `finally` stops every process.
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    raise_fd_limit()
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-bench-")
    started = time.monotonic()
    try:
        result = session(procs, workdir, args, settings)
    finally:
        procs.stop_all()
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    os.makedirs(args.out, exist_ok=True)
    md = report.markdown(result)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump(result, f, indent=2, sort_keys=False)
        f.write("\n")
    with open(os.path.join(args.out, "latest.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"written: {os.path.relpath(os.path.join(args.out, 'latest.md'), os.getcwd())} and latest.json "
        f"({result['elapsed_s']} s)")


def session(procs, workdir, args, settings):
    info = machine_info(args.sluice, args.oha)
    perf_reason = tools.perf_supported()
    if perf_reason:
        log(f"syscalls not counted: {perf_reason}")

    log("starting upstream, nginx proxy, redis, sluice")
    upstream = start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", CPU_REST)
    if upstream.reason:
        raise SystemExit(f"bench: cannot run anything: {upstream.reason}")
    nginx = start_nginx(procs, workdir, "proxy", "proxy.nginx.conf", CPU_PROXY, UPSTREAM_PORT=upstream.port)
    floor = start_floor(procs, workdir, args.floor, upstream.port)
    redis_srv = start_redis(procs, workdir)
    cluster_srv = start_redis_cluster(procs, workdir)
    if not os.access(args.sluice, os.X_OK):
        missing = f"no sluice binary at {args.sluice}"
        mem = Server("sluice-memory", reason=missing)
        red = Server("sluice-redis", reason=missing)
        clu = Server("sluice-redis-cluster", reason=missing)
        routes = Server("sluice-1000-routes", reason=missing)
    else:
        mem = start_sluice(procs, workdir, args.sluice, "sluice-memory", "sluice-memory.yaml",
                           UPSTREAM_PORT=upstream.port)
        if redis_srv.reason:
            red = Server("sluice-redis", reason=redis_srv.reason)
        else:
            red = start_sluice(procs, workdir, args.sluice, "sluice-redis", "sluice-redis.yaml",
                               UPSTREAM_PORT=upstream.port, REDIS_PORT=redis_srv.port)
        routes = start_sluice(procs, workdir, args.sluice, "sluice-1000-routes", "sluice-routes.yaml",
                              UPSTREAM_PORT=upstream.port, ROUTES=many_routes(1000))
        if cluster_srv.reason:
            clu = Server("sluice-redis-cluster", reason=cluster_srv.reason)
        else:
            clu = start_sluice(procs, workdir, args.sluice, "sluice-redis-cluster",
                               "sluice-redis-cluster.yaml",
                               UPSTREAM_PORT=upstream.port, REDIS_PORT=cluster_srv.port)
    for s in (nginx, floor, mem, red, clu, routes):
        if s.reason:
            log(f"{s.name}: {s.reason}")
    # Every instance started and ready, nothing asked of any yet: what
    # each spends of a core idle.
    for s in (mem, red, floor):
        if not s.reason:
            s.idle_cpu_ms = tools.idle_cpu(s.proc.pid, IDLE_CPU_S)

    scenarios = [
        Scenario("direct", upstream, "/", proxy=False),
        Scenario("nginx-proxy", nginx, "/", proxy=True),
        Scenario("nginx-limit-allowed", nginx, "/allowed", proxy=True),
        Scenario("nginx-limit-blocked", nginx, "/blocked", proxy=True, blocked=True),
        # The same stack as sluice with nothing of sluice's own: what
        # sluice-none is measured against.
        Scenario("hyper-floor", floor, "/none", proxy=True),
        # The stack refusing with a fixed 429 and nothing else: what a
        # refusal on hyper cannot go below.
        Scenario("hyper-floor-blocked", floor, "/blocked", proxy=True, blocked=True),
        Scenario("sluice-none", mem, "/none", proxy=True),
        Scenario("sluice-memory", mem, "/allowed", proxy=True),
        Scenario("sluice-blocked-memory", mem, "/blocked", proxy=True, blocked=True),
        # The same limit as sluice-memory, behind 999 prefix routes that
        # come first in the file and do not match.
        Scenario("sluice-1000-routes", routes, "/r0999/item", proxy=True),
        Scenario("sluice-redis", red, "/allowed", proxy=True, redis=True),
        Scenario("sluice-blocked-redis", red, "/blocked", proxy=True, redis=True, blocked=True),
        # Redis statistics are read from the standalone Redis only.
        Scenario("sluice-redis-cluster", clu, "/allowed", proxy=True),
    ]
    for scn in scenarios:
        probe(scn)
        if scn.reason and not scn.server.reason:
            log(f"{scn.key}: not run: {scn.reason}")

    redis = Redis(redis_srv.port) if not redis_srv.reason else None

    log(f"warm-up round (discarded), {settings['warmup_s']} s each")
    capacity = {}
    for scn in scenarios:
        if scn.runnable():
            closed = run_scenario(procs, workdir, scn, settings, redis, 0, "warm-up", False)
            if closed:
                capacity[scn.key] = closed["rps"]
    # One rate for every scenario, so each added latency compares like
    # with like: half of what the slowest proxy on the allowed path
    # managed in the warm-up. Half of the fastest (once sluice-none) put
    # the slower ones, Redis first, past their capacity, and their
    # latency then measured a queue, not the proxy.
    allowed = {k: v for k, v in capacity.items()
               if k != "direct" and not any(s.key == k and s.blocked for s in scenarios)}
    base = min(allowed, key=allowed.get) if allowed else "direct"
    rate = max(100, int(capacity.get(base, 2000) * 0.5))
    if os.environ.get("BENCH_OPEN_RATE"):
        rate, base = max(1, int(os.environ["BENCH_OPEN_RATE"])), "BENCH_OPEN_RATE"
    settings["open_rate"] = rate
    settings["open_rate_basis"] = base
    log(f"open-loop rate: {rate} req/s (50% of {base} in the warm-up)")

    for r in range(settings["rounds"]):
        order = scenarios if r % 2 == 0 else list(reversed(scenarios))
        tag = f"round {r + 1}"
        log(f"{tag}: {' '.join(s.key for s in order if s.runnable())}")
        for scn in order:
            if scn.runnable():
                run_scenario(procs, workdir, scn, settings, redis, rate, tag, True)

    if perf_reason is None:
        log("syscalls (perf attached, throughput not used)")
        for scn in scenarios:
            count_syscalls(procs, workdir, scn, settings, redis)

    log(f"{MANY_CONNS} connections")
    # The hyper floor too: what the stack's own buffers take at as many
    # connections, beside which sluice's figure is read.
    for server in (mem, red, floor):
        many_connections(server, "/allowed", settings["closed_s"])
        server.rss_32_kb = max((c["rss_kb"] for s in scenarios if s.server is server for c in s.closed
                                if c.get("rss_kb")), default=None)

    log("redis stall (CLIENT PAUSE)")
    stall = redis_stall(settings, red, redis_srv, rate)
    if redis:
        try:
            redis.close()
        except OSError:
            pass

    settings.pop("oha", None)
    return {
        "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": info,
        "settings": settings,
        "syscalls_not_counted": perf_reason,
        "pinning": {"proxy_cpu": CPU_PROXY, "load_upstream_redis_cpu": CPU_REST},
        "scenarios": summarize(scenarios),
        "memory": {
            s.name: {"reason": s.reason, "idle_kb": s.idle_rss_kb, "idle_anon_kb": s.idle_anon_kb,
                     "idle_cpu_ms_per_s": s.idle_cpu_ms,
                     "conns_32_kb": s.rss_32_kb,
                     "conns_1000": s.rss_many}
            for s in (mem, red, floor)
        },
        "redis_stall": stall,
        "capacity_warmup_rps": capacity,
    }


def med_range(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(scenarios):
    by_key = {s.key: s for s in scenarios}
    direct = by_key["direct"]
    out = {}
    for s in scenarios:
        entry = {"url_path": s.path, "server": s.server.name, "reason": s.reason, "rounds": len(s.closed)}
        if not s.closed:
            out[s.key] = entry
            continue
        entry["rps"] = med_range([c["rps"] for c in s.closed])
        entry["cpu_us_per_req"] = med_range([c["cpu_us_per_req"] for c in s.closed])
        entry["syscalls_per_req"] = med_range([s.syscalls])
        entry["non_2xx_share"] = sum(c["non_2xx"] for c in s.closed) / max(1, sum(c["requests"] for c in s.closed))
        entry["socket_errors"] = sum(c["socket_errors"] for c in s.closed)
        if s.redis:
            names = sorted({k for c in s.closed for k in c.get("redis_cmds_per_req", {})})
            per_req = {k: statistics.median(c.get("redis_cmds_per_req", {}).get(k, 0.0) for c in s.closed)
                       for k in names}
            entry["redis_cmds_per_req"] = {k: v for k, v in per_req.items() if tools.is_client_command(k)}
            entry["redis_script_calls_per_req"] = {
                k: v for k, v in per_req.items() if not tools.is_client_command(k)}
            entry["redis_cpu_us_per_req"] = med_range([c.get("redis_cpu_us_per_req") for c in s.closed])
        if s.open:
            for p in ("p50_ms", "p99_ms", "p999_ms"):
                entry[p] = med_range([o[p] for o in s.open])
                if direct.open and len(direct.open) == len(s.open):
                    entry["added_" + p] = med_range([o[p] - d[p] for o, d in zip(s.open, direct.open)
                                                      if o[p] is not None and d[p] is not None])
            decided = [o["decision"] for o in s.open if (o.get("decision") or {}).get("count")]
            if decided:
                entry["decision_ms"] = {p: med_range([d[p] for d in decided])
                                        for p in ("p50_ms", "p99_ms", "p999_ms")}
            pings = [o["redis_ping_p99_ms"] for o in s.open if o.get("redis_ping_p99_ms") is not None]
            if pings:
                entry["redis_ping_p99_ms"] = med_range(pings)
            if any("redis_stalls_max_ms" in o for o in s.open):
                names = sorted({k for o in s.open for k in o.get("redis_stalls_max_ms", {})})
                entry["redis_stalls_max_ms"] = {k: [o.get("redis_stalls_max_ms", {}).get(k, 0) for o in s.open]
                                                for k in names}
            statuses = {}
            for o in s.open:
                for k, v in o["statuses"].items():
                    statuses[k] = statuses.get(k, 0) + v
            entry["open_statuses"] = statuses
            errors = {}
            for o in s.open:
                for k, v in o["errors"].items():
                    errors[k] = errors.get(k, 0) + v
            entry["open_errors"] = errors
        entry["raw"] = {"closed": s.closed, "open": s.open}
        out[s.key] = entry
    # Ratios within each round: both figures come from the same round.
    for key, entry in out.items():
        entry["ratio"] = {}
        for ref in ("direct", "nginx-proxy", "hyper-floor", "hyper-floor-blocked", "nginx-limit-blocked",
                    "sluice-none", "sluice-memory", "sluice-redis"):
            a, b = by_key[key], by_key[ref]
            if a.closed and b.closed and len(a.closed) == len(b.closed):
                entry["ratio"][ref] = med_range([x["rps"] / y["rps"] for x, y in zip(a.closed, b.closed) if y["rps"]])
        for ref in ("sluice-none", "hyper-floor"):
            field = "cpu_ratio_" + ref.replace("-", "_")
            entry[field] = None
            a, b = by_key[key], by_key[ref]
            if a.closed and b.closed and len(a.closed) == len(b.closed):
                entry[field] = med_range([
                    x["cpu_us_per_req"] / y["cpu_us_per_req"] for x, y in zip(a.closed, b.closed)
                    if x["cpu_us_per_req"] and y["cpu_us_per_req"]])
    return out


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); every started process was stopped")
        sys.exit(130)
