"""Attention ops: scaled dot-product Attention (opset 23) and RotaryEmbedding (opset 23).

Attention is written out as tensor code: heads split from 3-d inputs, the key/value
cache joined, grouped key/value heads repeated, ``softmax(q k^T * scale + bias) v`` with
the bias assembled from the mask, the causal triangle and the padded key lengths.
"""

from __future__ import annotations

import math

from ember.onnx.context import NodeContext, Value
from ember.onnx.ops.math import dtype_attr, number
from ember.onnx.registry import converter
from ember.tensor import DType

_NEG_INF = '-float("inf")'


def _size(v: Value, i: int, expr: str | None = None) -> int | str:
    """Dim ``i`` of ``v``: an int when static, else read from ``expr`` (``v``) when it runs."""
    shape = v.shape
    if shape is not None and isinstance(shape[i], int):
        return shape[i]
    return f"{expr or v.expr}.shape[{i}]"


def _heads(node: NodeContext, v: Value, heads: int, lines: list[str], hint: str) -> str:
    """A 3-d ``[batch, seq, heads * size]`` input as ``[batch, heads, seq, size]``."""
    out = node.tmp(hint)
    lines.append(f"{out} = {v.expr}.reshape([{_size(v, 0)}, {_size(v, 1)}, {heads}, -1])"
                 f".swap_dims(1, 2)")
    return out


@converter("Attention", since=23,
           attrs=("is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale",
                  "softcap", "softmax_precision"))  # fmt: skip
def attention(node: NodeContext) -> list[str]:
    """Follows the ONNX reference: ``q`` and ``k`` are each scaled by ``sqrt(scale)``, the
    softcap applies before the bias, a boolean mask's False and a causal or padded position
    become ``-inf``, and kv heads repeat interleaved (``h0, h0, h1, h1``) for grouped
    queries. Half-precision inputs are computed in f32 and rounded once at the end."""
    q, k, v = node.input(0), node.input(1), node.input(2)
    mask, past_k, past_v, kv_lengths = node.input(3), node.input(4), node.input(5), node.input(6)
    rank = q.rank
    if rank not in (3, 4):
        node.unsupported("Q must have a known rank of 3 or 4")
    causal = bool(node.attr("is_causal", 0))
    softcap = float(node.attr("softcap", 0.0))
    mode = int(node.attr("qk_matmul_output_mode", 0))
    precision = dtype_attr(node, "softmax_precision")
    lines: list[str] = []

    if rank == 3:
        q_heads, kv_heads = node.attr("q_num_heads", None), node.attr("kv_num_heads", None)
        if q_heads is None or kv_heads is None:
            node.unsupported("3-d Q/K/V need the attributes q_num_heads and kv_num_heads")
        qh = _heads(node, q, int(q_heads), lines, "q")
        kh = _heads(node, k, int(kv_heads), lines, "k")
        vh = _heads(node, v, int(kv_heads), lines, "v")
        hidden = q.shape[2] if q.shape is not None else None
        head_size: int | str = (hidden // int(q_heads) if isinstance(hidden, int)
                                else f"{qh}.shape[3]")  # fmt: skip
        q_heads_n: int | str = int(q_heads)
        kv_heads_n: int | str = int(kv_heads)
    else:
        qh, kh, vh = q.expr, k.expr, v.expr
        head_size = _size(q, 3)
        q_heads_n, kv_heads_n = _size(q, 1), _size(k, 1)

    # Half precision: computed in f32, rounded to the input dtype once at the end.
    low = q.dtype in (DType.F16, DType.BF16)
    if low:
        lines.append(f"{qh}, {kh}, {vh} = {qh}.float(), {kh}.float(), {vh}.float()")

    # The key/value cache: the present key/value are the past ones followed by the new ones.
    if past_k.present:
        key = node.tmp("present_key")
        past = f"{past_k.expr}.float()" if low else past_k.expr
        lines.append(f"{key} = Tensor.cat([{past}, {kh}], 2)")
    else:
        key = kh
    if past_v.present:
        value = node.tmp("present_value")
        past = f"{past_v.expr}.float()" if low else past_v.expr
        lines.append(f"{value} = Tensor.cat([{past}, {vh}], 2)")
    else:
        value = vh
    outputs = node.outputs
    back = f'.cast("{q.dtype.value}")' if low else ""
    if len(outputs) > 1:
        lines.append(f"{outputs[1]} = {key}{back}")
    if len(outputs) > 2:
        lines.append(f"{outputs[2]} = {value}{back}")

    # Grouped queries: each kv head serves q_heads / kv_heads consecutive query heads.
    if q_heads_n != kv_heads_n or isinstance(q_heads_n, str) or isinstance(kv_heads_n, str):
        reps = (q_heads_n // kv_heads_n if isinstance(q_heads_n, int) and isinstance(kv_heads_n, int)
                else f"{qh}.shape[1] // {key}.shape[1]")  # fmt: skip
        for name in ("key", "value"):
            src = key if name == "key" else value
            rep = node.tmp(f"{name}_rep")
            lines.append(f"{rep} = {src}.unsqueeze_dim(2).repeat_dim(2, {reps}).reshape("
                         f"[{src}.shape[0], -1, {src}.shape[2], {src}.shape[3]])")
            if name == "key":
                key = rep
            else:
                value = rep

    scale = node.attr("scale", None)
    if scale is not None:
        root = number(math.sqrt(float(scale)))
    elif isinstance(head_size, int):
        root = number(head_size ** -0.25)
    else:
        root = f"({head_size}) ** -0.25"
    scores = node.tmp("scores")
    lines.append(f"{scores} = ({qh} * {root}).matmul(({key} * {root}).swap_dims(2, 3))")
    if softcap > 0:
        lines.append(f"{scores} = ({scores} / {number(softcap)}).tanh() * {number(softcap)}")
    capped = scores

    bias_terms = _bias(node, mask, past_k, kv_lengths, causal, scores, key, lines)
    logits = capped
    if bias_terms:
        logits = node.tmp("logits")
        lines.append(f"{logits} = {' + '.join([capped, *bias_terms])}")

    probs = node.tmp("probs")
    if precision is not None and precision is not (DType.F32 if low else q.dtype):
        lines.append(f'{probs} = activation.softmax({logits}.cast("{precision.value}"), -1)'
                     f".cast({scores}.dtype)")
    else:
        lines.append(f"{probs} = activation.softmax({logits}, -1)")

    y = f"{probs}.matmul({value})"
    if rank == 3:
        y = f"{y}.swap_dims(1, 2).reshape([{_size(q, 0)}, {_size(q, 1)}, -1])"
    lines.append(f"{outputs[0]} = {y}{back}")
    if len(outputs) > 3:
        chosen = {0: capped, 1: capped, 2: logits, 3: probs}.get(mode)
        if chosen is None:
            node.unsupported(f"qk_matmul_output_mode {mode} is not one of 0, 1, 2, 3")
        lines.append(f"{outputs[3]} = {chosen}{back}")
    return lines


