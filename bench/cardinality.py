#!/usr/bin/env python3
"""A million distinct subjects through sluice, on the embedded store and on
Redis: what each one costs, and that every one of them expires.

    python3 bench/cardinality.py [--sluice target/release/sluice] [--subjects N] [--window S] [--keep]

CARD_SUBJECTS (default 1,000,000) and CARD_WINDOW (seconds, default 300)
set the figures. Two sluice (release build, `server.workers: 1`) in front of
nginx `return 200`: one on the memory store (`max_entries` twice the
subjects), one on a redis-server started here. Each gets N requests, every
one with an X-Subject header never sent before (wrk, bench/wrk/subjects.lua;
past the N-th it repeats one, until stopped),
on a fixed window of W seconds: a subject's key lives W + 1 s (ttl_grace)
after its one write, longer than the load takes, so all N are live at once
when measured.

Measured: sluice's VmRSS before and after (memory store: the growth per
subject), `sluice_memory_store_subjects`, Redis `used_memory` and `DBSIZE`
before and after (the growth per subject), then, polled every second, how
long after the TTL the gauge and DBSIZE are back to 0. The report goes to
results/cardinality.md and results/cardinality.json.

Load only ever targets 127.0.0.1. Every process is started here, pinned
(sluice on CPU 1; wrk, nginx and Redis on CPU 0) and stopped by its PID
when the script ends, however it ends.
"""

import argparse
import datetime
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import soak  # noqa: E402
import tools  # noqa: E402
from tools import Processes, Redis  # noqa: E402

BENCH = harness.BENCH
ROOT = harness.ROOT
CPU_REST = harness.CPU_REST
CONNS = 32
GRACE_S = 1
DEDUPE_S = 5  # store.dedupe_window's default: retry records live this long
EXPIRY_POLL_S = 120  # after the TTL

log = harness.log


def memory_store(n):
    return f"  kind: memory\n  max_entries: {2 * n}\n  budget: {harness.BUDGET_MS}ms\n  ttl_grace: {GRACE_S}s"


def redis_store(port):
    return (f"  kind: redis\n  url: redis://127.0.0.1:{port}\n  budget: {harness.BUDGET_MS}ms\n"
            f"  ttl_grace: {GRACE_S}s")


def subjects_gauge(admin):
    try:
        return int(soak.metric_sum(soak.scrape(admin), "sluice_memory_store_subjects"))
    except OSError:
        return None


def redis_figures(port):
    r = Redis(port)
    try:
        return {"dbsize": r.cmd("DBSIZE"), "used_memory": int(r.info("memory")["used_memory"])}
    finally:
        r.close()


def load(procs, workdir, server, n, tag, distinct_until_stopped=False):
    """N requests with N new subjects; the wrk result and how long it took.
    With `distinct_until_stopped` every request has a new subject until N
    were allowed (a 503 from an open breaker writes no key)."""
    prefix = "%08x" % random.getrandbits(32)
    argv = ["wrk", "-t1", f"-c{CONNS}", "-d900s", "--timeout=5s", "-s", os.path.join(soak.WRK_DIR, "subjects.lua"),
            f"http://127.0.0.1:{server.port}/subjects", "--", "X-Subject", prefix,
            "0" if distinct_until_stopped else str(n),
            str(random.getrandbits(24))]
    logf = os.path.join(workdir, f"wrk-{tag}.log")
    def decided():
        try:
            return soak.metric_sum(soak.scrape(server.admin_port), "sluice_requests_total", route="subjects",
                                   outcome="allowed")
        except OSError:
            return 0

    start = decided()
    t0 = time.monotonic()
    proc = procs.start(f"wrk-{tag}", argv, CPU_REST, logf)
    try:
        # Stop once N subjects were allowed (their keys written; a 503 from
        # an open breaker writes none), SIGINT: wrk prints its counts and ends.
        while proc.poll() is None and time.monotonic() - t0 < 900:
            if decided() - start >= n:
                break
            time.sleep(0.2)
    finally:
        procs.stop(proc, sig=signal.SIGINT)
    seconds = time.monotonic() - t0
    res = soak.parse_wrk(logf)
    res.pop("per_second", None)
    res["seconds"] = round(seconds, 1)
    res["rps"] = round(sum(res["statuses"].values()) / seconds)
    return res


