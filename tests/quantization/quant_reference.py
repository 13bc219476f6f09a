"""Per-element quantization parameters of a scheme, for the NumPy references of the tests."""

from __future__ import annotations

import numpy as np

from ember.quantization import QuantScheme


def per_element(params: np.ndarray, shape: tuple[int, ...], scheme: QuantScheme) -> np.ndarray:
    """Scales or zero points (``scheme.scales_shape(shape)``) repeated to ``shape``."""
    if scheme.granularity == "tensor":
        return np.full(shape, params)
    axis = scheme.axis % len(shape)
    if scheme.granularity == "axis":
        return np.broadcast_to(params.reshape([-1 if d == axis else 1 for d in range(len(shape))]),
                               shape)  # fmt: skip
    return np.repeat(params, scheme.block_size, axis=axis)
