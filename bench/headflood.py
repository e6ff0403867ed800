#!/usr/bin/env python3
"""Request-head floods: what sluice holds in memory for request heads that
never finish (HTTP/1) or never end their stream (HTTP/2), and whether it
keeps answering meanwhile. Several builds side by side in one run.

    python3 bench/headflood.py --sluice /work/before/target/release/sluice \\
        --sluice target/release/sluice [--rounds 1] [--h1-conns 2000]
        [--h2-conns 80] [--h2-slow-conns 10] [--h2-streams 128]
        [--h1-head-bytes N] [--h2-list-bytes N] [--hold 8] [--after 15]
        [--stem headflood] [--keep]
    python3 bench/headflood.py --render bench/results/headflood.json

`--sluice` takes a path, or `NAME=PATH` to name the build in the report
(otherwise the directory above `target/`, e.g. `before`). Each build gets a
fresh sluice for each scenario, started from the same configuration
(`sluice check` must accept it first): listen and admin on 127.0.0.1:0
(the ports are read back from the `listening` line of its JSON log), the
memory store, `server: { max_connections: 10000, max_connections_per_ip:
10000 }` so this one client may open every connection, one fixed window of
1,000,000 per second on `path_prefix: /` by `client_ip` (never reached),
everything else at the build's default (`workers: 0`, `header_read_timeout:
10s`, `http2.max_concurrent_streams: 128`; `max_header_bytes` 65536 up to
23db65c, 32768 after it; `server.request_heads`, the budget for held head
bytes, where the build has it: 2 MiB a connection, 4 MiB a client, 16 MiB
in all; the script never writes these keys, so one file suits every
build). In front
of an upstream of this script's own (`--serve-upstream`, asyncio, one
process): 200 `ok` at once on any path, after `--slow-s` (30) seconds on
`/slow`; keep-alive. (sluice forwards these GETs without a body, though
the HTTP/2 streams never end; a chunked body would be answered at once
and thrown away in a lingering close, 5 s of silence at most, as nginx.)

Per scenario and build, after a warm-up (32 keep-alive connections, 10
`GET /x` each), the idle VmRSS (median of 3 readings), then:

- `idle`: 1,000 keep-alive connections, each makes one complete
  `GET /x HTTP/1.1` (answered 200; at most 32 in flight, so the upstream
  pool grows no larger than the warm-up made it) and stays open idle;
  VmRSS with them open (median of 3) − idle = RSS per 1,000 idle HTTP/1
  connections.
- `h1`: `--h1-conns` connections each send `GET /x HTTP/1.1`, `Host`, then
  60 lines `X-Pad-NN: <1,000 bytes>` (60,746 bytes; `--h1-head-bytes N`:
  exactly N bytes, lines of 1,000-byte values and a shorter last one)
  and never the empty line that ends the head, at most
  2,000 new connections a second (faster, SYNs to sluice's 128-long
  listen backlog are lost on this kernel and cost 1 s each); then all
  closed.
- `h2`: `--h2-conns` cleartext HTTP/2 connections (prior knowledge, the
  `h2` library) each open streams of `GET /x` whose header list decodes to
  about 62 KB (60 headers `x-pad-NN`, 1,000-byte values; 62,567 bytes for
  `/x` as RFC 7541 counts a list; `--h2-list-bytes N`: exactly N, headers
  of 1,000-byte values and a shorter last one, e.g. 30,000 to stay under
  a `max_header_bytes` of 32,768, which h2 enforces as
  SETTINGS_MAX_HEADER_LIST_SIZE) with no END_STREAM, up to `--h2-streams`
  (128) per connection, and stop opening on a connection when its server's SETTINGS_MAX_CONCURRENT_STREAMS
  is reached (h2 refuses the next), when it sends GOAWAY, or when it
  refuses a stream (RST_STREAM REFUSED_STREAM or ENHANCE_YOUR_CALM). The
  block is HPACK-encoded once and sent again for every stream: Huffman-coded
  literals without indexing, 41,289 bytes on the wire for the 62,567-byte
  list (`--h2-raw`: plain literals, 61 KB); the decoder's 4,096-byte table would hold 3 of these
  1,040-byte entries, so indexing would save nothing. Every socket is read
  all along (h2 answers PINGs and SETTINGS, DATA is acknowledged); per
  connection the streams opened, the RST_STREAMs by error code, the
  response HEADERS by status, the GOAWAY and its code; then all closed.
- `h2-slow`: the same on `--h2-slow-conns` (10) connections to `/slow`,
  which the upstream answers only after `--slow-s`, longer than the hold
  (`--h2-slow-conns 80`: as many streams as the `/x` flood, all held).

A flood is closed `--hold` (8) seconds after its first connection, and
never before 0.5 s after it finished opening: every HTTP/1 head is closed
by this client before sluice's `header_read_timeout` (10 s from accept)
would close it. During each flood a regular client sends `GET /ok` (a new connection,
`Connection: close`, 2 s timeout) every 200 ms and records what it got.
VmRSS (/proc/PID/status) is sampled every 100 ms from the first connection
on: peak during the flood (until the connections are closed), and the
reading `--after` seconds after they were closed; /proc/PID/smaps_rollup,
threads, FDs, sluice's client and upstream connections (/proc/PID/net/tcp)
and a few /metrics families at the end of the hold and at the after
reading, and there too (with gdb, `--no-gdb` to skip) glibc's
`malloc_stats()`: what malloc has mapped and what of it is in use (gdb
stops sluice for about half a second each time). Whether sluice is still
alive after each flood, and its exit status if not. Where the build
exports them, `sluice_head_bytes_held` and
`sluice_head_budget_refused_total{reason}` are scraped from the admin port
every 100 ms from the first connection to the after reading: the peak
held until the close (a sampled peak: a lower bound), and the refusals
by reason at the after reading. Per flood, what its connections (HTTP/1:
the status of an answer before the close, or held to it) and streams
(HTTP/2: response statuses, RST_STREAM codes, GOAWAY) got.

Order: in each round the scenarios run in turn, each on every build, the
builds' order alternating from one scenario (and round) to the next. No
pinning: sluice (two workers on this 2-core machine), the upstream and this
client share both CPUs; RSS does not depend on it. The client raises its
open-file limit (and so sluice's) to 65,536.

Load only ever targets 127.0.0.1; ports are free ones. Every process is
started here and stopped by its PID when the script ends, however it ends.
The report goes to results/headflood.md and results/headflood.json
(`--out DIR`, `--stem NAME`: DIR/NAME.md and DIR/NAME.json).
"""

import argparse
import asyncio
import concurrent.futures
import datetime
import errno
import json
import os
import platform
import re
import select
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

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)

# The upstream server runs as a child of this script (`--serve-upstream`)
# and needs nothing but the standard library; the rest imports the harness.
if __name__ == "__main__" and "--serve-upstream" in sys.argv:
    connflood = harness = tools = soak = Processes = None
else:
    import connflood  # noqa: E402
    import harness  # noqa: E402
    import soak  # noqa: E402
    import tools  # noqa: E402
    from tools import Processes  # noqa: E402

PAD_LINES = 60
PAD_VALUE_BYTES = 1000
WARMUP_CONNS = 32
WARMUP_REQUESTS = 10  # per warm-up connection
IDLE_IN_FLIGHT = 32  # the idle scenario's requests in flight at once
CONNECT_IN_FLIGHT = 256  # connects in progress at once (HTTP/1 flood)
# New connections per second, at most. Unpaced, a burst of connects to a
# listener with the backlog of 128 sluice has (tokio's) loses SYNs on this
# kernel even while every connection is accepted at once, and each lost
# SYN costs its 1 s retransmission: 2,000 connections took 5 s instead
# of 1 s.
CONNECT_RATE = 2000
PROBE_EVERY_S = 0.2
LINGER_S, LINGER_MAX_S = 5, 30  # the upstream's lingering close (nginx's defaults)
PROBE_TIMEOUT_S = 2.0
SAMPLE_EVERY_S = 0.1
OPEN_TIMEOUT_S = 30.0  # most time for a flood's opening phase
HOLD_AFTER_OPENING_S = 0.5  # a flood is held at least this long once opened
# RST_STREAM codes after which no more streams are opened on a connection.
REFUSING_CODES = {7, 11}  # REFUSED_STREAM, ENHANCE_YOUR_CALM
H2_OUTBUF_HIGH = 256 * 1024  # open no more streams while this much is unsent
SMAPS_KEYS = ("Rss", "Pss", "Private_Dirty", "Anonymous")
METRIC_FAMILIES = re.compile(
    r"^sluice_(requests_total|requests_refused_total|connections_refused|upstream_errors_total|"
    r"http2_|connections_open|runtime_alive_tasks|open_connections|connections|head_)")
HEAD_HELD = "sluice_head_bytes_held"
HEAD_REFUSED = "sluice_head_budget_refused_total"
HEAD_EVERY_S = 0.1  # how often the head gauge is scraped during a flood

