#!/usr/bin/env bash
# Sets up ember with its test dependencies, checks style, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check src tests benchmarks examples
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
exec .venv/bin/python -m pytest -n "${EMBER_TEST_WORKERS:-2}" --dist worksteal -q "$@"
