"""The NumPy backend."""

from ember.backend.device import register_backend
from ember.backends.ndarray.backend import NdArray

register_backend("ndarray", NdArray)

__all__ = ["NdArray"]
