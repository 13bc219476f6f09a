"""Convolutions: Conv and ConvTranspose, as ember ``Conv*d`` / ``ConvTranspose*d`` layers
when the weights are constants, else the functional ops of ``ember.tensor.module``.

ONNX pads each spatial dim by its own ``(begin, end)``; ember's convolutions pad both
ends alike. The common part goes to the convolution, and what one end has beyond the
other is padded onto the input first (Conv) or trimmed from the output (ConvTranspose).
The window helpers here (kernel, strides, dilations, pads with ``auto_pad``) serve the
pooling converters as well. A convolution whose rank, kernel or SAME padding is only known
when the model runs becomes ``rt.conv``, which reads them from the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.onnx.context import NodeContext, Value
from ember.onnx.registry import converter
from ember.tensor import DType

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_CONV_IMPORTS = ("from ember.nn.conv import Conv{n}d, Conv{n}dConfig, PaddingConfig",)
_TRANSPOSE_IMPORTS = ("from ember.nn.conv_transpose import ConvTranspose{n}d, "
                      "ConvTranspose{n}dConfig",)  # fmt: skip


def known_rank(node: NodeContext, x: Value, w: Value | None = None) -> int | None:
    """The rank of ``x`` (``[N, C, *spatial]``) at import time: its own, else that of the
    node's ``kernel_shape`` or of the weight ``w``, which the input's must match."""
    if x.rank is not None:
        return x.rank
    kernel = node.attr("kernel_shape", None)
    if kernel is not None:
        return len(kernel) + 2
    return w.rank if w is not None else None


def spatial_rank(node: NodeContext, x: Value, w: Value | None = None) -> int:
    """The number of spatial dims of ``x`` (``[N, C, *spatial]``), see :func:`known_rank`."""
    rank = known_rank(node, x, w)
    if rank is None:
        node.unsupported("the input's rank must be known at import time; run ONNX shape "
                         "inference or give the input a static rank")
    if rank < 3:
        node.unsupported(f"the input needs at least one spatial dim ([N, C, ...]), got rank "
                         f"{rank}")
    return rank - 2


def spatial_sizes(x: Value) -> list[int] | None:
    """The spatial dims of ``x`` when known at import time (the batch may be dynamic)."""
    shape = x.shape
    if shape is None or not all(isinstance(d, int) for d in shape[2:]):
        return None
    return [int(d) for d in shape[2:]]


def window(node: NodeContext, x: Value, kernel: Sequence[int]) -> tuple[list[int], list[int],
                                                                          list[int], list[int]]:
    """``(strides, dilations, pads_begin, pads_end)`` of a sliding-window node.

    ``auto_pad`` SAME_UPPER / SAME_LOWER pad so that the output has ``ceil(in / stride)``
    positions, the odd one at the end (UPPER) or at the start (LOWER); they need the
    input's spatial dims at import time.
    """
    n = len(kernel)
    strides = [int(s) for s in node.attr("strides", [1] * n)]
    dilations = [int(d) for d in node.attr("dilations", [1] * n)]
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        pads = [int(p) for p in node.attr("pads", [0] * (2 * n))]
        return strides, dilations, pads[:n], pads[n:]
    if auto_pad == "VALID":
        return strides, dilations, [0] * n, [0] * n
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        node.unsupported(f"auto_pad {auto_pad!r} is not an ONNX padding mode")
    sizes = spatial_sizes(x)
    if sizes is None:
        node.unsupported(f"auto_pad {auto_pad} needs the input's spatial dims at import time")
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return strides, dilations, begin, end


def pad_args(begin: Sequence[int], end: Sequence[int]) -> list[int]:
    """ONNX's per-dim ``(begin, end)`` pads in ``Tensor.pad``'s order (last dim first)."""
    return [v for b, e in zip(reversed(begin), reversed(end)) for v in (b, e)]


def _value(v: Sequence[int]) -> int | tuple[int, ...]:
    """A config value: an int for one spatial dim, a tuple for more."""
    return int(v[0]) if len(v) == 1 else tuple(int(i) for i in v)


def _is_weight(w: Value, b: Value) -> bool:
    """Constant f32 weights (and bias): what ember's conv layers (f32 by default) hold."""
    return (w.const is not None and w.dtype is DType.F32
            and (not b.present or (b.const is not None and b.dtype is DType.F32)))  # fmt: skip


