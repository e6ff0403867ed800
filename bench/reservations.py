#!/usr/bin/env python3
"""Limits charged on response, side by side in one run: what reserving a
unit before forwarding (and giving it back when the answer charges
nothing) costs, against a build that only checked before forwarding.

    python3 bench/reservations.py --sluice before=/work/before/target/release/sluice \\
        --sluice after=target/release/sluice [--seconds 5] [--rounds 2]

Each build gets a fresh sluice and a fresh redis-server per scenario, the
same configuration: the Redis store (budget 25 ms), one route `/login`
charged on response (`charge: { on: response, statuses: [401] }`) by
`client_ip`, in front of an upstream of this script's own (asyncio, one
process) that answers `/login?status=S&ms=M` with status S after M ms.
All load comes from 127.0.0.1: one subject.

Scenarios:

- `successes`: `wrk -c 16` for `--seconds` on `/login?status=200` against a
  limit of 10^9 an hour (never reached): requests a second, Redis calls a
  request (INFO commandstats), sluice CPU microseconds a request.
- `burst-N`: N clients at once (N in 3, 5, 10, 20), each logging in
  successfully (`status=200`, the app taking 100 ms) as fast as answered
  (a 429 retried at once) for `--seconds`, against a limit of 5 an hour:
  successful logins a second. What a NAT'd office pays for exact
  brute-force limits: at most `limit` logins of one subject in progress
  at once.
- `guesses`: 100 failed logins at once (`status=401`, 300 ms) against a
  limit of 5 an hour: how many reached the app.
- `hang-ups`: 12 clients one after another, each gone 0.2 s after sending
  `GET /slow` (the app takes 4 s; `subject: global`, in-flight limit 3):
  the most requests the app had in progress at once (it does not notice a
  client that left, as Werkzeug, gunicorn or Puma do not). Then 30 failed
  logins (the app answers after 1 s), each client gone at 0.3 s: the 31st
  login's status (429 when the hung-up failures were charged).

The report goes to stdout and `bench/results/<stem>.md`.
"""

import argparse
import asyncio
import http.client
import json
import os
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tools  # noqa: E402


def serve_upstream(port):
    """200 (or `status`) after `ms` milliseconds, keep-alive; counts what it
    answered in a file next to nothing: the count is read over HTTP
    (`/count`)."""
    answered = [0]
    # Requests in progress (head read, answer not yet written) and the most
    # at once since the last `/peak`: like most app servers, this one does
    # not notice a client that went away, and works its delay out.
    progress = {"now": 0, "peak": 0}

    async def handle(reader, writer):
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                target = head[: head.find(b"\r\n")].split(b" ")[1].decode()
                if target.startswith("/count"):
                    body = str(answered[0]).encode()
                    status = 200
                elif target.startswith("/peak"):
                    body = str(progress["peak"]).encode()
                    progress["peak"] = progress["now"]
                    status = 200
                else:
                    answered[0] += 1
                    progress["now"] += 1
                    progress["peak"] = max(progress["peak"], progress["now"])
                    q = dict(p.split("=", 1) for p in target.partition("?")[2].split("&") if "=" in p)
                    await asyncio.sleep(int(q.get("ms", "0")) / 1000)
                    progress["now"] -= 1
                    status = int(q.get("status", "200"))
                    body = b"ok\n"
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


CONFIG = """version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: http://127.0.0.1:{upstream}
store:
  kind: redis
  url: redis://127.0.0.1:{redis}
  budget: 25ms
identity:
  pseudonym_key: "0123456789abcdef0123456789abcdef"
policies:
  failed_logins: {{ algorithm: fixed-window, limit: {limit}, window: 1h }}
  in_flight: {{ algorithm: concurrency, limit: 3 }}
routes:
  - name: login
    match: {{ path: /login }}
    subject: client_ip
    policy: failed_logins
    charge: {{ on: response, statuses: [401] }}
  - name: slow
    match: {{ path: /slow }}
    subject: global
    policy: in_flight
default: {{ policy: none }}
"""


class Run:
    """One sluice of one build, with its own redis-server."""

    def __init__(self, procs, workdir, binary, upstream, limit):
        self.procs = procs
        self.redis_port = tools.free_port()
        rlog = os.path.join(workdir, f"redis-{self.redis_port}.log")
        self.redis_proc = procs.start("redis", ["redis-server", "--port", str(self.redis_port), "--save", "",
                                                "--appendonly", "no"], None, rlog)
        if not tools.wait_tcp(self.redis_port, self.redis_proc):
            raise SystemExit("reservations: redis-server did not start")
        config = CONFIG.format(upstream=upstream, redis=self.redis_port, limit=limit)
        self.proc, self.port, _, self.log = tools.start_sluice(procs, workdir, binary, config, "sluice")
        deadline = time.time() + 15
        # Ready once Redis answers its decisions.
        while time.time() < deadline and tools.http_status(self.port, "/login?status=200") != 200:
            time.sleep(0.1)
        self.redis = tools.Redis(self.redis_port)

    def stop(self):
        self.redis.close()
        self.procs.stop(self.proc)
        self.procs.stop(self.redis_proc)


