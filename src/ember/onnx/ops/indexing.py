"""Indexing ops: GatherElements, GatherND, ScatterElements (and the older Scatter), ScatterND,
OneHot, NonZero, TopK, Compress, ReverseSequence, Trilu and EyeLike.

ONNX's negative indices count from the end of their dim; the generated code maps them
with ``%`` (the remainder has the divisor's sign), so an index past either end wraps
instead of failing. Scatters with a ``max``, ``min`` or ``mul`` reduction compare every
update with every target position along the scattered dim, which costs memory in
``updates x dim size``; ``none`` and ``add`` are one scatter-add. Duplicate indices with
reduction ``none`` (whose result ONNX leaves undefined) add up.
"""

from __future__ import annotations

import math

import numpy as np

from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.ir import ember_dtype
from ember.onnx.registry import converter
from ember.tensor.data import numpy_dtype

# Constant indices up to this many elements are written inline; larger ones become fields.
_INLINE = 16


def _axis(x: Value, axis: int) -> int | str:
    """An ONNX ``axis`` of ``x``: non-negative when the rank or the axis is known to be,
    else the expression that makes it so when the model runs."""
    if x.rank is not None:
        return axis % max(x.rank, 1)
    return axis if axis >= 0 else f"rt.axis({axis}, {x.expr}.rank)"


def _dim(x: Value, i: int | str) -> str:
    shape = x.shape
    if shape is not None and isinstance(i, int) and isinstance(shape[i], int):
        return str(shape[i])
    return f"{x.expr}.shape[{i}]"


def _static(node: NodeContext, x: Value, what: str) -> tuple[int, ...]:
    shape = x.static_shape
    if shape is None:
        node.unsupported(f"{node.op_type} needs the static shape of {what} at import time")
    return shape  # type: ignore[return-value]


def _indices(node: NodeContext, indices: Value, data: Value, axis: int | str) -> str:
    """Non-negative indices along ``axis`` of ``data``: constants are mapped at import
    time, runtime ones with ``%``."""
    const = indices.const
    if const is not None and data.static_shape is not None and isinstance(axis, int):
        size = data.static_shape[axis]
        mapped = np.where(const < 0, const + size, const).astype(np.int64)
        if mapped.size <= _INLINE:
            return f"Tensor.from_data({literal(mapped)}, device={data.expr}.device)"
        return node.param(mapped, f"{node.name}_indices", trainable=False)
    return f"{indices.expr} % {_dim(data, axis)}"


# ---------------------------------------------------------------------------------- gathers
@converter("GatherElements", since=11, attrs=("axis",))
def gather_elements(node: NodeContext) -> str:
    data, indices = node.input(0), node.input(1)
    axis = _axis(data, int(node.attr("axis", 0)))
    where = _indices(node, indices, data, axis)
    return f"{node.outputs[0]} = {data.expr}.gather({axis}, {where})"


def _linear(node: NodeContext, indices: Value, dims: tuple[int, ...], lines: list[str]) -> str:
    """A local of the row-major position of each index tuple (the last dim of ``indices``)
    in a block of ``dims``; keeps the last dim with size 1."""
    index = indices.expr
    where = node.tmp("position")
    sizes = literal(list(dims))
    if len(dims) == 1:
        lines.append(f"{where} = {index} % {dims[0]}")
        return where
    strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
    device = f"{index}.device"
    lines.append(f"{where} = ({index} % Tensor.from_data({sizes}, device={device}) * "
                 f"Tensor.from_data({literal(strides)}, device={device})).sum_dim(-1)")
    return where


