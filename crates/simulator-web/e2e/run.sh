#!/usr/bin/env bash
# End-to-end test of the burst-tier simulator page in headless Chromium.
#
#   crates/simulator-web/e2e/run.sh
#
# 1. needs Debian's chromium ($CHROMIUM, /usr/bin/chromium) and
#    playwright-core in e2e/node_modules: e2e/install.sh installs both (the
#    test script runs it; cargo test itself never installs anything);
# 2. starts a server on a free port, unless CHARON_URL names a running one:
#    - default: the crate's example server, built first with cargo;
#    - CHARON_SERVER_CMD: any command, run with bash -c, with PORT (the HTTP
#      port to listen on) and GRPC_PORT (a second free port) in its
#      environment, e.g.
#        CHARON_SERVER_CMD='target/debug/charon serve --listen 127.0.0.1:$GRPC_PORT --http-listen 127.0.0.1:$PORT'
# 3. runs simulator.spec.mjs at 1280×800 and 390×844; screenshots go to
#    E2E_OUT (default: target/e2e at the workspace root), the server's output
#    to E2E_OUT/server.log.
# Exits non-zero when any check fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${E2E_OUT:-$root/target/e2e}"
mkdir -p "$out"
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

say() { echo "e2e: $*" >&2; }

if [ ! -x "$CHROMIUM" ] || [ ! -f "$here/node_modules/playwright-core/package.json" ]; then
  say "chromium or playwright-core is missing: run $here/install.sh first"
  exit 1
fi

free_port() {
  node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    # The server runs in a process group of its own (setsid): stop all of it.
    kill -TERM -- "-$server_pid" 2>/dev/null || kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT

if [ -n "${CHARON_URL:-}" ]; then
  base="$CHARON_URL"
else
  PORT="$(free_port)"
  GRPC_PORT="$(free_port)"
  export PORT GRPC_PORT
  if [ -n "${CHARON_SERVER_CMD:-}" ]; then
    cmd="$CHARON_SERVER_CMD"
  else
    say "building the example server"
    (cd "$root" && cargo build --quiet -p charon-simulator-web --example serve)
    target="${CARGO_TARGET_DIR:-$root/target}"
    cmd="exec \"$target/debug/examples/serve\" 127.0.0.1:\$PORT"
  fi
  say "starting: $cmd"
  (cd "$root" && exec setsid bash -c "$cmd") >"$out/server.log" 2>&1 &
  server_pid=$!
  base="http://127.0.0.1:$PORT"
  ready=""
  for _ in $(seq 1 300); do
    if node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$base/simulator"; then
      ready=1
      break
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      break
    fi
    sleep 0.2
  done
  if [ -z "$ready" ]; then
    say "no page at $base/simulator; the server's output:"
    cat "$out/server.log" >&2
    exit 1
  fi
fi

say "testing $base/simulator"
CHARON_URL="$base" E2E_OUT="$out" node "$here/simulator.spec.mjs"
say "screenshots in $out"
