"""Layout ops: Slice, Split, Expand, Tile, Pad, CenterCropPad, DepthToSpace, SpaceToDepth, and
the shape-driven makers ConstantOfShape, Range and Size.

Shape-like operands known at import time (constants, folded shape arithmetic) become
Python literals, so a typical model reads ``x[:, 2:5]`` or ``x.pad([1, 1], 0.0)``. Those
only known when the model runs are read on the host with ``rt.ints`` and used in the same
expressions; ONNX's clamping of slice bounds is Python's, so both forms slice alike.
"""

from __future__ import annotations

import math

import numpy as np

from ember.backend.errors import DTypeError
from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.registry import converter
from ember.tensor import DType
from ember.tensor.data import dtype_of_numpy

# Slice bounds at or past these mean "to the end" whatever the dim (ONNX writes INT_MAX).
_BIG = 2**31 - 1


def _operand(node: NodeContext, value: Value, hint: str) -> tuple[list[int] | str, list[str]]:
    """A shape-like input: its ints when constant, else a local holding ``rt.ints`` of it
    (with the line that assigns it)."""
    if value.is_const:
        return value.ints(), []
    name = node.tmp(hint)
    return name, [f"{name} = rt.ints({value.expr})"]


def _item(values: list[int] | str, i: int) -> str:
    return str(values[i]) if isinstance(values, list) else f"{values}[{i}]"


def _dim(x: Value, i: int) -> str:
    """Dim ``i`` of ``x``: a literal when static, else read from the tensor when it runs."""
    shape = x.shape
    if shape is not None and isinstance(shape[i], int):
        return str(shape[i])
    return f"{x.expr}.shape[{i}]"


def _rank(node: NodeContext, x: Value) -> int:
    if x.rank is None:
        node.unsupported("the input's rank must be known at import time (run ONNX shape "
                         "inference, or give the model's inputs static ranks)")
    return x.rank  # type: ignore[return-value]


def _lhs(outputs: list[str]) -> str:
    """The target of an assignment unpacking a list into ``outputs``."""
    return ", ".join(outputs) + ("," if len(outputs) == 1 else "")


# ---------------------------------------------------------------------------------- Slice
def _slice_text(start: list[int] | str, end: list[int] | str, step: list[int] | str | None,
                i: int) -> str:  # fmt: skip
    """``start:end:step`` for the ``i``-th sliced axis, leaving out the bounds Python infers
    (only when the step's sign is known at import time)."""
    s, e = _item(start, i), _item(end, i)
    if not isinstance(step, str):
        forward = step is None or step[i] > 0
        if isinstance(start, list) and (start[i] == 0 if forward else
                                        start[i] == -1 or start[i] >= _BIG):
            s = ""
        if isinstance(end, list) and (end[i] >= _BIG if forward else end[i] <= -_BIG):
            e = ""
    if step is None or (isinstance(step, list) and step[i] == 1):
        return f"{s}:{e}"
    return f"{s}:{e}:{_item(step, i)}"


