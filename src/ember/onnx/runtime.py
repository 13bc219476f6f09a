"""Helpers the generated code calls where ONNX semantics need more than one tensor op.

Each helper is a plain function of tensors and Python values, so generated ``forward``
methods stay straight-line code: no lookup of converters happens when a model runs.
Helpers resolve what depends on runtime shapes (dynamic dims, negative axes, ONNX's
``0`` in a reshape) from the tensors they get.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.onnx import runtime as rt
    >>> x = Tensor.zeros([2, 3, 4], ember.device("ndarray"))
    >>> rt.shape(x).tolist(), rt.reshape(x, [0, -1]).shape
    ([2, 3, 4], (2, 12))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.backend.device import Device
from ember.backend.errors import ShapeError, fmt_shape
from ember.module import Param
from ember.tensor import DType, Tensor

IntsLike = Sequence[int] | Tensor


def param(shape: Sequence[int], dtype: str, device: Device | None = None, *,
          trainable: bool = True) -> Param:  # fmt: skip
    """A placeholder parameter (zeros) of ``shape`` and ``dtype``; records fill it."""
    value = Tensor.zeros(list(shape), device, DType.parse(dtype), DType.parse(dtype).kind)
    return Param(value, require_grad=trainable)


def ints(value: IntsLike | int) -> list[int]:
    """A shape-like operand (a list, or a 1-d Int tensor computed at runtime) as ints."""
    if isinstance(value, Tensor):
        return [int(v) for v in np.asarray(value.to_numpy()).reshape(-1)]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def axis(dim: int, rank: int) -> int:
    """A possibly negative ONNX axis as an index in ``[0, rank)``."""
    if not -rank <= dim < max(rank, 1):
        raise ShapeError(f"axis {dim} is out of range for a tensor of rank {rank}")
    return dim + rank if dim < 0 else dim


def shape(x: Tensor, start: int = 0, end: int | None = None) -> Tensor:
    """ONNX ``Shape``: the dims ``start:end`` of ``x`` as a 1-d i64 tensor."""
    dims = x.shape
    rank = len(dims)
    s = min(max(start + rank if start < 0 else start, 0), rank)
    e = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return Tensor.from_data(np.asarray(dims[s:e], dtype=np.int64), x.device)


def reshape(x: Tensor, target: IntsLike, allowzero: bool = False) -> Tensor:
    """ONNX ``Reshape``: ``-1`` infers a dim; ``0`` copies the input's dim unless ``allowzero``."""
    dims = ints(target)
    current = x.shape
    if not allowzero:
        dims = [current[i] if d == 0 and i < len(current) else d for i, d in enumerate(dims)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        total = math.prod(current)
        if known == 0 or total % known or dims.count(-1) > 1:
            raise ShapeError(f"Reshape: cannot reshape {fmt_shape(current)} into {fmt_shape(dims)}")
        dims[dims.index(-1)] = total // known
    if math.prod(dims) != math.prod(current):
        raise ShapeError(f"Reshape: cannot reshape {fmt_shape(current)} into {fmt_shape(dims)}")
    return x.reshape(dims)


def flatten(x: Tensor, dim: int = 1) -> Tensor:
    """ONNX ``Flatten``: a 2-d tensor of the dims before ``dim`` and those from it."""
    dims = x.shape
    d = axis(dim, len(dims) + 1) if dim < 0 else dim
    return x.reshape([math.prod(dims[:d]), math.prod(dims[d:])])


def transpose(x: Tensor, perm: Sequence[int] | None = None) -> Tensor:
    """ONNX ``Transpose``: ``perm`` or, by default, the dims reversed."""
    order = list(range(x.rank))[::-1] if perm is None else list(perm)
    return x.permute(order)


def unsqueeze(x: Tensor, axes: IntsLike) -> Tensor:
    """ONNX ``Unsqueeze``: size-1 dims at ``axes`` of the output (negative counts from the end)."""
    wanted = ints(axes)
    rank = x.rank + len(wanted)
    at = sorted(axis(a, rank) for a in wanted)
    dims = list(x.shape)
    for a in at:
        dims.insert(a, 1)
    return x.reshape(dims)


def squeeze(x: Tensor, axes: IntsLike | None = None) -> Tensor:
    """ONNX ``Squeeze``: drops the size-1 dims ``axes``, or all size-1 dims when None."""
    if axes is None:
        return x.reshape([d for d in x.shape if d != 1])
    return x.squeeze_dims([axis(a, x.rank) for a in ints(axes)])


def gather(x: Tensor, indices: Tensor | int | Sequence[Any], dim: int = 0) -> Tensor:
    """ONNX ``Gather``: the slices of ``x`` along ``dim`` at ``indices`` (negative counts from
    the end); the indices' shape replaces that dim."""
    d = axis(dim, x.rank)
    size = x.shape[d]
    if isinstance(indices, Tensor):
        index_shape = indices.shape
        flat = indices.reshape([-1]) if index_shape != (math.prod(index_shape),) else indices
        flat = flat.int()
        flat = flat.mask_where(flat.lower(0), flat + size)
    else:
        array = np.asarray(indices, dtype=np.int64)
        index_shape = array.shape
        array = np.where(array < 0, array + size, array).reshape(-1)
        flat = Tensor.from_data(array, x.device)
    out = x.select(d, flat)
    dims = x.shape
    return out.reshape([*dims[:d], *index_shape, *dims[d + 1 :]])


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """ONNX ``MatMul`` (NumPy's ``matmul``): 1-d operands gain and then lose a dim."""
    if a.rank >= 2 and b.rank >= 2:
        return a.matmul(b)
    left = a.unsqueeze_dim(0) if a.rank == 1 else a
    right = b.unsqueeze_dim(-1) if b.rank == 1 else b
    out = left.matmul(right)
    if a.rank == 1:
        out = out.squeeze(-2)
    if b.rank == 1:
        out = out.squeeze(-1)
    return out


def concat(tensors: Sequence[Tensor], dim: int) -> Tensor:
    """ONNX ``Concat``: joins along ``dim``; empty inputs take part as ONNX allows."""
    d = axis(dim, tensors[0].rank)
    parts = [t for t in tensors if t.shape[d] != 0 or t.num_elements() != 0] or list(tensors[:1])
    if len(parts) == 1:
        return parts[0]
    return Tensor.cat(parts, d)
