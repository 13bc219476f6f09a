"""Pooling layers: AvgPool1d/2d, MaxPool1d/2d and AdaptiveAvgPool1d/2d.

The windowed pools take their padding as a :class:`~ember.nn.conv.PaddingConfig`,
as the convolutions do, and their stride defaults to the window (as in Burn and
PyTorch). Padding is resolved to ``(start, end)`` sizes per dim when the layer is
built; an uneven ``Same`` puts the extra row at the end, as the convolutions do.
"""

from __future__ import annotations

from ember.backend.device import Device
from ember.backend.errors import ConfigError, ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt, PositivePair
from ember.module import Module
from ember.nn.conv import PaddingConfig, Valid, _resolve_padding
from ember.tensor import Tensor
from ember.tensor import module as F

_SPATIAL_NAMES = {1: "length", 2: "height, width"}

Pads = tuple[tuple[int, int], ...]  # (start, end) per spatial dim


def _check_rank(layer: str, x: Tensor, n: int) -> None:
    if x.rank != n + 2:
        raise ShapeError(
            f"{layer}: expected an input of shape [batch, channels, {_SPATIAL_NAMES[n]}], "
            f"got {fmt_shape(x.shape)}"
        )


def _pool_padding(owner: str, padding: PaddingConfig, kernel: tuple[int, ...],
                  stride: tuple[int, ...], dilation: tuple[int, ...]) -> Pads:  # fmt: skip
    """``(start, end)`` per dim, as the convolutions resolve it, within the pooling ops' limit."""
    pads = _resolve_padding(owner, padding, kernel, stride, dilation)
    # The pooling ops take at most half a window of padding per side (PyTorch's limit).
    if any(2 * start > k for (start, _), k in zip(pads, kernel)):
        raise ConfigError(
            f"{owner}.padding: at most half the kernel size {list(kernel)} per side, got "
            f"{[list(p) for p in pads]} (start, end) per dim",
            fields=(f"{owner}.padding",),
        )
    return pads


class _Pool(Module):
    """What AvgPool and MaxPool share: window, stride, padding and the rank check."""

    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: Pads
    ceil_mode: bool

    def _split_padding(self, x: Tensor, fill: float) -> tuple[Tensor, tuple[int, ...], bool]:
        """The symmetric part of the padding for the op, and ``x`` padded with the rest.

        The pooling ops pad both sides alike; the extra end rows of an uneven ``Same``
        are added here, filled with ``fill``. Also says whether there were any.
        """
        _check_rank(type(self).__name__, x, len(self.kernel_size))
        start = tuple(p for p, _ in self.padding)
        extra = [end - begin for begin, end in self.padding]
        if any(extra):
            x = x.pad([v for e in reversed(extra) for v in (0, e)], value=fill)
        return x, start, any(extra)


class AvgPool1dConfig(Config):
    """Configuration of an :class:`AvgPool1d` layer.

    Args:
        kernel_size: length of the window.
        stride: step between windows. Default: None, the window's length (as Burn and PyTorch).
        padding: a :class:`~ember.nn.conv.PaddingConfig` (zeros). Default: ``Valid()``.
        count_include_pad: whether padded zeros count in the average's divisor.
            Default: True (Burn's and PyTorch's default).
        ceil_mode: round the output size up instead of down. Default: False.

    Raises:
        ConfigError: at ``init``, for Same padding with a stride above 1, Explicit padding
            of the wrong length, or padding of more than half the window.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.pool import AvgPool1dConfig
        >>> pool = AvgPool1dConfig(2).init()
        >>> pool(Tensor.from_data([[[1.0, 3.0, 5.0, 7.0]]])).tolist()
        [[[2.0, 6.0]]]
    """

    kernel_size: PositiveInt
    stride: PositiveInt | None = None
    padding: PaddingConfig = Valid()
    count_include_pad: bool = True
    ceil_mode: bool = False

    def init(self, device: Device | None = None) -> AvgPool1d:
        """A new :class:`AvgPool1d` (no parameters: ``device`` is not used)."""
        kernel, stride = (self.kernel_size,), (self.stride or self.kernel_size,)
        pads = _pool_padding("AvgPool1dConfig", self.padding, kernel, stride, (1,))
        return AvgPool1d(kernel, stride, pads, self.ceil_mode, self.count_include_pad)


