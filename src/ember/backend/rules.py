"""Abstract evaluation: the shape and dtype each op produces, and the checks on its input.

A rule receives the abstract values (shape and dtype) of an op's tensor
operands and its attributes, and returns the abstract value(s) of its output,
or raises an ember error that names the op, the shapes and the dtypes. The
Tensor layer validates through these rules, so backends may assume valid
input; a lazy backend (fusion) can use them to know output shapes without
running anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ember.backend.errors import ArgumentError, DTypeError, KindError, ShapeError, fmt_shape
from ember.backend.options import (
    ConvOptions,
    ConvTransposeOptions,
    InterpolateOptions,
    PadOptions,
    PoolOptions,
)
from ember.tensor.dtype import DType, Kind

Shape = tuple[int, ...]


class AVal(NamedTuple):
    """The abstract value of a tensor: what an op's output is, without its elements."""

    shape: Shape
    dtype: DType


# ---------------------------------------------------------------- helpers
def broadcast_shapes(op: str, a: Shape, b: Shape) -> Shape:
    """NumPy broadcasting of two shapes, with an error naming ``op`` and both shapes."""
    if a == b:
        return a
    na, nb = len(a), len(b)
    n = max(na, nb)
    out = []
    for i in range(n):
        da = a[i - n + na] if i >= n - na else 1
        db = b[i - n + nb] if i >= n - nb else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            raise ShapeError(
                f"{op}: shapes {fmt_shape(a)} and {fmt_shape(b)} cannot be broadcast "
                f"(dim {i - n} is {da} vs {db})"
            )
    return tuple(out)


def check_dim(op: str, dim: int, rank: int) -> int:
    """Normalizes a possibly negative dim; raises ArgumentError when out of range.

    A 0-d tensor accepts dim 0 and -1, as in PyTorch: it acts as one element along that dim.
    """
    if rank == 0 and dim in (0, -1):
        return 0
    if not -rank <= dim < rank:
        raise ArgumentError(f"{op}: dim {dim} is out of range for a tensor of rank {rank}")
    return dim + rank if dim < 0 else dim


def _same_dtype(op: str, *avals: AVal) -> DType:
    first = avals[0].dtype
    for av in avals[1:]:
        if av.dtype is not first:
            raise DTypeError(f"{op}: operands have different dtypes {first} and {av.dtype}")
    return first


def _need_kind(op: str, av: AVal, kind: Kind, role: str) -> None:
    if av.dtype.kind is not kind:
        raise KindError(f"{op}: {role} must be a {kind.value} tensor, got {av.dtype.kind.value} ({av.dtype})")


# ---------------------------------------------------------------- element-wise
def same(op: str, x: AVal, *_attrs) -> AVal:
    """Unary element-wise ops and ops with scalar attributes: same shape and dtype."""
    return x


def to_bool(op: str, x: AVal, *_attrs) -> AVal:
    return AVal(x.shape, DType.BOOL)


def binary(op: str, a: AVal, b: AVal) -> AVal:
    return AVal(broadcast_shapes(op, a.shape, b.shape), _same_dtype(op, a, b))


def compare(op: str, a: AVal, b: AVal) -> AVal:
    _same_dtype(op, a, b)
    return AVal(broadcast_shapes(op, a.shape, b.shape), DType.BOOL)


def cast(op: str, x: AVal, dtype: DType) -> AVal:
    return AVal(x.shape, dtype)


def mask_where(op: str, x: AVal, mask: AVal, value: AVal) -> AVal:
    _need_kind(op, mask, Kind.BOOL, "mask")
    shape = broadcast_shapes(op, broadcast_shapes(op, x.shape, mask.shape), value.shape)
    return AVal(shape, _same_dtype(op, x, value))


def mask_fill(op: str, x: AVal, mask: AVal, _value) -> AVal:
    _need_kind(op, mask, Kind.BOOL, "mask")
    return AVal(broadcast_shapes(op, x.shape, mask.shape), x.dtype)


def clamp(op: str, x: AVal, low, high) -> AVal:
    if low is not None and high is not None and low > high:
        raise ArgumentError(f"{op}: min {low} is greater than max {high}")
    return x


