#!/usr/bin/env bash
# The web console's browser tests: Debian's Chromium driven by playwright-core against the
# warren binary (each test file starts its own broker on free ports with a temporary data
# directory).
#
# Usage: bash tests/browser/run.sh          (from any directory; as root it installs what
#                                             is missing: chromium with apt, npm packages)
# Environment:
#   WARREN_BIN  broker binary, relative to the repo root (default target/debug/warren)
#   CHROMIUM    browser binary (default /usr/bin/chromium)
set -euo pipefail

cd "$(dirname "$0")"

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  echo "chromium missing; installing with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends chromium
fi
"$CHROMIUM" --version 2>/dev/null || true
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "node/npm missing; installing with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q nodejs npm
fi
if [ ! -f node_modules/playwright-core/package.json ] || [ ! -f node_modules/amqplib/package.json ]; then
  echo "installing the browser tests' Node dependencies (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
fi
export CHROMIUM
export WARREN_BIN=${WARREN_BIN:-target/debug/warren}
npm test --silent
