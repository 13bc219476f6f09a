"""Resize and Upsample.

Resizing is separable: each resized dim is resampled on its own. Where ember's
``F.interpolate`` computes what ONNX asks (the height and width of ``[N, C, H, W]``;
bilinear or bicubic with ``half_pixel``-like or ``align_corners`` coordinates; nearest
with ``asymmetric`` coordinates rounded down), the node becomes that call. Otherwise the
resampling of each dim is worked out at import time from the static sizes, with ONNX's
rules for every coordinate transformation, rounding mode, cubic coefficient,
``exclude_outside`` and ``antialias``: nearest picks input positions (``select``), and
linear and cubic multiply by a fixed ``[in, out]`` interpolation matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.ops.conv import spatial_sizes
from ember.onnx.registry import converter
from ember.tensor import DType

# Index lists up to this long are written inline; longer ones become fields.
_INLINE = 16

_COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize")  # fmt: skip


@dataclass
class _Options:
    """What decides how one dim is resampled (ONNX's attributes, with their defaults)."""

    mode: str = "nearest"
    coordinates: str = "half_pixel"
    nearest: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation: float = 0.0
    antialias: bool = False


# ------------------------------------------------------------------- the resampling of one dim
def _source(o: _Options, size: int, out: int, scale: float,
            roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
    """The input coordinate of each output position, and (``tf_crop_and_resize``) which
    positions fall outside the input."""
    y = np.arange(out, dtype=np.float64)
    width = scale * size  # ONNX's unrounded output width
    mode = o.coordinates
    if mode == "align_corners":
        x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - out / width)
        x = offset + (y + 0.5) / scale - 0.5
    else:  # tf_crop_and_resize
        start, end = roi
        x = (np.full(out, (end - start) * (size - 1) / 2) if width == 1
             else y * (end - start) * (size - 1) / (width - 1))  # fmt: skip
        x = x + start * (size - 1)
        return x, (x < 0) | (x > size - 1)
    return x, None


def _nearest_index(o: _Options, x: np.ndarray, scale: float) -> np.ndarray:
    """The nearest input position for each coordinate, by the rounding mode."""
    rounding = o.nearest
    if rounding == "simple":  # Upsample and Resize-10: down when enlarging, else up
        rounding = "floor" if scale >= 1 else "ceil"
    if rounding == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if rounding == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if rounding == "floor":
        return np.floor(x)
    return np.ceil(x)


def _kernel(o: _Options, t: np.ndarray) -> np.ndarray:
    """The interpolation kernel at distances ``t``: the triangle (linear), or Keys' cubic
    with coefficient ``A``."""
    t = np.abs(t)
    if o.mode == "linear":
        return np.clip(1 - t, 0, None)
    a = o.cubic_a
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _weights(o: _Options, size: int, out: int, scale: float,
             roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
    """The ``[out, size]`` matrix that resamples one dim, and the constant each output
    position gets outside a crop (``tf_crop_and_resize``), or None."""
    x, outside = _source(o, size, out, scale, roi)
    matrix = np.zeros((out, size))
    rows = np.arange(out)
    if o.mode == "nearest":
        index = np.clip(_nearest_index(o, x, scale), 0, size - 1).astype(np.int64)
        matrix[rows, index] = 1.0
    else:
        # Taps at base + i around x; an x on a tap takes it as its right neighbour.
        base = np.floor(x)
        ratio = x - base
        on_tap = ratio == 0
        base, ratio = np.where(on_tap, base - 1, base), np.where(on_tap, 1.0, ratio)
        reach = 1 if o.mode == "linear" else 2
        shrink = min(scale, 1.0) if o.antialias else 1.0
        start = math.floor(-reach / shrink) + 1
        offsets = np.arange(start, 2 - start)
        coeffs = _kernel(o, (offsets[None, :] - ratio[:, None]) * shrink)
        if o.antialias:
            coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
        taps = base[:, None].astype(np.int64) + offsets[None, :]
        if o.exclude_outside:
            coeffs = np.where((taps < 0) | (taps >= size), 0.0, coeffs)
            total = coeffs.sum(axis=1, keepdims=True)
            coeffs = coeffs / np.where(total == 0, 1.0, total)
        np.add.at(matrix, (np.repeat(rows, len(offsets)), np.clip(taps, 0, size - 1).ravel()),
                  coeffs.ravel())  # fmt: skip
    extra = None
    if outside is not None and outside.any():
        matrix[outside] = 0.0
        extra = np.where(outside, o.extrapolation, 0.0)
    return matrix, extra


# ---------------------------------------------------------------------------- the node
def _plan(node: NodeContext, x: Value, scales: list[float] | None, sizes: list[int] | None,
          axes: list[int], roi: list[float] | None,
          policy: str) -> list[tuple[int, int, int, float, tuple[float, float]]]:  # fmt: skip
    """``(dim, in, out, scale, roi)`` of each dim that changes."""
    shape = x.shape
    if shape is None:
        node.unsupported("Resize needs the input's rank and resized dims at import time")
    n = len(axes)
    boxes = [(0.0, 1.0) if roi is None or len(roi) != 2 * n else (roi[i], roi[n + i])
             for i in range(n)]  # fmt: skip
    if sizes is None and scales is None:
        node.unsupported("Resize needs scales or sizes")
    # A dim scaled by 1 stays as it is, known or not (a dynamic batch dim).
    kept = {a for i, a in enumerate(axes)
            if sizes is None and scales[i] == 1.0 and boxes[i] == (0.0, 1.0)}  # fmt: skip
    dims = []
    for a in axes:
        if a not in kept and not isinstance(shape[a], int):
            node.unsupported(f"dim {a} of the input is resized and must be known at import time")
        dims.append(shape[a])
    if sizes is not None:
        factors = [out / size for out, size in zip(sizes, dims)]
        if policy in ("not_larger", "not_smaller"):
            common = min(factors) if policy == "not_larger" else max(factors)
            factors = [common] * n
            sizes = [int(common * size + 0.5) for size in dims]
        elif policy != "stretch":
            node.unsupported(f"keep_aspect_ratio_policy {policy!r} is not an ONNX policy")
    else:
        factors = [float(s) for s in scales]
        sizes = [size if a in kept else int(s * size) for a, s, size in zip(axes, factors, dims)]
    plan = []
    for a, size, out, scale, box in zip(axes, dims, sizes, factors, boxes):
        if a in kept or (out == size and math.isclose(scale, 1.0) and box == (0.0, 1.0)):
            continue
        if out <= 0:
            node.unsupported(f"dim {a} would be resized to {out}")
        plan.append((a, size, out, scale, box))
    return plan


def _interpolate_call(node: NodeContext, x: Value, o: _Options,
                      plan: list[tuple[int, int, int, float, tuple[float, float]]]) -> str | None:  # fmt: skip
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


def _resample(node: NodeContext, x: Value, o: _Options,
              plan: list[tuple[int, int, int, float, tuple[float, float]]]) -> list[str]:  # fmt: skip
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
        matrix, extra = _weights(o, size, out, scale, box)
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


def _floats(node: NodeContext, v: Value) -> list[float] | None:
    """A constant float input as a list; None when absent or empty."""
    if not v.present:
        return None
    if v.const is None:
        node.unsupported(f"input {v.name!r} must be a constant known at import time")
    values = [float(f) for f in np.asarray(v.const, dtype=np.float64).reshape(-1)]
    return values or None


def _ints(v: Value) -> list[int] | None:
    """A constant int input as a list; None when absent or empty."""
    if not v.present:
        return None
    return v.ints() or None


def _output_sizes(node: NodeContext, axes: list[int]) -> list[int]:
    """The resized dims from the output's static shape: ``sizes`` known only at run time
    must equal them (the ``stretch`` policy)."""
    shape = node.output_shape(0)
    dims = None if shape is None else [shape[a] for a in axes]
    if dims is None or not all(isinstance(d, int) for d in dims):
        node.unsupported("sizes known only at run time need the output's resized dims at "
                         "import time (run ONNX shape inference, or make sizes a constant)")
    return dims  # type: ignore[return-value]


def _options(node: NodeContext) -> _Options:
    o = _Options(
        mode=node.attr("mode", "nearest"),
        coordinates=node.attr("coordinate_transformation_mode", "half_pixel"),
        nearest=node.attr("nearest_mode", "round_prefer_floor"),
        cubic_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(node.attr("exclude_outside", 0)),
        extrapolation=float(node.attr("extrapolation_value", 0.0)),
        antialias=bool(node.attr("antialias", 0)),
    )
    if o.mode not in ("nearest", "linear", "cubic"):
        node.unsupported(f"mode {o.mode!r} is not an ONNX resize mode")
    if o.coordinates not in _COORDINATES:
        node.unsupported(f"coordinate_transformation_mode {o.coordinates!r} is not supported")
    if o.nearest not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        node.unsupported(f"nearest_mode {o.nearest!r} is not an ONNX rounding mode")
    return o


@converter("Resize", since=11, attrs=("coordinate_transformation_mode", "cubic_coeff_a",
                                      "exclude_outside", "extrapolation_value", "mode",
                                      "nearest_mode", "antialias", "axes",
                                      "keep_aspect_ratio_policy"),
           limits="scales and roi must be constants, sizes a constant or the output's static "
                  "dims; the resized dims static; linear and cubic modes on float inputs")  # fmt: skip
def resize(node: NodeContext) -> list[str]:
    """Opset 11 on: inputs ``X, roi, scales, sizes``; opset 18 adds ``axes``,
    ``antialias`` and ``keep_aspect_ratio_policy``."""
    x = node.input(0)
    if x.rank is None:
        node.unsupported("Resize needs the input's rank at import time")
    o = _options(node)
    axes = [int(a) % x.rank for a in node.attr("axes", range(x.rank))]
    roi = _floats(node, node.input(1)) if o.coordinates == "tf_crop_and_resize" else None
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    sizes_input = node.input(3)
    if sizes_input.present and sizes_input.const is None and policy == "stretch":
        sizes = _output_sizes(node, axes)
    else:
        sizes = _ints(sizes_input)
    scales = None if sizes is not None else _floats(node, node.input(2))
    plan = _plan(node, x, scales, sizes, axes, roi, policy)
    return _resample(node, x, o, plan)


_LEGACY_LIMITS = "scales must be a constant and the resized dims static"


def _legacy(node: NodeContext, scales: list[float] | None) -> list[str]:
    """Upsample and Resize-10: ``asymmetric`` coordinates; nearest rounds down when
    enlarging and up when shrinking."""
    x = node.input(0)
    if x.rank is None:
        node.unsupported(f"{node.op_type} needs the input's rank at import time")
    mode = node.attr("mode", "nearest")
    if mode == "bilinear":  # Upsample-7 spelled linear this way too
        mode = "linear"
    if mode not in ("nearest", "linear"):
        node.unsupported(f"mode {mode!r} is not supported (nearest or linear)")
    o = _Options(mode=mode, coordinates="asymmetric", nearest="simple")
    plan = _plan(node, x, scales, None, list(range(x.rank)), None, "stretch")
    return _resample(node, x, o, plan)


@converter("Resize", since=10, attrs=("mode",), limits=_LEGACY_LIMITS)
def resize_v10(node: NodeContext) -> list[str]:
    return _legacy(node, _floats(node, node.input(1)))


@converter("Upsample", since=7, attrs=("mode", "scales"), limits=_LEGACY_LIMITS)
def upsample_v7(node: NodeContext) -> list[str]:
    return _legacy(node, [float(s) for s in node.attr("scales")])


@converter("Upsample", since=9, attrs=("mode",), limits=_LEGACY_LIMITS)
def upsample(node: NodeContext) -> list[str]:
    return _legacy(node, _floats(node, node.input(1)))
