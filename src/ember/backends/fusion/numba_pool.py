"""2-d max and average pooling forward as hand-written numba kernels (a candidate beside
NdArray's separable NumPy passes).

:func:`max_pool2d_with_indices` and :func:`avg_pool2d` compute exactly what
:mod:`ember.backends.ndarray.pool`'s functions of the same names compute (padding,
dilation, ``ceil_mode``, ``count_include_pad``; PyTorch's choice of max index: row-major
scan, a value wins when greater or NaN, a window of only ``-inf`` reports its first
in-bounds element), for float32 and float64. Other dtypes raise :class:`KernelUnsupported`.

Layout: one task per (sample, channel) plane. The plane is copied into the phased, padded
buffer of :func:`~ember.backends.fusion.numba_conv.pack_phases` (padding ``-inf`` for max,
0 for average), so every window tap is a stride-1 run over whole rows of the output
(``q = oh * wq + ow``, the extra ``wq - ow`` columns per row dropped at the end), and the
kernel makes one contiguous, vectorized pass per tap over the plane's running maxima (and
winning tap numbers) or sums, which stay in L1 for the planes of a CNN. The NdArray kernels
instead make about six NumPy passes per tap over whole batches.

Kernels take ``part, parts`` and run through ``numba_runtime._run_parts`` like
:mod:`~ember.backends.fusion.numba_conv`'s. The max kernel is compiled without fast-math
(its NaN tests must stay); the average kernel with ``reassoc`` (its sums may be added in
another order than NdArray's: equal to rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ember.backend.errors import ShapeError, fmt_shape
from ember.backend.rules import pool_out
from ember.backends.fusion.numba_conv import LANES, KernelUnsupported, pack_phases

if TYPE_CHECKING:
    from ember.backend.options import PoolOptions

try:  # numba is optional: the functions raise KernelUnsupported without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["KernelUnsupported", "avg_pool2d", "max_pool2d_with_indices"]

PARALLEL_MIN_ELEMENTS = 1 << 18
"""Poolings over fewer input elements run on one thread (waking others costs more)."""

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _jit(**flags):
    def wrap(fn):
        if numba is None:  # pragma: no cover - exercised where numba is missing
            return fn
        return numba.njit(nogil=True, cache=True, error_model="numpy", **flags)(fn)

    return wrap


@_jit()
def _max_pool(x, values, indices, used, first_h, first_w, kh, kw, sh, sw, ph, pw, dh, dw,
              hq, wq, part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Running maximum and winning tap per output position, one plane per task;
    ``first_h`` / ``first_w``: per output row / column, the first in-bounds tap."""
    n_all = x.shape[0]
    c_all = x.shape[1]
    w = x.shape[3]
    oh = values.shape[2]
    ow = values.shape[3]
    plane = hq * wq
    xq = np.full(sh * sw * plane + wq + LANES, -np.inf, x.dtype)
    length = -(-oh * wq // LANES) * LANES
    best = np.empty(length, x.dtype)
    tap = np.empty(length, np.int32)
    tasks = n_all * c_all
    for task in range(tasks * part // parts, tasks * (part + 1) // parts):
        n = task // c_all
        c = task % c_all
        pack_phases(x, xq, used, n, c, 1, sh, sw, ph, pw, hq, wq, -np.inf)
        for q in range(length):
            best[np.uintp(q)] = -np.inf
            tap[np.uintp(q)] = -1
        t = 0
        for i in range(kh):
            for j in range(kw):
                p = ((i * dh % sh) * sw + j * dw % sw) * plane + (i * dh // sh) * wq + j * dw // sw
                for q in range(length):
                    v = xq[np.uintp(p + q)]
                    b = best[np.uintp(q)]
                    wins = (v > b) | (v != v)
                    best[np.uintp(q)] = v if wins else b
                    tap[np.uintp(q)] = t if wins else tap[np.uintp(q)]
                t += 1
        for r in range(oh):
            src = r * wq
            dst_v = values[n, c, r]
            dst_i = indices[n, c, r]
            for jj in range(ow):
                q = np.uintp(src + jj)
                won = tap[q]
                i = first_h[r] if won < 0 else won // kw
                j = first_w[jj] if won < 0 else won % kw
                dst_v[np.uintp(jj)] = best[q]
                dst_i[np.uintp(jj)] = (r * sh - ph + i * dh) * w + jj * sw - pw + j * dw


@_jit(fastmath={"reassoc"})
def _avg_pool(x, out, used, div_h, div_w, kh, kw, sh, sw, ph, pw, dh, dw, hq, wq,
              part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Window sums over the zero-padded plane, divided by ``div_h[oh] * div_w[ow]``."""
    n_all = x.shape[0]
    c_all = x.shape[1]
    oh = out.shape[2]
    ow = out.shape[3]
    plane = hq * wq
    xq = np.zeros(sh * sw * plane + wq + LANES, x.dtype)
    length = -(-oh * wq // LANES) * LANES
    acc = np.empty(length, x.dtype)
    tasks = n_all * c_all
    for task in range(tasks * part // parts, tasks * (part + 1) // parts):
        n = task // c_all
        c = task % c_all
        pack_phases(x, xq, used, n, c, 1, sh, sw, ph, pw, hq, wq, 0.0)
        for q in range(length):
            acc[np.uintp(q)] = 0
        for i in range(kh):
            for j in range(kw):
                p = ((i * dh % sh) * sw + j * dw % sw) * plane + (i * dh // sh) * wq + j * dw // sw
                for q in range(length):
                    acc[np.uintp(q)] += xq[np.uintp(p + q)]
        for r in range(oh):
            src = r * wq
            dst = out[n, c, r]
            for jj in range(ow):
                dst[np.uintp(jj)] = acc[np.uintp(src + jj)] / (div_h[r] * div_w[jj])


def _geometry(x: np.ndarray, options: PoolOptions) -> tuple:
    """Output size, phased plane size and used phases; raises for what the kernels lack."""
    if numba is None:
        raise KernelUnsupported("numba pooling: numba is not installed")
    if np.dtype(x.dtype) not in _DTYPES:
        raise KernelUnsupported(f"numba pooling: dtype {x.dtype} is not supported")
    if x.ndim != 4:
        raise ShapeError(f"numba pooling: input {fmt_shape(x.shape)} must be 4-d")
    (kh, kw), (sh, sw) = options.kernel_size, options.stride
    (ph, pw), (dh, dw) = options.padding, options.dilation
    h, w = x.shape[2:]
    oh = pool_out(h, kh, sh, ph, dh, options.ceil_mode)
    ow = pool_out(w, kw, sw, pw, dw, options.ceil_mode)
    if oh < 1 or ow < 1:
        raise ShapeError(
            f"numba pooling: input {fmt_shape(x.shape)} is too small for window {kh}x{kw}"
        )
    hq = oh + dh * (kh - 1) // sh
    wq = ow + dw * (kw - 1) // sw
    used = np.zeros((sh, sw), np.bool_)
    used[np.ix_(np.arange(kh) * dh % sh, np.arange(kw) * dw % sw)] = True
    return oh, ow, hq, wq, used.reshape(-1)


def _counts(out: int, size: int, k: int, stride: int, pad: int, dil: int, include_pad: bool):
    """Per output along one dim, its window's taps inside the input (or the padded input)."""
    pos = (np.arange(out) * stride - pad)[:, None] + np.arange(k) * dil
    lo, hi = (-pad, size + pad) if include_pad else (0, size)
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def max_pool2d_with_indices(
    x: np.ndarray, options: PoolOptions, threads: int | None = None, empty: Callable = np.empty
) -> tuple[np.ndarray, np.ndarray]:
    """2-d max pooling of ``[N, C, H, W]``: the maxima and, as int64, the flat index
    ``h * W + w`` of each within its plane, as
    :func:`ember.backends.ndarray.pool.max_pool2d_with_indices` computes them;
    ``empty(shape, dtype)`` makes the outputs (a pool's ``take``, say)."""
    oh, ow, hq, wq, used = _geometry(x, options)
    n, c = x.shape[:2]
    values = empty((n, c, oh, ow), x.dtype)
    indices = empty((n, c, oh, ow), np.int64)
    if values.size == 0:
        return values, indices
    (kh, kw), (sh, sw) = options.kernel_size, options.stride
    (ph, pw), (dh, dw) = options.padding, options.dilation
    # The first tap of each window that is not in the left/top padding.
    start_h, start_w = np.arange(oh) * sh - ph, np.arange(ow) * sw - pw
    first_h = np.where(start_h < 0, (-start_h + dh - 1) // dh, 0).astype(np.int64)
    first_w = np.where(start_w < 0, (-start_w + dw - 1) // dw, 0).astype(np.int64)
    from ember.backends.fusion.numba_runtime import _run_parts, parts_for

    args = [x, values, indices, used, first_h, first_w, kh, kw, sh, sw, ph, pw, dh, dw, hq, wq]
    _run_parts(_max_pool, args, parts_for(x.size, PARALLEL_MIN_ELEMENTS, threads))
    return values, indices


def avg_pool2d(x: np.ndarray, options: PoolOptions, threads: int | None = None,
               empty: Callable = np.empty) -> np.ndarray:  # fmt: skip
    """2-d average pooling of ``[N, C, H, W]`` as
    :func:`ember.backends.ndarray.pool.avg_pool2d` computes it; ``empty(shape, dtype)``
    makes the output (a pool's ``take``, say)."""
    oh, ow, hq, wq, used = _geometry(x, options)
    n, c, h, w = x.shape
    out = empty((n, c, oh, ow), x.dtype)
    if out.size == 0:
        return out
    (kh, kw), (sh, sw) = options.kernel_size, options.stride
    (ph, pw), (dh, dw) = options.padding, options.dilation
    include = options.count_include_pad
    # Clamped per dim: the ndarray kernel clamps the product, and a product is 0 only
    # when a factor is (the window then sums to 0 either way).
    div_h = np.maximum(_counts(oh, h, kh, sh, ph, dh, include), 1).astype(x.dtype)
    div_w = np.maximum(_counts(ow, w, kw, sw, pw, dw, include), 1).astype(x.dtype)
    from ember.backends.fusion.numba_runtime import _run_parts, parts_for

    args = [x, out, used, div_h, div_w, kh, kw, sh, sw, ph, pw, dh, dw, hq, wq]
    _run_parts(_avg_pool, args, parts_for(x.size, PARALLEL_MIN_ELEMENTS, threads))
    return out
