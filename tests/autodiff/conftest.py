"""Gradient tests run on every autodiff backend: Autodiff(NdArray) and Autodiff(Torch), on the
CPU and, where torch sees a GPU, on CUDA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ember

sys.path.insert(0, str(Path(__file__).parent))

AUTODIFF_BACKENDS = {
    "autodiff-ndarray": lambda: ember.device("ndarray").autodiff(),
    "autodiff-torch": lambda: ember.device("torch").autodiff(),
    "autodiff-fusion": lambda: ember.device("ndarray").fusion(runtime="interpreter").autodiff(),
    "autodiff-torch-cuda": lambda: _cuda_device().autodiff(),
}


def _cuda_device() -> ember.Device:
    if ember.device_count("torch", "cuda") == 0:
        pytest.skip("no CUDA device: the autodiff-torch-cuda cases run only where torch sees a GPU")
    import torch

    # Full f32 on cuDNN (not its default TF32), to compare with f32 references made on the CPU.
    torch.backends.cudnn.allow_tf32 = False
    return ember.device("torch", "cuda:0")


@pytest.fixture(params=list(AUTODIFF_BACKENDS))
def device(request) -> ember.Device:
    return AUTODIFF_BACKENDS[request.param]()
