"""Helpers the generated code calls where ONNX semantics need more than one tensor op.

Each helper is a plain function of tensors and Python values, so generated ``forward``
methods stay straight-line code: no lookup of converters happens when a model runs.
Helpers resolve what depends on runtime shapes (dynamic dims, negative axes, ONNX's
``0`` in a reshape) from the tensors they get.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.onnx import runtime as rt
    >>> x = Tensor.zeros([2, 3, 4], ember.device("ndarray"))
    >>> rt.shape(x).tolist(), rt.reshape(x, [0, -1]).shape
    ([2, 3, 4], (2, 12))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from ember.backend.device import Device
from ember.backend.errors import ArgumentError, DTypeError, EmberIndexError, ShapeError, fmt_shape
from ember.module import Param
from ember.tensor import DType, Tensor
from ember.tensor.data import numpy_dtype

IntsLike = Sequence[int] | Tensor


def param(shape: Sequence[int], dtype: str, device: Device | None = None, *,
          trainable: bool = True) -> Param:  # fmt: skip
    """A placeholder parameter (zeros) of ``shape`` and ``dtype``; records fill it."""
    value = Tensor.zeros(list(shape), device, DType.parse(dtype), DType.parse(dtype).kind)
    return Param(value, require_grad=trainable)


def ints(value: IntsLike | int) -> list[int]:
    """A shape-like operand (a list, a 1-d Int tensor computed at runtime, or a host value of
    :mod:`ember.onnx.host`) as ints."""
    if isinstance(value, Tensor):
        return [int(v) for v in np.asarray(value.to_numpy()).reshape(-1)]
    if isinstance(value, np.ndarray):
        return [int(v) for v in value.reshape(-1)]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def axis(dim: int, rank: int) -> int:
    """A possibly negative ONNX axis as an index in ``[0, rank)``."""
    if not -rank <= dim < max(rank, 1):
        raise ShapeError(f"axis {dim} is out of range for a tensor of rank {rank}")
    return dim + rank if dim < 0 else dim


def shape(x: Tensor, start: int = 0, end: int | None = None) -> Tensor:
    """ONNX ``Shape``: the dims ``start:end`` of ``x`` as a 1-d i64 tensor."""
    dims = x.shape
    return Tensor.from_data(np.asarray(dims[shape_span(len(dims), start, end)], dtype=np.int64),
                            x.device)  # fmt: skip


def shape_span(rank: int, start: int = 0, end: int | None = None) -> slice:
    """ONNX ``Shape``'s ``start:end`` over ``rank`` dims, clamped as the spec says."""
    s = min(max(start + rank if start < 0 else start, 0), rank)
    e = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return slice(s, e)


def to_device(value: np.ndarray, like: Tensor) -> Tensor:
    """A host value as a tensor on ``like``'s device, where a tensor op reads it."""
    return Tensor.from_data(value, like.device)


