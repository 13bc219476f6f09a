"""How a tensor is quantized: the value type, the mapping, and which elements share a scale.

A :class:`QuantScheme` is a config (validated, frozen, printable, saved as JSON in records
and checkpoints). It says:

* ``value``: ``"int8"`` (one byte a value) or ``"int4"`` (two values a byte);
* ``mode``: ``"symmetric"`` (``q = round(x / scale)``, zero point 0, the range
  ``[-qmax, qmax]``) or ``"affine"`` (``q = round(x / scale) + zero_point`` over the full
  range ``[qmin, qmax]``, for values far from symmetric about 0, such as after a ReLU);
* ``granularity``: one scale for the whole tensor (``"tensor"``), one per index of
  ``axis`` (``"axis"``: per output channel of a weight), or one per ``block_size``
  consecutive elements along ``axis`` (``"block"``, as GPTQ-style int4 weights);
* ``scale_dtype``: ``"f32"`` or ``"f16"`` scales.

Example:
    >>> from ember.quantization import QuantScheme
    >>> QuantScheme(value="int4", granularity="block", axis=-1, block_size=32)
    QuantScheme(value='int4', mode='symmetric', granularity='block', axis=-1, block_size=32, scale_dtype='f32')
    >>> QuantScheme().qmin, QuantScheme().qmax
    (-127, 127)
    >>> QuantScheme(mode="affine").qmin
    -128
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from ember.backend.errors import ShapeError
from ember.backend.options import QuantOptions
from ember.config import Config
from ember.tensor.dtype import DType

__all__ = ["QuantScheme"]

_BITS = {"int8": 8, "int4": 4}


class QuantScheme(Config):
    """A quantization scheme (see the module doc).

    Args:
        value: ``"int8"`` or ``"int4"``. Default: ``"int8"``.
        mode: ``"symmetric"`` or ``"affine"``. Default: ``"symmetric"``.
        granularity: ``"tensor"``, ``"axis"`` or ``"block"``. Default: ``"tensor"``.
        axis: the axis of per-axis and per-block schemes (negative counts from the end);
            None for per-tensor ones.
        block_size: the elements of a block along ``axis`` (per-block schemes only).
        scale_dtype: ``"f32"`` or ``"f16"``. Default: ``"f32"``.

    Raises:
        ConfigError: an unknown value, mode, granularity or scale dtype; an axis missing
            for a per-axis or per-block scheme or given for a per-tensor one; a block size
            missing, not positive, or given without per-block granularity.
    """

    value: Literal["int8", "int4"] = "int8"
    mode: Literal["symmetric", "affine"] = "symmetric"
    granularity: Literal["tensor", "axis", "block"] = "tensor"
    axis: int | None = None
    block_size: int | None = None
    scale_dtype: Literal["f32", "f16"] = "f32"

    @model_validator(mode="after")
    def _consistent(self) -> QuantScheme:
        if self.granularity == "tensor" and self.axis is not None:
            raise ValueError(f"axis={self.axis} is given but granularity is 'tensor' "
                             "(one scale for the whole tensor has no axis)")  # fmt: skip
        if self.granularity != "tensor" and self.axis is None:
            raise ValueError(f"granularity {self.granularity!r} needs an axis")
        if self.granularity == "block":
            if self.block_size is None or self.block_size < 1:
                raise ValueError("granularity 'block' needs a positive block_size")
        elif self.block_size is not None:
            raise ValueError(f"block_size={self.block_size} is given but granularity is "
                             f"{self.granularity!r}, not 'block'")  # fmt: skip
        return self

    # ------------------------------------------------------------------ derived values

    @property
    def bits(self) -> int:
        """Bits of one quantized value."""
        return _BITS[self.value]

    @property
    def qmin(self) -> int:
        """The smallest quantized value: ``-qmax`` when symmetric, ``-2^(bits-1)`` when affine."""
        full = -(1 << (self.bits - 1))
        return full + 1 if self.mode == "symmetric" else full

    @property
    def qmax(self) -> int:
        """The largest quantized value: ``2^(bits-1) - 1``."""
        return (1 << (self.bits - 1)) - 1

    @property
    def scales_dtype(self) -> DType:
        return DType.parse(self.scale_dtype)

    def resolved_axis(self, rank: int) -> int | None:
        """The scheme's axis as an index in ``[0, rank)`` (None per tensor).

        Raises:
            ShapeError: the axis is out of range for a tensor of ``rank`` dims.
        """
        if self.axis is None:
            return None
        if not -rank <= self.axis < rank:
            raise ShapeError(f"{self.describe()}: axis {self.axis} is out of range for a tensor "
                             f"of rank {rank}")  # fmt: skip
        return self.axis % rank

    def scales_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the scales (and zero points) of a tensor of ``shape``: ``()`` per
        tensor, ``(shape[axis],)`` per axis, and ``shape`` with ``shape[axis] /
        block_size`` at ``axis`` per block.

        Raises:
            ShapeError: the axis is out of range, or the block size does not divide the
                axis.
        """
        options = self.options(len(shape))
        axis = options.axis
        if options.block_size is not None and shape[axis] % options.block_size:
            raise ShapeError(f"{self.describe()}: block size {self.block_size} does not divide "
                             f"dim {axis} of shape {list(shape)} ({shape[axis]})")  # fmt: skip
        return options.scales_shape(shape)

    def options(self, rank: int) -> QuantOptions:
        """The layout of the parameters for a tensor of ``rank`` dims, as the op table's
        quantized ops take it (the axis resolved; raises as :meth:`resolved_axis`)."""
        return QuantOptions(self.resolved_axis(rank), self.block_size)

    def describe(self) -> str:
        """A short name for messages: ``int8 symmetric per axis 0``."""
        where = {"tensor": "per tensor", "axis": f"per axis {self.axis}",
                 "block": f"per block of {self.block_size} along axis {self.axis}"}  # fmt: skip
        scale = "" if self.scale_dtype == "f32" else ", f16 scales"
        return f"{self.value} {self.mode} {where[self.granularity]}{scale}"
