"""Fixtures of the nn tests: layers run on NdArray and Torch (CUDA too, where there is a GPU),
with and without autodiff."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ember

sys.path.insert(0, str(Path(__file__).parent))


def _cuda() -> ember.Device:
    if ember.device_count("torch", "cuda") == 0:
        pytest.skip("no CUDA device: the nn tests' torch-cuda cases run only where torch sees a GPU")
    import torch

    # Full f32 on cuDNN (not its default TF32), to compare with f32 references made on the CPU.
    torch.backends.cudnn.allow_tf32 = False
    return ember.device("torch", "cuda:0")


def _cuda_fusion() -> ember.Device:
    device = _cuda()
    from ember.backends.fusion import triton_runtime

    if not triton_runtime.available():
        pytest.skip("triton is not installed: the nn tests' fusion cases on cuda need ember[gpu-jit]")
    return device.fusion(runtime="triton")


BASE = {
    "ndarray": lambda: ember.device("ndarray"),
    "torch": lambda: ember.device("torch"),
    "torch-cuda": _cuda,
    # Triton kernels generated from the fused IR, on the GPU.
    "fusion-torch-cuda": _cuda_fusion,
}


@pytest.fixture(params=list(BASE))
def base_device(request) -> ember.Device:
    """A device without autodiff: layers run for inference."""
    return BASE[request.param]()


@pytest.fixture(params=list(BASE))
def ad_device(request) -> ember.Device:
    """An autodiff device: layers train and gradients flow."""
    return BASE[request.param]().autodiff()
