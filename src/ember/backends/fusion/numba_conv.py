"""2-d convolution forward as hand-written numba kernels: a candidate beside NdArray's im2col.

:func:`conv2d` computes exactly what :func:`ember.backends.ndarray.conv.conv2d` computes
(cross-correlation ``[N, C, H, W] * [O, C/g, kh, kw] -> [N, O, oh, ow]`` with stride,
zero padding, dilation and groups), for float32 and float64, by *direct* convolution: no
unrolled matrix is built, so no copy of ``C * kh * kw`` times the input runs through memory
and small shapes (few channels, where a GEMM is short and wide) pay no BLAS overhead.
Other dtypes (f16, bf16, ints) raise :class:`KernelUnsupported` so that a caller falls back
to the NdArray kernel; so does a missing numba.

Layout, per task (sample ``n``, group ``g``, block of :data:`OB` output channels, tile of
output rows):

* **Phased padded input.** The group's input channels of sample ``n`` are copied once
  (per part, when the task reaches a new ``(n, g)``) into a scratch buffer
  ``[cg, sh, sw, hq, wq]``: the zero-padded input split by row and column phase modulo the
  stride, ``xq[c, a, b, i, j] = x_padded[c, i * sh + a, j * sw + b]``. Tap ``(kh, kw)`` of
  output ``(oh, ow)`` then reads ``xq[c, (kh dh) % sh, (kw dw) % sw, oh + (kh dh) // sh,
  ow + (kw dw) // sw]``: every tap is a stride-1 window of one plane, whatever the stride
  and dilation, so the inner loop always walks contiguous memory.
* **Full rows.** Output positions are numbered ``q = oh * wq + ow`` over whole rows of
  the plane (``wq >= ow``), so a tap's window for a tile of rows is *one* contiguous run of
  the flat buffer, ``xq[offset(tap) + q]``, and the inner loop runs over the whole tile (many
  rows) instead of one short row. The ``wq - ow`` extra columns per row are computed and
  dropped when the tile is written out (waste: ``(kw - 1) dw / sw`` columns per row). In
  the forward kernel at stride 1, a row's right padding columns are the next row's left
  ones (zeros too; taps reading past a row's end wrap onto them): ``min(pw, (kw - 1) dw)``
  fewer columns per row (a 3x3 layer at 16x16 computes 17 columns a row, not 18).
  Where a row's valid columns fill whole vectors with columns to spare (32 wide and a
  padding column: 2 vectors a row, not 33 / 16), the forward kernel's tiles take each
  row's vectors only, wherever they lie (:func:`_spans`, the tile's ``spread``
  variant; each output is the same sum): measured on the ONNX CNN's layers alternating
  with the full rows, 1.3-1.6% less time at 32 wide and 3.4-4% at 16 wide.
* **Epilogue.** The forward kernel's store applies :class:`Epilogue` (clamp, residual
  add, clamp: ReLU and a residual block's ``relu(conv + skip)``), compiled without
  fast-math so each step rounds as the op alone does (``conv_epilogue`` fuses the ops).
  Where every vector a tile sums is whole output columns of whole channel blocks
  (:func:`_direct`: rows of whole vectors, or a 1x1 layer's full rows), the tiles apply
  it in registers and store the outputs themselves (the tile's ``epilogue`` variant),
  with no pass over a buffer of sums: measured on the ONNX CNN's layers, buffer pass and
  tile stores alternating, 2-5% less time for the 3x3 layers, 15-25% for the 1x1 and the
  3-channel stem, 4-7% for the five together, at one and two threads.
* **Register blocking.** The forward kernel (:func:`_conv_tiled`) sums :data:`TILE_OB`
  output channels by :data:`TILE_VECTORS` vectors of positions in registers, over every
  tap, with :func:`~ember.backends.fusion.numba_tile.tile_kernel` (LLVM IR: numba keeps
  loop accumulators in memory); per tap it loads 3 vectors and 8 weights for 24 FMAs and
  stores nothing. Taps are flattened over (input channel, kh, kw); output channels are
  padded to a multiple of :data:`TILE_OB` with zero weights (never written out). Weights
  are packed as ``[g, blocks, taps, TILE_OB]`` on every call, or once for a weight that
  cannot change (read-only, as an imported model's are: :func:`packed_weight`).
* **Tiles** are runs of whole rows of about :data:`TILE_POSITIONS` positions, rounded up
  to whole spans of ``TILE_VECTORS`` vectors (the extra positions read the buffer's zeroed
  slack and are dropped). A tile's spans run outside its channel blocks, so a span's input
  stays in L1 while the blocks' weights stream past; its sums, every channel of the
  group, go to an ``[O/g, tile]`` buffer (L2), written out row by row with the bias.
* The gradients (``numba_conv_grad``) still run :func:`_conv_blocked`, the earlier kernel:
  per vector of positions it loads 6 input vectors and 4 accumulators, does 24 FMAs and
  stores the 4 accumulators (:data:`OB` channels by :data:`UNROLL` taps; its accumulators
  for a tile of :data:`TILE` positions stay in L1).
* **Tiles are whole vectors** (:data:`LANES`) in the gradients' kernel too: the scalar
  remainder loop of a tile would cost as much as a vector pass.
* **Depthwise** convolutions (fewer than :data:`OB` output channels per group, e.g.
  ``groups == C``) run a one-channel variant of the same loop (:func:`_conv_single`,
  adding a whole 3x3 kernel per pass where the taps allow): padding them to :data:`OB`
  channels would quadruple the work.
* **Copies in and out** (packing, writing a tile back) go through 1-d row views with
  unsigned indices, so they vectorize too: for a depthwise layer they cost as much as the
  arithmetic (measured: 0.75 -> 0.5 ms on the depthwise benchmark case).

Measured (Zen 5, float32, one thread, busy machine; ``benchmarks/bench_conv_kernels.py``,
medians): the ONNX CNN's layers at batch 8 run at 150-225 GFLOP/s (3->32 stem 0.09 ms,
32->32 at 32x32 0.68 ms, 32->64 stride 2 0.48 ms, 64->64 at 16x16 0.73 ms), 1.2-1.4x the
earlier 4x6 kernel with accumulators in memory; torch takes 0.15, 0.79, 0.40 and 0.69 ms.
The tile alone (no packing, no waste) runs at about 270 GFLOP/s.

**Parts.** The kernels take ``part, parts`` and run that contiguous slice of their task
range (like the fusion runtime's generated kernels); :func:`conv2d` runs them with
``numba_runtime._run_parts``: part 0 on the calling thread, the others on the runtime's
worker threads (kernels release the GIL; numba's own thread pool is not used). The forward
kernel's parts instead claim one sample's tiles at a time from a counter they share, so a
core that a neighbour slows takes fewer samples (each still packed once, by the part that
claims it; each output the same sum).

Kernels are compiled with ``fastmath={'contract', 'reassoc'}``: sums may be added in
another order than NdArray's GEMM adds them (the results agree to rounding).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.backend.errors import ShapeError, fmt_shape
from ember.backend.kept import immutable
from ember.backends.fusion.numba_runtime import _run_parts, claims, parts_for
from ember.backends.fusion.numba_source import KernelUnsupported
from ember.backends.fusion.numba_tile import VECTOR_BYTES, lanes, tile_kernel
from ember.backends.fusion.views import read_only

# numba's disk cache keys these kernels by this file only, not by numba_tile.py, whose IR
# they inline. A test (test_numba_tile.py) checks this digest of numba_tile.py: editing that
# file means updating the digest here, which changes this file and so renews the cache.
TILE_SOURCE_SHA256 = "47e810bb65cc25cd"
# The same for the numba_math functions they inline (test_numba_runtime.py checks it).
MATH_SOURCE_SHA256 = "a5267effa21eab27"

if TYPE_CHECKING:
    from ember.backend.options import ConvOptions

try:  # numba is optional: conv2d raises KernelUnsupported without it
    import numba

    from ember.backends.fusion.numba_math import next_part
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = [
    "LANES",
    "OB",
    "SINGLE_UNROLL",
    "TILE",
    "UNROLL",
    "Epilogue",
    "KernelUnsupported",
    "Launch",
    "conv2d",
    "launch_for",
    "pack_phases",
    "prepare",
    "run",
    "supports",
]

OB = 4
"""Output channels one inner loop updates (a multiple of this is padded with zero weights)."""
UNROLL = 6
"""Taps one inner loop of the blocked kernel adds: 6 is two rows of a 3x3 kernel (measured
on Zen 5, float32: 12-17% faster than 3; 9 runs out of vector registers, 30-50% slower)."""
SINGLE_UNROLL = 3
"""Taps one inner loop of the one-channel kernel adds (a row of a 3x3 depthwise kernel)."""
TILE = 512
"""Output positions per tile and channel, at least: ``OB * TILE`` accumulators (8 KiB in
float32) stay in L1 while every tap runs over them."""
LANES = 16
"""The tile length is rounded up to a multiple of this (a float32 vector of AVX-512): the
extra positions are computed from the buffer's zeroed slack and dropped."""
TILE_POSITIONS = 1152
"""Output positions (of full rows) of one tile of the forward kernel, at most, unless a
row is longer: a 32x32 plane with its padding columns (1088) is one tile."""
TILE_OB = 8 if VECTOR_BYTES == 64 else 4
"""Output channels of one register tile of the forward kernel (a multiple of this is padded
with zero weights): 8 with AVX-512's 32 vector registers, 4 with AVX2's 16."""
TILE_VECTORS = 3
"""Vectors of positions of one register tile (the kernel has tiles of 1 and 2 vectors for
a partial span, so this stays 3): 8 x 3 accumulators, 3 loaded vectors and a
broadcast weight fill AVX-512's 32 registers (measured on Zen 5, float32, alone: 8x3
270 GFLOP/s, 6x4 275, 4x6 249, 8x2 255)."""
PARALLEL_MIN_MACS = 1 << 24
"""Convolutions of fewer multiply-adds than this run on one thread: waking the others costs
more than they save (measured on 2 busy cores: 3-7 M multiply-adds ran 25-35% slower on 2
threads than on one, 38 M ran 1.3x faster)."""

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_FLAGS = {"contract", "reassoc"}


