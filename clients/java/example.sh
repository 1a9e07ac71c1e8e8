#!/usr/bin/env bash
# Builds the client and runs example/Consume.java: a group member that prints
# `processed <topic> <partition> <offset>` per record. Needs KAFKA_LEASE_ADDR,
# KAFKA_LEASE_GROUP and KAFKA_LEASE_TOPIC; with KAFKA_LEASE_DEAD_LETTER_TOPIC (an existing
# topic) it consumes in queue mode, each partition in offset order, else with plain reads.
# SIGTERM/SIGINT: finish, leave the group (its leases are released, committing), exit 0.
# Maven's local repository is $KAFKA_LEASE_CLIENTS_CACHE/java/m2 (default: .cache/clients/java/m2
# of the repository, which git ignores); the build output is Maven's target/ (ignored too).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$here/../../.cache/clients}/java"
mkdir -p "$cache" && cache="$(cd "$cache" && pwd)"
m2="$cache/m2"
cd "$here"

# Build output goes to stderr: stdout carries only the example's lines.
# (sed: this Maven build prints stray colour-reset codes even in batch mode)
mvn -B -q -Dmaven.repo.local="$m2" package -DskipTests \
  dependency:build-classpath -DincludeScope=runtime -Dmdep.outputFile=target/classpath.txt 2>&1 \
  | sed 's/\x1b\[0m//g' >&2
classpath="target/kafka-lease-client-0.1.0-SNAPSHOT.jar:$(cat target/classpath.txt)"
rm -rf target/example-classes
# javac warns that sun.misc.Signal is internal API (the example uses it on purpose): its
# output is shown only when compiling fails.
if ! javac -d target/example-classes -cp "$classpath" example/Consume.java >target/javac.log 2>&1; then
  cat target/javac.log >&2
  exit 1
fi
# exec: the JVM gets the signals itself.
exec java -cp "target/example-classes:$classpath" io.github.kafkalease.examples.Consume
