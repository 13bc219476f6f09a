"""Quantized tensors: Int values, Float scales and Int zero points under a scheme.

:func:`quantize` maps a Float tensor to a :class:`QTensor` and :meth:`QTensor.dequantize`
maps it back; both are Tensor-API code, so they compute the same numbers on every backend
and run through any decorator (``docs/quantization_plan.md`` has the formulas). A
:class:`QTensor` is not a :class:`~ember.tensor.Tensor`: Float ops do not take it, and
nothing dequantizes it behind the caller's back.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.quantization import QuantScheme
    >>> x = Tensor.from_data([[0.5, -1.0], [2.0, 0.25]], ember.device("ndarray"))
    >>> q = x.quantize(QuantScheme(granularity="axis", axis=0))
    >>> q.int_values().tolist(), q.scales.tolist()
    ([[64, -127], [127, 16]], [0.007874015718698502, 0.015748031437397003])
    >>> q.dequantize().tolist()
    [[0.5039370059967041, -1.0], [2.0, 0.25196850299835205]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ember.backend import rules
from ember.backend.device import Device
from ember.backend.errors import DTypeError, KindError, ShapeError, fmt_shape
from ember.backend.ops import ops
from ember.backend.options import QuantOptions
from ember.quantization.scheme import QuantScheme
from ember.tensor import DType, Kind, Tensor
from ember.tensor.tensor import _wrap

__all__ = ["QTensor", "quantize", "quantize_with"]

EPS = float(np.finfo(np.float32).eps)
"""The smallest scale: an all-zero block quantizes to zeros instead of dividing by 0."""


class QTensor:
    """A quantized tensor (see the module doc).

    Args:
        values: the quantized values: an i8 tensor of ``shape`` (int8 schemes), or a 1-d u8
            tensor of ``ceil(numel / 2)`` bytes holding two int4 values each, in flat (C)
            order, the first in the low nibble.
        scales: Float, of ``scheme.scales_shape(shape)`` and the scheme's scale dtype.
        zero_points: i8 of the scales' shape for affine schemes; None for symmetric ones.
        scheme: the :class:`QuantScheme`.
        shape: the logical shape.

    Prefer :func:`quantize` (``tensor.quantize(scheme)``), which computes all of them.
    """

    __slots__ = ("_operands_cache", "_options", "scales", "scheme", "shape", "values",
                 "zero_points")  # fmt: skip

    def __init__(self, values: Tensor, scales: Tensor, zero_points: Tensor | None,
                 scheme: QuantScheme, shape: Sequence[int]) -> None:  # fmt: skip
        self.values, self.scales, self.zero_points = values, scales, zero_points
        self.scheme, self.shape = scheme, tuple(int(d) for d in shape)
        self._options: QuantOptions | None = None
        self._operands_cache: tuple[list, list] | None = None

    @property
    def device(self) -> Device:
        return self.values.device

    @property
    def rank(self) -> int:
        return len(self.shape)

    def int_values(self) -> Tensor:
        """The quantized values as an i8 tensor of :attr:`shape` (int4 ones unpacked)."""
        if self.scheme.value == "int8":
            return self.values
        return _unpack_int4(self.values, self.shape)

    def dequantize(self, dtype: DType | str = DType.F32) -> Tensor:
        """``(values - zero_point) * scale`` as a Float tensor of ``dtype`` (default f32)."""
        dtype = DType.parse(dtype)
        if not dtype.is_float:
            raise DTypeError(f"dequantize: dtype must be a float dtype, got {dtype.value}")
        prims, avals = self._operands()
        rules.dequantize(ops.dequantize.name, *avals, self.options)
        prim = self.device.backend.dequantize(*prims, self.options)
        return _wrap(prim, self.device, Kind.FLOAT).cast(dtype)

    @property
    def options(self) -> QuantOptions:
        """The layout of the parameters as the op table's quantized ops take it."""
        if self._options is None:
            self._options = self.scheme.options(self.rank)
        return self._options

    def _operands(self) -> tuple[list, list]:
        """The backend primitives of the Int values (int4 unpacked), the scales and the zero
        points (None for a symmetric scheme), and their abstract values for the op rules.
        Kept for int8 (a QTensor never changes); int4 values are unpacked per call, so that
        the unpacked copy never doubles what a 4-bit weight holds."""
        if self._operands_cache is not None:
            return self._operands_cache
        tensors = [self.int_values(), self.scales, self.zero_points]
        prims = [None if t is None else t._prim for t in tensors]
        operands = (prims, [None if t is None else t._aval() for t in tensors])
        if self.scheme.value == "int8":
            self._operands_cache = operands
        return operands

    # ------------------------------------------------------------------ layout
    def reshape(self, shape: Sequence[int]) -> QTensor:
        """See :func:`ember.quantization.layout.reshape`."""
        from ember.quantization import layout

        return layout.reshape(self, shape)

    def permute(self, axes: Sequence[int]) -> QTensor:
        """See :func:`ember.quantization.layout.permute`."""
        from ember.quantization import layout

        return layout.permute(self, axes)

    def narrow(self, dim: int, start: int, length: int) -> QTensor:
        """See :func:`ember.quantization.layout.narrow`."""
        from ember.quantization import layout

        return layout.narrow(self, dim, start, length)

    @staticmethod
    def cat(tensors: Sequence[QTensor], dim: int) -> QTensor:
        """See :func:`ember.quantization.layout.cat`."""
        from ember.quantization import layout

        return layout.cat(tensors, dim)

    def to_device(self, device: Device) -> QTensor:
        """The same quantized tensor on ``device``."""
        zero_points = None if self.zero_points is None else self.zero_points.to_device(device)
        return QTensor(self.values.to_device(device), self.scales.to_device(device), zero_points,
                       self.scheme, self.shape)  # fmt: skip

    def __repr__(self) -> str:
        return (f"QTensor(shape={fmt_shape(self.shape)}, {self.scheme.describe()}, "
                f"device={self.device})")  # fmt: skip