def supports(x: np.ndarray, weight: np.ndarray) -> bool:
    """Whether :func:`conv2d` takes these arrays (numba present; float32 or float64)."""
    return numba is not None and x.ndim == 4 and x.dtype in _DTYPES


def _jit(fn):
    if numba is None:  # pragma: no cover - exercised where numba is missing
        return fn
    return numba.njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy")(fn)


def _exact(fn):
    """Compiled like :func:`_jit` but without fast-math (the epilogue's own rounding)."""
    if numba is None:  # pragma: no cover - exercised where numba is missing
        return fn
    return numba.njit(nogil=True, cache=True, error_model="numpy")(fn)


def _exact_inline(fn):
    if numba is None:  # pragma: no cover - exercised where numba is missing
        return fn
    return numba.njit(inline="always", error_model="numpy")(fn)


def _inline(fn):
    if numba is None:  # pragma: no cover - exercised where numba is missing
        return fn
    return numba.njit(inline="always", fastmath=_FLAGS, error_model="numpy")(fn)


@_jit
def pack_phases(x, xq, used, n, c0, cg, sh, sw, ph, pw, hq, wq, fill):  # pragma: no cover
    """Copies channels ``c0 .. c0 + cg`` of sample ``n`` of ``x`` into the phased, padded
    flat buffer ``xq`` ``[cg, sh, sw, hq, wq]`` (``fill`` where the window hangs outside:
    0 for convolutions and average pooling, -inf for max pooling).

    Only the phases ``(a, b)`` with ``used[a * sw + b]`` are written: no tap reads the
    others (a 1x1 kernel at stride 2 reads one phase of four). At column stride 2, one
    loop splits each padded source row into both column phases (pairs of neighbours: a
    loop that vectorizes), even where a tap reads only one of them: a loop per phase
    gathers every other element (30 -> 21 us a sample for a 32-channel 32x32 input, Zen
    3; 13.7 -> 10.6 us with the row copied into its padding first, an AVX-512 Xeon), and
    LLVM's vector gathers are slower still where the CPU's microcode guards them (a 1x1
    layer at stride 2 on an AVX-512 Xeon: 36.5 us a sample, 4.4 ns an element written)."""
    h = x.shape[2]
    w = x.shape[3]
    plane = hq * wq
    # A source row with its padding, for the column split at stride 2 (every column it
    # reads: 2 wq of them, or the whole row).
    padded = np.full(max(2 * wq, pw + w), fill, xq.dtype)
    for c in range(cg):
        for a in range(sh):
            if sw == 2 and (used[a * 2] or used[a * 2 + 1]):
                start = ((c * sh + a) * sw) * plane
                for i in range(hq):
                    row = i * sh + a - ph
                    if row < 0 or row >= h:
                        for j in range(wq):
                            xq[np.uintp(start + i * wq + j)] = fill
                            xq[np.uintp(start + plane + i * wq + j)] = fill
                    else:
                        _split_row(x[n, c0 + c, row], xq, start + i * wq,
                                   start + plane + i * wq, padded, pw, wq)  # fmt: skip
                continue
            for b in range(sw):
                if not used[a * sw + b]:
                    continue
                start = ((c * sh + a) * sw + b) * plane
                # Columns j read x column j * sw + b - pw: valid for j in [jlo, jhi).
                jlo = min(wq, max(0, (pw - b + sw - 1) // sw))
                jhi = max(jlo, min(wq, (w + pw - b + sw - 1) // sw))
                for i in range(hq):
                    row = i * sh + a - ph
                    dst = start + i * wq
                    if row < 0 or row >= h:
                        for j in range(wq):
                            xq[np.uintp(dst + j)] = fill
                        continue
                    for j in range(jlo):
                        xq[np.uintp(dst + j)] = fill
                    # A 1-d row view and unsigned indices: the copy vectorizes (sw == 1).
                    src = x[n, c0 + c, row]
                    shift = b - pw
                    for j in range(jlo, jhi):
                        xq[np.uintp(dst + j)] = src[np.uintp(j * sw + shift)]
                    for j in range(jhi, wq):
                        xq[np.uintp(dst + j)] = fill


@_inline
def _split_row(src, xq, d0, d1, padded, pw, wq):  # pragma: no cover - runs compiled
    """Row ``src`` split into its even padded columns at ``xq[d0:]`` and its odd ones at
    ``xq[d1:]``, ``wq`` each. ``padded`` is the row's scratch, ``fill`` already in its
    padding (``[0, pw)`` and past ``pw + len(src)``): one copy, then one loop over pairs
    of neighbours (a loop per stretch of the row between its paddings cost 30% more)."""
    for j in range(src.shape[0]):
        padded[np.uintp(pw + j)] = src[np.uintp(j)]
    for j in range(wq):
        xq[np.uintp(d0 + j)] = padded[np.uintp(2 * j)]
        xq[np.uintp(d1 + j)] = padded[np.uintp(2 * j + 1)]


@_jit
def _pack_tiles(weight, wt):  # pragma: no cover - runs compiled
    """``wt[g, blk, t, o] = weight[g, blk * ob + o, t]`` (0 past the last channel): the
    forward kernel's weight blocks. A loop per channel writes each tap's slot in turn
    (5-6x faster than NumPy's copy of the transposed view: 13 against 73 us for a 64 x 64
    3x3 layer, paid on every call)."""
    groups, og, taps = weight.shape
    nblk, ob = wt.shape[1], wt.shape[3]
    for g in range(groups):
        for blk in range(nblk):
            dst = wt[g, blk]
            for o in range(ob):
                c = blk * ob + o
                if c < og:
                    src = weight[g, c]
                    for t in range(taps):
                        dst[t, o] = src[t]
                else:
                    for t in range(taps):
                        dst[t, o] = 0.0


@_jit
def _conv_blocked(x, wt, offs, used, bias, out, sh, sw, ph, pw, hq, wq, groups, cg, nblk,
                  rows_per_tile, part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Output channel blocks of :data:`OB` (see the module doc); ``out`` is
    ``[N, O, oh, ow]``, ``wt`` ``[groups * nblk, taps / 6, 6, 4]``, ``offs`` the flat
    buffer offset of each (padded) tap, ``bias`` ``[groups * nblk, 4]``."""
    n_all = x.shape[0]
    o_all = out.shape[1]
    oh = out.shape[2]
    ow = out.shape[3]
    og = o_all // groups
    taps6 = wt.shape[1]
    xq = np.zeros(cg * sh * sw * hq * wq + wq + LANES, x.dtype)
    acc = np.empty((4, rows_per_tile * wq + LANES), x.dtype)
    ntiles = (oh + rows_per_tile - 1) // rows_per_tile
    tasks = n_all * groups * nblk * ntiles
    packed = -1
    for task in range(tasks * part // parts, tasks * (part + 1) // parts):
        tile = task % ntiles
        rest = task // ntiles
        blk = rest % nblk
        sample_group = rest // nblk
        g = sample_group % groups
        n = sample_group // groups
        if sample_group != packed:
            pack_phases(x, xq, used, n, g * cg, cg, sh, sw, ph, pw, hq, wq, 0.0)
            packed = sample_group
        gb = g * nblk + blk
        r0 = tile * rows_per_tile
        r1 = min(oh, r0 + rows_per_tile)
        # Whole vectors only: the scalar remainder loop would cost as much as a vector pass.
        length = -(-(r1 - r0) * wq // LANES) * LANES
        base = r0 * wq
        a0 = acc[0]
        a1 = acc[1]
        a2 = acc[2]
        a3 = acc[3]
        bias0 = bias[gb, 0]
        bias1 = bias[gb, 1]
        bias2 = bias[gb, 2]
        bias3 = bias[gb, 3]
        for j in range(length):
            a0[np.uintp(j)] = bias0
            a1[np.uintp(j)] = bias1
            a2[np.uintp(j)] = bias2
            a3[np.uintp(j)] = bias3
        for t in range(taps6):
            p0 = offs[6 * t + 0] + base
            p1 = offs[6 * t + 1] + base
            p2 = offs[6 * t + 2] + base
            p3 = offs[6 * t + 3] + base
            p4 = offs[6 * t + 4] + base
            p5 = offs[6 * t + 5] + base
            w00 = wt[gb, t, 0, 0]
            w01 = wt[gb, t, 0, 1]
            w02 = wt[gb, t, 0, 2]
            w03 = wt[gb, t, 0, 3]
            w10 = wt[gb, t, 1, 0]
            w11 = wt[gb, t, 1, 1]
            w12 = wt[gb, t, 1, 2]
            w13 = wt[gb, t, 1, 3]
            w20 = wt[gb, t, 2, 0]
            w21 = wt[gb, t, 2, 1]
            w22 = wt[gb, t, 2, 2]
            w23 = wt[gb, t, 2, 3]
            w30 = wt[gb, t, 3, 0]
            w31 = wt[gb, t, 3, 1]
            w32 = wt[gb, t, 3, 2]
            w33 = wt[gb, t, 3, 3]
            w40 = wt[gb, t, 4, 0]
            w41 = wt[gb, t, 4, 1]
            w42 = wt[gb, t, 4, 2]
            w43 = wt[gb, t, 4, 3]
            w50 = wt[gb, t, 5, 0]
            w51 = wt[gb, t, 5, 1]
            w52 = wt[gb, t, 5, 2]
            w53 = wt[gb, t, 5, 3]
            for j in range(length):
                v0 = xq[np.uintp(p0 + j)]
                v1 = xq[np.uintp(p1 + j)]
                v2 = xq[np.uintp(p2 + j)]
                v3 = xq[np.uintp(p3 + j)]
                v4 = xq[np.uintp(p4 + j)]
                v5 = xq[np.uintp(p5 + j)]
                a0[np.uintp(j)] += (
                    w00 * v0 + w10 * v1 + w20 * v2
                    + w30 * v3 + w40 * v4 + w50 * v5
                )  # fmt: skip
                a1[np.uintp(j)] += (
                    w01 * v0 + w11 * v1 + w21 * v2
                    + w31 * v3 + w41 * v4 + w51 * v5
                )  # fmt: skip
                a2[np.uintp(j)] += (
                    w02 * v0 + w12 * v1 + w22 * v2
                    + w32 * v3 + w42 * v4 + w52 * v5
                )  # fmt: skip
                a3[np.uintp(j)] += (
                    w03 * v0 + w13 * v1 + w23 * v2
                    + w33 * v3 + w43 * v4 + w53 * v5
                )  # fmt: skip
        o0 = g * og + blk * 4
        for o in range(min(4, og - blk * 4)):
            row_acc = acc[o]
            for r in range(r0, r1):
                src = (r - r0) * wq
                dst = out[n, o0 + o, r]
                for j in range(ow):
                    dst[np.uintp(j)] = row_acc[np.uintp(src + j)]


# Vectors wherever they lie (_spans), a tile's last 1 or 2 in a narrower one.
_tile = None if numba is None else tile_kernel(TILE_OB, TILE_VECTORS, spread=True)
_tile2 = None if numba is None else tile_kernel(TILE_OB, 2, spread=True)
_tile1 = None if numba is None else tile_kernel(TILE_OB, 1)
# The same, storing finished outputs through the epilogue (_spans' ``direct``).
_out3, _out2, _out1 = (None if numba is None else tile_kernel(TILE_OB, nv, epilogue=True)
                       for nv in (3, 2, 1))  # fmt: skip


@_jit
def _conv_tiled(x, wt, offs, used, bias, out, res, has_res, bounds, sh, sw,
                ph, pw, hq, wq, groups, cg, nblk, rows_per_tile, span, direct, claims, part,
                parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Output channel blocks of :data:`TILE_OB` by spans of ``span`` positions, summed in
    registers by :func:`numba_tile.tile_kernel` (see the module doc); ``wt`` is flat
    ``[groups * nblk, taps, TILE_OB]``, ``offs`` the flat buffer offset of each tap,
    ``bias`` ``[O]``; the rest is the epilogue (:func:`_epilogue_rows`). With ``direct``
    (:func:`_direct`), the tiles store finished outputs themselves."""
    n_all = x.shape[0]
    o_all = out.shape[1]
    oh = out.shape[2]
    og = o_all // groups
    taps = offs.shape[0]
    ntiles = (oh + rows_per_tile - 1) // rows_per_tile
    longest = -(-rows_per_tile * wq // span) * span
    # Slack: the last span runs past the last row by up to span - 1 positions, and a tap
    # past the last plane by its offset; both read zeros (dropped, or padding).
    reach = 0
    for t in range(taps):
        reach = max(reach, offs[t] + oh * wq + span)
    xq = np.zeros(max(cg * sh * sw * hq * wq, reach) + LANES, x.dtype)
    # Every channel of the group's tile: [nblk * TILE_OB, longest] (none where the tiles
    # store outputs).
    acc = np.empty(0 if direct else nblk * TILE_OB * longest, x.dtype)
    # Where a row's valid columns take fewer vectors than the full rows' numbering does
    # (32 wide: 2 vectors, not 33 / 16), the tiles take those vectors only.
    ow = out.shape[3]
    width = span // TILE_VECTORS
    row_vectors = (ow + width - 1) // width
    by_rows = row_vectors * width < wq
    flat_out = out.reshape(out.size)
    flat_res = res.reshape(res.size)
    tasks = n_all * groups * ntiles
    packed = -1
    piece = np.int64(part)  # a parallel launch's prange index is unsigned
    while piece < parts:  # this call's slice, then those it claims (numba_runtime.claims)
        for task in range(tasks * piece // parts, tasks * (piece + 1) // parts):
            tile = task % ntiles
            sample_group = task // ntiles
            g = sample_group % groups
            n = sample_group // groups
            if sample_group != packed:
                pack_phases(x, xq, used, n, g * cg, cg, sh, sw, ph, pw, hq, wq, 0.0)
                packed = sample_group
            r0 = tile * rows_per_tile
            r1 = min(oh, r0 + rows_per_tile)
            _spans(xq, offs, wt, acc, g * nblk, nblk, taps, r0, r1, wq, by_rows, row_vectors,
                   width, longest, direct, flat_out, n * o_all, oh * ow, ow, bias, bounds,
                   flat_res, has_res)  # fmt: skip
            if direct:
                continue
            for o in range(og):
                oc = g * og + o
                _epilogue_rows(out, acc, o * longest, bias[oc], n, oc, r0, r1, wq, res,
                               has_res, bounds)  # fmt: skip
        piece = next_part(claims)


@_inline
def _spans(xq, offs, wt, acc, block0, nblk, taps, r0, r1, wq, by_rows, row_vectors, width,
           longest, direct, out, first_plane, plane, ow, bias, bounds, res,
           has_res):  # fmt: skip  # pragma: no cover - runs compiled
    """The sums of rows ``r0 .. r1`` for every block of channels, :data:`TILE_VECTORS`
    vectors of positions at a time (a last 1 or 2 take a narrower tile: a 16x16 layer's
    272 positions are 5 spans of 48 and one of 32, not 6 spans). Vector ``i`` starts at
    position ``r0 * wq + i * width`` over the full rows, or ``by_rows`` at ``(r0 + i //
    row_vectors) * wq + i % row_vectors * width``: each row's vectors only, not the padding
    column that the full rows compute and drop. Spans outside, blocks inside: a span's
    input (its taps' windows) stays in L1 while every block's weights stream past it.

    ``direct``: every vector is whole output columns, the ``i``-th at ``r0 * ow + i *
    width`` of its channel's plane (``plane`` long; the sample's first is plane
    ``first_plane`` of the flat ``out``), and the tiles store the epilogue's results there,
    not sums into ``acc``."""
    if by_rows:
        vectors = (r1 - r0) * row_vectors
    else:
        vectors = ((r1 - r0) * wq + width - 1) // width
    for first in range(0, vectors, TILE_VECTORS):
        count = min(TILE_VECTORS, vectors - first)
        qa = _vector_at(first, r0, wq, by_rows, row_vectors, width)
        qb = _vector_at(first + 1, r0, wq, by_rows, row_vectors, width)
        qc = _vector_at(first + 2, r0, wq, by_rows, row_vectors, width)
        s = qa - r0 * wq
        for blk in range(nblk):
            wstart = (block0 + blk) * taps * TILE_OB
            if direct:
                oc0 = (block0 + blk) * TILE_OB  # whole blocks: og is a multiple of TILE_OB
                at = (first_plane + oc0) * plane + r0 * ow + first * width
                if count == TILE_VECTORS:
                    _out3(xq, offs, wt, wstart, qa, taps, out, at, plane, qb, qc, bias, oc0,
                          bounds, res, has_res)  # fmt: skip
                elif count == 2:
                    _out2(xq, offs, wt, wstart, qa, taps, out, at, plane, qb, qc, bias, oc0,
                          bounds, res, has_res)  # fmt: skip
                else:
                    _out1(xq, offs, wt, wstart, qa, taps, out, at, plane, qb, qc, bias, oc0,
                          bounds, res, has_res)  # fmt: skip
                continue
            a0 = blk * TILE_OB * longest + s
            if count == TILE_VECTORS:
                _tile(xq, offs, wt, wstart, qa, taps, acc, a0, longest, qb, qc)
            elif count == 2:
                _tile2(xq, offs, wt, wstart, qa, taps, acc, a0, longest, qb)
            else:
                _tile1(xq, offs, wt, wstart, qa, taps, acc, a0, longest)


@_inline
def _vector_at(i, r0, wq, by_rows, row_vectors, width):  # pragma: no cover - runs compiled
    """Where vector ``i`` of :func:`_spans` starts."""
    if by_rows:
        return (r0 + i // row_vectors) * wq + i % row_vectors * width
    return r0 * wq + i * width


@_exact
def _epilogue_rows(out, acc, a0, b, n, oc, r0, r1, wq, res, has_res,
                   bounds):  # fmt: skip  # pragma: no cover - runs compiled
    """Writes rows ``r0 .. r1`` of channel ``oc`` from a tile's sums (``acc[a0:]``, full
    rows of ``wq``) through the epilogue ``clamp(clamp(sum + b, lo1, hi1) + res, lo2,
    hi2)`` (``bounds``; infinite ones change nothing, ``res`` only with ``has_res``).
    Compiled without fast-math: each step rounds as the unfused op does."""
    ow = out.shape[3]
    lo1 = bounds[0]
    hi1 = bounds[1]
    lo2 = bounds[2]
    hi2 = bounds[3]
    for r in range(r0, r1):
        src = a0 + (r - r0) * wq
        dst = out[n, oc, r]
        if has_res:
            add = res[n, oc, r]
            for j in range(ow):
                v = _clamp(acc[np.uintp(src + j)] + b, lo1, hi1) + add[np.uintp(j)]
                dst[np.uintp(j)] = _clamp(v, lo2, hi2)
        else:
            for j in range(ow):
                dst[np.uintp(j)] = _clamp(_clamp(acc[np.uintp(src + j)] + b, lo1, hi1), lo2, hi2)


@_exact_inline
def _clamp(v, lo, hi):  # pragma: no cover - runs compiled
    """``minimum(maximum(v, lo), hi)`` as NumPy computes it (a NaN stays NaN)."""
    v = lo if v < lo else v
    return hi if v > hi else v


@_inline
def _single_task(task, ntiles, o_all, og, rows_per_tile, oh, wq):  # pragma: no cover
    """Where task ``task`` of a one-channel kernel works: sample, output channel, its
    group, the tile's first and end rows, and the vector-padded length of the tile."""
    tile = task % ntiles
    rest = task // ntiles
    oc = rest % o_all
    r0 = tile * rows_per_tile
    r1 = min(oh, r0 + rows_per_tile)
    # Whole vectors only: the scalar remainder loop would cost as much as a vector pass.
    length = -(-(r1 - r0) * wq // LANES) * LANES
    return rest // o_all, oc, oc // og, r0, r1, length


@_inline
def _store_rows(out, acc, n, oc, r0, r1, wq, ow):  # pragma: no cover
    """Writes the valid columns of a tile's full-row accumulators to ``out[n, oc]``."""
    for r in range(r0, r1):
        src = (r - r0) * wq
        dst = out[n, oc, r]
        for j in range(ow):
            dst[np.uintp(j)] = acc[np.uintp(src + j)]


@_jit
def _conv_single(x, wt, offs, used, bias, out, sh, sw, ph, pw, hq, wq, groups, cg,
                 rows_per_tile, part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """One output channel per pass (groups of fewer than :data:`OB` channels, depthwise):
    as :func:`_conv_blocked` with a block of one channel; ``wt`` is ``[O, taps / k, k]``
    for ``k`` taps per pass, 3 or 9 (a whole 3x3 kernel: one accumulator load and store per
    9 FMAs instead of per 3, measured faster on depthwise 3x3), ``bias`` ``[O]``."""
    n_all = x.shape[0]
    o_all = out.shape[1]
    oh = out.shape[2]
    ow = out.shape[3]
    og = o_all // groups
    groups_of_taps = wt.shape[1]
    nine = wt.shape[2] == 9
    xq = np.zeros(cg * sh * sw * hq * wq + wq + LANES, x.dtype)
    acc = np.empty(rows_per_tile * wq + LANES, x.dtype)
    ntiles = (oh + rows_per_tile - 1) // rows_per_tile
    tasks = n_all * o_all * ntiles
    packed = -1
    for task in range(tasks * part // parts, tasks * (part + 1) // parts):
        n, oc, g, r0, r1, length = _single_task(task, ntiles, o_all, og, rows_per_tile, oh, wq)
        sample_group = n * groups + g
        if sample_group != packed:
            pack_phases(x, xq, used, n, g * cg, cg, sh, sw, ph, pw, hq, wq, 0.0)
            packed = sample_group
        base = r0 * wq
        b = bias[oc]
        for j in range(length):
            acc[np.uintp(j)] = b
        for t in range(groups_of_taps):
            if nine:  # chosen per tap group, outside the vector loop
                _add9(acc, xq, wt, offs, oc, t, base, length)
            else:
                _add3(acc, xq, wt, offs, oc, t, base, length)
        _store_rows(out, acc, n, oc, r0, r1, wq, ow)


@_inline
def _add3(acc, xq, wt, offs, oc, t, base, length):  # pragma: no cover - runs compiled
    """Adds tap group ``t`` of 3 taps to one channel's accumulators."""
    p0 = offs[3 * t] + base
    p1 = offs[3 * t + 1] + base
    p2 = offs[3 * t + 2] + base
    w0 = wt[oc, t, 0]
    w1 = wt[oc, t, 1]
    w2 = wt[oc, t, 2]
    for j in range(length):
        acc[np.uintp(j)] += (
            w0 * xq[np.uintp(p0 + j)] + w1 * xq[np.uintp(p1 + j)] + w2 * xq[np.uintp(p2 + j)]
        )


@_inline
def _add9(acc, xq, wt, offs, oc, t, base, length):  # pragma: no cover - runs compiled
    """Adds tap group ``t`` of 9 taps to one channel's accumulators."""
    p0 = offs[9 * t + 0] + base
    p1 = offs[9 * t + 1] + base
    p2 = offs[9 * t + 2] + base
    p3 = offs[9 * t + 3] + base
    p4 = offs[9 * t + 4] + base
    p5 = offs[9 * t + 5] + base
    p6 = offs[9 * t + 6] + base
    p7 = offs[9 * t + 7] + base
    p8 = offs[9 * t + 8] + base
    w0 = wt[oc, t, 0]
    w1 = wt[oc, t, 1]
    w2 = wt[oc, t, 2]
    w3 = wt[oc, t, 3]
    w4 = wt[oc, t, 4]
    w5 = wt[oc, t, 5]
    w6 = wt[oc, t, 6]
    w7 = wt[oc, t, 7]
    w8 = wt[oc, t, 8]
    for j in range(length):
        acc[np.uintp(j)] += (
            w0 * xq[np.uintp(p0 + j)] + w1 * xq[np.uintp(p1 + j)]
            + w2 * xq[np.uintp(p2 + j)] + w3 * xq[np.uintp(p3 + j)]
            + w4 * xq[np.uintp(p4 + j)] + w5 * xq[np.uintp(p5 + j)]
            + w6 * xq[np.uintp(p6 + j)] + w7 * xq[np.uintp(p7 + j)]
            + w8 * xq[np.uintp(p8 + j)]
        )  # fmt: skip


@dataclass(frozen=True)
class Epilogue:
    """Element-wise ops :func:`conv2d` applies to each output as it stores it, in this
    order: ``clamp(clamp(conv + bias, *first) + residual, *second)``, where ``clamp(v, lo,
    hi)`` is NumPy's ``minimum(maximum(v, lo), hi)`` and a bound of None is no bound; each
    step rounds as the op alone does, so the result equals the ops run one by one.

    ``residual`` is an array of the output's shape and dtype (None: no addition).
    """

    first: tuple[float | None, float | None] = (None, None)
    residual: np.ndarray | None = None
    second: tuple[float | None, float | None] = (None, None)


@functools.lru_cache(maxsize=64)
def _bounds(_: str, first: tuple, second: tuple, dtype: np.dtype) -> np.ndarray:
    """The kernel's four clamp bounds (infinite where None); kept per epilogue, since a
    model's layers call with the same few (the kernel never writes them)."""
    return np.array([_bound(first[0], -np.inf), _bound(first[1], np.inf),
                     _bound(second[0], -np.inf), _bound(second[1], np.inf)], dtype)  # fmt: skip


@functools.lru_cache(maxsize=4)
def _no_residual(dtype: np.dtype) -> np.ndarray:
    return read_only(np.empty((0, 0, 0, 0), dtype), fresh=True)


def _bound(value: float | None, none: float) -> float:
    return none if value is None else value


def conv2d(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    options: ConvOptions,
    threads: int | None = None,
    empty: Callable = np.empty,
    epilogue: Epilogue | None = None,
) -> np.ndarray:
    """2-d convolution ``[N, C, H, W] * [O, C/g, kh, kw] -> [N, O, oh, ow]`` (plus ``bias``
    ``[O]``), as :func:`ember.backends.ndarray.conv.conv2d` computes it; returns a new
    C-contiguous array of ``x``'s dtype.

    ``threads`` parts run the kernel (default: one below :data:`PARALLEL_MIN_MACS`
    multiply-adds, else ``EMBER_FUSION_THREADS`` or every core). Raises
    :class:`KernelUnsupported` for dtypes other than float32 / float64 or without numba,
    and :class:`~ember.backend.errors.ShapeError` for shapes that do not convolve.
    ``empty(shape, dtype)`` makes the output (a pool's ``take``, say).

    With an ``epilogue``, returns ``epilogue``'s ops applied to the convolution instead,
    computed as each output is stored (see :class:`Epilogue`); it needs at least
    :data:`OB` output channels per group (:class:`KernelUnsupported` otherwise).
    """
    epilogue_bounds = None if epilogue is None else (epilogue.first, epilogue.second)
    launch = launch_for(x, weight, bias, options, threads, epilogue_bounds)
    return run(launch, x, empty, None if epilogue is None else epilogue.residual)


MAX_LAUNCHES = 16
"""Launches :func:`launch_for` keeps for one weight (input shapes, options, thread counts,
epilogues); more, and it forgets them all."""


def launch_for(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               options: ConvOptions, threads: int | None,
               epilogue: tuple | None) -> Launch:  # fmt: skip
    """:func:`prepare`'s launch, kept while ``weight`` and ``bias`` cannot change and live
    (a model's layers call again with the same weights, input shapes and options): beside
    the weight's packed blocks (:func:`packed_weight`), so it goes with them; a weak
    reference tells a live bias from a later array that reuses its id."""
    if not immutable(weight) or (bias is not None and not immutable(bias)):
        return prepare(x, weight, bias, options, threads, epilogue)
    # repr tells -0.0 from 0.0 among the bounds (equal keys otherwise).
    key = (x.shape, x.dtype, threads, options, repr(epilogue), id(bias))
    blocks, launches = _kept(weight)
    found = None if launches is None else launches.get(key)
    if found is not None and (bias is None or found[0]() is bias):
        return found[1]
    launch = prepare(x, weight, bias, options, threads, epilogue)  # packs, keeping the blocks
    blocks, launches = _kept(weight)
    if launches is not None and launch.before[0].base is blocks:  # of this grouping
        if len(launches) >= MAX_LAUNCHES:
            launches.clear()
        launches[key] = (None if bias is None else weakref.ref(bias), launch)
    return launch


def _kept(weight: np.ndarray) -> tuple:
    """``(packed blocks, launches kept beside them)`` of ``weight``, or ``(None, None)``."""
    with _packed_lock:
        found = _packed.get(id(weight))
        return found[1:] if found is not None and found[0]() is weight else (None, None)


@dataclass(frozen=True)
class Launch:
    """A convolution's kernel call without its input, output and residual (:func:`prepare`;
    :func:`launch_for` keeps one while its weight cannot change). ``before`` are the
    kernel's arguments between the input and the output, ``after`` those after the
    epilogue's."""

    kernel: Any
    x_shape: tuple
    out_shape: tuple
    dtype: np.dtype
    before: tuple
    bounds: np.ndarray | None  # None: the one-channel kernel, which takes no epilogue
    after: tuple
    parts: int


def prepare(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, options: ConvOptions,
            threads: int | None = None,
            epilogue: tuple | None = None) -> Launch:  # fmt: skip
    """The :class:`Launch` of :func:`conv2d` for ``x``'s shape and dtype (read, not kept),
    ``weight`` and ``bias``, with the clamp bounds ``epilogue`` (``(first, second)`` of an
    :class:`Epilogue`) or none.

    Raises:
        KernelUnsupported: no numba, a dtype other than float32 / float64, or an epilogue
            on fewer than :data:`OB` output channels per group.
        ShapeError: shapes that do not convolve.
    """
    if numba is None:
        raise KernelUnsupported("numba conv2d: numba is not installed")
    dtype = np.dtype(x.dtype)
    if dtype not in _DTYPES:
        raise KernelUnsupported(f"numba conv2d: dtype {dtype} is not supported")
    if x.ndim != 4 or weight.ndim != 4:
        raise ShapeError(
            f"numba conv2d: input {fmt_shape(x.shape)} and weight {fmt_shape(weight.shape)} "
            "must both be 4-d"
        )
    g = _geometry(x.shape, weight.shape, options.groups, tuple(options.stride),
                  tuple(options.padding), tuple(options.dilation), dtype.itemsize)  # fmt: skip
    n, o = x.shape[0], weight.shape[0]
    b = read_only(np.zeros(o, dtype) if bias is None else bias.astype(dtype, copy=False).reshape(o),
                  fresh=True)  # fmt: skip
    parts = parts_for(g.macs, PARALLEL_MIN_MACS, threads)
    shape = (n, o, g.oh, g.ow)
    if g.single:
        if epilogue is not None:
            raise KernelUnsupported(f"numba conv2d: an epilogue needs {OB} or more output "
                                    f"channels per group, not {o // options.groups}")  # fmt: skip
        # Fewer than OB channels per group: one pass per channel, no padded channels.
        wt = np.zeros((o, g.taps), dtype)
        wt[:, : g.taps_used] = weight.reshape(o, g.taps_used)
        before = (wt.reshape(o, g.taps // g.unroll, g.unroll), g.offs, g.used, b)
        return Launch(_conv_single, x.shape, shape, dtype, before, None,
                      (*g.layout, g.rows_per_tile), parts)  # fmt: skip
    first, second = epilogue or (_NO_BOUNDS, _NO_BOUNDS)
    # repr tells -0.0 from 0.0 (equal keys otherwise): a bound's sign can show in a result.
    bounds = _bounds(repr((first, second)), first, second, dtype)
    before = (packed_weight(weight, dtype, g), g.offs, g.used, b)
    return Launch(_conv_tiled, x.shape, shape, dtype, before, bounds,
                  (*g.layout, g.nblk, g.rows_per_tile, g.span, g.direct), parts)  # fmt: skip


_NO_BOUNDS = (None, None)


def run(launch: Launch, x: np.ndarray, empty: Callable = np.empty,
        residual: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """``launch`` on ``x`` (of the shape and dtype it was prepared for), adding ``residual``
    (an array of the output's shape and dtype) in its epilogue; the output comes from
    ``empty(shape, dtype)``.

    Raises:
        ShapeError: ``x`` or ``residual`` of another shape or dtype than prepared for.
    """
    if x.shape != launch.x_shape or x.dtype != launch.dtype:
        raise ShapeError(f"numba conv2d: input {fmt_shape(x.shape)} {x.dtype}, prepared for "
                         f"{fmt_shape(launch.x_shape)} {launch.dtype}")  # fmt: skip
    out = empty(launch.out_shape, launch.dtype)
    if out.size == 0:
        return out
    if launch.bounds is None:  # the one-channel kernel
        _run_parts(launch.kernel, [x, *launch.before, out, *launch.after], launch.parts)
        return out
    if residual is None:
        res = _no_residual(launch.dtype)
    elif residual.shape != out.shape or residual.dtype != launch.dtype:
        raise ShapeError(
            f"numba conv2d: an epilogue residual {fmt_shape(residual.shape)} "
            f"{residual.dtype} does not match the output {fmt_shape(out.shape)} {launch.dtype}"
        )
    else:
        res = read_only(np.ascontiguousarray(residual))
    # A call a thread, each claiming a sample's (and group's) tiles as it comes free (see
    # the module doc).
    threads = launch.parts
    x = read_only(x)  # one compile for a step's read-only input and an activation
    samples = x.shape[0] * launch.after[6] if threads > 1 else 1  # after[6]: groups
    args = [x, *launch.before, out, res, residual is not None, launch.bounds, *launch.after,
            claims(threads)]  # fmt: skip
    _run_parts(launch.kernel, args, samples, threads, calls=threads)
    return out


@dataclass(frozen=True)
class _Geometry:
    """What a convolution's shapes and options decide (:func:`_geometry`)."""

    oh: int
    ow: int
    macs: int
    taps: int  # per output channel, padded to a multiple of ``unroll``
    taps_used: int  # cg * kh * kw
    offs: np.ndarray
    used: np.ndarray
    layout: tuple  # the kernels' (sh, sw, ph, pw, hq, wq, groups, cg)
    single: bool  # fewer than OB channels per group: the one-channel kernel
    unroll: int
    rows_per_tile: int
    nblk: int  # the tiled kernel's blocks of TILE_OB channels per group
    span: int
    direct: bool  # the tiled kernel's tiles store outputs (_direct)


@functools.lru_cache(maxsize=256)
def _geometry(x_shape: tuple, w_shape: tuple, groups: int, stride: tuple, padding: tuple,
              dilation: tuple, itemsize: int) -> _Geometry:  # fmt: skip
    """The output size, phased buffer, taps and tiling of a convolution: computed once per
    shape and options (a model calls the same layers again and again).

    Raises:
        ShapeError: shapes that do not convolve.
    """
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if groups < 1 or c % groups or o % groups or cg * groups != c:
        raise ShapeError(
            f"numba conv2d: input {fmt_shape(x_shape)} and weight {fmt_shape(w_shape)} "
            f"do not fit groups={groups}"
        )
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ShapeError(
            f"numba conv2d: kernel {kh}x{kw} (dilation {dh}x{dw}) is larger than the padded "
            f"input {h + 2 * ph}x{w + 2 * pw}"
        )
    og = o // groups
    hq = oh + dh * (kh - 1) // sh
    wq = ow + dw * (kw - 1) // sw
    if og >= OB and sw == 1:
        # A row's right padding columns can be the next row's left ones (zeros as well):
        # the taps reading past a row's end wrap onto them, so fewer columns are computed
        # and dropped (a 16-wide 3x3 layer: 17 columns a row instead of 18).
        wq -= min(pw, dw * (kw - 1))
    single = og < OB
    unroll = (9 if (cg * kh * kw) % 9 == 0 else SINGLE_UNROLL) if single else 1
    offs, used = _tap_layout(cg, kh, kw, sh, sw, dh, dw, hq, wq, unroll)
    if single:
        rows_per_tile = max(1, min(oh, -(-TILE // wq)))
    else:
        # Few row tiles: each rounds up to whole spans (waste), and the sums of a whole
        # plane (64 channels of 1024 positions: 256 KiB in float32) still sit in L2.
        rows_per_tile = -(-oh // -(-oh * wq // TILE_POSITIONS))
    span = TILE_VECTORS * lanes(itemsize)
    return _Geometry(
        oh=oh, ow=ow, macs=n * o * oh * ow * cg * kh * kw, taps=offs.size,
        taps_used=cg * kh * kw, offs=offs, used=used, layout=(sh, sw, ph, pw, hq, wq, groups, cg),
        single=single, unroll=unroll, rows_per_tile=rows_per_tile, nblk=-(-og // TILE_OB),
        span=span, direct=not single and _direct(oh, ow, wq, og, rows_per_tile, span),
    )  # fmt: skip


def _direct(oh: int, ow: int, wq: int, og: int, rows_per_tile: int, span: int) -> bool:
    """Whether the tiled kernel's tiles can store finished outputs (``_spans``' ``direct``):
    each vector it sums must be whole output columns of one channel, and the vectors of a
    row tile the output's rows in order. That holds for whole channel blocks (no padded
    channels to drop) over rows of whole vectors (a 32-wide layer: two a row, the padding
    column skipped), or over full rows without extra columns (``wq == ow``, a 1x1 layer)
    when every row tile is whole vectors. Elsewhere the sums go to a buffer that the
    epilogue reads row by row, dropping the extra columns."""
    width = span // TILE_VECTORS
    if og % TILE_OB:
        return False
    if ow % width == 0 and ow < wq:
        return True
    last = oh - (-(-oh // rows_per_tile) - 1) * rows_per_tile
    return wq == ow and (rows_per_tile * ow) % width == 0 and (last * ow) % width == 0


PACKED_CACHE_BYTES = 64 << 20
"""Bytes of packed weights kept for weights that cannot change (:func:`packed_weight`)."""

# id(weight) -> (weak reference, packed blocks, the launches kept beside them: launch_for)
_packed: OrderedDict[int, tuple[weakref.ref, np.ndarray, dict]] = OrderedDict()
_packed_bytes = 0
# Reentrant: a weight's weak reference calls back (_forget_packed) when the weight dies,
# which the garbage collector may make happen inside packed_weight, lock held.
_packed_lock = threading.RLock()


def packed_weight(weight: np.ndarray, dtype: np.dtype, g: _Geometry) -> np.ndarray:
    """``weight`` as the tiled kernel's blocks ``[groups, nblk, taps, TILE_OB]`` (flat) for
    the grouping of ``g``.

    Packed on every call, except for a weight nothing can change: read-only down to the
    memory it views (``bytes``, or arrays that are all read-only, as loaded records and
    imported models are), whose blocks are packed once and kept while the weight lives
    (at most :data:`PACKED_CACHE_BYTES` of them, the oldest dropped first): an inference
    loop then packs nothing.
    """
    global _packed_bytes
    if not immutable(weight):
        return _pack(weight, dtype, g).reshape(-1)
    key = id(weight)
    shape = (g.layout[6], g.nblk, g.taps, TILE_OB)  # one weight may serve several groupings
    with _packed_lock:
        found = _packed.get(key)
        if found is not None and found[0]() is weight:
            wt = found[1]
            if wt.dtype == dtype and wt.shape == shape:
                _packed.move_to_end(key)
                return wt.reshape(-1)
    wt = _pack(weight, dtype, g)  # writable still: a read-only array compiles anew
    with _packed_lock:
        old = _packed.pop(key, None)
        _packed_bytes -= 0 if old is None else old[1].nbytes
        _packed[key] = (weakref.ref(weight, functools.partial(_forget_packed, key)), wt, {})
        _packed_bytes += wt.nbytes
        while _packed_bytes > PACKED_CACHE_BYTES and _packed:
            _packed_bytes -= _packed.popitem(last=False)[1][1].nbytes
    return wt.reshape(-1)


def _forget_packed(key: int, ref: weakref.ref) -> None:
    global _packed_bytes
    with _packed_lock:
        found = _packed.get(key)
        if found is not None and found[0] is ref:  # not a later weight that reuses the id
            del _packed[key]
            _packed_bytes -= found[1].nbytes


def _pack(weight: np.ndarray, dtype: np.dtype, g: _Geometry) -> np.ndarray:
    groups, taps = g.layout[6], g.taps
    wt = np.empty((groups, g.nblk, taps, TILE_OB), dtype)
    _pack_tiles(np.ascontiguousarray(weight).reshape(groups, -1, taps), wt)
    return wt


@functools.lru_cache(maxsize=256)
def _tap_layout(cg: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, hq: int,
                wq: int, unroll: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The taps' offsets (:func:`_offsets`) and which phases ``(a, b)`` of the buffer they
    read, flat ``[sh * sw]``: computed once per geometry (the kernels never write them)."""
    used = np.zeros((sh, sw), np.bool_)
    used[np.ix_(np.arange(kh) * dh % sh, np.arange(kw) * dw % sw)] = True
    return _offsets(cg, kh, kw, sh, sw, dh, dw, hq, wq, unroll), used.reshape(-1)


def _offsets(cg: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, hq: int,
             wq: int, unroll: int) -> np.ndarray:  # fmt: skip
    """Flat offset in the phased buffer ``[cg, sh, sw, hq, wq]`` of each tap (channel, kh,
    kw), padded with offset 0 (zero weight) to a multiple of ``unroll``."""
    c = np.arange(cg).reshape(cg, 1, 1)
    rows = np.arange(kh).reshape(1, kh, 1) * dh
    cols = np.arange(kw).reshape(1, 1, kw) * dw
    plane = ((c * sh + rows % sh) * sw + cols % sw) * (hq * wq)
    offs = (plane + (rows // sh) * wq + cols // sw).reshape(-1)
    taps = -(-offs.size // unroll) * unroll
    return np.concatenate([offs, np.zeros(taps - offs.size, offs.dtype)]).astype(np.int64)
