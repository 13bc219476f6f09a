"""The fusion devices replay tests run on (a helper module of the fusion tests)."""

from __future__ import annotations

import pytest

import ember

FUSION_DEVICES = ["interpreter", "numba", "torch-numba"]
"""NdArray values under each CPU runtime, and Torch's CPU values under numba."""


def fusion_device(name: str) -> ember.Device:
    """The fusion device ``name`` of :data:`FUSION_DEVICES` (skipped where numba or torch
    is missing)."""
    if name.endswith("numba"):
        pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    if name == "torch-numba":
        pytest.importorskip("torch", reason="the Torch backend needs torch")
        return ember.device("torch").fusion(runtime="numba")
    return ember.device("ndarray").fusion(runtime=name)
