"""Resize and Upsample.

Resizing is separable: each resized dim is resampled on its own. Where ember's
``F.interpolate`` computes what ONNX asks (the height and width of ``[N, C, H, W]``;
bilinear or bicubic with ``half_pixel``-like or ``align_corners`` coordinates; nearest
with ``asymmetric`` coordinates rounded down), the node becomes that call. Otherwise, when
scales, sizes, ROI and the resized dims are known at import time, the resampling of each
dim is worked out then (``rt.Resampling``, with ONNX's rules for every coordinate
transformation, rounding mode, cubic coefficient, ``exclude_outside`` and ``antialias``):
nearest picks input positions (``select``), and linear and cubic multiply by a fixed
``[in, out]`` interpolation matrix. What is known only when the model runs goes to
``rt.resize``, which builds the same matrices from the values it gets.
"""

from __future__ import annotations

import math

import numpy as np

from ember.backend.errors import EmberError
from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.ops.conv import spatial_sizes
from ember.onnx.registry import converter
from ember.onnx.runtime import Resampling, ResizedDim, resize_plan
from ember.tensor import DType

# Index lists up to this long are written inline; longer ones become fields.
_INLINE = 16


def _plan(node: NodeContext, x: Value, scales: list[float] | None, sizes: list[int] | None,
          axes: list[int], roi: list[float] | None, policy: str) -> list[ResizedDim] | None:  # fmt: skip
    """The dims that change, or None when a resized dim is known only at run time."""
    try:
        return resize_plan(x.shape, axes, scales, sizes, roi, policy)  # type: ignore[arg-type]
    except EmberError as error:
        node.unsupported(str(error).removeprefix("Resize: "))


def _interpolate_call(node: NodeContext, x: Value, o: Resampling,
                      plan: list[ResizedDim]) -> str | None:
    """``F.interpolate(...)`` when ember's interpolation is exactly the ONNX resize."""
    if x.rank != 4 or not plan or any(a not in (2, 3) for a, *_ in plan):
        return None
    if x.dtype is None or not x.dtype.is_float or o.antialias or o.exclude_outside:
        return None
    if any(not math.isclose(scale, out / size, rel_tol=1e-12) for _, size, out, scale, _ in plan):
        return None
    corners = o.coordinates == "align_corners"
    if o.mode == "nearest":
        enlarging = all(out >= size for _, size, out, *_ in plan)
        exact = o.coordinates == "asymmetric" and (
            o.nearest == "floor" or (o.nearest == "simple" and enlarging))
        mode = "nearest"
    else:
        half = o.coordinates == "half_pixel" or (
            o.coordinates == "pytorch_half_pixel" and all(out > 1 for _, _, out, *_ in plan))
        exact = (half or corners) and (o.mode == "linear" or o.cubic_a == -0.75)
        mode = "bilinear" if o.mode == "linear" else "bicubic"
    if not exact:
        return None
    size = spatial_sizes(x)
    if size is None:
        return None
    for a, _, out, *_ in plan:
        size[a - 2] = out
    return f"F.interpolate({x.expr}, {size}, {mode!r}, {corners})"


def _resample(node: NodeContext, x: Value, o: Resampling, plan: list[ResizedDim]) -> list[str]:
    y, rank = node.outputs[0], x.rank or 0
    call = _interpolate_call(node, x, o, plan)
    if call is not None:
        return [f"{y} = {call}"]
    if not plan:
        return [f"{y} = {x.expr}"]
    lines, current = [], x.expr
    is_float = x.dtype is not None and x.dtype.is_float
    float_dtype = np.float64 if x.dtype is DType.F64 else np.float32
    for a, size, out, scale, box in plan:
        matrix, extra = o.weights(size, out, scale, box)
        if o.mode == "nearest" and extra is None:
            index = matrix.argmax(axis=1)
            where = (literal(index) if out <= _INLINE
                     else node.param(index.astype(np.int64), f"{node.name}_index_{a}",
                                     trainable=False))  # fmt: skip
            lines.append(f"{y} = {current}.select({a}, {where})")
        else:
            if not is_float:
                node.unsupported(f"{o.mode} resizing of {x.dtype} tensors is not supported; "
                                 f"ember interpolates float tensors")
            weights = node.param(matrix.T.astype(float_dtype), f"{node.name}_weights_{a}",
                                 trainable=False)  # fmt: skip
            if a == rank - 1:
                expr = f"{current}.matmul({weights})"
            else:
                expr = f"{current}.swap_dims({a}, -1).matmul({weights}).swap_dims({a}, -1)"
            if extra is not None:
                shift = node.param(extra.reshape([out] + [1] * (rank - a - 1)).astype(float_dtype),
                                   f"{node.name}_outside_{a}", trainable=False)  # fmt: skip
                expr = f"{expr} + {shift}"
            lines.append(f"{y} = {expr}")
        current = y
    return lines


def _floats(v: Value) -> list[float] | None:
    """A constant float input as a list; None when absent or empty."""
    if not v.present:
        return None
    values = [float(f) for f in np.asarray(v.const, dtype=np.float64).reshape(-1)]
    return values or None


def _ints(v: Value) -> list[int] | None:
    """A constant int input as a list; None when absent or empty."""
    if not v.present:
        return None
    return v.ints() or None


def _runtime(v: Value | None) -> bool:
    """Whether an input is given but known only when the model runs."""
    return v is not None and v.present and v.const is None


def _output_sizes(node: NodeContext, axes: list[int]) -> list[int] | None:
    """The resized dims from the output's static shape (what run-time ``sizes`` must be
    under the ``stretch`` policy), or None when they are not all known."""
    shape = node.output_shape(0)
    dims = None if shape is None else [shape[a] for a in axes]
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return dims  # type: ignore[return-value]


