"""Logic ops: comparisons, boolean and bitwise ops, NaN and infinity tests, and Where.

Comparisons and boolean ops broadcast like NumPy from opset 7; before it they take the
``broadcast`` and ``axis`` attributes (see :func:`ember.onnx.ops.math.legacy_rhs`).
"""

from __future__ import annotations

from ember.onnx.context import NodeContext
from ember.onnx.ops.math import legacy_rhs, scalar_operand
from ember.onnx.registry import converter

# op type: (the Tensor method, the opset the op starts at, whether it had a legacy form).
_BINARY = {
    "Equal": ("equal", 1, True),
    "Greater": ("greater", 1, True),
    "Less": ("lower", 1, True),
    "GreaterOrEqual": ("greater_equal", 12, False),
    "LessOrEqual": ("lower_equal", 12, False),
    "And": ("bool_and", 1, True),
    "Or": ("bool_or", 1, True),
    "Xor": ("bool_xor", 1, True),
    "BitwiseAnd": ("bitwise_and", 18, False),
    "BitwiseOr": ("bitwise_or", 18, False),
    "BitwiseXor": ("bitwise_xor", 18, False),
}


def _binary(node: NodeContext) -> str:
    a, b = node.input(0), node.input(1)
    method = _BINARY[node.op_type][0]
    rhs = legacy_rhs(node) if node.opset < 7 else scalar_operand(b, a)
    return f"{node.outputs[0]} = {a.expr}.{method}({rhs})"


for _op, (_, _since, _legacy) in _BINARY.items():
    if _legacy:
        converter(_op, since=_since, attrs=("broadcast", "axis"))(_binary)
        converter(_op, since=7, attrs=())(_binary)
    else:
        converter(_op, since=_since, attrs=())(_binary)


@converter("Not", since=1, attrs=())
def not_(node: NodeContext) -> str:
    return f"{node.outputs[0]} = {node.input(0).expr}.bool_not()"


@converter("BitwiseNot", since=18, attrs=())
def bitwise_not(node: NodeContext) -> str:
    return f"{node.outputs[0]} = {node.input(0).expr}.bitwise_not()"


@converter("BitShift", since=11, attrs=("direction",))
def bit_shift(node: NodeContext) -> str:
    direction = str(node.attr("direction")).upper()
    if direction not in ("LEFT", "RIGHT"):
        node.unsupported(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    x, shift = node.input(0), node.input(1)
    method = "bitwise_left_shift" if direction == "LEFT" else "bitwise_right_shift"
    return f"{node.outputs[0]} = {x.expr}.{method}({scalar_operand(shift, x)})"


@converter("IsNaN", since=9, attrs=())
def is_nan(node: NodeContext) -> str:
    return f"{node.outputs[0]} = {node.input(0).expr}.is_nan()"


@converter("IsInf", since=10, attrs=("detect_positive", "detect_negative"))
def is_inf(node: NodeContext) -> str:
    x = node.input(0).expr
    positive = bool(node.attr("detect_positive", 1))
    negative = bool(node.attr("detect_negative", 1))
    if positive and negative:
        test = f"{x}.is_inf()"
    elif positive:
        test = f'{x}.equal(float("inf"))'
    elif negative:
        test = f'{x}.equal(-float("inf"))'
    else:
        test = f"Tensor.full({x}.shape, False, {x}.device)"
    return f"{node.outputs[0]} = {test}"


@converter("Where", since=9, attrs=())
def where(node: NodeContext) -> str:
    """``x`` where ``condition`` holds, else ``y``; the three broadcast together."""
    condition, x, y = node.input(0), node.input(1), node.input(2)
    return f"{node.outputs[0]} = {y.expr}.mask_where({condition.expr}, {x.expr})"
