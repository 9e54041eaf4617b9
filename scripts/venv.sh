#!/usr/bin/env bash
# Create the project virtualenv and install gpuprov with its test extras.
# Usage: scripts/venv.sh [PYTHON] [VENV_DIR]
set -euo pipefail
py=${1:-python3}
venv=${2:-.venv}

if ! command -v "$py" >/dev/null 2>&1; then
  echo "[venv] $py not found: gpuprov needs Python >= 3.11" >&2
  exit 1
fi
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "[venv] gpuprov needs Python >= 3.11; $py is $("$py" -V 2>&1). Set PYTHON=python3.11 (or newer)." >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  if ! "$py" -m venv "$venv" >/dev/null 2>&1; then
    # Debian and Ubuntu ship venv support separately.
    rm -rf "$venv"
    ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    echo "[venv] installing python${ver}-venv" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python${ver}-venv" >/dev/null \
      || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    "$py" -m venv "$venv"
  fi
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
echo "[venv] gpuprov installed in $venv" >&2
