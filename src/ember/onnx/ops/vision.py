"""Vision ops: GridSample and AffineGrid.

GridSample gathers: for each output point and each spatial dim the interpolation taps
(1 nearest, 2 linear, 4 cubic) get an index and a weight; the taps of all dims combine by
broadcasting into flat indices into the input's flattened spatial dims, one ``gather``
reads them all, and a weighted sum over the taps gives the output.
"""

from __future__ import annotations

import math

from ember.onnx.context import NodeContext
from ember.onnx.ops.math import number
from ember.onnx.registry import converter

# Keys' cubic convolution kernel with a = -0.75, as PyTorch and ONNX use for GridSample:
# the weights of the taps at -1, 0, 1, 2 for a fractional offset t.
_CUBIC_A = -0.75


def _cubic_weights(t: str) -> list[str]:
    a = _CUBIC_A
    far = f"(({a} * ({{u}}) - {5 * a}) * ({{u}}) + {8 * a}) * ({{u}}) - {4 * a}"
    near = f"(({a + 2} * ({{u}}) - {a + 3}) * ({{u}}) * ({{u}}) + 1.0)"
    return [far.format(u=f"{t} + 1.0"), near.format(u=t), near.format(u=f"1.0 - {t}"),
            far.format(u=f"2.0 - {t}")]  # fmt: skip


def _reflect(node: NodeContext, v: str, low: float, high: float) -> list[str]:
    """Lines that reflect ``v`` at the borders ``low`` and ``high`` (as often as needed)
    until it lies between them; values inside are kept."""
    width = high - low
    if width <= 0:
        return [f"{v} = {v}.clamp({number(low)}, {number(high)})"]
    out, turns, rest, near_low = (node.tmp("out"), node.tmp("turns"), node.tmp("rest"),
                                  node.tmp("near_low"))  # fmt: skip
    lo, hi = number(low), number(high)
    return [
        f"{out} = (-{v} + {lo}).max_pair({v} - {hi})",
        f"{turns} = ({out} / {number(width)}).floor()",
        f"{rest} = {out} - {turns} * {number(width)}",
        # An even number of turns leaves the point near the border it crossed.
        f"{near_low} = {v}.lower({lo}).bool_xor({turns}.remainder(2.0).equal(1.0))",
        f"{v} = {v}.mask_where({out}.greater(0.0), ({rest} + {lo}).mask_where("
        f"{near_low}.bool_not(), -{rest} + {hi}))",
    ]