def _bias(node: NodeContext, mask: Value, past_k: Value, kv_lengths: Value, causal: bool,
          scores: str, key: str, lines: list[str]) -> list[str]:  # fmt: skip
    """The additive terms of the attention bias (each broadcasting against the scores)."""
    terms = []
    if mask.present:
        m = node.tmp("mask")
        if mask.dtype is DType.BOOL:
            lines.append(f"{m} = Tensor.zeros({mask.expr}.shape, {scores}.device, {scores}.dtype)"
                         f".mask_fill({mask.expr}.bool_not(), {_NEG_INF})")
        else:
            lines.append(f"{m} = {mask.expr}.cast({scores}.dtype)")
        # A mask shorter than the keys leaves the remaining keys out.
        lines.append(f"{m} = {m}.pad([0, {key}.shape[2] - {m}.shape[-1]], {_NEG_INF}) "
                     f"if {m}.shape[-1] < {key}.shape[2] else {m}")
        terms.append(m)
    if causal:
        # Query i sees the past and the new keys up to i: key j is hidden when j - past > i.
        past = f"{past_k.expr}.shape[2]" if past_k.present else "0"
        c = node.tmp("causal")
        lines.append(f"{c} = Tensor.full([{scores}.shape[2], {scores}.shape[3]], {_NEG_INF}, "
                     f"{scores}.device, {scores}.dtype).triu({past} + 1)")
        terms.append(c)
    if kv_lengths.present:
        # Keys at or beyond a batch entry's length are padding.
        p = node.tmp("padding")
        lines.append(f"{p} = Tensor.zeros([{scores}.shape[0], 1, 1, {scores}.shape[3]], "
                     f"{scores}.device, {scores}.dtype).mask_fill(Tensor.arange({scores}.shape[3]"
                     f", device={scores}.device).reshape([1, 1, 1, -1]).greater_equal("
                     f"{kv_lengths.expr}.int().reshape([-1, 1, 1, 1])), {_NEG_INF})")
        terms.append(p)
    return terms


