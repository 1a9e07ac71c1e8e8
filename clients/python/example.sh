#!/usr/bin/env bash
# Runs examples/consume.py: consumes KAFKA_LEASE_TOPIC as a member of KAFKA_LEASE_GROUP
# through the gateway at KAFKA_LEASE_ADDR, until SIGTERM or SIGINT; in queue mode when
# KAFKA_LEASE_DEAD_LETTER_TOPIC names an existing topic (not KAFKA_LEASE_TOPIC), else with
# plain Reads. Installs the pinned environment first (see env.sh), then execs Python itself so
# that signals reach it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${KAFKA_LEASE_ADDR:?set KAFKA_LEASE_ADDR to the gateway host:port}"
: "${KAFKA_LEASE_GROUP:?set KAFKA_LEASE_GROUP to the consumer group}"
: "${KAFKA_LEASE_TOPIC:?set KAFKA_LEASE_TOPIC to the topic}"
# shellcheck source=env.sh
source "$here/env.sh" >&2
# This checkout's src/, whichever checkout's editable install the shared venv holds.
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}"

cd "$here"
exec "$venv/bin/python" -u examples/consume.py