def quantize(tensor: Tensor, scheme: QuantScheme, scales: Tensor | None = None,
             zero_points: Tensor | None = None) -> QTensor:  # fmt: skip
    """``tensor`` quantized by ``scheme``: with scales (and zero points) computed from its
    range, or the given ones.

    Args:
        tensor: a Float tensor.
        scheme: how to quantize.
        scales: Float scales of ``scheme.scales_shape(tensor.shape)``, all positive; None
            computes them (symmetric: ``max|x| / qmax``; affine: from ``min(x, 0)`` and
            ``max(x, 0)``), at least float32's epsilon, in the scheme's scale dtype.
        zero_points: Int zero points of that shape in ``[qmin, qmax]`` (affine schemes,
            with given scales); None computes them. Symmetric schemes take none.

    Raises:
        KindError: ``tensor`` is not Float.
        ShapeError: the scheme's axis is out of range, its block size does not divide the
            axis, or given scales / zero points have another shape.
        DTypeError: given scales are not Float, or zero points not Int.
        ArgumentError: given scales are not positive, zero points out of range, zero points
            for a symmetric scheme or scales without them for an affine one.
    """
    from ember.backend.errors import ArgumentError

    what = f"quantize ({scheme.describe()})"
    if not isinstance(tensor, Tensor) or tensor.kind is not Kind.FLOAT:
        kind = tensor.kind.value if isinstance(tensor, Tensor) else type(tensor).__name__
        raise KindError(f"{what}: expected a Float tensor, got {kind}")
    shape = tuple(tensor.shape)
    qshape = scheme.scales_shape(shape)  # validates the axis and the block size
    work = tensor if tensor.dtype in (DType.F32, DType.F64) else tensor.cast(DType.F32)
    probe = QTensor(work, work, None, scheme, shape)  # layout helpers need shape and scheme
    x = _blocked(work, probe)
    reduce = _reduced_dims(probe)
    affine = scheme.mode == "affine"
    if zero_points is not None and not affine:
        raise ArgumentError(f"{what}: a symmetric scheme takes no zero points")
    if scales is None:
        if zero_points is not None:
            raise ArgumentError(f"{what}: zero points were given without scales")
        if affine:
            lo = _reduce(x, reduce, "min_dim").clamp(max=0.0)
            hi = _reduce(x, reduce, "max_dim").clamp(min=0.0)
            raw = (hi - lo) / float(scheme.qmax - scheme.qmin)
        else:
            raw = _reduce(x.abs(), reduce, "max_dim") / float(scheme.qmax)
        scales_b = raw.clamp(min=EPS).cast(scheme.scales_dtype)  # stored, then used
        scales = scales_b.reshape(list(qshape))
        if affine:
            zp_b = (float(scheme.qmin) - (lo / scales_b.cast(work.dtype)).round())
            zero_points = zp_b.clamp(scheme.qmin, scheme.qmax).cast(DType.I8).reshape(list(qshape))
    else:
        scales, zero_points = _given(what, scheme, qshape, scales, zero_points, affine)
    return quantize_with(work, scheme, scales, zero_points)


