"""Resampling, padding and embedding kernels of the NdArray backend.

Every function is pure (inputs are never written to) and returns arrays of the
input's dtype. Half-precision floats are computed in float32 and cast back.

Interpolation is separable in every mode PyTorch offers here: the output is
the input resampled along W, then along H, each time as a weighted sum of a
few taps (1 for nearest, 2 for bilinear, 4 for bicubic) gathered with one
``np.take`` per tap over all planes at once. This is the order in which
PyTorch's CPU kernel evaluates its sums, so float64 results agree to the last
few bits. A dense ``[out, in]`` resampling matrix would be simpler but costs
``in`` multiply-adds per output instead of the tap count.

The backward pass applies the transposed maps: each tap's weighted gradient
is summed over the runs of outputs that share a source index (tap indices are
non-decreasing in the output index, so those outputs are adjacent) and added
at those distinct sources.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    from ember.backend.options import InterpolateOptions, PadOptions

__all__ = ["embedding", "embedding_backward", "interpolate", "interpolate_backward", "pad"]

_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))

# PyTorch's bicubic convolution constant.
_CUBIC_A = -0.75


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float32 for half precision, else the dtype itself."""
    return np.dtype(np.float32) if dtype in _HALF else dtype


def _finish(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return out if out.dtype == dtype else out.astype(dtype)


def _segment_sums(rows: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums the rows of ``rows`` ``[M, R]`` that share a key; ``keys`` ``[M]`` must be sorted.

    Returns the distinct keys and their sums ``[U, R]``. The runs of equal keys
    are summed as pairwise trees, one vectorized gather-add over all runs per
    level, so it takes ``log2(longest run)`` passes over a shrinking set of
    rows. (``np.add.reduceat`` and ``np.add.at`` pay NumPy's per-call overhead
    for every run and column, which is many times slower for short runs.)
    ``rows`` is consumed: the sums are accumulated in place.
    """
    m = keys.shape[0]
    if m == 0:
        return keys, rows
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    lengths = np.diff(np.append(starts, m))
    longest = int(lengths.max()) if m else 0
    if longest > 1:
        rank = np.arange(m) - np.repeat(starts, lengths)
        run_length = np.repeat(lengths, lengths)
        step = 1
        while step < longest:
            sel = np.flatnonzero((rank % (2 * step) == 0) & (rank + step < run_length))
            rows[sel] += rows[sel + step]
            step *= 2
    return keys[starts], rows[starts]


# ---------------------------------------------------------------- interpolation
def _nearest_taps(size: int, out: int) -> tuple[np.ndarray, None]:
    """PyTorch's legacy ``nearest`` source index ``floor(dst * in / out)``.

    PyTorch computes it in float32 (except for the exact 1x and 2x cases),
    and float32 rounding decides the floor for some sizes, so this does too.
    """
    dst = np.arange(out)
    if out == size:
        src = dst
    elif out == 2 * size:
        src = dst >> 1
    else:
        scale = np.float32(size) / np.float32(out)
        src = np.floor(dst.astype(np.float32) * scale).astype(np.int64)
        src = np.minimum(src, size - 1)
    return src[:, None], None


def _source_index(size: int, out: int, align_corners: bool, cubic: bool) -> np.ndarray:
    """PyTorch's ``area_pixel_compute_source_index`` for every output position."""
    dst = np.arange(out, dtype=np.float64)
    if align_corners:
        return dst * ((size - 1) / (out - 1) if out > 1 else 0.0)
    src = (dst + 0.5) * (size / out) - 0.5
    return src if cubic else np.maximum(src, 0.0)


def _linear_taps(size: int, out: int, align_corners: bool) -> tuple[np.ndarray, np.ndarray]:
    src = _source_index(size, out, align_corners, cubic=False)
    i0 = np.minimum(np.floor(src).astype(np.int64), size - 1)
    lam = np.clip(src - i0, 0.0, 1.0)
    i1 = i0 + (i0 < size - 1)
    return np.stack([i0, i1], axis=1), np.stack([1.0 - lam, lam], axis=1)


def _cubic_taps(size: int, out: int, align_corners: bool) -> tuple[np.ndarray, np.ndarray]:
    """Keys' cubic convolution with ``A = -0.75`` over taps ``floor(src) - 1 .. + 2``,
    each clamped to the input (PyTorch's border handling)."""
    src = _source_index(size, out, align_corners, cubic=True)
    i0 = np.minimum(np.floor(src).astype(np.int64), size - 1)
    t = np.clip(src - i0, 0.0, 1.0)
    a = _CUBIC_A

    def near(z):  # |z| <= 1
        return ((a + 2) * z - (a + 3)) * z * z + 1

    def far(z):  # 1 < |z| < 2
        return ((a * z - 5 * a) * z + 8 * a) * z - 4 * a

    weights = np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)
    idx = np.clip(i0[:, None] + np.arange(-1, 3), 0, size - 1)
    return idx, weights


def _taps(size: int, out: int, options: InterpolateOptions) -> tuple[np.ndarray, np.ndarray | None]:
    """Per output position along one dim: source indices ``[out, T]`` and weights
    ``[out, T]`` (``None`` for nearest, whose single weight is 1)."""
    if options.mode == "nearest":
        return _nearest_taps(size, out)
    if options.mode == "bilinear":
        return _linear_taps(size, out, options.align_corners)
    return _cubic_taps(size, out, options.align_corners)


def _resample_axis(
    x: np.ndarray, axis: int, idx: np.ndarray, weights: np.ndarray | None
) -> np.ndarray:
    """``sum_t x[..., idx[:, t], ...] * weights[:, t]`` along ``axis`` (summed in tap order)."""
    if weights is None:
        return np.take(x, idx[:, 0], axis=axis)
    shape = (-1,) + (1,) * (x.ndim - 1 - axis)
    w = weights.astype(x.dtype)
    out = np.take(x, idx[:, 0], axis=axis)
    out *= w[:, 0].reshape(shape)
    for t in range(1, idx.shape[1]):
        term = np.take(x, idx[:, t], axis=axis)
        term *= w[:, t].reshape(shape)
        out += term
    return out


def _resample_axis_transposed(
    g: np.ndarray, axis: int, idx: np.ndarray, weights: np.ndarray | None, size: int
) -> np.ndarray:
    """The transpose of :func:`_resample_axis`: scatters ``g`` back to ``size`` positions.

    The resampled axis is moved to the front of a contiguous copy, so every
    output position is one row and each tap's contributions are whole-row
    segment sums (tap indices never decrease along the output, so rows with a
    common source are adjacent).
    """
    if weights is None and idx.shape[0] % size == 0:
        k = idx.shape[0] // size
        if np.array_equal(idx[:, 0], np.arange(idx.shape[0]) // k):
            # Nearest upsampling by a whole factor: each source owns k adjacent outputs.
            shape = g.shape[:axis] + (size, k) + g.shape[axis + 1 :]
            return g.reshape(shape).sum(axis=axis + 1)
    moved = np.ascontiguousarray(np.moveaxis(g, axis, 0))
    rest = moved.shape[1:]
    flat = moved.reshape(moved.shape[0], -1)
    out = np.zeros((size, flat.shape[1]), g.dtype)
    owned = not np.shares_memory(moved, g)  # the sums below run in place
    for t in range(idx.shape[1]):
        if weights is not None:
            term = flat * weights[:, t].astype(g.dtype)[:, None]
        else:
            term = flat if owned else flat.copy()
        targets, sums = _segment_sums(term, idx[:, t])
        out[targets] += sums  # distinct targets: fancy += is exact
    return np.moveaxis(out.reshape(size, *rest), 0, axis)


def interpolate(
    x: np.ndarray, output_size: tuple[int, int], options: InterpolateOptions
) -> np.ndarray:
    """Resizes ``x`` ``[N, C, H, W]`` to ``output_size`` as ``torch.nn.functional.interpolate``
    does for ``mode`` nearest (legacy indexing; ``align_corners`` is ignored),
    bilinear and bicubic (``align_corners`` either way; bicubic taps outside the
    input are clamped to its border, and its results may overshoot the input
    range, as in PyTorch)."""
    dtype = x.dtype
    (h, w), (oh, ow) = x.shape[2:], output_size
    xw = x.astype(_work_dtype(dtype), copy=False)
    rows = _resample_axis(xw, 3, *_taps(w, ow, options))
    return _finish(_resample_axis(rows, 2, *_taps(h, oh, options)), dtype)


def interpolate_backward(
    x: np.ndarray, grad: np.ndarray, output_size: tuple[int, int], options: InterpolateOptions
) -> np.ndarray:
    """Gradient of :func:`interpolate` with respect to ``x`` (``grad`` has ``output_size``)."""
    dtype = x.dtype
    (h, w), (oh, ow) = x.shape[2:], output_size
    g = grad.astype(_work_dtype(dtype), copy=False)
    g = _resample_axis_transposed(g, 2, *_taps(h, oh, options), h)
    g = _resample_axis_transposed(g, 3, *_taps(w, ow, options), w)
    return _finish(np.ascontiguousarray(g), dtype)


# ---------------------------------------------------------------- padding
def _source_positions(size: int, before: int, after: int, mode: str) -> np.ndarray:
    """For each padded position, the input position it copies (reflect or edge),
    measured from the original bounds as PyTorch does, so negative pads crop."""
    src = np.arange(-before, size + after)
    if mode == "edge":
        return np.clip(src, 0, size - 1)
    src = np.abs(src)  # reflect about 0 ...
    return np.where(src > size - 1, 2 * (size - 1) - src, src)  # ... and about size - 1


def _pad_mirror(x: np.ndarray, pads: list[tuple[int, int]], mode: str) -> np.ndarray:
    """Reflect or edge padding with non-negative pads: one copy of ``x`` into the middle
    of the output, then each padded dim's borders copied from the output itself.

    Dims are filled in order over the full extent of the other dims, so a later
    dim's border rows are copied from rows an earlier dim already filled: the
    corners come out reflected (or replicated) twice, as in ``np.pad`` and
    PyTorch. Cheaper than ``np.pad``, which does the same with more overhead.
    """
    shape = tuple(s + b + a for s, (b, a) in zip(x.shape, pads))
    out = np.empty(shape, x.dtype)
    out[tuple(slice(b, b + s) for s, (b, _) in zip(x.shape, pads))] = x
    for axis, ((b, a), s) in enumerate(zip(pads, x.shape)):
        lead = (slice(None),) * axis
        end = b + s  # one past the last input position along this axis
        if mode == "edge":
            if b:
                out[(*lead, slice(0, b))] = out[(*lead, slice(b, b + 1))]
            if a:
                out[(*lead, slice(end, None))] = out[(*lead, slice(end - 1, end))]
        else:
            if b:
                out[(*lead, slice(0, b))] = out[(*lead, slice(2 * b, b, -1))]
            if a:
                stop = end - 2 - a
                out[(*lead, slice(end, None))] = out[
                    (*lead, slice(end - 2, stop if stop >= 0 else None, -1))
                ]
    return out


def pad(x: np.ndarray, options: PadOptions) -> np.ndarray:
    """Pads the trailing ``len(options.pads)`` dims of ``x`` (any dtype) with
    ``options.pads[i] = (before, after)`` for the i-th of those dims.

    Modes: ``constant`` (``options.value``, cast to the dtype), ``reflect``
    (mirror without repeating the edge) and ``edge`` (PyTorch's replicate).
    Negative pads crop, as in ``torch.nn.functional.pad``.
    """
    lead = x.ndim - len(options.pads)
    pads = [(0, 0)] * lead + [tuple(p) for p in options.pads]
    if options.mode == "constant":
        # Negative pads crop first; the rest is a fill and one copy of the kept block.
        crop = tuple(slice(max(0, -b), s - max(0, -a)) for (b, a), s in zip(pads, x.shape))
        kept = x[crop]
        shape = tuple(s + max(0, b) + max(0, a) for (b, a), s in zip(pads, kept.shape))
        out = np.full(shape, options.value, dtype=x.dtype)
        out[tuple(slice(max(0, b), max(0, b) + s) for (b, _), s in zip(pads, kept.shape))] = kept
        return out
    if all(b >= 0 and a >= 0 for b, a in pads):
        return _pad_mirror(x, pads, options.mode)
    out = x
    for axis, (b, a) in enumerate(pads):
        if b or a:
            out = np.take(out, _source_positions(x.shape[axis], b, a, options.mode), axis=axis)
    return out if out is not x else x.copy()


# ---------------------------------------------------------------- embedding
def embedding(weights: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Rows of ``weights`` ``[V, D]`` gathered by ``indices`` (any shape) into ``[*indices, D]``."""
    return np.take(weights, indices, axis=0)


def embedding_backward(weights: np.ndarray, grad: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Gradient of :func:`embedding` with respect to ``weights``: the rows of ``grad``
    ``[*indices, D]`` summed per index into ``[V, D]``.

    The rows are sorted by index and the runs of equal indices summed with
    :func:`_segment_sums`: a sort of the indices plus about one pass over
    ``grad``, however often indices repeat.
    """
    dtype = weights.dtype
    wd = _work_dtype(dtype)
    vocab, dim = weights.shape
    out = np.zeros((vocab, dim), wd)
    idx = indices.reshape(-1).astype(np.int64, copy=False)
    if idx.size == 0:
        return _finish(out, dtype)
    if idx.min() < 0:
        idx = np.where(idx < 0, idx + vocab, idx)
    order = np.argsort(idx, kind="stable")
    rows = grad.reshape(-1, dim)[order].astype(wd, copy=False)  # a fresh array: summed in place
    targets, sums = _segment_sums(rows, idx[order])
    out[targets] = sums
    return _finish(out, dtype)
