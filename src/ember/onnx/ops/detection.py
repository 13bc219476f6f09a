"""Ops whose outputs depend on the values: Unique, NonMaxSuppression, TensorScatter,
Col2Im, RoiAlign and MaxRoiPool.

Eager code allows data-dependent shapes, so all of them are tensor ops. Unique compares
every slice with every other (``[n, n, slice size]`` booleans, so memory grows with the
square of the number of slices); the first slice of each equal group is kept, and the
sorted order ranks the kept slices lexicographically (the first differing element
decides). NonMaxSuppression compares every box with every other box of its batch
(``[B, classes, n, n]``). RoiAlign and MaxRoiPool gather their samples from each ROI's image."""

from __future__ import annotations

from ember.onnx.context import NodeContext
from ember.onnx.registry import converter


@converter("Unique", since=11, attrs=("axis", "sorted"))
def unique(node: NodeContext) -> list[str]:
    """The distinct slices along ``axis`` (elements of the flattened input when absent),
    sorted ascending (``sorted=1``, the default) or in order of first occurrence; with
    the index of each one's first occurrence, the inverse map and the counts (all i64)."""
    x = node.input(0)
    axis = node.attr("axis", None)
    ordered = bool(node.attr("sorted", 1))
    rank = x.rank
    if axis is not None and rank is None:
        node.unsupported("Unique with an axis needs the input's rank at import time")
    r, eq, first, keep, n = (node.tmp("rows"), node.tmp("same"), node.tmp("first"),
                             node.tmp("keep"), node.tmp("n"))  # fmt: skip
    lines: list[str] = []
    if axis is None:
        source = node.tmp("flat")
        lines += [f"{source} = {x.expr}.reshape([-1])", f"{r} = {source}.reshape([-1, 1])"]
    else:
        axis = int(axis) % rank
        source = node.tmp("moved")
        lines += [f"{source} = {x.expr}.movedim({axis}, 0)",
                  f"{r} = {source}.reshape([{source}.shape[0], -1])"]  # fmt: skip
    lines += [
        f"{n} = {r}.shape[0]",
        f"{eq} = {r}.unsqueeze_dim(1).equal({r}.unsqueeze_dim(0)).all_dim(2).squeeze(2)",
        # The first equal slice of each slice; the slices that are their own first are kept.
        f"{first} = {eq}.int().argmax(1).squeeze(1)",
        f"{keep} = {first}.equal(Tensor.arange({n}, device={r}.device).cast({first}.dtype))"
        ".argwhere().reshape([-1])",
    ]  # fmt: skip
    if ordered:
        a, b, at, less = node.tmp("a"), node.tmp("b"), node.tmp("at"), node.tmp("less")
        lines += [
            f"{a} = {r}.unsqueeze_dim(1).expand([{n}, {n}, -1])",
            f"{b} = {r}.unsqueeze_dim(0).expand([{n}, {n}, -1])",
            f"{at} = {a}.not_equal({b}).int().argmax(2)",
            f"{less} = {a}.gather(2, {at}).lower({b}.gather(2, {at})).squeeze(2).int()",
            # A kept slice's rank: how many kept slices are less than it.
            f"{keep} = {keep}.select(0, {less}.select(0, {keep}).select(1, {keep}).sum_dim(0)"
            ".reshape([-1]).argsort())",
        ]  # fmt: skip
    out = node.outputs
    y = f"{source}.select(0, {keep})"
    if axis is not None:
        y = f"{y}.movedim(0, {axis})"
    lines.append(f"{out[0]} = {y}")
    if len(out) > 1 and out[1]:
        lines.append(f"{out[1]} = {keep}.cast('i64')")
    if len(out) > 2 and out[2]:
        slot = node.tmp("slot")
        lines += [
            f"{slot} = {first}.zeros_like().scatter(0, {keep}.cast({first}.dtype), "
            f"Tensor.arange({keep}.shape[0], device={r}.device).cast({first}.dtype))",
            f"{out[2]} = {slot}.select(0, {first}).cast('i64')",
        ]  # fmt: skip
    if len(out) > 3 and out[3]:
        lines.append(f"{out[3]} = {eq}.int().sum_dim(1).reshape([-1]).select(0, {keep})"
                     ".cast('i64')")
    return lines


