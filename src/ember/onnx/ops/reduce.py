"""Reductions: ReduceSum/Mean/Max/Min/Prod, the norms and log-sums, ArgMax/ArgMin, and the
cumulative CumSum/CumProd.

ember's ``*_dim`` reductions keep the reduced dim with size 1, which is ONNX's
``keepdims=1``; several axes are reduced one after the other and, without ``keepdims``,
squeezed at the end. A reduction over a dim of size 0 (the empty set) has a value known
at import time (0 for sums, 1 for products, -inf for a maximum, ...) and folds to a
constant when the input's shape is static.
"""

from __future__ import annotations

import ast
import math
from typing import Any, NamedTuple

import numpy as np

from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.registry import converter
from ember.tensor import DType, Kind
from ember.tensor.data import numpy_dtype


class _Reduction(NamedTuple):
    """How one ONNX reduction is written with ember ops.

    ``pre`` maps the input before the reduction and ``post`` the reduced result (format
    strings of ``{x}``); ``method`` is the ember reduction along one dim and ``whole``
    the one over every element; ``empty`` the value of a reduction over no element.
    """

    method: str
    whole: str
    empty: float
    pre: str = "{x}"
    post: str = "{x}"


_REDUCTIONS = {
    "ReduceSum": _Reduction("sum_dim", "sum", 0.0),
    "ReduceMean": _Reduction("mean_dim", "mean", math.nan),
    "ReduceMax": _Reduction("max_dim", "max", -math.inf),
    "ReduceMin": _Reduction("min_dim", "min", math.inf),
    "ReduceProd": _Reduction("prod_dim", "prod", 1.0),
    "ReduceL1": _Reduction("sum_dim", "sum", 0.0, pre="{x}.abs()"),
    "ReduceL2": _Reduction("sum_dim", "sum", 0.0, pre="{x}.pow(2)", post="{x}.sqrt()"),
    "ReduceLogSum": _Reduction("sum_dim", "sum", -math.inf, post="{x}.log()"),
    "ReduceSumSquare": _Reduction("sum_dim", "sum", 0.0, pre="{x}.pow(2)"),
    "ReduceLogSumExp": _Reduction("sum_dim", "sum", -math.inf),
}

# Bool tensors (ReduceMax/Min from opset 20): the maximum is "any", the minimum "all".
_BOOL_REDUCTIONS = {
    "ReduceMax": _Reduction("any_dim", "any", 0.0),
    "ReduceMin": _Reduction("all_dim", "all", 1.0),
}

# The opset from which ``axes`` is an input rather than an attribute.
_AXES_INPUT = {op: 18 for op in _REDUCTIONS} | {"ReduceSum": 13}


def _axes(node: NodeContext) -> list[int] | Value | None:
    """The reduced axes as written (possibly negative), ``[]`` for none at all (a no-op
    with ``noop_with_empty_axes``), None for every axis, or the ``axes`` input when it is
    only known at run time."""
    if node.opset < _AXES_INPUT[node.op_type]:
        axes = node.attr("axes", None)
        return [int(a) for a in axes] if axes else None
    given = node.input(1)
    if given.present and not given.is_const:
        return given
    axes = given.ints() if given.present else []
    if axes:
        return axes
    return [] if node.attr("noop_with_empty_axes", 0) else None


def _normalized(node: NodeContext, axes: list[int], rank: int | None) -> list[int]:
    """The axes sorted, non-negative where the rank is known (else all of one sign: see
    :func:`_mixed`)."""
    if rank is None:
        return sorted(set(axes))
    bad = [a for a in axes if not -rank <= a < rank]
    if bad:
        node.unsupported(f"axes {bad} are out of range for an input of rank {rank}")
    return sorted({a + rank if a < 0 else a for a in axes})


def _empty_value(reduction: _Reduction, dtype: DType | None) -> Any:
    """The value of a reduction over no element, in ``dtype`` (a float when unknown)."""
    if dtype is DType.BOOL:
        return bool(reduction.empty)
    if dtype is not None and dtype.is_int:
        info = np.iinfo(numpy_dtype(dtype))
        return {math.inf: info.max, -math.inf: info.min}.get(reduction.empty, reduction.empty)
    return reduction.empty


def _empty_set(node: NodeContext, x: Value, axes: list[int] | None, keepdims: bool,
               reduction: _Reduction) -> bool:  # fmt: skip
    """Folds the output to a constant when the reduction covers a dim of size 0."""
    static = x.static_shape
    dtype = x.dtype
    if static is None or dtype is None:
        return False
    reduced = range(len(static)) if axes is None else axes
    if not any(static[a] == 0 for a in reduced):
        return False
    shape = [1 if i in reduced else d for i, d in enumerate(static)
             if keepdims or i not in reduced]  # fmt: skip
    value = np.full(shape, _empty_value(reduction, dtype), dtype=numpy_dtype(dtype))
    node.set_constant(0, value)
    return True


