#!/usr/bin/env bash
# Builds the Java client and runs its tests: FakeGatewayTest (a scripted gateway on loopback)
# always, GatewayTest against the gateway at KAFKA_LEASE_ADDR with the records described by
# KAFKA_LEASE_FIXTURE (skipped, with a message, when they are not set). Maven's local
# repository is $KAFKA_LEASE_CLIENTS_CACHE/java/m2 (default: .cache/clients/java/m2 of the
# repository, which git ignores; downloads on the first run).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$here/../../.cache/clients}/java"
mkdir -p "$cache" && cache="$(cd "$cache" && pwd)"
m2="$cache/m2"
cd "$here"

for tool in java javac mvn; do
  command -v "$tool" >/dev/null || { echo "test.sh: $tool is not on PATH (Java 17+, Maven 3.8+)" >&2; exit 1; }
done
echo "[java] $(java -version 2>&1 | head -n1); $(mvn -v 2>/dev/null | head -n1 | sed 's/\x1b\[[0-9;]*m//g')"
if [[ -z "${KAFKA_LEASE_ADDR:-}" || -z "${KAFKA_LEASE_FIXTURE:-}" ]]; then
  echo "[java] KAFKA_LEASE_ADDR or KAFKA_LEASE_FIXTURE is not set: the gateway tests will be skipped"
else
  echo "[java] gateway $KAFKA_LEASE_ADDR, fixture $KAFKA_LEASE_FIXTURE"
fi

echo "[java] mvn test (resolving dependencies into $m2, compiling, testing)"
rm -rf target/surefire-reports
status=0
# (sed: this Maven build prints stray colour-reset codes even in batch mode)
mvn -B -q -Dmaven.repo.local="$m2" test 2>&1 | sed -u 's/\x1b\[0m//g' || status=$?

passed=0 failed=0 skipped=0
for report in target/surefire-reports/TEST-*.xml; do
  [[ -f "$report" ]] || continue
  head="$(grep -m1 '<testsuite' "$report")"
  attr() { sed -n "s/.* $1=\"\([0-9]*\)\".*/\1/p" <<<"$head"; }
  tests="$(attr tests)" failures="$(attr failures)" errors="$(attr errors)" skips="$(attr skipped)"
  failed=$((failed + failures + errors))
  skipped=$((skipped + skips))
  passed=$((passed + tests - failures - errors - skips))
done
echo "$passed passed, $failed failed, $skipped skipped"
if [[ "$status" -ne 0 || "$failed" -ne 0 ]]; then
  echo "[java] tests failed (mvn exit status $status)" >&2
  exit 1
fi

echo "[java] compiling the example"
mvn -B -q -Dmaven.repo.local="$m2" dependency:build-classpath -DincludeScope=runtime \
  -Dmdep.outputFile=target/classpath.txt >target/classpath.log 2>&1 || { cat target/classpath.log >&2; exit 1; }
rm -rf target/example-check
javac -d target/example-check -cp "target/classes:$(cat target/classpath.txt)" example/Consume.java \
  >target/javac.log 2>&1 || { cat target/javac.log >&2; exit 1; }
echo "[java] all good"