def _scalar(node: NodeContext, index: int, default: str) -> str:
    """A Python number expression of the optional 1-element input ``index``."""
    value = node.input(index)
    if not value.present:
        return default
    if value.const is not None:
        return repr(value.const.reshape(-1)[0].item())
    return f"{value.expr}.sum().item()"


@converter("NonMaxSuppression", since=10, attrs=("center_point_box",))
def non_max_suppression(node: NodeContext) -> list[str]:
    """Greedy per-class suppression: in descending score order (ties: the lower box index
    first), a box above ``score_threshold`` is selected unless its IoU with a selected
    box exceeds ``iou_threshold``; at most ``max_output_boxes_per_class`` per class.

    The greedy rule says a box is kept when no kept box before it overlaps it; repeating
    that rule on all boxes at once from "all kept" settles every box in order, so it
    reaches the greedy selection in at most one round per box (usually a few)."""
    boxes, scores = node.input(0), node.input(1)
    limit = _scalar(node, 2, "0")
    iou_limit = _scalar(node, 3, "0.0")
    center = bool(node.attr("center_point_box", 0))
    b, s = boxes.expr, scores.expr
    t = node.tmp
    y1, x1, y2, x2, area = t("y1"), t("x1"), t("y2"), t("x2"), t("area")
    lines = [f"{c} = {b}.narrow(2, {i}, 1)" for i, c in enumerate((y1, x1, y2, x2))]
    if center:  # [x_center, y_center, width, height]
        lines += [f"{y1}, {x1}, {y2}, {x2} = {x1} - {x2} / 2.0, {y1} - {y2} / 2.0, "
                  f"{x1} + {x2} / 2.0, {y1} + {y2} / 2.0"]  # fmt: skip
    else:  # two corners, in either order
        lines += [f"{y1}, {y2} = {y1}.min_pair({y2}), {y1}.max_pair({y2})",
                  f"{x1}, {x2} = {x1}.min_pair({x2}), {x1}.max_pair({x2})"]  # fmt: skip
    inter, iou, order, n = t("inter"), t("iou"), t("order"), t("n")
    lines += [
        f"{area} = ({y2} - {y1}) * ({x2} - {x1})",
        f"{inter} = ({y2}.min_pair({y2}.swap_dims(1, 2)) - {y1}.max_pair({y1}.swap_dims(1, 2)))"
        f".clamp_min(0.0) * ({x2}.min_pair({x2}.swap_dims(1, 2)) - "
        f"{x1}.max_pair({x1}.swap_dims(1, 2))).clamp_min(0.0)",
        f"{iou} = {inter} / ({area} + {area}.swap_dims(1, 2) - {inter})",
        f"{iou} = {iou}.mask_fill({area}.lower_equal(0.0).bool_or("
        f"{area}.swap_dims(1, 2).lower_equal(0.0)), 0.0)",
        f"{n} = {s}.shape[2]",
        f"{order} = {s}.argsort(2, descending=True)",
    ]  # fmt: skip
    sup, ok, keep, new, step, rows, cols = (t("overlaps"), t("ok"), t("keep"), t("new"),
                                            t("step"), t("rows"), t("cols"))  # fmt: skip
    sorted_scores = f"{s}.gather(2, {order})"
    threshold = _scalar(node, 4, "")
    ok_expr = (f"{sorted_scores}.greater({threshold})" if threshold
               else f"{sorted_scores}.is_nan().bool_not()")
    lines += [
        # IoU of the boxes in each class's score order: rows, then columns, permuted.
        f"{rows} = {order}.unsqueeze_dim(3).expand([-1, -1, -1, {n}])",
        f"{cols} = {order}.unsqueeze_dim(2).expand([-1, -1, {n}, -1])",
        f"{sup} = {iou}.unsqueeze_dim(1).expand([-1, {s}.shape[1], -1, -1]).gather(2, {rows})"
        f".gather(3, {cols}).greater({iou_limit})",
        # Only a box earlier in the order can suppress.
        f"{sup} = {sup}.bool_and(Tensor.arange({n}, device={s}.device).reshape([-1, 1]).greater("
        f"Tensor.arange({n}, device={s}.device).reshape([1, -1])))",
        f"{ok} = {ok_expr}",
        f"{keep} = {ok}",
        f"for {step} in range({n}):",
        f"    {new} = {ok}.bool_and({sup}.bool_and({keep}.unsqueeze_dim(2)).any_dim(3)"
        ".squeeze(3).bool_not())",
        f"    if bool({new}.equal({keep}).all()):",
        "        break",
        f"    {keep} = {new}",
        f"{keep} = {keep}.bool_and({keep}.int().cumsum(2).lower_equal({limit}))",
    ]  # fmt: skip
    at, box = t("at"), t("box")
    lines += [
        f"{at} = {keep}.argwhere()",
        f"{box} = {order}.reshape([-1]).select(0, ({at}.narrow(1, 0, 1) * {s}.shape[1] + "
        f"{at}.narrow(1, 1, 1)).reshape([-1]) * {n} + {at}.narrow(1, 2, 1).reshape([-1]))",
        f"{node.outputs[0]} = Tensor.cat([{at}.narrow(1, 0, 2), {box}.reshape([-1, 1])], 1)"
        ".cast('i64')",
    ]  # fmt: skip
    return lines


