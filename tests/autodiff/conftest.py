"""Gradient tests run on every autodiff backend: Autodiff(NdArray) and Autodiff(Torch)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ember

sys.path.insert(0, str(Path(__file__).parent))

AUTODIFF_BACKENDS = {
    "autodiff-ndarray": lambda: ember.device("ndarray").autodiff(),
    "autodiff-torch": lambda: ember.device("torch").autodiff(),
}


@pytest.fixture(params=list(AUTODIFF_BACKENDS))
def device(request) -> ember.Device:
    return AUTODIFF_BACKENDS[request.param]()
