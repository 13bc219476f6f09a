"""Helpers of the nn tests: PyTorch state dicts as ember records, and comparisons."""

from __future__ import annotations

import numpy as np
import torch

from ember import Tensor, TensorData
from ember.record.adapter import PYTORCH
from ember.record.imported import ImportedRecord


def to_data(t: torch.Tensor) -> TensorData:
    return TensorData(t.detach().cpu().numpy())


def pytorch_record(module: torch.nn.Module) -> ImportedRecord:
    """The module's state dict as PyTorchFileRecorder would give it (adapter included)."""
    return ImportedRecord({k: to_data(v) for k, v in module.state_dict().items()}, adapter=PYTORCH)


def from_torch(t: torch.Tensor, device) -> Tensor:
    return Tensor.from_data(to_data(t), device)


def assert_close(actual: Tensor, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5):
    np.testing.assert_allclose(
        actual.to_numpy(), expected.detach().cpu().numpy(), atol=atol, rtol=rtol
    )
