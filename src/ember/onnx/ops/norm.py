"""Normalizations: BatchNormalization, LayerNormalization, RMSNormalization,
InstanceNormalization, GroupNormalization, LpNormalization, MeanVarianceNormalization, LRN.

With constant f32 scales and shifts and a layout an ember layer has (``BatchNorm``,
``LayerNorm`` and ``RmsNorm`` over the last dim, ``InstanceNorm``, ``GroupNorm``), the
node becomes that layer; otherwise it is written out with tensor ops. The layers follow
the device as ember's layers do: ``BatchNorm`` uses its running statistics at inference
and the batch's on an autodiff device (fine-tuning), as in ember and Burn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.onnx.context import NodeContext, Value
from ember.onnx.registry import converter
from ember.tensor import DType

_NORM_IMPORTS = "from ember.nn.norm import {layer}, {layer}Config"


def _consts(*values: Value) -> list[np.ndarray] | None:
    """The f32 constants of ``values`` (absent ones as None), or None if one is not."""
    out = []
    for v in values:
        if not v.present:
            out.append(None)
        elif v.const is None or v.dtype is not DType.F32:
            return None
        else:
            out.append(v.const.astype(np.float32))
    return out


def _per_channel(expr: str, x: Value) -> str:
    """A ``[C]`` vector shaped to broadcast along dim 1 of ``x`` (of any rank)."""
    if x.rank is None:
        return f"rt.per_channel({expr}, {x.expr})"
    return f"{expr}.reshape([1, -1{', 1' * (x.rank - 2)}])"


def _eps(node: NodeContext, default: float = 1e-5) -> float:
    return float(node.attr("epsilon", default))


# ------------------------------------------------------------------------ BatchNormalization
def _batch_norm_layer(node: NodeContext, x: Value, stats: list[np.ndarray],
                      momentum: float) -> str:  # fmt: skip
    scale, bias, mean, var = stats
    build = (f"BatchNormConfig({scale.shape[0]}, epsilon={_eps(node)!r}, "
             f"momentum={round(1 - momentum, 7)!r}).init(device)")
    params = {"gamma": scale, "beta": bias, "running_mean": mean, "running_var": var}
    layer = node.layer(node.name, "BatchNorm", build, params,
                       (_NORM_IMPORTS.format(layer="BatchNorm"),))
    return f"{node.outputs[0]} = {layer}({x.expr})"


def _batch_norm_inference(node: NodeContext, momentum: float) -> str:
    """``(x - mean) / sqrt(var + epsilon) * scale + bias`` with the given statistics."""
    x, s, b, mean, var = (node.input(i) for i in range(5))
    if any(node.output_used(i) for i in range(1, len(node.outputs))):
        node.unsupported("the training outputs of BatchNormalization before opset 14 (mean, "
                         "var, saved_mean, saved_var) are not supported")
    stats = _consts(s, b, mean, var)
    if stats is not None and x.dtype is DType.F32:
        return _batch_norm_layer(node, x, stats, momentum)
    inv = f"({_per_channel(var.expr, x)} + {_eps(node)!r}).rsqrt()"
    return (f"{node.outputs[0]} = ({x.expr} - {_per_channel(mean.expr, x)}) * {inv} * "
            f"{_per_channel(s.expr, x)} + {_per_channel(b.expr, x)}")


@converter("BatchNormalization", since=1,
           attrs=("consumed_inputs", "epsilon", "is_test", "momentum", "spatial"),
           limits="the training outputs of opsets before 14 are not supported")  # fmt: skip
def batch_norm_legacy(node: NodeContext) -> str:
    if not node.attr("spatial", 1):
        node.unsupported("spatial=0 (statistics per element rather than per channel) is not "
                         "supported")
    return _batch_norm_inference(node, float(node.attr("momentum", 0.9)))


@converter("BatchNormalization", since=14, attrs=("epsilon", "momentum", "training_mode"),
           limits="training_mode=1 returns the updated running statistics as outputs; the "
                  "generated model does not keep them between calls")
def batch_norm(node: NodeContext) -> str | list[str]:
    """Inference uses the given statistics; ``training_mode=1`` the batch's (biased
    variance), with the updated running statistics as outputs 1 and 2."""
    momentum = float(node.attr("momentum", 0.9))
    if not node.attr("training_mode", 0):
        return _batch_norm_inference(node, momentum)
    x, s, b, mean, var = (node.input(i) for i in range(5))

    def statistic(expr: str) -> str:
        """The mean of ``expr`` over every dim but the channels', kept with size 1."""
        if x.rank is None:
            return f"rt.global_pool({expr}.mean_dim(0), 'mean_dim')"
        return expr + "".join(f".mean_dim({d})" for d in (0, *range(2, x.rank)))

    batch_mean, centered, batch_var = node.tmp("batch_mean"), node.tmp("centered"), \
        node.tmp("batch_var")  # fmt: skip
    y = node.outputs[0]
    lines = [
        f"{batch_mean} = {statistic(x.expr)}",
        f"{centered} = {x.expr} - {batch_mean}",
        f"{batch_var} = {statistic(f'({centered} * {centered})')}",
        f"{y} = {centered} * ({batch_var} + {_eps(node)!r}).rsqrt() * "
        f"{_per_channel(s.expr, x)} + {_per_channel(b.expr, x)}",
    ]
    keep = 1 - momentum
    for i, (running, batch) in enumerate(((mean, batch_mean), (var, batch_var)), start=1):
        if i < len(node.outputs):
            lines.append(f"{node.outputs[i]} = {running.expr} * {momentum!r} + "
                         f"{batch}.reshape([-1]) * {keep!r}")
    return lines