def quantize_with(tensor: Tensor, scheme: QuantScheme, scales: Tensor,
                  zero_points: Tensor | None) -> QTensor:  # fmt: skip
    """``tensor`` quantized by parameters known to be valid (those of an earlier
    :func:`quantize`, or of a calibration): what :func:`quantize` does after its checks,
    which read the parameters' values (a device sync each call)."""
    shape = tuple(tensor.shape)
    work = tensor if tensor.dtype in (DType.F32, DType.F64) else tensor.cast(DType.F32)
    probe = QTensor(work, work, None, scheme, shape)  # layout helpers need shape and scheme
    q = (_blocked(work, probe) / _along(scales.cast(work.dtype), probe)).round()
    if zero_points is not None:
        q = q + _along(zero_points.cast(work.dtype), probe)
    values = q.clamp(float(scheme.qmin), float(scheme.qmax)).cast(DType.I8).reshape(list(shape))
    if scheme.value == "int4":
        values = _pack_int4(values)
    return QTensor(values, scales, zero_points, scheme, shape)


def _given(what: str, scheme: QuantScheme, qshape: tuple[int, ...], scales: Tensor,
           zero_points: Tensor | None, affine: bool) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """Given quantization parameters, checked and in the scheme's dtypes."""
    from ember.backend.errors import ArgumentError

    if not isinstance(scales, Tensor) or scales.kind is not Kind.FLOAT:
        raise DTypeError(f"{what}: scales must be a Float tensor")
    if tuple(scales.shape) != qshape:
        raise ShapeError(f"{what}: scales must have shape {fmt_shape(qshape)}, got "
                         f"{fmt_shape(scales.shape)}")  # fmt: skip
    scales = scales.cast(scheme.scales_dtype)
    if bool(scales.lower_equal(0.0).any().item()) or bool(scales.is_nan().any().item()):
        raise ArgumentError(f"{what}: every scale must be positive")
    if affine and zero_points is None:
        raise ArgumentError(f"{what}: an affine scheme needs zero points with its scales")
    if zero_points is not None:
        if not isinstance(zero_points, Tensor) or zero_points.kind is not Kind.INT:
            raise DTypeError(f"{what}: zero points must be an Int tensor")
        if tuple(zero_points.shape) != qshape:
            raise ShapeError(f"{what}: zero points must have shape {fmt_shape(qshape)}, got "
                             f"{fmt_shape(zero_points.shape)}")  # fmt: skip
        outside = zero_points.lower(scheme.qmin).bool_or(zero_points.greater(scheme.qmax))
        if bool(outside.any().item()):
            raise ArgumentError(f"{what}: zero points must lie in [{scheme.qmin}, "
                                f"{scheme.qmax}]")  # fmt: skip
        zero_points = zero_points.cast(DType.I8)
    return scales, zero_points


# ------------------------------------------------------------------------ layout helpers


def _blocked(x: Tensor, q: QTensor) -> Tensor:
    """``x`` (of ``q``'s shape) with a per-block axis split into (blocks, block_size)."""
    return x.reshape(list(q.options.blocked(q.shape)))


def _reduced_dims(q: QTensor) -> list[int]:
    """The dims of the blocked view that one scale covers."""
    axis = q.scheme.resolved_axis(q.rank)
    if axis is None:
        return list(range(q.rank))
    if q.scheme.granularity == "axis":
        return [d for d in range(q.rank) if d != axis]
    return [axis + 1]


def _reduce(x: Tensor, dims: list[int], how: str) -> Tensor:
    for d in dims:
        x = getattr(x, how)(d)  # keeps the dim (size 1)
    return x


def _along(params: Tensor, q: QTensor) -> Tensor:
    """Scales or zero points shaped to broadcast against the blocked view of ``q``."""
    return params.reshape(list(q.options.broadcast(q.shape)))


def _pack_int4(values: Tensor) -> Tensor:
    """i8 values in [-8, 7] as u8 bytes of two (flat order, the first in the low nibble)."""
    flat = values.reshape([-1]).cast(DType.I32).bitwise_and(0x0F)
    if flat.shape[0] % 2:
        flat = Tensor.cat([flat, Tensor.zeros([1], flat.device, DType.I32, Kind.INT)], 0)
    pairs = flat.reshape([-1, 2])
    low, high = pairs.narrow(1, 0, 1), pairs.narrow(1, 1, 1)
    return (low + high.bitwise_left_shift(4)).reshape([-1]).cast(DType.U8)


def _unpack_int4(packed: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The i8 values of ``shape`` that :func:`_pack_int4` packed."""
    wide = packed.cast(DType.I32)
    nibbles = Tensor.cat([wide.bitwise_and(0x0F).unsqueeze_dim(1),
                          wide.bitwise_right_shift(4).bitwise_and(0x0F).unsqueeze_dim(1)], 1)  # fmt: skip
    signed = nibbles - nibbles.greater_equal(8).cast(DType.I32) * 16
    count = math.prod(shape)
    return signed.reshape([-1]).narrow(0, 0, count).reshape(list(shape)).cast(DType.I8)
