"""Backend implementations, one folder each.

Backends with optional dependencies register a factory that imports them on
first use, so ``import ember`` works without those dependencies installed.
"""

from ember.backend.device import register_backend
from ember.backend.errors import BackendUnavailableError


def _torch(**options):
    try:
        from ember.backends.torch import Torch
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        raise BackendUnavailableError(
            "the 'torch' backend needs PyTorch, which is not installed; "
            "install it with: pip install 'ember[torch]'"
        ) from None
    return Torch(**options)


register_backend("torch", _torch)
