"""The rules of ember's shape inference, one per op type (see :mod:`ember.onnx.facts`).

Each rule gives its outputs' element types, ranks and the dims it can tell from its
inputs' facts and its attributes, following the ONNX operator specification. Integer
tensors of shape arithmetic (``Shape``, ``Gather``, ``Concat``, ``Slice``, simple
arithmetic) carry their elements, so a ``Reshape`` to a shape computed in the graph gets
its dims, and a ``Reshape`` to a shape whose length alone is known gets its rank. The
bodies of If, Loop and Scan are inferred with the facts of the values they receive.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.onnx.facts import (
    BOOL,
    FLOAT,
    INT64,
    INT_TYPES,
    MAX_RANK,
    MAX_VALUE,
    UNKNOWN,
    Fact,
    Shape,
    Site,
    axis_of,
    broadcast_shapes,
    fact_of_array,
    fits,
    join,
    known,
    product,
    rule,
    same_dim,
)
from ember.onnx.ir import Dim
from ember.onnx.runtime import shape_span

_INT32 = 6


def _value(elems: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
    """Elements worth tracking: a short sequence."""
    if elems is None or len(elems) > MAX_VALUE:
        return None
    return tuple(elems)


def _vector(elem: int, elems: Sequence[Dim] | None) -> Fact:
    """A 1-d integer tensor of ``elems`` (None: its length and elements unknown)."""
    if elems is None:
        return Fact(elem, (None,))
    return Fact(elem, (len(elems),), _value(elems))


def _length(fact: Fact) -> int | None:
    """The length of a 1-d tensor (a shape) when known and a rank can be that long."""
    shape = fact.shape
    if shape is None or len(shape) != 1 or not isinstance(shape[0], int):
        return None
    return shape[0] if 0 <= shape[0] <= MAX_RANK else None


def _const_ints(site: Site, index: int) -> list[int] | None:
    """Input ``index``'s elements when all are known ints (a constant or shape arithmetic)."""
    return site.input(index).ints() if site.present(index) else None


# ------------------------------------------------------------------------ element-wise
_SAME = (
    "Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Floor",
    "Ceil", "Round", "Sign", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh",
    "Cosh", "Asinh", "Acosh", "Atanh", "Softplus", "Softsign", "Elu", "Selu", "LeakyRelu",
    "ThresholdedRelu", "HardSigmoid", "HardSwish", "Mish", "Gelu", "Celu", "Shrink",
    "BitwiseNot", "Clip", "LRN", "Softmax", "LogSoftmax", "Hardmax", "InstanceNormalization",
    "GroupNormalization", "LpNormalization", "MeanVarianceNormalization", "Trilu", "CumSum",
    "CumProd", "ReverseSequence", "ScatterElements", "Scatter", "ScatterND",
    "RMSNormalization", "Swish",
)  # fmt: skip


@rule(*_SAME)
def same_as_input(site: Site) -> Fact:
    """Same type and shape as the first input."""
    return site.input(0).with_shape(site.input(0).shape)


@rule("Identity")
def identity(site: Site) -> Fact:
    return site.input(0)


@rule("IsNaN", "IsInf", "Not")
def bool_like_input(site: Site) -> Fact:
    return Fact(BOOL, site.input(0).shape)


@rule("Dropout")
def dropout(site: Site) -> list[Fact]:
    x = site.input(0)
    return [x.with_shape(x.shape), Fact(BOOL, x.shape)]


_INT64_RANGE = range(-(2**63), 2**63)


def _arithmetic(op: str, a: Dim, b: Dim) -> Dim:
    """``a op b`` on known ints; None past int64 (a chain of products must not grow
    without bound) or for a division by zero."""
    if not isinstance(a, int) or not isinstance(b, int):
        return None
    if op == "Add":
        result = a + b
    elif op == "Sub":
        result = a - b
    elif op == "Mul":
        result = a * b
    elif b == 0:
        return None
    else:
        quotient = abs(a) // abs(b)  # integer Div truncates toward zero
        result = quotient if (a < 0) == (b < 0) else -quotient
    return result if result in _INT64_RANGE else None


@rule("Add", "Sub", "Mul", "Div")
def arithmetic(site: Site) -> Fact:
    """Broadcasting; on integer elements known at import time, their values too."""
    a, b = site.input(0), site.input(1)
    shape = broadcast_shapes([a.shape, b.shape])
    out = Fact(a.elem_type or b.elem_type, shape)
    if a.value is None or b.value is None or shape is None or len(shape) > 1:
        return out
    if a.elem_type not in INT_TYPES or b.elem_type not in INT_TYPES:
        return out
    left, right = list(a.value), list(b.value)
    if len(left) == 1:
        left = left * len(right)
    if len(right) == 1:
        right = right * len(left)
    if len(left) != len(right):
        return out
    op = site.node.op_type
    return Fact(out.elem_type, shape, _value([_arithmetic(op, x, y) for x, y in zip(left, right)]))