def _options(node: NodeContext) -> Resampling:
    o = Resampling(
        mode=node.attr("mode", "nearest"),
        coordinates=node.attr("coordinate_transformation_mode", "half_pixel"),
        nearest=node.attr("nearest_mode", "round_prefer_floor"),
        cubic_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(node.attr("exclude_outside", 0)),
        extrapolation=float(node.attr("extrapolation_value", 0.0)),
        antialias=bool(node.attr("antialias", 0)),
    )
    if o.nearest == "simple":  # only Upsample's and Resize-10's rule
        node.unsupported("nearest_mode 'simple' is not an ONNX rounding mode")
    try:
        o.check()
    except EmberError as error:
        node.unsupported(str(error).removeprefix("Resize: "))
    return o


def _at_run_time(node: NodeContext, x: Value, o: Resampling, roi: Value | None,
                 scales: Value | None, sizes: Value | None, axes: list[int] | None,
                 policy: str) -> str:  # fmt: skip
    """``rt.resize(...)``: the resampling worked out when the model runs."""
    if o.mode != "nearest" and x.dtype is not None and not x.dtype.is_float:
        node.unsupported(f"{o.mode} resizing of {x.dtype} tensors is not supported; "
                         f"ember interpolates float tensors")
    inputs = ", ".join(v.expr if v is not None else "None" for v in (roi, scales, sizes))
    default = Resampling()
    options = [f"{name}={getattr(o, name)!r}" for name in ("mode", "coordinates", "nearest",
               "cubic_a", "exclude_outside", "extrapolation", "antialias")
               if getattr(o, name) != getattr(default, name)]  # fmt: skip
    if axes is not None:
        options.insert(0, f"axes={literal(axes)}")
    if policy != "stretch":
        options.append(f"policy={policy!r}")
    return f"{node.outputs[0]} = rt.resize({x.expr}, {inputs}{''.join(', ' + o for o in options)})"


@converter("Resize", since=11, attrs=("coordinate_transformation_mode", "cubic_coeff_a",
                                      "exclude_outside", "extrapolation_value", "mode",
                                      "nearest_mode", "antialias", "axes",
                                      "keep_aspect_ratio_policy"),
           limits="linear and cubic modes on float inputs")  # fmt: skip
def resize(node: NodeContext) -> list[str]:
    """Opset 11 on: inputs ``X, roi, scales, sizes``; opset 18 adds ``axes``,
    ``antialias`` and ``keep_aspect_ratio_policy``."""
    x = node.input(0)
    o = _options(node)
    given_axes = node.attr("axes", None)
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    roi_in = node.input(1) if o.coordinates == "tf_crop_and_resize" else None
    scales_in, sizes_in = node.input(2), node.input(3)
    if x.rank is not None:
        axes = [int(a) % x.rank for a in (range(x.rank) if given_axes is None else given_axes)]
        sizes = (_output_sizes(node, axes) if _runtime(sizes_in) and policy == "stretch"
                 else None if _runtime(sizes_in) else _ints(sizes_in))  # fmt: skip
        known = sizes is not None or not _runtime(sizes_in)
        scales = None
        if known and sizes is None:
            known = not _runtime(scales_in)
            scales = _floats(scales_in) if known else None
        if known and not _runtime(roi_in):
            roi = None if roi_in is None else _floats(roi_in)
            plan = _plan(node, x, scales, sizes, axes, roi, policy)
            if plan is not None:
                return _resample(node, x, o, plan)
    axes_list = None if given_axes is None else [int(a) for a in given_axes]
    return [_at_run_time(node, x, o, roi_in, scales_in, sizes_in, axes_list, policy)]


def _legacy(node: NodeContext, scales: Value | list[float]) -> list[str]:
    """Upsample and Resize-10: ``asymmetric`` coordinates; nearest rounds down when
    enlarging and up when shrinking."""
    x = node.input(0)
    mode = node.attr("mode", "nearest")
    if mode == "bilinear":  # Upsample-7 spelled linear this way too
        mode = "linear"
    if mode not in ("nearest", "linear"):
        node.unsupported(f"mode {mode!r} is not supported (nearest or linear)")
    o = Resampling(mode=mode, coordinates="asymmetric", nearest="simple")
    if x.rank is not None and not (isinstance(scales, Value) and _runtime(scales)):
        values = scales if isinstance(scales, list) else _floats(scales)
        plan = _plan(node, x, values, None, list(range(x.rank)), None, "stretch")
        if plan is not None:
            return _resample(node, x, o, plan)
    if isinstance(scales, list):
        return [f"{node.outputs[0]} = rt.resize({x.expr}, None, {literal(scales)}, None, "
                f"mode={mode!r}, coordinates='asymmetric', nearest='simple')"]
    return [_at_run_time(node, x, o, None, scales, None, None, "stretch")]


_LEGACY_LIMITS = "linear mode on float inputs"


@converter("Resize", since=10, attrs=("mode",), limits=_LEGACY_LIMITS)
def resize_v10(node: NodeContext) -> list[str]:
    return _legacy(node, node.input(1))


@converter("Upsample", since=7, attrs=("mode", "scales"), limits=_LEGACY_LIMITS)
def upsample_v7(node: NodeContext) -> list[str]:
    return _legacy(node, [float(s) for s in node.attr("scales")])


@converter("Upsample", since=9, attrs=("mode",), limits=_LEGACY_LIMITS)
def upsample(node: NodeContext) -> list[str]:
    return _legacy(node, node.input(1))
