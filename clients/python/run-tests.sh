#!/usr/bin/env bash
# The Python client's checks: builds and installs the package (a real,
# non-editable `pip install`) with the pinned test requirements into a
# virtualenv in Charon's cache directory ($CHARON_CACHE_DIR or
# ~/.cache/charon; the requirements are installed once per machine, the
# package on every run), then runs `mypy --strict`,
# `ruff check` and `ruff format --check` on it, then pytest against real
# `charon serve` processes (and private redis-servers) started by fixtures.
#
#   clients/python/run-tests.sh                 # builds target/debug/charon first
#   CHARON_BIN=/path/to/charon clients/python/run-tests.sh [pytest args]
#
# Environment: CARGO_TARGET_DIR (default: <workspace>/target).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}

# No pytest, ruff or mypy cache nor __pycache__ in the tree.
export PYTHONDONTWRITEBYTECODE=1
export RUFF_CACHE_DIR=$target/python-client-ruff-cache

mkdir -p "$target"
venv=$("$root/scripts/python-env" python-client "$here/requirements-test.txt")
# One reinstallation of the package at a time (it is what is tested, so
# it is installed again on every run).
exec 9>"$venv.package.lock"
flock 9
# Installed from a copy, so that the build leaves nothing (build/,
# *.egg-info) in the tree.
src=$(mktemp -d "$target/python-client-src.XXXXXX")
trap 'rm -rf "$src"' EXIT
tar -C "$here" --exclude=build --exclude='*.egg-info' --exclude=__pycache__ -cf - \
    pyproject.toml README.md src | tar -C "$src" -xf -
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
    --force-reinstall --no-deps "$src"
flock -u 9

echo "== mypy --strict, ruff (charon_client)" >&2
"$venv/bin/python" -m mypy --config-file "$here/pyproject.toml" \
    --cache-dir "$target/python-client-mypy-cache" -p charon_client
(cd "$here" && "$venv/bin/ruff" check src tests examples gen_stubs.py \
    && "$venv/bin/ruff" format --check src tests examples gen_stubs.py)

if [ -z "${CHARON_BIN:-}" ]; then
    # --workspace: the features `cargo test --workspace` built it with,
    # so after it this builds nothing.
    (cd "$root" && cargo build --locked --quiet --workspace --bins)
    CHARON_BIN=$target/debug/charon
fi
# The tests run from the package's folder: the path must not be relative.
CHARON_BIN=$(realpath "$CHARON_BIN")
export CHARON_BIN

cd "$here"
"$venv/bin/python" -m pytest -p no:cacheprovider -q -o console_output_style=classic \
    --rootdir "$here" "$@" "$here/tests"