def _slice(node: NodeContext, x: Value, starts: Value | list[int], ends: Value | list[int],
           axes: Value | list[int] | None, steps: Value | None) -> list[str]:  # fmt: skip
    lines: list[str] = []

    def operand(v: Value | list[int], hint: str) -> list[int] | str:
        if isinstance(v, list):
            return v
        got, more = _operand(node, v, hint)
        lines.extend(more)
        return got

    start, end = operand(starts, "starts"), operand(ends, "ends")
    step = operand(steps, "steps") if steps is not None and steps.present else None
    if isinstance(step, list) and all(s == 1 for s in step):
        step = None
    given: list[int] | str | None = None
    if isinstance(axes, list):
        given = axes
    elif axes is not None and axes.present:
        given = operand(axes, "axes")
    y = node.outputs[0]
    count = len(start) if isinstance(start, list) else len(end) if isinstance(end, list) else \
        (node.input(1).static_shape or [None])[0]  # fmt: skip
    # Negative and non-negative axes of a tensor whose rank is unknown, like axes known only
    # at run time, are resolved against the rank the tensor has when it runs.
    mixed = isinstance(given, list) and x.rank is None and len({a < 0 for a in given}) > 1
    if isinstance(given, str) or count is None or mixed:
        # One (start, end, step) range per axis, None elsewhere.
        rank = x.rank if x.rank is not None else f"{x.expr}.rank"
        spans = [start if isinstance(start, str) else literal(start),
                 end if isinstance(end, str) else literal(end)]
        if step is not None:
            spans.append(step if isinstance(step, str) else literal(step))
        if given is None:
            picked = f"range(len({spans[0]}))" if count is None else literal(list(range(count)))
        else:
            picked = given if isinstance(given, str) else literal(given)
        ranges = node.tmp("ranges")
        lines.append(f"{ranges} = dict(zip([a % {rank} for a in {picked}], "
                     f"zip({', '.join(spans)})))")
        lines.append(f"{y} = {x.expr}.slice([{ranges}.get(d) for d in range({rank})])")
        return lines
    axis_list = list(range(count)) if given is None else list(given)  # type: ignore[arg-type]
    rank = x.rank
    if rank is None and all(a < 0 for a in axis_list):
        # Negative axes count from the end, after an ellipsis.
        key = {a: _slice_text(start, end, step, i) for i, a in enumerate(axis_list)}
        first = min(key)
        parts = ["..."] + [key.get(a, ":") for a in range(first, 0)]
    elif rank is None and all(a >= 0 for a in axis_list):
        # Non-negative axes count from the front; the dims after the last one are kept whole.
        key = {a: _slice_text(start, end, step, i) for i, a in enumerate(axis_list)}
        parts = [key.get(d, ":") for d in range(max(key) + 1)]
    else:
        key = {a % rank: _slice_text(start, end, step, i) for i, a in enumerate(axis_list)}
        parts = [key.get(d, ":") for d in range(rank)]
        while parts and parts[-1] == ":":
            parts.pop()
    if not parts or parts == ["..."]:
        lines.append(f"{y} = {x.expr}")
    else:
        lines.append(f"{y} = {x.expr}[{', '.join(parts)}]")
    return lines


@converter("Slice", since=1, attrs=("starts", "ends", "axes"))
def slice_v1(node: NodeContext) -> list[str]:
    axes = node.attr("axes", None)
    return _slice(node, node.input(0), [int(v) for v in node.attr("starts")],
                  [int(v) for v in node.attr("ends")],
                  None if axes is None else [int(a) for a in axes], None)


@converter("Slice", since=10, attrs=())
def slice_v10(node: NodeContext) -> list[str]:
    return _slice(node, node.input(0), node.input(1), node.input(2), node.input(3),
                  node.input(4))


# ---------------------------------------------------------------------------------- Split
def _split(node: NodeContext, sizes: Value | list[int] | None, equal_parts: bool) -> list[str]:
    """``sizes`` given, or ``len(outputs)`` parts: equal ones (``equal_parts``), else
    opset 18's ``num_outputs`` parts with a smaller last one."""
    x = node.input(0)
    axis = int(node.attr("axis", 0))
    count = len(node.outputs)
    lhs = _lhs(node.outputs)
    if isinstance(sizes, Value) and sizes.present:
        if not sizes.is_const:
            return [f"{lhs} = {x.expr}.split(rt.ints({sizes.expr}), {axis})"]
        sizes = sizes.ints()
    if isinstance(sizes, list) and sizes:
        return [f"{lhs} = {x.expr}.split({sizes}, {axis})"]
    shape = x.shape
    if shape is not None and isinstance(shape[axis], int):
        size = shape[axis]
        part = size // count if equal_parts else -(-size // count)
        if equal_parts and part * count != size:
            node.unsupported(f"dim {axis} of size {size} does not split into {count} equal parts")
        return [f"{lhs} = {x.expr}.split({[part] * (count - 1) + [size - part * (count - 1)]}, "
                f"{axis})"]
    dim = _dim(x, axis if x.rank is None else axis % x.rank)
    part = f"{dim} // {count}" if equal_parts else f"-(-{dim} // {count})"
    return [f"{lhs} = {x.expr}.split({part}, {axis})"]


