#!/usr/bin/env bash
# Builds and tests the Go client against a gateway: KAFKA_LEASE_ADDR (host:port) and
# KAFKA_LEASE_FIXTURE (the fixture JSON, see tests/clients.rs). Without them the tests that
# need a gateway are skipped. Modules and build cache live under $KAFKA_LEASE_CLIENTS_CACHE/go
# (default: .cache/clients/go of the repository, which git ignores).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$here/../../.cache/clients}/go"
mkdir -p "$cache" && cache=$(cd "$cache" && pwd)
say() { printf '[go] %s\n' "$*"; }

command -v go >/dev/null || { echo "go is not on PATH" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-modcacherw
export GOPATH="$cache/gopath" GOMODCACHE="$cache/gopath/pkg/mod" GOCACHE="$cache/gocache"
cd "$here"

say "$(go version); KAFKA_LEASE_ADDR=${KAFKA_LEASE_ADDR:-<unset>}"
say "go mod download"
go mod download
say "gofmt"
unformatted=$(gofmt -l .)
if [[ -n $unformatted ]]; then
  echo "not gofmt-formatted:" >&2
  echo "$unformatted" >&2
  exit 1
fi
say "go vet ./..."
go vet ./...
say "go test ./..."
go test -count=1 -v -timeout 5m ./...
say "passed"