@rule("Pow", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu",
      "Max", "Min", "Sum", "Mean")  # fmt: skip
def broadcasting(site: Site) -> Fact:
    """Broadcasting of every input; the first input's type."""
    facts = [site.input(i) for i in range(site.num_inputs) if site.present(i)]
    if not facts:
        return UNKNOWN
    return Fact(facts[0].elem_type, broadcast_shapes([f.shape for f in facts]))


@rule("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor")
def comparison(site: Site) -> Fact:
    return Fact(BOOL, broadcast_shapes([site.input(0).shape, site.input(1).shape]))


@rule("Where")
def where(site: Site) -> Fact:
    x, y = site.input(1), site.input(2)
    shapes = [site.input(0).shape, x.shape, y.shape]
    return Fact(x.elem_type or y.elem_type, broadcast_shapes(shapes))


@rule("Cast")
def cast(site: Site) -> Fact:
    x, to = site.input(0), int(site.attr("to", 0))
    value = x.value if to in INT_TYPES and x.elem_type in INT_TYPES else None
    return Fact(to, x.shape, value)


@rule("CastLike")
def cast_like(site: Site) -> Fact:
    return Fact(site.input(1).elem_type, site.input(0).shape)


@rule("QuantizeLinear")
def quantize(site: Site) -> Fact:
    zero = site.input(2)
    elem = zero.elem_type if site.present(2) else int(site.attr("output_dtype", 0)) or 2
    return Fact(elem, site.input(0).shape)


@rule("DequantizeLinear")
def dequantize(site: Site) -> Fact:
    elem = int(site.attr("output_dtype", 0)) or site.input(1).elem_type
    return Fact(elem, site.input(0).shape)


# ------------------------------------------------------------------------ constants
@rule("Constant")
def constant(site: Site) -> Fact:
    attrs = site.node.attrs
    if "value" in attrs:
        return fact_of_array(np.asarray(attrs["value"]))
    if "value_float" in attrs:
        return Fact(FLOAT, ())
    if "value_floats" in attrs:
        return Fact(FLOAT, (len(attrs["value_floats"]),))
    if "value_int" in attrs:
        return Fact(INT64, (), (int(attrs["value_int"]),))
    if "value_ints" in attrs:
        return fact_of_array(np.asarray(attrs["value_ints"], dtype=np.int64))
    return UNKNOWN


@rule("ConstantOfShape")
def constant_of_shape(site: Site) -> Fact:
    value = site.attr("value")
    elem = fact_of_array(np.asarray(value)).elem_type if value is not None else FLOAT
    dims = site.input(0).value
    if dims is not None:
        fill = np.asarray(value).reshape(-1) if value is not None else None
        elems = None
        if (len(dims) == 1 and isinstance(dims[0], int) and dims[0] <= MAX_VALUE
                and elem in INT_TYPES and fill is not None and fill.size == 1):  # fmt: skip
            elems = (int(fill[0]),) * dims[0]
        return Fact(elem, tuple(dims), elems)
    length = _length(site.input(0))
    return Fact(elem, None if length is None else (None,) * length)