@converter("TensorScatter", since=24, attrs=("axis", "mode"))
def tensor_scatter(node: NodeContext) -> list[str]:
    """Writes ``update`` into a copy of ``past_cache`` along ``axis`` (the sequence dim),
    batch ``b`` from position ``write_indices[b]`` (0 when absent) on; ``circular`` wraps
    the positions around the cache's length. Each cache position reads the update step
    that lands on it (one ``gather``) where one does, and keeps its value elsewhere."""
    past, update, write = node.input(0), node.input(1), node.input(2)
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        node.unsupported(f"mode {mode!r} is not one of linear, circular")
    rank = past.rank
    if rank is None:
        node.unsupported("the cache's rank must be known at import time")
    axis = int(node.attr("axis", -2)) % rank
    if axis == 0:
        node.unsupported("axis 0 is the batch dim; the sequence dim must come after it")
    p, u = past.expr, update.expr
    t = node.tmp
    pos, hits, written, source = t("pos"), t("hits"), t("written"), t("source")
    start = (f"{write.expr}.reshape([-1, 1])" if write.present
             else f"Tensor.zeros([{p}.shape[0], 1], {p}.device, 'i64')")
    lines = [f"{pos} = {start} + Tensor.arange({u}.shape[{axis}], device={p}.device)"
             f".reshape([1, -1]).cast({start}.dtype)"]  # fmt: skip
    if mode == "circular":
        lines.append(f"{pos} = {pos} % {p}.shape[{axis}]")
    spread = ", ".join(["-1"] + ["1"] * (axis - 1) + [f"{p}.shape[{axis}]"]
                       + ["1"] * (rank - axis - 1))
    target = (f"[*{u}.shape[:{axis}], {p}.shape[{axis}], *{u}.shape[{axis + 1}:]]")
    lines += [
        f"{hits} = {pos}.unsqueeze_dim(2).equal(Tensor.arange({p}.shape[{axis}], "
        f"device={p}.device).cast({pos}.dtype).reshape([1, 1, -1]))",
        f"{written} = {hits}.any_dim(1).reshape([{spread}]).expand({target})",
        f"{source} = {hits}.int().argmax(1).reshape([{spread}]).expand({target})",
        f"{node.outputs[0]} = {p}.mask_where({written}, {u}.gather({axis}, {source}))",
    ]  # fmt: skip
    return lines