@converter("Split", since=1, attrs=("axis", "split"))
def split_v1(node: NodeContext) -> list[str]:
    split = node.attr("split", None)
    if split is not None:
        return _split(node, [int(s) for s in split], True)
    return _split(node, node.input(1), True)


@converter("Split", since=13, attrs=("axis",))
def split_v13(node: NodeContext) -> list[str]:
    return _split(node, node.input(1), True)


@converter("Split", since=18, attrs=("axis", "num_outputs"))
def split_v18(node: NodeContext) -> list[str]:
    if node.input(1).present:
        return _split(node, node.input(1), True)
    count = node.attr("num_outputs", None)
    if count is None:
        node.unsupported("Split needs the 'split' input or the 'num_outputs' attribute")
    if int(count) != len(node.outputs):
        node.unsupported(f"num_outputs is {count} but the node has {len(node.outputs)} outputs")
    return _split(node, None, False)


# ---------------------------------------------------------------------------------- Expand, Tile
@converter("Expand", since=8, attrs=())
def expand(node: NodeContext) -> list[str]:
    """NumPy broadcasting of the input with the shape: a target dim of 1 keeps the input's."""
    x, shape = node.input(0), node.input(1)
    y = node.outputs[0]
    target, lines = _operand(node, shape, "shape")
    count = len(target) if isinstance(target, list) else (shape.static_shape or [None])[0]
    current = x.shape
    if count is None or current is None:
        # Ranks unknown at import time: align both shapes at the end, then broadcast.
        have, want = node.tmp("have"), node.tmp("want")
        wanted = _list(target)
        rank = f"max(len({wanted}), {x.expr}.rank)"
        return [*lines,
                f"{have} = [1] * ({rank} - {x.expr}.rank) + list({x.expr}.shape)",
                f"{want} = [1] * ({rank} - len({wanted})) + list({wanted})",
                f"{y} = {x.expr}.expand([b if a == 1 else a for a, b in zip({have}, {want})])"]
    out_rank = max(count, len(current))
    dims: list[str] = []
    for i in range(out_rank):
        j, k = i - (out_rank - count), i - (out_rank - len(current))
        have = current[k] if k >= 0 else 1
        want = _item(target, j) if j >= 0 else None
        if want is None or have == 0:
            dims.append(str(have) if isinstance(have, int) else f"{x.expr}.shape[{k}]")
        elif isinstance(have, int) and have == 1:
            dims.append(want)
        elif isinstance(have, int) and isinstance(target, list):
            dims.append(str(have if target[j] in (1, have) else target[j]))
        else:
            mine = str(have) if isinstance(have, int) else f"{x.expr}.shape[{k}]"
            dims.append(f"max({mine}, {want})")
    if all(d.isdigit() for d in dims) and tuple(int(d) for d in dims) == current:
        return [*lines, f"{y} = {x.expr}"]
    return [*lines, f"{y} = {x.expr}.expand([{', '.join(dims)}])"]


def _list(values: list[int] | str) -> str:
    return literal(values) if isinstance(values, list) else values


@converter("Tile", since=1, attrs=())
def tile_v1(node: NodeContext) -> str:
    """Opset 1 to 5: the input repeated ``tiles`` times along ``axis`` (both inputs)."""
    x, tiles, axis = node.input(0), node.input(1), node.input(2)
    times = str(tiles.ints()[0]) if tiles.is_const else f"int({tiles.expr})"
    dim = str(axis.ints()[0]) if axis.is_const else f"int({axis.expr})"
    return f"{node.outputs[0]} = {x.expr}.repeat_dim({dim}, {times})"


@converter("Tile", since=6, attrs=())
def tile(node: NodeContext) -> list[str]:
    x, repeats = node.input(0), node.input(1)
    times, lines = _operand(node, repeats, "repeats")
    if isinstance(times, list) and all(t == 1 for t in times):
        return [f"{node.outputs[0]} = {x.expr}"]
    return [*lines, f"{node.outputs[0]} = {x.expr}.repeat({_list(times)})"]


# ---------------------------------------------------------------------------------- Pad
_MODES = ("constant", "reflect", "edge", "wrap")


