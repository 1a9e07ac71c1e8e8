#!/usr/bin/env bash
# Generates the Java stubs (messages + gRPC client) of partition_lease.proto and errors.proto
# into src/generated/java. protoc and protoc-gen-grpc-java come from the Maven registry (the
# versions pinned in pom.xml) and are cached under $KAFKA_LEASE_CLIENTS_CACHE/java (default:
# .cache/clients/java of the repository, which git ignores).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$repo/.cache/clients}/java"
mkdir -p "$cache" && cache="$(cd "$cache" && pwd)"
m2="$cache/m2"
proto_root="$repo/proto"
out="$here/src/generated/java"

prop() { sed -n "s:.*<$1>\(.*\)</$1>.*:\1:p" "$here/pom.xml" | head -n1; }
protobuf_version="$(prop protobuf.version)"
grpc_codegen_version="$(prop grpc.codegen.version)"
dependency_plugin="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) classifier=linux-x86_64 ;;
  Linux-aarch64) classifier=linux-aarch_64 ;;
  Darwin-x86_64) classifier=osx-x86_64 ;;
  Darwin-arm64) classifier=osx-aarch_64 ;;
  *) echo "generate.sh: no protoc build for $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac

tools="$cache/tools"
protoc="$tools/protoc-$protobuf_version-$classifier.exe"
grpc_plugin="$tools/protoc-gen-grpc-java-$grpc_codegen_version-$classifier.exe"
wkt="$tools/protobuf-java-$protobuf_version-protos"

fetch() { # artifact coordinates -> copied into $tools
  local log
  log="$(mktemp)"
  if ! (cd "$tools" && mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$m2" \
    "$dependency_plugin:copy" -Dartifact="$1" -DoutputDirectory="$tools") >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

mkdir -p "$tools"
if [[ ! -x "$protoc" ]]; then
  echo "generate.sh: fetching protoc $protobuf_version" >&2
  fetch "com.google.protobuf:protoc:$protobuf_version:exe:$classifier"
  chmod +x "$protoc"
fi
if [[ ! -x "$grpc_plugin" ]]; then
  echo "generate.sh: fetching protoc-gen-grpc-java $grpc_codegen_version" >&2
  fetch "io.grpc:protoc-gen-grpc-java:$grpc_codegen_version:exe:$classifier"
  chmod +x "$grpc_plugin"
fi
if [[ ! -f "$wkt/google/protobuf/timestamp.proto" ]]; then
  # The well-known types (Duration, Timestamp, Empty) ship inside protobuf-java's jar.
  fetch "com.google.protobuf:protobuf-java:$protobuf_version:jar"
  rm -rf "$wkt" && mkdir -p "$wkt"
  (cd "$wkt" && unzip -q -o "$tools/protobuf-java-$protobuf_version.jar" 'google/protobuf/*.proto')
fi

rm -rf "$out"
mkdir -p "$out"
"$protoc" \
  --proto_path="$proto_root" \
  --proto_path="$wkt" \
  --plugin=protoc-gen-grpc-java="$grpc_plugin" \
  --java_out="$out" \
  --grpc-java_out="$out" \
  kafka_lease/v1/partition_lease.proto \
  kafka_lease/v1/errors.proto
echo "generate.sh: stubs written to ${out#"$repo/"}" >&2