def reshape(x: Tensor, target: IntsLike, allowzero: bool = False) -> Tensor:
    """ONNX ``Reshape``: ``-1`` infers a dim; ``0`` copies the input's dim unless ``allowzero``."""
    dims = ints(target)
    current = x.shape
    if not allowzero:
        dims = [current[i] if d == 0 and i < len(current) else d for i, d in enumerate(dims)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        total = math.prod(current)
        if known == 0 or total % known or dims.count(-1) > 1:
            raise ShapeError(f"Reshape: cannot reshape {fmt_shape(current)} into {fmt_shape(dims)}")
        dims[dims.index(-1)] = total // known
    if math.prod(dims) != math.prod(current):
        raise ShapeError(f"Reshape: cannot reshape {fmt_shape(current)} into {fmt_shape(dims)}")
    return x.reshape(dims)


def flatten(x: Tensor, dim: int = 1) -> Tensor:
    """ONNX ``Flatten``: a 2-d tensor of the dims before ``dim`` and those from it."""
    dims = x.shape
    d = axis(dim, len(dims) + 1) if dim < 0 else dim
    return x.reshape([math.prod(dims[:d]), math.prod(dims[d:])])


def hardmax(x: Tensor, dim: int) -> Tensor:
    """ONNX ``Hardmax`` along ``dim`` of a tensor of any rank: 1 at the first maximum."""
    d = axis(dim, x.rank)
    positions = Tensor.arange(x.shape[d], device=x.device)
    positions = positions.reshape([-1 if i == d else 1 for i in range(x.rank)])
    return positions.equal(x.argmax(d)).cast(x.dtype)


def per_channel(v: Tensor, x: Tensor) -> Tensor:
    """A ``[C]`` vector shaped to broadcast along dim 1 of ``x`` (``[N, C, ...]``)."""
    return v.reshape([1, -1, *[1] * (x.rank - 2)])


_GLOBAL_POOLS = ("mean_dim", "max_dim", "sum_dim")


def global_pool(x: Tensor, reduce: str) -> Tensor:
    """ONNX's global poolings of ``[N, C, ...]`` of any rank: ``reduce`` (``"mean_dim"``,
    ``"max_dim"`` or ``"sum_dim"``) over every spatial dim, kept with size 1.

    Two or more spatial dims are reduced as one, flattened: one pass over contiguous
    planes, where a reduction per dim reads the first one across rows (NumPy: 0.43 ms for
    ``[8, 64, 16, 16]``, against 0.03 ms flattened) and leaves a second reduction that no
    fused kernel takes with the first."""
    if reduce not in _GLOBAL_POOLS:
        raise ArgumentError(f"global_pool: reduce must be one of {', '.join(_GLOBAL_POOLS)}, "
                            f"got {reduce!r}")
    if x.rank > 3:
        n, c, *spatial = x.shape
        flat = getattr(x.reshape([n, c, math.prod(spatial)]), reduce)(2)
        return flat.reshape([n, c, *[1] * len(spatial)])
    for d in range(2, x.rank):
        x = getattr(x, reduce)(d)
    return x


def _same_pads(sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int], upper: bool) -> tuple[list[int], list[int]]:  # fmt: skip
    """ONNX's SAME padding: ``ceil(size / stride)`` outputs, the odd pad at the end
    (``upper``) or at the start."""
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(small if upper else large)
        end.append(large if upper else small)
    return begin, end