# ----------------------------------------------------------------- Layer / RMS normalization
def _leading(x: Value, axis: int) -> str:
    """The dims before ``axis`` as a list expression (literal when the shape is known)."""
    static = x.static_shape
    if static is not None:
        return str(list(static[:axis]))
    return f"[*{x.expr}.shape[:{axis}]]"


def _flatten_from(x: Value, axis: int) -> str:
    """``x`` as ``[*dims before axis, -1]``: the normalized dims joined into the last."""
    lead = _leading(x, axis)
    return f"{x.expr}.reshape({lead[:-1]}{', ' if lead != '[]' else ''}-1])"


def _stat_shape(x: Value, axis: int, rank: int | None) -> str:
    """The shape of the statistics: the dims before ``axis``, then ones (``axis`` is
    negative or ``rank`` known, or the ones are counted when the model runs)."""
    lead = _leading(x, axis)
    if rank is None and axis >= 0:
        return f"{lead[:-1]}{', ' if lead != '[]' else ''}*[1] * ({x.expr}.rank - {axis})]"
    ones = ", ".join(["1"] * (-axis if rank is None else rank - axis))
    return f"{lead[:-1]}{', ' if lead != '[]' else ''}{ones}]"


def _axis(node: NodeContext, x: Value) -> int:
    """The ``axis`` attribute, non-negative when the input's rank is known (Python's
    negative slicing serves the dims from it otherwise)."""
    axis = int(node.attr("axis", -1))
    return axis % x.rank if x.rank is not None else axis


def _last_dim_vector(x: Value, v: Value, const: np.ndarray | None, axis: int,
                     rank: int | None) -> bool:  # fmt: skip
    """Whether ``v`` is a constant ``[D]`` over the last dim, the only normalized one."""
    return (const is not None and rank is not None and axis == rank - 1 and const.ndim == 1
            and x.shape is not None and const.shape[0] == x.shape[-1])  # fmt: skip


@converter("LayerNormalization", since=17, attrs=("axis", "epsilon", "stash_type"))
def layer_norm(node: NodeContext) -> list[str]:
    """Normalizes over the dims from ``axis`` on; outputs 1 and 2 are the mean and the
    inverse standard deviation, shaped ``[*dims before axis, 1, ...]``."""
    x, scale, bias = node.input(0), node.input(1), node.input(2)
    r, axis = x.rank, _axis(node, x)
    consts = _consts(scale, bias)
    stats_used = any(node.output_used(i) for i in (1, 2))
    if (consts is not None and x.dtype is DType.F32 and not stats_used
            and _last_dim_vector(x, scale, consts[0], axis, r)
            and (consts[1] is None or consts[1].shape == consts[0].shape)):  # fmt: skip
        gamma, beta = consts
        params = {"gamma": gamma, "beta": np.zeros_like(gamma) if beta is None else beta}
        layer = node.layer(node.name, "LayerNorm",
                           f"LayerNormConfig({gamma.shape[0]}, epsilon={_eps(node)!r})"
                           ".init(device)", params, (_NORM_IMPORTS.format(layer="LayerNorm"),))
        return [f"{node.outputs[0]} = {layer}({x.expr})"]
    flat, mean, centered, inv = (node.tmp(h) for h in ("flat", "mean", "centered", "inv_std"))
    y = node.outputs[0]
    lines = [
        f"{flat} = {_flatten_from(x, axis)}",
        f"{mean} = {flat}.mean_dim(-1)",
        f"{centered} = {flat} - {mean}",
        f"{inv} = (({centered} * {centered}).mean_dim(-1) + {_eps(node)!r}).rsqrt()",
        f"{y} = ({centered} * {inv}).reshape({x.expr}.shape) * {scale.expr}",
    ]
    if bias.present:
        lines.append(f"{y} = {y} + {bias.expr}")
    for i, stat in ((1, mean), (2, inv)):
        if i < len(node.outputs) and node.outputs[i]:
            lines.append(f"{node.outputs[i]} = {stat}.reshape({_stat_shape(x, axis, r)})")
    return lines


