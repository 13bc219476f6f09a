"""Momentum for SGD: a running velocity of the gradients, with optional Nesterov look-ahead."""

from __future__ import annotations

from ember.config import Config
from ember.config.fields import NonNegativeFloat
from ember.optim._util import UnitFloat
from ember.tensor import Tensor


class MomentumConfig(Config):
    """Heavy-ball momentum, as ``torch.optim.SGD`` applies it.

    The first step's velocity is the gradient itself; after that
    ``velocity = momentum * velocity + (1 - dampening) * grad``. The step direction
    is the velocity, or ``grad + momentum * velocity`` with ``nesterov``.

    The defaults are Burn's: momentum 0.9 and **dampening 0.1** (PyTorch's SGD has no
    momentum by default and dampening 0). Unlike PyTorch, which refuses Nesterov
    momentum with a nonzero dampening, ember (like Burn) applies both.

    Args:
        momentum: the velocity's decay factor; must be >= 0. Default: 0.9.
        dampening: the share of each new gradient left out of the velocity, in
            ``[0, 1]``. Default: 0.1.
        nesterov: whether to use Nesterov's look-ahead. Default: False.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.optim.momentum import MomentumConfig
        >>> grad = Tensor.ones([2], ember.device("ndarray"))
        >>> step, velocity = MomentumConfig().transform(grad, None)
        >>> step, velocity = MomentumConfig().transform(grad, velocity)
        >>> [round(v, 4) for v in step.tolist()]  # 0.9 * 1 + (1 - 0.1) * 1
        [1.8, 1.8]
    """

    momentum: NonNegativeFloat = 0.9
    dampening: UnitFloat = 0.1
    nesterov: bool = False

    def transform(self, grad: Tensor, velocity: Tensor | None) -> tuple[Tensor, Tensor]:
        """The step direction and the new velocity, from the gradient and the last velocity."""
        if velocity is None:
            velocity = grad
        else:
            velocity = velocity * self.momentum + grad * (1.0 - self.dampening)
        step = grad + velocity * self.momentum if self.nesterov else velocity
        return step, velocity
