"""Convolutions: Conv1d, Conv2d and Conv3d, one implementation for any number of spatial dims.

The weight is ``[channels_out, channels_in / groups, *kernel_size]``, PyTorch's
layout, so PyTorch weights load without an adapter rule.
"""

from __future__ import annotations

import math
from typing import Any

from ember.backend.device import Device
from ember.backend.errors import ConfigError, ShapeError, fmt_shape
from ember.config import Config, Variant
from ember.config.fields import NonNegativeInts, PositiveInt, PositivePair, PositiveTriple
from ember.module import Module, Param
from ember.nn.initializer import Initializer, KaimingUniform
from ember.tensor import Tensor
from ember.tensor import module as F

_DEFAULT_INIT = KaimingUniform(gain=1 / math.sqrt(3))

# Sizes per spatial dim of a 3-d layer, as PositivePair is for 2-d ones.


class PaddingConfig(Variant):
    """How a convolution pads its input: ``Valid``, ``Same`` or ``Explicit(...)``.

    * ``PaddingConfig.Valid()``: no padding; the output shrinks by the kernel's reach.
    * ``PaddingConfig.Same()``: the output has the input's size. Needs stride 1 (as in
      PyTorch); an even reach ``dilation * (kernel_size - 1)`` pads one more at the end
      than at the start, as PyTorch's ``padding="same"`` does.
    * ``PaddingConfig.Explicit(p)`` or ``Explicit(p_1, ..., p_n)``: ``p`` zeros on both
      sides of every spatial dim, or one amount per spatial dim.

    ``PaddingConfig1d``, ``PaddingConfig2d`` and ``PaddingConfig3d`` (Burn's names) are
    this same family.

    Example:
        >>> from ember.nn import PaddingConfig
        >>> PaddingConfig.Explicit(1, 2)
        Explicit(sizes=(1, 2))
        >>> PaddingConfig.Same().to_json()
        '"Same"'
    """


class Valid(PaddingConfig):
    """No padding."""


class Same(PaddingConfig):
    """Padding that keeps the spatial size (stride 1 only)."""


class Explicit(PaddingConfig):
    """Zeros on both sides of each spatial dim: one amount for all dims, or one per dim."""

    sizes: NonNegativeInts

    def __init__(self, *sizes: int, **kwargs: Any) -> None:
        if sizes:
            kwargs["sizes"] = sizes
        super().__init__(**kwargs)

    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


PaddingConfig1d = PaddingConfig2d = PaddingConfig3d = PaddingConfig


