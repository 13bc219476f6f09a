"""Matrix products: MatMul and Gemm, as ember ``Linear`` layers when the weight is a constant."""

from __future__ import annotations

import numpy as np

from ember.onnx.context import NodeContext, Value
from ember.onnx.registry import converter
from ember.tensor import DType

_LINEAR_IMPORTS = ("from ember.nn.linear import Linear, LinearConfig",)


def _is_weight(b: Value) -> bool:
    """A constant 2-d f32 matrix: what ember's Linear (f32 by default) holds."""
    value = b.const
    return value is not None and value.ndim == 2 and b.dtype is DType.F32


def _linear(node: NodeContext, weight: np.ndarray, bias: np.ndarray | None) -> str:
    """A Linear field with ``weight`` stored ``[d_input, d_output]`` (ONNX's ``B`` layout)."""
    d_input, d_output = weight.shape
    config = f"LinearConfig({d_input}, {d_output})"
    params = {"weight": weight.astype(np.float32)}
    if bias is None:
        config += ".with_bias(False)"
    else:
        params["bias"] = bias.astype(np.float32)
    return node.layer(node.name, "Linear", f"{config}.init(device)", params, _LINEAR_IMPORTS)


@converter("MatMul", since=1, attrs=())
def matmul(node: NodeContext) -> str:
    a, b = node.input(0), node.input(1)
    if _is_weight(b) and a.rank != 0:
        return f"{node.outputs[0]} = {_linear(node, b.const, None)}({a.expr})"
    if a.rank is not None and b.rank is not None and a.rank >= 2 and b.rank >= 2:
        return f"{node.outputs[0]} = {a.expr}.matmul({b.expr})"
    return f"{node.outputs[0]} = rt.matmul({a.expr}, {b.expr})"


def _bias_row(c: Value, n: int) -> np.ndarray | None:
    """C as a ``[n]`` bias when it is a constant that broadcasts along the rows only."""
    value = c.const
    if value is None or value.size not in (1, n) or (value.ndim == 2 and value.shape[0] != 1):
        return None
    return np.broadcast_to(value.reshape(-1), (n,)).copy()


@converter("Gemm", since=1, attrs=("alpha", "beta", "transA", "transB", "broadcast"))
def gemm(node: NodeContext) -> str:
    """``alpha * A' @ B' + beta * C`` with A' and B' optionally transposed."""
    a, b, c = node.input(0), node.input(1), node.input(2)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    y = node.outputs[0]
    x = f"{a.expr}.transpose()" if trans_a else a.expr
    if _is_weight(b):
        weight = alpha * (b.const.T if trans_b else b.const)
        n = weight.shape[1]
        bias = _bias_row(c, n) if c.present else None
        if not c.present or bias is not None:
            return f"{y} = {_linear(node, weight, None if bias is None else beta * bias)}({x})"
    product = f"{x}.matmul({b.expr}.transpose())" if trans_b else f"{x}.matmul({b.expr})"
    if alpha != 1.0:
        product = f"{product} * {alpha!r}"
    if not c.present:
        return f"{y} = {product}"
    scaled = c.expr if beta == 1.0 else f"{c.expr} * {beta!r}"
    return f"{y} = {product} + {scaled}"
