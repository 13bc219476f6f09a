"""The Tensor layer: Tensor, TensorData, dtypes and kinds, distributions, activations."""

from ember.tensor.data import TensorData
from ember.tensor.distribution import Distribution
from ember.tensor.dtype import Bool, DType, Float, Int, Kind

__all__ = ["Bool", "DType", "Distribution", "Float", "Int", "Kind", "Tensor", "TensorData"]


def __getattr__(name: str):
    # The backend protocol imports dtypes from this package while Tensor imports
    # the protocol; loading Tensor on first use breaks that cycle.
    if name == "Tensor":
        from ember.tensor.tensor import Tensor

        return Tensor
    raise AttributeError(f"module 'ember.tensor' has no attribute {name!r}")
