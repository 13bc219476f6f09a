"""Shape arithmetic on the host: the ONNX ops of exported models' shape computations, run
on small NumPy arrays.

A model exported with a dynamic dim (a batch) computes its reshape targets when it runs:
``Shape``, ``Gather``, ``Unsqueeze``, ``Concat`` and a little integer arithmetic, a few
dozen nodes per attention layer, each on an array of a few elements. As tensor ops each
costs a dispatch through the Tensor API and the device (20 to 60 us on a Fusion device,
more than the layer's element-wise work). The translator (:mod:`ember.onnx.translate`)
runs such nodes here instead, as onnxruntime runs them on the CPU: a node whose inputs
are all host values or small constants (or a ``Shape`` of any tensor) becomes one
``host.run(...)`` line, and a host value becomes a tensor on the model's device
(``rt.to_device``) only where a tensor op reads it. A reshape, slice or expand reads its
ints straight from it.

Adding an op is registering its rule (``_rule``, private: generated code may call this
module's public functions): a function of the node's inputs (NumPy arrays;
``Shape`` and ``Size`` also read a tensor's shape), its attributes and the opset. Rules
keep ember's semantics, so a model gives the same values either way: element-wise ops and
casts run the op table's primitives of the NdArray backend (integer division truncates
toward zero, a cast of floats to ints truncates), operands of one op have one kind (a
:class:`~ember.backend.errors.KindError` otherwise), and errors are the typed errors the
tensor ops raise. Every host value holds at most :data:`MAX_ELEMENTS`
elements: the translator only sends nodes whose outputs are known to be that small, and
:func:`run` checks it again.

Example:
    >>> import numpy as np
    >>> from ember.onnx import host
    >>> dims = np.array([128, 8, 256])
    >>> batch = host.run("Gather", 13, [dims, np.array(1)], {"axis": 0})
    >>> host.run("Mul", 14, [batch, np.array(4)], {}).tolist()
    32
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.backend.errors import (
    ArgumentError,
    DTypeError,
    EmberIndexError,
    KindError,
    ShapeError,
    fmt_shape,
)
from ember.backend.ops import OPS, OpDef
from ember.backend.rules import broadcast_shapes, check_dim
from ember.onnx.infer_rules import sliced
from ember.onnx.ir import ember_dtype
from ember.onnx.runtime import ints, shape_span
from ember.tensor.data import dtype_of_numpy, numpy_dtype
from ember.tensor.dtype import Kind, promote

MAX_ELEMENTS = 64
"""The most elements a host value holds (shape arithmetic: a rank's worth of dims)."""

DTYPES = frozenset(np.dtype(t) for t in ("bool", "int8", "int16", "int32", "int64", "uint8",
                                         "float32", "float64"))  # fmt: skip
"""The dtypes of host values (and of the constants host nodes read)."""

Rule = Callable[[list[Any], dict[str, Any], int], Any]
RULES: dict[str, Rule] = {}

# The attributes each op may carry here, as a number or a list of numbers. A node with any
# other (a legacy Add's ``broadcast`` and ``axis``, which broadcast otherwise) or with one
# of the wrong form stays tensor ops, whose converter reports what is wrong at import.
_ATTRS: dict[str, dict[str, type]] = {
    "Shape": {"start": int, "end": int}, "Gather": {"axis": int}, "Concat": {"axis": int},
    "Unsqueeze": {"axes": list}, "Squeeze": {"axes": list}, "Cast": {"to": int, "saturate": int},
    "Slice": {"starts": list, "ends": list, "axes": list},
}  # fmt: skip


def _rule(*op_types: str) -> Callable[[Rule], Rule]:
    """Registers a host rule for ``op_types``."""

    def register(fn: Rule) -> Rule:
        for op in op_types:
            RULES[op] = fn
        return fn

    return register


def runs_on_host(op_type: str, attrs: dict[str, Any], input_dtypes: Sequence[np.dtype | None]) -> bool:
    """Whether a node of ``op_type`` with ``attrs`` may run here, its inputs' dtypes
    (None where only a tensor's shape is read) as given: ops with a rule, casts to a dtype
    of :data:`DTYPES`, and only the attributes the rule reads, each an int or a list of
    ints as ONNX defines it."""
    if op_type not in RULES:
        return False
    if any(d is not None and d not in DTYPES for d in input_dtypes):
        return False
    allowed = _ATTRS.get(op_type, {})
    for name, value in attrs.items():
        form = allowed.get(name)
        if form is list and isinstance(value, list | tuple):
            if not all(isinstance(v, int | np.integer) for v in value):
                return False
        elif form is not int or not isinstance(value, int | np.integer):
            return False
    if op_type == "Cast":
        target = ember_dtype(int(attrs.get("to", 0)))
        return target is not None and numpy_dtype(target) in DTYPES
    return True


def size_bound(op: str, sizes: Sequence[int]) -> int:
    """The most elements ``op``'s output can hold, given the most each input holds (0 for
    an absent one; a ``Shape``'s input: its rank): how the translator keeps host values
    small when shape inference left an output's shape unknown."""
    if op == "Size":
        return 1
    if op == "Concat":
        return sum(sizes)
    if op in ("Add", "Sub", "Mul", "Div", "Equal", "Where", "Gather"):
        return math.prod(s for s in sizes if s)
    return sizes[0]  # Shape (the rank), Slice, (Un)Squeeze, Cast and the unary ops


MEMO_ENTRIES = 4096
"""Host results kept for reuse (:func:`run`); more, and they are all forgotten."""

_memo: dict[tuple, np.ndarray] = {}


def run(op: str, opset: int, inputs: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    """The output of ONNX ``op`` (``opset``) on host ``inputs`` (None for an absent one).

    Rules are pure functions of their inputs' values (a ``Shape``'s or ``Size``'s: of its
    tensor's dims), attributes and opset, and a model computes the same few dozen shape
    values on every call of a size: each result is kept (read-only) and handed out again
    for the same op and arguments (a call of a rule costs several microseconds, its key
    about one).
    """
    key = _memo_key(op, opset, inputs, attrs)
    if key is not None:
        found = _memo.get(key)
        if found is not None:
            return found
    fn = RULES.get(op)
    if fn is None:
        raise ArgumentError(f"no host rule for the ONNX op {op!r}")
    out = np.asarray(fn(inputs, attrs, opset))
    if out.size > MAX_ELEMENTS:
        raise ShapeError(f"{op}: a shape computation made {out.size} elements, more than the "
                         f"{MAX_ELEMENTS} a host value holds")  # fmt: skip
    if key is None:
        return out
    out = out.copy()  # its own memory: a rule may return a view of an input
    out.flags.writeable = False
    if len(_memo) >= MEMO_ENTRIES:
        _memo.clear()
    _memo[key] = out
    return out


def _memo_key(op: str, opset: int, inputs: list[Any], attrs: dict[str, Any]) -> tuple | None:
    """What a host result depends on, or None where an argument is not plain data."""
    parts: list[Any] = [op, opset]
    for value in inputs:
        if value is None:
            parts.append(None)
        elif type(value) is np.ndarray or isinstance(value, np.generic):
            parts.append((value.dtype.str, value.shape, value.tobytes()))
        elif op in ("Shape", "Size") and type(getattr(value, "shape", None)) in (tuple, list):
            parts.append(("dims", tuple(value.shape)))
        else:
            return None
    for name, value in attrs.items():
        if type(value) is list:
            value = tuple(value)
        if type(value) not in (int, tuple):
            return None
        parts.append((name, value))
    return tuple(parts)


def array(value: Any, dtype: str) -> np.ndarray:
    """A constant input of a host node: ``value`` (a number or nested lists) as ``dtype``."""
    return np.asarray(value, dtype=np.dtype(dtype))


# ------------------------------------------------------------------------------ helpers
def _name(kind: Kind) -> str:
    return kind.value.lower()


def _same_kind(op: str, a: np.ndarray, b: np.ndarray) -> None:
    ka, kb = dtype_of_numpy(a.dtype).kind, dtype_of_numpy(b.dtype).kind
    if ka is not kb:
        raise KindError(f"{op}: operands have different kinds, {_name(ka)} and {_name(kb)}")


def _broadcast(op: str, *xs: np.ndarray) -> None:
    shape = xs[0].shape
    for x in xs[1:]:
        shape = broadcast_shapes(op, shape, x.shape)


def _axes(inputs: list[Any], attrs: dict[str, Any], opset: int, since_input: int) -> list[int] | None:
    """(Un)Squeeze's axes: an attribute before opset ``since_input``, then an input."""
    if opset < since_input:
        axes = attrs.get("axes")
    else:
        axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    return None if axes is None else ints(np.asarray(axes))


# ------------------------------------------------------------------------------ shapes
@_rule("Shape")
def _shape(inputs, attrs, opset):
    dims = tuple(inputs[0].shape)
    end = attrs.get("end")
    span = shape_span(len(dims), int(attrs.get("start", 0)), None if end is None else int(end))
    return np.asarray(dims[span], dtype=np.int64)


@_rule("Size")
def _size(inputs, attrs, opset):
    return np.int64(math.prod(inputs[0].shape))


@_rule("Gather")
def _gather(inputs, attrs, opset):
    x, indices = inputs[0], np.asarray(inputs[1])
    if indices.dtype.kind not in "iu":
        raise DTypeError(f"Gather: indices must be integers, got {indices.dtype}")
    d = check_dim("Gather", int(attrs.get("axis", 0)), x.ndim)
    size = x.shape[d]
    wrapped = np.where(indices < 0, indices + size, indices)
    bad = (wrapped < 0) | (wrapped >= size)
    if bad.any():
        raise EmberIndexError(f"Gather: index {int(indices[bad].reshape(-1)[0])} is out of range "
                              f"for dim {d} of size {size}")  # fmt: skip
    return np.take(x, wrapped, axis=d)


@_rule("Unsqueeze")
def _unsqueeze(inputs, attrs, opset):
    x, axes = inputs[0], _axes(inputs, attrs, opset, 13)
    if axes is None:
        raise ArgumentError("Unsqueeze needs axes")
    rank = x.ndim + len(axes)
    shape = list(x.shape)
    for d in sorted(check_dim("unsqueeze_dims", a, rank) for a in axes):
        shape.insert(d, 1)
    return x.reshape(shape)


@_rule("Squeeze")
def _squeeze(inputs, attrs, opset):
    x, axes = inputs[0], _axes(inputs, attrs, opset, 13)
    if axes is None:
        return x.reshape([d for d in x.shape if d != 1])
    drop = {check_dim("squeeze_dims", a, x.ndim) for a in axes}
    for d in drop:
        if x.shape[d] != 1:
            raise ShapeError(f"squeeze_dims: dim {d} of shape {fmt_shape(x.shape)} has size "
                             f"{x.shape[d]}, not 1")  # fmt: skip
    return x.reshape([s for i, s in enumerate(x.shape) if i not in drop])


@_rule("Concat")
def _concat(inputs, attrs, opset):
    parts = [np.asarray(p) for p in inputs if p is not None]
    for p in parts[1:]:
        _same_kind("Concat", parts[0], p)
        if p.ndim != parts[0].ndim:
            raise ShapeError(f"Concat: parts have ranks {parts[0].ndim} and {p.ndim}")
    d = check_dim("Concat", int(attrs.get("axis", 1 if opset < 4 else 0)), parts[0].ndim)
    return np.concatenate(parts, axis=d)


@_rule("Slice")
def _slice(inputs, attrs, opset):
    x = inputs[0]
    if opset < 10:
        starts, ends = attrs["starts"], attrs["ends"]
        axes, steps = attrs.get("axes"), None
    else:
        starts, ends = inputs[1], inputs[2]
        axes = inputs[3] if len(inputs) > 3 else None
        steps = inputs[4] if len(inputs) > 4 else None
    starts, ends = ints(np.asarray(starts)), ints(np.asarray(ends))
    axes = list(range(len(starts))) if axes is None else ints(np.asarray(axes))
    steps = [1] * len(starts) if steps is None else ints(np.asarray(steps))
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(f"Slice: {len(starts)} starts, {len(ends)} ends, {len(axes)} axes and "
                         f"{len(steps)} steps")  # fmt: skip
    for start, end, axis, step in zip(starts, ends, axes, steps):
        d = check_dim("Slice", axis, x.ndim)
        if step == 0:
            raise ArgumentError("Slice: a step of 0")
        x = np.take(x, np.asarray(sliced(x.shape[d], start, end, step), dtype=np.intp), axis=d)
    return x


# ------------------------------------------------------------------------------ values
# Element-wise ops and casts run the op table's primitives of ember's NdArray backend
# (NumPy arrays are its values), so they compute exactly what the tensor ops compute.
@functools.cache
def _ndarray() -> Any:
    import ember

    return ember.device("ndarray").backend


def _primitive(op: OpDef, onnx_op: str, arrays: list[np.ndarray], *attrs: Any) -> np.ndarray:
    """``op`` of the op table on ``arrays`` (one kind, broadcastable, brought to one dtype
    as the Tensor API brings them)."""
    for a in arrays[1:]:
        _same_kind(onnx_op, arrays[0], a)
    dtypes = [dtype_of_numpy(a.dtype) for a in arrays]
    kind = dtypes[0].kind
    if kind not in op.kinds:
        have = ", ".join(sorted(_name(k) for k in op.kinds))
        raise KindError(f"{onnx_op} is not defined for {_name(kind)} tensors (only {have})")
    _broadcast(onnx_op, *arrays)
    if len(set(dtypes)) > 1:
        target = numpy_dtype(functools.reduce(promote, dtypes))
        arrays = [a.astype(target, copy=False) for a in arrays]
    with np.errstate(all="ignore"):  # int wrap-around, a float divided by zero, sqrt(-1)
        return getattr(_ndarray(), op.primitive(kind))(*arrays, *attrs)


def _through_table(onnx_op: str, op: OpDef) -> None:
    def run_op(inputs, attrs, opset):
        return _primitive(op, onnx_op, [np.asarray(v) for v in inputs[: len(op.inputs)]])

    _rule(onnx_op)(run_op)


for _onnx_op, _ember_op in (("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "div"),
                            ("Neg", "neg"), ("Abs", "abs"), ("Sqrt", "sqrt"),
                            ("Equal", "equal")):  # fmt: skip
    _through_table(_onnx_op, OPS[_ember_op])


@_rule("Identity")
def _identity(inputs, attrs, opset):
    return inputs[0]


@_rule("Cast")
def _cast(inputs, attrs, opset):
    dtype = ember_dtype(int(attrs["to"]))
    if dtype is None:
        raise DTypeError(f"Cast: ONNX type {attrs['to']} has no ember dtype")
    return _primitive(OPS["cast"], "Cast", [np.asarray(inputs[0])], dtype)


@_rule("Where")
def _where(inputs, attrs, opset):
    mask, x, y = (np.asarray(v) for v in inputs[:3])
    if mask.dtype.kind != "b":
        raise KindError(f"Where: the condition must be a bool tensor, got {mask.dtype}")
    _same_kind("Where", x, y)
    _broadcast("Where", mask, x, y)
    return np.where(mask, x, y)
