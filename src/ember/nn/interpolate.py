"""Interpolate1d and Interpolate2d: resize the spatial dims to a size or by a scale factor."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar

from ember.backend.device import Device
from ember.backend.errors import ConfigError, ShapeError, fmt_shape
from ember.config import Config, Variant
from ember.config.fields import AS_TUPLE, PositiveFloat, PositiveInt, PositivePair
from ember.module import Module
from ember.tensor import Tensor
from ember.tensor import module as F

PositiveFloatPair = Annotated[tuple[PositiveFloat, PositiveFloat], AS_TUPLE]


class InterpolateMode(Variant):
    """How :class:`Interpolate1d` and :class:`Interpolate2d` compute new values.

    * ``InterpolateMode.Nearest()``: the nearest input value (PyTorch's ``nearest``).
    * ``InterpolateMode.Linear()``: linear along each dim (``linear`` / ``bilinear``).
    * ``InterpolateMode.Cubic()``: cubic convolution along each dim (``bicubic``,
      with PyTorch's ``a = -0.75``).

    Example:
        >>> from ember.nn.interpolate import InterpolateMode
        >>> InterpolateMode.Cubic().to_json()
        '"Cubic"'
    """

    _functional: ClassVar[str]


class Nearest(InterpolateMode):
    """The nearest input value: ``floor(out_index * in_size / out_size)``."""

    _functional = "nearest"


class Linear(InterpolateMode):
    """Linear interpolation along each spatial dim."""

    _functional = "bilinear"


class Cubic(InterpolateMode):
    """Cubic convolution along each spatial dim."""

    _functional = "bicubic"


def _output_size(owner: str, output_size: tuple[int, ...] | None,
                 scale_factor: tuple[float, ...] | None) -> None:  # fmt: skip
    if (output_size is None) == (scale_factor is None):
        given = "both" if output_size is not None else "neither"
        raise ConfigError(
            f"{owner}: needs exactly one of output_size and scale_factor, got {given}",
            fields=(f"{owner}.output_size", f"{owner}.scale_factor"),
        )


class _Interpolate(Module):
    output_size: tuple[int, ...] | None
    scale_factor: tuple[float, ...] | None
    mode: InterpolateMode
    align_corners: bool

    _spatial: ClassVar[str]  # the names of the spatial dims, which also give their number

    def forward(self, x: Tensor) -> Tensor:
        name = type(self).__name__
        _output_size(name, self.output_size, self.scale_factor)  # for layers built by hand
        if x.rank != self._spatial.count(",") + 3 or 0 in x.shape[2:]:
            raise ShapeError(
                f"{name}: expected an input of shape [batch, channels, {self._spatial}] "
                f"with non-empty spatial dims, got {fmt_shape(x.shape)}"
            )
        size = self.output_size
        if size is None:
            # The output size is rounded down, as in Burn and PyTorch.
            size = tuple(math.floor(d * s) for d, s in zip(x.shape[2:], self.scale_factor))
            if 0 in size:
                raise ShapeError(
                    f"{name}: scale_factor {list(self.scale_factor)} gives an empty output "
                    f"{list(size)} for an input of shape {fmt_shape(x.shape)}"
                )
        return F.interpolate(x, size, self.mode._functional, self.align_corners)


class Interpolate1dConfig(Config):
    """Configuration of an :class:`Interpolate1d` layer: give ``output_size`` or ``scale_factor``.

    Args:
        output_size: the length of the output. Default: None.
        scale_factor: output length over input length; the output length is rounded down.
            Default: None.
        mode: an :class:`InterpolateMode`. Default: ``Nearest()``.
        align_corners: for Linear and Cubic, whether the first and last samples of the
            input and output are aligned; otherwise pixel centers are (``half_pixel``).
            Default: True, as Burn; PyTorch's default is False.

    Raises:
        ConfigError: at ``init``, unless exactly one of ``output_size`` and ``scale_factor``
            is given.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.interpolate import Interpolate1dConfig, InterpolateMode
        >>> config = Interpolate1dConfig(output_size=5, mode=InterpolateMode.Linear())
        >>> config.init()(Tensor.from_data([[[0.0, 1.0, 4.0]]])).tolist()
        [[[0.0, 0.5, 1.0, 2.5, 4.0]]]
    """

    output_size: PositiveInt | None = None
    scale_factor: PositiveFloat | None = None
    mode: InterpolateMode = Nearest()
    align_corners: bool = True

    def init(self, device: Device | None = None) -> Interpolate1d:
        """A new :class:`Interpolate1d` (no parameters: ``device`` is not used)."""
        _output_size("Interpolate1dConfig", self.output_size, self.scale_factor)
        size = None if self.output_size is None else (self.output_size,)
        scale = None if self.scale_factor is None else (self.scale_factor,)
        return Interpolate1d(size, scale, self.mode, self.align_corners)


class Interpolate1d(_Interpolate):
    """Resizes ``[batch, channels, length]`` to a fixed length or by a scale factor.

    Build it with :class:`Interpolate1dConfig`.

    Args:
        output_size: ``(length,)``, or None to use ``scale_factor``.
        scale_factor: ``(factor,)``, or None.
        mode: an :class:`InterpolateMode`.
        align_corners: whether the end samples of input and output are aligned.

    Shape:
        - Input: ``[batch, channels, length]``.
        - Output: ``[batch, channels, length_out]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.interpolate import Interpolate1dConfig
        >>> up = Interpolate1dConfig(scale_factor=2.0).init()
        >>> up(Tensor.from_data([[[1.0, 2.0]]])).tolist()
        [[[1.0, 1.0, 2.0, 2.0]]]
    """

    _spatial = "length"


class Interpolate2dConfig(Config):
    """Configuration of an :class:`Interpolate2d` layer: give ``output_size`` or ``scale_factor``.

    Args:
        output_size: ``(height, width)`` of the output. Default: None.
        scale_factor: ``(height, width)`` factors; each output size is rounded down.
            Default: None.
        mode: an :class:`InterpolateMode`. Default: ``Nearest()``.
        align_corners: for Linear and Cubic, whether the corner samples of the input and
            output are aligned; otherwise pixel centers are. Default: True, as Burn;
            PyTorch's default is False.

    Raises:
        ConfigError: at ``init``, unless exactly one of ``output_size`` and ``scale_factor``
            is given.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.interpolate import Interpolate2dConfig, InterpolateMode
        >>> config = Interpolate2dConfig(scale_factor=[2.0, 1.5], mode=InterpolateMode.Cubic())
        >>> config.init()(Tensor.ones([1, 3, 4, 4])).shape
        (1, 3, 8, 6)
    """

    output_size: PositivePair | None = None
    scale_factor: PositiveFloatPair | None = None
    mode: InterpolateMode = Nearest()
    align_corners: bool = True

    def init(self, device: Device | None = None) -> Interpolate2d:
        """A new :class:`Interpolate2d` (no parameters: ``device`` is not used)."""
        _output_size("Interpolate2dConfig", self.output_size, self.scale_factor)
        return Interpolate2d(self.output_size, self.scale_factor, self.mode, self.align_corners)


class Interpolate2d(_Interpolate):
    """Resizes ``[batch, channels, height, width]`` to a fixed size or by scale factors.

    Build it with :class:`Interpolate2dConfig`; the fields are those of
    :class:`Interpolate1d` with two spatial dims.

    Shape:
        - Input: ``[batch, channels, height, width]``.
        - Output: ``[batch, channels, height_out, width_out]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.interpolate import Interpolate2dConfig, InterpolateMode
        >>> config = Interpolate2dConfig(output_size=[3, 3], mode=InterpolateMode.Linear())
        >>> config.init()(Tensor.from_data([[[[0.0, 2.0], [4.0, 6.0]]]]))[0, 0].tolist()
        [[0.0, 1.0, 2.0], [2.0, 3.0, 4.0], [4.0, 5.0, 6.0]]
    """

    _spatial = "height, width"
