#!/usr/bin/env bash
# Sets up ember and runs the main job: the guide. It trains the MNIST CNN (the dashboard
# on a terminal, plain lines otherwise), then classifies the first test digits with it.
# Arguments go to `ember guide train` (e.g. --epochs 2, --backend torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
artifact_dir="${EMBER_GUIDE_DIR:-/tmp/guide}"
.venv/bin/python -m ember guide train --artifact-dir "$artifact_dir" "$@"
exec .venv/bin/python -m ember guide infer --artifact-dir "$artifact_dir"
