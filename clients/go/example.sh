#!/usr/bin/env bash
# Builds the example consumer (examples/consume) and runs it in this process's place, so that
# SIGTERM reaches it: KAFKA_LEASE_ADDR, KAFKA_LEASE_GROUP and KAFKA_LEASE_TOPIC say where
# and what to consume.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache="$(cd "$here/../.." && pwd)/.cache/clients/go"

export GOTOOLCHAIN=local GOFLAGS=-modcacherw
export GOPATH="$cache/gopath" GOMODCACHE="$cache/gopath/pkg/mod" GOCACHE="$cache/gocache"
mkdir -p "$cache/bin"
cd "$here"
go build -o "$cache/bin/consume" ./examples/consume
exec "$cache/bin/consume"
