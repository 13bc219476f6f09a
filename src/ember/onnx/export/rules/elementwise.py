"""Element-wise arithmetic: binary ops (and their ``_scalar`` forms), unary math, clamp, cast.

Most are one ONNX node, named by the tables below; the rest (floor-style float remainder,
``log1p``, ``expm1``, ``rsqrt``, ``trunc``) are two or three.
"""

from __future__ import annotations

import math

from ember.onnx.export.emitter import Emitter, onnx_type
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall
from ember.tensor.dtype import Kind

BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
          "max_pair": "Max", "min_pair": "Min"}  # fmt: skip
"""Binary ops that are one ONNX node (integer Div truncates in both)."""

UNARY = {"neg": "Neg", "abs": "Abs", "sign": "Sign", "exp": "Exp", "log": "Log", "erf": "Erf",
         "sqrt": "Sqrt", "recip": "Reciprocal", "sin": "Sin", "cos": "Cos", "tan": "Tan",
         "sinh": "Sinh", "cosh": "Cosh", "tanh": "Tanh", "asin": "Asin", "acos": "Acos",
         "atan": "Atan", "round": "Round", "floor": "Floor", "ceil": "Ceil", "is_nan": "IsNaN",
         "is_inf": "IsInf"}  # fmt: skip
"""Unary ops that are one ONNX node (Round rounds half to even, as ember does)."""


def _operands(e: Emitter, call: OpCall) -> tuple[str, str]:
    """Both operands of a binary op or of its ``_scalar`` form (the scalar as a constant)."""
    if call.op.name.endswith("_scalar"):
        return e.input(call, 0), e.scalar_like(call, e.static(call, "scalar"))
    return e.input(call, 0), e.input(call, 1)


@exporter(*BINARY, *(f"{name}_scalar" for name in BINARY))
def binary(e: Emitter, call: OpCall) -> None:
    a, b = _operands(e, call)
    e.node(BINARY[call.op.name.removesuffix("_scalar")], [a, b], [e.output(call)])


@exporter("remainder", "remainder_scalar")
def remainder(e: Emitter, call: OpCall) -> None:
    """The remainder takes the divisor's sign (Python's ``%``): ONNX ``Mod`` for integers,
    ``a - floor(a / b) * b`` for floats (ONNX's float ``Mod`` is C's ``fmod``)."""
    a, b = _operands(e, call)
    if call.kind is Kind.INT:
        e.node("Mod", [a, b], [e.output(call)], fmod=0)
        return
    quotient = e.node("Floor", [e.node("Div", [a, b])])
    e.node("Sub", [a, e.node("Mul", [quotient, b])], [e.output(call)])


@exporter(*UNARY)
def unary(e: Emitter, call: OpCall) -> None:
    e.node(UNARY[call.op.name], [e.input(call, 0)], [e.output(call)])


@exporter("log1p", "expm1", "rsqrt", "trunc")
def unary_composed(e: Emitter, call: OpCall) -> None:
    x, out = e.input(call, 0), e.output(call)
    one = e.scalar_like(call, 1)
    name = call.op.name
    if name == "log1p":
        e.node("Log", [e.node("Add", [x, one])], [out])
    elif name == "expm1":
        e.node("Sub", [e.node("Exp", [x]), one], [out])
    elif name == "rsqrt":
        e.node("Reciprocal", [e.node("Sqrt", [x])], [out])
    else:  # trunc: toward zero
        negative = e.node("Less", [x, e.scalar_like(call, 0)])
        e.node("Where", [negative, e.node("Ceil", [x]), e.node("Floor", [x])], [out])


@exporter("atan2")
def atan2(e: Emitter, call: OpCall) -> None:
    """The angle of ``(x, y) = (rhs, lhs)``: ``atan(y / x)``, plus or minus pi when ``x < 0``
    (by the sign of ``y``), and 0 at the origin, as NumPy's ``arctan2`` (signed zeros
    aside)."""
    y, x = e.input(call, 0), e.input(call, 1)
    zero = e.scalar_like(call, 0.0)
    angle = e.node("Atan", [e.node("Div", [y, x])])
    half_turn = e.node("Where", [e.node("Less", [y, zero]), e.scalar_like(call, -math.pi),
                                 e.scalar_like(call, math.pi)])  # fmt: skip
    turned = e.node("Where", [e.node("Less", [x, zero]), e.node("Add", [angle, half_turn]),
                              angle])  # fmt: skip
    origin = e.node("And", [e.node("Equal", [x, zero]), e.node("Equal", [y, zero])])
    e.node("Where", [origin, zero, turned], [e.output(call)])


@exporter("clamp")
def clamp(e: Emitter, call: OpCall) -> None:
    low, high = e.static(call, "min"), e.static(call, "max")
    bounds = ["" if v is None else e.scalar_like(call, v) for v in (low, high)]
    while bounds and not bounds[-1]:
        bounds.pop()
    e.node("Clip", [e.input(call, 0), *bounds], [e.output(call)])


@exporter("cast")
def cast(e: Emitter, call: OpCall) -> None:
    e.node("Cast", [e.input(call, 0)], [e.output(call)], to=onnx_type(e.static(call, "dtype")))


@exporter("to_device")
def to_device(e: Emitter, call: OpCall) -> None:
    """A graph has no devices: the value itself."""
    e.bind(call, e.input(call, 0))