# ---------------------------------------------------------------------------------- Conv
_AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def _conv_at_run_time(node: NodeContext, x: Value, w: Value, b: Value) -> str:
    """``rt.conv``: the convolution whose rank, kernel or SAME padding is read from the
    tensors when the model runs."""
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in _AUTO_PADS:
        node.unsupported(f"auto_pad {auto_pad!r} is not an ONNX padding mode")
    options = [f"{name}={[int(v) for v in node.attr(name)]}"
               for name in ("strides", "pads", "dilations") if node.attr(name, None)]
    if int(node.attr("group", 1)) != 1:
        options.append(f"group={int(node.attr('group'))}")
    if auto_pad != "NOTSET":
        options.append(f"auto_pad={auto_pad!r}")
    bias = b.expr if b.present else "None"
    return f"{node.outputs[0]} = rt.conv({', '.join([x.expr, w.expr, bias, *options])})"


@converter("Conv", since=1, attrs=_CONV_ATTRS)
def conv(node: NodeContext) -> str:
    x, w, b = node.input(0), node.input(1), node.input(2)
    rank = known_rank(node, x, w)
    kernel_known = w.shape is not None and all(isinstance(d, int) for d in w.shape[2:])
    same = node.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER")
    if rank is None or not kernel_known or (same and spatial_sizes(x) is None):
        return _conv_at_run_time(node, x, w, b)
    n = spatial_rank(node, x, w)
    if n > 3:
        node.unsupported(f"ember has 1-d, 2-d and 3-d convolutions, not {n}-d")
    kernel = [int(k) for k in node.attr("kernel_shape", w.shape[2:])]
    group = int(node.attr("group", 1))
    strides, dilations, begin, end = window(node, x, kernel)
    common = [min(bg, e) for bg, e in zip(begin, end)]
    extra = pad_args([bg - c for bg, c in zip(begin, common)],
                     [e - c for e, c in zip(end, common)])  # fmt: skip
    source = f"{x.expr}.pad({extra})" if any(extra) else x.expr
    y = node.outputs[0]
    if _is_weight(w, b):
        weight = w.const.astype(np.float32)
        c_out, c_in = weight.shape[0], weight.shape[1] * group
        channels = (f"channels_in={c_in}, channels_out={c_out}" if n == 1
                    else f"channels=({c_in}, {c_out})")  # fmt: skip
        args = [channels, f"kernel_size={_value(kernel)}"]
        if any(s != 1 for s in strides):
            args.append(f"stride={_value(strides)}")
        if any(d != 1 for d in dilations):
            args.append(f"dilation={_value(dilations)}")
        if group != 1:
            args.append(f"groups={group}")
        if any(common):
            sizes = common[:1] if len(set(common)) == 1 else common
            args.append(f"padding=PaddingConfig.Explicit({', '.join(map(str, sizes))})")
        params = {"weight": weight}
        if b.present:
            params["bias"] = b.const.astype(np.float32)
        else:
            args.append("bias=False")
        layer = node.layer(node.name, f"Conv{n}d", f"Conv{n}dConfig({', '.join(args)}).init(device)",
                           params, [line.format(n=n) for line in _CONV_IMPORTS])  # fmt: skip
        return f"{y} = {layer}({source})"
    bias = b.expr if b.present else "None"
    return (f"{y} = F.conv{n}d({source}, {w.expr}, {bias}, {strides}, {common}, {dilations}, "
            f"{group})")


# ------------------------------------------------------------------------- ConvTranspose
def _transpose_pads(node: NodeContext, x: Value, kernel: list[int], strides: list[int],
                    dilations: list[int], output_padding: list[int]) -> tuple[list[int], list[int]]:  # fmt: skip
    """``(begin, end)``: what to trim from each end of the full transposed output
    (negative: zeros to add). ``output_shape`` and SAME ``auto_pad`` fix the output size
    and put the odd one of the trimmed amount at the start (SAME_UPPER: at the end)."""
    n = len(kernel)
    auto_pad = node.attr("auto_pad", "NOTSET")
    output_shape = node.attr("output_shape", None)
    if output_shape is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        if auto_pad == "VALID":
            return [0] * n, [-p for p in output_padding]
        pads = [int(p) for p in node.attr("pads", [0] * (2 * n))]
        return pads[:n], [e - p for e, p in zip(pads[n:], output_padding)]
    sizes = spatial_sizes(x)
    if sizes is None:
        node.unsupported("output_shape or auto_pad SAME needs the input's spatial dims at "
                         "import time")
    wanted = ([int(v) for v in output_shape][-n:] if output_shape is not None
              else [size * s for size, s in zip(sizes, strides)])  # fmt: skip
    begin, end = [], []
    for size, k, s, d, op, out in zip(sizes, kernel, strides, dilations, output_padding,
                                      wanted):  # fmt: skip
        total = s * (size - 1) + op + (k - 1) * d + 1 - out
        small, large = total // 2, total - total // 2
        # Trimmed from the full output (which lacks output_padding's extra end).
        first, last = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        begin.append(first)
        end.append(last - op)
    return begin, end


