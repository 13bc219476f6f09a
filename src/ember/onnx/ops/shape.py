"""Shape and layout ops: Reshape, Flatten, Transpose, Squeeze/Unsqueeze, Concat, Gather, Shape,
Constant.

Shape-like inputs known at import time (constants, or folded shape arithmetic) become
Python literals in the generated code; those only known at run time (a dynamic batch
dim) go through the helpers of :mod:`ember.onnx.runtime`.
"""

from __future__ import annotations

import math

import numpy as np

from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.registry import converter

# Constant indices up to this many elements are written inline; larger ones become fields.
_INLINE = 16


def _resolve(dims: list[int], current: tuple[int, ...], allowzero: bool) -> list[int] | None:
    """The reshape target with 0 and -1 resolved against a static input shape."""
    out = [current[i] if d == 0 and not allowzero and i < len(current) else d
           for i, d in enumerate(dims)]  # fmt: skip
    if out.count(-1) > 1:
        return None
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or math.prod(current) % known:
            return None
        out[out.index(-1)] = math.prod(current) // known
    return out if math.prod(out) == math.prod(current) else None


def _reshape(node: NodeContext, x: Value, target: Value | list[int], allowzero: bool) -> str:
    y = node.outputs[0]
    dims = target if isinstance(target, list) else (target.ints() if target.is_const else None)
    if dims is None:
        return f"{y} = rt.reshape({x.expr}, {target.expr}, allowzero={allowzero})"
    static = x.static_shape
    resolved = _resolve(dims, static, allowzero) if static is not None else None
    if resolved is not None:
        return f"{y} = {x.expr}.reshape({resolved})"
    if 0 not in dims:
        return f"{y} = {x.expr}.reshape({dims})"
    return f"{y} = rt.reshape({x.expr}, {dims}, allowzero={allowzero})"


@converter("Reshape", since=1, attrs=("shape", "consumed_inputs"))
def reshape_v1(node: NodeContext) -> str:
    return _reshape(node, node.input(0), [int(d) for d in node.attr("shape")], False)


@converter("Reshape", since=5, attrs=())
def reshape_v5(node: NodeContext) -> str:
    return _reshape(node, node.input(0), node.input(1), False)


@converter("Reshape", since=14, attrs=("allowzero",))
def reshape_v14(node: NodeContext) -> str:
    return _reshape(node, node.input(0), node.input(1), bool(node.attr("allowzero", 0)))


@converter("Flatten", since=1, attrs=("axis",))
def flatten(node: NodeContext) -> str:
    x, axis = node.input(0), int(node.attr("axis", 1))
    static = x.static_shape
    if static is not None:
        a = axis + len(static) if axis < 0 else axis
        dims = [math.prod(static[:a]), math.prod(static[a:])]
        return f"{node.outputs[0]} = {x.expr}.reshape({dims})"
    return f"{node.outputs[0]} = rt.flatten({x.expr}, {axis})"


@converter("Transpose", since=1, attrs=("perm",))
def transpose(node: NodeContext) -> str:
    x = node.input(0)
    perm = node.attr("perm", None)
    if perm is None and x.rank is not None:
        perm = list(range(x.rank))[::-1]
    if perm is None:
        return f"{node.outputs[0]} = rt.transpose({x.expr})"
    return f"{node.outputs[0]} = {x.expr}.permute({[int(p) for p in perm]})"


@converter("Shape", since=1, attrs=("start", "end"))
def shape(node: NodeContext) -> str | None:
    """Known dims fold to a constant, so shape arithmetic on them folds too."""
    x = node.input(0)
    start, end = int(node.attr("start", 0)), node.attr("end", None)
    if x.shape is not None:
        rank = len(x.shape)
        s = min(max(start + rank if start < 0 else start, 0), rank)
        e = rank if end is None else min(max(int(end) + rank if end < 0 else int(end), 0), rank)
        dims = x.shape[s:e]
        if all(isinstance(d, int) for d in dims):
            node.set_constant(0, np.asarray(dims, dtype=np.int64))
            return None
    args = "" if start == 0 and end is None else f", {start}" + ("" if end is None else f", {end}")
    return f"{node.outputs[0]} = rt.shape({x.expr}{args})"


