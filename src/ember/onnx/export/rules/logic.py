"""Comparisons, boolean and bitwise logic, and selection by mask."""

from __future__ import annotations

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall
from ember.tensor.dtype import Kind

COMPARE = {"equal": "Equal", "greater": "Greater", "greater_equal": "GreaterOrEqual",
           "lower": "Less", "lower_equal": "LessOrEqual"}  # fmt: skip
"""Comparisons that are one ONNX node; ``not_equal`` is ``Not(Equal)``."""

LOGIC = {"and": "And", "or": "Or", "xor": "Xor"}
BITWISE = {"bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr", "bitwise_xor": "BitwiseXor"}


def _operands(e: Emitter, call: OpCall) -> tuple[str, str]:
    if call.op.name.endswith(("_elem", "_scalar")):
        return e.input(call, 0), e.scalar_like(call, call.attr("scalar"))
    return e.input(call, 0), e.input(call, 1)


@exporter(*COMPARE, "not_equal", *(f"{name}_elem" for name in (*COMPARE, "not_equal")))
def compare(e: Emitter, call: OpCall) -> None:
    a, b = _operands(e, call)
    name = call.op.name.removesuffix("_elem")
    if name == "not_equal":
        e.node("Not", [e.node("Equal", [a, b])], [e.output(call)])
    else:
        e.node(COMPARE[name], [a, b], [e.output(call)])


@exporter(*LOGIC)
def logic(e: Emitter, call: OpCall) -> None:
    e.node(LOGIC[call.op.name], [e.input(call, 0), e.input(call, 1)], [e.output(call)])


@exporter("not")
def logical_not(e: Emitter, call: OpCall) -> None:
    e.node("Not", [e.input(call, 0)], [e.output(call)])


@exporter(*BITWISE, *(f"{name}_scalar" for name in BITWISE), kinds=[Kind.INT], since=18)
def bitwise(e: Emitter, call: OpCall) -> None:
    a, b = _operands(e, call)
    e.node(BITWISE[call.op.name.removesuffix("_scalar")], [a, b], [e.output(call)])


@exporter("bitwise_not", kinds=[Kind.INT], since=18)
def bitwise_not(e: Emitter, call: OpCall) -> None:
    e.node("BitwiseNot", [e.input(call, 0)], [e.output(call)])


@exporter("mask_where")
def mask_where(e: Emitter, call: OpCall) -> None:
    """``value`` where the mask holds, ``tensor`` elsewhere."""
    tensor, mask, value = (e.input(call, i) for i in range(3))
    e.node("Where", [mask, value, tensor], [e.output(call)])


@exporter("mask_fill")
def mask_fill(e: Emitter, call: OpCall) -> None:
    value = e.scalar_like(call, call.attr("value"))
    e.node("Where", [e.input(call, 1), value, e.input(call, 0)], [e.output(call)])
