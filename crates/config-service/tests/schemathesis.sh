#!/usr/bin/env bash
# OpenAPI conformance of the configuration service: runs schemathesis (from
# PyPI, installed here once per machine into a virtualenv in Charon's cache
# directory, $CHARON_CACHE_DIR or ~/.cache/charon) against /openapi.json of
# a running service.
#
#   crates/config-service/tests/schemathesis.sh            # builds and starts the dev_server example
#   CHARON_CONFIG_URL=http://127.0.0.1:PORT \
#   CHARON_CONFIG_TOKEN=T crates/config-service/tests/schemathesis.sh   # checks a service already running
#
# Environment: CARGO_TARGET_DIR (default: <workspace>/target),
# SCHEMATHESIS_MAX_EXAMPLES (default 25 per operation), SCHEMATHESIS_SEED (default 1).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
max_examples=${SCHEMATHESIS_MAX_EXAMPLES:-25}
seed=${SCHEMATHESIS_SEED:-1}

mkdir -p "$target"
venv=$("$root/scripts/python-env" schemathesis "$here/schemathesis-requirements.txt")

work=$(mktemp -d)
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

url=${CHARON_CONFIG_URL:-}
token=${CHARON_CONFIG_TOKEN:-schemathesis-token}
if [ -z "$url" ]; then
    cargo build --quiet -p charon-config-service --example dev_server
    cp "$here/seed.yaml" "$work/seed.yaml"
    "$target/debug/examples/dev_server" --db "$work/config.db" --listen 127.0.0.1:0 \
        --token "$token" --seed "$work/seed.yaml" >"$work/out" 2>"$work/err" &
    server_pid=$!
    for _ in $(seq 1 100); do
        if grep -q '^listening on ' "$work/out"; then break; fi
        if ! kill -0 "$server_pid" 2>/dev/null; then cat "$work/err" >&2; exit 1; fi
        sleep 0.1
    done
    url=$(sed -n 's/^listening on //p' "$work/out")
    [ -n "$url" ] || { echo "the service did not start" >&2; cat "$work/err" >&2; exit 1; }
fi

echo "schemathesis against $url/openapi.json" >&2
# Its cache (.schemathesis/) goes to the scratch directory, not the tree.
cd "$work"
"$venv/bin/schemathesis" run "$url/openapi.json" \
    --header "Authorization: Bearer $token" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,ignored_auth \
    --max-examples "$max_examples" \
    --seed "$seed" \
    --no-color \
    --suppress-health-check all