def upstream_count(port, what="/count"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", what)
    n = int(conn.getresponse().read())
    conn.close()
    return n


def hang_up(port, path, after):
    """Sends one GET of `path` and closes the socket `after` seconds later."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    time.sleep(after)
    sock.close()


def hang_ups(run, upstream):
    """12 clients, each gone 0.2 s after sending `GET /slow` (the app takes
    4 s) against an in-flight limit of 3: the most requests the app had in
    progress at once. Then 30 failed logins (the app answers after 1 s),
    each client gone at 0.3 s, against a limit of 5: the 31st's status."""
    upstream_count(upstream, "/peak")
    for _ in range(12):
        hang_up(run.port, "/slow?ms=4000", 0.2)
    time.sleep(4.5)
    peak = upstream_count(upstream, "/peak")
    for _ in range(30):
        hang_up(run.port, "/login?status=401&ms=1000", 0.3)
    time.sleep(1.5)
    conn = http.client.HTTPConnection("127.0.0.1", run.port, timeout=10)
    conn.request("GET", "/login?status=401")
    status = conn.getresponse().status
    conn.close()
    return {"peak_in_progress": peak, "login_31": status}


def successes(run, seconds):
    run.redis.cmd("CONFIG", "RESETSTAT")
    cpu0 = tools.cpu_seconds(run.proc.pid)
    out = tools.run_wrk(f"http://127.0.0.1:{run.port}/login?status=200", 16, seconds, 1)
    cpu = tools.cpu_seconds(run.proc.pid) - cpu0
    calls = sum(n for name, n in run.redis.commandstats().items() if name.startswith(("fcall", "evalsha")))
    return {
        "rps": out["rps"],
        "non_2xx": out["non_2xx"],
        "redis_calls_per_request": calls / max(1, out["requests"]),
        "cpu_us_per_request": cpu * 1e6 / max(1, out["requests"]),
    }


def burst(run, clients, seconds, path):
    statuses = {}
    lock = threading.Lock()
    stop = time.time() + seconds

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", run.port, timeout=10)
        while time.time() < stop:
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            with lock:
                statuses[r.status] = statuses.get(r.status, 0) + 1
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(statuses.values())
    return {"requests": total, "ok_per_s": statuses.get(200, 0) / seconds, "statuses": statuses}


def guesses(run, upstream, n=100):
    before = upstream_count(upstream)
    barrier = threading.Barrier(n)
    statuses = {}
    lock = threading.Lock()

    def guess():
        conn = http.client.HTTPConnection("127.0.0.1", run.port, timeout=10)
        conn.connect()
        barrier.wait()
        conn.request("GET", "/login?status=401&ms=300")
        r = conn.getresponse()
        r.read()
        with lock:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        conn.close()

    threads = [threading.Thread(target=guess) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"forwarded": upstream_count(upstream) - before, "statuses": statuses}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", action="append", required=True)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stem", default="reservations")
    ap.add_argument("--serve-upstream", type=int)
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    builds = [s.split("=", 1) if "=" in s else (s, s) for s in args.sluice]
    procs = tools.Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-reservations-")
    results = {name: {} for name, _ in builds}
    try:
        up = tools.free_port()
        proc = procs.start("upstream", [sys.executable, os.path.abspath(__file__), "--sluice", "x",
                                        "--serve-upstream", str(up)], None, os.path.join(workdir, "up.log"))
        if not tools.wait_tcp(up, proc):
            raise SystemExit("reservations: the upstream did not start")
        for round_ in range(args.rounds):
            # Interleaved: each round runs every build once per scenario.
            for name, binary in builds:
                run = Run(procs, workdir, binary, up, 10**9)
                results[name].setdefault("successes", []).append(successes(run, args.seconds))
                run.stop()
                for clients in (3, 5, 10, 20):
                    run = Run(procs, workdir, binary, up, 5)
                    r = burst(run, clients, args.seconds, "/login?status=200&ms=100")
                    results[name].setdefault(f"burst-{clients}", []).append(r)
                    run.stop()
                run = Run(procs, workdir, binary, up, 5)
                results[name].setdefault("guesses", []).append(guesses(run, up))
                run.stop()
                run = Run(procs, workdir, binary, up, 5)
                results[name].setdefault("hang-ups", []).append(hang_ups(run, up))
                run.stop()
    finally:
        procs.stop_all()

    lines = [
        "# Limits charged on response: reserving before forwarding",
        "",
        f"`python3 bench/reservations.py {' '.join('--sluice ' + s for s in args.sluice)} "
        f"--seconds {args.seconds:g} --rounds {args.rounds}`, {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} cores, release builds, Redis store on loopback; medians of {args.rounds} "
        "interleaved rounds.",
        "",
        "| build | successes: req/s | Redis calls / req | sluice CPU µs / req | successful logins a second, 3 / 5 / 10 / 20 clients at once (limit 5, app 100 ms) | 100 guesses at once vs 5: forwarded | 12 hang-ups vs in-flight 3: most in progress | 31st login after 30 hung-up failures |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    for name, _ in builds:
        r = results[name]
        s = r["successes"]
        shares = " / ".join(f"{med([x['ok_per_s'] for x in r[f'burst-{c}']]):.0f}" for c in (3, 5, 10, 20))
        lines.append(
            f"| {name} | {med([x['rps'] for x in s]):,.0f} | {med([x['redis_calls_per_request'] for x in s]):.2f} "
            f"| {med([x['cpu_us_per_request'] for x in s]):.1f} | {shares} | "
            f"{med([x['forwarded'] for x in r['guesses']])} | {med([x['peak_in_progress'] for x in r['hang-ups']])} "
            f"| {med([x['login_31'] for x in r['hang-ups']])} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{args.stem}.md")
    with open(out, "w") as f:
        f.write(report)
    with open(out[:-3] + ".json", "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
