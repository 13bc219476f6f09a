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
        return e.input(call, 0), e.scalar_like(call, e.static(call, "scalar"))
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


@exporter("bitwise_and_scalar", kinds=[Kind.INT])
def low_bits(e: Emitter, call: OpCall) -> None:
    """Before opset 18, ``x & (2**k - 1)`` (unpacking packed int4 weights) is ``x mod 2**k``
    with the divisor's sign, which is exact for every sign of ``x``."""
    mask = e.static(call, "scalar")
    if mask < 0 or (mask + 1) & mask:
        raise e.unsupported(call, f"before opset 18 only masks 2**k - 1 are written (got "
                                  f"{mask}); export with opset=18")
    e.node("Mod", [e.input(call, 0), e.scalar_like(call, mask + 1)], [e.output(call)], fmod=0)


@exporter("bitwise_left_shift", "bitwise_right_shift", "bitwise_left_shift_scalar",
          "bitwise_right_shift_scalar", kinds=[Kind.INT])  # fmt: skip
def bit_shift(e: Emitter, call: OpCall) -> None:
    """Shifts of signed integers (ONNX's BitShift is for unsigned ones only) as arithmetic:
    ``x * 2**k`` to the left, ``(x - x mod 2**k) / 2**k`` to the right (the floor, as an
    arithmetic shift rounds)."""
    x, k = _operands(e, call)
    power = e.node("Pow", [e.scalar_like(call, 2), k])
    if "left" in call.op.name:
        e.node("Mul", [x, power], [e.output(call)])
        return
    rest = e.node("Mod", [x, power], fmod=0)  # the divisor's sign: 0 <= rest < 2**k
    e.node("Div", [e.node("Sub", [x, rest]), power], [e.output(call)])


@exporter("bitwise_not", kinds=[Kind.INT], since=18)
def bitwise_not(e: Emitter, call: OpCall) -> None:
    e.node("BitwiseNot", [e.input(call, 0)], [e.output(call)])


def where(e: Emitter, call: OpCall, mask: str, value: str, tensor: str) -> None:
    """``value`` where the mask holds, ``tensor`` elsewhere. onnxruntime has no boolean
    Where, so for Bool tensors it is ``mask and value or not mask and tensor``."""
    if call.kind is not Kind.BOOL:
        e.node("Where", [mask, value, tensor], [e.output(call)])
        return
    chosen = e.node("And", [mask, value])
    kept = e.node("And", [e.node("Not", [mask]), tensor])
    e.node("Or", [chosen, kept], [e.output(call)])


@exporter("mask_where")
def mask_where(e: Emitter, call: OpCall) -> None:
    where(e, call, e.input(call, 1), e.input(call, 2), e.input(call, 0))


@exporter("mask_fill")
def mask_fill(e: Emitter, call: OpCall) -> None:
    where(e, call, e.input(call, 1), e.scalar_like(call, e.static(call, "value")), e.input(call, 0))