CONFIG = """\
# Written by bench/headflood.py: one route on a limit never reached, every
# connection bound wide enough for one client to hold a flood.
version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  max_connections: 10000
  max_connections_per_ip: 10000
upstream:
  url: http://127.0.0.1:@@UPSTREAM_PORT@@
store:
  kind: memory
policies:
  open:
    algorithm: fixed-window
    limit: 1000000
    window: 1s
routes:
  - name: all
    match: { path_prefix: / }
    subject: client_ip
    policy: open
"""

H2_ERROR_NAMES = {
    0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
    4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM",
    8: "CANCEL", 9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM",
    12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED",
}


def log(msg):
    print(f"[headflood {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the upstream ------------------------------------------------------------------


def serve_upstream(port, slow_s):
    """The upstream: 200 `ok` on any path, after `slow_s` on /slow. Runs in
    its own process until stopped."""

    async def handle(reader, writer):
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                end = head.find(b"\r\n")
                parts = head[:end].split(b" ")
                path = parts[1] if len(parts) > 1 else b"/"
                low = head.lower()
                m = re.search(rb"\r\ntransfer-encoding:[^\r]*chunked", low)
                chunked = m is not None
                m = re.search(rb"\r\ncontent-length:\s*(\d+)", low)
                length = int(m.group(1)) if m and not chunked else 0
                if path.startswith(b"/slow"):
                    await asyncio.sleep(slow_s)
                if length:
                    await reader.readexactly(length)
                close = chunked or b"\r\nconnection: close" in low
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
                             + (b"Connection: close\r\n" if close else b"") + b"\r\nok\n")
                await writer.drain()
                if close:
                    if chunked:
                        # A body of unknown length, never read: a lingering
                        # close as nginx's (closing with unread data would
                        # reset the answer away): what comes is thrown
                        # away until LINGER_S of silence, LINGER_MAX_S in all.
                        try:
                            async with asyncio.timeout(LINGER_MAX_S):
                                while True:
                                    async with asyncio.timeout(LINGER_S):
                                        if not await reader.read(1 << 16):
                                            break
                        except (TimeoutError, ConnectionError):
                            pass
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port, limit=1 << 18, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


UPSTREAM_PID = [None]


def start_upstream(procs, workdir, slow_s):
    port = tools.free_port()
    logf = os.path.join(workdir, "upstream.log")
    proc = procs.start("upstream", [sys.executable, os.path.abspath(__file__), "--serve-upstream", str(port),
                                    "--slow-s", str(slow_s)], None, logf)
    if not tools.wait_tcp(port, proc):
        raise SystemExit(f"headflood: the upstream did not start: {tools.tail(logf)}")
    UPSTREAM_PID[0] = proc.pid
    return proc, port


# --- readings ------------------------------------------------------------------------


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


def metrics_of_interest(admin_port):
    """The /metrics series of a few families (non-zero only), name{labels}: value."""
    out = {}
    try:
        for name, labels, value in soak.scrape(admin_port):
            if value and METRIC_FAMILIES.match(name):
                key = name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else "")
                out[key] = out.get(key, 0) + value
    except (OSError, ValueError):
        pass
    return out


def reading(srv, metrics=True):
    """VmRSS, smaps_rollup, threads, FDs (and /metrics) of sluice now."""
    pid = srv.pid
    r = {"t_unix": round(time.time(), 2)}
    try:
        r["rss_kb"] = tools.rss_kb(pid)
        r["threads"] = len(os.listdir(f"/proc/{pid}/task"))
        r["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        r["rss_kb"] = None
    r.update(smaps_rollup(pid))
    try:
        r["client_conns"], r["upstream_conns"] = connflood.sockets(pid, srv.port, srv.upstream_port)
    except OSError:
        pass
    if metrics and srv.admin_port:
        r["metrics"] = metrics_of_interest(srv.admin_port)
    return r


def median_rss(pid, n=3, gap=0.3):
    vals = []
    for i in range(n):
        try:
            v = tools.rss_kb(pid)
        except OSError:
            v = None
        if v is not None:
            vals.append(v)
        if i + 1 < n:
            time.sleep(gap)
    return statistics.median(vals) if vals else None


class Sampler:
    """VmRSS of `pid` every 100 ms on a thread: (seconds since start, kB)."""

    def __init__(self, pid):
        self.pid = pid
        self.samples = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()

    def now(self):
        return time.monotonic() - self.t0

    def _run(self):
        while True:
            try:
                kb = tools.rss_kb(self.pid)
            except OSError:
                kb = None
            if kb is not None:
                self.samples.append((round(self.now(), 2), kb))
            if self._stop.wait(SAMPLE_EVERY_S):
                return

    def peak(self, until=None):
        vals = [kb for t, kb in self.samples if until is None or t <= until]
        return max(vals) if vals else None


class HeadSampler:
    """`sluice_head_bytes_held` and `sluice_head_budget_refused_total` from
    the admin port's /metrics every HEAD_EVERY_S on a thread, from the
    first connection of a flood to its after reading: (s, bytes held,
    {reason: refused}). A build without them gives nothing."""

    def __init__(self, admin_port, t0):
        self.admin_port, self.t0 = admin_port, t0
        self.samples = []
        self.errors = 0
        self.missing = False  # the gauge was not in /metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        if self.admin_port:
            self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self):
        while True:
            t = time.monotonic() - self.t0
            try:
                metrics = soak.scrape(self.admin_port)
            except (OSError, ValueError):
                self.errors += 1
                metrics = None
            if metrics is not None:
                held = [v for n, _, v in metrics if n == HEAD_HELD]
                if not held:
                    self.missing = True
                    return
                refused = {}
                for n, labels, v in metrics:
                    if n == HEAD_REFUSED:
                        refused[labels.get("reason", "?")] = refused.get(labels.get("reason", "?"), 0) + int(v)
                self.samples.append((round(t, 2), int(sum(held)), refused))
            if self._stop.wait(HEAD_EVERY_S):
                return

    def summary(self, until):
        """The peak held until `until` (s), when it was first reached, the
        last reading, the refusals at the last reading."""
        if self.missing or not self.samples:
            return {"reason": "no sluice_head_bytes_held in /metrics" if self.missing else "no scrape answered",
                    "scrape_errors": self.errors}
        during = [x for x in self.samples if x[0] <= until] or self.samples[:1]
        peak = max(during, key=lambda x: x[1])
        last = self.samples[-1]
        return {"peak_held_bytes": peak[1], "peak_at_s": peak[0], "last_held_bytes": last[1],
                "last_at_s": last[0], "refused": last[2], "scrapes": len(self.samples),
                "scrape_errors": self.errors, "timeline": [(t, h) for t, h, _ in self.samples[::2]]}


