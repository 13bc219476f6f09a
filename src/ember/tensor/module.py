"""Functional module ops: convolution, pooling, embedding, interpolation, unfolding, layer norm.

The layers of ``ember.nn`` call these; they take PyTorch-style arguments (an int
or one value per spatial dim), build the op's options, validate through the op
table's rules and call one backend op.

Example:
    >>> from ember import Tensor
    >>> from ember.tensor import module
    >>> x = Tensor.ones([1, 1, 4, 4])
    >>> module.conv2d(x, Tensor.ones([2, 1, 3, 3]), padding=1).shape
    (1, 2, 4, 4)
"""

from __future__ import annotations

from collections.abc import Sequence

from ember.backend.errors import ArgumentError, KindError, ShapeError, fmt_shape
from ember.backend.ops import OpDef, ops
from ember.backend.options import ConvOptions, ConvTransposeOptions, InterpolateOptions, PoolOptions
from ember.tensor.dtype import Kind
from ember.tensor.tensor import Tensor, _same_device, _wrap

IntOrSeq = int | Sequence[int]


def _tuple(op: str, name: str, value: IntOrSeq, n: int, minimum: int) -> tuple[int, ...]:
    out = (int(value),) * n if isinstance(value, int) else tuple(int(v) for v in value)
    if len(out) != n:
        raise ArgumentError(f"{op}: {name} needs 1 or {n} values, got {list(out)}")
    if any(v < minimum for v in out):
        raise ArgumentError(f"{op}: {name} values must be >= {minimum}, got {list(out)}")
    return out


def _describe(t: Tensor) -> str:
    article = "an" if t.kind is Kind.INT else "a"
    return f"{article} {t.kind.value} tensor of shape {fmt_shape(t.shape)} ({t.dtype.value})"


def _float(op: str, *tensors: Tensor | None) -> None:
    for t in tensors:
        if t is not None and t.kind is not Kind.FLOAT:
            raise KindError(f"{op}: needs Float tensors, got {_describe(t)}")


def _run(op: OpDef, x: Tensor, tensors: Sequence[Tensor | None], *attrs, kind: Kind = Kind.FLOAT):
    """Validates ``op`` through its rule and calls it; casts operands to ``x``'s dtype."""
    _float(op.name, x, *tensors)
    for t in tensors:
        if t is not None:
            _same_device(op.name, x, t)
    dtype = x.dtype
    cast = [None if t is None else t.cast(dtype) for t in tensors]
    op.rule(op.name, x._aval(), *[None if t is None else t._aval() for t in cast], *attrs)
    prims = [None if t is None else t._prim for t in cast]
    return getattr(x.backend, op.name)(x._prim, *prims, *attrs)


def _conv(n: int, x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, dilation, groups) -> Tensor:
    op = getattr(ops, f"conv{n}d")
    options = ConvOptions(
        _tuple(op.name, "stride", stride, n, 1), _tuple(op.name, "padding", padding, n, 0),
        _tuple(op.name, "dilation", dilation, n, 1), int(groups),
    )  # fmt: skip
    if options.groups < 1:
        raise ArgumentError(f"{op.name}: groups must be >= 1, got {groups}")
    return _wrap(_run(op, x, [weight, bias], options), x.device, Kind.FLOAT)


def conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
           padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1) -> Tensor:  # fmt: skip
    """1-d convolution (cross-correlation, as in PyTorch).

    Shape:
        x ``[N, C_in, L]``, weight ``[C_out, C_in / groups, K]``, bias ``[C_out]``
        -> ``[N, C_out, L_out]``.
    """
    return _conv(1, x, weight, bias, stride, padding, dilation, groups)


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
           padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1) -> Tensor:  # fmt: skip
    """2-d convolution. Shape: x ``[N, C_in, H, W]``, weight ``[C_out, C_in / groups, KH, KW]``."""
    return _conv(2, x, weight, bias, stride, padding, dilation, groups)


def conv3d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
           padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1) -> Tensor:  # fmt: skip
    """3-d convolution. Shape: x ``[N, C_in, D, H, W]``, weight ``[C_out, C_in / groups, KD, KH, KW]``."""
    return _conv(3, x, weight, bias, stride, padding, dilation, groups)


