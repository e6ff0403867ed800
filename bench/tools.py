"""Plumbing for the benchmark: processes stopped by PID, free ports, /proc
readings, perf, a minimal Redis client and the two load generators.

Python 3 standard library only.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Processes:
    """Every long-running process the harness starts, stopped by PID."""

    def __init__(self):
        self._procs = []

    def start(self, name, argv, cpu, log_path):
        """Starts `argv` pinned to `cpu` (taskset execs, so the PID is the
        program's own), output to `log_path`, in its own session so a Ctrl-C
        on the terminal reaches the harness only and the harness stops it."""
        cmd = ["taskset", "-c", str(cpu)] + list(argv) if cpu is not None else list(argv)
        log = open(log_path, "wb")
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self._procs.append((name, proc))
        return proc

    def stop(self, proc, sig=signal.SIGTERM, grace=5.0):
        if proc.poll() is None:
            try:
                os.kill(proc.pid, sig)
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
            except ProcessLookupError:
                pass
        self._procs = [(n, p) for (n, p) in self._procs if p is not proc]

    def stop_all(self):
        for _, proc in reversed(list(self._procs)):
            try:
                self.stop(proc)
            except Exception:  # noqa: BLE001 - keep stopping the others
                pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_tcp(port, proc, timeout=10.0):
    """True once 127.0.0.1:`port` accepts; False when `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def tail(path, lines=3):
    try:
        with open(path, "rb") as f:
            text = f.read()[-4000:].decode("utf-8", "replace")
    except OSError:
        return ""
    return " | ".join(x.strip() for x in text.strip().splitlines()[-lines:])


def http_status(port, path, timeout=5.0):
    """The status of one GET to 127.0.0.1:`port``path`; raises OSError."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


# --- sluice and a plain upstream -----------------------------------------------


def start_sluice(procs, workdir, binary, config_text, name, cpu=None, timeout=15.0):
    """Writes `config_text` and runs `binary` on it: (process, traffic port,
    admin port or None, log path) once its `listening` line is logged."""
    stem = f"{name}-{time.time_ns()}"
    cfg = os.path.join(workdir, stem + ".yaml")
    with open(cfg, "w") as f:
        f.write(config_text)
    log = os.path.join(workdir, stem + ".log")
    proc = procs.start(name, [binary, "run", "--config", cfg], cpu, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        with open(log, errors="replace") as f:
            for line in f:
                if "listening" not in line:
                    continue
                t = re.search(r'"traffic_addr":"127\.0\.0\.1:(\d+)"', line)
                a = re.search(r'"admin_addr":"127\.0\.0\.1:(\d+)"', line)
                if t:
                    return proc, int(t.group(1)), int(a.group(1)) if a else None, log
    raise SystemExit(f"{name}: sluice did not start: {tail(log)}")


def serve_ok(port):
    """A keep-alive upstream answering every request `200 ok` at once
    (asyncio, one thread; run it in a process of its own)."""
    import asyncio

    async def handle(reader, writer):
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --- /proc -------------------------------------------------------------------


def cpu_seconds(pid):
    """utime + stime of the whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime 14, stime 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kb(pid, field="VmRSS"):
    """`pid`'s resident memory in kB: all of it (`VmRSS`), or `RssAnon`,
    the part no file backs (heap, stacks), which is what a memory limit
    cannot reclaim; the rest is mostly the binary's own pages."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def cpu_ns(pid):
    """CPU time `pid` has used so far, every thread's, in nanoseconds
    (`/proc/<pid>/task/*/schedstat`: exact, where `/proc/<pid>/stat` counts
    10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def idle_cpu(pid, seconds):
    """What `pid` spends of a core while nothing is asked of it, over
    `seconds`: CPU milliseconds a second."""
    before = cpu_ns(pid)
    time.sleep(seconds)
    return (cpu_ns(pid) - before) / 1e6 / seconds


class RssSampler:
    """Samples VmRSS of `pid` every 100 ms on a thread; keeps the maximum,
    and the most of it that was anonymous (`RssAnon`)."""

    def __init__(self, pid):
        self.pid = pid
        self.max_kb = None
        self.max_anon_kb = None
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
                kb, anon = rss_kb(self.pid), rss_kb(self.pid, "RssAnon")
            except OSError:
                kb = anon = None
            if kb is not None and (self.max_kb is None or kb > self.max_kb):
                self.max_kb = kb
            if anon is not None and (self.max_anon_kb is None or anon > self.max_anon_kb):
                self.max_anon_kb = anon
            if self._stop.wait(0.1):
                return


# --- perf --------------------------------------------------------------------

PERF_EVENT = "raw_syscalls:sys_enter"


def perf_supported():
    """None when `perf stat -e raw_syscalls:sys_enter` counts here, else why not."""
    try:
        out = subprocess.run(
            ["perf", "stat", "-e", PERF_EVENT, "-x", ",", "--", "true"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"perf not usable: {e}"
    if out.returncode != 0 or _perf_count(out.stderr) is None:
        return "perf cannot count " + PERF_EVENT + ": " + (out.stderr.strip().splitlines() or ["?"])[-1]
    return None


def _perf_count(text):
    for line in text.splitlines():
        if line.startswith("#") or PERF_EVENT not in line:
            continue
        first = line.split(",", 1)[0].strip()
        return int(first) if first.isdigit() else None
    return None


class PerfSyscalls:
    """Counts the syscalls of `pid` (all its threads) while the block runs."""

    def __init__(self, procs, pid, out_path, cpu):
        self.procs, self.pid, self.out_path, self.cpu = procs, pid, out_path, cpu
        self.count = None
        self._proc = None

    def __enter__(self):
        self._proc = self.procs.start(
            "perf",
            ["perf", "stat", "-e", PERF_EVENT, "-x", ",", "-o", self.out_path, "-p", str(self.pid)],
            self.cpu,
            self.out_path + ".log",
        )
        # perf needs a moment to open its counters on every thread.
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        # SIGINT makes perf stat print its counts and exit.
        self.procs.stop(self._proc, sig=signal.SIGINT)
        try:
            with open(self.out_path) as f:
                self.count = _perf_count(f.read())
        except OSError:
            self.count = None


# --- Redis -------------------------------------------------------------------


# Commands a client sends; every other command in `INFO commandstats` was
# called by a script or function (Redis counts those too). sluice must work
# with a user allowed only FCALL, FUNCTION LOAD/LIST/DELETE, PING and the
# commands its functions call, so it sends no data command itself but the
# libraries' leases (one SET per library at start and each hour).
CLIENT_COMMAND_PREFIXES = ("eval", "script", "fcall", "function", "ping", "hello", "client", "select", "auth")


def is_client_command(name):
    return name.startswith(CLIENT_COMMAND_PREFIXES)


class Redis:
    """Just enough RESP for CONFIG RESETSTAT, INFO and CLIENT PAUSE."""

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def close(self):
        self.file.close()
        self.sock.close()

    def cmd(self, *args):
        parts = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(parts))
        return self._read()

    def _read(self):
        line = self.file.readline()
        if not line:
            raise OSError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise OSError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            return data[:-2].decode()
        if kind == b"*":
            return [self._read() for _ in range(int(rest))]
        raise OSError(f"redis: unexpected reply {line!r}")

    def info(self, section):
        out = {}
        for line in self.cmd("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def commandstats(self):
        """{command: calls}, without the commands the harness itself sends."""
        calls = {}
        for k, v in self.info("commandstats").items():
            name = k[len("cmdstat_"):]
            if name.startswith(("config", "info")):
                continue
            m = re.search(r"calls=(\d+)", v)
            if m:
                calls[name] = int(m.group(1))
        return calls

    def cpu_seconds(self):
        cpu = self.info("cpu")
        return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


# --- sluice's own figures ----------------------------------------------------


def decision_buckets(admin_port):
    """{le: count} of sluice_decision_duration_seconds{source="store"} (all
    routes), from sluice's admin `/metrics`."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line.startswith("sluice_decision_duration_seconds_bucket{") or 'source="store"' not in line:
            continue
        m = re.search(r'le="([^"]+)"\}\s+(\S+)', line)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            out[le] = out.get(le, 0) + float(m.group(2))
    return out


def quantile_ms(buckets, q):
    """The q-quantile from cumulative buckets, linear within a bucket (ms)."""
    items = sorted(buckets.items())
    total = items[-1][1] if items else 0
    if not total:
        return None
    want = q * total
    lo_le, lo_n = 0.0, 0.0
    for le, n in items:
        if n >= want:
            if le == float("inf"):
                return lo_le * 1000
            frac = (want - lo_n) / max(1e-9, n - lo_n)
            return (lo_le + frac * (le - lo_le)) * 1000
        lo_le, lo_n = le, n
    return None


def share_over(buckets, le):
    items = sorted(buckets.items())
    total = items[-1][1] if items else 0
    return None if not total else 1 - buckets.get(le, 0) / total


def decision_summary(before, after):
    """The decisions between two readings of `decision_buckets`."""
    diff = {le: after.get(le, 0) - before.get(le, 0) for le in after}
    return {
        "count": max(diff.values()) if diff else 0,
        "p50_ms": quantile_ms(diff, 0.5), "p99_ms": quantile_ms(diff, 0.99), "p999_ms": quantile_ms(diff, 0.999),
        "over_1ms": share_over(diff, 0.001), "over_2_5ms": share_over(diff, 0.0025),
    }


class Pinger:
    """PING every 2 ms on a connection of its own, from a thread pinned to
    `cpu`: Redis's round trip as anyone on that CPU sees it, in ms."""

    def __init__(self, port, cpu):
        self.port = port
        self.cpu = cpu
        self.rtts = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        os.sched_setaffinity(0, {self.cpu})  # this thread only
        r = Redis(self.port)
        try:
            while not self._stop.wait(0.002):
                t0 = time.perf_counter()
                r.cmd("PING")
                self.rtts.append((time.perf_counter() - t0) * 1000)
        finally:
            r.close()


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# --- load generators ---------------------------------------------------------


def run_wrk(url, conns, seconds, cpu, timeout_s=5, headers=()):
    """Closed loop: `conns` connections each sending as fast as answered,
    each request with `headers` (`Name: value` strings) beside wrk's Host."""
    argv = [
        "taskset", "-c", str(cpu),
        "wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", f"--timeout={timeout_s}s",
    ]
    for header in headers:
        argv += ["-H", header]
    argv.append(url)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    text = out.stdout
    m_req = re.search(r"(\d+) requests in", text)
    m_rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    if out.returncode != 0 or not m_req or not m_rps:
        raise RuntimeError("wrk failed: " + (out.stderr.strip() or text.strip())[-300:])
    m_non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    m_err = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {
        "requests": int(m_req.group(1)),
        "rps": float(m_rps.group(1)),
        "non_2xx": int(m_non2xx.group(1)) if m_non2xx else 0,
        "socket_errors": sum(int(x) for x in m_err.groups()) if m_err else 0,
    }


def run_oha(oha, url, rate, seconds, conns, cpu):
    """Open loop at `rate` requests/s with latency correction (the time a
    request should have been sent counts, not when a busy connection got
    round to it)."""
    argv = [
        "taskset", "-c", str(cpu),
        oha, "-q", str(int(rate)), "-z", f"{seconds}s", "-c", str(conns), "-w",
        "--latency-correction", "--no-tui", "--output-format", "json",
        "--worker-threads", "1", url,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    if out.returncode != 0:
        raise RuntimeError("oha failed: " + out.stderr.strip()[-300:])
    data = json.loads(out.stdout)
    pct = data.get("latencyPercentiles") or {}
    summary = data.get("summary") or {}

    def ms(v):
        return None if v is None else v * 1000.0

    return {
        "rps": summary.get("requestsPerSec"),
        "p50_ms": ms(pct.get("p50")),
        "p99_ms": ms(pct.get("p99")),
        "p999_ms": ms(pct.get("p99.9")),
        "max_ms": ms(summary.get("slowest")),
        "statuses": {str(k): int(v) for k, v in (data.get("statusCodeDistribution") or {}).items()},
        "errors": {str(k): int(v) for k, v in (data.get("errorDistribution") or {}).items()},
    }
