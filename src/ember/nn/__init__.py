"""Neural network layers, each built from a config: ``LinearConfig(4, 3).init(device)``.

Every layer is a :class:`~ember.module.Module` whose parameters are
:class:`~ember.module.Param`; every config is a frozen :class:`~ember.Config`
that saves to JSON. Layers whose PyTorch counterparts store weights in another
layout register a rule with the PyTorch adapter (``ember.record.adapter.PYTORCH``),
so PyTorch state dicts load directly.

Example:
    >>> import ember
    >>> from ember import Tensor, nn
    >>> device = ember.device("ndarray")
    >>> conv = nn.Conv2dConfig([1, 8], [3, 3]).init(device)
    >>> head = nn.LinearConfig(8, 10).init(device)
    >>> x = conv(Tensor.ones([2, 1, 5, 5], device))
    >>> head(x.mean_dim(3).mean_dim(2).flatten(1)).shape
    (2, 10)
"""

from ember.nn._util import is_training
from ember.nn.conv import (
    Conv1d,
    Conv1dConfig,
    Conv2d,
    Conv2dConfig,
    PaddingConfig,
    PaddingConfig1d,
    PaddingConfig2d,
)
from ember.nn.initializer import Initializer
from ember.nn.linear import Linear, LinearConfig
from ember.nn.norm import BatchNorm, BatchNormConfig

__all__ = [
    "BatchNorm", "BatchNormConfig", "Conv1d", "Conv1dConfig", "Conv2d", "Conv2dConfig",
    "Initializer", "Linear", "LinearConfig", "PaddingConfig", "PaddingConfig1d",
    "PaddingConfig2d", "is_training",
]  # fmt: skip
