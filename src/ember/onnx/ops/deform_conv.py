"""DeformConv: 2-d convolution whose kernel taps sample the input at learned offsets."""

from __future__ import annotations

from ember.onnx.context import NodeContext
from ember.onnx.registry import converter


@converter("DeformConv", since=19,
           attrs=("dilations", "group", "kernel_shape", "offset_group", "pads", "strides"),
           limits="2-d inputs only")  # fmt: skip
def deform_conv(node: NodeContext) -> list[str]:
    """Each kernel tap of each output position reads the input bilinearly (zero outside) at
    its regular position plus its offset, scaled by the mask (ones when absent); the
    sampled ``[N, C * kh * kw, oh * ow]`` columns then meet the weights in one grouped
    matrix product. Offsets are ``[N, offset_group * kh * kw * 2, oh, ow]`` with (y, x)
    pairs; the output's spatial size is the offsets'."""
    x, w, offset, bias, mask = (node.input(i) for i in range(5))
    w_shape = w.shape
    if x.rank != 4 or w_shape is None or len(w_shape) != 4 or \
            not all(isinstance(d, int) for d in w_shape):
        node.unsupported("only 2-d inputs ([N, C, H, W]) with a weight of known shape")
    kh, kw = [int(k) for k in node.attr("kernel_shape", w_shape[2:])]
    sh, sw = [int(s) for s in node.attr("strides", [1, 1])]
    dh, dw = [int(d) for d in node.attr("dilations", [1, 1])]
    pt, pl = [int(p) for p in node.attr("pads", [0, 0, 0, 0])][:2]
    group, og = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    xe, oe = x.expr, offset.expr
    n, c, h, wd, oh, ow = (node.tmp(v) for v in ("n", "c", "h", "w", "oh", "ow"))
    off, py, px, y0, x0, fy, fx = (node.tmp(v) for v in ("off", "py", "px", "y0", "x0", "fy",
                                                         "fx"))  # fmt: skip
    xg, cols, dy, dx, yy, xx, weight, idx, m = (
        node.tmp(v) for v in ("xg", "cols", "dy", "dx", "yy", "xx", "weight", "idx", "mask"))
    dev = f"device={xe}.device"
    taps = kh * kw
    lines = [
        f"{n}, {c}, {h}, {wd} = {xe}.shape",
        f"{oh}, {ow} = {oe}.shape[2], {oe}.shape[3]",
        f"{off} = {oe}.cast({xe}.dtype).reshape([{n}, {og}, {kh}, {kw}, 2, {oh}, {ow}])",
        # Regular positions: output row i, tap a -> i * stride - pad + a * dilation.
        f"{py} = {off}.narrow(4, 0, 1).squeeze(4) + (Tensor.arange({oh}, {dev}) * {sh} - {pt})"
        f".reshape([1, 1, 1, 1, -1, 1]).cast({xe}.dtype) + (Tensor.arange({kh}, {dev}) * {dh})"
        f".reshape([1, 1, -1, 1, 1, 1]).cast({xe}.dtype)",
        f"{px} = {off}.narrow(4, 1, 1).squeeze(4) + (Tensor.arange({ow}, {dev}) * {sw} - {pl})"
        f".reshape([1, 1, 1, 1, 1, -1]).cast({xe}.dtype) + (Tensor.arange({kw}, {dev}) * {dw})"
        f".reshape([1, 1, 1, -1, 1, 1]).cast({xe}.dtype)",
        f"{y0}, {x0} = {py}.floor(), {px}.floor()",
        f"{fy}, {fx} = {py} - {y0}, {px} - {x0}",
        f"{xg} = {xe}.reshape([{n}, {og}, {c} // {og}, {h} * {wd}])",
        f"{cols} = None",
        f"for {dy}, {dx} in ((0, 0), (0, 1), (1, 0), (1, 1)):",
        f"    {yy}, {xx} = {y0} + {dy}, {x0} + {dx}",
        f"    {weight} = ({fy} if {dy} else 1.0 - {fy}) * ({fx} if {dx} else 1.0 - {fx})",
        # Corners outside the input read zero.
        f"    {weight} = {weight}.mask_fill({yy}.lower(0).bool_or({yy}.greater({h} - 1))"
        f".bool_or({xx}.lower(0)).bool_or({xx}.greater({wd} - 1)), 0.0)",
        f"    {idx} = ({yy}.clamp(0, {h} - 1) * {wd} + {xx}.clamp(0, {wd} - 1)).int()"
        f".reshape([{n}, {og}, 1, -1]).repeat_dim(2, {c} // {og})",
        f"    {m} = {xg}.gather(3, {idx}) * {weight}.reshape([{n}, {og}, 1, -1])",
        f"    {cols} = {m} if {cols} is None else {cols} + {m}",
    ]
    if mask.present:
        lines.append(f"{cols} = {cols} * {mask.expr}.cast({xe}.dtype)"
                     f".reshape([{n}, {og}, 1, -1])")
    out = node.outputs[0]
    lines += [
        # [N, C, taps * P] -> [N, group, C / group * taps, P], matching the weight's layout.
        f"{cols} = {cols}.reshape([{n}, {group}, -1, {taps}, {oh} * {ow}])"
        f".reshape([{n}, {group}, -1, {oh} * {ow}])",
        f"{out} = {w.expr}.cast({xe}.dtype).reshape([{group}, {w_shape[0] // group}, -1])"
        f".unsqueeze_dim(0).matmul({cols}).reshape([{n}, -1, {oh}, {ow}])",
    ]
    if bias.present:
        lines.append(f"{out} = {out} + {bias.expr}.cast({xe}.dtype).reshape([1, -1, 1, 1])")
    return lines