class _AvgPool(_Pool):
    count_include_pad: bool

    def forward(self, x: Tensor) -> Tensor:
        padded, start, uneven = self._split_padding(x, 0.0)
        pool = F.avg_pool1d if len(self.kernel_size) == 1 else F.avg_pool2d
        if not uneven or self.count_include_pad:
            return pool(padded, self.kernel_size, self.stride, start, self.ceil_mode,
                        self.count_include_pad)  # fmt: skip
        # The op would count the zeros added here as input: divide the windows' sums by
        # the number of real elements in each instead, both as averages over full windows.
        total = pool(padded, self.kernel_size, self.stride, start, self.ceil_mode, True)
        ones = Tensor.ones([1, 1, *x.shape[2:]], x.device, dtype=x.dtype)
        mask, _, _ = self._split_padding(ones, 0.0)
        return total / pool(mask, self.kernel_size, self.stride, start, self.ceil_mode, True)


class AvgPool1d(_AvgPool):
    """Average over sliding windows of ``[batch, channels, length]``.

    Build it with :class:`AvgPool1dConfig`.

    Args:
        kernel_size: one value per spatial dim.
        stride: one value per spatial dim.
        padding: ``(start, end)`` zeros per spatial dim.
        ceil_mode: round the output size up.
        count_include_pad: whether padded zeros count in the divisor.

    Shape:
        - Input: ``[batch, channels, length]``.
        - Output: ``[batch, channels, length_out]`` with
          ``length_out = (length + start + end - kernel_size) // stride + 1``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.conv import PaddingConfig
        >>> from ember.nn.pool import AvgPool1dConfig
        >>> config = AvgPool1dConfig(3, stride=1, padding=PaddingConfig.Same())
        >>> x = Tensor.from_data([[[3.0, 3.0, 3.0]]])
        >>> config.init()(x).tolist(), config.with_count_include_pad(False).init()(x).tolist()
        ([[[2.0, 3.0, 2.0]]], [[[3.0, 3.0, 3.0]]])
    """


class AvgPool2dConfig(Config):
    """Configuration of an :class:`AvgPool2d` layer.

    Args:
        kernel_size: ``(height, width)`` of the window.
        stride: step between windows per dim. Default: None, the window's size.
        padding: a :class:`~ember.nn.conv.PaddingConfig` (zeros). Default: ``Valid()``.
        count_include_pad: whether padded zeros count in the divisor. Default: True.
        ceil_mode: round the output size up instead of down. Default: False.

    Raises:
        ConfigError: at ``init``, as for :class:`AvgPool1dConfig`.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.pool import AvgPool2dConfig
        >>> pool = AvgPool2dConfig([2, 2]).init()
        >>> pool.stride, pool(Tensor.ones([1, 3, 8, 6])).shape
        ((2, 2), (1, 3, 4, 3))
    """

    kernel_size: PositivePair
    stride: PositivePair | None = None
    padding: PaddingConfig = Valid()
    count_include_pad: bool = True
    ceil_mode: bool = False

    def init(self, device: Device | None = None) -> AvgPool2d:
        """A new :class:`AvgPool2d` (no parameters: ``device`` is not used)."""
        stride = self.stride or self.kernel_size
        pads = _pool_padding("AvgPool2dConfig", self.padding, self.kernel_size, stride, (1, 1))
        return AvgPool2d(self.kernel_size, stride, pads, self.ceil_mode, self.count_include_pad)


class AvgPool2d(_AvgPool):
    """Average over sliding windows of ``[batch, channels, height, width]``.

    Build it with :class:`AvgPool2dConfig`; the fields are those of :class:`AvgPool1d`
    with two spatial dims.

    Shape:
        - Input: ``[batch, channels, height, width]``.
        - Output: ``[batch, channels, height_out, width_out]``, each as for :class:`AvgPool1d`.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.pool import AvgPool2dConfig
        >>> x = Tensor.from_data([[[[1.0, 2.0], [3.0, 6.0]]]])
        >>> AvgPool2dConfig([2, 2]).init()(x).tolist()
        [[[[3.0]]]]
    """


