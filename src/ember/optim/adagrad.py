"""AdaGrad (Duchi et al., 2011): steps divided by the root of the summed squared gradients."""

from __future__ import annotations

from ember.config import Config
from ember.config.fields import NonNegativeFloat
from ember.optim.clipping import GradientClippingConfig
from ember.optim.decay import WeightDecayConfig
from ember.optim.optimizer import OptimizerAdaptor, SimpleOptimizer, State
from ember.tensor import Tensor


class AdaGradConfig(Config):
    """Configuration of the AdaGrad optimizer.

    Each step adds ``grad**2`` to a running ``sum`` and moves the parameter by
    ``lr_t * grad / (sqrt(sum) + epsilon)``, where the learning rate decays with the
    step count ``time`` as ``lr_t = lr / (1 + (time - 1) * lr_decay)``: the update of
    ``torch.optim.Adagrad`` (with ``initial_accumulator_value=0``).

    The defaults are Burn's; PyTorch's ``epsilon`` is 1e-10 where Burn's is **1e-5**.

    Args:
        lr_decay: how fast the learning rate decays with the step count, >= 0. Default: 0.
        epsilon: added to the denominator for stability, >= 0. Default: 1e-5.
        weight_decay: an L2 penalty added to the gradient. Default: None.
        gradient_clipping: how to clip each parameter's gradient first. Default: None.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.linear import LinearConfig
        >>> from ember.optim.adagrad import AdaGradConfig
        >>> device = ember.device("ndarray").autodiff()
        >>> model = LinearConfig(2, 1).init(device)
        >>> bias = model.bias.val().item()
        >>> grads = model(Tensor.ones([1, 2], device)).sum().backward()
        >>> model = AdaGradConfig().init().step(0.1, model, grads)  # grad / sqrt(grad**2) = 1
        >>> round(model.bias.val().item() - bias, 4)
        -0.1
    """

    lr_decay: NonNegativeFloat = 0.0
    epsilon: NonNegativeFloat = 1e-5
    weight_decay: WeightDecayConfig | None = None
    gradient_clipping: GradientClippingConfig | None = None

    def init(self) -> OptimizerAdaptor:
        """A new AdaGrad optimizer, without state."""
        return OptimizerAdaptor(AdaGrad(self), self.gradient_clipping)


class AdaGrad(SimpleOptimizer):
    """The AdaGrad update of one tensor; its state is the step count and the sum of squares."""

    def __init__(self, config: AdaGradConfig) -> None:
        self.config = config

    def state_fields(self) -> dict[str, type]:
        return {"time": int, "sum": Tensor}

    def step(
        self, lr: float, tensor: Tensor, grad: Tensor, state: State | None
    ) -> tuple[Tensor, State | None]:
        config = self.config
        if config.weight_decay is not None:
            grad = config.weight_decay.transform(grad, tensor)
        squared = grad * grad
        if state is None:
            time, total = 1, squared
        else:
            time, total = state["time"] + 1, state["sum"] + squared
        decayed_lr = lr / (1.0 + (time - 1) * config.lr_decay)
        direction = grad / (total.sqrt() + config.epsilon)
        return tensor - direction * decayed_lr, {"time": time, "sum": total}

    def __repr__(self) -> str:
        return f"AdaGrad({self.config!r})"
