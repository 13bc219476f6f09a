"""Softmax, LogSoftmax and Hardmax.

Before opset 13 these ops see the input as a matrix: the dims before ``axis`` (default
1) are the rows, the dims from ``axis`` on one row each, normalized together. From opset
13 they normalize along the one dim ``axis`` (default -1). Both become ember's
``activation.softmax`` / ``log_softmax`` along one dim (of the input reshaped to that
matrix where needed); Hardmax is a one at the first maximum. An input whose rank is not
known at import time is made that matrix when the model runs.
"""

from __future__ import annotations

import math

from ember.onnx.context import NodeContext
from ember.onnx.registry import converter

_FUNCTIONS = {"Softmax": "activation.softmax", "LogSoftmax": "activation.log_softmax"}


def _along(node: NodeContext, x: str, axis: int, rank: int | None) -> str:
    """The expression of the node's op along the one dim ``axis`` of ``x``."""
    if node.op_type != "Hardmax":
        return f"{_FUNCTIONS[node.op_type]}({x}, {axis})"
    if rank is None:
        return f"rt.hardmax({x}, {axis})"
    # The positions along axis, shaped to broadcast, equal to the (first) argmax.
    dim = axis % rank
    shape = ", ".join("-1" if d == dim else "1" for d in range(rank))
    positions = f"Tensor.arange({x}.shape[{dim}], device={x}.device).reshape([{shape}])"
    return f"{positions}.equal({x}.argmax({dim})).cast({x}.dtype)"


@converter("Softmax", since=1, attrs=("axis",))
@converter("LogSoftmax", since=1, attrs=("axis",))
@converter("Hardmax", since=1, attrs=("axis",))
def softmax_2d(node: NodeContext) -> str | list[str]:
    """Opsets 1 to 12: normalized over all the dims from ``axis`` on, as one."""
    x = node.input(0)
    y = node.outputs[0]
    if x.rank is None:
        # Any rank: the matrix is made when the model runs (rt.flatten reads the dims).
        rows = node.tmp("rows")
        return [f"{rows} = rt.flatten({x.expr}, {int(node.attr('axis', 1))})",
                f"{y} = {_along(node, rows, 1, 2)}.reshape({x.expr}.shape)"]
    axis = int(node.attr("axis", 1)) % max(x.rank, 1)
    if axis == x.rank - 1:  # only the last dim: the same as the opset 13 op
        return f"{y} = {_along(node, x.expr, axis, x.rank)}"
    static = x.static_shape
    if static is not None:
        matrix = f"{x.expr}.reshape({[math.prod(static[:axis]), math.prod(static[axis:])]})"
    else:
        matrix = f"rt.flatten({x.expr}, {axis})"
    rows = node.tmp("rows")
    return [f"{rows} = {matrix}", f"{y} = {_along(node, rows, 1, 2)}.reshape({x.expr}.shape)"]


@converter("Softmax", since=13, attrs=("axis",))
@converter("LogSoftmax", since=13, attrs=("axis",))
@converter("Hardmax", since=13, attrs=("axis",))
def softmax(node: NodeContext) -> str:
    """Opset 13 on: normalized along the one dim ``axis``."""
    x = node.input(0)
    return f"{node.outputs[0]} = {_along(node, x.expr, int(node.attr('axis', -1)), x.rank)}"