@converter("GatherND", since=11, attrs=("batch_dims",))
def gather_nd(node: NodeContext) -> list[str]:
    """Slices of ``data`` at index tuples: the data becomes a list of rows, one per tuple of
    its (batch, indexed) dims, and the tuples become row numbers."""
    data, indices = node.input(0), node.input(1)
    shape = _static(node, data, "data")
    index_shape = indices.shape
    if index_shape is None or not isinstance(index_shape[-1], int):
        node.unsupported("GatherND needs the size of the indices' last dim at import time")
    batch, depth = int(node.attr("batch_dims", 0)), int(index_shape[-1])  # type: ignore[index]
    block = shape[batch : batch + depth]
    rest = list(shape[batch + depth :])
    lines: list[str] = []
    where = _linear(node, indices, block, lines)
    batches = math.prod(shape[:batch])
    if batch:
        # Each batch's rows start one block further: the batch number times the block size.
        offset = [1] * (len(index_shape) - batch)  # type: ignore[arg-type]
        start = (f"Tensor.arange({batches}, device={indices.expr}.device)"
                 f".reshape({list(shape[:batch]) + offset}) * {math.prod(block)}")
        lines.append(f"{where} = {where} + {start}")
    rows = f"{data.expr}.reshape({[batches * math.prod(block), *rest]})"
    out = f"[*{indices.expr}.shape[:-1], {', '.join(map(str, rest))}]" if rest else \
        f"{indices.expr}.shape[:-1]"  # fmt: skip
    lines.append(f"{node.outputs[0]} = {rows}.select(0, {where}.reshape([-1])).reshape({out})")
    return lines


# ---------------------------------------------------------------------------------- scatters
def _dense(node: NodeContext, base: str, at: str, values: str, dim: int, size: str,
           reduction: str) -> list[str]:  # fmt: skip
    """``max``/``min``/``mul`` of ``values`` into ``base`` at positions ``at`` along ``dim``
    (``at`` and ``values`` are like ``base`` but may be shorter along ``dim``).

    Every update is compared with every target position (a new last dim of ``size``);
    where they differ, the base's own value stands in, which leaves max and min unchanged,
    and 1 does for mul.
    """
    hits, chosen, y = node.tmp("hits"), node.tmp("chosen"), node.outputs[0]
    target = f"{base}.movedim({dim}, -1).unsqueeze_dim({dim})"
    lines = [f"{hits} = {at}.unsqueeze_dim(-1).equal(Tensor.arange({size}, "
             f"device={base}.device))"]
    update = f"{values}.unsqueeze_dim(-1)"
    if reduction == "mul":
        lines.append(f"{chosen} = {update}.mask_fill({hits}.bool_not(), 1).prod_dim({dim})")
    else:
        full = f"{target}.expand({hits}.shape)"
        reduce = "max_dim" if reduction == "max" else "min_dim"
        lines.append(f"{chosen} = {full}.mask_where({hits}, {update}).{reduce}({dim})")
    combined = {"mul": "mul", "max": "max_pair", "min": "min_pair"}[reduction]
    lines.append(f"{y} = {base}.{combined}({chosen}.squeeze_dims([{dim}]).movedim(-1, {dim}))")
    return lines


def _scatter(node: NodeContext, reduction: str) -> list[str]:
    data, indices, updates = node.input(0), node.input(1), node.input(2)
    axis = _axis(data, int(node.attr("axis", 0)))
    where = _indices(node, indices, data, axis)
    y = node.outputs[0]
    if reduction == "add":
        return [f"{y} = {data.expr}.scatter({axis}, {where}, {updates.expr})"]
    at = node.tmp("at")
    lines = [f"{at} = {where}"]
    if reduction == "none":
        # Clear the targets, then add: an update replaces the value it lands on.
        hit = node.tmp("hit")
        ones = f"Tensor.ones({at}.shape, {at}.device, 'i64')"
        lines.append(f"{hit} = Tensor.zeros({data.expr}.shape, {data.expr}.device, 'i64')"
                     f".scatter({axis}, {at}, {ones}).greater(0)")
        lines.append(f"{y} = {data.expr}.mask_fill({hit}, 0).scatter({axis}, {at}, "
                     f"{updates.expr})")
        return lines
    shape, index_shape = data.static_shape, indices.static_shape
    base = data.expr
    if shape is None or index_shape is None:
        node.unsupported(f"reduction {reduction!r} needs static shapes of data and indices")
    region = [i if d != axis else s for d, (i, s) in enumerate(zip(index_shape, shape))]
    if tuple(region) != shape:
        # Indices smaller than the data outside the axis: reduce into that corner only.
        corner = node.tmp("corner")
        lines.append(f"{corner} = {base}[{', '.join(f':{r}' for r in region)}]")
        lines += _dense(node, corner, at, updates.expr, axis, str(shape[axis]), reduction)
        ranges = literal([[0, r] for r in region])
        lines.append(f"{y} = {base}.slice_assign({ranges}, {y})")
        return lines
    return lines + _dense(node, base, at, updates.expr, axis, str(shape[axis]), reduction)