# ---------------------------------------------------------------- creation
def creation(op: str, shape: Sequence[int], *rest) -> AVal:
    """``full``, ``empty`` and ``random``: attributes (shape, ..., device, dtype)."""
    shape = tuple(shape)
    if any(d < 0 for d in shape):
        raise ShapeError(f"{op}: negative dimension in shape {fmt_shape(shape)}")
    return AVal(shape, rest[-1])


def arange(op: str, start: int, end: int, step: int, _device, dtype: DType) -> AVal:
    if step == 0:
        raise ArgumentError(f"{op}: step must not be zero")
    return AVal((max(0, math.ceil((end - start) / step)),), dtype)


# ---------------------------------------------------------------- reductions
def reduce_all(op: str, x: AVal) -> AVal:
    return AVal((), x.dtype)


def reduce_all_bool(op: str, x: AVal) -> AVal:
    return AVal((), DType.BOOL)


def _keep(x: AVal, dim: int) -> Shape:
    return x.shape[:dim] + (1,) + x.shape[dim + 1 :]


def reduce_dim(op: str, x: AVal, dim: int) -> AVal:
    return AVal(_keep(x, dim), x.dtype)


def reduce_dim_bool(op: str, x: AVal, dim: int) -> AVal:
    return AVal(_keep(x, dim), DType.BOOL)


def reduce_dim_index(op: str, x: AVal, dim: int) -> AVal:
    if x.shape[dim] == 0:
        raise ShapeError(f"{op}: cannot reduce the empty dim {dim} of shape {fmt_shape(x.shape)}")
    return AVal(_keep(x, dim), DType.I64)


def reduce_dim_nonempty(op: str, x: AVal, dim: int) -> AVal:
    """``max_dim`` / ``min_dim``: an empty dim has no extreme."""
    reduce_dim_index(op, x, dim)
    return reduce_dim(op, x, dim)


def reduce_dim_with_indices(op: str, x: AVal, dim: int) -> tuple[AVal, AVal]:
    return reduce_dim(op, x, dim), reduce_dim_index(op, x, dim)


def reduce_nonempty(op: str, x: AVal) -> AVal:
    if 0 in x.shape:
        raise ShapeError(f"{op}: cannot reduce an empty tensor of shape {fmt_shape(x.shape)}")
    return AVal((), x.dtype)


def scan(op: str, x: AVal, dim: int) -> AVal:
    return x


def sort(op: str, x: AVal, dim: int, descending: bool) -> AVal:
    return x


def argsort(op: str, x: AVal, dim: int, descending: bool) -> AVal:
    return AVal(x.shape, DType.I64)


def sort_with_indices(op: str, x: AVal, dim: int, descending: bool) -> tuple[AVal, AVal]:
    return x, AVal(x.shape, DType.I64)


def var(op: str, x: AVal, dim: int, correction: int) -> AVal:
    return AVal(_keep(x, dim), x.dtype)


def var_mean(op: str, x: AVal, dim: int, correction: int) -> tuple[AVal, AVal]:
    out = AVal(_keep(x, dim), x.dtype)
    return out, out


# ---------------------------------------------------------------- layout
def reshape(op: str, x: AVal, shape: Shape) -> AVal:
    if math.prod(shape) != math.prod(x.shape) or (shape and min(shape) < 0):
        raise ShapeError(
            f"{op}: cannot reshape {fmt_shape(x.shape)} ({math.prod(x.shape)} elements) "
            f"into {fmt_shape(shape)}"
        )
    return AVal(tuple(shape), x.dtype)


def permute(op: str, x: AVal, axes: Shape) -> AVal:
    if sorted(axes) != list(range(len(x.shape))):
        raise ArgumentError(f"{op}: {list(axes)} is not a permutation of the dims of rank {len(x.shape)}")
    shape = x.shape
    return AVal(tuple([shape[a] for a in axes]), x.dtype)


def expand(op: str, x: AVal, shape: Shape) -> AVal:
    shape = tuple(shape)
    n, k = len(shape), len(x.shape)
    ok = n >= k and all(x.shape[i] in (1, shape[n - k + i]) for i in range(k))
    if not ok:
        raise ShapeError(f"{op}: cannot expand shape {fmt_shape(x.shape)} to {fmt_shape(shape)}")
    return AVal(shape, x.dtype)


def flip(op: str, x: AVal, axes: Shape) -> AVal:
    if len(set(axes)) != len(axes):
        raise ArgumentError(f"{op}: repeated dim in {list(axes)}")
    return x


