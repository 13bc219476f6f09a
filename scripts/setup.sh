#!/usr/bin/env bash
# Creates .venv (once) and installs ember with the extras given as arguments.
# Usage: bash scripts/setup.sh [extra,...]   e.g. bash scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
extras="${1:-}"
spec="."
if [ -n "$extras" ]; then spec=".[${extras}]"; fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
