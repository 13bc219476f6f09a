"""Gradient tests run on every autodiff backend: Autodiff(NdArray) and Autodiff(Torch), on the
CPU and, where torch sees a GPU, on CUDA."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import ember

sys.path.insert(0, str(Path(__file__).parent))

AUTODIFF_BACKENDS = {
    "autodiff-ndarray": lambda: ember.device("ndarray").autodiff(),
    "autodiff-torch": lambda: ember.device("torch").autodiff(),
    "autodiff-fusion": lambda: ember.device("ndarray").fusion(runtime="interpreter").autodiff(),
    # Compiles some 500 kernels (minutes on 2 cores): run when EMBER_TEST_AUTODIFF names it.
    "autodiff-fusion-numba": lambda: ember.device("ndarray").fusion(runtime="numba").autodiff(),
    "autodiff-torch-cuda": lambda: _cuda_device().autodiff(),
    # Triton kernels on the GPU (ember[gpu-jit]), under the gradients.
    "autodiff-fusion-torch-cuda": lambda: _cuda_fusion().autodiff(),
    # The same kernels in Triton's interpreter on CPU tensors: run when named (minutes).
    "autodiff-fusion-triton": lambda: _triton_fusion().autodiff(),
}
OPT_IN = frozenset({"autodiff-fusion-numba", "autodiff-fusion-triton"})


def _triton_fusion() -> ember.Device:
    from ember.backends.fusion import triton_runtime

    if not triton_runtime.available():
        pytest.skip("triton is not installed: the autodiff-fusion-triton cases need ember[gpu-jit]")
    with triton_runtime.interpreter():  # while the runtime is made: it keeps the mode
        return ember.device("torch").fusion(runtime="triton")


def _cuda_fusion() -> ember.Device:
    device = _cuda_device()
    from ember.backends.fusion import triton_runtime

    if not triton_runtime.available():
        pytest.skip("triton is not installed: the fusion cases on cuda need ember[gpu-jit]")
    return device.fusion(runtime="triton")


def _cuda_device() -> ember.Device:
    if ember.device_count("torch", "cuda") == 0:
        pytest.skip("no CUDA device: the autodiff-torch-cuda cases run only where torch sees a GPU")
    import torch

    # Full f32 on cuDNN (not its default TF32), to compare with f32 references made on the CPU.
    torch.backends.cudnn.allow_tf32 = False
    return ember.device("torch", "cuda:0")


def _selected() -> list[str]:
    wanted = os.environ.get("EMBER_TEST_AUTODIFF")
    if wanted:
        return [b.strip() for b in wanted.split(",")]
    return [b for b in AUTODIFF_BACKENDS if b not in OPT_IN]


@pytest.fixture(params=_selected())
def device(request) -> ember.Device:
    return AUTODIFF_BACKENDS[request.param]()
