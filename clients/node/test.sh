#!/usr/bin/env bash
# Installs the dependencies (npm ci, cached under the repo's .cache/clients/node), builds,
# typechecks, and runs the tests (node's built-in runner) against the gateway at
# KAFKA_LEASE_ADDR with the records described by KAFKA_LEASE_FIXTURE.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export npm_config_cache="$repo/.cache/clients/node/npm"
cd "$here"
say() { printf '[node] %s\n' "$*"; }

: "${KAFKA_LEASE_ADDR:?set KAFKA_LEASE_ADDR to a gateway address (host:port)}"
: "${KAFKA_LEASE_FIXTURE:?set KAFKA_LEASE_FIXTURE to the fixture JSON file}"

say "node $(node --version), npm $(npm --version)"
say "npm ci (cache: .cache/clients/node/npm)"
npm ci --no-audit --no-fund --prefer-offline
say "typecheck (tsc --noEmit)"
node_modules/.bin/tsc -p tsconfig.json --noEmit
say "build (tsc)"
rm -rf dist
node_modules/.bin/tsc -p tsconfig.json
say "tests against $KAFKA_LEASE_ADDR"
node --test --test-concurrency=1 --test-reporter=spec dist/test/*.test.js
