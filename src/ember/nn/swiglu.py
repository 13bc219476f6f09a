"""SwiGlu: a gated linear unit with a SiLU gate (Shazeer, 2020), built from two Linear layers."""

from __future__ import annotations

import math

from ember.backend.device import Device
from ember.backend.errors import ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt
from ember.module import Module
from ember.nn.initializer import Initializer, KaimingUniform
from ember.nn.linear import Linear, LinearConfig
from ember.tensor import Tensor
from ember.tensor.activation import silu


class SwiGluConfig(Config):
    """Configuration of a :class:`SwiGlu` layer.

    Args:
        d_input: size of each input (the last dim).
        d_output: size of each output.
        bias: whether both linear maps add a learned bias. Default: False (Burn's default,
            as in the feed-forward blocks of LLaMA-style models).
        initializer: how to fill both linear maps, as for :class:`~ember.nn.linear.LinearConfig`.
            Default: ``KaimingUniform(gain=1/sqrt(3))``.

    Example:
        >>> import ember
        >>> from ember.nn.swiglu import SwiGluConfig
        >>> layer = SwiGluConfig(8, 16).init(ember.device("ndarray"))
        >>> layer.linear_inner.weight.shape, layer.linear_outer.bias
        ((8, 16), None)
    """

    d_input: PositiveInt
    d_output: PositiveInt
    bias: bool = False
    initializer: Initializer = KaimingUniform(gain=1 / math.sqrt(3))

    def init(self, device: Device | None = None) -> SwiGlu:
        """A new :class:`SwiGlu` with two freshly initialized linear maps on ``device``."""
        linear = LinearConfig(
            self.d_input, self.d_output, bias=self.bias, initializer=self.initializer
        )
        return SwiGlu(linear.init(device), linear.init(device))


class SwiGlu(Module):
    """``silu(linear_inner(x)) * linear_outer(x)`` over the last dim.

    Args:
        linear_inner: the gate's linear map, passed through SiLU.
        linear_outer: the value's linear map.

    Shape:
        - Input: ``[..., d_input]``.
        - Output: ``[..., d_output]``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.swiglu import SwiGluConfig
        >>> layer = SwiGluConfig(4, 6).init()
        >>> layer(Tensor.ones([2, 3, 4])).shape
        (2, 3, 6)
    """

    linear_inner: Linear
    linear_outer: Linear

    def forward(self, x: Tensor) -> Tensor:
        d_input = self.linear_inner.d_input
        if not x.shape or x.shape[-1] != d_input:
            raise ShapeError(
                f"SwiGlu: expected an input of shape [..., {d_input}] (d_input), "
                f"got {fmt_shape(x.shape)}"
            )
        return silu(self.linear_inner(x)) * self.linear_outer(x)
