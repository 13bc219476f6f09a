"""The autodiff decorator: gradients for any backend."""

from ember.backends.autodiff.backend import Autodiff
from ember.backends.autodiff.graph import Gradients, GraphFreedError
from ember.backends.autodiff.partial import Partial
from ember.backends.autodiff.rule import Saved, backward, unbroadcast

__all__ = [
    "Autodiff", "Gradients", "GraphFreedError", "Partial", "Saved", "backward", "unbroadcast",
]
