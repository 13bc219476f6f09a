"""Transposed convolutions: ConvTranspose1d, 2d and 3d, one implementation for any rank.

A transposed convolution is the gradient of a convolution with respect to its
input: it spreads every input value over a window of the output, so with a
stride above 1 it upsamples. The weight is ``[channels_in, channels_out / groups,
*kernel_size]``, PyTorch's and Burn's layout, so PyTorch weights load without an
adapter rule.

Padding is given as explicit sizes, as in Burn and PyTorch: ``padding`` zeros are
taken off both ends of every output dim and ``padding_out`` adds rows at the far end
(to pick among the output sizes that a strided convolution maps to one input size).
"""

from __future__ import annotations

import math

from ember.backend.device import Device
from ember.backend.errors import ConfigError, ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import (
    NonNegativeInt,
    NonNegativePair,
    NonNegativeTriple,
    PositiveInt,
    PositivePair,
    PositiveTriple,
)
from ember.module import Module, Param
from ember.nn.conv import check_groups
from ember.nn.initializer import Initializer, KaimingUniform
from ember.tensor import Tensor
from ember.tensor import module as F

_DEFAULT_INIT = KaimingUniform(gain=1 / math.sqrt(3))



def _init_conv_transpose(owner: str, module: type[_ConvTranspose], device: Device | None,
                         channels: tuple[int, int], kernel: tuple[int, ...],
                         stride: tuple[int, ...], dilation: tuple[int, ...], groups: int,
                         padding: tuple[int, ...], padding_out: tuple[int, ...], bias: bool,
                         initializer: Initializer) -> _ConvTranspose:  # fmt: skip
    c_in, c_out = channels
    check_groups(owner, channels, groups)
    for p, s, d in zip(padding_out, stride, dilation):
        if p >= max(s, d):
            raise ConfigError(
                f"{owner}.padding_out: each size must be smaller than the stride or the dilation "
                f"of its dim, got padding_out {list(padding_out)} with stride {list(stride)} "
                f"and dilation {list(dilation)}",
                fields=(f"{owner}.padding_out",),
            )
    # PyTorch's fans: each output sees channels_out / groups * prod(kernel) weights of one input.
    taps = math.prod(kernel)
    fans = {"fan_in": c_out // groups * taps, "fan_out": c_in // groups * taps}
    weight = initializer.init_param([c_in, c_out // groups, *kernel], device, **fans)
    bias_param = initializer.init_param([c_out], device, **fans) if bias else None
    return module(weight, bias_param, stride, padding, padding_out, dilation, groups)


class _ConvTranspose(Module):
    """The layer behind ConvTranspose1d, 2d and 3d; the weight's rank sets the dims."""

    weight: Param
    bias: Param | None
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    padding_out: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    _spatial_names = {1: "length", 2: "height, width", 3: "depth, height, width"}

    @property
    def channels_in(self) -> int:
        return self.weight.shape[0]

    @property
    def channels_out(self) -> int:
        return self.weight.shape[1] * self.groups

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return self.weight.shape[2:]

    def forward(self, x: Tensor) -> Tensor:
        n = len(self.stride)
        if x.rank != n + 2 or x.shape[1] != self.channels_in:
            raise ShapeError(
                f"{type(self).__name__}: expected an input of shape [batch, {self.channels_in} "
                f"(channels_in), {self._spatial_names[n]}], got {fmt_shape(x.shape)}"
            )
        bias = self.bias.val() if self.bias is not None else None
        return _FUNCTIONAL[n](
            x, self.weight.val(), bias, self.stride, self.padding, self.padding_out,
            self.dilation, self.groups,
        )  # fmt: skip


_FUNCTIONAL = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class ConvTranspose1dConfig(Config):
    """Configuration of a :class:`ConvTranspose1d` layer.

    Args:
        channels: ``(channels_in, channels_out)``.
        kernel_size: length of the kernel.
        stride: spacing of the input values in the output. Default: 1.
        dilation: spacing between kernel taps. Default: 1.
        groups: blocked connections; must divide both channel counts. Default: 1.
        padding: size trimmed from both ends of the output: the padding of the convolution
            this layer transposes. Default: 0.
        padding_out: extra size added at the end of the output; smaller than ``stride`` or
            ``dilation``. Default: 0.
        bias: whether to add a learned bias per output channel. Default: True.
        initializer: how to fill the weight and the bias, with
            ``fan_in = channels_out / groups * kernel_size`` and
            ``fan_out = channels_in / groups * kernel_size``.
            Default: ``KaimingUniform(gain=1/sqrt(3))``, PyTorch's bounds.

    Raises:
        ConfigError: at ``init``, when ``groups`` does not divide the channels or
            ``padding_out`` is not below the stride or the dilation.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.conv_transpose import ConvTranspose1dConfig
        >>> up = ConvTranspose1dConfig([4, 2], 3, stride=2, padding=1, padding_out=1).init()
        >>> up.weight.shape, up(Tensor.ones([1, 4, 5])).shape
        ((4, 2, 3), (1, 2, 10))
    """

    channels: PositivePair
    kernel_size: PositiveInt
    stride: PositiveInt = 1
    dilation: PositiveInt = 1
    groups: PositiveInt = 1
    padding: NonNegativeInt = 0
    padding_out: NonNegativeInt = 0
    bias: bool = True
    initializer: Initializer = _DEFAULT_INIT

    def init(self, device: Device | None = None) -> ConvTranspose1d:
        """A new :class:`ConvTranspose1d` with freshly initialized parameters on ``device``."""
        return _init_conv_transpose(
            "ConvTranspose1dConfig", ConvTranspose1d, device, self.channels, (self.kernel_size,),
            (self.stride,), (self.dilation,), self.groups, (self.padding,), (self.padding_out,),
            self.bias, self.initializer,
        )  # fmt: skip


class ConvTranspose1d(_ConvTranspose):
    """Transposed 1-d convolution over ``[batch, channels, length]``.

    Build it with :class:`ConvTranspose1dConfig`.

    Args:
        weight: ``[channels_in, channels_out / groups, kernel_size]``.
        bias: ``[channels_out]``, or None.
        stride: one value per spatial dim.
        padding: one value per spatial dim.
        padding_out: one value per spatial dim.
        dilation: one value per spatial dim.
        groups: number of blocked connections.

    Shape:
        - Input: ``[batch, channels_in, length]``.
        - Output: ``[batch, channels_out, length_out]`` with ``length_out = (length - 1) * stride
          - 2 * padding + dilation * (kernel_size - 1) + padding_out + 1``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.conv_transpose import ConvTranspose1dConfig
        >>> up = ConvTranspose1dConfig([1, 1], 2, stride=2, bias=False).init()
        >>> up = up.map(lambda path, p: Tensor.ones(p.shape))
        >>> up(Tensor.from_data([[[1.0, 2.0, 3.0]]])).tolist()  # each value spread over 2
        [[[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]]]
    """


class ConvTranspose2dConfig(Config):
    """Configuration of a :class:`ConvTranspose2d` layer.

    Args:
        channels: ``(channels_in, channels_out)``.
        kernel_size: ``(height, width)`` of the kernel.
        stride: spacing of the input values in the output per dim. Default: ``(1, 1)``.
        dilation: spacing between kernel taps per dim. Default: ``(1, 1)``.
        groups: blocked connections; must divide both channel counts. Default: 1.
        padding: per dim, as for :class:`ConvTranspose1dConfig`. Default: ``(0, 0)``.
        padding_out: per dim, extra size at the end of the output. Default: ``(0, 0)``.
        bias: whether to add a learned bias per output channel. Default: True.
        initializer: as for :class:`ConvTranspose1dConfig`, with the kernel's area.

    Raises:
        ConfigError: at ``init``, when ``groups`` does not divide the channels or
            ``padding_out`` is not below the stride or the dilation.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.conv_transpose import ConvTranspose2dConfig
        >>> up = ConvTranspose2dConfig([8, 3], [4, 4], stride=[2, 2], padding=[1, 1]).init()
        >>> up(Tensor.ones([1, 8, 16, 16])).shape
        (1, 3, 32, 32)
    """

    channels: PositivePair
    kernel_size: PositivePair
    stride: PositivePair = (1, 1)
    dilation: PositivePair = (1, 1)
    groups: PositiveInt = 1
    padding: NonNegativePair = (0, 0)
    padding_out: NonNegativePair = (0, 0)
    bias: bool = True
    initializer: Initializer = _DEFAULT_INIT

    def init(self, device: Device | None = None) -> ConvTranspose2d:
        """A new :class:`ConvTranspose2d` with freshly initialized parameters on ``device``."""
        return _init_conv_transpose(
            "ConvTranspose2dConfig", ConvTranspose2d, device, self.channels, self.kernel_size,
            self.stride, self.dilation, self.groups, self.padding, self.padding_out, self.bias,
            self.initializer,
        )  # fmt: skip


class ConvTranspose2d(_ConvTranspose):
    """Transposed 2-d convolution over ``[batch, channels, height, width]``.

    Build it with :class:`ConvTranspose2dConfig`; the fields are those of
    :class:`ConvTranspose1d` with two spatial dims.

    Shape:
        - Input: ``[batch, channels_in, height, width]``.
        - Output: ``[batch, channels_out, height_out, width_out]``, each size as for
          :class:`ConvTranspose1d`.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.conv_transpose import ConvTranspose2dConfig
        >>> up = ConvTranspose2dConfig([4, 6], [3, 3], groups=2).init(ember.device("ndarray"))
        >>> up.weight.shape, up.channels_out, up(Tensor.ones([2, 4, 5, 5])).shape
        ((4, 3, 3, 3), 6, (2, 6, 7, 7))
    """


class ConvTranspose3dConfig(Config):
    """Configuration of a :class:`ConvTranspose3d` layer.

    Args:
        channels: ``(channels_in, channels_out)``.
        kernel_size: ``(depth, height, width)`` of the kernel.
        stride: per dim. Default: ``(1, 1, 1)``.
        dilation: per dim. Default: ``(1, 1, 1)``.
        groups: blocked connections; must divide both channel counts. Default: 1.
        padding: per dim, as for :class:`ConvTranspose1dConfig`. Default: ``(0, 0, 0)``.
        padding_out: per dim, extra size at the end of the output. Default: ``(0, 0, 0)``.
        bias: whether to add a learned bias per output channel. Default: True.
        initializer: as for :class:`ConvTranspose1dConfig`, with the kernel's volume.

    Raises:
        ConfigError: at ``init``, when ``groups`` does not divide the channels or
            ``padding_out`` is not below the stride or the dilation.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.conv_transpose import ConvTranspose3dConfig
        >>> up = ConvTranspose3dConfig([2, 1], [2, 2, 2], stride=[2, 2, 2]).init()
        >>> up(Tensor.ones([1, 2, 3, 3, 3])).shape
        (1, 1, 6, 6, 6)
    """

    channels: PositivePair
    kernel_size: PositiveTriple
    stride: PositiveTriple = (1, 1, 1)
    dilation: PositiveTriple = (1, 1, 1)
    groups: PositiveInt = 1
    padding: NonNegativeTriple = (0, 0, 0)
    padding_out: NonNegativeTriple = (0, 0, 0)
    bias: bool = True
    initializer: Initializer = _DEFAULT_INIT

    def init(self, device: Device | None = None) -> ConvTranspose3d:
        """A new :class:`ConvTranspose3d` with freshly initialized parameters on ``device``."""
        return _init_conv_transpose(
            "ConvTranspose3dConfig", ConvTranspose3d, device, self.channels, self.kernel_size,
            self.stride, self.dilation, self.groups, self.padding, self.padding_out, self.bias,
            self.initializer,
        )  # fmt: skip


class ConvTranspose3d(_ConvTranspose):
    """Transposed 3-d convolution over ``[batch, channels, depth, height, width]``.

    Build it with :class:`ConvTranspose3dConfig`; the fields are those of
    :class:`ConvTranspose1d` with three spatial dims.

    Shape:
        - Input: ``[batch, channels_in, depth, height, width]``.
        - Output: ``[batch, channels_out, depth_out, height_out, width_out]``, each size as
          for :class:`ConvTranspose1d`.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.conv_transpose import ConvTranspose3dConfig
        >>> up = ConvTranspose3dConfig([3, 3], [3, 3, 3], padding=[1, 1, 1]).init()
        >>> up(Tensor.ones([1, 3, 2, 4, 4])).shape  # stride 1, padding 1: the same size
        (1, 3, 2, 4, 4)
    """
