"""The training switch the layers share."""

from __future__ import annotations

from ember.backend.device import Device
from ember.config.fields import PositiveInt  # noqa: F401  (rnn.py's import, until it moves)


def is_training(device: Device) -> bool:
    """Whether layers run in training mode on ``device``.

    As in Burn, the backend decides: on an autodiff device a layer trains
    (batch norm uses the batch's statistics, dropout drops); elsewhere, e.g. after
    ``module.valid()``, it runs for inference.
    """
    return hasattr(device.backend, "backward")