@rule("Range")
def range_(site: Site) -> Fact:
    start, limit, delta = (site.input(i) for i in range(3))
    length: Dim = None
    values = [start.ints(), limit.ints(), delta.ints()]
    if all(v is not None and len(v) == 1 for v in values):
        (s,), (e,), (d,) = values  # type: ignore[misc]
        if d != 0:
            length = max(-(-(e - s) // d), 0)
    return Fact(start.elem_type, (length,))


@rule("EyeLike")
def eye_like(site: Site) -> Fact:
    x = site.input(0)
    return Fact(int(site.attr("dtype", 0)) or x.elem_type, x.shape)


@rule("RandomNormalLike", "RandomUniformLike", "Bernoulli")
def random_like(site: Site) -> Fact:
    x = site.input(0)
    return Fact(int(site.attr("dtype", 0)) or x.elem_type, x.shape)


# ------------------------------------------------------------------------ shapes
@rule("Shape")
def shape(site: Site) -> Fact:
    """The input's dims (``start:end``) as a 1-d i64 tensor, elements included."""
    dims = site.input(0).shape
    if dims is None:
        return Fact(INT64, (None,))
    end = site.attr("end")
    span = shape_span(len(dims), int(site.attr("start", 0)), None if end is None else int(end))
    return _vector(INT64, dims[span])


@rule("Size")
def size(site: Site) -> Fact:
    dims = site.input(0).shape
    total = product(dims) if dims is not None else None
    return Fact(INT64, (), (total,))


def _reshaped(dims: Sequence[Dim], current: Shape | None, allowzero: bool) -> Shape:
    """The dims of a reshape to ``dims`` (0 copies the input's dim unless ``allowzero``,
    -1 is what is left)."""
    out: list[Dim] = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            out.append(current[i] if current is not None and i < len(current) else None)
        elif isinstance(d, int) and d < 0:
            out.append(None)
        else:
            out.append(d)
    if dims.count(-1) == 1 and current is not None:
        total, rest = product(current), product([d for d in out if d is not None])
        if total is not None and rest and out.count(None) == 1 and total % rest == 0:
            out[out.index(None)] = total // rest
    return tuple(out)


@rule("Reshape")
def reshape(site: Site) -> Fact:
    """The rank is the length of the target shape, known even where its elements are not."""
    x = site.input(0)
    if site.opset < 5:
        target = site.ints_attr("shape")
        return x.with_shape(_reshaped(target, x.shape, False) if target is not None else None)
    allowzero = bool(site.attr("allowzero", 0))
    target = site.input(1)
    if target.value is not None:
        shape_out = _reshaped(list(target.value), x.shape, allowzero)
        value = x.value if x.value is not None and len(shape_out) <= 1 else None
        return Fact(x.elem_type, shape_out, value)
    length = _length(target)
    return x.with_shape(None if length is None else (None,) * length)


@rule("Flatten")
def flatten(site: Site) -> Fact:
    """Always 2-d: the dims before ``axis``, then the rest."""
    x, axis = site.input(0), int(site.attr("axis", 1))
    if x.shape is None:
        return x.with_shape((1, None) if axis == 0 else (None, None))
    rank = len(x.shape)
    a = axis + rank if axis < 0 else axis
    if not 0 <= a <= rank:
        return x.with_shape((None, None))
    return x.with_shape((product(x.shape[:a]), product(x.shape[a:])))


@rule("Transpose")
def transpose(site: Site) -> Fact:
    x = site.input(0)
    if x.shape is None:
        return x.with_shape(None)
    perm = site.ints_attr("perm") or list(range(len(x.shape)))[::-1]
    if sorted(perm) != list(range(len(x.shape))):
        return x.with_shape(None)
    return x.with_shape(tuple(x.shape[p] for p in perm))


def _axes(site: Site, since_input: int) -> list[int] | None:
    """``axes`` of (Un)Squeeze and the reductions: an attribute before ``since_input``,
    then an input (None when absent or unknown)."""
    if site.opset < since_input:
        return site.ints_attr("axes")
    return _const_ints(site, 1)


@rule("Unsqueeze")
def unsqueeze(site: Site) -> Fact:
    x, axes = site.input(0), _axes(site, 13)
    if x.shape is None or axes is None:
        return x.with_shape(None)
    rank = len(x.shape) + len(axes)
    at = sorted({axis_of(a, rank) for a in axes} - {None})  # type: ignore[type-var]
    if len(at) != len(axes):
        return x.with_shape(None)
    dims = list(x.shape)
    for a in at:
        dims.insert(a, 1)
    value = x.value if len(dims) <= 1 else None
    return Fact(x.elem_type, tuple(dims), value)


@rule("Squeeze")
def squeeze(site: Site) -> Fact:
    x, axes = site.input(0), _axes(site, 13)
    if x.shape is None:
        return x.with_shape(None)
    rank = len(x.shape)
    if axes is None:
        given = site.attr("axes") is not None if site.opset < 13 else site.present(1)
        if given or not known(x.shape):
            return x.with_shape(None)
        dims = tuple(d for d in x.shape if d != 1)
    else:
        drop = {axis_of(a, rank) for a in axes}
        if None in drop:
            return x.with_shape(None)
        dims = tuple(d for i, d in enumerate(x.shape) if i not in drop)
    value = x.value if len(dims) <= 1 else None
    return Fact(x.elem_type, dims, value)


@rule("Concat")
def concat(site: Site) -> Fact:
    parts = [site.input(i) for i in range(site.num_inputs) if site.present(i)]
    elem = next((p.elem_type for p in parts if p.elem_type), 0)
    ranks = {p.rank for p in parts if p.rank is not None}
    if len(ranks) != 1:
        return Fact(elem)
    rank = ranks.pop()
    axis = axis_of(int(site.attr("axis", 0)), rank)
    if axis is None:
        return Fact(elem)
    dims: list[Dim] = [None] * rank
    for p in parts:
        if p.shape is not None:
            dims = [same_dim(d, s) if i != axis else d for i, (d, s) in enumerate(zip(dims, p.shape))]
    sizes = [p.shape[axis] if p.shape is not None else None for p in parts]
    dims[axis] = sum(sizes) if known(sizes) else None  # type: ignore[arg-type]
    value = None
    if rank == 1 and elem in INT_TYPES:
        # Elements of the parts, a part of known length but unknown elements as Nones: a
        # shape built of known and computed dims.
        elems = [p.value if p.value is not None else
                 (None,) * p.shape[0] if p.shape is not None and isinstance(p.shape[0], int)
                 and p.shape[0] <= MAX_VALUE else None for p in parts]  # fmt: skip
        if all(e is not None for e in elems):
            value = _value([v for e in elems for v in e])  # type: ignore[union-attr]
    return Fact(elem, tuple(dims), value)


@rule("Gather")
def gather(site: Site) -> Fact:
    data, indices = site.input(0), site.input(1)
    if data.shape is None or indices.shape is None:
        return data.with_shape(None)
    axis = axis_of(int(site.attr("axis", 0)), len(data.shape))
    if axis is None:
        return data.with_shape(None)
    dims = (*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :])
    value = None
    picks = indices.ints()
    if data.value is not None and picks is not None and len(data.shape) == 1:
        n = len(data.value)
        if all(-n <= i < n for i in picks):
            value = tuple(data.value[i] for i in picks)
    return Fact(data.elem_type, dims, value)


@rule("GatherElements")
def gather_elements(site: Site) -> Fact:
    return Fact(site.input(0).elem_type, site.input(1).shape)


@rule("GatherND")
def gather_nd(site: Site) -> Fact:
    data, indices = site.input(0), site.input(1)
    batch = int(site.attr("batch_dims", 0))
    if data.shape is None or indices.shape is None or not indices.shape \
            or not isinstance(indices.shape[-1], int):
        return data.with_shape(None)
    depth = indices.shape[-1]
    return data.with_shape((*indices.shape[:-1], *data.shape[batch + depth :]))


def sliced(size: int, start: int, end: int, step: int) -> range:
    """The positions ONNX's Slice takes along a dim of ``size`` (``step`` not 0): negative
    bounds count from the end, then are clamped to ``[0, size]`` (``[-1, size - 1]``
    walking backwards)."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return range(min(max(start, 0), size), min(max(end, 0), size), step)
    return range(min(max(start, 0), size - 1), min(max(end, -1), size - 1), step)


@rule("Slice")
def slice_(site: Site) -> Fact:
    """The same rank; the sliced dims' sizes when the bounds are known."""
    x = site.input(0)
    if x.shape is None:
        return x.with_shape(None)
    rank = len(x.shape)
    if site.opset < 10:
        starts, ends = site.ints_attr("starts"), site.ints_attr("ends")
        axes, steps = site.ints_attr("axes"), None
    else:
        starts, ends = _const_ints(site, 1), _const_ints(site, 2)
        axes = _const_ints(site, 3) if site.present(3) else None
        steps = _const_ints(site, 4) if site.present(4) else None
        if (site.present(3) and axes is None) or (site.present(4) and steps is None):
            return x.with_shape((None,) * rank)
    if starts is None or ends is None or len(starts) != len(ends):
        return x.with_shape((None,) * rank)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if len(axes) != len(starts) or len(steps) != len(starts):
        return x.with_shape((None,) * rank)
    dims = list(x.shape)
    value = list(x.value) if x.value is not None and rank == 1 else None
    for a, s, e, st in zip(axes, starts, ends, steps):
        at = axis_of(a, rank)
        if at is None or st == 0:
            return x.with_shape((None,) * rank)
        size = dims[at]
        dims[at] = len(sliced(size, s, e, st)) if isinstance(size, int) else None
        if value is not None:
            value = [value[i] for i in sliced(len(value), s, e, st)]
    return Fact(x.elem_type, tuple(dims), _value(value))


@rule("Split")
def split(site: Site) -> list[Fact]:
    x, n = site.input(0), site.num_outputs
    if x.shape is None:
        return [x.with_shape(None)] * n
    rank = len(x.shape)
    axis = axis_of(int(site.attr("axis", 0)), rank)
    if axis is None:
        return [x.with_shape(None)] * n
    sizes = site.ints_attr("split") if site.opset < 13 else _const_ints(site, 1)
    size = x.shape[axis]
    parts: list[Dim]
    if sizes is not None and len(sizes) == n:
        parts = list(sizes)
    elif isinstance(size, int) and n and (site.opset < 13 or not site.present(1)):
        chunk = -(-size // n)
        if size % n == 0:
            parts = [size // n] * n
        elif site.opset >= 18:
            parts = [chunk] * (n - 1) + [size - chunk * (n - 1)]
        else:
            parts = [None] * n
    else:
        parts = [None] * n
    return [x.with_shape((*x.shape[:axis], p, *x.shape[axis + 1 :])) for p in parts]


@rule("Expand")
def expand(site: Site) -> Fact:
    x, target = site.input(0), site.input(1)
    if target.value is not None:
        return x.with_shape(broadcast_shapes([x.shape, tuple(target.value)]))
    length = _length(target)
    if x.shape is not None and length is not None:
        return x.with_shape((None,) * max(len(x.shape), length))
    return x.with_shape(None)


@rule("Tile")
def tile(site: Site) -> Fact:
    x, repeats = site.input(0), site.input(1).ints()
    if x.shape is None:
        return x.with_shape(None)
    if repeats is None or len(repeats) != len(x.shape):
        return x.with_shape((None,) * len(x.shape))
    dims = [d * r if isinstance(d, int) else (d if r == 1 else None)
            for d, r in zip(x.shape, repeats)]  # fmt: skip
    return x.with_shape(tuple(dims))


@rule("Pad")
def pad(site: Site) -> Fact:
    x = site.input(0)
    if x.shape is None:
        return x.with_shape(None)
    rank = len(x.shape)
    if site.opset < 11:
        pads = site.ints_attr("pads" if site.opset >= 2 else "paddings")
        axes: list[int] | None = list(range(rank))
    else:
        pads = _const_ints(site, 1)
        axes = _const_ints(site, 3) if site.opset >= 18 and site.present(3) else list(range(rank))
    if pads is None or axes is None or len(pads) != 2 * len(axes):
        return x.with_shape((None,) * rank)
    dims = list(x.shape)
    for i, a in enumerate(axes):
        at = axis_of(a, rank)
        if at is None:
            return x.with_shape((None,) * rank)
        grow = pads[i] + pads[len(axes) + i]
        dims[at] = dims[at] + grow if isinstance(dims[at], int) else (dims[at] if not grow else None)
    return x.with_shape(tuple(dims))


@rule("Resize", "Upsample", "CenterCropPad")
def same_rank(site: Site) -> Fact:
    x = site.input(0)
    return x.with_shape(None if x.shape is None else (None,) * len(x.shape))


@rule("DepthToSpace", "SpaceToDepth")
def depth_space(site: Site) -> Fact:
    x, b = site.input(0), int(site.attr("blocksize", 1))
    if x.shape is None or len(x.shape) != 4:
        return x.with_shape((None,) * 4)
    n, c, h, w = x.shape
    if site.node.op_type == "DepthToSpace":
        dims = (n, c // (b * b) if isinstance(c, int) else None,
                h * b if isinstance(h, int) else None, w * b if isinstance(w, int) else None)
    else:
        dims = (n, c * b * b if isinstance(c, int) else None,
                h // b if isinstance(h, int) else None, w // b if isinstance(w, int) else None)
    return x.with_shape(dims)


@rule("NonZero")
def non_zero(site: Site) -> Fact:
    x = site.input(0)
    return Fact(INT64, (x.rank, None))


@rule("TopK")
def top_k(site: Site) -> list[Fact]:
    x = site.input(0)
    if x.shape is None:
        return [x.with_shape(None), Fact(INT64)]
    axis = axis_of(int(site.attr("axis", -1)), len(x.shape))
    if axis is None:
        return [x.with_shape(None), Fact(INT64)]
    k = site.attr("k") if site.opset < 10 else (_const_ints(site, 1) or [None])[0]
    dims = (*x.shape[:axis], k, *x.shape[axis + 1 :])
    return [x.with_shape(dims), Fact(INT64, dims)]


@rule("OneHot")
def one_hot(site: Site) -> Fact:
    indices, depth, values = site.input(0), site.input(1).ints(), site.input(2)
    if indices.shape is None:
        return Fact(values.elem_type)
    rank = len(indices.shape) + 1
    axis = axis_of(int(site.attr("axis", -1)), rank)
    if axis is None:
        return Fact(values.elem_type)
    dims = list(indices.shape)
    dims.insert(axis, depth[0] if depth is not None and len(depth) == 1 else None)
    return Fact(values.elem_type, tuple(dims))


# ------------------------------------------------------------------------ reductions
_REDUCE_AXES_INPUT = {"ReduceSum": 13}
_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
               "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")  # fmt: skip


@rule(*_REDUCTIONS)
def reduce(site: Site) -> Fact:
    """``keepdims`` keeps the rank whatever the axes; without it the reduced axes go."""
    x = site.input(0)
    keepdims = bool(site.attr("keepdims", 1))
    since = _REDUCE_AXES_INPUT.get(site.node.op_type, 18)
    axes = _axes(site, since)
    runtime = site.opset >= since and site.present(1) and axes is None
    if x.shape is None:
        return x.with_shape(None)
    rank = len(x.shape)
    if runtime:
        return x.with_shape((None,) * rank if keepdims else None)
    if not axes:
        if site.opset >= since and site.attr("noop_with_empty_axes", 0):
            return x.with_shape(x.shape)
        axes = list(range(rank))
    picked = {axis_of(a, rank) for a in axes}
    if None in picked:
        return x.with_shape(None)
    if keepdims:
        return x.with_shape(tuple(1 if i in picked else d for i, d in enumerate(x.shape)))
    return x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in picked))


@rule("ArgMax", "ArgMin")
def arg_reduce(site: Site) -> Fact:
    x = site.input(0)
    if x.shape is None:
        return Fact(INT64)
    rank = len(x.shape)
    axis = axis_of(int(site.attr("axis", 0)), rank)
    if axis is None:
        return Fact(INT64)
    if site.attr("keepdims", 1):
        return Fact(INT64, tuple(1 if i == axis else d for i, d in enumerate(x.shape)))
    return Fact(INT64, tuple(d for i, d in enumerate(x.shape) if i != axis))


# ------------------------------------------------------------------------ products
@rule("MatMul", "MatMulInteger")
def matmul(site: Site) -> Fact:
    """NumPy's matmul: 1-d operands gain a dim, then lose it; batch dims broadcast."""
    a, b = site.input(0), site.input(1)
    elem = _INT32 if site.node.op_type == "MatMulInteger" else a.elem_type
    if a.shape is None or b.shape is None or not a.shape or not b.shape:
        return Fact(elem)
    left = (1, *a.shape) if len(a.shape) == 1 else a.shape
    right = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    batch = broadcast_shapes([left[:-2], right[:-2]])
    dims: list[Dim] = [*batch, left[-2], right[-1]]  # type: ignore[misc]
    if len(b.shape) == 1:
        dims.pop(-1)
    if len(a.shape) == 1:
        dims.pop(-2 if len(b.shape) != 1 else -1)
    return Fact(elem, tuple(dims))


@rule("Gemm")
def gemm(site: Site) -> Fact:
    """Always 2-d: ``[M, N]`` of A and B, each maybe transposed."""
    a, b = site.input(0), site.input(1)
    m = n = None
    if a.shape is not None and len(a.shape) == 2:
        m = a.shape[1] if site.attr("transA", 0) else a.shape[0]
    if b.shape is not None and len(b.shape) == 2:
        n = b.shape[0] if site.attr("transB", 0) else b.shape[1]
    return Fact(a.elem_type or b.elem_type, (m, n))


# ------------------------------------------------------------------------ convolutions
def _spatial_rank(site: Site, x: Fact, w: Fact | None) -> int | None:
    """The number of spatial dims: from the input, the kernel_shape or the weight."""
    if x.rank is not None:
        return x.rank - 2
    kernel = site.ints_attr("kernel_shape")
    if kernel is not None:
        return len(kernel)
    if w is not None and w.rank is not None:
        return w.rank - 2
    return None


def _window_sizes(site: Site, x: Fact, kernel: Sequence[Dim], n: int,
                  ceil: bool = False) -> list[Dim]:  # fmt: skip
    """The output's spatial dims of a sliding window over ``x``."""
    sizes = list(x.shape[2:]) if x.shape is not None and len(x.shape) == n + 2 else [None] * n
    strides = site.ints_attr("strides") or [1] * n
    dilations = site.ints_attr("dilations") or [1] * n
    pads = site.ints_attr("pads") or [0] * (2 * n)
    auto_pad = site.attr("auto_pad", "NOTSET") or "NOTSET"
    if len(strides) != n or len(dilations) != n or len(pads) != 2 * n or len(kernel) != n:
        return [None] * n
    out: list[Dim] = []
    for i, (size, k, s, d) in enumerate(zip(sizes, kernel, strides, dilations)):
        if not isinstance(size, int) or s <= 0:
            out.append(None)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-size // s))
        elif not isinstance(k, int):
            out.append(None)
        else:
            begin, end = (0, 0) if auto_pad == "VALID" else (pads[i], pads[n + i])
            span = size + begin + end - d * (k - 1) - 1
            if ceil or span < 0:
                out.append(None)  # ceil mode's last-window rule differs between runtimes
            else:
                out.append(span // s + 1)
    return out


@rule("Conv", "ConvInteger", "QLinearConv")
def conv(site: Site) -> Fact:
    """``[N, C_out, *spatial]``: the rank of the input, or of the weight."""
    x = site.input(0)
    w = site.input(3 if site.node.op_type == "QLinearConv" else 1)
    elem = x.elem_type
    if site.node.op_type == "ConvInteger":
        elem = _INT32
    elif site.node.op_type == "QLinearConv":
        elem = site.input(7).elem_type
    n = _spatial_rank(site, x, w)
    if n is None or n < 0:
        return Fact(elem)
    kernel = site.ints_attr("kernel_shape") or (
        list(w.shape[2:]) if w.shape is not None and len(w.shape) == n + 2 else [None] * n)
    batch = x.shape[0] if x.shape is not None and len(x.shape) == n + 2 else None
    channels = w.shape[0] if w.shape is not None and len(w.shape) == n + 2 else None
    return Fact(elem, (batch, channels, *_window_sizes(site, x, kernel, n)))


@rule("ConvTranspose")
def conv_transpose(site: Site) -> Fact:
    x, w = site.input(0), site.input(1)
    n = _spatial_rank(site, x, w)
    if n is None or n < 0:
        return Fact(x.elem_type)
    batch = x.shape[0] if x.shape is not None and len(x.shape) == n + 2 else None
    group = int(site.attr("group", 1))
    channels = None
    if w.shape is not None and len(w.shape) == n + 2 and isinstance(w.shape[1], int):
        channels = w.shape[1] * group
    spatial: list[Dim] = [None] * n
    output_shape = site.ints_attr("output_shape")
    if output_shape is not None and len(output_shape) >= n:
        spatial = list(output_shape[-n:])
    elif x.shape is not None and len(x.shape) == n + 2:
        kernel = site.ints_attr("kernel_shape") or (
            list(w.shape[2:]) if w.shape is not None and len(w.shape) == n + 2 else None)
        strides = site.ints_attr("strides") or [1] * n
        dilations = site.ints_attr("dilations") or [1] * n
        extra = site.ints_attr("output_padding") or [0] * n
        pads = site.ints_attr("pads") or [0] * (2 * n)
        auto_pad = site.attr("auto_pad", "NOTSET") or "NOTSET"
        for i, size in enumerate(x.shape[2:]):
            if not isinstance(size, int) or kernel is None or not isinstance(kernel[i], int):
                continue
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                spatial[i] = size * strides[i]
                continue
            begin, end = (0, 0) if auto_pad == "VALID" else (pads[i], pads[n + i])
            spatial[i] = (strides[i] * (size - 1) + extra[i] + (kernel[i] - 1) * dilations[i]
                          + 1 - begin - end)  # fmt: skip
    return Fact(x.elem_type, (batch, channels, *spatial))


@rule("MaxPool", "AveragePool", "LpPool")
def pool(site: Site) -> list[Fact]:
    x = site.input(0)
    kernel = site.ints_attr("kernel_shape")
    if kernel is None:
        return [x.with_shape(None), Fact(INT64)]
    n = len(kernel)
    lead = tuple(x.shape[:2]) if x.shape is not None and len(x.shape) == n + 2 else (None, None)
    ceil = bool(site.attr("ceil_mode", 0))
    dims = (*lead, *_window_sizes(site, x, kernel, n, ceil))
    return [x.with_shape(dims), Fact(INT64, dims)]


@rule("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(site: Site) -> Fact:
    x = site.input(0)
    if x.shape is None or len(x.shape) < 2:
        return x.with_shape(None)
    return x.with_shape((*x.shape[:2], *[1] * (len(x.shape) - 2)))


# ------------------------------------------------------------------------ normalizations
@rule("BatchNormalization")
def batch_norm(site: Site) -> list[Fact]:
    """Y like X; the statistics outputs (training) like the running mean."""
    x, mean = site.input(0), site.input(3)
    return [x.with_shape(x.shape), *[mean.with_shape(mean.shape)] * (site.num_outputs - 1)]


@rule("LayerNormalization")
def layer_norm(site: Site) -> list[Fact]:
    """Y like X; Mean and InvStdDev keep the dims before ``axis`` and are 1 after."""
    x = site.input(0)
    stash = int(site.attr("stash_type", 1))
    if x.shape is None:
        return [x.with_shape(None), Fact(stash), Fact(stash)]
    axis = axis_of(int(site.attr("axis", -1)), len(x.shape))
    if axis is None:
        return [x.with_shape(x.shape), Fact(stash), Fact(stash)]
    stats = Fact(stash, (*x.shape[:axis], *[1] * (len(x.shape) - axis)))
    return [x.with_shape(x.shape), stats, stats]


# ------------------------------------------------------------------------ recurrent
@rule("LSTM", "GRU", "RNN")
def recurrent(site: Site) -> list[Fact]:
    """Y ``[seq, directions, batch, hidden]`` (``layout=1``: ``[batch, seq, directions,
    hidden]``); Y_h and Y_c ``[directions, batch, hidden]`` (``[batch, directions,
    hidden]``)."""
    x, r = site.input(0), site.input(2)
    directions = 2 if site.attr("direction", "forward") == "bidirectional" else 1
    hidden = site.attr("hidden_size")
    if hidden is None and r.shape is not None and len(r.shape) == 3:
        hidden = r.shape[-1]
    layout = int(site.attr("layout", 0))
    seq = batch = None
    if x.shape is not None and len(x.shape) == 3:
        seq, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    if layout:
        y, state = (batch, seq, directions, hidden), (batch, directions, hidden)
    else:
        y, state = (seq, directions, batch, hidden), (directions, batch, hidden)
    return [Fact(x.elem_type, y), Fact(x.elem_type, state), Fact(x.elem_type, state)]


# ------------------------------------------------------------------------ control flow
@rule("If")
def if_(site: Site) -> list[Fact]:
    """Each output is what both branches agree on."""
    then = site.body("then_branch", [])
    otherwise = site.body("else_branch", [])
    if len(then) != len(otherwise):
        return []
    return [join(a, b) for a, b in zip(then, otherwise)]


def _carried(site: Site, fixed: list[Fact], per_step: list[Fact], states: list[Fact],
             offset: int) -> tuple[list[Fact], list[Fact]]:  # fmt: skip
    """Infers a loop body until its carried values' facts hold at every step.

    ``fixed`` are the facts of the body inputs before the carried ones (a Loop's counter
    and condition), ``per_step`` those after them (a Scan's slices); the body's carried
    outputs start at output ``offset``. Gives the carried values' facts and the body's
    outputs. A fact that a step does not keep widens to what both tell; the third try
    gives up on the shapes (a body that changes ranks)."""
    facts = list(states)
    for attempt in range(3):
        outputs = site.body("body", [*fixed, *facts, *per_step])
        stepped = outputs[offset : offset + len(facts)]
        if len(stepped) != len(facts):
            return [Fact(f.elem_type) for f in facts], outputs
        if all(fits(s, f) for s, f in zip(stepped, facts)):
            return facts, outputs
        if attempt == 0:
            facts = [join(f, s) for f, s in zip(facts, stepped)]
        else:
            facts = [Fact(f.elem_type if f.elem_type == s.elem_type else 0)
                     for f, s in zip(facts, stepped)]  # fmt: skip
    return facts, outputs


@rule("Loop")
def loop(site: Site) -> list[Fact]:
    """Carried values keep what every step keeps; scan outputs gain a leading dim (the
    trip count when it is known and no condition can stop the loop early)."""
    n = site.num_inputs - 2
    states = [site.input(2 + i) for i in range(n)]
    counter, condition = Fact(INT64, ()), Fact(BOOL, ())
    facts, outputs = _carried(site, [counter, condition], [], states, 1)
    trips = site.input(0).ints() if site.present(0) and not site.present(1) else None
    steps: Dim = trips[0] if trips is not None and len(trips) == 1 else None
    scans = [o.with_shape(None if o.shape is None else (steps, *o.shape))
             for o in outputs[1 + n :]]  # fmt: skip
    return [*_finals(facts, outputs[1 : 1 + n], steps), *scans]


def _finals(facts: list[Fact], stepped: list[Fact], steps: Dim) -> list[Fact]:
    """The carried values after the loop: a step's output when at least one step surely
    runs, else what holds from the start on."""
    if isinstance(steps, int) and steps > 0 and len(stepped) == len(facts):
        return [Fact(s.elem_type or f.elem_type, s.shape) for f, s in zip(facts, stepped)]
    return [Fact(f.elem_type, f.shape) for f in facts]


@rule("Scan")
def scan(site: Site) -> list[Fact]:
    """Opset 9 on: scanned inputs lose their scan axis in the body; scan outputs gain one
    (of the sequence's length) at their output axis."""
    if site.opset < 9:
        return []
    m = int(site.attr("num_scan_inputs", 0))
    n = site.num_inputs - m
    if m <= 0 or n < 0:
        return []
    states = [site.input(i) for i in range(n)]
    in_axes = site.ints_attr("scan_input_axes") or [0] * m
    slices, length = [], None
    for i, axis in enumerate(in_axes):
        x = site.input(n + i)
        at = axis_of(axis, x.rank) if x.rank is not None else None
        if at is None:
            slices.append(Fact(x.elem_type))
            continue
        slices.append(x.with_shape(x.shape[:at] + x.shape[at + 1 :]))  # type: ignore[index]
        if i == 0:
            length = x.shape[at]  # type: ignore[index]
    facts, outputs = _carried(site, [], slices, states, 0)
    out_axes = site.ints_attr("scan_output_axes") or [0] * (len(outputs) - n)
    scans = []
    for o, axis in zip(outputs[n:], out_axes):
        at = axis_of(axis, o.rank + 1) if o.shape is not None else None
        if at is None:
            scans.append(Fact(o.elem_type))
        else:
            scans.append(o.with_shape((*o.shape[:at], length, *o.shape[at:])))  # type: ignore[index]
    return [*_finals(facts, outputs[:n], length), *scans]

