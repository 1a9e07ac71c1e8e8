#!/usr/bin/env bash
# Runs the example (examples/consume.ts) with KAFKA_LEASE_ADDR, KAFKA_LEASE_GROUP and
# KAFKA_LEASE_TOPIC, and KAFKA_LEASE_DEAD_LETTER_TOPIC for queue mode (optional): installs and builds first if needed, then execs node directly so that
# SIGTERM and SIGINT reach the program. npm's cache is $KAFKA_LEASE_CLIENTS_CACHE/node/npm
# (default: .cache/clients/node/npm of the repository, which git ignores); node_modules/ and
# the build (dist/) stay in this folder, ignored by git.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$here/../../.cache/clients}/node"
mkdir -p "$cache" && cache=$(cd "$cache" && pwd)
export npm_config_cache="$cache/npm"
cd "$here"

if [[ ! -d node_modules/@grpc/grpc-js || ! -x node_modules/.bin/tsc || package-lock.json -nt node_modules/.package-lock.json ]]; then
  npm ci --no-audit --no-fund --prefer-offline >&2
fi
stale=$(find src examples tsconfig.json package.json -newer dist/examples/consume.js 2>/dev/null | head -1 || true)
if [[ ! -f dist/examples/consume.js || -n $stale ]]; then
  node_modules/.bin/tsc -p tsconfig.json >&2
fi
exec node dist/examples/consume.js
