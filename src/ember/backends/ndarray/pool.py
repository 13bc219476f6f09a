"""Pooling kernels of the NdArray backend: NumPy functions over plain arrays.

Every function is pure (inputs are never written to) and returns arrays of the
input's dtype (indices are int64). Half-precision inputs are computed in
float32 and cast back, as PyTorch's CPU kernels accumulate them.

Windows are reduced *separably*: first along the last dim for every row of the
padded input, then along the rows of that partial result. A ``kh x kw``
window then costs ``kw + kh`` vectorized passes over arrays about the size of
the output instead of ``kh * kw``, and no window is ever materialized. Each
pass is one NumPy call over all channels and positions of all samples (of a
cache-sized block of samples, for max pooling); the only other Python loops
run over kernel taps.

Max pooling reproduces PyTorch's choice of index exactly: the scan order is
row-major and a value replaces the current maximum when it is greater or NaN,
so ties go to the first maximum and NaNs to the last NaN; a window holding only
``-inf`` reports its first in-bounds element. The separable scan keeps those
rules, because the first row holding the window's maximum, scanned left to
right, holds the window's first maximum.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from ember.backend.rules import pool_out

if TYPE_CHECKING:
    from ember.backend.options import PoolOptions

__all__ = [
    "adaptive_avg_pool2d",
    "adaptive_avg_pool2d_backward",
    "adaptive_max_pool2d",
    "avg_pool2d",
    "avg_pool2d_backward",
    "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward",
]

_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))

# Bytes of padded input per block of samples in max pooling: about a quarter of L2.
_BLOCK_BYTES = 1 << 19


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float32 for half precision, else the dtype itself."""
    return np.dtype(np.float32) if dtype in _HALF else dtype


def _work(x: np.ndarray) -> np.ndarray:
    """``x`` in its working dtype (see :func:`_work_dtype`)."""
    return x.astype(np.float32) if x.dtype in _HALF else x


