"""Fixtures of the optimizer tests: models train on NdArray and Torch with autodiff (CUDA too,
where there is a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ember

sys.path.insert(0, str(Path(__file__).parent))


def _cuda() -> ember.Device:
    if ember.device_count("torch", "cuda") == 0:
        pytest.skip(
            "no CUDA device: the optim tests' torch-cuda cases run only where torch sees a GPU"
        )
    return ember.device("torch", "cuda:0")


BASE = {
    "ndarray": lambda: ember.device("ndarray"),
    "torch": lambda: ember.device("torch"),
    "torch-cuda": _cuda,
}


@pytest.fixture(params=list(BASE))
def ad_device(request) -> ember.Device:
    """An autodiff device, where models train."""
    return BASE[request.param]().autodiff()
