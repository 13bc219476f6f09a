"""AdamW (Loshchilov & Hutter, 2019): Adam with weight decay applied to the weights directly."""

from __future__ import annotations

from ember.config import Config
from ember.config.fields import NonNegativeFloat
from ember.optim._util import Beta
from ember.optim.adam import AdaptiveMomentum
from ember.optim.clipping import GradientClippingConfig
from ember.optim.optimizer import OptimizerAdaptor, SimpleOptimizer, State
from ember.tensor import Tensor


class AdamWConfig(Config):
    """Configuration of the AdamW optimizer.

    Each step first shrinks the parameter, ``param *= 1 - lr * weight_decay``, then
    takes Adam's step (see :class:`~ember.optim.adam.AdamConfig`); the decay never
    passes through the moment estimates. This is ``torch.optim.AdamW``'s update.

    The defaults are Burn's: PyTorch's ``epsilon`` is 1e-8 (Burn: **1e-5**) and its
    ``weight_decay`` 1e-2 (Burn: **1e-4**).

    Args:
        beta_1: decay rate of the gradient's average, in ``[0, 1)``. Default: 0.9.
        beta_2: decay rate of the squared gradient's average, in ``[0, 1)``. Default: 0.999.
        epsilon: added to the denominator for stability, >= 0. Default: 1e-5.
        weight_decay: the decoupled decay rate, >= 0. Default: 1e-4.
        amsgrad: use the largest ``moment_2`` seen so far. Default: False.
        gradient_clipping: how to clip each parameter's gradient first. Default: None.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.linear import LinearConfig
        >>> from ember.optim.adamw import AdamWConfig
        >>> device = ember.device("ndarray").autodiff()
        >>> model = LinearConfig(2, 1).init(device)
        >>> zero = Tensor.zeros([1, 2], device)
        >>> grads = (model(zero) * 0.0).sum().backward()  # zero gradients: only the decay acts
        >>> after = AdamWConfig(weight_decay=0.5).init().step(0.1, model, grads)
        >>> ratio = after.weight.val() / model.weight.val()
        >>> [round(v, 4) for v in ratio.reshape([2]).tolist()]
        [0.95, 0.95]
    """

    beta_1: Beta = 0.9
    beta_2: Beta = 0.999
    epsilon: NonNegativeFloat = 1e-5
    weight_decay: NonNegativeFloat = 1e-4
    amsgrad: bool = False
    gradient_clipping: GradientClippingConfig | None = None

    def init(self) -> OptimizerAdaptor:
        """A new AdamW optimizer, without state."""
        return OptimizerAdaptor(AdamW(self), self.gradient_clipping)


class AdamW(SimpleOptimizer):
    """The AdamW update of one tensor."""

    def __init__(self, config: AdamWConfig) -> None:
        self.config = config
        self.momentum = AdaptiveMomentum(
            config.beta_1, config.beta_2, config.epsilon, config.amsgrad
        )

    def state_fields(self) -> dict[str, type]:
        return self.momentum.state_fields()

    def step(
        self, lr: float, tensor: Tensor, grad: Tensor, state: State | None
    ) -> tuple[Tensor, State | None]:
        direction, state = self.momentum.transform(grad, state)
        decay = lr * self.config.weight_decay
        decayed = tensor * (1.0 - decay) if decay else tensor
        return decayed - direction * lr, state

    def __repr__(self) -> str:
        return f"AdamW({self.config!r})"
