"""Gradient clipping: bounding each parameter's gradient before the optimizer uses it.

Every optimizer config has a ``gradient_clipping`` field that takes one of:

* ``GradientClippingConfig.Value(threshold)``: each element is clamped to
  ``[-threshold, threshold]`` (``torch.nn.utils.clip_grad_value_``).
* ``GradientClippingConfig.Norm(max_norm)``: a gradient whose L2 norm exceeds
  ``max_norm`` is scaled by ``max_norm / (norm + 1e-6)``.

As in Burn, the norm is taken **per parameter tensor**: each parameter's gradient
is clipped on its own. PyTorch's ``clip_grad_norm_(model.parameters(), max_norm)``
clips the norm of all gradients together; ember's ``Norm`` equals calling it once
per parameter.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.optim.clipping import GradientClippingConfig
    >>> grad = Tensor.from_data([3.0, -4.0], ember.device("ndarray"))
    >>> GradientClippingConfig.Value(1.0).clip(grad).tolist()
    [1.0, -1.0]
    >>> [round(v, 4) for v in GradientClippingConfig.Norm(1.0).clip(grad).tolist()]
    [0.6, -0.8]
"""

from __future__ import annotations

from ember.config import Variant
from ember.config.fields import PositiveFloat
from ember.tensor import Tensor

__all__ = ["GradientClippingConfig", "Norm", "Value"]

# Keeps the scale finite for a zero gradient (the same guard PyTorch's clip_grad_norm_ uses).
_NORM_EPSILON = 1e-6


class GradientClippingConfig(Variant):
    """How an optimizer bounds each gradient: ``GradientClippingConfig.Value(threshold)`` or
    ``GradientClippingConfig.Norm(max_norm)``; saved by variant name in a config's JSON."""

    def clip(self, grad: Tensor) -> Tensor:
        """``grad`` clipped (a new tensor on the same device)."""
        raise NotImplementedError


class Value(GradientClippingConfig):
    """Clamps every element of a gradient to ``[-threshold, threshold]``.

    Args:
        threshold: the largest absolute value kept; must be > 0.
    """

    threshold: PositiveFloat

    def clip(self, grad: Tensor) -> Tensor:
        return grad.clamp(-self.threshold, self.threshold)


class Norm(GradientClippingConfig):
    """Scales a gradient down to L2 norm ``max_norm`` when its norm is larger.

    Each parameter's gradient is clipped on its own (Burn's rule), not all together
    as ``torch.nn.utils.clip_grad_norm_`` does.

    Args:
        max_norm: the largest L2 norm kept; must be > 0.
    """

    max_norm: PositiveFloat

    def clip(self, grad: Tensor) -> Tensor:
        norm = (grad * grad).sum().sqrt()
        # A scale tensor (not a Python float) keeps the step free of a device sync.
        scale = (self.max_norm / (norm + _NORM_EPSILON)).clamp_max(1.0)
        return grad * scale
