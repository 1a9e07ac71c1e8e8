#!/usr/bin/env bash
# Builds the example consumer (examples/consume) and runs it in this process's place, so that
# SIGTERM reaches it: KAFKA_LEASE_ADDR, KAFKA_LEASE_GROUP and KAFKA_LEASE_TOPIC say where
# and what to consume. Modules, build cache and the binary go to $KAFKA_LEASE_CLIENTS_CACHE/go
# (default: .cache/clients/go of the repository, which git ignores).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$here/../../.cache/clients}/go"
mkdir -p "$cache" && cache=$(cd "$cache" && pwd)

export GOTOOLCHAIN=local GOFLAGS=-modcacherw
export GOPATH="$cache/gopath" GOMODCACHE="$cache/gopath/pkg/mod" GOCACHE="$cache/gocache"
mkdir -p "$cache/bin"
cd "$here"
go build -o "$cache/bin/consume" ./examples/consume
exec "$cache/bin/consume"