def conv(x: Tensor, w: Tensor, b: Tensor | None = None, *, strides: Sequence[int] | None = None,
         pads: Sequence[int] | None = None, dilations: Sequence[int] | None = None,
         group: int = 1, auto_pad: str = "NOTSET") -> Tensor:  # fmt: skip
    """ONNX ``Conv`` whose number of spatial dims (1 to 3) is the input's rank less 2, read
    when the model runs; the keywords are ONNX's attributes (None: their defaults)."""
    n = x.rank - 2
    if not 1 <= n <= 3 or w.rank != x.rank:
        raise ShapeError(f"Conv: ember convolves 1 to 3 spatial dims with a weight of the "
                         f"input's rank, got input {fmt_shape(x.shape)} and weight "
                         f"{fmt_shape(w.shape)}")
    from ember.tensor import module as functional

    strides = list(strides) if strides else [1] * n
    dilations = list(dilations) if dilations else [1] * n
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = _same_pads(x.shape[2:], w.shape[2:], strides, dilations,
                                auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        begin, end = [0] * n, [0] * n
    elif auto_pad in ("NOTSET", ""):
        given = list(pads) if pads else [0] * (2 * n)
        begin, end = given[:n], given[n:]
    else:
        raise ArgumentError(f"Conv: auto_pad {auto_pad!r} is not an ONNX padding mode")
    if len(strides) != n or len(dilations) != n or len(begin) != n or len(end) != n:
        raise ShapeError(f"Conv: strides {strides}, dilations {dilations} and pads do not fit "
                         f"{n} spatial dims")
    # ember pads both ends alike: the common part there, the rest onto the input first.
    common = [min(a, e) for a, e in zip(begin, end)]
    extra = [v for a, e, c in zip(reversed(begin), reversed(end), reversed(common))
             for v in (a - c, e - c)]  # fmt: skip
    if any(extra):
        x = x.pad(extra)
    op = (functional.conv1d, functional.conv2d, functional.conv3d)[n - 1]
    return op(x, w, b, strides, common, dilations, group)


def transpose(x: Tensor, perm: Sequence[int] | None = None) -> Tensor:
    """ONNX ``Transpose``: ``perm`` or, by default, the dims reversed."""
    order = list(range(x.rank))[::-1] if perm is None else list(perm)
    return x.permute(order)


def unsqueeze(x: Tensor, axes: IntsLike) -> Tensor:
    """ONNX ``Unsqueeze``: size-1 dims at ``axes`` of the output (negative counts from the end)."""
    wanted = ints(axes)
    rank = x.rank + len(wanted)
    at = sorted(axis(a, rank) for a in wanted)
    dims = list(x.shape)
    for a in at:
        dims.insert(a, 1)
    return x.reshape(dims)


def squeeze(x: Tensor, axes: IntsLike | None = None) -> Tensor:
    """ONNX ``Squeeze``: drops the size-1 dims ``axes``, or all size-1 dims when None."""
    if axes is None:
        return x.reshape([d for d in x.shape if d != 1])
    return x.squeeze_dims([axis(a, x.rank) for a in ints(axes)])


def gather(x: Tensor, indices: Tensor | int | Sequence[Any], dim: int = 0) -> Tensor:
    """ONNX ``Gather``: the slices of ``x`` along ``dim`` at ``indices`` (negative counts from
    the end); the indices' shape replaces that dim."""
    d = axis(dim, x.rank)
    size = x.shape[d]
    if isinstance(indices, Tensor):
        index_shape = indices.shape
        flat = indices.reshape([-1]) if index_shape != (math.prod(index_shape),) else indices
        flat = flat.int()
        flat = flat.mask_where(flat.lower(0), flat + size)
    else:
        array = np.asarray(indices, dtype=np.int64)
        index_shape = array.shape
        array = np.where(array < 0, array + size, array).reshape(-1)
        if array.size and (array.min() < 0 or array.max() >= size):
            bad = np.asarray(indices).reshape(-1)[(array < 0) | (array >= size)][0]
            raise EmberIndexError(f"Gather: index {int(bad)} is out of range for dim {d} of "
                                  f"size {size}")  # fmt: skip
        start = int(array[0]) if array.size else -1
        consecutive = array.size and (array == np.arange(start, start + array.size)).all()
        if consecutive and start >= 0 and start + array.size <= size:
            # Consecutive constant indices (a split of packed weights or q/k/v): a view,
            # where a select would copy the rows it picks.
            out = x.narrow(d, start, int(array.size))
            dims = x.shape
            return out.reshape([*dims[:d], *index_shape, *dims[d + 1 :]])
        flat = Tensor.from_data(array, x.device)
    out = x.select(d, flat)
    dims = x.shape
    return out.reshape([*dims[:d], *index_shape, *dims[d + 1 :]])


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """ONNX ``MatMul`` (NumPy's ``matmul``): 1-d operands gain and then lose a dim."""
    if a.rank >= 2 and b.rank >= 2:
        return a.matmul(b)
    left = a.unsqueeze_dim(0) if a.rank == 1 else a
    right = b.unsqueeze_dim(-1) if b.rank == 1 else b
    out = left.matmul(right)
    if a.rank == 1:
        out = out.squeeze(-2)
    if b.rank == 1:
        out = out.squeeze(-1)
    return out


def concat(tensors: Sequence[Tensor], dim: int) -> Tensor:
    """ONNX ``Concat``: joins along ``dim``; empty inputs take part as ONNX allows."""
    d = axis(dim, tensors[0].rank)
    parts = [t for t in tensors if t.shape[d] != 0 or t.num_elements() != 0] or list(tensors[:1])
    if len(parts) == 1:
        return parts[0]
    return Tensor.cat(parts, d)


# ------------------------------------------------------------------------------ Resize
# ONNX's resizing is separable: each resized dim is resampled on its own, by picking input
# positions (nearest) or by an ``[out, in]`` interpolation matrix (linear, cubic). The plan
# and the matrices are NumPy work on sizes and scales: importers make them once when those
# are known at import time, and ``resize`` makes them from the values it gets otherwise.
_RESIZE_MODES = ("nearest", "linear", "cubic")
_RESIZE_COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                       "align_corners", "asymmetric", "tf_crop_and_resize")  # fmt: skip
# "simple" is Upsample's and Resize-10's: down when enlarging, else up.
_RESIZE_ROUNDINGS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_RESIZE_POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class Resampling:
    """How ONNX ``Resize`` resamples one dim: its attributes, with ONNX's defaults."""

    mode: str = "nearest"
    coordinates: str = "half_pixel"
    nearest: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation: float = 0.0
    antialias: bool = False

    def check(self) -> None:
        """Raises :class:`ArgumentError` for a mode, coordinate transformation or rounding
        that ONNX does not have."""
        for what, value, known in (("mode", self.mode, _RESIZE_MODES),
                                   ("coordinate_transformation_mode", self.coordinates,
                                    _RESIZE_COORDINATES),
                                   ("nearest_mode", self.nearest, _RESIZE_ROUNDINGS)):  # fmt: skip
            if value not in known:
                raise ArgumentError(f"Resize: {what} {value!r} is not one of {', '.join(known)}")

    def source(self, size: int, out: int, scale: float,
               roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        """The input coordinate of each output position, and (``tf_crop_and_resize``) which
        positions fall outside the input."""
        y = np.arange(out, dtype=np.float64)
        width = scale * size  # ONNX's unrounded output width
        mode = self.coordinates
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

    def nearest_index(self, x: np.ndarray, scale: float) -> np.ndarray:
        """The nearest input position of each coordinate, by the rounding mode."""
        rounding = self.nearest
        if rounding == "simple":
            rounding = "floor" if scale >= 1 else "ceil"
        if rounding == "round_prefer_floor":
            return np.ceil(x - 0.5)
        if rounding == "round_prefer_ceil":
            return np.floor(x + 0.5)
        if rounding == "floor":
            return np.floor(x)
        return np.ceil(x)

    def kernel(self, t: np.ndarray) -> np.ndarray:
        """The interpolation kernel at distances ``t``: the triangle (linear), or Keys' cubic
        with coefficient ``cubic_a``."""
        t = np.abs(t)
        if self.mode == "linear":
            return np.clip(1 - t, 0, None)
        a = self.cubic_a
        near = ((a + 2) * t - (a + 3)) * t * t + 1
        far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
        return np.where(t <= 1, near, np.where(t < 2, far, 0.0))

    def weights(self, size: int, out: int, scale: float,
                roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        """The ``[out, size]`` matrix that resamples one dim, and the constant each output
        position gets outside a crop (``tf_crop_and_resize``), or None."""
        x, outside = self.source(size, out, scale, roi)
        matrix = np.zeros((out, size))
        rows = np.arange(out)
        if self.mode == "nearest":
            index = np.clip(self.nearest_index(x, scale), 0, size - 1).astype(np.int64)
            matrix[rows, index] = 1.0
        else:
            # Taps at base + i around x; an x on a tap takes it as its right neighbour.
            base = np.floor(x)
            ratio = x - base
            on_tap = ratio == 0
            base, ratio = np.where(on_tap, base - 1, base), np.where(on_tap, 1.0, ratio)
            reach = 1 if self.mode == "linear" else 2
            shrink = min(scale, 1.0) if self.antialias else 1.0
            start = math.floor(-reach / shrink) + 1
            offsets = np.arange(start, 2 - start)
            coeffs = self.kernel((offsets[None, :] - ratio[:, None]) * shrink)
            if self.antialias:
                coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
            taps = base[:, None].astype(np.int64) + offsets[None, :]
            if self.exclude_outside:
                coeffs = np.where((taps < 0) | (taps >= size), 0.0, coeffs)
                total = coeffs.sum(axis=1, keepdims=True)
                coeffs = coeffs / np.where(total == 0, 1.0, total)
            np.add.at(matrix, (np.repeat(rows, len(offsets)),
                               np.clip(taps, 0, size - 1).ravel()), coeffs.ravel())  # fmt: skip
        extra = None
        if outside is not None and outside.any():
            matrix[outside] = 0.0
            extra = np.where(outside, self.extrapolation, 0.0)
        return matrix, extra


class ResizedDim(NamedTuple):
    """One dim a resize changes: its index, input and output sizes, scale and ROI."""

    dim: int
    size: int
    out: int
    scale: float
    roi: tuple[float, float]


def resize_plan(dims: Sequence[Any], axes: Sequence[int], scales: Sequence[float] | None,
                sizes: Sequence[int] | None, roi: Sequence[float] | None,
                policy: str = "stretch") -> list[ResizedDim] | None:  # fmt: skip
    """The dims ``Resize`` changes, from the input's ``dims`` (a non-int: not known yet),
    the non-negative ``axes`` it resizes and one of ``scales`` and ``sizes`` per axis;
    None when a resized dim is not known."""
    n = len(axes)
    for what, given in (("scales", scales), ("sizes", sizes)):
        if given is not None and len(given) != n:
            raise ShapeError(f"Resize: {what} has {len(given)} values for {n} resized axes")
    if sizes is None and scales is None:
        raise ArgumentError("Resize: needs scales or sizes")
    if policy not in _RESIZE_POLICIES:
        raise ArgumentError(f"Resize: keep_aspect_ratio_policy {policy!r} is not one of "
                            f"{', '.join(_RESIZE_POLICIES)}")
    boxes = [(0.0, 1.0) if roi is None or len(roi) != 2 * n else (roi[i], roi[n + i])
             for i in range(n)]  # fmt: skip
    # A dim scaled by 1 stays as it is, known or not (a dynamic batch dim).
    kept = {a for i, a in enumerate(axes)
            if sizes is None and scales[i] == 1.0 and boxes[i] == (0.0, 1.0)}  # type: ignore[index]
    if any(a not in kept and not isinstance(dims[a], int) for a in axes):
        return None
    ins = [dims[a] for a in axes]
    if sizes is not None:
        factors = [out / size for out, size in zip(sizes, ins)]
        if policy != "stretch":
            common = min(factors) if policy == "not_larger" else max(factors)
            factors = [common] * n
            sizes = [int(common * size + 0.5) for size in ins]
    else:
        factors = [float(s) for s in scales]  # type: ignore[union-attr]
        sizes = [size if a in kept else int(s * size) for a, s, size in zip(axes, factors, ins)]
    plan = []
    for a, size, out, scale, box in zip(axes, ins, sizes, factors, boxes):
        if a in kept or (out == size and math.isclose(scale, 1.0) and box == (0.0, 1.0)):
            continue
        if out <= 0:
            raise ShapeError(f"Resize: dim {a} of size {size} would be resized to {out}")
        plan.append(ResizedDim(a, size, int(out), scale, box))
    return plan


def _floats_or_none(value: Tensor | Sequence[float] | None) -> list[float] | None:
    """A 1-d float operand as a list; None when absent or empty (ONNX's unused input)."""
    if value is None:
        return None
    array = value.to_numpy() if isinstance(value, Tensor) else value
    values = [float(v) for v in np.asarray(array, dtype=np.float64).reshape(-1)]
    return values or None


def resize(x: Tensor, roi: Tensor | Sequence[float] | None,
           scales: Tensor | Sequence[float] | None, sizes: IntsLike | None, *,
           axes: Sequence[int] | None = None, mode: str = "nearest",
           coordinates: str = "half_pixel", nearest: str = "round_prefer_floor",
           cubic_a: float = -0.75, exclude_outside: bool = False, extrapolation: float = 0.0,
           antialias: bool = False, policy: str = "stretch") -> Tensor:  # fmt: skip
    """ONNX ``Resize`` with ``roi``, ``scales`` and ``sizes`` known when it runs: one per
    resized axis (``axes``, by default all), ``sizes`` taking precedence; ``roi`` counts
    only for ``tf_crop_and_resize``. The keywords are ONNX's attributes.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.onnx import runtime as rt
        >>> x = Tensor.from_data([[1.0, 3.0]], ember.device("ndarray"))
        >>> rt.resize(x, None, [1.0, 2.0], None, mode="linear").tolist()
        [[1.0, 1.5, 2.5, 3.0]]
    """
    o = Resampling(mode, coordinates, nearest, float(cubic_a), bool(exclude_outside),
                   float(extrapolation), bool(antialias))  # fmt: skip
    o.check()
    rank = x.rank
    picked = list(range(rank)) if axes is None else [axis(a, rank) for a in axes]
    size_list = None if sizes is None else ints(sizes) or None
    scale_list = None if size_list is not None else _floats_or_none(scales)
    box = _floats_or_none(roi) if coordinates == "tf_crop_and_resize" else None
    plan = resize_plan(x.shape, picked, scale_list, size_list, box, policy)
    for d in plan or ():
        matrix, extra = o.weights(d.size, d.out, d.scale, d.roi)
        if mode == "nearest" and extra is None:
            index = matrix.argmax(axis=1).astype(np.int64)
            x = x.select(d.dim, Tensor.from_data(index, x.device))
            continue
        if not x.dtype.is_float:
            raise DTypeError(f"Resize: {mode} resizing needs a float tensor, got {x.dtype}")
        dtype = numpy_dtype(x.dtype)
        weights = Tensor.from_data(matrix.T.astype(dtype), x.device)
        if d.dim == rank - 1:
            x = x.matmul(weights)
        else:
            x = x.swap_dims(d.dim, -1).matmul(weights).swap_dims(d.dim, -1)
        if extra is not None:
            shift = extra.reshape([d.out] + [1] * (rank - d.dim - 1)).astype(dtype)
            x = x + Tensor.from_data(shift, x.device)
    return x


def float8_e8m0(x: Tensor, round_mode: str = "up", saturate: bool = True) -> Tensor:
    """``x`` cast to f8e8m0fnu (a power of two) as ONNX's Cast does: from the exponent of the
    f32 value, sign dropped, raised by one when ``round_mode`` is ``"up"`` and the mantissa is
    not zero, or ``"nearest"`` and it is at least one half; ``"down"`` keeps the exponent.
    A result past 2**127 is 2**127 with ``saturate``, else NaN; NaN and infinities give NaN.

    Example:
        >>> import ember
        >>> x = Tensor.from_data([0.0, 0.124, 3.0, 4.0], ember.device("ndarray"))
        >>> float8_e8m0(x).cast("f32").tolist()
        [5.877471754111438e-39, 0.125, 4.0, 4.0]
    """
    if round_mode not in ("up", "down", "nearest"):
        raise ArgumentError(f"float8_e8m0: round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    # f64 holds every power of two in reach exactly; the value is rounded to f32 first, as ONNX does.
    a = x.cast("f32").cast("f64").abs()
    smallest_normal, below = 2.0**-126, 2.0**-127
    normal = a.greater_equal(smallest_normal)
    # ln / ln 2 may miss an exact power of two by an ulp: one step either way fixes it.
    d = a.full_like(2.0).pow((a.clamp_min(smallest_normal).log() / math.log(2.0)).floor())
    d = d.mask_where(d.greater(a), d / 2.0)
    d = d.mask_where((d * 2.0).lower_equal(a), d * 2.0)
    # f32 subnormals have the exponent field 0, whose e8m0 value is 2**-127.
    subnormal = normal.bool_not()
    d = d.mask_where(subnormal, a.full_like(below))
    if round_mode != "down":
        up = round_mode == "up"
        d = d.mask_where(normal.bool_and(a.greater(d) if up else a.greater_equal(d * 1.5)), d * 2.0)
        sub_up = subnormal.bool_and(a.greater(0.0) if up else a.greater(below))
        d = d.mask_where(sub_up, a.full_like(smallest_normal))
    d = d.clamp_max(2.0**127) if saturate else d.mask_fill(d.greater(2.0**127), math.nan)
    d = d.mask_fill(a.is_nan().bool_or(a.is_inf()), math.nan)
    return d.cast("f8e8m0fnu")


# ------------------------------------------------------------------ quantized operands
# ONNX's quantized values are u8 or i8; ember's quantized tensors hold i8. A u8 value v with
# zero point z is the i8 value v - 128 with zero point z - 128: the same dequantized number.


def quantized_input(values: Tensor, scale: Tensor | None = None,
                    zero_point: Tensor | None = None) -> Any:  # fmt: skip
    """An ONNX quantized activation (u8 or i8 ``values`` with one ``scale`` and one
    ``zero_point``) as a per-tensor :class:`ember.quantization.QTensor`.

    A missing scale is 1 (the integer ops, MatMulInteger and ConvInteger, have none); a
    missing zero point is ONNX's 0.

    Raises:
        DTypeError: the values are not u8 or i8, or the zero point has another dtype.
        ShapeError: the scale or the zero point has more than one element.
    """
    from ember.quantization import QTensor

    if values.dtype not in (DType.U8, DType.I8):
        raise DTypeError(f"quantized input: values must be u8 or i8, got {values.dtype.value}")
    for what, t in (("scale", scale), ("zero point", zero_point)):
        if t is not None and math.prod(t.shape) != 1:
            raise ShapeError(f"quantized input: one {what} per tensor is supported, got shape "
                             f"{fmt_shape(t.shape)}")  # fmt: skip
    if zero_point is not None and zero_point.dtype is not values.dtype:
        raise DTypeError(f"quantized input: the zero point is {zero_point.dtype.value}, the "
                         f"values {values.dtype.value}")  # fmt: skip
    device = values.device
    scale = (Tensor.ones([], device) if scale is None
             else scale.reshape([]).cast(DType.F32))  # fmt: skip
    zero = None if zero_point is None else zero_point.reshape([])
    if values.dtype is DType.U8:
        values = (values.cast(DType.I32) - 128).cast(DType.I8)
        zero = (Tensor.from_data(np.array(-128, np.int8), device) if zero is None
                else (zero.cast(DType.I32) - 128).cast(DType.I8))  # fmt: skip
    return QTensor(values, scale, zero, _input_scheme(zero is not None), values.shape)


@cache
def _input_scheme(affine: bool) -> Any:
    """The scheme of a per-tensor activation (made once: a scheme is a validated config)."""
    from ember.quantization import QuantScheme

    return QuantScheme(mode="affine" if affine else "symmetric")


def _weight(weight: Any) -> Any:
    """A :class:`QTensor`, or what a generated module holds of one (a layer whose
    ``qtensor()`` gives it)."""
    from ember.quantization import QTensor

    return weight if isinstance(weight, QTensor) else weight.qtensor()


def quantized_linear(x: Any, weight: Any, bias: Tensor | None = None) -> Tensor:
    """``x @ weight + bias`` by :func:`ember.quantization.linear`: a Float ``x`` or a
    quantized one (:func:`quantized_input`) by a quantized ``weight`` of ``[K, N]``; f32."""
    from ember.quantization import linear

    return linear(x, _weight(weight), bias)


def _pad_quantized(q: Any, pads: Sequence[int]) -> Any:
    """The QTensor ``q`` padded with its zero point (a dequantized 0), ``pads`` in
    ``Tensor.pad``'s order."""
    from ember.quantization import QTensor

    values = q.int_values()
    if q.zero_points is None:
        padded = values.pad(list(pads))
    else:
        zero = q.zero_points.cast(DType.I32)
        padded = ((values.cast(DType.I32) - zero).pad(list(pads)) + zero).cast(DType.I8)
    return QTensor(padded, q.scales, q.zero_points, q.scheme, padded.shape)


def quantized_conv(x: Any, weight: Any, bias: Tensor | None, strides: Sequence[int],
                   pads_begin: Sequence[int], pads_end: Sequence[int],
                   dilations: Sequence[int], groups: int) -> Tensor:  # fmt: skip
    """ONNX's 2-d Conv by :func:`ember.quantization.conv2d`: a Float ``x`` or a quantized
    one (per tensor) by a quantized weight ``[M, C / groups, KH, KW]``; f32. Uneven pads
    pad ``x`` first (a quantized ``x`` with its zero point)."""
    from ember.quantization import QTensor, conv2d

    common = [min(b, e) for b, e in zip(pads_begin, pads_end)]
    extra = [v for b, e, c in zip(reversed(pads_begin), reversed(pads_end), reversed(common))
             for v in (b - c, e - c)]  # fmt: skip
    if any(extra):
        x = _pad_quantized(x, extra) if isinstance(x, QTensor) else x.pad(extra)
    return conv2d(x, _weight(weight), bias, list(strides), common, list(dilations), int(groups))
