"""What the layers share: the training switch and the check of class or token indices."""

from __future__ import annotations

from ember.backend.device import Device
from ember.backend.errors import EmberIndexError
from ember.tensor import Tensor


def is_training(device: Device) -> bool:
    """Whether layers run in training mode on ``device``.

    As in Burn, the backend decides: on an autodiff device a layer trains
    (batch norm uses the batch's statistics, dropout drops); elsewhere, e.g. after
    ``module.valid()``, it runs for inference.
    """
    return hasattr(device.backend, "backward")


def check_indices(owner: str, what: str, indices: Tensor, size: int) -> None:
    """Raises :class:`EmberIndexError` unless every index lies in ``[0, size)``.

    It reads the smallest and the largest index back (one sync on an accelerator): the
    backends disagree on bad indices (NumPy wraps negative ones, one-hot encodings give
    zero rows, CUDA kernels abort the process), so one check serves them all.
    """
    if not indices.num_elements():
        return
    low, high = Tensor.cat([indices.min().reshape([1]), indices.max().reshape([1])], 0).tolist()
    if low < 0 or high >= size:
        raise EmberIndexError(f"{owner}: {what} must be in [0, {size}), got {low} to {high}")
