"""The autodiff decorator: gradients for any backend."""

from ember.backends.autodiff.backend import Autodiff
from ember.backends.autodiff.graph import Gradients, GraphFreedError

__all__ = ["Autodiff", "Gradients", "GraphFreedError"]
