"""FlexAttention (domain ``ai.onnx.preview``, opset 1): attention with modifier subgraphs.

The op is scaled dot-product attention over rank-4 ``[batch, heads, seq, size]`` inputs
whose scores and probabilities may each pass through a user subgraph: ``score_mod``
after ``q k^T * scale`` (masks, biases, soft caps) and ``prob_mod`` after the softmax.
Each subgraph becomes inline code between the attention's own lines, as the bodies of
``If`` and ``Loop`` do (see :mod:`ember.onnx.ops.control`).

As in the ONNX function that defines it, ``q`` and ``k`` are each scaled by
``sqrt(scale)`` in their own dtype, the scores are then cast to the softmax precision
(f32, or f64 for f64 inputs, unless ``softmax_precision`` says otherwise), the
modifiers, the softmax and the product with ``v`` run in that precision, and the result
is cast back to the input dtype. Grouped kv heads serve consecutive query heads
(query head ``h`` uses kv head ``h // (q_heads // kv_heads)``).
"""

from __future__ import annotations

import numpy as np

from ember.onnx.context import NodeContext, Value
from ember.onnx.ops.math import dtype_attr, number
from ember.onnx.registry import converter
from ember.tensor import DType

_PREVIEW = "ai.onnx.preview"


def _size(v: Value, i: int) -> int | str:
    """Dim ``i`` of ``v``: an int when static, else read when the code runs."""
    shape = v.shape
    if shape is not None and isinstance(shape[i], int):
        return shape[i]
    return f"{v.expr}.shape[{i}]"


def _root_scale(node: NodeContext, q: Value) -> str:
    """``sqrt(scale)`` as code; computed in f32 like the op's function body."""
    scale = node.attr("scale", None)
    head = _size(q, 3)
    if scale is None and isinstance(head, str):
        return f"({head}) ** -0.25"
    value = np.float32(scale) if scale is not None else np.float32(1) / np.sqrt(np.float32(head))
    return number(float(np.sqrt(np.float32(value))))


def _modifier(node: NodeContext, attr: str, value: str, lines: list[str]) -> str:
    """Runs the subgraph ``attr`` on the local ``value``; returns its output's expression."""
    if attr not in node.attrs:
        return value
    body = node.body(attr)
    if len(body.inputs) != 1 or body.num_outputs != 1:
        node.unsupported(f"{attr} must have one input and one output, it has "
                         f"{len(body.inputs)} and {body.num_outputs}")
    lines.append(f"{body.inputs[0]} = {value}")
    lines.extend(body.lines)
    result = node.tmp(attr)
    lines.append(f"{result} = {body.output(0)}")
    return result


def _repeat_heads(node: NodeContext, src: str, v: Value, reps: int | str,
                  lines: list[str]) -> str:  # fmt: skip
    """``[b, kv_heads, s, d]`` as ``[b, kv_heads * reps, s, d]``, each head repeated in place."""
    out = node.tmp("rep")
    lines.append(f"{out} = {src}.unsqueeze_dim(2).repeat_dim(2, {reps}).reshape("
                 f"[{_size(v, 0)}, -1, {_size(v, 2)}, {_size(v, 3)}])")
    return out


@converter("FlexAttention", since=1, domain=_PREVIEW,
           attrs=("prob_mod", "scale", "score_mod", "softmax_precision"))  # fmt: skip
def flex_attention(node: NodeContext) -> list[str]:
    q, k, v = node.input(0), node.input(1), node.input(2)
    if any(x.rank not in (None, 4) for x in (q, k, v)):
        node.unsupported("Q, K and V must be rank-4 [batch, heads, seq, size] tensors")
    if q.rank is None:
        node.unsupported("Q's rank must be known at import time")
    dtype = q.dtype
    precision = dtype_attr(node, "softmax_precision")
    if precision is None:
        precision = DType.F64 if dtype is DType.F64 else DType.F32
    lines: list[str] = []

    key, value = k.expr, v.expr
    q_heads, kv_heads = _size(q, 1), _size(k, 1)
    if isinstance(q_heads, str) or isinstance(kv_heads, str) or q_heads != kv_heads:
        if isinstance(q_heads, int) and isinstance(kv_heads, int):
            if q_heads % kv_heads:
                node.unsupported(f"{q_heads} query heads are not a multiple of {kv_heads} kv heads")
            reps: int | str = q_heads // kv_heads
        else:
            reps = f"{q.expr}.shape[1] // {k.expr}.shape[1]"
        key = _repeat_heads(node, key, k, reps, lines)
        value = _repeat_heads(node, value, v, reps, lines)

    root = _root_scale(node, q)
    scores = node.tmp("scores")
    lines.append(f"{scores} = ({q.expr} * {root}).matmul(({key} * {root}).swap_dims(2, 3))")
    # An input dtype unknown at import time is taken to be the softmax precision already.
    recast = dtype is not None and dtype is not precision
    if recast:
        lines.append(f'{scores} = {scores}.cast("{precision.value}")')
        cast_value = node.tmp("v")
        lines.append(f'{cast_value} = {value}.cast("{precision.value}")')
        value = cast_value
    scores = _modifier(node, "score_mod", scores, lines)
    probs = node.tmp("probs")
    lines.append(f"{probs} = activation.softmax({scores}, -1)")
    probs = _modifier(node, "prob_mod", probs, lines)
    back = f'.cast("{dtype.value}")' if recast else ""
    lines.append(f"{node.outputs[0]} = {probs}.matmul({value}){back}")
    return lines