def _fill(node: NodeContext, x: Value, value: float | int | str) -> str:
    """The pad value as code of the input's kind (ember wants an int for Int tensors)."""
    if isinstance(value, str):
        return value
    dtype = x.dtype
    if dtype is not None and not dtype.is_float:
        return literal(bool(value) if dtype is DType.BOOL else int(value))
    return literal(float(value))


def _pad(node: NodeContext, pads: Value | list[int], value: float | int | str,
         axes: Value | list[int] | None) -> list[str]:  # fmt: skip
    """ONNX pads ``[b_1, ..., b_n, e_1, ..., e_n]`` for ``axes`` (all dims by default)."""
    x = node.input(0)
    mode = str(node.attr("mode", "constant"))
    if mode not in _MODES:
        node.unsupported(f"pad mode {node.attr('mode')!r} (ember pads constant, reflect, edge, "
                         f"wrap)")
    lines: list[str] = []
    if isinstance(pads, Value):
        amounts, lines = _operand(node, pads, "pads")
    else:
        amounts = pads
    count = len(amounts) // 2 if isinstance(amounts, list) else \
        ((node.input(1).static_shape or [None])[0] or 0) // 2  # fmt: skip
    picked: list[int] | str | None
    if isinstance(axes, Value) and axes.present:
        picked, more = _operand(node, axes, "axes")
        lines += more
    else:
        picked = None if isinstance(axes, Value) else axes
    rank = x.rank
    if rank is None and picked is None and count:
        rank = count  # without axes, the pads name every dim
    rank = _rank(node, x) if rank is None else rank
    y = node.outputs[0]
    fill = _fill(node, x, value) if mode == "constant" else None
    if isinstance(picked, str) or (count == 0 and isinstance(amounts, str)):
        if mode == "wrap":
            node.unsupported("wrap padding needs its axes and the number of pads known at import "
                             "time")
        pairs = node.tmp("pairs")
        chosen = picked if isinstance(picked, str) else f"range({rank})"
        half = f"len({amounts}) // 2"
        lines.append(f"{pairs} = dict(zip([a % {rank} for a in {chosen}], "
                     f"zip({amounts}[:{half}], {amounts}[{half}:])))")
        flat = f"[v for d in range({rank - 1}, -1, -1) for v in {pairs}.get(d, (0, 0))]"
        extra = f", {fill}" if mode == "constant" else f", mode={mode!r}"
        return [*lines, f"{y} = {x.expr}.pad({flat}{extra})"]
    dims = list(range(rank)) if picked is None else [a % rank for a in picked]
    per_dim: dict[int, tuple[str, str]] = {}
    for i, d in enumerate(dims):
        before, after = _item(amounts, i), _item(amounts, count + i)
        if before != "0" or after != "0":
            per_dim[d] = (before, after)
    if not per_dim:
        return [*lines, f"{y} = {x.expr}"]
    if mode == "wrap":
        return lines + _wrap(node, x, per_dim)
    first = min(per_dim)
    flat_pads = [v for d in range(rank - 1, first - 1, -1) for v in per_dim.get(d, ("0", "0"))]
    text = "[" + ", ".join(flat_pads) + "]"
    if mode == "constant":
        extra = "" if fill in ("0", "0.0", "False") else f", {fill}"
    else:
        extra = f", mode={mode!r}"
    return [*lines, f"{y} = {x.expr}.pad({text}{extra})"]


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _wrap(node: NodeContext, x: Value, per_dim: dict[int, tuple[str, str]]) -> list[str]:
    """Wrap padding. Negative pads crop first (as onnxruntime does); then, along each
    padded dim of the kept block, the positions ``-before .. kept + after`` are taken
    modulo the kept size."""
    y = node.outputs[0]
    current = x.expr
    lines = []
    for d, (before, after) in sorted(per_dim.items()):
        size = _dim(x, d)
        if _is_int(before) and _is_int(after) and _is_int(size):
            b, e, s = int(before), int(after), int(size)
            kept = s - max(-b, 0) - max(-e, 0)
            span = f"{-max(b, 0)}, {kept + max(e, 0)}"
            shift = f" + {max(-b, 0)}" if b < 0 else ""
            index = f"Tensor.arange({span}, device={x.expr}.device) % {kept}{shift}"
        else:
            kept = node.tmp("kept")
            lines.append(f"{kept} = {size} - max(-{before}, 0) - max(-{after}, 0)")
            span = f"-max({before}, 0), {kept} + max({after}, 0)"
            index = (f"Tensor.arange({span}, device={x.expr}.device) % {kept} + "
                     f"max(-{before}, 0)")
        lines.append(f"{y} = {current}.select({d}, {index})")
        current = y
    return lines