def slice_(op: str, x: AVal, ranges: tuple[tuple[int, int, int], ...]) -> AVal:
    """``ranges`` holds one normalized (start, stop, step) per leading dim, step > 0."""
    if len(ranges) > len(x.shape):
        raise ShapeError(f"{op}: {len(ranges)} ranges for a tensor of rank {len(x.shape)}")
    shape = list(x.shape)
    for d, (start, stop, step) in enumerate(ranges):
        if step <= 0 or not 0 <= start <= x.shape[d] or not 0 <= stop <= x.shape[d]:
            raise ArgumentError(f"{op}: range {start}:{stop}:{step} invalid for dim {d} of size {x.shape[d]}")
        shape[d] = max(0, -(-(stop - start) // step))
    return AVal(tuple(shape), x.dtype)


def slice_assign(op: str, x: AVal, values: AVal, ranges) -> AVal:
    target = slice_(op, x, ranges)
    if values.shape != target.shape:
        raise ShapeError(
            f"{op}: values of shape {fmt_shape(values.shape)} do not fit the slice of shape "
            f"{fmt_shape(target.shape)}"
        )
    _same_dtype(op, x, values)
    return x


def cat(op: str, *avals_and_dim) -> AVal:
    *avals, dim = avals_and_dim
    if not avals:
        raise ArgumentError(f"{op}: needs at least one tensor")
    first = avals[0]
    outside = first.shape[:dim] + first.shape[dim + 1 :]
    for av in avals[1:]:
        if len(av.shape) != len(first.shape) or av.shape[:dim] + av.shape[dim + 1 :] != outside:
            raise ShapeError(
                f"{op}: shapes {fmt_shape(first.shape)} and {fmt_shape(av.shape)} differ outside "
                f"dim {dim}"
            )
    dtype = _same_dtype(op, *avals)
    size = sum([av.shape[dim] for av in avals])
    return AVal(first.shape[:dim] + (size,) + first.shape[dim + 1 :], dtype)


def repeat_dim(op: str, x: AVal, dim: int, times: int) -> AVal:
    if times < 0:
        raise ArgumentError(f"{op}: times must be >= 0, got {times}")
    return AVal(x.shape[:dim] + (x.shape[dim] * times,) + x.shape[dim + 1 :], x.dtype)


def argwhere(op: str, x: AVal) -> AVal:
    # The row count depends on the data; -1 marks it for lazy backends.
    return AVal((-1, len(x.shape)), DType.I64)


# ---------------------------------------------------------------- indexing
def _indices(op: str, idx: AVal) -> None:
    _need_kind(op, idx, Kind.INT, "indices")


def _index_fits(op: str, x: AVal, indices: AVal, dim: int) -> None:
    # As in PyTorch, an index may be smaller than the tensor outside ``dim``, never larger.
    if any(i > s for d, (i, s) in enumerate(zip(indices.shape, x.shape)) if d != dim):
        raise ShapeError(
            f"{op}: indices of shape {fmt_shape(indices.shape)} are larger than the tensor "
            f"{fmt_shape(x.shape)} outside dim {dim}"
        )


def gather(op: str, x: AVal, indices: AVal, dim: int) -> AVal:
    _indices(op, indices)
    if len(indices.shape) != len(x.shape):
        raise ShapeError(
            f"{op}: indices of shape {fmt_shape(indices.shape)} must have the rank of the "
            f"tensor {fmt_shape(x.shape)}"
        )
    _index_fits(op, x, indices, dim)
    return AVal(indices.shape, x.dtype)


def scatter_add(op: str, x: AVal, indices: AVal, values: AVal, dim: int) -> AVal:
    _indices(op, indices)
    if indices.shape != values.shape or len(indices.shape) != len(x.shape):
        raise ShapeError(
            f"{op}: indices {fmt_shape(indices.shape)} and values {fmt_shape(values.shape)} must "
            f"have one shape, of the rank of the tensor {fmt_shape(x.shape)}"
        )
    _index_fits(op, x, indices, dim)
    _same_dtype(op, x, values)
    return x


def select(op: str, x: AVal, indices: AVal, dim: int) -> AVal:
    _indices(op, indices)
    if len(indices.shape) != 1:
        raise ShapeError(f"{op}: indices must be 1-d, got shape {fmt_shape(indices.shape)}")
    return AVal(x.shape[:dim] + indices.shape + x.shape[dim + 1 :], x.dtype)


def select_assign(op: str, x: AVal, indices: AVal, values: AVal, dim: int) -> AVal:
    expected = select(op, x, indices, dim).shape
    if values.shape != expected:
        raise ShapeError(
            f"{op}: values of shape {fmt_shape(values.shape)} do not match the selection "
            f"{fmt_shape(expected)}"
        )
    _same_dtype(op, x, values)
    return x


# ---------------------------------------------------------------- linear algebra
def matmul(op: str, a: AVal, b: AVal) -> AVal:
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError(
            f"{op}: both operands need rank >= 2, got {fmt_shape(a.shape)} and {fmt_shape(b.shape)}"
        )
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"{op}: inner dims differ: {fmt_shape(a.shape)} @ {fmt_shape(b.shape)} "
            f"({a.shape[-1]} != {b.shape[-2]})"
        )
    try:
        batch = broadcast_shapes(op, a.shape[:-2], b.shape[:-2])
    except ShapeError as e:  # name the whole operands, not only their batch dims
        raise ShapeError(
            f"{op}: batch dims of {fmt_shape(a.shape)} and {fmt_shape(b.shape)} cannot be broadcast"
        ) from e
    return AVal(batch + (a.shape[-2], b.shape[-1]), _same_dtype(op, a, b))


# ---------------------------------------------------------------- quantized
def dequantize(op: str, values: AVal, scales: AVal, zero_points: AVal | None,
               options) -> AVal:  # fmt: skip
    """Int values with Float scales (and Int zero points) of ``options``' layout -> f32."""
    if values.dtype.kind is not Kind.INT:
        raise DTypeError(f"{op}: values must be Int, got {values.dtype.value}")
    if scales.dtype.kind is not Kind.FLOAT:
        raise DTypeError(f"{op}: scales must be Float, got {scales.dtype.value}")
    if options.axis is not None and not 0 <= options.axis < len(values.shape):
        raise ShapeError(f"{op}: axis {options.axis} is out of range for values of shape "
                         f"{fmt_shape(values.shape)}")  # fmt: skip
    if options.block_size is not None and values.shape[options.axis] % options.block_size:
        raise ShapeError(f"{op}: block size {options.block_size} does not divide dim "
                         f"{options.axis} of {fmt_shape(values.shape)}")  # fmt: skip
    expected = options.scales_shape(values.shape)
    for name, params in (("scales", scales), ("zero points", zero_points)):
        if params is not None and tuple(params.shape) != expected:
            raise ShapeError(f"{op}: {name} must have shape {fmt_shape(expected)} for values of "
                             f"shape {fmt_shape(values.shape)}, got {fmt_shape(params.shape)}")  # fmt: skip
    if zero_points is not None and zero_points.dtype.kind is not Kind.INT:
        raise DTypeError(f"{op}: zero points must be Int, got {zero_points.dtype.value}")
    return AVal(values.shape, DType.F32)


def quantized_linear(op: str, x: AVal, values: AVal, scales: AVal, zero_points: AVal | None,
                     bias: AVal | None, options) -> AVal:  # fmt: skip
    """``x @ dequantize(values, ...) + bias``: a Float ``x`` by a quantized ``[..., K, N]``,
    plus an optional Float ``bias`` of ``[N]``."""
    if x.dtype.kind is not Kind.FLOAT:
        raise DTypeError(f"{op}: the input must be Float, got {x.dtype.value}")
    weight = dequantize(op, values, scales, zero_points, options)
    out = matmul(op, x, AVal(weight.shape, x.dtype))
    if bias is not None and tuple(bias.shape) != out.shape[-1:]:
        raise ShapeError(f"{op}: bias must have shape {fmt_shape(out.shape[-1:])}, got "
                         f"{fmt_shape(bias.shape)}")  # fmt: skip
    return out


def quantized_conv(op: str, x: AVal, values: AVal, scales: AVal, zero_points: AVal | None,
                   bias: AVal | None, options: ConvOptions, quant) -> AVal:  # fmt: skip
    """A 2-d or 3-d convolution of a Float ``x`` by a quantized weight ``[C_out, C_in / groups,
    *kernel]`` (the weight's rank picks the dims)."""
    if x.dtype.kind is not Kind.FLOAT:
        raise DTypeError(f"{op}: the input must be Float, got {x.dtype.value}")
    if len(values.shape) not in (4, 5):
        raise ShapeError(f"{op}: the weight must be 4-d or 5-d ([C_out, C_in / groups, *kernel]), "
                         f"got {fmt_shape(values.shape)}")  # fmt: skip
    weight = dequantize(op, values, scales, zero_points, quant)
    return conv(op, x, AVal(weight.shape, x.dtype), bias, options)


def integer_linear(op: str, values: AVal, scales: AVal, zero_points: AVal | None,
                   weight_values: AVal, weight_scales: AVal, weight_zero_points: AVal | None,
                   bias: AVal | None, input_quant, options) -> AVal:  # fmt: skip
    """``dequantize(input) @ dequantize(weight) + bias``: a quantized ``[..., M, K]`` by a
    quantized ``[..., K, N]``, plus an optional Float ``bias`` of ``[N]``; f32."""
    x = dequantize(op, values, scales, zero_points, input_quant)
    return quantized_linear(op, x, weight_values, weight_scales, weight_zero_points, bias, options)


def integer_conv(op: str, values: AVal, scales: AVal, zero_points: AVal | None,
                 weight_values: AVal, weight_scales: AVal, weight_zero_points: AVal | None,
                 bias: AVal | None, options: ConvOptions, input_quant, quant) -> AVal:  # fmt: skip
    """A convolution of a quantized input by a quantized weight (2-d or 3-d); f32."""
    x = dequantize(op, values, scales, zero_points, input_quant)
    return quantized_conv(op, x, weight_values, weight_scales, weight_zero_points, bias,
                          options, quant)  # fmt: skip


# ---------------------------------------------------------------- module ops
def _spatial(op: str, x: AVal, n: int, what: str = "input") -> None:
    if len(x.shape) != n + 2:
        dims = "batch, channels" if what == "input" else "channels in/out"
        raise ShapeError(
            f"{op}: {what} must have rank {n + 2} ([{dims}, {n} spatial dims]), "
            f"got {fmt_shape(x.shape)}"
        )


def _conv_out(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def conv(op: str, x: AVal, weight: AVal, bias: AVal | None, options: ConvOptions) -> AVal:
    n = len(options.stride)
    _spatial(op, x, n)
    _spatial(op, weight, n, "weight")
    c_in, g = x.shape[1], options.groups
    if c_in % g or weight.shape[0] % g or weight.shape[1] * g != c_in:
        raise ShapeError(
            f"{op}: weight {fmt_shape(weight.shape)} does not fit input {fmt_shape(x.shape)} "
            f"with groups={g} (expected weight [out, {c_in // max(g, 1)}, ...])"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ShapeError(f"{op}: bias must have shape [{weight.shape[0]}], got {fmt_shape(bias.shape)}")
    out = tuple(
        _conv_out(x.shape[2 + i], weight.shape[2 + i], options.stride[i], options.padding[i], options.dilation[i])
        for i in range(n)
    )
    if any(o <= 0 for o in out):
        raise ShapeError(f"{op}: input {fmt_shape(x.shape)} is too small for kernel {fmt_shape(weight.shape[2:])}")
    _same_dtype(op, x, weight)
    return AVal((x.shape[0], weight.shape[0]) + out, x.dtype)


def conv_transpose(op: str, x: AVal, weight: AVal, bias: AVal | None, options: ConvTransposeOptions) -> AVal:
    n = len(options.stride)
    _spatial(op, x, n)
    _spatial(op, weight, n, "weight")
    g = options.groups
    if x.shape[1] != weight.shape[0] or weight.shape[0] % g:
        raise ShapeError(
            f"{op}: weight {fmt_shape(weight.shape)} does not fit input {fmt_shape(x.shape)} "
            f"(expected weight [{x.shape[1]}, out/groups, ...], groups={g})"
        )
    c_out = weight.shape[1] * g
    if bias is not None and bias.shape != (c_out,):
        raise ShapeError(f"{op}: bias must have shape [{c_out}], got {fmt_shape(bias.shape)}")
    for i in range(n):
        if options.padding_out[i] >= max(options.stride[i], options.dilation[i]):
            raise ArgumentError(f"{op}: padding_out must be smaller than stride or dilation")
    out = tuple(
        (x.shape[2 + i] - 1) * options.stride[i] - 2 * options.padding[i]
        + options.dilation[i] * (weight.shape[2 + i] - 1) + options.padding_out[i] + 1
        for i in range(n)
    )
    if any(o <= 0 for o in out):
        raise ShapeError(
            f"{op}: output size {list(out)} is not positive for input {fmt_shape(x.shape)} and "
            f"weight {fmt_shape(weight.shape)}"
        )
    _same_dtype(op, x, weight)
    return AVal((x.shape[0], c_out) + out, x.dtype)


def pool_out(size: int, k: int, stride: int, pad: int, dil: int, ceil_mode: bool) -> int:
    span = size + 2 * pad - dil * (k - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1  # the last window would start inside the right padding
    return out


def pool(op: str, x: AVal, options: PoolOptions) -> AVal:
    n = len(options.kernel_size)
    _spatial(op, x, n)
    for i in range(n):
        if options.padding[i] * 2 > options.kernel_size[i]:
            raise ArgumentError(
                f"{op}: padding {options.padding[i]} must be at most half the kernel size "
                f"{options.kernel_size[i]}"
            )
    out = tuple(
        pool_out(x.shape[2 + i], options.kernel_size[i], options.stride[i], options.padding[i],
                 options.dilation[i], options.ceil_mode)
        for i in range(n)
    )  # fmt: skip
    if any(o <= 0 for o in out):
        raise ShapeError(f"{op}: input {fmt_shape(x.shape)} is too small for window {list(options.kernel_size)}")
    return AVal(x.shape[:2] + out, x.dtype)


def pool_with_indices(op: str, x: AVal, options: PoolOptions) -> tuple[AVal, AVal]:
    out = pool(op, x, options)
    return out, AVal(out.shape, DType.I64)


def _conv_backward(op: str, x: AVal, weight: AVal, grad: AVal, options) -> None:
    n = len(options.stride)
    if n not in (2, 3):
        raise ArgumentError(f"{op}: expected 2-d or 3-d options, got {n}-d")
    _spatial(op, x, n)
    _spatial(op, weight, n, "weight")
    _spatial(op, grad, n, "grad")
    _same_dtype(op, x, weight)
    _same_dtype(op, x, grad)


def conv_x_backward(op: str, x: AVal, weight: AVal, grad: AVal, options) -> AVal:
    """Gradient of a (transposed) convolution for its input: the input's shape and dtype."""
    _conv_backward(op, x, weight, grad, options)
    return x


def conv_weight_backward(op: str, x: AVal, weight: AVal, grad: AVal, options) -> AVal:
    """Gradient of a (transposed) convolution for its weight: the weight's shape and dtype."""
    _conv_backward(op, x, weight, grad, options)
    return weight


def pool_backward(op: str, x: AVal, grad: AVal, options: PoolOptions) -> AVal:
    return x


def max_pool_backward(op: str, x: AVal, grad: AVal, indices: AVal, options: PoolOptions) -> AVal:
    return x


def _resizable(op: str, x: AVal, output_size: tuple[int, ...]) -> None:
    _spatial(op, x, len(output_size))
    if 0 in x.shape[2:]:
        raise ShapeError(f"{op}: input {fmt_shape(x.shape)} has an empty spatial dim")


def adaptive_pool(op: str, x: AVal, output_size: tuple[int, ...]) -> AVal:
    _resizable(op, x, output_size)
    if any(o <= 0 for o in output_size):
        raise ArgumentError(f"{op}: output size {list(output_size)} must be positive")
    return AVal(x.shape[:2] + tuple(output_size), x.dtype)


def adaptive_pool_backward(op: str, x: AVal, grad: AVal) -> AVal:
    return x


def embedding(op: str, weights: AVal, indices: AVal) -> AVal:
    _indices(op, indices)
    if len(weights.shape) != 2:
        raise ShapeError(f"{op}: weights must be [num_embeddings, dim], got {fmt_shape(weights.shape)}")
    return AVal(indices.shape + (weights.shape[1],), weights.dtype)


def embedding_backward(op: str, weights: AVal, grad: AVal, indices: AVal) -> AVal:
    return weights


def interpolate(op: str, x: AVal, output_size: tuple[int, ...], options: InterpolateOptions) -> AVal:
    _resizable(op, x, output_size)
    if options.mode not in ("nearest", "bilinear", "bicubic"):
        raise ArgumentError(f"{op}: unknown mode {options.mode!r}; expected nearest, bilinear or bicubic")
    if any(o <= 0 for o in output_size):
        raise ArgumentError(f"{op}: output size {list(output_size)} must be positive")
    return AVal(x.shape[:2] + tuple(output_size), x.dtype)


def interpolate_backward(op: str, x: AVal, grad: AVal, output_size, options) -> AVal:
    return x


def pad(op: str, x: AVal, options: PadOptions) -> AVal:
    k = len(options.pads)
    if k > len(x.shape):
        raise ShapeError(f"{op}: {k} padded dims for a tensor of rank {len(x.shape)}")
    if options.mode not in ("constant", "reflect", "edge"):
        raise ArgumentError(f"{op}: unknown mode {options.mode!r}; expected constant, reflect or edge")
    lead = len(x.shape) - k
    shape = list(x.shape)
    for i, (before, after) in enumerate(options.pads):
        size = x.shape[lead + i]
        if options.mode == "reflect" and (before >= size or after >= size):
            raise ArgumentError(f"{op}: reflect padding ({before}, {after}) must be smaller than dim size {size}")
        if options.mode == "edge" and size == 0 and (before or after):
            raise ArgumentError(f"{op}: edge padding of an empty dim")
        shape[lead + i] = size + before + after
        if shape[lead + i] < 0:
            raise ShapeError(f"{op}: padding ({before}, {after}) makes dim {lead + i} negative")
    return AVal(tuple(shape), x.dtype)


def unfold4d(op: str, x: AVal, kernel_size: tuple[int, int], options: ConvOptions) -> AVal:
    _spatial(op, x, 2)
    out = [
        _conv_out(x.shape[2 + i], kernel_size[i], options.stride[i], options.padding[i], options.dilation[i])
        for i in range(2)
    ]
    if any(o <= 0 for o in out):
        raise ShapeError(f"{op}: input {fmt_shape(x.shape)} is too small for kernel {list(kernel_size)}")
    return AVal((x.shape[0], x.shape[1] * kernel_size[0] * kernel_size[1], out[0] * out[1]), x.dtype)


# ---------------------------------------------------------------- activations
def dim_op(op: str, x: AVal, dim: int) -> AVal:
    return x


def glu(op: str, x: AVal, dim: int) -> AVal:
    if x.shape[dim] % 2:
        raise ShapeError(f"{op}: dim {dim} of shape {fmt_shape(x.shape)} must have an even size")
    return AVal(x.shape[:dim] + (x.shape[dim] // 2,) + x.shape[dim + 1 :], x.dtype)


def activation_backward(op: str, x: AVal, grad: AVal, *_attrs) -> AVal:
    """The gradient of an element-wise activation: ``grad`` of the input's shape and dtype."""
    if grad.shape != x.shape:
        raise ShapeError(f"{op}: grad {fmt_shape(grad.shape)} must have the input's shape {fmt_shape(x.shape)}")
    _same_dtype(op, x, grad)
    return x


def layer_norm(op: str, x: AVal, weight: AVal | None, bias: AVal | None, epsilon: float) -> AVal:
    """Layer norm over the last dim: ``weight`` and ``bias`` (each optional) of that dim's size."""
    if not x.shape:
        raise ShapeError(f"{op}: needs an input of rank >= 1, got a 0-d tensor")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None:
            if param.shape != x.shape[-1:]:
                raise ShapeError(f"{op}: {name} must have shape [{x.shape[-1]}] (the last dim of "
                                 f"input {fmt_shape(x.shape)}), got {fmt_shape(param.shape)}")  # fmt: skip
            _same_dtype(op, x, param)
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not epsilon >= 0:
        raise ArgumentError(f"{op}: epsilon must be a number >= 0, got {epsilon!r}")
    return x


def prelu(op: str, x: AVal, alpha: AVal) -> AVal:
    ok = alpha.shape in ((), (1,)) or (len(x.shape) >= 2 and alpha.shape == (x.shape[1],))
    if not ok:
        raise ShapeError(
            f"{op}: alpha of shape {fmt_shape(alpha.shape)} must have 1 element or one per channel "
            f"(dim 1) of input {fmt_shape(x.shape)}"
        )
    _same_dtype(op, x, alpha)
    return x
