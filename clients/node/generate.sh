#!/usr/bin/env bash
# Regenerates the stubs in src/gen from ../../proto (partition_lease.proto and errors.proto; not
# gateway_peer.proto) with buf and ts-proto (options in buf.gen.yaml). Deterministic: running it
# twice leaves no diff. Installs what it needs: ts-proto through npm (package-lock.json), buf
# through `scripts/services install prototools` (into the repo's .cache).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$repo/.cache/clients}/node"
mkdir -p "$cache" && cache=$(cd "$cache" && pwd)
export npm_config_cache="$cache/npm"

version() { sed -n "s/^$1=//p" "$repo/scripts/services"; }
buf="$repo/.cache/services/prototools-$(version BUF_VERSION)-$(version PROTOC_GEN_GO_VERSION)-$(version PROTOC_GEN_GO_GRPC_VERSION)/bin/buf"
if [[ ! -x $buf ]]; then
  (cd "$repo" && scripts/services install prototools >&2)
fi
[[ -x $buf ]] || { echo "buf not found at $buf" >&2; exit 1; }

cd "$here"
if [[ ! -x node_modules/.bin/protoc-gen-ts_proto ]]; then
  # --ignore-scripts: no `prepare` build of the stubs about to be replaced.
  npm ci --no-audit --no-fund --ignore-scripts >&2
fi
# buf resolves the template's paths (input, plugin, out) against the working directory: here.
rm -rf src/gen
"$buf" generate --template buf.gen.yaml
echo "generated $(find src/gen -name '*.ts' | wc -l) files in clients/node/src/gen" >&2
