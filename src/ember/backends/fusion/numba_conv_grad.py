"""Gradients of 2-d convolution as numba kernels: candidates beside NdArray's backward ops.

:func:`conv2d_x_backward` and :func:`conv2d_weight_backward` compute what
``NdArray().conv_x_backward`` / ``conv_weight_backward`` compute (the gradients of
:func:`ember.backends.ndarray.conv.conv2d` for its input and its weight, given the output
gradient ``grad``), for float32 and float64, with stride, zero padding, dilation and groups.
Other dtypes, or a missing numba, raise :class:`KernelUnsupported` so that a caller falls
back to the NdArray ops.

**Input gradient** (``dx [N, C, H, W]``). Input row ``i`` receives ``grad[o] * w[t]`` for
every tap ``t`` and output row ``o`` with ``o * s + t * d - p == i``. Split the input rows
by their *phase* ``r = (i + p) % s``: the taps that reach phase ``r`` are those with
``t * d % s == r``, evenly spaced, and each phase is a *stride-1* correlation of ``grad``
with those taps, flipped (a sub-pixel decomposition: no zeros are inserted into ``grad``,
so no multiply-add is wasted at stride 2). Each phase (pair of row and column phases) runs
the kernels of :mod:`ember.backends.fusion.numba_conv` (:func:`_correlate_into`) on
``grad`` itself with the weight's channels exchanged (``[C, O/g, kh', kw']`` per group):
their packing pads ``grad`` with zeros on both sides, or crops it, and their write-out
stores straight into the phase's strided view of ``dx`` (measured: a padded copy of
``grad`` and a scatter of each phase into ``dx`` made the stride-2 case 2.7x slower). At
stride 1 there is one phase: the correlation with padding ``d (k - 1) - p``; where that
padding is even on both sides it runs as :func:`numba_conv.conv2d` of ``grad`` by the
flipped weight, on the forward's register-tiled kernel. A *small* strided gradient
(:data:`ZERO_INSERT_MAX_MACS`) runs that way too, on the gradient spread out with zeros
between its elements: ``stride**2`` times the multiply-adds, but one kernel run, where
each phase's set-up would cost more than its arithmetic.

**Weight gradient** (``dw [O, C/g, kh, kw]``): ``dw[o, c, t] = sum over (n, oh, ow) of
grad[n, o, oh, ow] * x_padded[n, c, oh sh + kh dh, ow sw + kw dw]``, a reduction, by
:func:`_weight_blocked`:

* **Shared position numbering.** A chunk of samples is copied into a phased, padded buffer
  as ``numba_conv`` does (``xq[c, a, b, n, i, j] = x_padded[n, c, i sh + a, j sw + b]``,
  planes of ``hq x wq``), and ``grad`` into ``gq[o, n, i, j]`` on the *same* planes, zero
  outside ``oh x ow``. A position ``u = (n * hq + i) * wq + j`` then numbers both: tap
  ``(c, kh, kw)`` reads ``xq[offset(tap) + u]``, so each ``(o, tap)`` sum is one long dot
  product of two contiguous runs over every sample of the chunk (the zeros of ``gq`` drop
  the extra columns and rows, and whatever they meet of the next sample).
* **Register blocking.** The inner loop adds the products of :data:`OB` gradient rows with
  :data:`TB` taps: per vector of positions 10 loads and 24 FMAs into 24 vector
  accumulators, which are summed (horizontally) once per tile of :data:`TILE` positions.
  Without AVX-512 (16 vector registers) the loop takes 3 taps, :func:`_taps3`:
  7 loads and 12 FMAs (measured on Zen 3, one thread: 2.1-2.4x faster than the 24
  accumulators, which spilled; 1.6-1.9x at two threads).
  Groups of fewer than :data:`OB` output channels (depthwise) run a one-channel variant,
  :func:`_weight_single`, over :data:`TB_SINGLE` taps per pass.
* **Parts** take contiguous chunks of samples; each adds into its own float64 partial sums,
  added up at the end (so results do not depend on the thread count's timing, only on it).
* **Non-finite inputs.** The dropped positions multiply input values by zeros of ``gq``: an
  infinite or NaN input value makes NaN in more entries of ``dw`` than in NdArray's.

Measured (Zen 5, float32, one thread, busy machine; ``benchmarks/bench_conv_kernels.py
--backward``): on every 3x3 case both gradients take 0.2-0.6 of the time of NdArray's
(guide CNN, batch 64: input gradient of the second layer 2.16 -> 0.76 ms, weight gradients
0.29 -> 0.12 and 1.73 -> 0.55 ms), faster than torch's on the guide layers, depthwise and
the strided input gradient, 1.05-1.6x slower on the wide layers. The weight gradient of a
1x1 convolution (a plain GEMM) is 1.4x slower than NdArray's: the tuner keeps NdArray's.

Kernels are compiled with ``fastmath={'contract', 'reassoc'}``: sums may be added in
another order than NdArray's (the results agree to rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ember.backend.errors import ShapeError, fmt_shape
from ember.backend.options import ConvOptions
from ember.backends.fusion import numba_conv
from ember.backends.fusion.numba_conv import LANES, _split_row
from ember.backends.fusion.numba_source import KernelUnsupported
from ember.backends.fusion.numba_tile import VECTOR_BYTES

try:  # numba is optional: the functions raise KernelUnsupported without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["KernelUnsupported", "conv2d_weight_backward", "conv2d_x_backward", "supports"]

OB = 4
"""Output channels (gradient rows) one inner loop of the weight gradient reads."""
TB = 6 if VECTOR_BYTES == 64 else 3
"""Taps one inner loop of the weight gradient reads. With AVX-512, ``OB * TB`` = 24 vector
accumulators (the taps' loads fold into the FMAs); measured on Zen 5, float32, one thread:
5-15% faster than 4 taps; 8 channels x 3 taps and 6 x 4 were slower. AVX2's 16 registers
hold 12 accumulators beside the loads (:func:`_taps3`): 24 spilled, and the
guide CNN's second-layer weight gradient ran at 27 GFLOP/s on a Zen 3 core."""
TB_SINGLE = 8
"""Taps per pass of the one-channel (depthwise) weight gradient kernel."""
TILE = 2048
"""Positions per tile of the weight gradient: the accumulators are summed once per tile."""
CHUNK_BYTES = 1 << 21
"""Bytes of packed input and gradient per chunk of samples (per part)."""
PARALLEL_MIN_MACS = numba_conv.PARALLEL_MIN_MACS
"""Below this many multiply-adds a gradient runs on one thread (see ``numba_conv``)."""
ZERO_INSERT_MAX_MACS = 1 << 23
"""Multiply-adds, at most, of a strided input gradient run as one stride-1 convolution of
the zero-spread output gradient (:func:`_zero_inserted`): ``stride**2`` times the work of
the phases, but one kernel run instead of one per phase, whose set-up dominates at this
size (the gradient-penalty critic's 16 -> 8 channel layer, 6x6 -> 13x13 at stride 2,
batch 32: 0.59 -> 0.30 ms at one thread, 1.0 -> 0.46 ms at two)."""

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_FLAGS = {"contract", "reassoc"}


def supports(x: np.ndarray, weight: np.ndarray, grad: np.ndarray) -> bool:
    """Whether the gradients take these arrays (numba present; 4-d float32 / float64)."""
    return (numba is not None and x.ndim == 4 and x.dtype in _DTYPES
            and weight.dtype == x.dtype and grad.dtype == x.dtype)  # fmt: skip


def _jit(fn):
    if numba is None:  # pragma: no cover - exercised where numba is missing
        return fn
    return numba.njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy")(fn)


def _check(x: np.ndarray, weight: np.ndarray, grad: np.ndarray, options: ConvOptions,
           what: str) -> tuple[int, int]:  # fmt: skip
    """Raises unless the gradient is computable here; returns the forward's output size."""
    if numba is None:
        raise KernelUnsupported(f"numba {what}: numba is not installed")
    for a in (x, weight, grad):
        if np.dtype(a.dtype) not in _DTYPES or a.dtype != x.dtype:
            raise KernelUnsupported(f"numba {what}: dtype {a.dtype} is not supported")
    if x.ndim != 4 or weight.ndim != 4 or grad.ndim != 4:
        raise ShapeError(
            f"numba {what}: input {fmt_shape(x.shape)}, weight {fmt_shape(weight.shape)} and "
            f"grad {fmt_shape(grad.shape)} must all be 4-d"
        )
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    groups = options.groups
    if groups < 1 or c % groups or o % groups or cg * groups != c:
        raise ShapeError(
            f"numba {what}: input {fmt_shape(x.shape)} and weight {fmt_shape(weight.shape)} "
            f"do not fit groups={groups}"
        )
    (sh, sw), (ph, pw), (dh, dw) = options.stride, options.padding, options.dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if grad.shape != (n, o, oh, ow):
        raise ShapeError(
            f"numba {what}: grad {fmt_shape(grad.shape)} is not the output "
            f"{fmt_shape((n, o, oh, ow))} of input {fmt_shape(x.shape)} and weight "
            f"{fmt_shape(weight.shape)}"
        )
    return oh, ow


def _parts(macs: int, threads: int | None) -> int:
    from ember.backends.fusion.numba_runtime import parts_for

    return parts_for(macs, PARALLEL_MIN_MACS, threads)


# ------------------------------------------------------------------------- input gradient
def _phases(size: int, k: int, s: int, p: int, d: int) -> list[tuple]:
    """Along one dim, per phase ``r`` that has input rows and taps: ``(taps, dilation,
    first input row, rows, grad start)`` of its stride-1 correlation (taps in the flipped
    order of the correlation; ``grad start`` is the row of ``grad`` its first output reads,
    negative within the zero padding; see the module doc)."""
    phases = []
    for r in range(s):
        taps = [t for t in range(k) if t * d % s == r]
        m_lo = -((r - p) // s)  # first m with input row s m + r - p >= 0
        rows = (size - 1 + p - r) // s - m_lo + 1
        if not taps or rows <= 0:
            continue
        dil = (taps[1] - taps[0]) * d // s if len(taps) > 1 else 1
        reach = (taps[0] * d - r) // s + (len(taps) - 1) * dil
        first = s * m_lo + r - p
        phases.append((taps[::-1], dil, first, rows, m_lo - reach))
    return phases


def _correlate_into(grad: np.ndarray, sub: np.ndarray, out: np.ndarray, pad: tuple[int, int],
                    dilation: tuple[int, int], groups: int, parts: int) -> None:  # fmt: skip
    """Writes into ``out`` ``[N, C, rows, cols]`` (any strides: a phase of ``dx``) the
    stride-1 correlation of ``grad`` ``[N, O, oh, ow]`` by ``sub`` ``[C, O/g, jh, jw]``, with
    ``pad`` zero rows and columns before ``grad`` (negative: that many are skipped) and as
    many after it as ``out`` needs.

    This is :func:`numba_conv.conv2d`'s set-up around its kernels: their packing copies
    the window of ``grad`` (its ``fill`` of zeros pads both ends, a negative padding crops)
    and their write-out stores into ``out`` in place, so neither a padded copy of ``grad``
    nor a scatter of each phase into ``dx`` is made."""
    c, og, jh, jw = sub.shape
    cg = c // groups  # the output channels of a group: the correlation's own "og"
    dh, dw = dilation
    rows, cols = out.shape[2:]
    hq, wq = rows + dh * (jh - 1), cols + dw * (jw - 1)
    single = 9 if (og * jh * jw) % 9 == 0 else numba_conv.SINGLE_UNROLL
    unroll = numba_conv.UNROLL if cg >= numba_conv.OB else single
    offs = numba_conv._offsets(og, jh, jw, 1, 1, dh, dw, hq, wq, unroll)
    taps = offs.size
    used = np.ones(1, np.bool_)
    w_taps = np.zeros((groups, cg, taps), sub.dtype)
    w_taps[:, :, : og * jh * jw] = sub.reshape(groups, cg, og * jh * jw)
    rows_per_tile = max(1, min(rows, -(-numba_conv.TILE // wq)))
    geometry = (1, 1, pad[0], pad[1], hq, wq, groups, og)
    from ember.backends.fusion.numba_runtime import _run_parts

    if cg < numba_conv.OB:
        wt = w_taps.reshape(c, taps // single, single)
        args = [grad, wt, offs, used, np.zeros(c, sub.dtype), out]
        _run_parts(numba_conv._conv_single, [*args, *geometry, rows_per_tile], parts)
        return
    ob = numba_conv.OB
    nblk = -(-cg // ob)
    wt = np.zeros((groups, nblk * ob, taps), sub.dtype)
    wt[:, :cg] = w_taps
    wt = np.ascontiguousarray(
        wt.reshape(groups, nblk, ob, taps // unroll, unroll).transpose(0, 1, 3, 4, 2)
    ).reshape(groups * nblk, taps // unroll, unroll, ob)
    args = [grad, wt, offs, used, np.zeros((groups * nblk, ob), sub.dtype), out]
    _run_parts(numba_conv._conv_blocked, [*args, *geometry, nblk, rows_per_tile], parts)


def conv2d_x_backward(
    x: np.ndarray,
    weight: np.ndarray,
    grad: np.ndarray,
    options: ConvOptions,
    threads: int | None = None,
    empty: Callable = np.empty,
) -> np.ndarray:
    """Gradient of ``conv2d(x, weight)`` for ``x`` given the output gradient ``grad``
    (``[N, C, H, W]``, ``x``'s dtype; ``x`` is read only for its shape).

    ``threads`` parts run each phase (default: one for a phase of fewer than
    :data:`PARALLEL_MIN_MACS` multiply-adds, else ``EMBER_FUSION_THREADS`` or every core). Raises
    :class:`KernelUnsupported` for dtypes other than float32 / float64 or without numba, and
    :class:`~ember.backend.errors.ShapeError` for shapes that do not fit. ``empty(shape,
    dtype)`` makes the output (a pool's ``take``, say).
    """
    _check(x, weight, grad, options, "conv2d_x_backward")
    c, h, w = x.shape[1:]
    o, cg, kh, kw = weight.shape
    groups = options.groups
    og = o // groups
    (sh, sw), (ph, pw), (dh, dw) = options.stride, options.padding, options.dilation
    phases_h = _phases(h, kh, sh, ph, dh)
    phases_w = _phases(w, kw, sw, pw, dw)
    # Every input row and column in a phase with taps: each is written once.
    covered = sum(p[3] for p in phases_h) == h and sum(p[3] for p in phases_w) == w
    if grad.size == 0 or x.size == 0:
        return np.zeros(x.shape, x.dtype)
    # The weight with its channels exchanged per group: [C, O/g, kh, kw].
    wt = weight.reshape(groups, og, cg, kh, kw).transpose(0, 2, 1, 3, 4).reshape(c, og, kh, kw)
    if sh == sw == 1 and len(phases_h) == len(phases_w) == 1:
        # One phase (stride 1) that pads ``grad`` evenly: a plain convolution of ``grad``
        # with the flipped weight, on the forward's register-tiled kernel (measured: an
        # 8 -> 16 channel 3x3 layer at 26x26, batch 32, 2.0 -> 1.3 ms).
        (taps_h, dil_h, _, _, start_h), (taps_w, dil_w, _, _, start_w) = (
            phases_h[0], phases_w[0])  # fmt: skip
        pad = (-start_h, -start_w)
        even = all(
            p >= 0 and size + 2 * p - d * (len(t) - 1) == full
            for size, p, d, t, full in zip(grad.shape[2:], pad, (dil_h, dil_w),
                                           (taps_h, taps_w), (h, w))
        )  # fmt: skip
        if even:
            sub = np.ascontiguousarray(wt[:, :, taps_h][:, :, :, taps_w])
            flipped = ConvOptions((1, 1), pad, (dil_h, dil_w), groups)
            return numba_conv.conv2d(grad, sub, None, flipped, threads, empty)
    if (sh > 1 or sw > 1) and x.size * og * kh * kw <= ZERO_INSERT_MAX_MACS:
        reach_h, reach_w = dh * (kh - 1) - ph, dw * (kw - 1) - pw
        if reach_h >= 0 and reach_w >= 0:
            return _zero_inserted(grad, wt, x.shape, options, (reach_h, reach_w), threads, empty)
    dx = empty(x.shape, x.dtype)
    if not covered:
        dx.fill(0)
    for taps_h, dil_h, first_h, rows_h, start_h in phases_h:
        for taps_w, dil_w, first_w, rows_w, start_w in phases_w:
            sub = np.ascontiguousarray(wt[:, :, taps_h][:, :, :, taps_w])
            out = dx[:, :, first_h::sh, first_w::sw][:, :, :rows_h, :rows_w]
            # Each phase is a kernel run of its own: the threshold is per phase (measured:
            # the 4 phases of a 38 M multiply-add stride-2 gradient ran slower on 2 threads).
            parts = _parts(out.size * og * len(taps_h) * len(taps_w), threads)
            _correlate_into(grad, sub, out, (-start_h, -start_w), (dil_h, dil_w), groups, parts)
    return dx


def _zero_inserted(grad: np.ndarray, wt: np.ndarray, x_shape: tuple[int, ...],
                   options: ConvOptions, reach: tuple[int, int], threads: int | None,
                   empty: Callable) -> np.ndarray:  # fmt: skip
    """The input gradient of a small strided convolution as one stride-1 convolution: the
    output gradient with ``stride - 1`` zeros between its elements (and the rows and
    columns the forward's stride dropped at the end), padded by ``reach = d (k - 1) - p``
    on each side, by the flipped weight with its channels exchanged (``wt``)."""
    n, o, oh, ow = grad.shape
    (sh, sw), (dh, dw) = options.stride, options.dilation
    kh, kw = wt.shape[2:]
    spread_h, spread_w = (oh - 1) * sh + 1, (ow - 1) * sw + 1
    rows = x_shape[2] - 2 * reach[0] + dh * (kh - 1)  # the dropped ones end up zero
    cols = x_shape[3] - 2 * reach[1] + dw * (kw - 1)
    spread = np.zeros((n, o, rows, cols), grad.dtype)
    spread[:, :, :spread_h:sh, :spread_w:sw] = grad
    flipped = np.ascontiguousarray(wt[:, :, ::-1, ::-1])
    stride_1 = ConvOptions((1, 1), reach, (dh, dw), options.groups)
    return numba_conv.conv2d(spread, flipped, None, stride_1, threads, empty)


# ------------------------------------------------------------------------ weight gradient
@_jit
def _pack(x, grad, xq, gq, n0, nb, chunk, sh, sw, ph, pw, hq, wq, groups, ogp):  # pragma: no cover
    """Copies samples ``n0 .. n0 + nb`` of ``x`` into ``xq`` ``[C, sh, sw, chunk, hq, wq]``
    (zero-padded, phased) and of ``grad`` into ``gq`` ``[groups * ogp, chunk, hq, wq]``
    (rows ``>= oh`` and columns ``>= ow`` stay zero); both flat."""
    c_all = x.shape[1]
    h = x.shape[2]
    w = x.shape[3]
    o_all = grad.shape[1]
    oh = grad.shape[2]
    ow = grad.shape[3]
    og = o_all // groups
    plane = hq * wq
    # At column stride 2 each row is split into both column phases at once, as
    # numba_conv.pack_phases does: a loop per phase becomes vector gathers (slow).
    padded = np.zeros(max(2 * wq, pw + w), xq.dtype)
    for c in range(c_all):
        for a in range(sh):
            if sw == 2:
                for s in range(nb):
                    start = (((c * sh + a) * 2) * chunk + s) * plane
                    for i in range(hq):
                        row = i * sh + a - ph
                        if 0 <= row < h:
                            _split_row(x[n0 + s, c, row], xq, start + i * wq,
                                       start + chunk * plane + i * wq, padded, pw, wq)  # fmt: skip
                continue
            for b in range(sw):
                jlo = min(wq, max(0, (pw - b + sw - 1) // sw))
                jhi = max(jlo, min(wq, (w + pw - b + sw - 1) // sw))
                shift = b - pw
                for s in range(nb):
                    start = (((c * sh + a) * sw + b) * chunk + s) * plane
                    for i in range(hq):
                        row = i * sh + a - ph
                        if row < 0 or row >= h:
                            continue  # stays zero
                        dst = start + i * wq
                        src = x[n0 + s, c, row]
                        for j in range(jlo, jhi):
                            xq[np.uintp(dst + j)] = src[np.uintp(j * sw + shift)]
    for oc in range(o_all):
        row_o = (oc // og) * ogp + oc % og
        for s in range(nb):
            start = (row_o * chunk + s) * plane
            for i in range(oh):
                src = grad[n0 + s, oc, i]
                dst = start + i * wq
                for j in range(ow):
                    gq[np.uintp(dst + j)] = src[np.uintp(j)]


@_jit
def _taps6(xq, gq, offs, acc, xbase, row_stride, t0, ob, size,
           zero):  # fmt: skip  # pragma: no cover - runs compiled
    """Adds into ``acc`` rows ``ob .. ob + 3`` the sums of 4 gradient rows with each tap over
    ``size`` positions from ``t0``, 6 taps per inner loop (24 accumulators: AVX-512)."""
    g0 = gq[(ob + 0) * row_stride + t0 :]
    g1 = gq[(ob + 1) * row_stride + t0 :]
    g2 = gq[(ob + 2) * row_stride + t0 :]
    g3 = gq[(ob + 3) * row_stride + t0 :]
    for t in range(offs.size // 6):
        x0 = xq[xbase + offs[6 * t + 0] :]
        x1 = xq[xbase + offs[6 * t + 1] :]
        x2 = xq[xbase + offs[6 * t + 2] :]
        x3 = xq[xbase + offs[6 * t + 3] :]
        x4 = xq[xbase + offs[6 * t + 4] :]
        x5 = xq[xbase + offs[6 * t + 5] :]
        s00 = s01 = s02 = s03 = s04 = s05 = zero
        s10 = s11 = s12 = s13 = s14 = s15 = zero
        s20 = s21 = s22 = s23 = s24 = s25 = zero
        s30 = s31 = s32 = s33 = s34 = s35 = zero
        for j in range(size):
            u = np.uintp(j)
            v0 = x0[u]
            v1 = x1[u]
            v2 = x2[u]
            v3 = x3[u]
            v4 = x4[u]
            v5 = x5[u]
            e0 = g0[u]
            e1 = g1[u]
            e2 = g2[u]
            e3 = g3[u]
            s00 += e0 * v0
            s01 += e0 * v1
            s02 += e0 * v2
            s03 += e0 * v3
            s04 += e0 * v4
            s05 += e0 * v5
            s10 += e1 * v0
            s11 += e1 * v1
            s12 += e1 * v2
            s13 += e1 * v3
            s14 += e1 * v4
            s15 += e1 * v5
            s20 += e2 * v0
            s21 += e2 * v1
            s22 += e2 * v2
            s23 += e2 * v3
            s24 += e2 * v4
            s25 += e2 * v5
            s30 += e3 * v0
            s31 += e3 * v1
            s32 += e3 * v2
            s33 += e3 * v3
            s34 += e3 * v4
            s35 += e3 * v5
        c0 = 6 * t
        acc[ob + 0, c0 + 0] += s00
        acc[ob + 0, c0 + 1] += s01
        acc[ob + 0, c0 + 2] += s02
        acc[ob + 0, c0 + 3] += s03
        acc[ob + 0, c0 + 4] += s04
        acc[ob + 0, c0 + 5] += s05
        acc[ob + 1, c0 + 0] += s10
        acc[ob + 1, c0 + 1] += s11
        acc[ob + 1, c0 + 2] += s12
        acc[ob + 1, c0 + 3] += s13
        acc[ob + 1, c0 + 4] += s14
        acc[ob + 1, c0 + 5] += s15
        acc[ob + 2, c0 + 0] += s20
        acc[ob + 2, c0 + 1] += s21
        acc[ob + 2, c0 + 2] += s22
        acc[ob + 2, c0 + 3] += s23
        acc[ob + 2, c0 + 4] += s24
        acc[ob + 2, c0 + 5] += s25
        acc[ob + 3, c0 + 0] += s30
        acc[ob + 3, c0 + 1] += s31
        acc[ob + 3, c0 + 2] += s32
        acc[ob + 3, c0 + 3] += s33
        acc[ob + 3, c0 + 4] += s34
        acc[ob + 3, c0 + 5] += s35


@_jit
def _taps3(xq, gq, offs, acc, xbase, row_stride, t0, ob, size,
           zero):  # fmt: skip  # pragma: no cover - runs compiled
    """:func:`_taps6` with 3 taps per inner loop (12 accumulators: AVX2)."""
    g0 = gq[(ob + 0) * row_stride + t0 :]
    g1 = gq[(ob + 1) * row_stride + t0 :]
    g2 = gq[(ob + 2) * row_stride + t0 :]
    g3 = gq[(ob + 3) * row_stride + t0 :]
    for t in range(offs.size // 3):
        x0 = xq[xbase + offs[3 * t + 0] :]
        x1 = xq[xbase + offs[3 * t + 1] :]
        x2 = xq[xbase + offs[3 * t + 2] :]
        s00 = s01 = s02 = s10 = s11 = s12 = zero
        s20 = s21 = s22 = s30 = s31 = s32 = zero
        for j in range(size):
            u = np.uintp(j)
            v0 = x0[u]
            v1 = x1[u]
            v2 = x2[u]
            e0 = g0[u]
            e1 = g1[u]
            e2 = g2[u]
            e3 = g3[u]
            s00 += e0 * v0
            s01 += e0 * v1
            s02 += e0 * v2
            s10 += e1 * v0
            s11 += e1 * v1
            s12 += e1 * v2
            s20 += e2 * v0
            s21 += e2 * v1
            s22 += e2 * v2
            s30 += e3 * v0
            s31 += e3 * v1
            s32 += e3 * v2
        c0 = 3 * t
        acc[ob + 0, c0 + 0] += s00
        acc[ob + 0, c0 + 1] += s01
        acc[ob + 0, c0 + 2] += s02
        acc[ob + 1, c0 + 0] += s10
        acc[ob + 1, c0 + 1] += s11
        acc[ob + 1, c0 + 2] += s12
        acc[ob + 2, c0 + 0] += s20
        acc[ob + 2, c0 + 1] += s21
        acc[ob + 2, c0 + 2] += s22
        acc[ob + 3, c0 + 0] += s30
        acc[ob + 3, c0 + 1] += s31
        acc[ob + 3, c0 + 2] += s32


@_jit
def _weight_blocked(x, grad, offs, partial, sh, sw, ph, pw, hq, wq, groups, cg, nblk, chunk, tb,
                    part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Weight gradient by blocks of :data:`OB` channels x :data:`TB` taps (module doc):
    adds into ``partial[part]`` ``[groups * nblk * OB, taps]`` (float64); ``offs`` are the
    taps' offsets in a group's part of the packed input (padded with 0 to a multiple of
    ``tb``, the taps of one inner loop: 6, :func:`_taps6`, or 3, :func:`_taps3`)."""
    n_all = x.shape[0]
    c_all = x.shape[1]
    plane = hq * wq
    group_stride = cg * sh * sw * chunk * plane
    row_stride = chunk * plane
    xq = np.zeros(c_all * sh * sw * chunk * plane + plane + LANES, x.dtype)
    gq = np.zeros(groups * nblk * 4 * chunk * plane + LANES, x.dtype)
    acc = partial[part]
    zero = gq[gq.size - 1]  # the slack: a zero of the arrays' dtype
    chunks = (n_all + chunk - 1) // chunk
    for k in range(chunks * part // parts, chunks * (part + 1) // parts):
        n0 = k * chunk
        nb = min(chunk, n_all - n0)
        _pack(x, grad, xq, gq, n0, nb, chunk, sh, sw, ph, pw, hq, wq, groups, nblk * 4)
        length = nb * plane
        for t0 in range(0, length, TILE):
            size = min(TILE, length - t0)
            for g in range(groups):
                xbase = g * group_stride + t0
                for blk in range(nblk):
                    ob = (g * nblk + blk) * 4
                    if tb == 6:
                        _taps6(xq, gq, offs, acc, xbase, row_stride, t0, ob, size, zero)
                    else:
                        _taps3(xq, gq, offs, acc, xbase, row_stride, t0, ob, size, zero)


@_jit
def _weight_single(x, grad, offs, partial, sh, sw, ph, pw, hq, wq, groups, cg, og, chunk,
                   part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """:func:`_weight_blocked` one channel at a time (groups of fewer than :data:`OB`
    channels), :data:`TB_SINGLE` taps per pass: adds into ``partial[part]``
    ``[O, taps]``."""
    n_all = x.shape[0]
    c_all = x.shape[1]
    plane = hq * wq
    group_stride = cg * sh * sw * chunk * plane
    row_stride = chunk * plane
    xq = np.zeros(c_all * sh * sw * chunk * plane + plane + LANES, x.dtype)
    gq = np.zeros(groups * og * chunk * plane + LANES, x.dtype)
    acc = partial[part]
    zero = gq[gq.size - 1]  # the slack: a zero of the arrays' dtype
    taps8 = offs.size // 8
    chunks = (n_all + chunk - 1) // chunk
    for k in range(chunks * part // parts, chunks * (part + 1) // parts):
        n0 = k * chunk
        nb = min(chunk, n_all - n0)
        _pack(x, grad, xq, gq, n0, nb, chunk, sh, sw, ph, pw, hq, wq, groups, og)
        length = nb * plane
        for t0 in range(0, length, TILE):
            size = min(TILE, length - t0)
            for oc in range(groups * og):
                xbase = (oc // og) * group_stride + t0
                e = gq[oc * row_stride + t0 :]
                for t in range(taps8):
                    x0 = xq[xbase + offs[8 * t + 0] :]
                    x1 = xq[xbase + offs[8 * t + 1] :]
                    x2 = xq[xbase + offs[8 * t + 2] :]
                    x3 = xq[xbase + offs[8 * t + 3] :]
                    x4 = xq[xbase + offs[8 * t + 4] :]
                    x5 = xq[xbase + offs[8 * t + 5] :]
                    x6 = xq[xbase + offs[8 * t + 6] :]
                    x7 = xq[xbase + offs[8 * t + 7] :]
                    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
                    for j in range(size):
                        u = np.uintp(j)
                        v = e[u]
                        s0 += v * x0[u]
                        s1 += v * x1[u]
                        s2 += v * x2[u]
                        s3 += v * x3[u]
                        s4 += v * x4[u]
                        s5 += v * x5[u]
                        s6 += v * x6[u]
                        s7 += v * x7[u]
                    c0 = 8 * t
                    acc[oc, c0 + 0] += s0
                    acc[oc, c0 + 1] += s1
                    acc[oc, c0 + 2] += s2
                    acc[oc, c0 + 3] += s3
                    acc[oc, c0 + 4] += s4
                    acc[oc, c0 + 5] += s5
                    acc[oc, c0 + 6] += s6
                    acc[oc, c0 + 7] += s7


@functools.lru_cache(maxsize=256)
def _offsets(cg: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, chunk: int,
             hq: int, wq: int, multiple: int) -> np.ndarray:  # fmt: skip
    """Offset of each tap (channel, kh, kw) in a group's part of the packed input
    ``[cg, sh, sw, chunk, hq, wq]``, padded with 0 to a multiple of ``multiple``: computed
    once per geometry (the kernels never write it; building it cost as much as a small
    layer's kernel)."""
    c = np.arange(cg).reshape(cg, 1, 1)
    rows = np.arange(kh).reshape(1, kh, 1) * dh
    cols = np.arange(kw).reshape(1, 1, kw) * dw
    plane = ((c * sh + rows % sh) * sw + cols % sw) * (chunk * hq * wq)
    offs = (plane + (rows // sh) * wq + cols // sw).reshape(-1)
    taps = -(-offs.size // multiple) * multiple
    return np.concatenate([offs, np.zeros(taps - offs.size, offs.dtype)]).astype(np.int64)


def conv2d_weight_backward(
    x: np.ndarray,
    weight: np.ndarray,
    grad: np.ndarray,
    options: ConvOptions,
    threads: int | None = None,
) -> np.ndarray:
    """Gradient of ``conv2d(x, weight)`` for ``weight`` given the output gradient ``grad``
    (``[O, C/g, kh, kw]``, ``x``'s dtype; ``weight`` is read only for its shape).

    ``threads`` parts split the samples (default: one below :data:`PARALLEL_MIN_MACS`
    multiply-adds, else ``EMBER_FUSION_THREADS`` or every core). Raises
    :class:`KernelUnsupported` for dtypes other than float32 / float64 or without numba, and
    :class:`~ember.backend.errors.ShapeError` for shapes that do not fit.
    """
    oh, ow = _check(x, weight, grad, options, "conv2d_weight_backward")
    n, c = x.shape[:2]
    o, cg, kh, kw = weight.shape
    groups = options.groups
    og = o // groups
    (sh, sw), (ph, pw), (dh, dw) = options.stride, options.padding, options.dilation
    dtype = np.dtype(x.dtype)
    if grad.size == 0 or x.size == 0 or weight.size == 0:
        return np.zeros(weight.shape, dtype)
    hq = oh + dh * (kh - 1) // sh
    wq = ow + dw * (kw - 1) // sw
    single = og < OB
    ogp = og if single else -(-og // OB) * OB
    per_sample = (c * sh * sw + groups * ogp) * hq * wq * dtype.itemsize
    parts = min(n, _parts(n * o * oh * ow * cg * kh * kw, threads))
    chunk = max(1, min(-(-n // parts), CHUNK_BYTES // per_sample))
    parts = min(parts, -(-n // chunk))
    offs = _offsets(cg, kh, kw, sh, sw, dh, dw, chunk, hq, wq, TB_SINGLE if single else TB)
    partial = np.zeros((parts, groups * ogp, offs.size), np.float64)
    geometry = (sh, sw, ph, pw, hq, wq, groups, cg)
    from ember.backends.fusion.numba_runtime import _run_parts

    if single:
        _run_parts(_weight_single, [x, grad, offs, partial, *geometry, og, chunk], parts)
    else:
        _run_parts(_weight_blocked, [x, grad, offs, partial, *geometry, ogp // OB, chunk, TB],
                   parts)  # fmt: skip
    total = partial.sum(axis=0).reshape(groups, ogp, offs.size)[:, :og, : cg * kh * kw]
    return total.reshape(o, cg, kh, kw).astype(dtype)
