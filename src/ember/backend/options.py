"""Plain-data options of the module ops (convolution, pooling, interpolation, padding).

They are attributes of op records: immutable, hashable and comparable, so a
fusion or tracing decorator can key caches on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ConvOptions:
    """Stride, zero padding (per side) and dilation per spatial dim, and the group count."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1


@dataclass(frozen=True)
class ConvTransposeOptions:
    """Options of a transposed convolution; ``padding_out`` adds rows/cols on the far side."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    padding_out: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1


@dataclass(frozen=True)
class PoolOptions:
    """Window, stride, padding and dilation per spatial dim for max and average pooling.

    ``count_include_pad`` matters only for average pooling: whether padded
    zeros count in the divisor. ``ceil_mode`` rounds the output size up, as in
    PyTorch; a window that would start entirely in the right padding is dropped.
    """

    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool = False
    count_include_pad: bool = True


InterpolateMode = Literal["nearest", "bilinear", "bicubic"]


@dataclass(frozen=True)
class InterpolateOptions:
    """Mode of ``interpolate``. ``nearest`` follows PyTorch's legacy ``nearest`` indexing."""

    mode: InterpolateMode = "nearest"
    align_corners: bool = False


PadMode = Literal["constant", "reflect", "edge"]


@dataclass(frozen=True)
class PadOptions:
    """Padding of the trailing dims: ``pads`` is ``((before, after), ...)`` from the
    first padded dim to the last dim of the tensor."""

    pads: tuple[tuple[int, int], ...]
    mode: PadMode = "constant"
    value: float = 0.0


@dataclass(frozen=True)
class QuantOptions:
    """Which scale (and zero point) each quantized value takes: one for the whole tensor
    (``axis`` None), one per index of ``axis`` (``block_size`` None), or one per
    ``block_size`` consecutive values along ``axis`` (a non-negative axis)."""

    axis: int | None = None
    block_size: int | None = None

    def scales_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The scales' shape for values of ``shape`` (the layout ``ember.quantization`` uses)."""
        if self.axis is None:
            return ()
        if self.block_size is None:
            return (shape[self.axis],)
        a = self.axis
        return (*shape[:a], shape[a] // self.block_size, *shape[a + 1 :])

    def blocked(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` with a per-block axis split into ``(blocks, block_size)``: the view in
        which each parameter covers whole dims."""
        if self.block_size is None:
            return tuple(shape)
        a = self.axis
        return (*shape[:a], shape[a] // self.block_size, self.block_size, *shape[a + 1 :])

    def broadcast(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape the scales (and zero points) take to broadcast against the
        :meth:`blocked` view of values of ``shape``."""
        if self.axis is None:
            return (1,) * len(shape)
        if self.block_size is None:
            return tuple(shape[self.axis] if d == self.axis else 1 for d in range(len(shape)))
        scales = self.scales_shape(shape)
        return (*scales[: self.axis + 1], 1, *scales[self.axis + 1 :])