@converter("Col2Im", since=18, attrs=("dilations", "pads", "strides"))
def col2im(node: NodeContext) -> list[str]:
    """Sums sliding blocks ``[N, C * prod(block_shape), L]`` back into an image
    ``[N, C, *image_shape]`` (the inverse layout of an unfold): each block element's
    position in the padded image is computed from the block offset and the block's
    location, one scatter-add writes them all, and the pads are cropped away."""
    x, image, block = node.input(0), node.input(1), node.input(2)
    length = image.static_shape
    if length is None or len(length) != 1:
        node.unsupported("image_shape must be a 1-d tensor of known length")
    dims = length[0]
    strides = list(node.attr("strides", [1] * dims))
    dilations = list(node.attr("dilations", [1] * dims))
    pads = list(node.attr("pads", [0] * (2 * dims)))
    t = node.tmp
    img, blk, flat, rows, out = t("image"), t("block"), t("flat"), t("rows"), t("out")
    v = x.expr
    lines = [f"{img}, {blk} = rt.ints({image.expr}), rt.ints({block.expr})"]
    padded = [f"({img}[{d}] + {pads[d] + pads[d + dims]})" for d in range(dims)]
    for d in range(dims):
        count = (f"({padded[d]} - {dilations[d]} * ({blk}[{d}] - 1) - 1) // {strides[d]} + 1")
        k_axes = ["1"] * (2 * dims)
        k_axes[d] = "-1"
        l_axes = ["1"] * (2 * dims)
        l_axes[dims + d] = "-1"
        pos = (f"Tensor.arange({count}, device={v}.device).reshape([{', '.join(l_axes)}]) * "
               f"{strides[d]} + Tensor.arange({blk}[{d}], device={v}.device).reshape("
               f"[{', '.join(k_axes)}]) * {dilations[d]}")
        lines.append(f"{flat} = {pos}" if d == 0 else f"{flat} = {flat} * {padded[d]} + {pos}")
    total = " * ".join(padded)
    lines += [
        f"{flat} = {flat}.reshape([1, 1, -1])",
        f"{rows} = {v}.reshape([{v}.shape[0], -1, {flat}.shape[2]])",
        f"{out} = Tensor.zeros([{rows}.shape[0], {rows}.shape[1], {total}], {v}.device, "
        f"{v}.dtype).scatter(2, {flat}.expand([{rows}.shape[0], {rows}.shape[1], -1]), {rows})",
        f"{out} = {out}.reshape([{rows}.shape[0], {rows}.shape[1], {', '.join(padded)}])",
    ]  # fmt: skip
    lines += [f"{out} = {out}.narrow({2 + d}, {pads[d]}, {img}[{d}])" for d in range(dims)
              if pads[d] or pads[d + dims]]  # fmt: skip
    lines.append(f"{node.outputs[0]} = {out}")
    return lines


def _roi_axis(node: NodeContext, rois: str, x: str, first: int, size: str, pooled: int,
              ratio: int, half_pixel: bool, scale: float) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """Lines computing, along one image axis, each ROI's sample points ``[R, pooled, G]``
    (``G`` the largest sampling grid): the two interpolation taps' indices and weights
    (0 for a point outside the image), the grid size per ROI and which samples lie in it."""
    t = node.tmp
    start, extent, grid, steps, c, valid, low, high, frac, edge, inside = (
        t("start"), t("extent"), t("grid"), t("steps"), t("coord"), t("valid"), t("low"),
        t("high"), t("frac"), t("edge"), t("inside"))  # fmt: skip
    offset = 0.5 if half_pixel else 0.0
    lines = [
        f"{start} = {rois}.narrow(1, {first}, 1).reshape([-1, 1, 1]) * {scale} - {offset}",
        f"{extent} = {rois}.narrow(1, {first + 2}, 1).reshape([-1, 1, 1]) * {scale} - {offset}"
        f" - {start}",
    ]  # fmt: skip
    if not half_pixel:  # ROIs smaller than a pixel count as one pixel
        lines.append(f"{extent} = {extent}.clamp_min(1.0)")
    if ratio > 0:
        lines += [f"{grid} = {extent}.full_like({float(ratio)})", f"{steps} = {ratio}"]
    else:
        lines += [f"{grid} = ({extent} / {pooled}).ceil()",
                  f"{steps} = max(int({grid}.max().item()), 1)"]  # fmt: skip
    ramp = f"Tensor.arange({{n}}, device={x}.device).cast({x}.dtype).reshape({{shape}})"
    bins = ramp.format(n=pooled, shape="[1, -1, 1]")
    samples = ramp.format(n=steps, shape="[1, 1, -1]")
    lines += [
        f"{inside} = {samples}.lower({grid})",
        f"{c} = {start} + {bins} * ({extent} / {pooled}) + ({samples} + 0.5) * ({extent} / "
        f"{pooled}) / {grid}",
        f"{valid} = {inside}.bool_and({c}.greater_equal(-1.0)).bool_and({c}.lower_equal({size}))",
        f"{c} = {c}.mask_fill({valid}.bool_not(), 0.0).clamp_min(0.0)",
        f"{low} = {c}.floor()",
        f"{edge} = {low}.greater_equal({size} - 1)",
        f"{low} = {low}.mask_fill({edge}, {size} - 1)",
        f"{c} = {c}.mask_where({edge}, {low})",
        f"{high} = ({low} + 1.0).clamp_max({size} - 1)",
        f"{frac} = {c} - {low}",
    ]  # fmt: skip
    names = {"index": t("index"), "weight": t("weight"), "grid": grid, "inside": inside}
    lines += [
        f"{names['index']} = Tensor.stack([{low}, {high}], -1).int()",
        f"{names['weight']} = Tensor.stack([-{frac} + 1.0, {frac}], -1).mask_fill("
        f"{valid}.bool_not().unsqueeze_dim(-1), 0.0)",
    ]  # fmt: skip
    return lines, names