@converter("RMSNormalization", since=23, attrs=("axis", "epsilon", "stash_type"))
def rms_norm(node: NodeContext) -> str | list[str]:
    """``x / sqrt(mean(x^2) + epsilon) * scale`` over the dims from ``axis`` on."""
    x, scale = node.input(0), node.input(1)
    r, axis = x.rank, _axis(node, x)
    consts = _consts(scale)
    if (consts is not None and x.dtype is DType.F32
            and _last_dim_vector(x, scale, consts[0], axis, r)):  # fmt: skip
        gamma = consts[0]
        layer = node.layer(node.name, "RmsNorm",
                           f"RmsNormConfig({gamma.shape[0]}, epsilon={_eps(node)!r}).init(device)",
                           {"gamma": gamma}, (_NORM_IMPORTS.format(layer="RmsNorm"),))
        return f"{node.outputs[0]} = {layer}({x.expr})"
    flat = node.tmp("flat")
    return [
        f"{flat} = {_flatten_from(x, axis)}",
        f"{node.outputs[0]} = ({flat} * (({flat} * {flat}).mean_dim(-1) + {_eps(node)!r})"
        f".rsqrt()).reshape({x.expr}.shape) * {scale.expr}",
    ]


# --------------------------------------------------------------- Instance / group normalization
def _grouped(node: NodeContext, x: Value, groups: str | int, scale: Value, bias: Value,
             per_group: bool) -> list[str]:  # fmt: skip
    """Normalizes ``[N, C, ...]`` over each of ``groups`` channel groups and all other dims;
    the scale and shift apply per group (``per_group``) or per channel."""
    flat, centered = node.tmp("grouped"), node.tmp("centered")
    y = node.outputs[0]
    lines = [
        f"{flat} = {x.expr}.reshape([{x.expr}.shape[0], {groups}, -1])",
        f"{centered} = {flat} - {flat}.mean_dim(2)",
        f"{y} = {centered} * (({centered} * {centered}).mean_dim(2) + {_eps(node)!r}).rsqrt()",
    ]
    if not per_group:
        lines.append(f"{y} = {y}.reshape([{x.expr}.shape[0], {x.expr}.shape[1], -1])")
    lines.append(f"{y} = {y} * {scale.expr}.reshape([1, -1, 1]) + {bias.expr}.reshape([1, -1, 1])")
    lines.append(f"{y} = {y}.reshape({x.expr}.shape)")
    return lines


@converter("InstanceNormalization", since=1, attrs=("consumed_inputs", "epsilon"))
def instance_norm(node: NodeContext) -> str | list[str]:
    x, scale, bias = node.input(0), node.input(1), node.input(2)
    consts = _consts(scale, bias)
    if consts is not None and x.dtype is DType.F32:
        gamma, beta = consts
        layer = node.layer(node.name, "InstanceNorm",
                           f"InstanceNormConfig({gamma.shape[0]}, epsilon={_eps(node)!r})"
                           ".init(device)", {"gamma": gamma, "beta": beta},
                           (_NORM_IMPORTS.format(layer="InstanceNorm"),))  # fmt: skip
        return f"{node.outputs[0]} = {layer}({x.expr})"
    return _grouped(node, x, f"{x.expr}.shape[1]", scale, bias, per_group=False)