def _finish(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return out if out.dtype == dtype else out.astype(dtype)


class _Geometry:
    """Output sizes and padded extents of a 2-d pooling, per spatial dim.

    ``extent`` is the padded size the windows need: ``size + 2 * pad``, grown on
    the far side when ``ceil_mode`` lets the last window hang past the padding.
    """

    def __init__(self, shape: tuple[int, ...], options: PoolOptions) -> None:
        self.size = shape[2:]
        self.k, self.stride, self.pad, self.dil = (
            options.kernel_size, options.stride, options.padding, options.dilation,
        )  # fmt: skip
        self.out = tuple(
            pool_out(s, k, st, p, d, options.ceil_mode)
            for s, k, st, p, d in zip(self.size, self.k, self.stride, self.pad, self.dil)
        )
        self.extent = tuple(
            max(s + 2 * p, (o - 1) * st + d * (k - 1) + 1)
            for s, p, o, st, d, k in zip(
                self.size, self.pad, self.out, self.stride, self.dil, self.k
            )
        )

    def taps(self, dim: int) -> list[slice]:
        """For each kernel tap along ``dim``, the slice of the padded axis it reads for all outputs."""
        st, d, o = self.stride[dim], self.dil[dim], self.out[dim]
        return [slice(t * d, t * d + (o - 1) * st + 1, st) for t in range(self.k[dim])]

    def starts(self, dim: int) -> np.ndarray:
        """Per output, the (padded, possibly negative) input position of its window's first tap."""
        return np.arange(self.out[dim]) * self.stride[dim] - self.pad[dim]

    def first_valid(self, dim: int) -> np.ndarray:
        """Per output, the first in-bounds input position of its window along ``dim``."""
        d = self.dil[dim]
        start = self.starts(dim)
        # Windows starting in the left padding skip whole dilation steps, as PyTorch does.
        return np.where(start < 0, start + (-start + d - 1) // d * d, start)

    def counts(self, dim: int, include_pad: bool) -> np.ndarray:
        """Per output, how many taps of its window fall inside the input (or inside the
        padded input, with ``include_pad``): PyTorch's average-pooling divisor factor."""
        p, size = self.pad[dim], self.size[dim]
        pos = self.starts(dim)[:, None] + np.arange(self.k[dim]) * self.dil[dim]
        lo, hi = (-p, size + p) if include_pad else (0, size)
        return ((pos >= lo) & (pos < hi)).sum(axis=1)


def _padded(x: np.ndarray, geo: _Geometry, fill: float) -> np.ndarray:
    """``x`` in a fresh array of the padded extent, the border filled with ``fill``."""
    (eh, ew), (ph, pw), (h, w) = geo.extent, geo.pad, geo.size
    if (eh, ew) == (h, w):
        return x
    xp = np.full((*x.shape[:2], eh, ew), fill, x.dtype)
    xp[:, :, ph : ph + h, pw : pw + w] = x
    return xp


def _running_max(
    taps: list[np.ndarray],
    best: np.ndarray,
    tap: np.ndarray,
    scratch: tuple[np.ndarray, np.ndarray],
    has_nan: bool,
    carried: list[np.ndarray] | None = None,
    picked: np.ndarray | None = None,
) -> None:
    """Running maximum over ``taps`` (one view per window tap, in scan order) into ``best``.

    ``tap`` (pre-filled with the tap reported when nothing wins, the first
    in-bounds one) receives the number of the winning tap, and ``picked``
    (pre-filled likewise) the element of ``carried[t]`` at the winner. A value
    wins when greater than the running maximum or NaN, as in PyTorch.

    The tap number is kept as ``max(tap, t * update)``: a tap can only win after
    every earlier tap, so the newest winner always has the largest number.
    This and the rest are plain element-wise ufuncs writing into preallocated
    arrays, which NumPy vectorizes; a masked copy per tap would be slower.
    """
    update, stamp = scratch
    np.copyto(best, taps[0])
    if picked is not None:
        np.greater(best, -np.inf, out=update)
        if has_nan:
            update |= np.isnan(best)
        np.copyto(picked, carried[0], where=update)
    for t in range(1, len(taps)):
        v = taps[t]
        np.greater(v, best, out=update)
        if has_nan:
            update |= np.isnan(v)
        np.maximum(best, v, out=best)
        np.multiply(update, stamp.dtype.type(t), out=stamp)
        np.maximum(tap, stamp, out=tap)
        if picked is not None:
            np.copyto(picked, carried[t], where=update)


def max_pool2d_with_indices(x: np.ndarray, options: PoolOptions) -> tuple[np.ndarray, np.ndarray]:
    """2-d max pooling of ``[N, C, H, W]`` with padding, dilation and ``ceil_mode``, as
    ``torch.nn.functional.max_pool2d(..., return_indices=True)`` computes it.

    Returns the maxima and, as int64, the flat index ``h * W + w`` of each
    maximum within its input plane. Padding never wins (it is ``-inf`` and only
    a strictly greater value or a NaN replaces the current maximum).

    Samples are processed in blocks of about :data:`_BLOCK_BYTES` of padded
    input, so the half a dozen passes per tap run in L2 over preallocated
    buffers (fresh multi-megabyte temporaries would each cost page faults on
    top of the memory traffic). The loop runs once per block, not per sample.
    """
    dtype = x.dtype
    wd = _work_dtype(dtype)
    geo = _Geometry(x.shape, options)
    n, c = x.shape[:2]
    (eh, ew), (oh, ow), (ph, pw), (h, w) = geo.extent, geo.out, geo.pad, geo.size
    values = np.empty((n, c, oh, ow), wd)
    indices = np.empty((n, c, oh, ow), np.int64)
    if values.size == 0:
        return _finish(values, dtype), indices

    chunk = max(1, min(n, _BLOCK_BYTES // max(1, c * eh * ew * wd.itemsize)))
    direct = (eh, ew) == (h, w) and x.dtype == wd
    if not direct:
        xp = np.full((chunk, c, eh, ew), -np.inf, wd)  # the border stays -inf across blocks
        inner = xp[:, :, ph : ph + h, pw : pw + w]
    tap_dtype = np.min_scalar_type(max(geo.k))
    first_w = (geo.first_valid(1) - geo.starts(1)) // geo.dil[1]
    first_h = (geo.first_valid(0) - geo.starts(0)) // geo.dil[0]
    row_best = np.empty((chunk, c, eh, ow), wd)
    row_tap = np.empty((chunk, c, eh, ow), tap_dtype)
    row_scratch = (np.empty(row_best.shape, bool), np.empty(row_best.shape, tap_dtype))
    col_tap = np.empty((chunk, c, oh, ow), tap_dtype)
    col_w = np.empty((chunk, c, oh, ow), tap_dtype)
    col_scratch = (np.empty(col_tap.shape, bool), np.empty(col_tap.shape, tap_dtype))
    taps_w, taps_h = geo.taps(1), geo.taps(0)
    # The flat index of tap (0, 0) of every window, and the step of one tap along each dim.
    base = geo.starts(0)[:, None] * w + geo.starts(1)
    step_h, step_w = geo.dil[0] * w, geo.dil[1]
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        if direct:
            src = x[start : start + m]
        else:
            np.copyto(inner[:m], x[start : start + m])
            src = xp[:m]
        has_nan = bool(np.isnan(np.max(src)))
        # Along W for every padded row: each row's maximum and the tap it came from.
        rb, rt = row_best[:m], row_tap[:m]
        rt[...] = first_w
        _running_max(
            [src[:, :, :, s] for s in taps_w], rb, rt, tuple(a[:m] for a in row_scratch), has_nan
        )
        # Along H over those row maxima, carrying the W tap of the winning row.
        ct, cw = col_tap[:m], col_w[:m]
        ct[...] = first_h[:, None]
        cw[...] = first_w
        _running_max(
            [rb[:, :, s] for s in taps_h], values[start : start + m], ct,
            tuple(a[:m] for a in col_scratch), has_nan, [rt[:, :, s] for s in taps_h], cw,
        )  # fmt: skip
        idx = indices[start : start + m]
        np.multiply(ct, step_h, out=idx)
        idx += base
        idx += cw if step_w == 1 else cw * np.int64(step_w)
    return _finish(values, dtype), indices


def max_pool2d_with_indices_backward(
    x: np.ndarray, grad: np.ndarray, indices: np.ndarray, options: PoolOptions
) -> np.ndarray:
    """Gradient of :func:`max_pool2d_with_indices` with respect to ``x``: each output's
    gradient added at the input position its index names.

    When windows cannot overlap (stride at least the dilated window in both
    dims) every position is named at most once and a plain scatter does it;
    otherwise ``np.bincount`` sums the duplicates in one vectorized pass.
    """
    n, c, h, w = x.shape
    plane = h * w
    wd = _work_dtype(x.dtype)
    flat = (
        indices.reshape(n * c, math.prod(indices.shape[2:])) + (np.arange(n * c) * plane)[:, None]
    )
    disjoint = all(
        s >= d * (k - 1) + 1
        for s, d, k in zip(options.stride, options.dilation, options.kernel_size)
    )
    if disjoint:
        out = np.zeros(n * c * plane, wd)
        out[flat.ravel()] = grad.reshape(-1)
    else:
        out = np.bincount(
            flat.ravel(), weights=grad.reshape(-1).astype(np.float64), minlength=n * c * plane
        )
    return _finish(out.reshape(x.shape), x.dtype)


def _avg_divisor(geo: _Geometry, include_pad: bool) -> np.ndarray:
    div = geo.counts(0, include_pad)[:, None] * geo.counts(1, include_pad)
    return np.maximum(div, 1)  # a window with no element sums to 0; avoid 0 / 0


def avg_pool2d(x: np.ndarray, options: PoolOptions) -> np.ndarray:
    """2-d average pooling of ``[N, C, H, W]`` as ``torch.nn.functional.avg_pool2d``
    computes it, with ``count_include_pad`` and ``ceil_mode``: the divisor counts the
    window's taps inside the padded input (or inside the input only), and a
    window reaching past the padding in ceil mode counts only its part within.
    Dilation, which PyTorch lacks here, spaces the taps as in max pooling.
    """
    dtype = x.dtype
    xw = _work(x)
    geo = _Geometry(x.shape, options)
    xp = _padded(xw, geo, 0)
    taps_w, taps_h = geo.taps(1), geo.taps(0)
    rows = xp[:, :, :, taps_w[0]].copy()
    for s in taps_w[1:]:
        rows += xp[:, :, :, s]
    total = rows[:, :, taps_h[0]].copy()
    for s in taps_h[1:]:
        total += rows[:, :, s]
    total /= _avg_divisor(geo, options.count_include_pad).astype(total.dtype)
    return _finish(total, dtype)


def avg_pool2d_backward(x: np.ndarray, grad: np.ndarray, options: PoolOptions) -> np.ndarray:
    """Gradient of :func:`avg_pool2d` with respect to ``x``: each output's gradient,
    divided by its window's divisor, spread over the window's taps. The separable
    passes of the forward run in reverse (scatter along H, then along W)."""
    dtype = x.dtype
    geo = _Geometry(x.shape, options)
    wd = _work_dtype(dtype)
    g = grad.astype(wd) / _avg_divisor(geo, options.count_include_pad).astype(wd)
    n, c = x.shape[:2]
    rows = np.zeros((n, c, geo.extent[0], geo.out[1]), g.dtype)
    for s in geo.taps(0):
        rows[:, :, s] += g
    full = np.zeros((n, c, *geo.extent), g.dtype)
    for s in geo.taps(1):
        full[:, :, :, s] += rows
    (ph, pw), (h, w) = geo.pad, geo.size
    return _finish(np.ascontiguousarray(full[:, :, ph : ph + h, pw : pw + w]), dtype)


def _adaptive_windows(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows: output ``i`` covers ``[floor(i*size/out), ceil((i+1)*size/out))``."""
    i = np.arange(out)
    return (i * size) // out, -(-((i + 1) * size) // out)


def _window_matrix(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """The 0/1 matrix ``[out, size]`` summing each adaptive window, and the window lengths."""
    start, end = _adaptive_windows(size, out)
    pos = np.arange(size)
    return ((pos >= start[:, None]) & (pos < end[:, None])).astype(np.float64), end - start


def _apply_separable(x: np.ndarray, mh: np.ndarray, mw: np.ndarray) -> np.ndarray:
    """``mh @ x @ mw.T`` for every plane of ``x`` ``[N, C, H, W]``, as two large GEMMs.

    Both products run over all planes at once: along W the planes stack into
    one ``[N*C*H, W]`` matrix; along H the partial result is transposed to
    ``[H, N*C*w']`` first. A per-plane ``np.matmul`` would make N*C tiny BLAS
    calls, which dominates for e.g. global pooling of ``[64, 512, 7, 7]``.
    """
    n, c, h, w = x.shape
    oh, ow = mh.shape[0], mw.shape[0]
    t = x.reshape(n * c * h, w) @ mw.T.astype(x.dtype)
    t = np.ascontiguousarray(t.reshape(n * c, h, ow).transpose(1, 0, 2)).reshape(h, n * c * ow)
    t = mh.astype(x.dtype) @ t
    return np.ascontiguousarray(t.reshape(oh, n, c, ow).transpose(1, 2, 0, 3))


def adaptive_avg_pool2d(x: np.ndarray, output_size: tuple[int, int]) -> np.ndarray:
    """Adaptive average pooling of ``[N, C, H, W]`` to ``output_size``, as
    ``torch.nn.functional.adaptive_avg_pool2d`` computes it: the window sums are
    products with 0/1 window matrices along each dim, then divided by the
    window areas."""
    dtype = x.dtype
    xw = _work(x)
    (h, w), (oh, ow) = x.shape[2:], output_size
    if (oh, ow) == (1, 1):
        # Global pooling: the plane sums as one matrix-vector product (BLAS streams it;
        # NumPy's sum pays a per-plane overhead on small planes).
        out = (xw.reshape(-1, h * w) @ np.ones(h * w, xw.dtype)).reshape(*x.shape[:2], 1, 1)
        out /= np.asarray(h * w, out.dtype)
        return _finish(out, dtype)
    if h % oh == 0 and w % ow == 0:
        # Equal, disjoint windows: the window sums as one strided add per window column,
        # then one per window row. (NumPy's sum over the two inner axes of a reshaped view
        # runs an element at a time: 20x slower on the guide CNN's 24x24 -> 8x8.)
        kh, kw = h // oh, w // ow
        rows = xw[..., 0::kw].copy()
        for j in range(1, kw):
            rows += xw[..., j::kw]
        out = rows[:, :, 0::kh].copy()
        for i in range(1, kh):
            out += rows[:, :, i::kh]
        out /= np.asarray(kh * kw, out.dtype)
        return _finish(out, dtype)
    mh, lh = _window_matrix(h, oh)
    mw, lw = _window_matrix(w, ow)
    out = _apply_separable(xw, mh, mw)
    out /= (lh[:, None] * lw).astype(out.dtype)
    return _finish(out, dtype)


def adaptive_avg_pool2d_backward(x: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """Gradient of :func:`adaptive_avg_pool2d` with respect to ``x``: the transposed
    window matrices applied to the gradient divided by the window areas."""
    dtype = x.dtype
    (h, w), (oh, ow) = x.shape[2:], grad.shape[2:]
    wd = _work_dtype(dtype)
    if h % oh == 0 and w % ow == 0:
        # Equal, disjoint windows: every input gets its window's gradient / area.
        kh, kw = h // oh, w // ow
        g = grad.astype(wd) / np.asarray(kh * kw, wd)
        # Widened along W first (whole elements), then copied to the kh rows of each window
        # in runs of full rows: one broadcast over [.., ow, kw] runs NumPy's inner loop kw
        # elements at a time (2x slower on the guide CNN's 8x8 -> 24x24).
        rows = np.repeat(g, kw, axis=-1) if kw > 1 else g
        out = np.empty(x.shape, wd)
        out.reshape(*x.shape[:2], oh, kh, w)[...] = rows[:, :, :, None, :]
        return _finish(out, dtype)
    mh, lh = _window_matrix(h, oh)
    mw, lw = _window_matrix(w, ow)
    g = grad.astype(wd) / (lh[:, None] * lw).astype(wd)
    return _finish(_apply_separable(g, mh.T, mw.T), dtype)


def _adaptive_max_axis(x: np.ndarray, out: int, axis: int) -> np.ndarray:
    """Adaptive max along one axis. Tap ``j`` of every window reads position
    ``min(start + j, end - 1)``: repeating a window's last element cannot change
    its maximum, so windows of different lengths need no mask."""
    size = x.shape[axis]
    start, end = _adaptive_windows(size, out)
    if size % out == 0:
        shape = x.shape[:axis] + (out, size // out) + x.shape[axis + 1 :]
        return np.max(x.reshape(shape), axis=axis + 1)
    best = np.take(x, start, axis=axis)
    for j in range(1, int((end - start).max())):
        np.maximum(best, np.take(x, np.minimum(start + j, end - 1), axis=axis), out=best)
    return best


def adaptive_max_pool2d(x: np.ndarray, output_size: tuple[int, int]) -> np.ndarray:
    """Adaptive max pooling of ``[N, C, H, W]`` to ``output_size`` (values only), as
    ``torch.nn.functional.adaptive_max_pool2d`` computes it; NaN propagates."""
    dtype = x.dtype
    xw = _work(x)
    rows = _adaptive_max_axis(xw, output_size[1], 3)
    return _finish(_adaptive_max_axis(rows, output_size[0], 2), dtype)
