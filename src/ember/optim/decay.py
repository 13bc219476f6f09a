"""Weight decay as an L2 penalty added to the gradient."""

from __future__ import annotations

from ember.config import Config
from ember.config.fields import NonNegativeFloat
from ember.tensor import Tensor


class WeightDecayConfig(Config):
    """An L2 penalty: the gradient becomes ``grad + penalty * param``.

    This is the ``weight_decay`` of ``torch.optim.SGD``, ``Adam``, ``RMSprop`` and
    ``Adagrad``. AdamW decays the weights directly instead (see
    :class:`~ember.optim.adamw.AdamWConfig`).

    Args:
        penalty: the L2 coefficient; must be >= 0.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.optim.decay import WeightDecayConfig
        >>> device = ember.device("ndarray")
        >>> grad, param = Tensor.ones([2], device), Tensor.from_data([2.0, -4.0], device)
        >>> WeightDecayConfig(0.5).transform(grad, param).tolist()
        [2.0, -1.0]
    """

    penalty: NonNegativeFloat

    def transform(self, grad: Tensor, param: Tensor) -> Tensor:
        """The gradient with the penalty's own gradient added."""
        return grad + param * self.penalty if self.penalty else grad
