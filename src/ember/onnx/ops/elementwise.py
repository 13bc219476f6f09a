"""Element-wise ops: arithmetic with broadcasting, and unary math and activations."""

from __future__ import annotations

from ember.onnx.context import NodeContext
from ember.onnx.registry import converter

# Opset 1 to 5 nodes carry ``consumed_inputs``, a memory hint with no effect on results.
_LEGACY = ("consumed_inputs",)

_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}


def _binary(node: NodeContext) -> str:
    a, b = node.input(0), node.input(1)
    return f"{node.outputs[0]} = {a.expr} {_BINARY[node.op_type]} {b.expr}"


def _binary_legacy(node: NodeContext) -> str:
    """Opsets 1 to 6: broadcasting only with ``broadcast=1``, ``b`` aligned at ``axis``."""
    a, b = node.input(0), node.input(1)
    other = b.expr
    if node.attr("broadcast", 0) and "axis" in node.attrs:
        if a.rank is None or b.rank is None:
            node.unsupported("broadcast with an axis needs the ranks of both inputs; run ONNX "
                             "shape inference or give the inputs static ranks")
        start = node.attrs["axis"] % a.rank
        trailing = a.rank - start - b.rank
        if trailing:
            other = f"rt.unsqueeze({other}, {list(range(b.rank, b.rank + trailing))})"
    return f"{node.outputs[0]} = {a.expr} {_BINARY[node.op_type]} {other}"


for _op in _BINARY:
    converter(_op, since=1, attrs=(*_LEGACY, "broadcast", "axis"))(_binary_legacy)
    converter(_op, since=7, attrs=())(_binary)


# Unary ops: the expression of the output, from the input ``x``.
_UNARY = {
    "Relu": "activation.relu({x})",
    "Sigmoid": "activation.sigmoid({x})",
    "Tanh": "{x}.tanh()",
    "Exp": "{x}.exp()",
    "Log": "{x}.log()",
    "Sqrt": "{x}.sqrt()",
    "Neg": "-{x}",
    "Abs": "{x}.abs()",
    "Identity": "{x}",
}


def _unary(node: NodeContext) -> str:
    x = node.input(0)
    return f"{node.outputs[0]} = " + _UNARY[node.op_type].format(x=x.expr)


for _op in _UNARY:
    converter(_op, since=1, attrs=_LEGACY)(_unary)