_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduction(node: NodeContext) -> str:
    reduction = str(node.attr("reduction", "none"))
    if reduction not in _REDUCTIONS:
        node.unsupported(f"reduction {reduction!r} (expected one of {', '.join(_REDUCTIONS)})")
    return reduction


@converter("Scatter", since=9, attrs=("axis",))
@converter("ScatterElements", since=11, attrs=("axis", "reduction"))
def scatter_elements(node: NodeContext) -> list[str]:
    return _scatter(node, _reduction(node))


@converter("ScatterND", since=11, attrs=("reduction",))
def scatter_nd(node: NodeContext) -> list[str]:
    """Updates whole slices at index tuples: the data becomes a list of rows (one per tuple
    of its indexed dims), the tuples become row numbers, and the rows are scattered."""
    data, indices, updates = node.input(0), node.input(1), node.input(2)
    reduction = _reduction(node)
    shape = _static(node, data, "data")
    index_shape = indices.shape
    if index_shape is None or not isinstance(index_shape[-1], int):
        node.unsupported("ScatterND needs the size of the indices' last dim at import time")
    depth = int(index_shape[-1])  # type: ignore[index]
    rows, rest = math.prod(shape[:depth]), list(shape[depth:])
    lines: list[str] = []
    where = _linear(node, indices, shape[:depth], lines)
    new, y = node.tmp("new_rows"), node.outputs[0]
    lines.append(f"{where} = {where}.reshape([-1])")
    if depth == 1:  # the data's first dim already numbers its rows
        flat, back = data.expr, ""
    else:
        flat, back = node.tmp("rows"), f".reshape({list(shape)})"
        lines.append(f"{flat} = {data.expr}.reshape({[rows, *rest]})")
    lines.append(f"{new} = {updates.expr}.reshape({[-1, *rest]})")
    unit = [1] * len(rest)
    if reduction == "add":
        lines.append(f"{y} = {flat}.select_assign(0, {where}, {new}){back}")
    elif reduction == "none":
        hit = node.tmp("hit")
        ones = f"Tensor.ones({where}.shape, {where}.device, 'i64')"
        lines.append(f"{hit} = Tensor.zeros([{rows}], {where}.device, 'i64')"
                     f".select_assign(0, {where}, {ones}).greater(0).reshape({[rows, *unit]})")
        lines.append(f"{y} = {flat}.mask_fill({hit}, 0).select_assign(0, {where}, {new}){back}")
    else:
        # Row k of the result reduces the updates whose tuple is k: compare all with all.
        hits, chosen = node.tmp("hits"), node.tmp("chosen")
        lines.append(f"{hits} = {where}.unsqueeze_dim(-1).equal(Tensor.arange({rows}, "
                     f"device={where}.device)).reshape({[-1, rows, *unit]})")
        update = f"{new}.unsqueeze_dim(1)"
        if reduction == "mul":
            lines.append(f"{chosen} = {update}.mask_fill({hits}.bool_not(), 1).prod_dim(0)")
        else:
            dims = ", ".join(str(d) for d in [rows, *rest])
            full = f"{flat}.unsqueeze_dim(0).expand([{hits}.shape[0], {dims}])"
            reduce = "max_dim" if reduction == "max" else "min_dim"
            lines.append(f"{chosen} = {full}.mask_where({hits}, {update}).{reduce}(0)")
        combined = {"mul": "mul", "max": "max_pair", "min": "min_pair"}[reduction]
        lines.append(f"{y} = {flat}.{combined}({chosen}.squeeze_dims([0])){back}")
    return lines