@converter("Pad", since=1, attrs=("mode", "paddings", "value"))
def pad_v1(node: NodeContext) -> list[str]:
    return _pad(node, [int(p) for p in node.attr("paddings")], node.attr("value", 0.0), None)


@converter("Pad", since=2, attrs=("mode", "pads", "value"))
def pad_v2(node: NodeContext) -> list[str]:
    return _pad(node, [int(p) for p in node.attr("pads")], node.attr("value", 0.0), None)


@converter("Pad", since=11, attrs=("mode",),
           limits="wrap padding needs its axes known at import time")
def pad_v11(node: NodeContext) -> list[str]:
    value = node.input(2)
    fill: float | int | str = 0
    if value.present:
        const = value.const
        fill = np.asarray(const).reshape(-1)[0].item() if const is not None and const.size \
            else 0 if const is not None else f"{value.expr}.item()"  # fmt: skip
    return _pad(node, node.input(1), fill, node.input(3) if node.opset >= 18 else None)


@converter("CenterCropPad", since=18, attrs=("axes",))
def center_crop_pad(node: NodeContext) -> list[str]:
    """Crops or zero-pads each axis to the given size, centred; an odd difference leaves the
    extra element at the end. A crop is a negative pad, so one ``pad`` does both."""
    x, shape = node.input(0), node.input(1)
    rank = _rank(node, x)
    axes = [int(a) % rank for a in node.attr("axes", range(rank))]
    target, lines = _operand(node, shape, "size")
    per_dim: dict[int, tuple[str, str]] = {}
    static = x.shape
    for i, d in enumerate(axes):
        have = static[d] if static is not None else None
        if isinstance(target, list) and isinstance(have, int):
            diff = target[i] - have
            before = diff // 2 if diff >= 0 else -((-diff) // 2)
            if diff:
                per_dim[d] = (str(before), str(diff - before))
            continue
        diff = f"{_item(target, i)} - {_dim(x, d)}"
        grow = node.tmp("grow")
        lines.append(f"{grow} = {diff}")
        # Toward zero: a crop by 3 starts 1 in, a pad by 3 puts 1 before.
        before = f"int({grow} / 2)"
        per_dim[d] = (before, f"{grow} - {before}")
    y = node.outputs[0]
    if not per_dim:
        return [*lines, f"{y} = {x.expr}"]
    first = min(per_dim)
    flat = [v for d in range(rank - 1, first - 1, -1) for v in per_dim.get(d, ("0", "0"))]
    return [*lines, f"{y} = {x.expr}.pad([{', '.join(flat)}])"]


# ---------------------------------------------------------------------------------- depth/space
def _nchw(node: NodeContext, x: Value) -> tuple[str, str, str, str]:
    if x.rank is not None and x.rank != 4:
        node.unsupported(f"{node.op_type} needs a 4-d input [N, C, H, W], got rank {x.rank}")
    return _dim(x, 0), _dim(x, 1), _dim(x, 2), _dim(x, 3)


