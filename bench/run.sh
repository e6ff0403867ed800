#!/usr/bin/env bash
# The benchmark, one command: installs what it needs, builds sluice in
# release mode, runs every scenario interleaved and writes
# bench/results/latest.md and latest.json, then replays each algorithm's
# Redis call beside the baseline INCR + EXPIRE script into bench/results/redis-cost.md.
#
#   bench/run.sh                 # full run: 3 rounds, a few minutes
#   BENCH_QUICK=1 bench/run.sh   # 1 round of 1-2 s runs, to try it out
#
# Tools are installed once: Debian packages with apt-get (nginx, redis-server,
# wrk, perf when available), oha with `cargo install` into $BENCH_CACHE
# (default ~/.cache/sluice-bench). Load only ever targets 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice-bench}"
OHA_VERSION="1.16.0"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else
    echo "bench: need root (or sudo) to run: $*" >&2; return 1
  fi
}

apt_updated=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || { echo "bench: missing $*; install it (no apt-get here)" >&2; return 1; }
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need_cmd() { # need_cmd COMMAND PACKAGE...
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  echo "== installing $* (for $cmd)"
  apt_install "$@"
}

need_cmd nginx nginx-light
need_cmd redis-server redis-server
need_cmd wrk wrk
need_cmd taskset util-linux
need_cmd python3 python3
# perf only counts syscalls; the harness reports them as not counted without it.
command -v perf >/dev/null 2>&1 || { echo "== installing perf (optional)"; apt_install linux-perf || true; }

# oha: an open-loop load generator with latency correction (wrk2 is not in Debian).
OHA="$CACHE/bin/oha"
if ! "$OHA" --version 2>/dev/null | grep -q " $OHA_VERSION\$"; then
  echo "== installing oha $OHA_VERSION into $CACHE (several minutes, once)"
  mkdir -p "$CACHE"
  cargo install oha --locked --version "$OHA_VERSION" --root "$CACHE" --quiet
fi

echo "== building sluice (release)"
cargo build --release --quiet
# The hyper floor (bench/floor/): sluice's stack with nothing of its own,
# built into the same target directory so the crates are shared.
echo "== building the hyper floor (release)"
CARGO_TARGET_DIR="$PWD/target" cargo build --release --quiet --manifest-path bench/floor/Cargo.toml

# Up to 1,000 connections in, as many to the upstream, per process.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

python3 bench/harness.py --sluice target/release/sluice --floor target/release/hyper-floor --oha "$OHA" "$@"

# What one decision costs Redis beside the baseline INCR + EXPIRE script (Redis alone on a
# CPU, redis-benchmark at saturation): bench/results/redis-cost.md.
if [ -n "${BENCH_QUICK:-}" ]; then calls=20000; else calls=200000; fi
python3 bench/redis_cost.py --sluice target/release/sluice --calls "$calls"