# ---------------------------------------------------------------------------------- one-hot
@converter("OneHot", since=9, attrs=("axis",))
def one_hot(node: NodeContext) -> list[str]:
    """``values[1]`` where an index (negative counts from ``depth``) meets its class, else
    ``values[0]``; the classes form a new dim at ``axis``. Out-of-range indices give all
    ``values[0]``."""
    indices, depth, values = node.input(0), node.input(1), node.input(2)
    rank = indices.rank
    axis = int(node.attr("axis", -1))
    if rank is not None:
        axis = axis + rank + 1 if axis < 0 else axis
    count = str(int(np.asarray(depth.const).reshape(-1)[0])) if depth.is_const else \
        f"int({depth.expr})"  # fmt: skip
    index, hits, y = node.tmp("index"), node.tmp("hits"), node.outputs[0]
    cast = "" if indices.dtype is not None and indices.dtype.is_int else ".int()"
    lines = [f"{index} = {indices.expr}{cast}",
             f"{index} = {index}.mask_where({index}.lower(0), {index} + {count})",
             f"{hits} = {index}.unsqueeze_dim(-1).equal(Tensor.arange({count}, "
             f"device={index}.device))"]
    picked = f"{values.expr}.select(0, {hits}.int().reshape([-1])).reshape({hits}.shape)"
    if axis != (rank if rank is not None else -1):  # the classes' dim is made last
        picked = f"{picked}.movedim(-1, {axis})"
    lines.append(f"{y} = {picked}")
    return lines


# ---------------------------------------------------------------------------------- selections
@converter("NonZero", since=9, attrs=())
def non_zero(node: NodeContext) -> str:
    """The positions of the nonzero elements, one row per dim (``[rank, count]``, i64)."""
    x = node.input(0)
    return f"{node.outputs[0]} = {x.expr}.argwhere().transpose().cast('i64')"


@converter("Compress", since=9, attrs=("axis",))
def compress(node: NodeContext) -> str:
    """The slices along ``axis`` (of the flattened input when absent) whose condition is
    true; a condition shorter than the dim leaves out the rest."""
    x, condition = node.input(0), node.input(1)
    axis = node.attr("axis", None)
    const = condition.const
    if const is not None:
        kept = np.flatnonzero(const).astype(np.int64)
        where = f"Tensor.from_data({literal(kept)}, device={x.expr}.device, dtype='i64')" \
            if kept.size <= _INLINE else node.param(kept, f"{node.name}_kept", trainable=False)
    else:
        where = f"{condition.expr}.argwhere().reshape([-1])"
    if axis is None:
        return f"{node.outputs[0]} = {x.expr}.reshape([-1]).select(0, {where})"
    return f"{node.outputs[0]} = {x.expr}.select({int(axis)}, {where})"


@converter("TopK", since=1, attrs=("axis", "k"))
@converter("TopK", since=10, attrs=("axis",))
@converter("TopK", since=11, attrs=("axis", "largest", "sorted"))
def top_k(node: NodeContext) -> list[str]:
    """The ``k`` largest (or smallest) elements along ``axis`` and their indices, sorted;
    equal elements keep their order (the lower index first), as ONNX asks."""
    x = node.input(0)
    axis = int(node.attr("axis", -1))
    if node.opset < 10:
        k = str(int(node.attr("k")))
    elif node.input(1).is_const:
        k = str(node.input(1).ints()[0])
    else:
        k = f"int({node.input(1).expr})"
    largest = bool(node.attr("largest", 1))
    values, indices = node.outputs[0], node.outputs[1]
    option = "" if largest else ", largest=False"
    return [f"{values}, {indices} = {x.expr}.topk_with_indices({k}, {axis}{option})",
            f"{indices} = {indices}.cast('i64')"]


