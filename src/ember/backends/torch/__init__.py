"""The PyTorch backend (optional: ``pip install 'ember[torch]'``)."""

from ember.backends.torch.backend import Torch

__all__ = ["Torch"]
