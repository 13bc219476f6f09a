"""ember: a deep learning framework for Python on the design of Burn.

One model code for every backend: tensors are handles on a backend chosen by
their device, and decorators (autodiff, fusion) wrap any backend.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> x = Tensor.from_data([[2.0, 3.0], [4.0, 5.0]], device=ember.device("ndarray"))
    >>> (x + Tensor.ones_like(x)).tolist()
    [[3.0, 4.0], [5.0, 6.0]]
"""

from ember.backend import (
    ArgumentError,
    Backend,
    BackendUnavailableError,
    ConfigError,
    Device,
    DeviceError,
    DTypeError,
    DTypeUsage,
    EmberError,
    EmberIndexError,
    KindError,
    ShapeError,
    UnsupportedError,
    default_device,
    device,
    device_count,
)
from ember.config import Config
from ember.module import Module, Param, ParamId, RunningState
from ember.tensor import Bool, Distribution, DType, Float, Int, Kind, Tensor, TensorData, activation

__version__ = "0.1.0"


def seed(device: Device, seed: int) -> None:
    """Seeds the random generator of ``device``: the same seed gives the same numbers."""
    device.backend.seed(device, seed)


__all__ = [
    "ArgumentError", "Backend", "BackendUnavailableError", "Bool", "Config", "ConfigError",
    "DType", "DTypeError",
    "DTypeUsage", "Device", "DeviceError", "Distribution", "EmberError", "EmberIndexError",
    "Float", "Int", "Kind", "KindError", "Module", "Param", "ParamId", "RunningState", "ShapeError",
    "Tensor", "TensorData",
    "UnsupportedError", "activation", "default_device", "device", "device_count", "seed",
]  # fmt: skip
