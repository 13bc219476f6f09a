"""Reductions (whole tensor to a 0-d value, or along one dim kept with size 1), arg-extremes,
any / all, cumulative sums and sorting."""

from __future__ import annotations

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall
from ember.tensor.dtype import Kind

REDUCE = {"sum": "ReduceSum", "prod": "ReduceProd", "mean": "ReduceMean", "max": "ReduceMax",
          "min": "ReduceMin"}  # fmt: skip

# ReduceSum takes its axes as an input from opset 13, the other reductions from opset 18.
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def reduce(e: Emitter, op_type: str, x: str, axes: list[int] | None, keepdims: bool,
           out: str | None = None) -> str:  # fmt: skip
    """A reduction node over ``axes`` (None: every dim), in the opset's spelling of axes."""
    outputs = [out] if out else 1
    if axes is None:
        return e.node(op_type, [x], outputs, keepdims=int(keepdims))
    if e.opset >= _AXES_INPUT_SINCE.get(op_type, 18):
        return e.node(op_type, [x, e.ints(axes)], outputs, keepdims=int(keepdims))
    return e.node(op_type, [x], outputs, axes=axes, keepdims=int(keepdims))


@exporter(*REDUCE)
def reduce_all(e: Emitter, call: OpCall) -> None:
    reduce(e, REDUCE[call.op.name], e.input(call, 0), None, False, e.output(call))


@exporter(*(f"{name}_dim" for name in REDUCE))
def reduce_dim(e: Emitter, call: OpCall) -> None:
    op_type = REDUCE[call.op.name.removesuffix("_dim")]
    reduce(e, op_type, e.input(call, 0), [e.static(call, "dim")], True, e.output(call))


@exporter("argmax", "argmin")
def arg_extreme(e: Emitter, call: OpCall) -> None:
    """The first index of the extreme (``select_last_index=0``), the dim kept."""
    op_type = "ArgMax" if call.op.name == "argmax" else "ArgMin"
    e.node(op_type, [e.input(call, 0)], [e.output(call)], axis=e.static(call, "dim"), keepdims=1)


@exporter("any", "all", "any_dim", "all_dim")
def any_all(e: Emitter, call: OpCall) -> None:
    """Whether any (all) element is true (non-zero): the max (min) of the truth as int32."""
    x = e.input(call, 0)
    if call.kind is not Kind.BOOL:
        x = e.node("Not", [e.node("Equal", [x, e.scalar_like(call, 0)])])
    as_int = e.node("Cast", [x], to=6)  # INT32
    op_type = "ReduceMax" if call.op.name.startswith("any") else "ReduceMin"
    dim = e.static(call, "dim") if call.op.name.endswith("_dim") else None
    reduced = reduce(e, op_type, as_int, None if dim is None else [dim], dim is not None)
    e.node("Cast", [reduced], [e.output(call)], to=9)  # BOOL


@exporter("cumsum")
def cumsum(e: Emitter, call: OpCall) -> None:
    axis = e.const(e.static(call, "dim"), "axis", None)
    e.node("CumSum", [e.input(call, 0), axis], [e.output(call)])


@exporter("sort_with_indices")
def sort_with_indices(e: Emitter, call: OpCall) -> None:
    """TopK over the whole dim. Ties may come in another order than ember's stable sort."""
    dim = e.static(call, "dim")
    aval = call.input_avals[0]
    assert aval is not None
    k = e.sizes(call, [aval.shape[dim]], [e.alternate_input_shape(call, 0)[dim]])
    e.node("TopK", [e.input(call, 0), k], [e.output(call, 0), e.output(call, 1)], axis=dim,
           largest=int(bool(e.static(call, "descending"))), sorted=1)  # fmt: skip


@exporter("var", "var_mean")
def var_mean(e: Emitter, call: OpCall) -> None:
    """``sum((x - mean)^2) / (n - correction)`` along ``dim`` (kept), with ``n`` read from the
    input's shape at run time, so the dim may be dynamic."""
    dim, correction = e.static(call, "dim"), e.static(call, "correction")
    x = e.input(call, 0)
    mean = reduce(e, "ReduceMean", x, [dim], True)
    centered = e.node("Sub", [x, mean])
    squares = reduce(e, "ReduceSum", e.node("Mul", [centered, centered]), [dim], True)
    size = e.node("Gather", [e.node("Shape", [x]), e.ints([dim])], axis=0)
    count = e.node("Sub", [e.node("CastLike", [size, x]), e.scalar_like(call, correction)])
    e.node("Div", [squares, count], [e.output(call, 0)])
    if call.op.name == "var_mean":
        e.node("Identity", [mean], [e.output(call, 1)])