def _trim(expr: str, begin: Sequence[int], end: Sequence[int], sizes: Sequence[int]) -> str:
    """``expr`` (spatial ``sizes``) with ``begin`` / ``end`` cut from the ends of each
    dim; a negative amount adds that many zeros instead."""
    add_b, add_e = [max(-v, 0) for v in begin], [max(-v, 0) for v in end]
    if any(add_b) or any(add_e):
        expr = f"{expr}.pad({pad_args(add_b, add_e)})"
    grown = [size + ab + ae for size, ab, ae in zip(sizes, add_b, add_e)]
    ranges = [(max(b, 0), size - max(e, 0)) for b, e, size in zip(begin, end, grown)]
    if any(r != (0, size) for r, size in zip(ranges, grown)):
        expr = f"{expr}.slice([None, None, {', '.join(f'({a}, {z})' for a, z in ranges)}])"
    return expr


@converter("ConvTranspose", since=1, attrs=(*_CONV_ATTRS, "output_padding", "output_shape"))
def conv_transpose(node: NodeContext) -> str:
    """``y`` is the full transposed convolution (size ``s * (in - 1) + d * (k - 1) + 1``)
    with ``pads`` trimmed from its ends and ``output_padding`` added at the end."""
    x, w, b = node.input(0), node.input(1), node.input(2)
    n = spatial_rank(node, x, w)
    if n > 3:
        node.unsupported(f"ember has 1-d, 2-d and 3-d transposed convolutions, not {n}-d")
    if w.shape is None or not all(isinstance(d, int) for d in w.shape[2:]):
        node.unsupported("the weight's kernel dims must be known at import time")
    kernel = [int(k) for k in node.attr("kernel_shape", w.shape[2:])]
    group = int(node.attr("group", 1))
    strides = [int(s) for s in node.attr("strides", [1] * n)]
    dilations = [int(d) for d in node.attr("dilations", [1] * n)]
    output_padding = [int(p) for p in node.attr("output_padding", [0] * n)]
    begin, end = _transpose_pads(node, x, kernel, strides, dilations, output_padding)
    # ember's ops trim `padding` from both ends and add `padding_out` (< stride or dilation)
    # at the end; pads of that form need no further trimming.
    common = [max(min(bg, e), 0) for bg, e in zip(begin, end)]
    padding_out = [max(common[i] - end[i], 0) for i in range(n)]
    if any(op >= max(s, d) for op, s, d in zip(padding_out, strides, dilations)):
        common, padding_out = [0] * n, [0] * n
    rest_b = [bg - c for bg, c in zip(begin, common)]
    rest_e = [e - c + op for e, c, op in zip(end, common, padding_out)]
    y = node.outputs[0]
    growing = any(v < 0 for v in [*rest_b, *rest_e])
    if _is_weight(w, b) and not growing:
        weight = w.const.astype(np.float32)
        c_in, c_out = weight.shape[0], weight.shape[1] * group
        args = [f"channels=({c_in}, {c_out})", f"kernel_size={_value(kernel)}"]
        for name, values, default in (("stride", strides, 1), ("dilation", dilations, 1),
                                      ("padding", common, 0), ("padding_out", padding_out, 0)):
            if any(v != default for v in values):
                args.append(f"{name}={_value(values)}")
        if group != 1:
            args.append(f"groups={group}")
        params = {"weight": weight}
        if b.present:
            params["bias"] = b.const.astype(np.float32)
        else:
            args.append("bias=False")
        layer = node.layer(node.name, f"ConvTranspose{n}d",
                           f"ConvTranspose{n}dConfig({', '.join(args)}).init(device)", params,
                           [line.format(n=n) for line in _TRANSPOSE_IMPORTS])  # fmt: skip
        out = f"{layer}({x.expr})"
    else:
        # Zeros added around the output must not get the bias: it is added after.
        bias = "None" if growing or not b.present else b.expr
        out = (f"F.conv_transpose{n}d({x.expr}, {w.expr}, {bias}, {strides}, {common}, "
               f"{padding_out}, {dilations}, {group})")
    if any(rest_b) or any(rest_e):
        sizes = spatial_sizes(x)
        if sizes is None:
            node.unsupported("these pads need the input's spatial dims at import time")
        full = [s * (size - 1) + d * (k - 1) + 1 - 2 * c + op for size, s, d, k, c, op in
                zip(sizes, strides, dilations, kernel, common, padding_out)]  # fmt: skip
        out = _trim(out, rest_b, rest_e, full)
    lines = [f"{y} = {out}"]
    if growing and b.present:
        lines.append(f"{y} = {y} + {b.expr}.reshape([1, -1{', 1' * n}])")
    return lines