def _may_be_empty(x: Value) -> bool:
    """Whether a dim of ``x`` may have size 0 (ember's max/min refuse an empty dim)."""
    shape = x.shape
    return shape is None or any(not isinstance(d, int) or d == 0 for d in shape)


def _along(expr: str, method: str, axes: list[int]) -> str:
    for a in axes:
        expr = f"{expr}.{method}({a})"
    return expr


def _squeezed(expr: str, axes: list[int], keepdims: bool) -> str:
    return expr if keepdims or not axes else f"{expr}.squeeze_dims({axes})"


def _mixed(axes: list[int] | None, rank: int | None) -> bool:
    """Whether axes of both signs (or every axis of a log-sum-exp) need the input's rank,
    which is only known when the model runs."""
    return rank is None and axes is not None and len({a < 0 for a in axes}) > 1


def _runtime_axes(node: NodeContext, x: Value, given: Value | list[int]) -> tuple[str, list[str]]:
    """A local holding the axes (``given`` read at run time, or a list whose signs need the
    input's rank) sorted and non-negative; an empty ``axes`` means every axis unless
    ``noop_with_empty_axes``."""
    name = node.tmp("axes")
    rank = x.rank if x.rank is not None else f"{x.expr}.rank"
    source = f"rt.ints({given.expr})" if isinstance(given, Value) else literal(given)
    line = f"{name} = sorted({{rt.axis(a, {rank}) for a in {source}}})"
    if not node.attr("noop_with_empty_axes", 0):
        line += f" or list(range({rank}))"
    return name, [line]


def _loop(node: NodeContext, out: str, source: str, method: str, axes: str,
          guard: Any = None) -> list[str]:  # fmt: skip
    """Lines reducing ``source`` into ``out`` over the runtime axes list ``axes``.

    With a ``guard`` value, an empty dim gives that value rather than reaching max/min."""
    a = node.tmp("axis")
    step = f"{out}.{method}({a})"
    if guard is not None:
        step = f"{step} if {out}.shape[{a}] else {out}.sum_dim({a}).full_like({literal(guard)})"
    return [f"{out} = {source}", f"for {a} in {axes}:", f"    {out} = {step}"]


def _reduce(node: NodeContext) -> str | list[str] | None:
    x = node.input(0)
    y = node.outputs[0]
    keepdims = bool(node.attr("keepdims", 1))
    reduction = _REDUCTIONS[node.op_type]
    if x.dtype is DType.BOOL and node.op_type in _BOOL_REDUCTIONS:
        reduction = _BOOL_REDUCTIONS[node.op_type]
    rank = x.rank
    axes = _axes(node)
    if isinstance(axes, Value) or _mixed(axes, rank) or (
            rank is None and axes is None and node.op_type == "ReduceLogSumExp"):
        # Axes normalized when the model runs, against the input's rank then.
        return _reduce_runtime(node, x, [] if axes is None else axes, keepdims, reduction)
    if axes is not None:
        axes = _normalized(node, axes, rank)
    if _empty_set(node, x, axes, keepdims, reduction):
        return None
    if node.op_type == "ReduceLogSumExp":
        if axes is None:
            axes = list(range(rank))  # type: ignore[arg-type]  (rank None went to run time)
        return _log_sum_exp(node, x, repr(axes), keepdims, static=True)
    source = reduction.pre.format(x=x.expr)
    if axes is None and (not keepdims or rank is None):
        # Every element: the whole-tensor reduction gives a 0-d tensor.
        reduced = reduction.post.format(x=f"{source}.{reduction.whole}()")
        if keepdims:
            reduced = f"{reduced}.reshape([1] * {x.expr}.rank)"
        return f"{y} = {reduced}"
    if axes is None:
        axes = list(range(rank))
    reduced = reduction.post.format(x=_along(source, reduction.method, axes))
    return f"{y} = {_squeezed(reduced, axes, keepdims)}"


def _reduce_runtime(node: NodeContext, x: Value, given: Value | list[int], keepdims: bool,
                    reduction: _Reduction) -> list[str]:  # fmt: skip
    """Axes known only at run time (``given`` an input, or a list that needs the rank): a
    loop over them."""
    axes, lines = _runtime_axes(node, x, given)
    if node.op_type == "ReduceLogSumExp":
        return lines + _log_sum_exp(node, x, axes, keepdims, static=False)
    y = node.outputs[0]
    guard = None
    if reduction.method in ("max_dim", "min_dim") and _may_be_empty(x):
        guard = _empty_value(reduction, x.dtype)
    lines += _loop(node, y, reduction.pre.format(x=x.expr), reduction.method, axes, guard)
    if reduction.post != "{x}":
        lines.append(f"{y} = {reduction.post.format(x=y)}")
    if not keepdims:
        lines.append(f"{y} = {y}.squeeze_dims({axes})")
    return lines


