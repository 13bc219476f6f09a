"""Layout ops that keep a tensor quantized: reshape, permute, narrow / slice, cat.

Each moves the values and, with them, the scales and zero points, so that every value
keeps the parameters it was quantized with; the results dequantize to the same numbers
the float op would give. Where the scheme does not allow it (a reshape that splits or
merges the axis the scales run along, a slice through a block, a cat of tensors with other
scales), the op raises and names the scheme: nothing is dequantized behind the caller's
back. Int4 values are unpacked for the op and packed again.

Example:
    >>> from ember import Tensor
    >>> from ember.quantization import QuantScheme
    >>> q = Tensor.from_data([[1.0, -2.0, 4.0], [8.0, 0.5, 1.0]]).quantize(
    ...     QuantScheme(granularity="axis", axis=0))
    >>> q.permute([1, 0]).scheme.axis, q.narrow(1, 1, 2).shape
    (1, (2, 2))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ember.backend.errors import ArgumentError, ShapeError, fmt_shape
from ember.tensor import Tensor

__all__ = ["cat", "narrow", "permute", "reshape"]


def _rebuilt(q, values: Tensor, scales: Tensor, zero_points: Tensor | None, shape, axis):
    """A QTensor of int8 ``values`` (packed again for int4) with the scheme's axis moved."""
    from ember.quantization.qtensor import QTensor, _pack_int4

    if q.scheme.axis is not None and q.scheme.axis < 0:
        axis -= len(shape)  # counted from the end, as the scheme counts it
    scheme = q.scheme if q.scheme.axis is None or q.scheme.axis == axis else q.scheme.with_axis(axis)
    packed = _pack_int4(values) if scheme.value == "int4" else values
    return QTensor(packed, scales, zero_points, scheme, shape)


def _params(q, fn) -> tuple[Tensor, Tensor | None]:
    """``fn`` applied to the scales and the zero points (None stays None)."""
    return fn(q.scales), None if q.zero_points is None else fn(q.zero_points)


