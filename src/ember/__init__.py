"""ember: a deep learning framework for Python on the design of Burn.

One model code for every backend: tensors are handles on a backend chosen by
their device, and decorators (autodiff, fusion) wrap any backend.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> x = Tensor.from_data([[2.0, 3.0], [4.0, 5.0]], device=ember.device("ndarray"))
    >>> (x + Tensor.ones_like(x)).tolist()
    [[3.0, 4.0], [5.0, 6.0]]

Subpackages are attributes that import on first use (``ember.nn.Linear`` works after a
plain ``import ember``), so ``import ember`` stays light: it loads neither torch, onnx
nor numba, nor the subpackages that a script does not touch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:  # type checkers and IDEs see the lazy subpackages as plain imports
    from ember import (  # noqa: F401
        backends,
        bench,
        data,
        distributed,
        func,
        guide,
        nn,
        onnx,
        optim,
        quantization,
        record,
        train,
    )

__version__ = "0.1.0"

#: The subpackages imported on first attribute access (PEP 562).
_LAZY_SUBPACKAGES = frozenset({
    "backends", "bench", "data", "distributed", "func", "guide", "nn", "onnx", "optim",
    "quantization", "record", "train",
})  # fmt: skip


def __getattr__(name: str) -> Any:
    """Imports a subpackage the first time it is read as an attribute (``ember.nn``)."""
    if name in _LAZY_SUBPACKAGES:
        # import_module sets the attribute on this package, so this runs once per name.
        return importlib.import_module(f"ember.{name}")
    raise AttributeError(f"module 'ember' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBPACKAGES)


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
