"""Backend implementations and decorators, one folder each.

Backends with optional dependencies register a factory that imports them on
first use, so ``import ember`` works without those dependencies installed.
Decorators register themselves here too (``device.autodiff()``,
``device.fusion()``), loading their package on first use.
"""

from ember.backend.device import register_backend, register_decorator
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


def _autodiff(inner, **options):
    from ember.backends.autodiff import Autodiff

    return Autodiff(inner, **options)


def _fusion(inner, **options):
    from ember.backends.fusion import Fusion

    return Fusion(inner, **options)


register_decorator("autodiff", _autodiff)
register_decorator("fusion", _fusion)
