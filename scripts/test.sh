#!/usr/bin/env bash
# Sets up ember with its test dependencies, checks style, and runs the whole test suite as
# EMBER_TEST_WORKERS pytest processes side by side (default 2), each on its shard of the
# tests (tests/sharding.py, scripts/run_shards.py). Arguments go to every pytest process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check src tests benchmarks examples scripts
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
exec .venv/bin/python scripts/run_shards.py "${EMBER_TEST_WORKERS:-2}" "$@"