def _group_norm(node: NodeContext, per_group: bool) -> str | list[str]:
    x, scale, bias = node.input(0), node.input(1), node.input(2)
    groups = int(node.attr("num_groups"))
    consts = _consts(scale, bias)
    channels = x.shape[1] if x.shape is not None and len(x.shape) > 1 else None
    if consts is not None and x.dtype is DType.F32 and isinstance(channels, int):
        gamma, beta = consts
        if per_group:  # opset 18: one scale per group, the same for each of its channels
            gamma, beta = (np.repeat(v, channels // groups) for v in (gamma, beta))
        layer = node.layer(node.name, "GroupNorm",
                           f"GroupNormConfig({groups}, {channels}, epsilon={_eps(node)!r})"
                           ".init(device)", {"gamma": gamma, "beta": beta},
                           (_NORM_IMPORTS.format(layer="GroupNorm"),))  # fmt: skip
        return f"{node.outputs[0]} = {layer}({x.expr})"
    return _grouped(node, x, groups, scale, bias, per_group)


@converter("GroupNormalization", since=18, attrs=("epsilon", "num_groups"))
def group_norm_v18(node: NodeContext) -> str | list[str]:
    """Opset 18: ``scale`` and ``bias`` have one value per group."""
    return _group_norm(node, per_group=True)


@converter("GroupNormalization", since=21, attrs=("epsilon", "num_groups", "stash_type"))
def group_norm(node: NodeContext) -> str | list[str]:
    """Opset 21: ``scale`` and ``bias`` have one value per channel."""
    return _group_norm(node, per_group=False)


# ---------------------------------------------------------------------- other normalizations
@converter("LpNormalization", since=1, attrs=("axis", "p"))
def lp_norm(node: NodeContext) -> list[str]:
    """``x`` divided by its L1 or L2 norm along ``axis`` (no epsilon, as ONNX); a slice whose
    norm is 0 stays 0 rather than becoming ``0 / 0``."""
    x, axis, p = node.input(0), int(node.attr("axis", -1)), int(node.attr("p", 2))
    if p not in (1, 2):
        node.unsupported(f"p={p}; LpNormalization has p 1 or 2")
    norm = node.tmp("norm")
    total = (f"{x.expr}.abs().sum_dim({axis})" if p == 1
             else f"({x.expr} * {x.expr}).sum_dim({axis}).sqrt()")  # fmt: skip
    return [f"{norm} = {total}",
            f"{node.outputs[0]} = {x.expr} / {norm}.mask_fill({norm}.equal(0), 1)"]  # fmt: skip


def _mean_over(expr: str, axes: Sequence[int]) -> str:
    return expr + "".join(f".mean_dim({a})" for a in axes)


@converter("MeanVarianceNormalization", since=9, attrs=("axes",))
def mean_variance_norm(node: NodeContext) -> list[str]:
    """``(x - mean) / (std + 1e-9)`` over ``axes`` (default ``[0, 2, 3]``), the function
    ONNX defines the op by."""
    x = node.input(0)
    axes = [int(a) for a in node.attr("axes", [0, 2, 3])]
    centered = node.tmp("centered")
    return [
        f"{centered} = {x.expr} - {_mean_over(x.expr, axes)}",
        f"{node.outputs[0]} = {centered} / ({_mean_over(f'({centered} * {centered})', axes)}"
        f".sqrt() + 1e-9)",
    ]


@converter("LRN", since=1, attrs=("alpha", "beta", "bias", "size"))
def lrn(node: NodeContext) -> list[str]:
    """Local response normalization across channels:
    ``x / (bias + alpha / size * sum of x^2 over nearby channels)^beta``."""
    x = node.input(0)
    size = int(node.attr("size"))
    alpha, beta = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    before, after = (size - 1) // 2, size // 2
    # Channels as a spatial dim: the window mean is a (size, 1) average pool over it.
    squares, y = node.tmp("squares"), node.outputs[0]
    return [
        f"{squares} = ({x.expr} * {x.expr}).reshape([{x.expr}.shape[0], 1, "
        f"{x.expr}.shape[1], -1]).pad([0, 0, {before}, {after}])",
        f"{squares} = F.avg_pool2d({squares}, [{size}, 1], 1).reshape({x.expr}.shape)",
        f"{y} = {x.expr} / ({squares} * {alpha!r} + {bias!r}).pow({beta!r})",
    ]
