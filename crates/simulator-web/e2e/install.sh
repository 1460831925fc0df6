#!/usr/bin/env bash
# Installs what the browser test (e2e/run.sh) needs, if missing: Debian's
# chromium with apt-get (as root) and playwright-core from npm (npm ci, into
# e2e/node_modules, from package-lock.json). Run by scripts/test before the
# browser tests, so that `cargo test` itself never installs anything.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

say() { echo "e2e/install: $*" >&2; }

if [ ! -x "$CHROMIUM" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    say "$CHROMIUM is missing and only root may apt-get install chromium"
    exit 1
  fi
  say "installing chromium with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi

if [ ! -f "$here/node_modules/playwright-core/package.json" ]; then
  say "installing playwright-core with npm"
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