def warm(server):
    """A few hundred requests on one subject, so connection buffers are in
    the 'before' figure and not counted as the subjects' cost."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for _ in range(200):
            conn.request("GET", "/subjects", headers={"X-Subject": "warm-up"})
            conn.getresponse().read()
    except OSError:
        pass
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--subjects", type=int, default=int(os.environ.get("CARD_SUBJECTS", "1000000")))
    ap.add_argument("--window", type=int, default=int(os.environ.get("CARD_WINDOW", "300")))
    ap.add_argument("--out", default=os.path.join(BENCH, "results"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs)")
    ap.add_argument("--render", metavar="JSON", help="only re-render the report of a saved result")
    ap.add_argument("--redis-only", metavar="JSON",
                    help="run the Redis store only; the memory store's figures come from this saved result")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            md = markdown(json.load(f))
        with open(os.path.join(os.path.dirname(os.path.abspath(args.render)), "cardinality.md"), "w") as f:
            f.write(md)
        print(md)
        return
    if not os.access(args.sluice, os.X_OK):
        raise SystemExit(f"cardinality: no sluice binary at {args.sluice} (cargo build --release)")

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
    workdir = tempfile.mkdtemp(prefix="sluice-cardinality-")
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
    with open(os.path.join(args.out, "cardinality.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "cardinality.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"written: results/cardinality.md and cardinality.json ({result['elapsed_s']} s)")


def session(procs, workdir, args):
    n, window = args.subjects, args.window
    ttl = window + GRACE_S
    info = harness.machine_info(args.sluice, os.path.expanduser("~/.cache/sluice-bench/bin/oha"))
    upstream = harness.start_nginx(procs, workdir, "upstream", "upstream.nginx.conf", CPU_REST)
    if upstream.reason:
        raise SystemExit(f"cardinality: {upstream.reason}")
    redis_srv = harness.start_redis(procs, workdir)
    if redis_srv.reason:
        raise SystemExit(f"cardinality: {redis_srv.reason}")
    mem = harness.start_sluice(procs, workdir, args.sluice, "sluice-memory", "sluice-cardinality.yaml",
                               UPSTREAM_PORT=upstream.port, STORE=memory_store(n), WINDOW_S=window)
    red = harness.start_sluice(procs, workdir, args.sluice, "sluice-redis", "sluice-cardinality.yaml",
                               UPSTREAM_PORT=upstream.port, STORE=redis_store(redis_srv.port), WINDOW_S=window)
    for s in (mem, red):
        if s.reason:
            raise SystemExit(f"cardinality: {s.name}: {s.reason}")
    out = {"generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": info,
           "settings": {"subjects": n, "window_s": window, "ttl_grace_s": GRACE_S, "ttl_s": ttl,
                        "connections": CONNS, "budget_ms": harness.BUDGET_MS,
                        "pinning": {"sluice_cpu": harness.CPU_PROXY, "load_upstream_redis_cpu": CPU_REST}}}

    if args.redis_only:
        with open(args.redis_only) as f:
            saved = json.load(f)
        m = saved["memory"]
        out["memory_from"] = saved.get("generated_at")
        mem_end = None  # nothing to poll
    else:
        # Memory store.
        warm(mem)
        time.sleep(2)
        m = {"rss_before_kb": tools.rss_kb(mem.pid), "subjects_before": subjects_gauge(mem.admin_port)}
        log(f"memory store: {n:,} subjects")
        m["load"] = load(procs, workdir, mem, n, "memory")
        mem_end = time.monotonic()
        time.sleep(2)  # the gauge is set by the sweeper, once a second
        m["rss_after_kb"] = tools.rss_kb(mem.pid)
        m["subjects_after"] = subjects_gauge(mem.admin_port)
        live = max(1, (m["subjects_after"] or 0) - (m["subjects_before"] or 0))
        m["rss_per_subject_bytes"] = round((m["rss_after_kb"] - m["rss_before_kb"]) * 1024 / live, 1)
        log(f"  {m['subjects_after']:,} subjects, RSS {m['rss_before_kb']} → {m['rss_after_kb']} kB")

    # Redis.
    warm(red)
    time.sleep(DEDUPE_S + 2)
    r = {"rss_before_kb": tools.rss_kb(red.pid), "redis_before": redis_figures(redis_srv.port)}
    log(f"redis store: {n:,} subjects")
    r["load"] = load(procs, workdir, red, n, "redis", distinct_until_stopped=True)
    red_end = time.monotonic()
    time.sleep(DEDUPE_S + 2)  # retry records gone: what is left is the subjects' state
    r["rss_after_kb"] = tools.rss_kb(red.pid)
    r["redis_after"] = redis_figures(redis_srv.port)
    keys = r["redis_after"]["dbsize"] - r["redis_before"]["dbsize"]
    r["keys_per_subject"] = round(keys / (n + 1), 3)
    r["allowed"] = r["load"]["statuses"].get("200", 0)
    r["used_memory_per_subject_bytes"] = round(
        (r["redis_after"]["used_memory"] - r["redis_before"]["used_memory"]) / max(1, keys), 1)
    log(f"  DBSIZE {r['redis_after']['dbsize']:,}, used_memory {r['redis_before']['used_memory']} → "
        f"{r['redis_after']['used_memory']}")

    # Expiry: poll both every second until empty, up to EXPIRY_POLL_S past
    # the TTL (counted from the end of each store's load: the last write).
    log(f"waiting for expiry: TTL {ttl} s after each subject's write")
    r["expiry"] = []
    r_zero = None
    if mem_end is None:
        m_zero = m["zero_after_ttl_s"]
    else:
        m["expiry"], m_zero = [], None
    deadline = red_end + ttl + EXPIRY_POLL_S
    while time.monotonic() < deadline and (m_zero is None or r_zero is None):
        now = time.monotonic()
        if m_zero is None:
            g = subjects_gauge(mem.admin_port)
            m["expiry"].append({"after_ttl_s": round(now - mem_end - ttl, 1), "subjects": g})
            if g == 0:
                m_zero = round(now - mem_end - ttl, 1)
        if r_zero is None:
            d = redis_figures(redis_srv.port)["dbsize"]
            r["expiry"].append({"after_ttl_s": round(now - red_end - ttl, 1), "dbsize": d})
            if d == 0:
                r_zero = round(now - red_end - ttl, 1)
        time.sleep(1)
    r["zero_after_ttl_s"] = r_zero
    if mem_end is not None:
        m["zero_after_ttl_s"] = m_zero
        m["rss_expired_kb"] = tools.rss_kb(mem.pid)
    r["redis_expired"] = redis_figures(redis_srv.port)
    r["rss_expired_kb"] = tools.rss_kb(red.pid)
    out["memory"], out["redis"] = m, r
    return out


def _n(v):
    return "—" if v is None else f"{v:,}"


def _mb(kb):
    return "—" if kb is None else f"{kb / 1024:.1f} MB"


def _bytes(b):
    return "—" if b is None else f"{b / 1024 / 1024:.1f} MB"


def markdown(res):
    mc, st, m, r = res["machine"], res["settings"], res["memory"], res["redis"]
    t = mc["tools"]
    lines = [
        f"# sluice cardinality — {res['generated_at']}",
        "",
        f"**Machine:** {mc['cpu_model']}, nproc {mc['nproc']}, {mc['memory_gib']} GiB, Linux {mc['kernel']}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in mc['loadavg_at_start'])}.  ",
        f"**Software:** {t['sluice']} (commit {t['sluice_commit']}), {(t['redis'] or '').split(' sha=')[0]}, "
        f"{t['wrk'].split(' Copyright')[0] if t['wrk'] else 'wrk'}.  ",
        f"**Method:** {st['subjects']:,} requests per store, each with an X-Subject never sent before "
        f"(wrk, {st['connections']} connections, `bench/wrk/subjects.lua`), through sluice (`server.workers: 1`, "
        f"CPU {st['pinning']['sluice_cpu']}) in front of nginx `return 200`; wrk, nginx and Redis on CPU "
        f"{st['pinning']['load_upstream_redis_cpu']}. Fixed window of {st['window_s']} s, `ttl_grace` "
        f"{st['ttl_grace_s']} s: each subject's key lives {st['ttl_s']} s after its one write, longer than the load "
        f"takes, so every subject is live when measured. Memory store with `max_entries: "
        f"{2 * st['subjects']:,}`. Whole run {res.get('elapsed_s', '—')} s.",
        "",
        "Throughput depends on what else runs on the machine; memory figures do not."
        + (f" The memory store's figures are from the run of {res['memory_from']} (`--redis-only` reran Redis)."
           if res.get("memory_from") else ""),
        "",
        "## Cost per subject",
        "",
        "| store | load | subjects live after | sluice RSS before → after | per subject |",
        "|---|---|---:|---:|---:|",
    ]
    ml, rl = m["load"], r["load"]

    def ld(x):
        st_ = ", ".join(f"{k}×{v:,}" for k, v in sorted(x["statuses"].items()))
        return f"{st_} in {x['seconds']} s ({x['rps']:,} req/s)"

    lines.append(f"| memory | {ld(ml)} | {_n(m['subjects_after'])} (`sluice_memory_store_subjects`) | "
                 f"{_mb(m['rss_before_kb'])} → {_mb(m['rss_after_kb'])} | **{m['rss_per_subject_bytes']:.0f} B** of "
                 f"sluice RSS |")
    rb, ra = r["redis_before"], r["redis_after"]
    keys = ra["dbsize"] - rb["dbsize"]
    grown = ra["used_memory"] - rb["used_memory"]
    # Subjects with a key: every allowed answer was a new subject (a 503
    # from an open breaker wrote none).
    with_keys = r.get("allowed") or (st["subjects"] + 1)
    per_subject = grown / with_keys
    lines.append(f"| redis | {ld(rl)} | {_n(keys)} keys (`DBSIZE`) | "
                 f"{_mb(r['rss_before_kb'])} → {_mb(r['rss_after_kb'])} (sluice holds no subject) | "
                 f"**{per_subject:.0f} B** of Redis `used_memory` ({_bytes(rb['used_memory'])} → "
                 f"{_bytes(ra['used_memory'])}; {grown / max(1, keys):.0f} B per key) |")
    extra = keys - with_keys
    lines += ["", "Redis is read 7 s after the load, when the retry records (`<state key>:e:<id>`, one per "
              "evaluation, `PX` 5 s: `store.dedupe_window`) have all expired. Expired is not yet reclaimed: "
              "Redis's active expiry samples keys with a TTL, and with the live state keys among them "
              f"it finds few expired ones per sample, so {_n(extra)} records beyond the {with_keys:,} "
              "state keys were still counted (and in `used_memory`); they go as the sampling finds them. The "
              "per-subject figure includes them: an upper bound. Memory store: past the N-th request wrk repeats one "
              "subject until it is stopped (its 429s above), so exactly N + 1 subjects are sent. Redis: every request "
              "has a new subject until N were allowed (a 503 while the breaker is open writes no key), so the "
              "subjects with a key are the allowed answers.", "", "## Expiry", ""]
    ttl = st["ttl_s"]

    def exp(name, zero, series, key):
        at = [p for p in series if p["after_ttl_s"] <= -1]
        before = at[-1][key] if at else None
        if zero is None:
            last = series[-1] if series else {}
            return (f"- {name}: **not back to 0** within {EXPIRY_POLL_S} s after the TTL; {last.get(key)} left at "
                    f"{last.get('after_ttl_s')} s after it.")
        return (f"- {name}: back to **0 {zero:+.1f} s** from the TTL ({ttl} s after the last write); "
                f"{_n(before)} left 1 s before the TTL (the last subjects' keys).")

    lines.append(exp("memory store (`sluice_memory_store_subjects`)", m["zero_after_ttl_s"], m["expiry"], "subjects"))
    lines.append(exp("Redis (`DBSIZE`)", r["zero_after_ttl_s"], r["expiry"], "dbsize"))
    lines += ["", f"After expiry: memory-store sluice RSS {_mb(m['rss_expired_kb'])} (the map keeps its capacity "
              f"for the next subjects); Redis `used_memory` {_bytes(r['redis_expired']['used_memory'])}, "
              f"DBSIZE {_n(r['redis_expired']['dbsize'])}.", ""]
    lines += ["## Targets", "", "| metric | target | measured | |", "|---|---|---|---|"]
    n = st["subjects"]
    ok_m = (m["subjects_after"] or 0) >= n
    lines.append(f"| distinct subjects live at once, memory | {n:,} | {_n(m['subjects_after'])} | "
                 f"{'met' if ok_m else 'missed'} |")
    ok_r = with_keys >= n
    lines.append(f"| distinct subjects live at once, Redis | {n:,} | {_n(with_keys)} with a key "
                 f"({_n(keys)} keys in all) | "
                 f"{'met' if ok_r else 'missed'} |")
    lines.append(f"| every key expires, memory | gauge 0 shortly after the TTL | "
                 f"{'%+.1f s' % m['zero_after_ttl_s'] if m['zero_after_ttl_s'] is not None else 'not 0'} | "
                 f"{'met' if m['zero_after_ttl_s'] is not None else 'missed'} |")
    lines.append(f"| every key expires, Redis | DBSIZE 0 shortly after the TTL | "
                 f"{'%+.1f s' % r['zero_after_ttl_s'] if r['zero_after_ttl_s'] is not None else 'not 0'} | "
                 f"{'met' if r['zero_after_ttl_s'] is not None else 'missed'} |")
    lines.append(f"| memory per subject | reported | sluice RSS {m['rss_per_subject_bytes']:.0f} B; Redis "
                 f"{per_subject:.0f} B (at most) | reported |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); every started process was stopped")
        sys.exit(130)