class MaxPool1dConfig(Config):
    """Configuration of a :class:`MaxPool1d` layer.

    Args:
        kernel_size: length of the window.
        stride: step between windows. Default: None, the window's length (as Burn and PyTorch).
        padding: a :class:`~ember.nn.conv.PaddingConfig`; padding never wins the maximum.
            Default: ``Valid()``.
        dilation: spacing between the window's taps. Default: 1.
        ceil_mode: round the output size up instead of down. Default: False.

    Raises:
        ConfigError: at ``init``, for Same padding with a stride above 1, Explicit padding
            of the wrong length, or padding of more than half the window.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.pool import MaxPool1dConfig
        >>> pool = MaxPool1dConfig(2).init()
        >>> pool(Tensor.from_data([[[1.0, 3.0, 5.0, 2.0]]])).tolist()
        [[[3.0, 5.0]]]
    """

    kernel_size: PositiveInt
    stride: PositiveInt | None = None
    padding: PaddingConfig = Valid()
    dilation: PositiveInt = 1
    ceil_mode: bool = False

    def init(self, device: Device | None = None) -> MaxPool1d:
        """A new :class:`MaxPool1d` (no parameters: ``device`` is not used)."""
        kernel, stride = (self.kernel_size,), (self.stride or self.kernel_size,)
        dilation = (self.dilation,)
        pads = _pool_padding("MaxPool1dConfig", self.padding, kernel, stride, dilation)
        return MaxPool1d(kernel, stride, pads, self.ceil_mode, dilation)


class _MaxPool(_Pool):
    dilation: tuple[int, ...]

    def forward(self, x: Tensor) -> Tensor:
        padded, start, _ = self._split_padding(x, float("-inf"))
        pool = F.max_pool1d if len(self.kernel_size) == 1 else F.max_pool2d
        return pool(padded, self.kernel_size, self.stride, start, self.dilation, self.ceil_mode)


class MaxPool1d(_MaxPool):
    """Maximum over sliding windows of ``[batch, channels, length]``.

    Build it with :class:`MaxPool1dConfig`.

    Args:
        kernel_size: one value per spatial dim.
        stride: one value per spatial dim.
        dilation: one value per spatial dim.
        padding: ``(start, end)`` per spatial dim; padded positions are ``-inf``.
        ceil_mode: round the output size up.

    Shape:
        - Input: ``[batch, channels, length]``.
        - Output: ``[batch, channels, length_out]`` with ``length_out =
          (length + start + end - dilation * (kernel_size - 1) - 1) // stride + 1``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.conv import PaddingConfig
        >>> from ember.nn.pool import MaxPool1dConfig
        >>> pool = MaxPool1dConfig(2, stride=1, padding=PaddingConfig.Same()).init()
        >>> pool.padding, pool(Tensor.from_data([[[-1.0, -3.0, -2.0]]])).tolist()
        (((0, 1),), [[[-1.0, -2.0, -2.0]]])
    """


class MaxPool2dConfig(Config):
    """Configuration of a :class:`MaxPool2d` layer.

    Args:
        kernel_size: ``(height, width)`` of the window.
        stride: step between windows per dim. Default: None, the window's size.
        padding: a :class:`~ember.nn.conv.PaddingConfig`. Default: ``Valid()``.
        dilation: spacing between the window's taps per dim. Default: ``(1, 1)``.
        ceil_mode: round the output size up instead of down. Default: False.

    Raises:
        ConfigError: at ``init``, as for :class:`MaxPool1dConfig`.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.conv import PaddingConfig
        >>> from ember.nn.pool import MaxPool2dConfig
        >>> pool = MaxPool2dConfig([3, 3], stride=[2, 2], padding=PaddingConfig.Explicit(1)).init()
        >>> pool(Tensor.ones([1, 16, 32, 32])).shape
        (1, 16, 16, 16)
    """

    kernel_size: PositivePair
    stride: PositivePair | None = None
    padding: PaddingConfig = Valid()
    dilation: PositivePair = (1, 1)
    ceil_mode: bool = False

    def init(self, device: Device | None = None) -> MaxPool2d:
        """A new :class:`MaxPool2d` (no parameters: ``device`` is not used)."""
        stride = self.stride or self.kernel_size
        kernel, dilation = self.kernel_size, self.dilation
        pads = _pool_padding("MaxPool2dConfig", self.padding, kernel, stride, dilation)
        return MaxPool2d(self.kernel_size, stride, pads, self.ceil_mode, self.dilation)