@converter("RotaryEmbedding", since=23, attrs=("interleaved", "num_heads", "rotary_embedding_dim"))
def rotary_embedding(node: NodeContext) -> list[str]:
    """Rotates the first ``rotary_embedding_dim`` features of each head by the angles whose
    cosines and sines are given (picked by ``position_ids`` when present): pairs are the two
    halves, or neighbours when ``interleaved``. 4-d inputs are ``[batch, heads, seq, size]``,
    3-d inputs ``[batch, seq, heads * size]``."""
    x, cos, sin, positions = node.input(0), node.input(1), node.input(2), node.input(3)
    interleaved = bool(node.attr("interleaved", 0))
    rank = x.rank
    if rank not in (3, 4):
        node.unsupported("the input must have a known rank of 3 or 4")
    lines: list[str] = []
    if rank == 3:
        heads = int(node.attr("num_heads", 0))
        if heads <= 0:
            node.unsupported("a 3-d input needs the attribute num_heads")
        x4 = node.tmp("x")
        lines.append(f"{x4} = {x.expr}.reshape([{_size(x, 0)}, {_size(x, 1)}, {heads}, -1])")
        hidden = x.shape[2] if x.shape is not None else None
        head_size: int | str = hidden // heads if isinstance(hidden, int) else f"{x4}.shape[3]"
        head_dim = 2  # the caches' [batch, seq, half] gain the heads dim after seq
    else:
        x4, head_size, head_dim = x.expr, _size(x, 3), 1
    rot_dim: int | str = int(node.attr("rotary_embedding_dim", 0)) or head_size
    half = rot_dim // 2 if isinstance(rot_dim, int) else f"{rot_dim} // 2"

    c, s = node.tmp("cos"), node.tmp("sin")
    for name, cache in ((c, cos), (s, sin)):
        picked = f"rt.gather({cache.expr}, {positions.expr}, 0)" if positions.present else cache.expr
        lines.append(f"{name} = {picked}.unsqueeze_dim({head_dim})")

    partial = not (isinstance(rot_dim, int) and rot_dim == head_size)
    rot = node.tmp("rot")
    lines.append(f"{rot} = {x4}.narrow(-1, 0, {rot_dim})" if partial else f"{rot} = {x4}")
    x1, x2 = node.tmp("x1"), node.tmp("x2")
    if interleaved:
        pairs = node.tmp("pairs")
        lines += [f"{pairs} = {rot}.reshape([*{rot}.shape[:-1], -1, 2])",
                  f"{x1} = {pairs}.narrow(-1, 0, 1).squeeze(-1)",
                  f"{x2} = {pairs}.narrow(-1, 1, 1).squeeze(-1)"]  # fmt: skip
    else:
        lines += [f"{x1} = {rot}.narrow(-1, 0, {half})",
                  f"{x2} = {rot}.narrow(-1, {half}, {half})"]  # fmt: skip
    real, imag = f"{c} * {x1} - {s} * {x2}", f"{s} * {x1} + {c} * {x2}"
    rotated = node.tmp("rotated")
    if interleaved:
        lines.append(f"{rotated} = Tensor.stack([{real}, {imag}], -1).reshape({rot}.shape)")
    else:
        lines.append(f"{rotated} = Tensor.cat([{real}, {imag}], -1)")
    if partial:
        lines.append(f"{rotated} = Tensor.cat([{rotated}, {x4}.narrow(-1, {rot_dim}, "
                     f"{x4}.shape[-1] - {rot_dim})], -1) if {x4}.shape[-1] > {rot_dim} "
                     f"else {rotated}")
    if rank == 3:
        lines.append(f"{node.outputs[0]} = {rotated}.reshape({x.expr}.shape)")
    else:
        lines.append(f"{node.outputs[0]} = {rotated}")
    return lines
