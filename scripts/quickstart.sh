#!/usr/bin/env bash
# Runs sluice on the embedded store in front of a tiny upstream, then shows
# 200s turning into 429s with curl. sluice keeps running until Ctrl-C
# (set QUICKSTART_EXIT=1 to stop after the demonstration).
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1 || { echo "quickstart needs $1 ($2)" >&2; exit 1; }; }
need cargo "install Rust from https://rustup.rs"
need python3 "apt-get install python3"
need curl "apt-get install curl"

# Another process on one of the ports would answer in sluice's place:
# refuse to start rather than show its answers. Bound as the app and
# sluice bind (SO_REUSEADDR): a connection of the last run still in
# TIME-WAIT holds no port, only a listener does.
for port in 3000 8080 9901; do
  if ! python3 -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()' "$port" 2>/dev/null; then
    echo "quickstart needs 127.0.0.1:$port, but another process holds it; stop it and try again" >&2
    exit 1
  fi
done

echo "== building sluice (release)"
cargo build --release --quiet

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

# The app sluice protects: any HTTP server on 127.0.0.1:3000.
python3 -m http.server 3000 --bind 127.0.0.1 --directory config >/dev/null 2>&1 &
app=$!
pids+=("$app")

log=target/quickstart.log
./target/release/sluice run --config config/quickstart.yaml --log-format text >"$log" 2>&1 &
sluice=$!
pids+=("$sluice")

# Wait until both the app and sluice answer, as long as both still run.
ready=0
for _ in $(seq 1 100); do
  for pid in "$app" "$sluice"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "quickstart: a process it started exited; sluice's log ($log):" >&2
      tail -n 20 "$log" >&2 || true
      exit 1
    fi
  done
  if curl -fsS -o /dev/null http://127.0.0.1:3000/ 2>/dev/null &&
     curl -fsS -o /dev/null http://127.0.0.1:9901/readyz 2>/dev/null; then
    ready=1; break
  fi
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "sluice or the app did not come up; see $log (is port 8080, 9901 or 3000 in use?)" >&2
  exit 1
fi
echo "== sluice is up (logs: $log)"

echo "== 8 requests to http://127.0.0.1:8080/ (the policy admits 5 at once, then one every 12s)"
codes=()
for i in $(seq 1 8); do
  code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/)
  echo "request $i -> $code"
  codes+=("$code")
done
# A token bucket has no window edge to straddle: 8 requests sent within
# 12 s get exactly 5 × 200 then 3 × 429, whenever the script runs.
if [ "${codes[*]}" != "200 200 200 200 200 429 429 429" ] || ! kill -0 "$sluice" 2>/dev/null; then
  echo "quickstart failed: expected 200s turning into 429s from its own sluice; see $log" >&2
  exit 1
fi
echo "== the 429 in full:"
curl -s -i http://127.0.0.1:8080/ || true
echo

if [ "${QUICKSTART_EXIT:-0}" = 1 ]; then exit 0; fi
echo "== sluice is serving on http://127.0.0.1:8080 (metrics: http://127.0.0.1:9901/metrics). Ctrl-C stops it."
wait
