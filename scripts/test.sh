#!/usr/bin/env bash
# Runs every test: unit, integration (real redis-server processes, the built
# binary, a real upstream), and the packaging checks (Dockerfile, Helm chart).
# Installs what the tests need when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# redis-cli builds the test clusters (redis-cli --cluster create / reshard).
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# slowhttptest runs slowloris and slow-body attacks against sluice.
command -v slowhttptest >/dev/null 2>&1 || missing+=(slowhttptest)
# faketime (libfaketime) steps the wall clock under a running sluice.
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
# ip routes the IPv6 documentation prefix to lo, so tests connect from many
# /64s and /56s (connection shares).
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
# Werkzeug (the app server under Flask) decodes Basic credentials in the
# identity tests, to check sluice counts what a Python app reads.
python3 -c 'import werkzeug' >/dev/null 2>&1 || python3 -m pip install -q werkzeug
# PyJWT and cryptography issue the tokens the JWT tests verify: what sluice
# checks is what a real issuer signed.
python3 -c 'import jwt, cryptography' >/dev/null 2>&1 || python3 -m pip install -q pyjwt cryptography
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# A missing server fails the run; tests never skip.
command -v redis-server >/dev/null
command -v redis-cli >/dev/null
command -v promtool >/dev/null
command -v slowhttptest >/dev/null
command -v faketime >/dev/null
command -v ip >/dev/null

echo "== cargo tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --all-targets --no-fail-fast
  cargo test --doc --quiet
else
  cargo test --all-targets --no-fail-fast
fi

if [ -x scripts/test-chart.sh ]; then
  echo "== Dockerfile and Helm chart"
  SLUICE_BIN="$PWD/target/debug/sluice" scripts/test-chart.sh
fi
echo "== all tests passed"