def _div(a: str, b: int) -> str:
    return str(int(a) // b) if a.isdigit() else f"{a} // {b}"


def _mul(a: str, b: int) -> str:
    return str(int(a) * b) if a.isdigit() else f"{a} * {b}"


@converter("DepthToSpace", since=1, attrs=("blocksize", "mode"))
def depth_to_space(node: NodeContext) -> str:
    """Channels to blocks of ``blocksize`` x ``blocksize`` pixels; ``DCR`` takes the depth
    as (block row, block col, channel), ``CRD`` as (channel, block row, block col)."""
    x = node.input(0)
    b = int(node.attr("blocksize"))
    mode = str(node.attr("mode", "DCR"))
    n, c, h, w = _nchw(node, x)
    channels = _div(c, b * b)
    if mode == "DCR":
        split, order = f"[{n}, {b}, {b}, {channels}, {h}, {w}]", [0, 3, 4, 1, 5, 2]
    elif mode == "CRD":
        split, order = f"[{n}, {channels}, {b}, {b}, {h}, {w}]", [0, 1, 4, 2, 5, 3]
    else:
        node.unsupported(f"DepthToSpace mode {mode!r} (expected DCR or CRD)")
    out = f"[{n}, {channels}, {_mul(h, b)}, {_mul(w, b)}]"
    return f"{node.outputs[0]} = {x.expr}.reshape({split}).permute({order}).reshape({out})"


@converter("SpaceToDepth", since=1, attrs=("blocksize",))
def space_to_depth(node: NodeContext) -> str:
    """Blocks of ``blocksize`` x ``blocksize`` pixels to channels, block position first."""
    x = node.input(0)
    b = int(node.attr("blocksize"))
    n, c, h, w = _nchw(node, x)
    split = f"[{n}, {c}, {_div(h, b)}, {b}, {_div(w, b)}, {b}]"
    out = f"[{n}, {_mul(c, b * b)}, {_div(h, b)}, {_div(w, b)}]"
    return (f"{node.outputs[0]} = {x.expr}.reshape({split}).permute([0, 3, 5, 1, 2, 4])"
            f".reshape({out})")


# ---------------------------------------------------------------------------------- makers
def _scalar_code(value: np.ndarray) -> str:
    item = np.asarray(value).reshape(-1)[0]
    if value.dtype == np.bool_:
        return literal(bool(item))
    if value.dtype.kind in "iu":
        return literal(int(item))
    return literal(float(item))


@converter("ConstantOfShape", since=9, attrs=("value",))
def constant_of_shape(node: NodeContext) -> str:
    shape = node.input(0)
    value = node.attr("value", None)
    array = np.zeros(1, np.float32) if value is None else np.asarray(value)
    try:
        dtype = dtype_of_numpy(array.dtype)
    except DTypeError:
        node.unsupported(f"the value has dtype {array.dtype}, which ember lacks")
    dims = literal(shape.ints()) if shape.is_const else f"rt.ints({shape.expr})"
    device = f"{shape.expr}.device"
    return (f"{node.outputs[0]} = Tensor.full({dims}, {_scalar_code(array)}, {device}, "
            f"{dtype.value!r})")


@converter("Range", since=11, attrs=("stash_type",))
def range_(node: NodeContext) -> list[str]:
    """``start, start + delta, ...`` short of ``limit``; floats are computed in f64 and then
    rounded to the output dtype, as NumPy's ``arange`` does."""
    start, limit, delta = node.input(0), node.input(1), node.input(2)
    dtype = start.dtype or node.output_dtype(0)
    if dtype is None:
        node.unsupported("Range needs the dtype of its inputs")
    y = node.outputs[0]
    s, e, d = node.tmp("start"), node.tmp("limit"), node.tmp("delta")
    lines = [f"{s}, {e}, {d} = {start.expr}.item(), {limit.expr}.item(), {delta.expr}.item()"]
    device = f"{start.expr}.device"
    if dtype.is_int:
        return [*lines, f"{y} = Tensor.arange({s}, {e}, {d}, {device}, {dtype.value!r})"]
    count = f"max(int(-(({s} - {e}) // {d})), 0)"
    return [*lines, f"{y} = (Tensor.arange({count}, device={device}).cast('f64') * {d} + {s})"
                    f".cast({dtype.value!r})"]


@converter("Size", since=1, attrs=())
def size(node: NodeContext) -> str | None:
    x = node.input(0)
    static = x.static_shape
    if static is not None:
        node.set_constant(0, np.int64(math.prod(static)))
        return None
    return f"{node.outputs[0]} = Tensor.full([], {x.expr}.num_elements(), {x.expr}.device, 'i64')"
