# Sourced by test.sh and example.sh: sets $venv to $KAFKA_LEASE_CLIENTS_CACHE/python/venv
# (default: .cache/clients/python/venv at the repository root, which git ignores), (re)creating
# it (deleting the old one) when requirements-dev.txt or pyproject.toml changed.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KAFKA_LEASE_CLIENTS_CACHE:-$here/../../.cache/clients}/python"
mkdir -p "$cache" && cache="$(cd "$cache" && pwd)"
venv="$cache/venv"
python="${PYTHON:-python3}"

want="$(cat "$here/requirements-dev.txt" "$here/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ]]; then
  echo "installing the pinned dependencies into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    -r "$here/requirements-dev.txt"
  # The package itself, editable; no build isolation, so no unpinned build backend download.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -e "$here"
  "$venv/bin/python" -m pip check >&2
  echo "$want" >"$venv/.requirements"
fi
