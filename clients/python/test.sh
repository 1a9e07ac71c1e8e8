#!/usr/bin/env bash
# Runs the Python client's tests against the gateway at KAFKA_LEASE_ADDR with the records of
# KAFKA_LEASE_FIXTURE (without them the live tests skip, saying so). Installs the exact pins
# of requirements-dev.txt and this package (editable) into $KAFKA_LEASE_CLIENTS_CACHE/python/venv
# (default: .cache/clients/python/venv at the repository root), reused while the pins and
# pyproject.toml are unchanged.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "$here/env.sh"

# The package under test is this checkout's src/: the venv's editable install points at the
# src/ of whichever checkout (re)made the venv, which another worktree sharing the cache may be.
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}"

echo "test.sh: $("$venv/bin/python" --version), tests in $here/tests" >&2
cd "$here"
exec "$venv/bin/python" -m pytest -v -p no:cacheprovider "$@"