def _resolve_padding(owner: str, padding: PaddingConfig, kernel: tuple[int, ...],
                     stride: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[tuple[int, int], ...]:  # fmt: skip
    """``(start, end)`` zeros per spatial dim."""
    n = len(kernel)
    if isinstance(padding, Valid):
        return ((0, 0),) * n
    if isinstance(padding, Explicit):
        sizes = padding.sizes * n if len(padding.sizes) == 1 else padding.sizes
        if len(sizes) != n:
            raise ConfigError(
                f"{owner}.padding: Explicit needs {'1 size' if n == 1 else f'1 or {n} sizes'} "
                f"(one per spatial dim), got {list(padding.sizes)}",
                fields=(f"{owner}.padding",),
            )
        return tuple((p, p) for p in sizes)
    if any(s != 1 for s in stride):
        raise ConfigError(
            f"{owner}.padding: Same padding needs stride 1, got stride {list(stride)} "
            "(use Explicit padding with a larger stride)",
            fields=(f"{owner}.padding",),
        )
    reach = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return tuple((r // 2, r - r // 2) for r in reach)


def check_groups(owner: str, channels: tuple[int, int], groups: int) -> None:
    """Raises ConfigError unless ``groups`` divides both channel counts."""
    c_in, c_out = channels
    if c_in % groups or c_out % groups:
        raise ConfigError(
            f"{owner}.groups: {groups} groups must divide both channels_in ({c_in}) "
            f"and channels_out ({c_out})",
            fields=(f"{owner}.groups",),
        )


def _init_conv(owner: str, module: type[_Conv], device: Device | None, channels: tuple[int, int],
               kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
               groups: int, padding: PaddingConfig, bias: bool, initializer: Initializer) -> _Conv:  # fmt: skip
    c_in, c_out = channels
    check_groups(owner, channels, groups)
    pads = _resolve_padding(owner, padding, kernel, stride, dilation)
    fans = {"fan_in": c_in // groups * math.prod(kernel), "fan_out": c_out // groups * math.prod(kernel)}
    weight = initializer.init_param([c_out, c_in // groups, *kernel], device, **fans)
    bias_param = initializer.init_param([c_out], device, **fans) if bias else None
    return module(weight, bias_param, stride, pads, dilation, groups)


class _Conv(Module):
    """The convolution of :class:`Conv1d`, :class:`Conv2d` and :class:`Conv3d`; the weight's
    rank sets the dims."""

    weight: Param
    bias: Param | None
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    groups: int

    _spatial_names = {1: "length", 2: "height, width", 3: "depth, height, width"}

    @property
    def channels_in(self) -> int:
        return self.weight.shape[1] * self.groups

    @property
    def channels_out(self) -> int:
        return self.weight.shape[0]

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return self.weight.shape[2:]

    def forward(self, x: Tensor) -> Tensor:
        x, start = self._padded(x)
        conv = _FUNCTIONAL[len(self.stride)]
        bias = self.bias.val() if self.bias is not None else None
        return conv(x, self.weight.val(), bias, self.stride, start, self.dilation, self.groups)

    def _padded(self, x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        """``x`` checked and padded where the padding is uneven, and the even padding the
        conv op adds itself (per side)."""
        n = len(self.stride)
        if x.rank != n + 2 or x.shape[1] != self.channels_in:
            raise ShapeError(
                f"{type(self).__name__}: expected an input of shape [batch, {self.channels_in} "
                f"(channels_in), {self._spatial_names.get(n, f'{n} spatial dims')}], "
                f"got {fmt_shape(x.shape)}"
            )
        start = tuple(p for p, _ in self.padding)
        extra = [end - begin for begin, end in self.padding]
        if any(extra):
            # The conv op pads symmetrically; the extra zeros of an uneven Same go at the end.
            x = x.pad([v for e in reversed(extra) for v in (0, e)])
        return x, start


_FUNCTIONAL = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


class Conv1dConfig(Config):
    """Configuration of a :class:`Conv1d` layer.

    Args:
        channels_in: channels of the input.
        channels_out: channels of the output.
        kernel_size: length of the kernel.
        stride: step between windows. Default: 1.
        dilation: spacing between kernel taps. Default: 1.
        groups: blocked connections: each output channel sees ``channels_in / groups``
            input channels. Must divide both channel counts. Default: 1.
        padding: a :class:`PaddingConfig`. Default: ``Valid()``.
        bias: whether to add a learned bias per output channel. Default: True.
        initializer: how to fill the weight and the bias, with
            ``fan_in = channels_in / groups * kernel_size`` and
            ``fan_out = channels_out / groups * kernel_size``.
            Default: ``KaimingUniform(gain=1/sqrt(3))``, as PyTorch.

    Raises:
        ConfigError: at ``init``, when ``groups`` does not divide the channels, for
            Same padding with a stride above 1 or Explicit padding of the wrong length.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn import Conv1dConfig, PaddingConfig
        >>> device = ember.device("ndarray")
        >>> conv = Conv1dConfig(2, 4, 3).with_padding(PaddingConfig.Same()).init(device)
        >>> conv.weight.shape, conv(Tensor.ones([8, 2, 10], device)).shape
        ((4, 2, 3), (8, 4, 10))
    """

    channels_in: PositiveInt
    channels_out: PositiveInt
    kernel_size: PositiveInt
    stride: PositiveInt = 1
    dilation: PositiveInt = 1
    groups: PositiveInt = 1
    padding: PaddingConfig = Valid()
    bias: bool = True
    initializer: Initializer = _DEFAULT_INIT

    def init(self, device: Device | None = None) -> Conv1d:
        """A new :class:`Conv1d` with freshly initialized parameters on ``device``."""
        return _init_conv(
            "Conv1dConfig", Conv1d, device, (self.channels_in, self.channels_out),
            (self.kernel_size,), (self.stride,), (self.dilation,), self.groups, self.padding,
            self.bias, self.initializer,
        )  # fmt: skip


class Conv1d(_Conv):
    """1-d convolution (cross-correlation) over ``[batch, channels, length]``.

    Build it with :class:`Conv1dConfig`.

    Args:
        weight: ``[channels_out, channels_in / groups, kernel_size]``.
        bias: ``[channels_out]``, or None.
        stride: one value per spatial dim.
        dilation: one value per spatial dim.
        padding: ``(start, end)`` zeros per spatial dim.
        groups: number of blocked connections.

    Shape:
        - Input: ``[batch, channels_in, length]``.
        - Output: ``[batch, channels_out, length_out]`` with
          ``length_out = (length + start + end - dilation * (kernel_size - 1) - 1) // stride + 1``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn import Conv1dConfig
        >>> conv = Conv1dConfig(4, 6, 3, groups=2, stride=2).init(ember.device("ndarray"))
        >>> conv.weight.shape, conv.channels_in, conv(Tensor.ones([1, 4, 9])).shape
        ((6, 2, 3), 4, (1, 6, 4))
    """


class Conv2dConfig(Config):
    """Configuration of a :class:`Conv2d` layer.

    Args:
        channels: ``(channels_in, channels_out)`` (a tuple or a list, as in Burn's ``[1, 8]``).
        kernel_size: ``(height, width)`` of the kernel.
        stride: step between windows per spatial dim. Default: ``(1, 1)``.
        dilation: spacing between kernel taps per spatial dim. Default: ``(1, 1)``.
        groups: blocked connections; must divide both channel counts. Default: 1.
        padding: a :class:`PaddingConfig`. Default: ``Valid()``.
        bias: whether to add a learned bias per output channel. Default: True.
        initializer: how to fill the weight and the bias, with
            ``fan_in = channels_in / groups * kh * kw`` and
            ``fan_out = channels_out / groups * kh * kw``.
            Default: ``KaimingUniform(gain=1/sqrt(3))``, as PyTorch.

    Raises:
        ConfigError: at ``init``, when ``groups`` does not divide the channels, for
            Same padding with a stride above 1 or Explicit padding of the wrong length.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn import Conv2dConfig, PaddingConfig
        >>> device = ember.device("ndarray")
        >>> config = Conv2dConfig((3, 8), (3, 3)).with_padding(PaddingConfig.Explicit(1))
        >>> conv = config.with_stride((2, 2)).init(device)
        >>> conv(Tensor.ones([1, 3, 32, 32], device)).shape
        (1, 8, 16, 16)
    """

    channels: PositivePair
    kernel_size: PositivePair
    stride: PositivePair = (1, 1)
    dilation: PositivePair = (1, 1)
    groups: PositiveInt = 1
    padding: PaddingConfig = Valid()
    bias: bool = True
    initializer: Initializer = _DEFAULT_INIT

    def init(self, device: Device | None = None) -> Conv2d:
        """A new :class:`Conv2d` with freshly initialized parameters on ``device``."""
        return _init_conv(
            "Conv2dConfig", Conv2d, device, self.channels, self.kernel_size, self.stride,
            self.dilation, self.groups, self.padding, self.bias, self.initializer,
        )  # fmt: skip


class Conv2d(_Conv):
    """2-d convolution (cross-correlation) over ``[batch, channels, height, width]``.

    Build it with :class:`Conv2dConfig`; the fields are those of :class:`Conv1d`
    with two spatial dims.

    Shape:
        - Input: ``[batch, channels_in, height, width]``.
        - Output: ``[batch, channels_out, height_out, width_out]``, each spatial size as
          for :class:`Conv1d`.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn import Conv2dConfig, PaddingConfig
        >>> conv = Conv2dConfig([3, 8], [4, 4], padding=PaddingConfig.Same()).init()
        >>> conv.padding  # an even kernel: one more zero at the end, as PyTorch's "same"
        ((1, 2), (1, 2))
        >>> conv(Tensor.ones([2, 3, 10, 12])).shape
        (2, 8, 10, 12)
    """


class Conv3dConfig(Config):
    """Configuration of a :class:`Conv3d` layer.

    Args:
        channels: ``(channels_in, channels_out)``.
        kernel_size: ``(depth, height, width)`` of the kernel.
        stride: step between windows per spatial dim. Default: ``(1, 1, 1)``.
        dilation: spacing between kernel taps per spatial dim. Default: ``(1, 1, 1)``.
        groups: blocked connections; must divide both channel counts. Default: 1.
        padding: a :class:`PaddingConfig`. Default: ``Valid()``.
        bias: whether to add a learned bias per output channel. Default: True.
        initializer: how to fill the weight and the bias, with
            ``fan_in = channels_in / groups * kd * kh * kw`` and
            ``fan_out = channels_out / groups * kd * kh * kw``.
            Default: ``KaimingUniform(gain=1/sqrt(3))``, as PyTorch.

    Raises:
        ConfigError: at ``init``, when ``groups`` does not divide the channels, for
            Same padding with a stride above 1 or Explicit padding of the wrong length.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.conv import Conv3dConfig, PaddingConfig
        >>> config = Conv3dConfig([2, 4], [3, 3, 3], padding=PaddingConfig.Explicit(1, 0, 0))
        >>> conv = config.init(ember.device("ndarray"))
        >>> conv.weight.shape, conv(Tensor.ones([1, 2, 4, 5, 6])).shape
        ((4, 2, 3, 3, 3), (1, 4, 4, 3, 4))
    """

    channels: PositivePair
    kernel_size: PositiveTriple
    stride: PositiveTriple = (1, 1, 1)
    dilation: PositiveTriple = (1, 1, 1)
    groups: PositiveInt = 1
    padding: PaddingConfig = Valid()
    bias: bool = True
    initializer: Initializer = _DEFAULT_INIT

    def init(self, device: Device | None = None) -> Conv3d:
        """A new :class:`Conv3d` with freshly initialized parameters on ``device``."""
        return _init_conv(
            "Conv3dConfig", Conv3d, device, self.channels, self.kernel_size, self.stride,
            self.dilation, self.groups, self.padding, self.bias, self.initializer,
        )  # fmt: skip


class Conv3d(_Conv):
    """3-d convolution (cross-correlation) over ``[batch, channels, depth, height, width]``.

    Build it with :class:`Conv3dConfig`; the fields are those of :class:`Conv1d`
    with three spatial dims (volumes, or video as frames x height x width).

    Shape:
        - Input: ``[batch, channels_in, depth, height, width]``.
        - Output: ``[batch, channels_out, depth_out, height_out, width_out]``, each spatial
          size as for :class:`Conv1d`.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.conv import Conv3dConfig, PaddingConfig
        >>> conv = Conv3dConfig([1, 2], [2, 3, 3], padding=PaddingConfig.Same()).init()
        >>> conv.padding
        ((0, 1), (1, 1), (1, 1))
        >>> conv(Tensor.ones([1, 1, 4, 6, 6])).shape
        (1, 2, 4, 6, 6)
    """
