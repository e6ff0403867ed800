#!/usr/bin/env bash
# Fuzzes each target in fuzz/ for a bounded time (libFuzzer through
# cargo-fuzz, on the stable toolchain: no sanitizer, so no -Z flags), after
# replaying every crash found so far (fuzz/artifacts/, all fixed). Fails on
# any crash, panic or broken property. Installs cargo-fuzz when missing.
#
#   FUZZ_SECONDS   time per target (default 60)
#   FUZZ_TARGETS   which targets (default: all of them)
#   FUZZ_SEED      libFuzzer's -seed (default 0: a new one each run; CI
#                  fixes it so a run explores the same way each time)
#
# One target for longer: FUZZ_SECONDS=3600 FUZZ_TARGETS=request_head scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${FUZZ_SECONDS:-60}"
read -r -a targets <<<"${FUZZ_TARGETS:-config request_head script_reply ratelimit_fields proxy_header framing}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

# One build for every target; `cargo fuzz run` below finds it up to date.
# Debug assertions stay on (cargo-fuzz's default): an overflow is a finding.
echo "== building the fuzz targets"
cargo fuzz build --sanitizer none

mkdir -p target/logs
for target in "${targets[@]}"; do
  log="target/logs/$target.log"
  artifacts=(artifacts/"$target"/*)
  if [ -e "${artifacts[0]}" ]; then
    echo "== $target: replaying ${#artifacts[@]} past crash(es)"
    if ! cargo fuzz run --sanitizer none "$target" "${artifacts[@]}" >"$log" 2>&1; then
      tail -n 40 "$log"
      echo "== $target: a past crash is back"
      exit 1
    fi
  fi

  echo "== $target: fuzzing for ${seconds}s"
  # New inputs go to the scratch corpus (first directory); the committed
  # starting inputs are only read.
  mkdir -p "target/corpus/$target"
  if ! cargo fuzz run --sanitizer none "$target" "target/corpus/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -seed="${FUZZ_SEED:-0}" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "== $target: failed; the input is in fuzz/artifacts/$target/ (full log: fuzz/$log)"
    exit 1
  fi
  grep -E '^Done [0-9]+ runs' "$log" || true
done
echo "== fuzzing found nothing"
