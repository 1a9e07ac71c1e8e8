#!/usr/bin/env bash
# Installs the dependencies (npm ci, npm's cache in $KAFKA_LEASE_CLIENTS_CACHE/node/npm, default
# the repo's .cache/clients/node/npm), builds, typechecks, and runs the tests (node's built-in
# runner) against the gateway at KAFKA_LEASE_ADDR with the records described by
# KAFKA_LEASE_FIXTURE.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$here/../../.cache/clients}/node"
mkdir -p "$cache" && cache=$(cd "$cache" && pwd)
export npm_config_cache="$cache/npm"
cd "$here"
say() { printf '[node] %s\n' "$*"; }

: "${KAFKA_LEASE_ADDR:?set KAFKA_LEASE_ADDR to a gateway address (host:port)}"
: "${KAFKA_LEASE_FIXTURE:?set KAFKA_LEASE_FIXTURE to the fixture JSON file}"

say "node $(node --version), npm $(npm --version)"
say "npm ci (cache: $npm_config_cache)"
npm ci --no-audit --no-fund --prefer-offline
say "typecheck (tsc --noEmit)"
node_modules/.bin/tsc -p tsconfig.json --noEmit
say "build (tsc)"
rm -rf dist
node_modules/.bin/tsc -p tsconfig.json
say "tests against $KAFKA_LEASE_ADDR"
node --test --test-concurrency=1 --test-reporter=spec dist/test/*.test.js
