#!/usr/bin/env bash
# Instructions per route lookup with host, header and query conditions,
# for tables of 10, 100 and 1,000 routes: callgrind counts what
# `RouteTable::find` executes in the `lookup_workload` unit test (10,000
# lookups, half meeting the conditions). Flat figures across table sizes
# show the path index still picks the candidates and conditions are
# checked on those only. Counts from the debug test build unless
# PROFILE=release is set; compare sizes within one run, not across builds.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-dev}
bin=$(cargo test --lib --no-run --profile "$profile" --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%8s  %14s  %s\n' routes instructions per-lookup
for n in 10 100 1000; do
    SLUICE_BENCH_ROUTES=$n valgrind --tool=callgrind --callgrind-out-file="$out/cg.$n" \
        --toggle-collect='sluice::route::RouteTable::find' \
        "$bin" --ignored --exact route::index::tests::lookup_workload --test-threads=1 \
        >/dev/null 2>"$out/log.$n"
    ir=$(callgrind_annotate "$out/cg.$n" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}')
    printf '%8s  %14s  %s\n' "$n" "$ir" "$((ir / 10000))"
done
