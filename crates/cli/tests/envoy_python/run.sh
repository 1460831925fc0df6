#!/usr/bin/env bash
# SPEC §11 through Envoy's own generated Python stubs (PyPI xds-protos):
# a pytest suite against real `charon serve` processes, in the in-memory
# store and on a private redis-server. Installs the pinned requirements
# (requirements.txt) once per machine into a virtualenv in Charon's cache
# directory ($CHARON_CACHE_DIR or ~/.cache/charon), then runs pytest.
#
#   crates/cli/tests/envoy_python/run.sh             # builds target/debug/charon first
#   CHARON_BIN=/path/to/charon crates/cli/tests/envoy_python/run.sh [pytest args]
#
# Run by `cargo test -p charon --test cli envoy_python:: -- --ignored` (which sets
# CHARON_BIN). Environment: CARGO_TARGET_DIR (default: <workspace>/target).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}

mkdir -p "$target"
venv=$("$root/scripts/python-env" envoy-python "$here/requirements.txt")
"$venv/bin/python" -c "import envoy.service.ratelimit.v3.rls_pb2_grpc"

if [ -z "${CHARON_BIN:-}" ]; then
    (cd "$root" && cargo build --quiet -p charon)
    CHARON_BIN=$target/debug/charon
fi
export CHARON_BIN

# No pytest cache nor __pycache__ in the tree.
export PYTHONDONTWRITEBYTECODE=1
cd "$here"
"$venv/bin/python" -m pytest -p no:cacheprovider -q -o console_output_style=classic \
    -n 4 --rootdir "$here" "$@" "$here"