@converter("GridSample", since=16, attrs=("align_corners", "mode", "padding_mode"))
def grid_sample(node: NodeContext) -> list[str]:
    """Samples ``X [N, C, *in]`` at ``grid [N, *out, d]`` (normalized coordinates in
    ``[-1, 1]``, the last dim listing x, y, ... i.e. the spatial dims in reverse), following
    the ONNX reference: points outside are clamped (``border``) or reflected
    (``reflection``) before interpolation, taps outside read 0 (``zeros``) or are clamped
    or reflected the same way; ``nearest`` rounds half to even. Cubic sampling with
    ``border`` clamps the taps only, as onnxruntime and PyTorch do (the ONNX reference
    also clamps the point first)."""
    x, grid = node.input(0), node.input(1)
    mode = node.attr("mode", "bilinear" if node.opset < 20 else "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = node.attr("padding_mode", "zeros")
    corners = bool(node.attr("align_corners", 0))
    if mode not in ("linear", "nearest", "cubic"):
        node.unsupported(f"mode {mode!r} is not one of linear, nearest, cubic")
    if padding not in ("zeros", "border", "reflection"):
        node.unsupported(f"padding_mode {padding!r} is not one of zeros, border, reflection")
    shape = x.shape
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape[2:]):
        node.unsupported("the spatial dims of X must be known at import time")
    sizes = list(shape[2:])
    dims = len(sizes)
    offsets = {"nearest": [0], "linear": [0, 1], "cubic": [-1, 0, 1, 2]}[mode]
    taps = len(offsets)
    g = grid.expr
    lines: list[str] = []
    flat = weight = ""
    stride = 1
    for i in reversed(range(dims)):
        size = sizes[i]
        low, high = (0.0, size - 1.0) if corners else (-0.5, size - 0.5)
        c, w, idx = node.tmp(f"coord{i}"), node.tmp(f"weight{i}"), node.tmp(f"index{i}")
        # Grid's last dim lists x (the last spatial dim) first.
        lines.append(f"{c} = {g}.narrow(-1, {dims - 1 - i}, 1).squeeze(-1)")
        if corners:
            lines.append(f"{c} = ({c} + 1.0) * {number((size - 1) / 2)}")
        else:
            lines.append(f"{c} = (({c} + 1.0) * {size} - 1.0) * 0.5")
        if mode == "nearest":
            lines.append(f"{c} = {c}.round()")
        if padding == "border" and mode != "cubic":
            lines.append(f"{c} = {c}.mask_where({c}.lower({number(low)}).bool_or({c}.greater("
                         f"{number(high)})), {c}.clamp(0.0, {number(size - 1.0)}))")
        elif padding == "reflection":
            lines += _reflect(node, c, low, high)
        if mode == "nearest":
            lines += [f"{idx} = {c}.trunc().unsqueeze_dim(-1)",
                      f"{w} = {idx}.ones_like()"]  # fmt: skip
        else:
            base, t = node.tmp("base"), node.tmp("t")
            lines += [f"{base} = {c}.floor()", f"{t} = {c} - {base}",
                      f"{idx} = Tensor.stack([{', '.join(f'{base} + {number(float(o))}' for o in offsets)}], -1)"]  # fmt: skip
            weights = [f"1.0 - {t}", t] if mode == "linear" else _cubic_weights(t)
            lines.append(f"{w} = Tensor.stack([{', '.join(weights)}], -1)")
        top = number(size - 1.0)
        if padding == "zeros":
            lines += [f"{w} = {w}.mask_fill({idx}.lower(0.0).bool_or({idx}.greater({top})), 0.0)",
                      f"{idx} = {idx}.clamp(0.0, {top})"]  # fmt: skip
        elif padding == "border":
            lines.append(f"{idx} = {idx}.clamp(0.0, {top})")
        else:
            lines += _reflect(node, idx, low, high)
            lines.append(f"{idx} = {idx}.trunc().clamp(0.0, {top})")
        # The taps of dim i take their own axis among the trailing tap axes.
        if dims > 1:
            axes = ["1"] * dims
            axes[i] = str(taps)
            spread = ", ".join(axes)
            lines += [f"{v} = {v}.reshape([*{v}.shape[:-1], {spread}])" for v in (idx, w)]
        term = idx if stride == 1 else f"{idx} * {stride}"
        flat = term if not flat else f"{flat} + {term}"
        weight = w if not weight else f"{weight} * {w}"
        stride *= size
    points, total, values = node.tmp("points"), node.tmp("weights"), node.tmp("values")
    source = f"{x.expr}.reshape([{x.expr}.shape[0], {x.expr}.shape[1], {math.prod(sizes)}])"
    lines += [
        f"{points} = ({flat}).int().reshape([{g}.shape[0], 1, -1]).repeat_dim(1, {x.expr}.shape[1])",
        f"{total} = ({weight}).reshape([{g}.shape[0], 1, -1])",
        f"{values} = {source}.gather(2, {points}) * {total}",
        f"{node.outputs[0]} = {values}.reshape([*{x.expr}.shape[:2], *{g}.shape[1:-1], "
        f"{taps ** dims}]).sum_dim(-1).squeeze(-1)",
    ]  # fmt: skip
    return lines


@converter("AffineGrid", since=20, attrs=("align_corners",))
def affine_grid(node: NodeContext) -> list[str]:
    """The sampling grid ``[N, *spatial, d]`` of the affine maps ``theta [N, d, d + 1]``:
    each output point's normalized coordinates (x first) with a trailing 1, times
    ``theta`` transposed. ``size`` is ``[N, C, *spatial]``."""
    theta, size = node.input(0), node.input(1)
    corners = bool(node.attr("align_corners", 0))
    lines: list[str] = []
    if size.is_const:
        sizes: list[int | str] = [int(d) for d in size.ints()]
    else:
        if size.static_shape is None or len(size.static_shape) != 1:
            node.unsupported("size must be a 1-d tensor of known length")
        dims = node.tmp("dims")
        lines.append(f"{dims} = rt.ints({size.expr})")
        sizes = [f"{dims}[{i}]" for i in range(size.static_shape[0])]
    spatial = sizes[2:]
    rank = len(spatial)
    if rank not in (2, 3):
        node.unsupported(f"size must list 2 or 3 spatial dims, got {rank}")
    t = theta.expr
    axes = []
    for i, n in enumerate(spatial):
        a = node.tmp("axis")
        ramp = f"Tensor.arange({n}, device={t}.device).cast({t}.dtype)"
        if corners:
            step = f"2.0 / max({n} - 1, 1)" if isinstance(n, str) else number(2.0 / max(n - 1, 1))
            lines.append(f"{a} = {ramp} * {step} - 1.0")
        else:
            lines.append(f"{a} = ({ramp} * 2.0 + 1.0) / {n} - 1.0")
        shape = ["1"] * rank
        shape[i] = "-1"
        lines.append(f"{a} = {a}.reshape([{', '.join(shape)}]).expand([{', '.join(map(str, spatial))}])")
        axes.append(a)
    base = node.tmp("base")
    ones = f"{axes[0]}.ones_like()"
    lines += [
        f"{base} = Tensor.stack([{', '.join(axes[::-1])}, {ones}], -1).reshape([-1, {rank + 1}])",
        f"{node.outputs[0]} = {base}.unsqueeze_dim(0).matmul({t}.swap_dims(1, 2)).reshape("
        f"[{t}.shape[0], {', '.join(map(str, spatial))}, {rank}])",
    ]  # fmt: skip
    return lines