class MaxPool2d(_MaxPool):
    """Maximum over sliding windows of ``[batch, channels, height, width]``.

    Build it with :class:`MaxPool2dConfig`; the fields are those of :class:`MaxPool1d`
    with two spatial dims.

    Shape:
        - Input: ``[batch, channels, height, width]``.
        - Output: ``[batch, channels, height_out, width_out]``, each as for :class:`MaxPool1d`.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.pool import MaxPool2dConfig
        >>> x = Tensor.from_data([[[[1.0, 2.0], [3.0, 6.0]]]])
        >>> MaxPool2dConfig([2, 2]).init()(x).tolist()
        [[[[6.0]]]]
    """


class AdaptiveAvgPool1dConfig(Config):
    """Configuration of an :class:`AdaptiveAvgPool1d` layer.

    Args:
        output_size: the length of the output, whatever the input's.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.pool import AdaptiveAvgPool1dConfig
        >>> AdaptiveAvgPool1dConfig(2).init()(Tensor.from_data([[[1.0, 2.0, 3.0, 5.0]]])).tolist()
        [[[1.5, 4.0]]]
    """

    output_size: PositiveInt

    def init(self, device: Device | None = None) -> AdaptiveAvgPool1d:
        """A new :class:`AdaptiveAvgPool1d` (no parameters: ``device`` is not used)."""
        return AdaptiveAvgPool1d((self.output_size,))


class _AdaptiveAvgPool(Module):
    output_size: tuple[int, ...]

    def forward(self, x: Tensor) -> Tensor:
        n = len(self.output_size)
        _check_rank(type(self).__name__, x, n)
        if 0 in x.shape[2:]:
            raise ShapeError(
                f"{type(self).__name__}: the input's spatial dims must not be empty, "
                f"got {fmt_shape(x.shape)}"
            )
        pool = F.adaptive_avg_pool1d if n == 1 else F.adaptive_avg_pool2d
        return pool(x, self.output_size)


class AdaptiveAvgPool1d(_AdaptiveAvgPool):
    """Average pooling of ``[batch, channels, length]`` to a fixed output length.

    Output position ``i`` averages the input from ``floor(i * length / output_size)`` to
    ``ceil((i + 1) * length / output_size)``, the windows PyTorch uses.

    Args:
        output_size: one size per spatial dim.

    Shape:
        - Input: ``[batch, channels, length]``.
        - Output: ``[batch, channels, output_size]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.pool import AdaptiveAvgPool1dConfig
        >>> AdaptiveAvgPool1dConfig(1).init()(Tensor.ones([2, 3, 7])).shape
        (2, 3, 1)
    """


class AdaptiveAvgPool2dConfig(Config):
    """Configuration of an :class:`AdaptiveAvgPool2d` layer.

    Args:
        output_size: ``(height, width)`` of the output, whatever the input's.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.pool import AdaptiveAvgPool2dConfig
        >>> AdaptiveAvgPool2dConfig([8, 8]).init()(Tensor.ones([1, 3, 28, 30])).shape
        (1, 3, 8, 8)
    """

    output_size: PositivePair

    def init(self, device: Device | None = None) -> AdaptiveAvgPool2d:
        """A new :class:`AdaptiveAvgPool2d` (no parameters: ``device`` is not used)."""
        return AdaptiveAvgPool2d(self.output_size)


class AdaptiveAvgPool2d(_AdaptiveAvgPool):
    """Average pooling of ``[batch, channels, height, width]`` to a fixed output size.

    The windows along each dim are those of :class:`AdaptiveAvgPool1d`.

    Shape:
        - Input: ``[batch, channels, height, width]``.
        - Output: ``[batch, channels, *output_size]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.pool import AdaptiveAvgPool2dConfig
        >>> x = Tensor.from_data([[[[1.0, 2.0], [3.0, 6.0]]]])
        >>> AdaptiveAvgPool2dConfig([1, 1]).init()(x).tolist()  # a global average
        [[[[3.0]]]]
    """
