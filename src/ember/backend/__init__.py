"""The Backend protocol, devices, the op table and ember's errors; the built-in backends."""

from ember.backend.base import Backend, DTypeUsage
from ember.backend.custom import CustomOp, custom_op
from ember.backend.device import (
    Device,
    default_device,
    device,
    device_count,
    register_backend,
    register_decorator,
)
from ember.backend.errors import (
    ArgumentError,
    BackendUnavailableError,
    ConfigError,
    ConfigFileNotFoundError,
    DeviceError,
    DTypeError,
    EmberError,
    EmberIndexError,
    KindError,
    ShapeError,
    UnsupportedError,
)
from ember.backend.ops import OPS, OpDef, ops
from ember.backend.rules import AVal

# The base backends import the protocol above, so they come last.
from ember.backends.ndarray import NdArray

__all__ = [
    "OPS",
    "AVal",
    "ArgumentError",
    "Backend",
    "BackendUnavailableError",
    "ConfigError",
    "ConfigFileNotFoundError",
    "CustomOp",
    "DTypeError",
    "DTypeUsage",
    "Device",
    "DeviceError",
    "EmberError",
    "EmberIndexError",
    "KindError",
    "NdArray",
    "OpDef",
    "ShapeError",
    "UnsupportedError",
    "custom_op",
    "default_device",
    "device",
    "device_count",
    "ops",
    "register_backend",
    "register_decorator",
]  # fmt: skip


def __getattr__(name: str):
    # Optional backends load on first use: ``from ember.backend import Torch`` needs torch.
    if name == "Torch":
        from ember.backends.torch import Torch

        return Torch
    raise AttributeError(f"module 'ember.backend' has no attribute {name!r}")
