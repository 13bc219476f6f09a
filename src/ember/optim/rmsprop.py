"""RMSProp (Hinton, 2012): steps divided by a running root mean square of the gradient."""

from __future__ import annotations

from ember.config import Config
from ember.config.fields import NonNegativeFloat
from ember.optim._util import UnitFloat
from ember.optim.clipping import GradientClippingConfig
from ember.optim.decay import WeightDecayConfig
from ember.optim.optimizer import OptimizerAdaptor, SimpleOptimizer, State
from ember.tensor import Tensor


class RmsPropConfig(Config):
    """Configuration of the RMSProp optimizer.

    Each step updates ``square_avg = alpha * square_avg + (1 - alpha) * grad**2``
    and divides the gradient by ``sqrt(square_avg) + epsilon``. With ``centered``
    the squared mean of a running gradient average ``grad_avg`` is subtracted first
    (an estimate of the variance); with ``momentum > 0`` the scaled gradients are
    accumulated in a buffer ``momentum_buffer`` that is then the step. The update of
    ``torch.optim.RMSprop`` with the same settings.

    The defaults are Burn's; PyTorch's ``epsilon`` is 1e-8 where Burn's is **1e-5**.

    Args:
        alpha: decay rate of the squared gradient's average, in ``[0, 1]``. Default: 0.99.
        epsilon: added to the denominator for stability, >= 0. Default: 1e-5.
        weight_decay: an L2 penalty added to the gradient. Default: None.
        momentum: the momentum factor, >= 0; 0 for none. Default: 0.
        centered: normalize by the gradient's estimated variance. Default: False.
        gradient_clipping: how to clip each parameter's gradient first. Default: None.

    Example:
        >>> from ember.optim.rmsprop import RmsPropConfig
        >>> list(RmsPropConfig(momentum=0.9, centered=True).init().optimizer.state_fields())
        ['square_avg', 'grad_avg', 'momentum_buffer']
    """

    alpha: UnitFloat = 0.99
    epsilon: NonNegativeFloat = 1e-5
    weight_decay: WeightDecayConfig | None = None
    momentum: NonNegativeFloat = 0.0
    centered: bool = False
    gradient_clipping: GradientClippingConfig | None = None

    def init(self) -> OptimizerAdaptor:
        """A new RMSProp optimizer, without state."""
        return OptimizerAdaptor(RmsProp(self), self.gradient_clipping)


class RmsProp(SimpleOptimizer):
    """The RMSProp update of one tensor."""

    def __init__(self, config: RmsPropConfig) -> None:
        self.config = config

    def state_fields(self) -> dict[str, type]:
        fields: dict[str, type] = {"square_avg": Tensor}
        if self.config.centered:
            fields["grad_avg"] = Tensor
        if self.config.momentum > 0:
            fields["momentum_buffer"] = Tensor
        return fields

    def step(
        self, lr: float, tensor: Tensor, grad: Tensor, state: State | None
    ) -> tuple[Tensor, State | None]:
        config = self.config
        alpha = config.alpha
        if config.weight_decay is not None:
            grad = config.weight_decay.transform(grad, tensor)
        # Every average starts from zero, so a missing state contributes nothing.
        square_avg = grad * grad * (1.0 - alpha)
        if state is not None:
            square_avg = state["square_avg"] * alpha + square_avg
        new_state: State = {"square_avg": square_avg}
        mean_square = square_avg
        if config.centered:
            grad_avg = grad * (1.0 - alpha)
            if state is not None:
                grad_avg = state["grad_avg"] * alpha + grad_avg
            new_state["grad_avg"] = grad_avg
            mean_square = square_avg - grad_avg * grad_avg
        direction = grad / (mean_square.sqrt() + config.epsilon)
        if config.momentum > 0:
            if state is not None:
                direction = state["momentum_buffer"] * config.momentum + direction
            new_state["momentum_buffer"] = direction
        return tensor - direction * lr, new_state

    def __repr__(self) -> str:
        return f"RmsProp({self.config!r})"
