"""Adam (Kingma & Ba, 2015): steps scaled by running estimates of the gradient's moments."""

from __future__ import annotations

import math

from ember.config import Config
from ember.config.fields import NonNegativeFloat
from ember.optim._util import Beta
from ember.optim.clipping import GradientClippingConfig
from ember.optim.decay import WeightDecayConfig
from ember.optim.optimizer import OptimizerAdaptor, SimpleOptimizer, State
from ember.tensor import Tensor


class AdamConfig(Config):
    """Configuration of the Adam optimizer.

    Each step keeps running averages of the gradient (``moment_1``) and of its
    square (``moment_2``), corrects their bias toward zero, and moves the parameter
    by ``lr * moment_1_hat / (sqrt(moment_2_hat) + epsilon)``, as ``torch.optim.Adam``
    does with the same settings.

    The defaults are Burn's; PyTorch's ``epsilon`` is 1e-8 where Burn's is **1e-5**.

    Args:
        beta_1: decay rate of the gradient's average, in ``[0, 1)``. Default: 0.9.
        beta_2: decay rate of the squared gradient's average, in ``[0, 1)``. Default: 0.999.
        epsilon: added to the denominator for stability, >= 0. Default: 1e-5.
        weight_decay: an L2 penalty added to the gradient (PyTorch's ``weight_decay``);
            see :class:`~ember.optim.adamw.AdamWConfig` for decoupled decay. Default: None.
        amsgrad: use the largest ``moment_2`` seen so far (Reddi et al., 2018).
            Default: False.
        gradient_clipping: how to clip each parameter's gradient first. Default: None.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.linear import LinearConfig
        >>> from ember.optim.adam import AdamConfig
        >>> device = ember.device("ndarray").autodiff()
        >>> model = LinearConfig(2, 1).init(device)
        >>> bias = model.bias.val().item()
        >>> grads = model(Tensor.ones([1, 2], device)).sum().backward()
        >>> model = AdamConfig().init().step(0.01, model, grads)
        >>> round(model.bias.val().item() - bias, 4)  # Adam's first step has size ~lr
        -0.01
    """

    beta_1: Beta = 0.9
    beta_2: Beta = 0.999
    epsilon: NonNegativeFloat = 1e-5
    weight_decay: WeightDecayConfig | None = None
    amsgrad: bool = False
    gradient_clipping: GradientClippingConfig | None = None

    def init(self) -> OptimizerAdaptor:
        """A new Adam optimizer, without state."""
        return OptimizerAdaptor(Adam(self), self.gradient_clipping)


class AdaptiveMomentum:
    """Adam's bias-corrected moment estimates; AdamW shares them.

    The state holds the step count ``time``, ``moment_1`` and ``moment_2``, and
    ``max_moment_2`` with ``amsgrad``.
    """

    def __init__(self, beta_1: float, beta_2: float, epsilon: float, amsgrad: bool) -> None:
        self.beta_1, self.beta_2, self.epsilon, self.amsgrad = beta_1, beta_2, epsilon, amsgrad

    def state_fields(self) -> dict[str, type]:
        fields: dict[str, type] = {"time": int, "moment_1": Tensor, "moment_2": Tensor}
        if self.amsgrad:
            fields["max_moment_2"] = Tensor
        return fields

    def transform(self, grad: Tensor, state: State | None) -> tuple[Tensor, State]:
        """The step direction (to be scaled by ``lr``) and the new state."""
        b1, b2 = self.beta_1, self.beta_2
        squared = grad * grad
        if state is None:  # the averages start from zero
            time, moment_1, moment_2 = 1, grad * (1.0 - b1), squared * (1.0 - b2)
        else:
            time = state["time"] + 1
            moment_1 = state["moment_1"] * b1 + grad * (1.0 - b1)
            moment_2 = state["moment_2"] * b2 + squared * (1.0 - b2)
        new_state: State = {"time": time, "moment_1": moment_1, "moment_2": moment_2}
        second = moment_2
        if self.amsgrad:
            second = moment_2 if state is None else state["max_moment_2"].max_pair(moment_2)
            new_state["max_moment_2"] = second
        correction_1 = 1.0 - b1**time
        correction_2 = 1.0 - b2**time
        denominator = second.sqrt() / math.sqrt(correction_2) + self.epsilon
        return moment_1 / denominator / correction_1, new_state


class Adam(SimpleOptimizer):
    """The Adam update of one tensor."""

    def __init__(self, config: AdamConfig) -> None:
        self.config = config
        self.momentum = AdaptiveMomentum(
            config.beta_1, config.beta_2, config.epsilon, config.amsgrad
        )

    def state_fields(self) -> dict[str, type]:
        return self.momentum.state_fields()

    def step(
        self, lr: float, tensor: Tensor, grad: Tensor, state: State | None
    ) -> tuple[Tensor, State | None]:
        if self.config.weight_decay is not None:
            grad = self.config.weight_decay.transform(grad, tensor)
        direction, state = self.momentum.transform(grad, state)
        return tensor - direction * lr, state

    def __repr__(self) -> str:
        return f"Adam({self.config!r})"