def _conv_transpose(n, x, weight, bias, stride, padding, padding_out, dilation, groups) -> Tensor:
    op = getattr(ops, f"conv_transpose{n}d")
    options = ConvTransposeOptions(
        _tuple(op.name, "stride", stride, n, 1), _tuple(op.name, "padding", padding, n, 0),
        _tuple(op.name, "padding_out", padding_out, n, 0), _tuple(op.name, "dilation", dilation, n, 1),
        int(groups),
    )  # fmt: skip
    if options.groups < 1:
        raise ArgumentError(f"{op.name}: groups must be >= 1, got {groups}")
    return _wrap(_run(op, x, [weight, bias], options), x.device, Kind.FLOAT)


def conv_transpose1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
                     padding: IntOrSeq = 0, padding_out: IntOrSeq = 0, dilation: IntOrSeq = 1,
                     groups: int = 1) -> Tensor:  # fmt: skip
    """Transposed 1-d convolution. Shape: weight ``[C_in, C_out / groups, K]``."""
    return _conv_transpose(1, x, weight, bias, stride, padding, padding_out, dilation, groups)


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
                     padding: IntOrSeq = 0, padding_out: IntOrSeq = 0, dilation: IntOrSeq = 1,
                     groups: int = 1) -> Tensor:  # fmt: skip
    """Transposed 2-d convolution. Shape: weight ``[C_in, C_out / groups, KH, KW]``."""
    return _conv_transpose(2, x, weight, bias, stride, padding, padding_out, dilation, groups)


def conv_transpose3d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
                     padding: IntOrSeq = 0, padding_out: IntOrSeq = 0, dilation: IntOrSeq = 1,
                     groups: int = 1) -> Tensor:  # fmt: skip
    """Transposed 3-d convolution. Shape: weight ``[C_in, C_out / groups, KD, KH, KW]``."""
    return _conv_transpose(3, x, weight, bias, stride, padding, padding_out, dilation, groups)


def _pool_options(op: OpDef, n, kernel_size, stride, padding, dilation, ceil_mode,
                  count_include_pad) -> PoolOptions:  # fmt: skip
    kernel = _tuple(op.name, "kernel_size", kernel_size, n, 1)
    return PoolOptions(
        kernel, kernel if stride is None else _tuple(op.name, "stride", stride, n, 1),
        _tuple(op.name, "padding", padding, n, 0), _tuple(op.name, "dilation", dilation, n, 1),
        bool(ceil_mode), bool(count_include_pad),
    )  # fmt: skip


def _pool(op: OpDef, x: Tensor, options: PoolOptions):
    out = _run(op, x, [], options)
    if isinstance(out, tuple):
        return _wrap(out[0], x.device, Kind.FLOAT), _wrap(out[1], x.device, Kind.INT)
    return _wrap(out, x.device, Kind.FLOAT)


def avg_pool1d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:  # fmt: skip
    """Average over windows. Shape: ``[N, C, L]`` -> ``[N, C, L_out]``; stride defaults to the window."""
    op = ops.avg_pool1d
    return _pool(op, x, _pool_options(op, 1, kernel_size, stride, padding, 1, ceil_mode, count_include_pad))


def avg_pool2d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:  # fmt: skip
    """Average over windows. Shape: ``[N, C, H, W]`` -> ``[N, C, H_out, W_out]``."""
    op = ops.avg_pool2d
    return _pool(op, x, _pool_options(op, 2, kernel_size, stride, padding, 1, ceil_mode, count_include_pad))


def max_pool1d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               dilation: IntOrSeq = 1, ceil_mode: bool = False) -> Tensor:  # fmt: skip
    """Maximum over windows; padding counts as -inf."""
    op = ops.max_pool1d
    return _pool(op, x, _pool_options(op, 1, kernel_size, stride, padding, dilation, ceil_mode, True))


def max_pool2d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               dilation: IntOrSeq = 1, ceil_mode: bool = False) -> Tensor:  # fmt: skip
    op = ops.max_pool2d
    return _pool(op, x, _pool_options(op, 2, kernel_size, stride, padding, dilation, ceil_mode, True))


