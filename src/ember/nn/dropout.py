"""Dropout: zeroes random elements while training, scaling the rest to keep the mean."""

from __future__ import annotations

from ember.backend.device import Device
from ember.config import Config
from ember.config.fields import Probability
from ember.module import Module
from ember.nn._util import is_training
from ember.tensor import Distribution, Tensor


class DropoutConfig(Config):
    """Configuration of a :class:`Dropout` layer.

    Args:
        prob: the probability of zeroing each element, in ``[0, 1]``.

    Example:
        >>> from ember.nn.dropout import DropoutConfig
        >>> DropoutConfig(0.1).init()
        Dropout {prob: 0.1, params: 0}
    """

    prob: Probability

    def init(self, device: Device | None = None) -> Dropout:
        """A new :class:`Dropout`; it holds no tensors, so ``device`` is not used."""
        return Dropout(self.prob)


class Dropout(Module):
    """Randomly zeroes elements of the input while training (Srivastava et al., 2014).

    Each element is kept with probability ``1 - prob`` and scaled by ``1 / (1 - prob)``,
    so the expected value of every element is unchanged; with ``prob = 1`` the output is
    all zeros. As in Burn, the device decides the mode: the layer drops only on an
    autodiff device (training); elsewhere, e.g. after ``module.valid()``, and whenever
    ``prob`` is 0, it returns the input unchanged. The mask is drawn from the input
    device's generator, so ``ember.seed`` makes it repeatable.

    Args:
        prob: the probability of zeroing each element.

    Shape:
        - Input: any shape.
        - Output: the input's shape.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.dropout import DropoutConfig
        >>> dropout = DropoutConfig(0.5).init()
        >>> x = Tensor.ones([2, 3], ember.device("ndarray"))
        >>> dropout(x).tolist()  # not an autodiff device: inference, nothing dropped
        [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
        >>> y = dropout(Tensor.ones([1000], ember.device("ndarray").autodiff()))
        >>> sorted(set(y.tolist()))  # training: zeros, and the kept values scaled by 2
        [0.0, 2.0]
    """

    prob: float = 0.5

    def forward(self, x: Tensor) -> Tensor:
        if self.prob == 0.0 or not is_training(x.device):
            return x
        if self.prob >= 1.0:
            return x * 0.0  # keeps the graph (zero gradients) instead of cutting it
        keep = Tensor.random(
            x.shape, Distribution.bernoulli(1.0 - self.prob), x.device, dtype=x.dtype
        )
        # One scaled mask, then one product with the input: the backward is a single multiply.
        return x * (keep * (1.0 / (1.0 - self.prob)))
