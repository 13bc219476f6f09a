"""Ops of recurrent sequence models' decoding (Mamba, Gated DeltaNet): CausalConvWithState,
the stateful depthwise convolution in front of their layers, and LinearAttention, whose
key-value state is updated one time step at a time."""

from __future__ import annotations

from ember.onnx.context import NodeContext
from ember.onnx.registry import converter


@converter("CausalConvWithState", since=27, attrs=("activation",))
def causal_conv_with_state(node: NodeContext) -> list[str]:
    """A depthwise 1-d convolution of ``[B, C, L]`` over ``past_state`` (zeros when absent)
    followed by the input, so that output ``t`` sees positions ``t - k + 1 .. t``; an
    optional SiLU (computed in f32); ``present_state`` is the last ``k - 1`` positions."""
    x, weight, bias, past = (node.input(i) for i in range(4))
    activation = node.attr("activation", "none")
    if isinstance(activation, bytes):
        activation = activation.decode()
    if activation not in ("none", "silu", "swish"):
        node.unsupported(f"the activation must be 'none', 'silu' or 'swish', got {activation!r}")
    w_shape = weight.shape
    if w_shape is None or len(w_shape) != 3 or not isinstance(w_shape[2], int):
        node.unsupported("the weight must be [channels, 1, k] with k known at import time")
    k = w_shape[2]
    expr = x.expr
    padded, out = node.tmp("padded"), node.outputs[0]
    lines = [f"{padded} = Tensor.cat([{past.expr}, {expr}], 2)" if past.present
             else f"{padded} = {expr}.pad([{k - 1}, 0])"]  # fmt: skip
    lines.append(f"{out} = F.conv1d({padded}, {weight.expr}, {bias.expr}, "
                 f"groups={expr}.shape[1])")  # fmt: skip
    if activation != "none":
        lines.append(f'{out} = activation.silu({out}.cast("f32")).cast({expr}.dtype)')
    if node.output_used(1):
        lines.append(f"{node.outputs[1]} = {padded}.narrow(2, {padded}.shape[2] - {k - 1}, "
                     f"{k - 1})")  # fmt: skip
    return lines


def _heads(expr: str, heads: int) -> str:
    """``[B, T, heads * D]`` as f32 ``[B, heads, T, D]``."""
    return (f'{expr}.cast("f32").reshape([{expr}.shape[0], {expr}.shape[1], {heads}, -1])'
            f".swap_dims(1, 2)")


@converter("LinearAttention", since=27,
           attrs=("chunk_size", "kv_num_heads", "q_num_heads", "scale", "update_rule"))
def linear_attention(node: NodeContext) -> list[str]:
    """Attention with a ``[B, H_kv, d_k, d_v]`` state updated one step at a time (in f32):
    ``S = S * exp(decay_t)`` (gated rules), ``v_t = beta_t * (v_t - k_t S)`` (delta rules),
    ``S = S + k_t^T v_t``, and ``o_t = scale * q_t S`` (query heads share their group's
    state). ``chunk_size`` is a speed hint and changes nothing."""
    q, k, v, past, decay, beta = (node.input(i) for i in range(6))
    rule = node.attr("update_rule", "gated_delta")
    if isinstance(rule, bytes):
        rule = rule.decode()
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        node.unsupported(f"the update_rule must be linear, gated, delta or gated_delta, "
                         f"got {rule!r}")  # fmt: skip
    hq, hkv = int(node.attr("q_num_heads")), int(node.attr("kv_num_heads"))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        node.unsupported(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != decay.present or delta != beta.present:
        node.unsupported(f"update_rule {rule!r} needs decay {'given' if gated else 'absent'} "
                         f"and beta {'given' if delta else 'absent'}")
    scale = float(node.attr("scale", 0.0))
    qe = q.expr
    scale_expr = repr(scale) if scale else f"({qe}.shape[2] // {hq}) ** -0.5"
    q4, k4, v4, s, outs = (node.tmp(n) for n in ("q4", "k4", "v4", "state", "steps"))
    step, kt, vt, g4, b4 = (node.tmp(n) for n in ("step", "k_t", "v_t", "decay4", "beta4"))
    read = node.tmp("read")
    lines = [f"{q4} = {_heads(qe, hq)}", f"{k4} = {_heads(k.expr, hkv)}",
             f"{v4} = {_heads(v.expr, hkv)}"]  # fmt: skip
    if gated:
        # decay's last dim is H_kv (one rate per head) or H_kv * d_k (one per key channel).
        lines.append(f"{g4} = {_heads(decay.expr, hkv)}.exp()")
    if delta:
        b = beta.expr
        lines.append(f'{b4} = {b}.cast("f32").reshape([{b}.shape[0], {b}.shape[1], -1, 1])'
                     f".swap_dims(1, 2)")
    if past.present:
        lines.append(f'{s} = {past.expr}.cast("f32")')
    else:
        lines.append(f"{s} = Tensor.zeros([{qe}.shape[0], {hkv}, {q4}.shape[3], {v4}.shape[3]], "
                     f'{qe}.device, "f32")')
    lines += [f"{outs} = []", f"for {step} in range({qe}.shape[1]):",
              f"    {kt} = {k4}.narrow(2, {step}, 1)", f"    {vt} = {v4}.narrow(2, {step}, 1)"]
    if gated:
        lines.append(f"    {s} = {s} * {g4}.narrow(2, {step}, 1).swap_dims(2, 3)")
    if delta:
        lines.append(f"    {vt} = {b4}.narrow(2, {step}, 1) * ({vt} - {kt}.matmul({s}))")
    lines.append(f"    {s} = {s} + {kt}.swap_dims(2, 3).matmul({vt})")
    if hq == hkv:
        lines.append(f"    {read} = {s}")
    else:
        lines.append(f"    {read} = {s}.unsqueeze_dim(2).repeat_dim(2, {hq // hkv})"
                     f".reshape([{s}.shape[0], {hq}, {s}.shape[2], {s}.shape[3]])")
    lines += [
        f"    {outs}.append({q4}.narrow(2, {step}, 1).matmul({read}) * {scale_expr})",
        f"{node.outputs[0]} = Tensor.cat({outs}, 2).swap_dims(1, 2).reshape([{qe}.shape[0], "
        f"{qe}.shape[1], -1]).cast({qe}.dtype)",
    ]
    if node.output_used(1):
        like = past.expr if past.present else qe
        lines.append(f"{node.outputs[1]} = {s}.cast({like}.dtype)")
    return lines