def max_pool1d_with_indices(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None,
                            padding: IntOrSeq = 0, dilation: IntOrSeq = 1,
                            ceil_mode: bool = False) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Maxima and their flat indices within each input plane (as PyTorch returns them)."""
    op = ops.max_pool1d_with_indices
    return _pool(op, x, _pool_options(op, 1, kernel_size, stride, padding, dilation, ceil_mode, True))


def max_pool2d_with_indices(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None,
                            padding: IntOrSeq = 0, dilation: IntOrSeq = 1,
                            ceil_mode: bool = False) -> tuple[Tensor, Tensor]:  # fmt: skip
    op = ops.max_pool2d_with_indices
    return _pool(op, x, _pool_options(op, 2, kernel_size, stride, padding, dilation, ceil_mode, True))


def adaptive_avg_pool1d(x: Tensor, output_size: IntOrSeq) -> Tensor:
    """Average pooling to a fixed output length (PyTorch's window boundaries)."""
    op = ops.adaptive_avg_pool1d
    return _pool(op, x, _tuple(op.name, "output_size", output_size, 1, 1))


def adaptive_avg_pool2d(x: Tensor, output_size: IntOrSeq) -> Tensor:
    op = ops.adaptive_avg_pool2d
    return _pool(op, x, _tuple(op.name, "output_size", output_size, 2, 1))


def adaptive_max_pool1d(x: Tensor, output_size: IntOrSeq) -> Tensor:
    op = ops.adaptive_max_pool1d
    return _pool(op, x, _tuple(op.name, "output_size", output_size, 1, 1))


def adaptive_max_pool2d(x: Tensor, output_size: IntOrSeq) -> Tensor:
    op = ops.adaptive_max_pool2d
    return _pool(op, x, _tuple(op.name, "output_size", output_size, 2, 1))


def embedding(weights: Tensor, indices: Tensor) -> Tensor:
    """Rows of ``weights`` at ``indices``. Shape: ``[V, D]`` and ``[...]`` -> ``[..., D]``."""
    op = ops.embedding
    _float(op.name, weights)
    if indices.kind is not Kind.INT:
        raise KindError(f"embedding: indices must be an Int tensor, got {_describe(indices)}")
    _same_device(op.name, weights, indices)
    op.rule(op.name, weights._aval(), indices._aval())
    return _wrap(weights.backend.embedding(weights._prim, indices._prim), weights.device, Kind.FLOAT)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
               epsilon: float = 1e-5) -> Tensor:  # fmt: skip
    """Normalizes over the last dim: ``(x - mean) / sqrt(var + epsilon) * weight + bias``.

    The variance is biased (divided by the dim's size), as in PyTorch's ``layer_norm``;
    ``weight`` and ``bias`` are optional, cast to ``x``'s dtype. One op of the table: a
    backend may run it as one kernel (Torch does), a fusion device fuses its decomposition.

    Shape:
        x ``[..., D]``, weight and bias ``[D]`` -> ``[..., D]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.tensor import module
        >>> [round(v, 4) for v in module.layer_norm(Tensor.from_data([[1.0, 3.0]])).tolist()[0]]
        [-1.0, 1.0]
    """
    return _wrap(_run(ops.layer_norm, x, [weight, bias], epsilon), x.device, Kind.FLOAT)


def interpolate(x: Tensor, output_size: IntOrSeq, mode: str = "nearest", align_corners: bool = False) -> Tensor:
    """Resizes the spatial dims of ``[N, C, H, W]`` (or ``[N, C, L]``) to ``output_size``.

    ``mode`` is ``nearest`` (PyTorch's legacy nearest), ``bilinear`` or ``bicubic``.
    """
    n = x.rank - 2
    if n not in (1, 2):
        raise ShapeError(f"interpolate: input must be [N, C, L] or [N, C, H, W], got {fmt_shape(x.shape)}")
    size = _tuple("interpolate", "output_size", output_size, n, 1)
    options = InterpolateOptions(mode, bool(align_corners))  # type: ignore[arg-type]
    if n == 1:  # one spatial dim runs as a 2-d resize of height 1
        out = interpolate(x.unsqueeze_dim(2), (1, size[0]), mode, align_corners)
        return out.squeeze(2)
    return _wrap(_run(ops.interpolate, x, [], size, options), x.device, Kind.FLOAT)


def unfold4d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq = 1, padding: IntOrSeq = 0,
             dilation: IntOrSeq = 1) -> Tensor:  # fmt: skip
    """Sliding blocks of ``[N, C, H, W]`` as ``[N, C*KH*KW, L]`` (``torch.nn.functional.unfold``)."""
    op = ops.unfold4d
    kernel = _tuple(op.name, "kernel_size", kernel_size, 2, 1)
    options = ConvOptions(
        _tuple(op.name, "stride", stride, 2, 1), _tuple(op.name, "padding", padding, 2, 0),
        _tuple(op.name, "dilation", dilation, 2, 1), 1,
    )  # fmt: skip
    return _wrap(_run(op, x, [], kernel, options), x.device, Kind.FLOAT)