@converter("Constant", since=1, attrs=("value", "value_float", "value_floats", "value_int",
                                       "value_ints", "sparse_value", "value_string",
                                       "value_strings"),
           limits="sparse_value and string constants are not supported")  # fmt: skip
def constant(node: NodeContext) -> None:
    attrs = node.attrs
    if "value" in attrs:
        node.set_constant(0, attrs["value"])
    elif "value_float" in attrs:
        node.set_constant(0, np.float32(attrs["value_float"]))
    elif "value_floats" in attrs:
        node.set_constant(0, np.asarray(attrs["value_floats"], dtype=np.float32))
    elif "value_int" in attrs:
        node.set_constant(0, np.int64(attrs["value_int"]))
    elif "value_ints" in attrs:
        node.set_constant(0, np.asarray(attrs["value_ints"], dtype=np.int64))
    elif "sparse_value" in attrs:
        node.unsupported("sparse constants (sparse_value) are not supported; a dense 'value' "
                         "is needed")
    else:
        node.unsupported("string constants have no ember tensor dtype")


def _axes(node: NodeContext, since_input: int) -> list[int] | str | None:
    """The ``axes`` of (Un)Squeeze: an attribute before opset ``since_input``, then an
    input. A list when known at import time, an expression when not, None when absent."""
    if node.opset < since_input:
        axes = node.attr("axes", None)
        return None if axes is None else [int(a) for a in axes]
    axes_input = node.input(1)
    if not axes_input.present:
        return None
    return axes_input.ints() if axes_input.is_const else axes_input.expr


@converter("Unsqueeze", since=1, attrs=("axes",))
@converter("Unsqueeze", since=13, attrs=())
def unsqueeze(node: NodeContext) -> str:
    x, axes = node.input(0), _axes(node, 13)
    if axes is None:
        node.unsupported("Unsqueeze needs axes")
    if isinstance(axes, str):
        return f"{node.outputs[0]} = rt.unsqueeze({x.expr}, {axes})"
    return f"{node.outputs[0]} = {x.expr}.unsqueeze_dims({axes})"


@converter("Squeeze", since=1, attrs=("axes",))
@converter("Squeeze", since=13, attrs=())
def squeeze(node: NodeContext) -> str:
    x, axes = node.input(0), _axes(node, 13)
    y = node.outputs[0]
    if isinstance(axes, list):
        return f"{y} = {x.expr}.squeeze_dims({axes})"
    if isinstance(axes, str):
        return f"{y} = rt.squeeze({x.expr}, {axes})"
    static = x.static_shape
    if static is not None:
        return f"{y} = {x.expr}.squeeze_dims({[i for i, d in enumerate(static) if d == 1]})"
    return f"{y} = rt.squeeze({x.expr})"


@converter("Concat", since=1, attrs=("axis",))
def concat(node: NodeContext) -> str:
    parts = [v for v in node.inputs if v.present]
    axis = int(node.attr("axis", 1))
    listed = ", ".join(v.expr for v in parts)
    shapes = [v.shape for v in parts]
    # Tensor.cat wants non-empty parts of one rank: known shapes without zeros say so.
    if all(s is not None and 0 not in s for s in shapes):
        return f"{node.outputs[0]} = Tensor.cat([{listed}], {axis})"
    return f"{node.outputs[0]} = rt.concat([{listed}], {axis})"


@converter("Gather", since=1, attrs=("axis",))
def gather(node: NodeContext) -> str:
    data, indices = node.input(0), node.input(1)
    axis = int(node.attr("axis", 0))
    index = indices.const
    if index is not None and index.size <= _INLINE:
        where = literal(index.astype(np.int64))
    else:
        where = indices.expr
    return f"{node.outputs[0]} = rt.gather({data.expr}, {where}, {axis})"
