#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run, each stage under its own time limit, logs
# into LOG_DIR (default ./gpu-logs). Run it on a machine whose python has torch with CUDA,
# triton and numba, with ember importable (PYTHONPATH=src works: ember has no entry points):
#
#   PYTHONPATH=src bash scripts/gpu_checks.sh [LOG_DIR]
#
# Stages: the CUDA cases outside the big suites (Triton runtime, Torch backend, quantized
# ops, recurrent sequence ops, distributed, training), the GPU benchmarks, then every CUDA
# case of the conformance, autodiff, nn and optim suites (``-k cuda``: the device kinds
# ``torch-cuda``, ``fusion-torch-cuda``, ``autodiff-*-cuda``), spread over the cores.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR="${1:-gpu-logs}"
mkdir -p "$LOG_DIR"
PY="${PYTHON:-python3}"
WORKERS="${GPU_CHECK_WORKERS:-$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))}"
export PYTHONUNBUFFERED=1 EMBER_FUSION_CACHE="${EMBER_FUSION_CACHE:-$(mktemp -d)}"

stage() {  # stage NAME SECONDS COMMAND...: runs the command, logs it, never stops the script
    local name="$1" limit="$2"
    shift 2
    echo "=== $name (limit ${limit}s) ==="
    local start=$SECONDS
    timeout -k 10 "$limit" "$@" > "$LOG_DIR/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $(( SECONDS - start ))s ==="
    # the summary lines only (the full log is in LOG_DIR)
    grep -E '^(FAILED|ERROR)|passed|failed|error|skipped:|ms|GB/s|ratio' "$LOG_DIR/$name.log" | tail -n 60
}

nvidia-smi -L
"$PY" -c 'import torch, triton, numba, numpy; print("torch", torch.__version__, "cuda",
torch.version.cuda, torch.cuda.get_device_name(), "triton", triton.__version__, "numba",
numba.__version__, "numpy", numpy.__version__)'

PYTEST=("$PY" -m pytest -q -p no:cacheprovider --tb=short -rfE)
stage small "${GPU_CHECK_SMALL_S:-120}" "${PYTEST[@]}" -n "$WORKERS" -k cuda \
    tests/backends/fusion/test_triton_runtime.py tests/backends/test_torch.py \
    tests/quantization/test_ops.py tests/nn/test_rnn_sequence.py tests/distributed/test_cuda.py \
    tests/backend/test_creation.py tests/backend/test_indexing.py tests/train/test_learner.py
stage bench "${GPU_CHECK_BENCH_S:-60}" "$PY" benchmarks/fusion.py --cuda --repeat 5
stage suites "${GPU_CHECK_SUITES_S:-290}" "${PYTEST[@]}" -n "$WORKERS" -k cuda --maxfail 1000 \
    --durations 15 tests/backend tests/autodiff tests/nn tests/optim
