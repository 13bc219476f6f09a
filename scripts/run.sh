#!/usr/bin/env bash
# Sets up ember and runs the main job: the getting-started example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/getting_started.py "$@"