def _roi_align(node: NodeContext, half_pixel: bool) -> list[str]:
    x, rois, batch = node.input(0), node.input(1), node.input(2)
    mode = node.attr("mode", "avg")
    if mode not in ("avg", "max"):
        node.unsupported(f"mode {mode!r} is not one of avg, max")
    ph, pw = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    ratio = int(node.attr("sampling_ratio", 0))
    scale = float(node.attr("spatial_scale", 1.0))
    v, r = x.expr, rois.expr
    height, width = f"{v}.shape[2]", f"{v}.shape[3]"
    y_lines, ys = _roi_axis(node, r, v, 1, height, ph, ratio, half_pixel, scale)
    x_lines, xs = _roi_axis(node, r, v, 0, width, pw, ratio, half_pixel, scale)
    t = node.tmp
    flat, weight, vals, n = t("flat"), t("weights"), t("values"), t("rois")
    lines = [*y_lines, *x_lines, f"{n} = {r}.shape[0]"]
    # Taps of both axes: [R, PH, PW, Gy, Gx, 2, 2].
    yi, xi = ys["index"], xs["index"]
    lines += [
        f"{flat} = {yi}.reshape([{n}, {ph}, 1, {yi}.shape[2], 1, 2, 1]) * {width} + "
        f"{xi}.reshape([{n}, 1, {pw}, 1, {xi}.shape[2], 1, 2])",
        f"{weight} = {ys['weight']}.reshape([{n}, 1, {ph}, 1, {yi}.shape[2], 1, 2, 1]) * "
        f"{xs['weight']}.reshape([{n}, 1, 1, {pw}, 1, {xi}.shape[2], 1, 2])",
        f"{vals} = {v}.reshape([{v}.shape[0], {v}.shape[1], -1]).select(0, {batch.expr})"
        f".gather(2, {flat}.reshape([{n}, 1, -1]).expand([{n}, {v}.shape[1], -1])).reshape("
        f"[{n}, {v}.shape[1], {ph}, {pw}, {yi}.shape[2], {xi}.shape[2], 2, 2]) * {weight}",
    ]  # fmt: skip
    y = node.outputs[0]
    if mode == "avg":
        count = f"({ys['grid']} * {xs['grid']}).clamp_min(1.0).reshape([-1, 1, 1, 1])"
        lines.append(f"{y} = {vals}.reshape([{n}, {v}.shape[1], {ph}, {pw}, -1]).sum_dim(4)"
                     f".squeeze(4) / {count}")
    else:
        # The largest weighted tap of each sample, the largest over the samples in the grid.
        inside = (f"{ys['inside']}.reshape([{n}, 1, 1, 1, -1, 1]).bool_and("
                  f"{xs['inside']}.reshape([{n}, 1, 1, 1, 1, -1]))")
        lines.append(f"{y} = {vals}.reshape([{n}, {v}.shape[1], {ph}, {pw}, {yi}.shape[2], "
                     f"{xi}.shape[2], 4]).max_dim(6).squeeze(6).mask_fill({inside}.bool_not(), "
                     f"-float('inf')).reshape([{n}, {v}.shape[1], {ph}, {pw}, -1]).max_dim(4)"
                     ".squeeze(4)")
    return lines


@converter("RoiAlign", since=10, attrs=("mode", "output_height", "output_width",
                                         "sampling_ratio", "spatial_scale"))
def roi_align_10(node: NodeContext) -> list[str]:
    """Opsets 10 to 15: pixel corners at integer coordinates (``output_half_pixel``)."""
    return _roi_align(node, half_pixel=False)


@converter("RoiAlign", since=16, attrs=("coordinate_transformation_mode", "mode",
                                         "output_height", "output_width", "sampling_ratio",
                                         "spatial_scale"))