def gdb_malloc_stats(pid, logf):
    """glibc's malloc_stats() (into sluice's stderr, its log), through gdb:
    {system, in_use, arenas} in bytes, or {'reason': ...}. Pauses sluice
    for about a second; frees nothing."""
    if not shutil.which("gdb"):
        return {"reason": "no gdb"}
    offset = os.path.getsize(logf)
    argv = ["gdb", "-nx", "-batch", "-p", str(pid), "-ex", "call (void) malloc_stats()", "-ex", "detach"]
    t0 = time.monotonic()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"reason": "gdb timed out"}
    took = round(time.monotonic() - t0, 2)
    time.sleep(0.1)
    with open(logf, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    arenas = [{"arena": int(m.group(1)), "system": int(m.group(2)), "in_use": int(m.group(3))}
              for m in re.finditer(r"Arena (\d+):\s*system bytes\s*=\s*(\d+)\s*in use bytes\s*=\s*(\d+)", text)]
    total = re.search(r"Total \(incl\. mmap\):\s*system bytes\s*=\s*(\d+)\s*in use bytes\s*=\s*(\d+)", text)
    mmap = re.search(r"max mmap regions\s*=\s*(\d+)\s*max mmap bytes\s*=\s*(\d+)", text)
    if not total:
        return {"reason": "no malloc_stats output: " + (out.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return {"system": int(total.group(1)), "in_use": int(total.group(2)), "arenas": arenas,
            "max_mmap_bytes": int(mmap.group(2)) if mmap else None, "gdb_s": took}


# --- HTTP/1 clients -------------------------------------------------------------------


def read_response(sock):
    """(status, bytes read) of one HTTP/1.1 response with Content-Length on
    a blocking socket; raises OSError or ValueError."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a whole head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head[9:12])
    m = re.search(rb"\r\ncontent-length:\s*(\d+)", head.lower())
    need = int(m.group(1)) if m else 0
    while len(body) < need:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the body")
        body += chunk
    return status


def get(port, path, sock=None, close=False, timeout=5.0):
    """One GET; on `sock` (kept open) or a new connection. Returns (status, sock)."""
    own = sock is None
    if own:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    extra = b"Connection: close\r\n" if close else b""
    sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
    return read_response(sock), sock


def warm_up(port):
    """WARMUP_CONNS keep-alive connections, WARMUP_REQUESTS requests each;
    returns the statuses."""
    def one(_):
        got = {}
        sock = None
        try:
            for _ in range(WARMUP_REQUESTS):
                st, sock = get(port, "/x", sock)
                got[st] = got.get(st, 0) + 1
        except (OSError, ValueError) as e:
            got[type(e).__name__] = got.get(type(e).__name__, 0) + 1
        finally:
            if sock:
                sock.close()
        return got

    total = {}
    with concurrent.futures.ThreadPoolExecutor(WARMUP_CONNS) as ex:
        for got in ex.map(one, range(WARMUP_CONNS)):
            for k, v in got.items():
                total[str(k)] = total.get(str(k), 0) + v
    return total


class Prober:
    """A regular client: `GET /ok` on a new connection every 200 ms."""

    def __init__(self, port):
        self.port = port
        self.results = []  # (t, status or error, seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.summary()

    def _run(self):
        n = 0
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                st, sock = get(self.port, "/ok", close=True, timeout=PROBE_TIMEOUT_S)
                sock.close()
                got = str(st)
            except socket.timeout:
                got = "timeout"
            except (OSError, ValueError) as e:
                got = type(e).__name__
            self.results.append((round(t - self.t0, 2), got, round(time.monotonic() - t, 4)))
            n += 1
            delay = self.t0 + n * PROBE_EVERY_S - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)

    def summary(self):
        statuses = {}
        for _, got, _ in self.results:
            statuses[got] = statuses.get(got, 0) + 1
        lat = [s for _, got, s in self.results if got == "200"]
        return {"sent": len(self.results), "statuses": statuses,
                "max_s": max((s for _, _, s in self.results), default=None),
                "median_ok_s": statistics.median(lat) if lat else None,
                "not_200": [(t, got) for t, got, _ in self.results if got != "200"][:50]}


def idle_connections(srv, n):
    """`n` keep-alive connections, one complete GET /x each, left open."""
    socks = []
    statuses = {}
    lock = threading.Lock()

    def one(_):
        try:
            st, sock = get(srv.port, "/x")
        except (OSError, ValueError) as e:
            st, sock = type(e).__name__, None
        with lock:
            statuses[str(st)] = statuses.get(str(st), 0) + 1
            if sock:
                socks.append(sock)

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(IDLE_IN_FLIGHT) as ex:
        list(ex.map(one, range(n)))
    opened_s = round(time.monotonic() - t0, 2)
    time.sleep(1.0)
    rss = median_rss(srv.pid, 3, 0.5)
    r = reading(srv)
    still_open = sum(1 for s in socks if not _readable(s))
    for s in socks:
        s.close()
    return {"statuses": statuses, "held": len(socks), "still_open_at_reading": still_open,
            "opened_s": opened_s, "rss_kb": rss, "reading": r}


def _readable(sock):
    r, _, _ = select.select([sock], [], [], 0)
    return bool(r)


def pad_values(pad_bytes, per_entry, overhead, what):
    """The value lengths of pad entries that take exactly `pad_bytes` in
    all, each `overhead` bytes beside its value: PAD_VALUE_BYTES each, the
    last one shorter (or the last two, when what is left would not hold an
    entry with a value of at least one byte)."""
    if pad_bytes <= overhead:
        raise SystemExit(f"headflood: {what} too small for one pad entry")
    full = PAD_VALUE_BYTES + overhead
    n, rest = divmod(pad_bytes, full)
    values = [PAD_VALUE_BYTES] * n
    if rest > overhead:
        values.append(rest - overhead)
    elif rest:
        if not values:
            raise SystemExit(f"headflood: {what} too small for one pad entry")
        # Split the last full entry and what is left into two entries.
        values.pop()
        both = full + rest - 2 * overhead
        values += [both // 2, both - both // 2]
    if len(values) > 99:
        raise SystemExit(f"headflood: {what} needs more than 99 pad entries of {PAD_VALUE_BYTES:,} bytes")
    return values


H1_PREFIX = b"GET /x HTTP/1.1\r\nHost: x\r\n"
H1_LINE_OVERHEAD = len(b"X-Pad-00: \r\n")  # 12


def h1_payload(head_bytes=None):
    """A request head without its end: the request line, `Host`, then pad
    lines `X-Pad-NN: <value>`; PAD_LINES lines of PAD_VALUE_BYTES (60,746
    bytes) unless `head_bytes` asks for a size: then exactly that many
    bytes, lines of PAD_VALUE_BYTES and a shorter last one."""
    if head_bytes is None:
        values = [PAD_VALUE_BYTES] * PAD_LINES
    else:
        values = pad_values(head_bytes - len(H1_PREFIX), PAD_VALUE_BYTES, H1_LINE_OVERHEAD, "--h1-head-bytes")
    pad = b"".join(b"X-Pad-%02d: %s\r\n" % (i, ((b"%02d" % i) * (v // 2 + 1))[:v]) for i, v in enumerate(values))
    payload = H1_PREFIX + pad
    assert head_bytes is None or len(payload) == head_bytes, (len(payload), head_bytes)
    return payload


class H1Flood:
    """`n` connections each sending `payload` (a request head without its
    end), driven by epoll; what sluice sends back or does is recorded."""

    def __init__(self, port, n, payload):
        self.addr = ("127.0.0.1", port)
        self.n, self.payload = n, memoryview(payload)
        self.ep = select.epoll()
        self.conns = {}  # fd -> state dict
        self.started = 0
        self.connect_failed = 0
        self.sent_all = 0
        self.outcomes = {}  # what ended a connection before we closed it
        self.connecting = 0
        self.t0 = None

    def _start_more(self):
        if self.t0 is None:
            self.t0 = time.monotonic()
        allowed = int((time.monotonic() - self.t0) * CONNECT_RATE) + 1
        while self.started < min(self.n, allowed) and self.connecting < CONNECT_IN_FLIGHT:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            err = s.connect_ex(self.addr)
            self.started += 1
            if err not in (0, errno.EINPROGRESS):
                self.connect_failed += 1
                s.close()
                continue
            self.conns[s.fileno()] = {"sock": s, "state": "connecting", "off": 0}
            self.connecting += 1
            self.ep.register(s.fileno(), select.EPOLLOUT)

    def _end(self, fd, c, outcome):
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        c["state"] = "ended"
        c["outcome"] = outcome
        try:
            self.ep.unregister(fd)
        except OSError:
            pass

    def _read(self, fd, c):
        s = c["sock"]
        try:
            data = s.recv(65536)
        except BlockingIOError:
            return
        except OSError as e:
            self._end(fd, c, f"error: {errno.errorcode.get(e.errno, e.errno)}")
            return
        if not data:
            self._end(fd, c, "closed by sluice (no answer)")
        elif data.startswith(b"HTTP/1.1 ") or data.startswith(b"HTTP/1.0 "):
            self._end(fd, c, f"answered {data[9:12].decode('ascii', 'replace')}")
        else:
            self._end(fd, c, "answered garbage")

    def poll(self, timeout):
        self._start_more()
        if self.started < self.n:
            timeout = min(timeout, 0.002)
        for fd, ev in self.ep.poll(timeout):
            c = self.conns.get(fd)
            if not c or c["state"] == "ended":
                continue
            s = c["sock"]
            if c["state"] == "connecting":
                self.connecting -= 1
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self.connect_failed += 1
                    self._end(fd, c, "connect failed")
                    continue
                c["state"] = "sending"
            if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR | select.EPOLLRDHUP):
                self._read(fd, c)
                if c["state"] == "ended":
                    continue
            if c["state"] == "sending" and ev & select.EPOLLOUT:
                try:
                    while c["off"] < len(self.payload):
                        c["off"] += s.send(self.payload[c["off"]:])
                except BlockingIOError:
                    pass
                except OSError as e:
                    self._end(fd, c, f"error: {errno.errorcode.get(e.errno, e.errno)}")
                    continue
                if c["off"] >= len(self.payload):
                    c["state"] = "sent"
                    self.sent_all += 1
                    self.ep.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)

    def opening_done(self):
        return self.started >= self.n and all(c["state"] in ("sent", "ended") for c in self.conns.values())

    def held(self):
        return sum(1 for c in self.conns.values() if c["state"] == "sent")

    def close(self):
        for c in self.conns.values():
            c["sock"].close()
        self.ep.close()

    def summary(self):
        return {"started": self.started, "connect_failed": self.connect_failed, "sent_all": self.sent_all,
                "held_at_end": self.held(), "ended_before_close": self.outcomes}


# --- HTTP/2 client --------------------------------------------------------------------


H2_ENTRY_OVERHEAD = len(b"x-pad-00") + 32  # RFC 7541 §4.1: name + value + 32


def h2_pseudo(path):
    return [(b":method", b"GET"), (b":scheme", b"http"), (b":path", path), (b":authority", b"x")]


def h2_pad_values(path, list_bytes):
    """The pad headers' value lengths: PAD_LINES of PAD_VALUE_BYTES unless
    `list_bytes` asks for a header list of exactly that size (as RFC 7541
    counts it, the pseudo-headers of `path` included)."""
    if list_bytes is None:
        return [PAD_VALUE_BYTES] * PAD_LINES
    pseudo = sum(len(n) + len(v) + 32 for n, v in h2_pseudo(path))
    return pad_values(list_bytes - pseudo, PAD_VALUE_BYTES, H2_ENTRY_OVERHEAD, "--h2-list-bytes")


def hpack_block(path, huffman, list_bytes=None):
    """One HPACK header block for `GET path` with the pad headers: static
    table entries and literals without indexing only, so it is valid
    whatever the decoder's dynamic table holds, and can be sent again as is.
    The list is PAD_LINES headers of PAD_VALUE_BYTES, or exactly
    `list_bytes` as RFC 7541 counts it (h2_pad_values)."""
    from hpack.hpack import encode_integer
    from hpack.huffman import HuffmanEncoder
    from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

    coder = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)

    def string(b):
        if huffman:
            enc = coder.encode(b)
            out = encode_integer(len(enc), 7)
            out[0] |= 0x80
            return bytes(out) + enc
        return bytes(encode_integer(len(b), 7)) + b

    def literal_indexed_name(index, value):  # 0000xxxx: literal without indexing, indexed name
        return bytes(encode_integer(index, 4)) + string(value)

    def literal_new_name(name, value):
        return b"\x00" + string(name) + string(value)

    block = bytearray()
    block += b"\x82"  # :method GET (static 2)
    block += b"\x86"  # :scheme http (static 6)
    block += literal_indexed_name(4, path)  # :path
    block += literal_indexed_name(1, b"x")  # :authority
    # Values of characters with 5-bit Huffman codes: 1,000 bytes, 625 on the wire.
    alphabet = b"0123456789aceiost"
    names, size = [], 0
    for i, length in enumerate(h2_pad_values(path, list_bytes)):
        name = b"x-pad-%02d" % i
        value = bytes(alphabet[(i * 7 + j) % len(alphabet)] for j in range(length))
        block += literal_new_name(name, value)
        size += len(name) + len(value) + 32
        names.append(name)
    headers = h2_pseudo(path)
    size += sum(len(n) + len(v) + 32 for n, v in headers)
    assert list_bytes is None or size == list_bytes, (size, list_bytes)
    return bytes(block), size, headers


class FixedBlock:
    """Stands in for h2's HPACK encoder: every header list it is asked for
    is the one block encoded once (hpack in Python would spend seconds a
    flood re-encoding 60 KB per stream, and the client would become the
    bottleneck). The block never refers to the dynamic table; when the
    server's SETTINGS_HEADER_TABLE_SIZE changes, the next block starts with
    the dynamic table size update RFC 7541 §4.2 asks for."""

    def __init__(self, block):
        self.block = block
        self._size = 4096
        self._update = None

    @property
    def header_table_size(self):
        return self._size

    @header_table_size.setter
    def header_table_size(self, value):
        if value != self._size:
            self._size = value
            self._update = value

    def encode(self, headers, huffman=True):  # noqa: ARG002 - h2's call
        if self._update is None:
            return self.block
        from hpack.hpack import encode_integer

        prefix = encode_integer(min(self._update, 4096), 5)
        prefix[0] |= 0x20
        self._update = None
        return bytes(prefix) + self.block


class H2Conn:
    def __init__(self, index, sock, conn):
        self.index, self.sock, self.conn = index, sock, conn
        self.out = bytearray()
        self.ready = False  # the server's SETTINGS came
        self.stop_reason = None  # why no more streams are opened
        self.opened = 0
        self.max_concurrent = None
        self.rst = {}  # code name -> n
        self.responses = {}  # status -> n
        self.ended = 0  # streams the server ended (END_STREAM)
        self.goaway = None
        self.eof = False
        self.error = None
        self.first_open_t = None
        self.stop_t = None
        self.closed_streams = set()

    def summary(self):
        return {"opened": self.opened, "max_concurrent_streams": self.max_concurrent, "rst_stream": self.rst,
                "response_headers": self.responses, "server_ended_streams": self.ended, "goaway": self.goaway,
                "server_closed": self.eof, "error": self.error, "stopped_opening": self.stop_reason,
                "first_stream_at_s": self.first_open_t, "stopped_opening_at_s": self.stop_t,
                "open_at_end": self.opened - len(self.closed_streams)}


class H2Flood:
    """`n` HTTP/2 connections, each opening up to `streams` streams of the
    fixed header block with no END_STREAM."""

    def __init__(self, port, n, streams, path, huffman, list_bytes=None):
        import h2.config
        import h2.connection

        import h2.events
        import h2.exceptions

        self.h2 = h2.events
        self.h2_exceptions = h2.exceptions
        self.block, self.list_size, self.headers = hpack_block(path, huffman, list_bytes)
        self.streams = streams
        self.conns = []
        self.sel = select.epoll()
        self.by_fd = {}
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None, validate_outbound_headers=False,
                                        normalize_outbound_headers=False, validate_inbound_headers=False)
        for i in range(n):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError as e:
                c = H2Conn(i, None, None)
                c.error = f"connect: {e}"
                c.stop_reason = "connect failed"
                self.conns.append(c)
                continue
            s.setblocking(False)
            conn = h2.connection.H2Connection(config=cfg)
            conn.encoder = FixedBlock(self.block)
            conn.initiate_connection()
            # A large window: the responses' bodies must never wait on us.
            conn.increment_flow_control_window(2 ** 30)
            c = H2Conn(i, s, conn)
            c.out += conn.data_to_send()
            self.conns.append(c)
            self.by_fd[s.fileno()] = c
            self.sel.register(s.fileno(), select.EPOLLIN | select.EPOLLOUT)

    def _stop_opening(self, c, why, now):
        if c.stop_reason is None:
            c.stop_reason = why
            c.stop_t = now

    def _events(self, c, events, now):
        ev = self.h2
        for e in events:
            if isinstance(e, ev.RemoteSettingsChanged):
                c.ready = True
                s = c.conn.remote_settings
                c.max_concurrent = s.max_concurrent_streams
            elif isinstance(e, ev.ResponseReceived):
                status = next((v for k, v in e.headers if k == b":status"), b"?").decode("ascii", "replace")
                c.responses[status] = c.responses.get(status, 0) + 1
            elif isinstance(e, ev.StreamReset):
                code = int(e.error_code)
                name = H2_ERROR_NAMES.get(code, str(code))
                c.rst[name] = c.rst.get(name, 0) + 1
                c.closed_streams.add(e.stream_id)
                if code in REFUSING_CODES:
                    self._stop_opening(c, f"RST_STREAM {name}", now)
            elif isinstance(e, ev.StreamEnded):
                c.ended += 1
            elif isinstance(e, ev.DataReceived):
                if e.flow_controlled_length:
                    c.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, ev.ConnectionTerminated):
                code = int(e.error_code)
                c.goaway = {"code": H2_ERROR_NAMES.get(code, str(code)), "last_stream_id": e.last_stream_id,
                            "debug": (e.additional_data or b"")[:200].decode("utf-8", "replace")}
                self._stop_opening(c, "GOAWAY", now)

    def _open_streams(self, c, now):
        if not c.ready or c.stop_reason or c.conn is None:
            return
        while c.opened < self.streams and len(c.out) < H2_OUTBUF_HIGH:
            try:
                sid = c.conn.get_next_available_stream_id()
                c.conn.send_headers(sid, self.headers, end_stream=False)
            except self.h2_exceptions.TooManyStreamsError:
                self._stop_opening(c, "max concurrent streams reached", now)
                return
            except self.h2_exceptions.ProtocolError as e:
                self._stop_opening(c, f"h2: {type(e).__name__}", now)
                return
            c.opened += 1
            if c.first_open_t is None:
                c.first_open_t = now
            c.out += c.conn.data_to_send()
        if c.opened >= self.streams:
            self._stop_opening(c, f"{self.streams} streams opened", now)

    def _drop(self, c):
        try:
            self.sel.unregister(c.sock.fileno())
        except (OSError, ValueError):
            pass

    def poll(self, timeout, now):
        for c in self.conns:
            if c.sock is not None and not c.eof and c.error is None:
                self._open_streams(c, now)
                if c.out:
                    self._flush(c)
        for fd, ev in self.sel.poll(timeout):
            c = self.by_fd.get(fd)
            if c is None or c.eof or c.error:
                continue
            if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                self._read(c, now)
            if c.out and not c.eof and c.error is None:
                self._flush(c)

    def _read(self, c, now):
        while True:
            try:
                data = c.sock.recv(1 << 18)
            except BlockingIOError:
                return
            except OSError as e:
                c.error = f"recv: {errno.errorcode.get(e.errno, e.errno)}"
                self._stop_opening(c, "connection error", now)
                self._drop(c)
                return
            if not data:
                c.eof = True
                self._stop_opening(c, "closed by the server", now)
                self._drop(c)
                return
            try:
                events = c.conn.receive_data(data)
            except self.h2_exceptions.ProtocolError as e:
                c.error = f"h2: {type(e).__name__}: {e}"[:200]
                self._stop_opening(c, "h2 protocol error", now)
                self._events(c, [], now)
                self._drop(c)
                return
            self._events(c, events, now)
            c.out += c.conn.data_to_send()

    def _flush(self, c):
        try:
            n = c.sock.send(c.out)
            del c.out[:n]
        except BlockingIOError:
            pass
        except OSError as e:
            c.error = f"send: {errno.errorcode.get(e.errno, e.errno)}"
            self._drop(c)

    def opening_done(self):
        return all(c.stop_reason is not None for c in self.conns)

    def close(self):
        for c in self.conns:
            if c.sock is not None:
                c.sock.close()
        self.sel.close()

    def summary(self):
        per = [c.summary() for c in self.conns]

        def add(key):
            out = {}
            for p in per:
                for k, v in p[key].items():
                    out[k] = out.get(k, 0) + v
            return out

        stops, goaways = {}, {}
        for p in per:
            stops[p["stopped_opening"] or "still opening"] = stops.get(p["stopped_opening"] or "still opening", 0) + 1
            if p["goaway"]:
                goaways[p["goaway"]["code"]] = goaways.get(p["goaway"]["code"], 0) + 1
        opened = [p["opened"] for p in per]
        return {
            "connections": len(per),
            "header_list_bytes": self.list_size,
            "header_block_wire_bytes": len(self.block),
            "streams_opened": sum(opened),
            "streams_opened_per_conn": {"min": min(opened), "max": max(opened)} if opened else None,
            "max_concurrent_streams": sorted({p["max_concurrent_streams"] for p in per
                                              if p["max_concurrent_streams"] is not None}),
            "rst_stream": add("rst_stream"),
            "response_headers": add("response_headers"),
            "server_ended_streams": sum(p["server_ended_streams"] for p in per),
            "streams_open_at_end": sum(p["open_at_end"] for p in per),
            "goaway": goaways,
            "server_closed": sum(1 for p in per if p["server_closed"]),
            "errors": sorted({p["error"] for p in per if p["error"]})[:5],
            "stopped_opening": stops,
            "per_connection": per,
        }


# --- one flood ----------------------------------------------------------------------


def alive(srv):
    code = srv.proc.poll()
    return {"alive": code is None, "exit_status": code}


def flood(srv, kind, args):
    """One flood on `srv`: open, hold, close, wait `args.after`; returns its figures."""
    out = {"kind": kind}
    sampler = Sampler(srv.pid).start()
    heads = HeadSampler(srv.admin_port, sampler.t0).start()
    prober = Prober(srv.port).start()
    client = None
    try:
        if kind == "h1":
            client = H1Flood(srv.port, args.h1_conns, h1_payload(args.h1_head_bytes))
        elif kind == "h2":
            client = H2Flood(srv.port, args.h2_conns, args.h2_streams, b"/x", not args.h2_raw, args.h2_list_bytes)
        else:
            client = H2Flood(srv.port, args.h2_slow_conns, args.h2_streams, b"/slow", not args.h2_raw,
                             args.h2_list_bytes)
        t0, cpu0 = time.monotonic(), time.process_time()
        sluice_cpu0, upstream_cpu0 = tools.cpu_seconds(srv.pid), tools.cpu_seconds(srv.upstream_pid)
        while not client.opening_done() and time.monotonic() - t0 < OPEN_TIMEOUT_S:
            if kind == "h1":
                client.poll(0.05)
            else:
                client.poll(0.05, sampler.now())
        out["opening_s"] = round(time.monotonic() - t0, 2)
        out["opening_complete"] = client.opening_done()
        # Is the client the bottleneck? Its CPU (all its threads) and sluice's
        # over the opening.
        out["opening_cpu_s"] = {"client": round(time.process_time() - cpu0, 2),
                                "sluice": round(tools.cpu_seconds(srv.pid) - sluice_cpu0, 2),
                                "upstream": round(tools.cpu_seconds(srv.upstream_pid) - upstream_cpu0, 2)}
        # Held until `hold` seconds after the first connection, and at least
        # HOLD_AFTER_OPENING_S after the last byte: so the HTTP/1 heads are
        # all closed by this client before sluice's header_read_timeout
        # (10 s from accept) closes them itself.
        hold_end = max(t0 + args.hold, time.monotonic() + HOLD_AFTER_OPENING_S)
        while time.monotonic() < hold_end:
            if kind == "h1":
                client.poll(0.05)
            else:
                client.poll(0.05, sampler.now())
        out["end_of_hold"] = reading(srv)
        out["end_of_hold"]["alive"] = alive(srv)
        # The regular client stops here: gdb is about to stop sluice.
        out["probe"] = prober.stop()
        if args.gdb and srv.proc.poll() is None:
            out["malloc_end_of_hold"] = gdb_malloc_stats(srv.pid, srv.log)
        # A last look at what came in meanwhile, then every connection closed.
        if kind == "h1":
            client.poll(0)
        else:
            client.poll(0, sampler.now())
        out["client"] = client.summary()
    except BaseException:
        prober.stop()
        sampler.stop()
        heads.stop()
        raise
    finally:
        if client is not None:
            client.close()
    closed_at = sampler.now()
    out["peak_rss_kb"] = sampler.peak(until=closed_at)
    # When RSS first came within 1% of the peak (it creeps up by a few kB
    # after: timers, the gdb call).
    out["peak_at_s"] = next((t for t, kb in sampler.samples
                             if out["peak_rss_kb"] and kb >= 0.99 * out["peak_rss_kb"]), None)
    time.sleep(max(0.0, args.after - (sampler.now() - closed_at)))
    sampler.stop()
    heads.stop()
    out["head_budget"] = heads.summary(until=closed_at)
    out["after"] = reading(srv)
    out["after"]["alive"] = alive(srv)
    if args.gdb and srv.proc.poll() is None:
        out["malloc_after"] = gdb_malloc_stats(srv.pid, srv.log)
    out["after_s"] = round(sampler.now() - closed_at, 1)
    out["closed_at_s"] = round(closed_at, 2)
    out["rss_timeline"] = sampler.samples[::5]  # every 0.5 s
    return out


# --- a run --------------------------------------------------------------------------


def label_of(spec):
    if "=" in spec and not os.path.exists(spec):
        name, path = spec.split("=", 1)
        return name, path
    parts = os.path.abspath(spec).split(os.sep)
    if "target" in parts and parts.index("target") > 0:
        return parts[parts.index("target") - 1], spec
    return os.path.basename(spec), spec


def build_info(path):
    info = {"path": path}
    try:
        info["version"] = subprocess.run([path, "--version"], capture_output=True, text=True,
                                         timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["version"] = None
    info["mtime"] = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")
    parts = os.path.abspath(path).split(os.sep)
    if "target" in parts:
        repo = os.sep.join(parts[:parts.index("target")]) or "/"
        rev = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no", "--", "src",
                                "Cargo.toml", "Cargo.lock"], capture_output=True, text=True)
        if rev.returncode == 0:
            info["work_tree"] = repo
            info["commit"] = rev.stdout.strip()
            info["src_modified"] = bool(dirty.stdout.strip())
            info["src_newer_than_binary"] = newer_sources(repo, os.path.getmtime(path))
    return info


def newer_sources(repo, mtime):
    """The files of src/ and Cargo.* changed after the binary was built: the
    commit named beside a build is only its source when there are none."""
    out = []
    for top in ("src", "Cargo.toml", "Cargo.lock"):
        base = os.path.join(repo, top)
        walk = os.walk(base) if os.path.isdir(base) else [(repo, [], [top])] if os.path.exists(base) else []
        for d, _, files in walk:
            for f in files:
                full = os.path.join(d, f)
                if os.path.getmtime(full) > mtime:
                    out.append(os.path.relpath(full, repo))
    return sorted(out)[:20]


def start(procs, workdir, binary, name, upstream_port):
    conf = os.path.join(workdir, "headflood.yaml.in")
    srv = harness.start_sluice(procs, workdir, binary, name, conf, UPSTREAM_PORT=upstream_port)
    if srv.reason:
        raise RuntimeError(srv.reason)
    srv.log = os.path.join(workdir, f"{name}.log")
    srv.upstream_port = upstream_port
    srv.upstream_pid = UPSTREAM_PID[0]
    return srv


def stop(procs, srv):
    # Nothing to flush in sluice on the memory store: SIGKILL spares the
    # shutdown delay (5 s) per start.
    procs.stop(srv.proc, sig=signal.SIGKILL)


def run_one(procs, workdir, args, label, binary, scenario, upstream_port, tag):
    name = f"{label}-{scenario}-{tag}"
    srv = start(procs, workdir, binary, name, upstream_port)
    try:
        res = {"scenario": scenario, "build": label, "round": tag}
        res["warmup"] = warm_up(srv.port)
        time.sleep(0.5)
        res["idle_rss_kb"] = median_rss(srv.pid)
        res["idle"] = reading(srv)
        if scenario == "idle":
            res["idle_conns"] = idle_connections(srv, args.idle_conns)
            res["idle_conns"]["alive"] = alive(srv)
        else:
            res["flood"] = flood(srv, scenario, args)
        res["log_tail"] = tools.tail(srv.log, 5)
        return res
    finally:
        stop(procs, srv)


SCENARIOS = ("idle", "h1", "h2", "h2-slow")


def session(procs, workdir, args, builds):
    with open(os.path.join(workdir, "headflood.yaml.in"), "w") as f:
        f.write(CONFIG)
    notes = []
    for label, path in builds:
        conf = os.path.join(workdir, f"check-{label}.yaml")
        harness.render(os.path.join(workdir, "headflood.yaml.in"), conf, UPSTREAM_PORT=1)
        check = subprocess.run([path, "check", "--config", conf], capture_output=True, text=True)
        if check.returncode != 0:
            raise SystemExit(f"headflood: `{path} check` refused the configuration: "
                             f"{(check.stderr or check.stdout).strip()[:400]}")
    upstream, upstream_port = start_upstream(procs, workdir, args.slow_s)
    scenarios = [s for s in SCENARIOS if s in args.scenarios.split(",")]
    runs = []
    step = 0
    for r in range(args.rounds):
        for scn in scenarios:
            order = builds if step % 2 == 0 else list(reversed(builds))
            step += 1
            for label, path in order:
                log(f"round {r + 1}: {scn} on {label}")
                try:
                    res = run_one(procs, workdir, args, label, path, scn, upstream_port, f"r{r + 1}")
                except RuntimeError as e:
                    res = {"scenario": scn, "build": label, "round": f"r{r + 1}", "reason": str(e)}
                    log(f"  not run: {e}")
                runs.append(res)
                log("  " + one_line(res))
                if upstream.poll() is not None:
                    raise SystemExit(f"headflood: the upstream exited ({upstream.poll()}): "
                                     f"{tools.tail(os.path.join(workdir, 'upstream.log'))}")
    return {
        "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 bench/headflood.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "builds": {label: build_info(path) for label, path in builds},
        "settings": {k: getattr(args, k) for k in ("rounds", "idle_conns", "h1_conns", "h2_conns", "h2_slow_conns",
                                                    "h2_streams", "hold", "after", "slow_s", "h2_raw", "gdb")}
        | {"scenarios": scenarios, "pad_value_bytes": PAD_VALUE_BYTES,
           "pad_lines": len(h1_payload(args.h1_head_bytes).split(b"\r\n")) - 3,
           "h1_head_bytes": len(h1_payload(args.h1_head_bytes)),
           "h1_head_bytes_asked": args.h1_head_bytes, "h2_list_bytes_asked": args.h2_list_bytes,
           "h2_list_bytes": {p: hpack_block(p.encode(), not args.h2_raw, args.h2_list_bytes)[1]
                             for p in ("/x", "/slow")},
           "config": CONFIG},
        "runs": runs,
        "notes": notes + auto_notes(runs),
    }


def auto_notes(runs):
    """What a reader must not miss: a build that died, a regular request
    not answered 200, a flood that did not open whole, and what bounds the
    HTTP/2 flood's peak on a path answered at once."""
    notes = []
    for x in runs:
        tag = f"{x['build']}, {x['scenario']}, {x['round']}"
        if x.get("reason"):
            notes.append(f"{tag}: not run: {x['reason']}")
            continue
        f = x.get("flood")
        if not f:
            continue
        for when in ("end_of_hold", "after"):
            a = f[when]["alive"]
            if not a["alive"]:
                notes.append(f"{tag}: **sluice had exited** by the {when.replace('_', ' ')} reading "
                             f"(exit status {a['exit_status']}; negative: killed by that signal).")
                break
        bad = {k: v for k, v in f["probe"]["statuses"].items() if k != "200"}
        if bad:
            notes.append(f"{tag}: the regular `GET /ok` got {counts(bad)} of {f['probe']['sent']}.")
        if not f["opening_complete"]:
            notes.append(f"{tag}: the flood had not finished opening after {OPEN_TIMEOUT_S:.0f} s.")
        c = f.get("client") or {}
        if c.get("streams_open_at_end") and c.get("response_headers"):
            m = f.get("malloc_end_of_hold") or {}
            notes.append(f"{tag}: {sum(c['response_headers'].values()):,} streams were answered before the close, "
                         f"so (end-of-hold RSS − idle) ÷ the {c['streams_open_at_end']:,} still open counts what "
                         "the answered ones left freed but not given back to the system"
                         + (f" (malloc had {m['in_use'] / 1048576:.1f} MB in use of {m['system'] / 1048576:.1f} "
                            "MB mapped then)" if "in_use" in m else "") + ".")
    quick = [x for x in runs if x.get("scenario") == "h2" and x.get("flood")]
    if quick and all(x["flood"]["client"]["streams_open_at_end"] == 0 for x in quick):
        notes.append("HTTP/2 flood on `/x`: every stream was answered and closed while the flood went on, so its "
                     "peak measures the streams in flight at once (how fast sluice and this upstream answer), not "
                     "10,240 held header lists; the slow path holds every stream it opens "
                     "(`--h2-slow-conns 80` holds as many as the `/x` flood opens).")
    return notes


def one_line(res):
    if res.get("reason"):
        return f"not run: {res['reason']}"
    s = f"idle {mb(res['idle_rss_kb'])} MB"
    if "idle_conns" in res:
        ic = res["idle_conns"]
        s += f"; {ic['held']} held, {mb(ic['rss_kb'])} MB, statuses {ic['statuses']}"
    if "flood" in res:
        f = res["flood"]
        s += (f"; peak {mb(f['peak_rss_kb'])} MB, after {f['after_s']} s {mb(f['after']['rss_kb'])} MB, "
              f"alive {f['after']['alive']['alive']}, probe {f['probe']['statuses']}")
        hb = f.get("head_budget") or {}
        if "peak_held_bytes" in hb:
            s += f"; head budget refused {hb['refused']}, peak held {hb['peak_held_bytes']:,} B"
        c = f["client"]
        if "streams_opened" in c:
            s += (f"; streams {c['streams_opened']}, rst {c['rst_stream']}, responses {c['response_headers']}, "
                  f"goaway {c['goaway']}")
        else:
            s += f"; sent {c['sent_all']}/{c['started']}, ended {c['ended_before_close']}"
    return s


def machine():
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            mem = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        mem = None
    glibc = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    try:
        import h2
        h2v = h2.__version__
    except ImportError:
        h2v = None
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": platform.release(), "memory_gib": mem,
            "glibc": glibc[0] if glibc else None, "python": platform.python_version(), "h2": h2v,
            "loadavg_at_start": os.getloadavg()}


# --- the report ---------------------------------------------------------------------


def mb(kb):
    return "—" if kb is None else f"{kb / 1024:.1f}"


def fmt_range(vals, fn=mb):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "—"
    if len(vals) == 1:
        return fn(vals[0])
    return f"{fn(statistics.median(vals))} ({fn(min(vals))}–{fn(max(vals))})"


def counts(d):
    return ", ".join(f"{k}×{v:,}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) if d else "none"


def merge_counts(ds):
    out = {}
    for d in ds:
        for k, v in (d or {}).items():
            out[k] = out.get(k, 0) + v
    return out


def per_build(result):
    """{build: {"idle": [runs], kind: [runs]}}: the runs that ran, by scenario."""
    out = {}
    for label in result["builds"]:
        by = {}
        for x in result["runs"]:
            if x["build"] == label and not x.get("reason"):
                by.setdefault(x["scenario"], []).append(x)
        out[label] = by
    return out


def malloc_text(m):
    if not m:
        return "—"
    if "system" not in m:
        return m.get("reason", "—")
    return f"{m['system'] / 1048576:.1f} / {m['in_use'] / 1048576:.1f}"


def markdown(result):
    st = result["settings"]
    m = result["machine"]
    labels = list(result["builds"])
    runs = per_build(result)
    lines = [
        f"# sluice request-head floods: memory and answers — {result['generated_at']}",
        "",
        f"**Machine:** {m['cpu_model']}, nproc {m['nproc']}, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"{m['glibc']}, Python {m['python']}, h2 {m['h2']}; load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}.  ",
    ]
    for label, b in result["builds"].items():
        where = (f"work tree `{b['work_tree']}` at {b['commit']}"
                 + (" with changes to src/ or Cargo.* not committed" if b.get("src_modified") else "")
                 + (f"; **built before the last change to** {', '.join(f'`{x}`' for x in b['src_newer_than_binary'])}"
                    ", so not necessarily of that commit" if b.get("src_newer_than_binary") else "")) \
            if b.get("commit") else ""
        lines.append(f"**{label}:** `{b['path']}` ({b['version']}, built {b['mtime']}{'; ' + where if where else ''}).  ")
    lines += [
        f"**Command:** `{result['command']}`; whole run {result.get('elapsed_s', '—')} s, "
        f"{st['rounds']} round(s); a fresh sluice per scenario and build; with more than one round a figure is "
        f"the median (min–max).",
        "",
        f"**Method** (bench/headflood.py's docstring has it all): the configuration at the end, `workers: 0` (two "
        f"workers here), every other setting at the build's default (`max_header_bytes`, and the budget "
        f"`request_heads` where the build has one); idle = VmRSS after {WARMUP_CONNS * WARMUP_REQUESTS} warm-up "
        f"requests. *Idle connections*: "
        f"{st['idle_conns']:,} keep-alive connections, one `GET /x` each (200), left open. *HTTP/1 flood*: "
        f"{st['h1_conns']:,} connections, each a request line, `Host` and {st['pad_lines']} `X-Pad-NN` lines of "
        f"{st['pad_value_bytes']:,} bytes at most ({st['h1_head_bytes']:,} bytes) and never the empty line. "
        f"*HTTP/2 flood*: "
        f"{st['h2_conns']} h2c connections, up to {st['h2_streams']} streams each (header list "
        f"{h2_list_bytes(result)}, no END_STREAM) on `/x`, which the upstream answers at once; *slow path*: "
        f"{st['h2_slow_conns']} connections on `/slow`, answered after {st['slow_s']:.0f} s. Each flood closed "
        f"{st['hold']:.0f} s after its first connection; peak = highest VmRSS sampled every 100 ms until the close; "
        f"after = VmRSS {st['after']:.0f} s after the close. A regular client sent `GET /ok` every 200 ms "
        f"throughout each flood, until the end of the hold.",
        "",
        "| | " + " | ".join(labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]

    def row(title, fn):
        vals = []
        for lb in labels:
            try:
                vals.append(fn(runs[lb]))
            except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError):
                vals.append("—")
        lines.append(f"| {title} | " + " | ".join(vals) + " |")

    def each(r, kind, fn):
        """fn over the runs of `kind`: the median (min–max) of what it gives."""
        return [fn(x) for x in r[kind]]

    def per_1000(x):
        ic = x["idle_conns"]
        return (ic["rss_kb"] - x["idle_rss_kb"]) * 1000 / ic["held"]

    row("idle RSS, MB (median, min–max, of every fresh start)",
        lambda r: fmt_range([x["idle_rss_kb"] for k in r for x in r[k]]))
    row(f"RSS with {st['idle_conns']:,} idle HTTP/1 connections open, MB",
        lambda r: fmt_range(each(r, "idle", lambda x: x["idle_conns"]["rss_kb"])))
    row("**RSS per 1,000 idle HTTP/1 connections, MB**",
        lambda r: "**" + fmt_range(each(r, "idle", per_1000)) + "**")
    row("idle connections held / answered",
        lambda r: " · ".join(f"{x['idle_conns']['held']:,} / {counts(x['idle_conns']['statuses'])}" for x in r["idle"]))
    for k, title in (("h1", f"HTTP/1 partial heads, {st['h1_conns']:,} conns"),
                     ("h2", f"HTTP/2 header lists, {st['h2_conns']} conns"),
                     ("h2-slow", f"HTTP/2 header lists, slow path, {st['h2_slow_conns']} conns")):
        if not any(k in runs[lb] for lb in labels):
            continue
        row(f"**{title}: peak RSS, MB**",
            lambda r, k=k: "**" + fmt_range(each(r, k, lambda x: x["flood"]["peak_rss_kb"])) + "**")
        row(f"{title}: RSS {st['after']:.0f} s after the close, MB",
            lambda r, k=k: fmt_range(each(r, k, lambda x: x["flood"]["after"]["rss_kb"])))
        row(f"{title}: what the flood got", lambda r, k=k: " · ".join(flood_got(x) for x in r[k]))
        row(f"{title}: head-budget refusals by reason; peak `{HEAD_HELD}`", lambda r, k=k: " · ".join(
            budget_text(x) for x in r[k]))
        row(f"{title}: sluice alive after", lambda r, k=k: ", ".join(
            "yes" if a["alive"] else f"**no** (exit status {a['exit_status']})"
            for a in each(r, k, lambda x: x["flood"]["after"]["alive"])))
        row(f"{title}: `GET /ok` answers", lambda r, k=k: counts(merge_counts(
            each(r, k, lambda x: x["flood"]["probe"]["statuses"]))) + "; slowest " + fmt_range(
            each(r, k, lambda x: x["flood"]["probe"]["max_s"]), lambda v: f"{v * 1000:.0f} ms"))
    lines.append("")

    def common_rows(k):
        row("opening took, s (CPU s meanwhile: client / sluice / upstream)", lambda r: " · ".join(
            f"{x['flood']['opening_s']:.1f} ({x['flood']['opening_cpu_s']['client']:.1f} / "
            f"{x['flood']['opening_cpu_s']['sluice']:.1f} / {x['flood']['opening_cpu_s']['upstream']:.1f})"
            for x in r[k]))
        row("held, s from the first connection to the close", lambda r: " · ".join(
            f"{x['flood']['closed_at_s']:.1f}" for x in r[k]))
        row("peak − idle, MB (within 1% of the peak from, s after the first connection)", lambda r: " · ".join(
            f"{mb(x['flood']['peak_rss_kb'] - x['idle_rss_kb'])} ({x['flood']['peak_at_s']:.1f})" for x in r[k]))
        row("end of the hold: RSS / Anonymous, MB", lambda r: " · ".join(
            f"{mb(x['flood']['end_of_hold'].get('rss_kb'))} / {mb(x['flood']['end_of_hold'].get('Anonymous_kb'))}"
            for x in r[k]))
        row("end of the hold: malloc mapped / in use, MB", lambda r: " · ".join(
            malloc_text(x["flood"].get("malloc_end_of_hold")) for x in r[k]))
        row("end of the hold: client / upstream connections, FDs, threads", lambda r: " · ".join(
            f"{x['flood']['end_of_hold'].get('client_conns')} / {x['flood']['end_of_hold'].get('upstream_conns')}, "
            f"{x['flood']['end_of_hold'].get('fds')}, {x['flood']['end_of_hold'].get('threads')}" for x in r[k]))
        row(f"{st['after']:.0f} s after: malloc mapped / in use, MB", lambda r: " · ".join(
            malloc_text(x["flood"].get("malloc_after")) for x in r[k]))
        row(f"{st['after']:.0f} s after: client / upstream connections, FDs", lambda r: " · ".join(
            f"{x['flood']['after'].get('client_conns')} / {x['flood']['after'].get('upstream_conns')}, "
            f"{x['flood']['after'].get('fds')}" for x in r[k]))
        row(f"`{HEAD_HELD}`: peak, MB (s after the first connection) / at the after reading", lambda r: " · ".join(
            head_held_text(x) for x in r[k]))
        row(f"`{HEAD_REFUSED}` by reason, at the after reading", lambda r: " · ".join(
            (counts(nonzero(x["flood"]["head_budget"].get("refused"))) if "peak_held_bytes" in
             (x["flood"].get("head_budget") or {}) else "—") for x in r[k]))
        row("`GET /ok`: not 200 (s after the first connection: what)", lambda r: " · ".join(
            (", ".join(f"{t:.1f}: {g}" for t, g in x["flood"]["probe"]["not_200"][:6]) or "none") for x in r[k]))

    if any("h1" in runs[lb] for lb in labels):
        lines += ["## HTTP/1 partial-head flood", "", "| | " + " | ".join(labels) + " |",
                  "|---|" + "---:|" * len(labels)]
        row("connections opened / whole partial head sent", lambda r: " · ".join(
            f"{x['flood']['client']['started'] - x['flood']['client']['connect_failed']:,} / "
            f"{x['flood']['client']['sent_all']:,}" for x in r["h1"]))
        row("still held at the end of the hold", lambda r: " · ".join(
            f"{x['flood']['client']['held_at_end']:,}" for x in r["h1"]))
        row("ended by sluice before the close", lambda r: counts(merge_counts(
            x["flood"]["client"]["ended_before_close"] for x in r["h1"])))
        row("(peak − idle) ÷ connections, KB", lambda r: " · ".join(
            f"{(x['flood']['peak_rss_kb'] - x['idle_rss_kb']) / max(1, x['flood']['client']['sent_all']):.0f}"
            for x in r["h1"]))
        common_rows("h1")
        lines.append("")
    for k, title in (("h2", "HTTP/2 header-list flood"), ("h2-slow", "HTTP/2 header-list flood, slow path")):
        if not any(k in runs[lb] for lb in labels):
            continue
        lines += [f"## {title}", "", "| | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
        cl = lambda x: x["flood"]["client"]  # noqa: E731
        row("server's SETTINGS_MAX_CONCURRENT_STREAMS", lambda r, k=k: ", ".join(sorted(
            {str(v) for x in r[k] for v in cl(x)["max_concurrent_streams"]})) or "—")
        row("streams opened (per connection min–max)", lambda r, k=k: " · ".join(
            f"{cl(x)['streams_opened']:,} ({cl(x)['streams_opened_per_conn']['min']}–"
            f"{cl(x)['streams_opened_per_conn']['max']})" for x in r[k]))
        row("response HEADERS by status", lambda r, k=k: counts(merge_counts(
            cl(x)["response_headers"] for x in r[k])))
        row("RST_STREAM by code", lambda r, k=k: counts(merge_counts(cl(x)["rst_stream"] for x in r[k])))
        row("streams the server ended (END_STREAM)", lambda r, k=k: " · ".join(
            f"{cl(x)['server_ended_streams']:,}" for x in r[k]))
        row("streams still open at the close (neither reset nor refused)", lambda r, k=k: " · ".join(
            f"{cl(x)['streams_open_at_end']:,}" for x in r[k]))
        row("GOAWAY (connections, by code)", lambda r, k=k: counts(merge_counts(cl(x)["goaway"] for x in r[k])))
        row("connections closed by the server / errors", lambda r, k=k: " · ".join(
            f"{cl(x)['server_closed']} / {'; '.join(cl(x)['errors']) or 'none'}" for x in r[k]))
        row("why opening stopped (connections)", lambda r, k=k: counts(merge_counts(
            cl(x)["stopped_opening"] for x in r[k])))
        row("(end-of-hold RSS − idle) ÷ streams open then, KB", lambda r, k=k: " · ".join(
            (f"{(x['flood']['end_of_hold']['rss_kb'] - x['idle_rss_kb']) / cl(x)['streams_open_at_end']:.0f}"
             if cl(x)["streams_open_at_end"] else "—") for x in r[k]))
        common_rows(k)
        lines.append("")
    lines += ["Where a cell has several values separated by ·, they are the rounds in order. *Anonymous*: from "
              "/proc/PID/smaps_rollup. *malloc mapped / in use*: glibc's `malloc_stats()` through gdb: what malloc "
              "holds from the system, and what of it is allocated now. *Client / upstream connections*: sluice's "
              "TCP sockets on its traffic port, and to the upstream (/proc/PID/net/tcp).", ""]
    lines += ["## Configuration", "", "```yaml", st["config"].replace("@@UPSTREAM_PORT@@", "PORT").rstrip(), "```", ""]
    if result.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def flood_got(x):
    """What the flood's connections (HTTP/1) or streams (HTTP/2) got from sluice."""
    c = x["flood"]["client"]
    if "streams_opened" in c:
        text = (f"{c['streams_opened']:,} streams: HEADERS {counts(c['response_headers'])}; "
                f"RST_STREAM {counts(c['rst_stream'])}")
        if c["goaway"]:
            text += f"; GOAWAY {counts(c['goaway'])}"
        if c["streams_open_at_end"]:
            text += f"; {c['streams_open_at_end']:,} still open at the close"
        return text
    ended = c["ended_before_close"]
    return (f"{c['started'] - c['connect_failed']:,} conns: {counts(ended) if ended else 'none answered'}"
            f"; {c['held_at_end']:,} held to the close")


def nonzero(d):
    return {k: v for k, v in (d or {}).items() if v}


def budget_text(x):
    hb = x["flood"].get("head_budget") or {}
    if "peak_held_bytes" not in hb:
        return "— (no such metric)" if "metric" in hb.get("reason", "") else "—"
    return (f"{counts(nonzero(hb['refused'])) or 'none'}; "
            f"peak {hb['peak_held_bytes'] / 1048576:.1f} MiB")


def head_held_text(x):
    hb = x["flood"].get("head_budget") or {}
    if "peak_held_bytes" not in hb:
        return "—"
    return (f"{hb['peak_held_bytes'] / 1048576:.2f} ({hb['peak_at_s']:.1f}) / "
            f"{hb['last_held_bytes'] / 1048576:.2f}")


def h2_list_bytes(result):
    sizes = result["settings"].get("h2_list_bytes")
    if sizes:
        return (f"{sizes['/x']:,} bytes as RFC 7541 counts it on `/x`, {sizes['/slow']:,} on `/slow`"
                + ("" if result["settings"].get("h2_list_bytes_asked") is None else " (`--h2-list-bytes`)"))
    for x in result["runs"]:
        c = (x.get("flood") or {}).get("client") or {}
        if "header_list_bytes" in c:
            return (f"{c['header_list_bytes']:,} bytes as RFC 7541 counts it, "
                    f"{c['header_block_wire_bytes']:,} bytes of HPACK on the wire")
    return "about 62 KB"


def main():
    if "--serve-upstream" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--serve-upstream", type=int, required=True)
        ap.add_argument("--slow-s", type=float, default=30.0)
        a = ap.parse_args()
        serve_upstream(a.serve_upstream, a.slow_s)
        return
    ap = argparse.ArgumentParser(description="Request-head floods: what sluice holds in memory for heads that "
                                             "never finish, and whether it keeps answering; builds side by side.")
    ap.add_argument("--sluice", action="append", metavar="[NAME=]PATH",
                    help="a sluice binary; give it once per build (default: target/release/sluice)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="of " + ",".join(SCENARIOS))
    ap.add_argument("--idle-conns", type=int, default=1000)
    ap.add_argument("--h1-conns", type=int, default=2000)
    ap.add_argument("--h2-conns", type=int, default=80)
    ap.add_argument("--h2-slow-conns", type=int, default=10)
    ap.add_argument("--h2-streams", type=int, default=128, help="most streams opened per connection")
    ap.add_argument("--h2-raw", action="store_true", help="HPACK literals without Huffman coding")
    ap.add_argument("--h1-head-bytes", type=int, default=None, metavar="N",
                    help="size of the HTTP/1 flood's partial head, exactly (default: 60 lines of 1,000 bytes, "
                         "60,746 bytes)")
    ap.add_argument("--h2-list-bytes", type=int, default=None, metavar="N",
                    help="size of the HTTP/2 floods' header lists as RFC 7541 counts them, exactly (default: 60 "
                         "headers of 1,000 bytes, 62,567 bytes on /x, 62,570 on /slow)")
    ap.add_argument("--hold", type=float, default=8.0,
                    help="seconds from a flood's first connection to its close (at least 0.5 s after it opened)")
    ap.add_argument("--after", type=float, default=15.0, help="seconds after the close for the after reading")
    ap.add_argument("--slow-s", type=float, default=30.0, help="how long the upstream takes on /slow")
    ap.add_argument("--no-gdb", dest="gdb", action="store_false", help="no malloc_stats() through gdb")
    ap.add_argument("--out", default=os.path.join(BENCH, "results"), help="the report's directory")
    ap.add_argument("--stem", default="headflood", help="the report's file names: STEM.md and STEM.json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs)")
    ap.add_argument("--render", metavar="SAVED.json", help="only render a saved result as markdown, to stdout")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            print(markdown(json.load(f)))
        return
    h1_payload(args.h1_head_bytes)  # a size no pad can make exits here, before anything starts
    for path in (b"/x", b"/slow"):
        h2_pad_values(path, args.h2_list_bytes)
    specs = args.sluice or [os.path.join(ROOT, "target", "release", "sluice")]
    builds = [label_of(s) for s in specs]
    seen = set()
    for i, (label, path) in enumerate(builds):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"headflood: no sluice binary at {path}")
        if label in seen:
            builds[i] = (f"{label}-{i + 1}", path)
        seen.add(builds[i][0])
    try:
        import h2  # noqa: F401
    except ImportError:
        raise SystemExit("headflood: the Python `h2` library is missing: pip install h2")
    if args.gdb and not shutil.which("gdb"):
        args.gdb = False

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    harness.raise_fd_limit()  # inherited by sluice
    harness.CPU_PROXY = None  # no pinning (taskset) for sluice
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-headflood-")
    started = time.monotonic()
    try:
        result = session(procs, workdir, args, builds)
    finally:
        procs.stop_all()
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    md = markdown(result)
    with open(os.path.join(args.out, args.stem + ".md"), "w") as f:
        f.write(md)
    print(md)
    log(f"written: {os.path.relpath(os.path.join(args.out, args.stem + '.md'), os.getcwd())} and {args.stem}.json "
        f"({result['elapsed_s']} s)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); every started process was stopped")
        sys.exit(130)