@converter("ReverseSequence", since=10, attrs=("batch_axis", "time_axis"))
def reverse_sequence(node: NodeContext) -> list[str]:
    """Reverses the first ``sequence_lens[b]`` time steps of each batch entry ``b``: time
    step ``t < len`` reads step ``len - 1 - t``, the others stay."""
    x, lengths = node.input(0), node.input(1)
    rank = x.rank
    batch_axis, time_axis = int(node.attr("batch_axis", 1)), int(node.attr("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        node.unsupported("ReverseSequence needs batch_axis and time_axis to be 0 and 1")
    steps, size = _dim(x, time_axis), node.tmp("lens")
    step, source, y = node.tmp("step"), node.tmp("source"), node.outputs[0]
    if time_axis == 0:  # [time, batch] grids
        lines = [f"{step} = Tensor.arange({steps}, device={x.expr}.device).reshape([-1, 1])",
                 f"{size} = {lengths.expr}.reshape([1, -1])"]
    else:
        lines = [f"{step} = Tensor.arange({steps}, device={x.expr}.device).reshape([1, -1])",
                 f"{size} = {lengths.expr}.reshape([-1, 1])"]
    lines.append(f"{source} = ({size} - 1 - {step}).mask_where({step}.greater_equal({size}), "
                 f"{step})")
    if rank is None:
        lines.append(f"{source} = {source}.reshape([*{source}.shape, *[1] * ({x.expr}.rank - 2)])"
                     f".expand({x.expr}.shape)")
    elif rank > 2:
        trailing = ", ".join(["1"] * (rank - 2))
        lines.append(f"{source} = {source}.reshape([*{source}.shape, {trailing}])"
                     f".expand({x.expr}.shape)")
    lines.append(f"{y} = {x.expr}.gather({time_axis}, {source})")
    return lines


# ---------------------------------------------------------------------------------- matrices
@converter("Trilu", since=14, attrs=("upper",))
def trilu(node: NodeContext) -> str:
    """The upper (or lower) triangle of the last two dims from diagonal ``k``, zeros elsewhere."""
    x, k = node.input(0), node.input(1)
    diagonal = "" if not k.present else str(k.ints()[0]) if k.is_const else f"int({k.expr})"
    method = "triu" if int(node.attr("upper", 1)) else "tril"
    return f"{node.outputs[0]} = {x.expr}.{method}({diagonal})"


@converter("EyeLike", since=9, attrs=("dtype", "k"))
def eye_like(node: NodeContext) -> str | None:
    """Ones on diagonal ``k`` of a matrix shaped like the input; a constant when the shape
    is static."""
    x = node.input(0)
    k = int(node.attr("k", 0))
    code = node.attr("dtype", None)
    dtype = ember_dtype(int(code)) if code is not None else x.dtype
    if dtype is None:
        node.unsupported("EyeLike's output dtype has no ember equivalent (or is unknown)")
    static = x.static_shape
    if static is not None and len(static) == 2:
        node.set_constant(0, np.eye(static[0], static[1], k, dtype=numpy_dtype(dtype)))
        return None
    rows, cols = _dim(x, 0), _dim(x, 1)
    device = f"{x.expr}.device"
    row = f"Tensor.arange({rows}, device={device}).reshape([-1, 1]) + {k}"
    col = f"Tensor.arange({cols}, device={device}).reshape([1, -1])"
    return f"{node.outputs[0]} = ({row}).equal({col}).cast({dtype.value!r})"