def roi_align(node: NodeContext) -> list[str]:
    """Average (or max) of bilinear samples on a regular grid in each output bin of each
    ROI ``[x1, y1, x2, y2]`` (times ``spatial_scale``) of image ``batch_indices[r]``; the
    grid has ``sampling_ratio`` points per bin side, or ``ceil(bin size)`` when 0. Max mode
    takes, per sample, the largest of its four weighted taps, as the ONNX reference and
    onnxruntime do."""
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    if ctm not in ("half_pixel", "output_half_pixel"):
        node.unsupported(f"coordinate_transformation_mode {ctm!r} is not one of half_pixel, "
                         "output_half_pixel")
    return _roi_align(node, half_pixel=ctm == "half_pixel")


def _pool_bins(node: NodeContext, rois: str, x: str, first: int, size: str, pooled: int,
               scale: float) -> tuple[list[str], str]:  # fmt: skip
    """Lines computing, along one axis, which pixels ``[R, pooled, size]`` each ROI's
    output bin covers (Caffe's rule: corners rounded half away from zero, bins of
    ``(extent + 1) / pooled`` pixels widened to whole pixels, clipped to the image)."""
    t = node.tmp
    start, end, extent, lo, hi, covered = (t("start"), t("end"), t("extent"), t("lo"), t("hi"),
                                           t("covered"))  # fmt: skip

    def rounded(col: int) -> str:
        v = f"({rois}.narrow(1, {col}, 1).reshape([-1, 1, 1]) * {scale})"
        return f"{v}.sign() * ({v}.abs() + 0.5).floor()"

    ramp = f"Tensor.arange({{n}}, device={x}.device).cast({x}.dtype).reshape({{shape}})"
    bins = ramp.format(n=pooled, shape="[1, -1, 1]")
    pixels = ramp.format(n=size, shape="[1, 1, -1]")
    lines = [
        f"{start} = {rounded(first)}",
        f"{end} = {rounded(first + 2)}",
        f"{extent} = ({end} - {start} + 1.0).clamp_min(1.0) / {pooled}",
        f"{lo} = (({bins} * {extent}).floor() + {start}).clamp(0.0, {size})",
        f"{hi} = ((({bins} + 1.0) * {extent}).ceil() + {start}).clamp(0.0, {size})",
        f"{covered} = {pixels}.greater_equal({lo}).bool_and({pixels}.lower({hi}))",
    ]  # fmt: skip
    return lines, covered


@converter("MaxRoiPool", since=1, attrs=("pooled_shape", "spatial_scale"))
def max_roi_pool(node: NodeContext) -> list[str]:
    """The maximum of each output bin of each ROI ``[batch_index, x1, y1, x2, y2]``, as
    onnxruntime computes it (an empty bin gives 0). The maximum is taken over the width,
    then the height, so the intermediate holds ``[R, C, H, pooled_w]`` values."""
    x, rois = node.input(0), node.input(1)
    pooled = [int(d) for d in node.attr("pooled_shape")]
    if len(pooled) != 2:
        node.unsupported(f"pooled_shape must list 2 dims, got {pooled}")
    ph, pw = pooled
    scale = float(node.attr("spatial_scale", 1.0))
    v, r = x.expr, rois.expr
    rows_lines, rows = _pool_bins(node, r, v, 2, f"{v}.shape[2]", ph, scale)
    cols_lines, cols = _pool_bins(node, r, v, 1, f"{v}.shape[3]", pw, scale)
    t = node.tmp
    images, wide, n = t("images"), t("wide"), t("rois")
    low = "-float('inf')"
    lines = [
        *rows_lines, *cols_lines, f"{n} = {r}.shape[0]",
        f"{images} = {v}.select(0, {r}.narrow(1, 0, 1).reshape([-1]).int())",
        # [R, C, H, 1, W] against the columns of each bin [R, 1, 1, PW, W].
        f"{wide} = {images}.unsqueeze_dim(3).mask_fill({cols}.unsqueeze_dim(1).unsqueeze_dim(1)"
        f".bool_not(), {low}).max_dim(4).squeeze(4)",
        # [R, C, 1, H, PW] against the rows of each bin [R, 1, PH, H, 1].
        f"{wide} = {wide}.unsqueeze_dim(2).mask_fill({rows}.unsqueeze_dim(1).unsqueeze_dim(4)"
        f".bool_not(), {low}).max_dim(3).squeeze(3)",
        f"{node.outputs[0]} = {wide}.mask_fill({wide}.is_inf(), 0.0)",
    ]  # fmt: skip
    return lines