def reshape(q, shape: Sequence[int]) -> object:
    """``q`` with the logical ``shape`` (one dim may be -1). A per-axis or per-block scheme
    needs its axis kept whole, with as many elements before it as before."""
    dims = [int(d) for d in shape]
    total = math.prod(q.shape)
    if dims.count(-1) == 1:
        known = math.prod(d for d in dims if d != -1)
        if known and total % known == 0:
            dims[dims.index(-1)] = total // known
    if math.prod(dims) != total or any(d < 0 for d in dims):
        raise ShapeError(f"QTensor.reshape: cannot reshape {fmt_shape(q.shape)} into "
                         f"{fmt_shape(shape)}")  # fmt: skip
    axis = q.scheme.resolved_axis(q.rank)
    new_axis = None
    if axis is not None:
        before = math.prod(q.shape[:axis])
        for p, d in enumerate(dims):
            if d == q.shape[axis] and math.prod(dims[:p]) == before:
                new_axis = p
                break
        else:
            raise ShapeError(f"QTensor.reshape ({q.scheme.describe()}): {fmt_shape(q.shape)} -> "
                             f"{fmt_shape(dims)} splits or moves dim {axis}, which the scales "
                             "run along; dequantize first")  # fmt: skip
    values = q.int_values().reshape(dims)
    if q.scheme.granularity == "block":  # the scales have the values' rank
        blocks = [d // q.scheme.block_size if p == new_axis else d for p, d in enumerate(dims)]
        scales, zero_points = _params(q, lambda t: t.reshape(blocks))
    else:
        scales, zero_points = q.scales, q.zero_points
    return _rebuilt(q, values, scales, zero_points, dims, new_axis)


def permute(q, axes: Sequence[int]) -> object:
    """``q`` with its dims in the order ``axes``; the scheme's axis follows its dim."""
    axes = [int(a) % q.rank if -q.rank <= int(a) < q.rank else int(a) for a in axes]
    if sorted(axes) != list(range(q.rank)):
        raise ArgumentError(f"QTensor.permute: axes must order the dims 0..{q.rank - 1}, got "
                            f"{list(axes)}")  # fmt: skip
    axis = q.scheme.resolved_axis(q.rank)
    values = q.int_values().permute(axes)
    if q.scheme.granularity == "block":
        scales, zero_points = _params(q, lambda t: t.permute(axes))
    else:
        scales, zero_points = q.scales, q.zero_points
    shape = tuple(q.shape[a] for a in axes)
    return _rebuilt(q, values, scales, zero_points, shape, None if axis is None else axes.index(axis))


def narrow(q, dim: int, start: int, length: int) -> object:
    """Elements ``start`` to ``start + length`` along ``dim``; along a per-block axis the
    range must start and end on block boundaries (or at the end of the dim)."""
    if not -q.rank <= dim < q.rank:
        raise ShapeError(f"QTensor.narrow: dim {dim} is out of range for rank {q.rank}")
    dim %= q.rank
    size = q.shape[dim]
    if start < 0:
        start += size
    if not (start >= 0 and length >= 0 and start + length <= size):
        raise ShapeError(f"QTensor.narrow: [{start}, {start + length}) is outside dim {dim} of "
                         f"{fmt_shape(q.shape)}")  # fmt: skip
    axis = q.scheme.resolved_axis(q.rank)
    values = q.int_values().narrow(dim, start, length)
    scales, zero_points = q.scales, q.zero_points
    if q.scheme.granularity == "axis" and dim == axis:
        scales, zero_points = _params(q, lambda t: t.narrow(0, start, length))
    elif q.scheme.granularity == "block":
        b = q.scheme.block_size if dim == axis else 1
        end = start + length
        if start % b or (end % b and end != size):
            raise ShapeError(f"QTensor.narrow ({q.scheme.describe()}): [{start}, {end}) cuts "
                             f"through a block of {b} along dim {dim}")  # fmt: skip
        scales, zero_points = _params(q, lambda t: t.narrow(dim, start // b, length // b))
    shape = tuple(length if d == dim else s for d, s in enumerate(q.shape))
    return _rebuilt(q, values, scales, zero_points, shape, axis)


def cat(tensors: Sequence, dim: int) -> object:
    """The QTensors ``tensors`` (one scheme) joined along ``dim``. Scales join along the
    scheme's axis, and along any dim of a per-block scheme; elsewhere every tensor must have
    the same scales (and zero points)."""
    from ember.quantization.qtensor import QTensor

    if not tensors or not all(isinstance(t, QTensor) for t in tensors):
        raise ArgumentError("QTensor.cat: needs a non-empty sequence of QTensors")
    first = tensors[0]
    if any(t.scheme != first.scheme for t in tensors):
        raise ArgumentError("QTensor.cat: the tensors have different schemes: "
                            + ", ".join(t.scheme.describe() for t in tensors))  # fmt: skip
    if not -first.rank <= dim < first.rank:
        raise ShapeError(f"QTensor.cat: dim {dim} is out of range for rank {first.rank}")
    dim %= first.rank
    axis = first.scheme.resolved_axis(first.rank)
    values = Tensor.cat([t.int_values() for t in tensors], dim)
    joins = first.scheme.granularity == "block" or (first.scheme.granularity == "axis" and dim == axis)
    if joins:
        along = dim if first.scheme.granularity == "block" else 0
        scales = Tensor.cat([t.scales for t in tensors], along)
        zero_points = None if first.zero_points is None else Tensor.cat(
            [t.zero_points for t in tensors], along)  # fmt: skip
    else:
        for t in tensors[1:]:
            same = t.scales.shape == first.scales.shape and bool(t.scales.equal(first.scales).all().item())
            if same and first.zero_points is not None:
                same = bool(t.zero_points.equal(first.zero_points).all().item())
            if not same:
                raise ArgumentError(f"QTensor.cat ({first.scheme.describe()}): along dim {dim} "
                                    "the tensors must share their scales and zero points; "
                                    "requantize them together or dequantize first")  # fmt: skip
        scales, zero_points = first.scales, first.zero_points
    return _rebuilt(first, values, scales, zero_points, tuple(values.shape), axis)