def _log_sum_exp(node: NodeContext, x: Value, axes: str, keepdims: bool,
                 static: bool) -> list[str]:  # fmt: skip
    """``log(sum(exp(x - m))) + m`` with ``m`` the maximum: no overflow. An infinite
    maximum is replaced by 0 so that infinities give infinities, not NaN.

    ``axes`` is a list literal (``static``) or the name of a runtime list."""
    m, y = node.tmp("peak"), node.outputs[0]
    shifted = f"({x.expr} - {m}).exp()"
    if static:
        dims = ast.literal_eval(axes)  # the list of ints written above
        lines = [f"{m} = {_along(x.expr, 'max_dim', dims)}"]
    else:
        guard = -math.inf if _may_be_empty(x) else None
        lines = _loop(node, m, x.expr, "max_dim", axes, guard)
    lines.append(f"{m} = {m}.mask_fill({m}.is_inf(), 0.0)")
    if static:
        lines.append(f"{y} = {_along(shifted, 'sum_dim', dims)}.log() + {m}")
    else:
        lines += _loop(node, y, shifted, "sum_dim", axes)
        lines.append(f"{y} = {y}.log() + {m}")
    if not keepdims and axes != "[]":
        lines.append(f"{y} = {y}.squeeze_dims({axes})")
    return lines


_ATTRS_BEFORE_INPUT = ("axes", "keepdims")
_ATTRS_WITH_INPUT = ("keepdims", "noop_with_empty_axes")

for _op in _REDUCTIONS:
    converter(_op, since=1, attrs=_ATTRS_BEFORE_INPUT)(_reduce)
    converter(_op, since=_AXES_INPUT[_op], attrs=_ATTRS_WITH_INPUT)(_reduce)


# ---------------------------------------------------------------------------- ArgMax / ArgMin
def _arg_reduce(node: NodeContext) -> str:
    """``select_last_index`` reads the flipped input: its first extreme is the last one."""
    x = node.input(0)
    method = "argmax" if node.op_type == "ArgMax" else "argmin"
    axis = int(node.attr("axis", 0))
    rank = x.rank
    if rank is not None:
        if not -rank <= axis < max(rank, 1):
            node.unsupported(f"axis {axis} is out of range for an input of rank {rank}")
        axis = axis + rank if axis < 0 else axis
    if node.attr("select_last_index", 0):
        static = x.static_shape
        last = static[axis] - 1 if static is not None else f"{x.expr}.shape[{axis}] - 1"
        index = f"({last} - {x.expr}.flip([{axis}]).{method}({axis}))"
    else:
        index = f"{x.expr}.{method}({axis})"
    index = _squeezed(index, [axis], bool(node.attr("keepdims", 1)))
    # ONNX's indices are i64 whatever the backend's default Int dtype is.
    return f'{node.outputs[0]} = {index}.cast("i64")'


for _op in ("ArgMax", "ArgMin"):
    converter(_op, since=1, attrs=("axis", "keepdims"))(_arg_reduce)
    converter(_op, since=12, attrs=("axis", "keepdims", "select_last_index"))(_arg_reduce)


# ---------------------------------------------------------------------------- CumSum / CumProd
def _cumulative(node: NodeContext) -> str | list[str]:
    """``reverse`` reads the axis backwards (flip, scan, flip back); ``exclusive`` shifts
    the scan by one step, starting from the operation's identity (0 or 1)."""
    x, y = node.input(0), node.outputs[0]
    method, identity = ("cumsum", 0) if node.op_type == "CumSum" else ("cumprod", 1)
    given, rank = node.input(1), x.rank
    lines = []
    if given.is_const:
        values = given.ints()
        if len(values) != 1:
            node.unsupported(f"the axis must be a single value, got {values}")
        axis: int | str = values[0]
        if rank is not None:
            if not -rank <= values[0] < rank:
                node.unsupported(f"axis {values[0]} is out of range for an input of rank {rank}")
            axis = values[0] % rank
    else:
        axis = node.tmp("axis")
        lines.append(f"{axis} = rt.axis(rt.ints({given.expr})[0], {x.expr}.rank)")
    reverse = bool(node.attr("reverse", 0))
    source = f"{x.expr}.flip([{axis}])" if reverse else x.expr
    lines.append(f"{y} = {source}.{method}({axis})")
    if node.attr("exclusive", 0):
        static = x.static_shape
        size = static[axis] if static is not None and isinstance(axis, int) \
            else f"{y}.shape[{axis}]"
        start = node.tmp("start")
        value = float(identity) if x.dtype is None or x.dtype.kind is Kind.FLOAT else identity
        lines += [
            f"{start} = {y}.narrow({axis}, 0, 1).full_like({value!r})",
            f"{y} = Tensor.cat([{start}, {y}.narrow({axis}, 0, {size} - 1)], {axis})",
        ]
    if reverse:
        lines.append(f"{y} = {y}.flip([{axis}])")
    return lines


converter("CumSum", since=11, attrs=("exclusive", "reverse"))(_cumulative)
converter("CumProd", since=26, attrs=("exclusive", "reverse"))(_cumulative)
