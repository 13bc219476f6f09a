"""Stochastic gradient descent, with optional weight decay and momentum."""

from __future__ import annotations

from ember.config import Config
from ember.optim.clipping import GradientClippingConfig
from ember.optim.decay import WeightDecayConfig
from ember.optim.momentum import MomentumConfig
from ember.optim.optimizer import OptimizerAdaptor, SimpleOptimizer, State
from ember.tensor import Tensor


class SgdConfig(Config):
    """Configuration of stochastic gradient descent: ``param -= lr * direction``.

    The direction is the gradient, with the L2 penalty added when ``weight_decay``
    is set, and run through momentum when ``momentum`` is set; the same update as
    ``torch.optim.SGD`` with those settings.

    Args:
        weight_decay: an L2 penalty added to the gradient. Default: None.
        momentum: momentum settings. Default: None (plain SGD). Note that
            ``MomentumConfig()`` has Burn's defaults: momentum 0.9, dampening 0.1.
        gradient_clipping: how to clip each parameter's gradient first. Default: None.

    Example:
        >>> from ember.optim.momentum import MomentumConfig
        >>> from ember.optim.sgd import SgdConfig
        >>> optimizer = SgdConfig(momentum=MomentumConfig(nesterov=True, dampening=0.0)).init()
        >>> list(optimizer.optimizer.state_fields())  # the state kept per parameter
        ['velocity']
    """

    weight_decay: WeightDecayConfig | None = None
    momentum: MomentumConfig | None = None
    gradient_clipping: GradientClippingConfig | None = None

    def init(self) -> OptimizerAdaptor:
        """A new SGD optimizer, without state."""
        return OptimizerAdaptor(Sgd(self), self.gradient_clipping)


class Sgd(SimpleOptimizer):
    """The SGD update of one tensor; its state is the momentum's velocity, if any."""

    def __init__(self, config: SgdConfig) -> None:
        self.config = config

    def state_fields(self) -> dict[str, type]:
        return {} if self.config.momentum is None else {"velocity": Tensor}

    def step(
        self, lr: float, tensor: Tensor, grad: Tensor, state: State | None
    ) -> tuple[Tensor, State | None]:
        config = self.config
        if config.weight_decay is not None:
            grad = config.weight_decay.transform(grad, tensor)
        new_state = None
        if config.momentum is not None:
            velocity = None if state is None else state["velocity"]
            grad, velocity = config.momentum.transform(grad, velocity)
            new_state = {"velocity": velocity}
        return tensor - grad * lr, new_state

    def __repr__(self) -> str:
        return f"Sgd({self.config!r})"
