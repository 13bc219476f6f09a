"""Matrix multiply as a numba kernel: a candidate beside NdArray's ``np.matmul``.

:func:`matmul` computes what NdArray's ``float_matmul`` computes (``[..., M, K] @ [..., K,
N]``, batch dims broadcast) for float32 and float64, by the classic packed, register-blocked
GEMM:

* **Packing.** ``B`` is copied into column panels of ``NR`` columns, ``[K, NR]`` each
  (zeros past the last column, so every tile runs the same loop); ``A`` a strip of
  :data:`MR` rows at a time, ``[K, MR]``, just before the strip runs against every column
  panel: the strip stays in L1 for all of them. (The strip outer and the panels inner: on
  a 2-vCPU AVX-512 Xeon the tile ran at 178 GFLOP/s against 148-162 with the panels outer,
  where each strip came back from L2 once per panel.) Where a copy turns rows into
  columns (a strip of a row-major ``A``; the panels of a transposed ``B``, a weight's
  ``Wᵀ``), whole vectors are transposed in registers (``numba_tile.transpose_kernel``):
  element by element, packing ``A`` took 9-19% of a product. A transposed ``A`` (a weight
  gradient's ``dYᵀ``) already holds a step's ``MR`` values side by side; with several
  blocks of ``K`` its strips are packed a block at a time, walking its rows (a strip at a
  time read 48 bytes from rows 1-4 KB apart, which no prefetcher follows).
* **Register tile.** A tile of ``MR x NR`` outputs lives in registers for the whole sum
  over a block of ``K``: per step of ``K`` it loads :data:`VECTORS` vectors of ``B`` and
  broadcasts ``MR`` values of ``A``, for ``MR * VECTORS`` vector FMAs. With AVX-512 that is
  12 x 2 vectors, 24 of the 32 registers of sums; without it, AVX2's 6 x 2 in 12 of 16.
  numba has no vector types, so the tile is the convolutions' LLVM IR tile
  (``numba_tile.tile_kernel``: a strip's ``MR`` rows are its output channels, a panel's
  columns its positions, and later blocks of ``K`` add to the sums): its sums are SSA
  vectors, and the loop compiles to two loads, ``MR`` broadcasts and ``2 MR`` FMAs per
  step, and asks for the panel's rows :data:`PREFETCH_TAPS` steps ahead (a panel comes
  from L2 once per strip). Alone, with its operands in cache, it ran at 185-190 GFLOP/s on
  one thread of that Xeon, whose FMA peak is about 203. Where ``B`` is packed whole
  (:func:`_tiles`), AVX-512 hosts run a 24 x 1 tile instead, on panels one vector wide
  (:data:`WIDE_MR`): the encoder step's 24 products back to back took 0.90-0.97x the time
  of the 12 x 2 tile everywhere (one process, alternating, one and two threads).
* **Blocking.** ``K`` is cut into blocks whose panels of ``B`` fit in L2
  (:data:`B_BLOCK_BYTES`); a strip's tiles add each later block's sums to the earlier ones.
  Where all of ``B``'s panels fit in that much, they are packed first (:func:`_pack`, then
  :func:`_tiles`, a strip over all of ``K`` at a time); a larger ``B`` (a weight
  gradient's activations) is packed a block at a time, just before the strips run against
  it (:func:`_blocks`), so the block is still in L2. A ``B`` nothing can change (an
  imported model's weight) keeps its panels.
* **Epilogues.** The first block's sums start from a ``bias`` (the tile loads its two
  vectors of columns for every row: the tile's ``biased`` variant) or, adding ``into`` an
  array, from its values: a linear layer's bias and a sum of products need no pass of
  their own.

**Parts.** The kernels take ``part, parts`` and run that contiguous slice of their tasks
(:func:`_pack`: panels of ``B``; :func:`_tiles`: strips of ``A``; :func:`_blocks`: the
panels where ``N >= M``, else the strips, so each part packs whole only the smaller
operand; :func:`_across_panels`, for products of few rows (:data:`PANELS_MAX_ROWS`) and
for a ``B`` packed once (:func:`pack_b`): panels of ``B``, each part running every strip),
so each output is computed by one task in the same order at any thread count;
:func:`matmul` runs them with ``numba_runtime._run_parts`` (part 0 on the calling thread).
Where a strip is one task over all of ``K`` (``B`` packed whole, in L2), :func:`_tiles`'s
parts instead claim :data:`CLAIM_STRIPS` strips at a time from a counter they share, so a
core that a neighbour slows takes fewer: each output is still one task's, the same bits.

Measured (a 2-vCPU AVX-512 Xeon, in one process beside NumPy's OpenBLAS) on the
``nn_step`` encoder's products (``[2048, 256] @ [256, 1024]`` and the like, forward and both
gradients): forward and input-gradient products 143-157 GFLOP/s at one thread (OpenBLAS
140-156), weight gradients (``K = 2048``) 120-133 (OpenBLAS 134-148); over all of them
0.96-1.01x OpenBLAS's speed at one thread and 1.01-1.03x at two (the kernel before these
packings: 0.89-0.92x and 0.91-0.94x); torch's MKL was 10-20% ahead of both at one thread. ``benchmarks/bench_matmul_kernels.py`` times it on other shapes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from ember.backend.kept import Kept, immutable, owner
from ember.backends.fusion.numba_source import KernelUnsupported
from ember.backends.fusion.numba_tile import (
    VECTOR_BYTES,
    tile_kernel,
    transpose_kernel,
    vector_copy,
)
from ember.backends.fusion.views import byte_offset, read_only
from ember.backends.ndarray.scratch import scratch

try:  # numba is optional: matmul raises KernelUnsupported without it
    import numba

    from ember.backends.fusion.numba_math import next_part
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["MR", "NR", "KernelUnsupported", "PackedB", "matmul", "matmul_dequantized",
           "matmul_packed", "pack_b", "supports", "supports_dequantized"]

MR = 12 if VECTOR_BYTES == 64 else 6
"""Rows of a register tile (broadcast values of ``A`` per step of ``K``)."""
VECTORS = 2
"""Vectors of columns of a register tile."""
NR = {np.dtype(np.float32): VECTORS * VECTOR_BYTES // 4,
      np.dtype(np.float64): VECTORS * VECTOR_BYTES // 8}  # fmt: skip
"""Columns of a register tile per dtype."""
_NR_BY_ITEMSIZE = {dtype.itemsize: nr for dtype, nr in NR.items()}
WIDE = VECTOR_BYTES == 64
"""Whether products whose ``B`` is packed whole (:func:`_tiles`) run the 24 x 1 tile."""
WIDE_MR = 24
"""Rows of the 24 x 1 tile: with AVX-512, each value of ``A`` feeds one FMA, which reads it
as an embedded broadcast (``{1to16}``): a step is one load and 24 FMAs, 26 instructions
against the 12 x 2 tile's 41 (12 broadcasts of their own). On a host whose core is shared,
issue slots are what a thread runs short of: alone in L1 it ran 1-7% faster (more in the
slower phases). Its panels are one vector wide, twice as many: the weight gradients, which
pack ``B`` a block at a time (:func:`_blocks`), took 1.01-1.10x as long with them at one
thread, and keep the 12 x 2 tile."""
NARROW_MR = 8
"""Rows of the 8 x 2 tile (AVX-512 only), on the 12 x 2 tile's panels: products of few rows
by a ``B`` packed once (:func:`matmul_packed`) whose row count 8 divides and 12 does not (a
recurrent step's batch of 16 ran 24 rows of tiles with either of the others)."""
B_BLOCK_BYTES = 1 << 20
"""Bytes of ``B``'s panels per block of ``K``, at most (L2 holds them beside the strips)."""
STRIP_BYTES = 48 << 10
"""Bytes of a packed strip of ``A`` per block of ``K``, at most: L1's size. A strip read
once per step streams in ahead of the tile, so where all of ``B`` fits in L2 its ``K``
need not be cut for the strip's sake; at 12 KiB (blocks of 256 rows), products of ``K``
768-1024 took 3-10% longer, each later block loading and storing the tiles' sums again."""
K_BLOCK_MIN = 128
"""Rows of ``B`` per block of ``K``, at least (the tile's sums load and store once a
block)."""
STRIP_GROUP = 16
"""Strips of a transposed ``A`` packed together per block of ``K`` (:func:`_blocks`): rows of
``MR * STRIP_GROUP`` values read side by side, and strips that stay in L2 beside the
output rows they add to (all of a ``[1024, 2048]`` ``dYᵀ``'s strips, 1 MB a block, pushed
the output out of L2: weight gradients ran 7-14% slower)."""
CLAIM_STRIPS = 2
"""Strips a part of :func:`_tiles` claims at a time where parts claim theirs (24 or 48 rows:
an atomic add per claim). Against fixed halves, alternating in one process at two threads on
the ``nn_step`` encoder's forward and input-gradient products: 0.89-0.98x the time over the
eight of them in six runs, 0.83-0.99x each (this 2-vCPU host's cores often ran at unequal
speeds); at one thread there is one part, and nothing claims. Two strips a claim against
four: 0.984-0.998x the time over the same eight (three runs; the last claim's wait is
shorter, most where a strip runs ``K = 1024``); one strip within those."""
PANELS_MAX_ROWS = 1024
"""Rows of ``A`` up to which a product whose ``B`` fits in L2 (packed whole) gives each
thread a share of ``B``'s panels and every strip of ``A`` (:func:`_across_panels`) rather
than strips to claim, and takes a second thread from a quarter of
:data:`PARALLEL_MIN_MACS`. Measured on a 2-vCPU Zen 4 at two threads, against claimed
strips at two threads: ``[64, 784] @ [784, 256]`` 166-171 us against 222-227 (one thread,
the default below 16M multiply-adds before: 388), ``[64, 256] @ [256, 256]`` 64-68
against 92, ``[128, 784] @ [784, 256]`` 269-277 against 391-399, a weight gradient's
``[256, 64]ᵀ @ [64, 256]`` 63-64 against 74-75; by shares of panels alone, 512 rows took
0.88-0.92x the time, 1024 rows 0.98-1.00x, 2048 rows 1.02-1.03x and 4096 1.07x (so those
claim strips)."""
PREFETCH_TAPS = 32
"""Steps of ``K`` ahead that the tile prefetches its panel's rows into L1 (4 KiB for
float32; 16-64 measured within noise of each other, 7-12% faster than none: a panel's rows
come from L2 once per strip, and the hardware's prefetch fell behind the tile's loads)."""
PARALLEL_MIN_MACS = 1 << 24
"""Products of fewer multiply-adds than this run on one thread (as ``numba_conv``)."""

# numba caches a kernel by its own file, so the tile it inlines must be named here (see
# numba_conv.py; test_numba_tile.py checks this digest of numba_tile.py).
TILE_SOURCE_SHA256 = "47e810bb65cc25cd"
# And the numba_math functions it inlines (test_numba_runtime.py checks this digest).
MATH_SOURCE_SHA256 = "a5267effa21eab27"


def supports(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether :func:`matmul` takes these arrays: numba present, both float32 or both
    float64, rank >= 2, matching inner dims, broadcastable batch dims, no empty dim, and at
    least a quarter tile of columns (``NR / 4``): a narrower product (a matrix-vector one)
    would compute and pack more than 4 times the columns it has."""
    if numba is None or type(a) is not np.ndarray or type(b) is not np.ndarray:
        return False
    if a.dtype != b.dtype or a.dtype not in NR or a.ndim < 2 or b.ndim < 2:
        return False
    if a.shape[-1] != b.shape[-2] or 0 in a.shape or 0 in b.shape:
        return False
    if b.shape[-1] < NR[a.dtype] // 4:
        return False
    if a.shape[:-2] != b.shape[:-2]:
        try:
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return False
    return True


def _jit(fn):
    if numba is None:  # pragma: no cover - exercised where numba is missing
        return fn
    return numba.njit(nogil=True, cache=True, error_model="numpy")(fn)


@_jit
def _pack_panels(b, rows_of_b, t, k0, kk, p0, p1, nr, flat, at):  # pragma: no cover - compiled
    """Packs rows ``k0 : k0 + kk`` of column panels ``p0 : p1`` of ``b[t]`` (``b`` ``[Bb, K,
    N]``) into ``flat`` from ``at``, each panel ``[kk, nr]`` (zeros past the last column). It
    walks ``b`` along its smaller stride: rows (a copy that vectorizes) or, for a transposed
    ``b``, columns: where ``rows_of_b`` is not empty it is that ``b``'s memory, ``[Bb, N,
    K]`` flat, and whole vectors of columns are transposed in registers."""
    k = b.shape[1]
    n = b.shape[2]
    width = VECTOR_BYTES // flat.itemsize
    if b.strides[2] <= b.strides[1]:
        _pack_rows(b, t, k0, kk, p0, p1, nr, flat, at)
        return
    for p in range(p0, p1):
        j0 = p * nr
        cols = min(nr, n - j0)
        base = at + (p - p0) * kk * nr
        if cols < nr:
            for q in range(kk):
                for j in range(cols, nr):
                    flat[base + q * nr + j] = 0
        done = 0
        if rows_of_b.size and cols == nr:
            src0 = (t * n + j0) * k + k0
            while done + width <= kk:
                for half in range(0, nr, width):
                    _transpose(rows_of_b, src0 + half * k + done, k, flat,
                               base + done * nr + half, nr)  # fmt: skip
                done += width
        for j in range(cols):
            src = b[t, :, j0 + j]
            for q in range(done, kk):
                flat[np.uintp(base + q * nr + j)] = src[np.uintp(k0 + q)]


@_jit
def _pack_rows(b, t, k0, kk, p0, p1, nr, flat, at):  # pragma: no cover - runs compiled
    """:func:`_pack_panels` of a ``b`` whose rows are contiguous, walking its rows: each
    row's ``nr`` columns of every panel in turn (a panel at a time read ``nr`` values from
    rows a row apart, a stride no prefetcher follows past a page)."""
    n = b.shape[2]
    last = min(p1, n // nr)  # panels of nr whole columns
    for q in range(kk):
        src = b[t, k0 + q]
        row = at + q * nr
        for p in range(p0, last):
            dst = row + (p - p0) * kk * nr
            s0 = p * nr
            for j in range(nr):
                flat[np.uintp(dst + j)] = src[np.uintp(s0 + j)]
        for p in range(max(p0, last), p1):
            dst = row + (p - p0) * kk * nr
            cols = min(nr, n - p * nr)
            for j in range(cols):
                flat[np.uintp(dst + j)] = src[np.uintp(p * nr + j)]
            for j in range(cols, nr):
                flat[np.uintp(dst + j)] = 0


@_jit
def _pack(b, rows_of_b, bp, part, parts):  # pragma: no cover - runs compiled
    """Packs all of ``b`` ``[Bb, K, N]`` into column panels ``bp`` ``[Bb, N / nr, K, nr]``
    (:func:`_pack_panels`); a task is one panel, and a part packs its run of panels of each
    batch entry in one call."""
    k = b.shape[1]
    nr = bp.shape[3]
    blocks = bp.shape[1]
    tasks = bp.shape[0] * blocks
    flat = bp.reshape(-1)
    first, end = tasks * part // parts, tasks * (part + 1) // parts
    task = first
    while task < end:
        t = task // blocks
        p0 = task % blocks
        p1 = min(blocks, p0 + end - task)
        _pack_panels(b, rows_of_b, t, 0, k, p0, p1, nr, flat, task * k * nr)
        task += p1 - p0


_tile = (None if numba is None
         else tile_kernel(MR, VECTORS, accumulating=True, strided=True, prefetch=PREFETCH_TAPS,
                          biased=True))  # fmt: skip
_wide_tile = (None if numba is None
              else tile_kernel(WIDE_MR, 1, accumulating=True, strided=True,
                               prefetch=PREFETCH_TAPS, biased=True))  # fmt: skip
_narrow_tile = (_tile if numba is None or not WIDE  # (never chosen there: MR is 6)
                else tile_kernel(NARROW_MR, VECTORS, accumulating=True, strided=True,
                                 prefetch=PREFETCH_TAPS, biased=True))  # fmt: skip
_transpose = None if numba is None else transpose_kernel()
_transpose_strip = None if numba is None else transpose_kernel(MR)
_transpose8 = None if numba is None else transpose_kernel(8)  # a wide strip: by vectors
_transpose16 = None if numba is None else transpose_kernel(16)  # of its rows
_copy = None if numba is None else vector_copy()


@_jit
def _pack_strip(flat_a, by_columns, base, m, k, i0, rows, k0, kk, strip, row_at,
                mr):  # fmt: skip  # pragma: no cover - runs compiled
    """Packs rows ``i0 : i0 + rows`` of ``A`` (from ``base`` of ``flat_a``: ``[M, K]``, or
    its transpose ``[K, M]`` where ``by_columns``), columns ``k0 : k0 + kk``, into ``strip``
    ``[kk, mr]`` (``mr``: :data:`MR` or :data:`WIDE_MR`; rows past ``rows`` repeat the last
    one, never stored)."""
    if by_columns and rows == mr:  # a strip's mr values of one step of K lie side by side
        for q in range(kk):
            src = np.uintp(base + (k0 + q) * m + i0)
            at = np.uintp(q * mr)
            for r in range(mr):
                strip[at + np.uintp(r)] = flat_a[src + np.uintp(r)]
        return
    if by_columns:
        for r in range(mr):
            row_at[r] = base + k0 * m + i0 + min(r, rows - 1)
        for q in range(kk):
            step = np.uintp(q * m)
            for r in range(mr):
                strip[np.uintp(q * mr + r)] = flat_a[row_at[r] + step]
        return
    done = 0
    if rows == mr:  # whole vectors of K transposed in registers
        width = VECTOR_BYTES // strip.itemsize
        while done + width <= kk:
            src = base + i0 * k + k0 + done
            if mr == MR:
                _transpose_strip(flat_a, src, k, strip, done * mr, mr)
            elif width == 16 and mr == WIDE_MR:  # 24 rows: 8, whose stores spill into the
                _transpose8(flat_a, src + 16 * k, k, strip, done * mr + 16, mr)  # next step's
                _transpose16(flat_a, src, k, strip, done * mr, mr)  # first 16, then those 16
            else:  # vectors of 8 rows (float64's 24, or the narrow tile's 8)
                for r0 in range(0, mr, 8):
                    _transpose8(flat_a, src + r0 * k, k, strip, done * mr + r0, mr)
            done += width
    for r in range(mr):
        row_at[r] = base + (i0 + min(r, rows - 1)) * k + k0
    for q in range(done, kk):
        for r in range(mr):
            strip[np.uintp(q * mr + r)] = flat_a[row_at[r] + np.uintp(q)]


@_jit
def _pack_columns(flat_a, base, m, s0, s1, k0, kk, apack, stride):  # pragma: no cover - compiled
    """Packs strips ``s0 : s1`` of a transposed ``A`` (``[K, M]`` from ``base`` of
    ``flat_a``), columns ``k0 : k0 + kk`` of ``A``, into ``apack`` (strip ``s`` at ``(s -
    s0) * stride``, ``[kk, MR]``, then a vector of slack), walking ``A``'s memory row by
    row: a strip at a time read 48 bytes from each of ``kk`` rows 1-4 KB apart, which no
    prefetcher follows. A step's ``MR`` values go as one vector (its last elements land in
    the next step's place, or in the slack)."""
    width = VECTOR_BYTES // apack.itemsize
    for q in range(kk):
        row = base + (k0 + q) * m
        for s in range(s0, s1):
            i0 = s * MR
            at = (s - s0) * stride + q * MR
            if width >= MR and i0 + width <= m:
                _copy(flat_a, row + i0, apack, at)
                continue
            for r in range(MR):  # rows past M repeat the last one (never stored)
                apack[np.uintp(at + r)] = flat_a[row + min(i0 + r, m - 1)]


@_jit
def _run_strip(strip, strip_at, kk, rows, flat_b, b_at, panel_step, p0, p1, nr, flat_out, out_at,
               n, later, edge, bias, mr):  # fmt: skip  # pragma: no cover - runs compiled
    """Runs a packed strip of ``rows`` rows (from ``strip_at`` of ``strip``) against column
    panels ``p0 : p1`` (panel ``p`` at
    ``b_at + (p - p0) * panel_step`` of ``flat_b``), into the output rows from ``out_at``
    (adding to them where ``later``; a first block of ``K`` with a ``bias`` adds to it: the
    tiles start from its vectors, where setting it in the strip's rows first cost a product
    4-11%); tiles past an edge go through the scratch ``edge``. ``mr`` rows: :data:`MR`
    for the 12 x 2 tile, :data:`WIDE_MR` for the 24 x 1 (panels of one vector)."""
    biased = not later and bias.size > 0
    for jb in range(p0, p1):
        j0 = jb * nr
        cols = min(nr, n - j0)
        b0 = b_at + (jb - p0) * panel_step
        at = out_at + j0
        if rows == mr and cols == nr:
            if mr == MR:  # the tiles are intrinsics, inlined here (through a helper: 5% slower)
                _tile(flat_b, nr, strip, strip_at, b0, kk, flat_out, at, n, later, bias, j0,
                      biased)  # fmt: skip
            elif mr == NARROW_MR:
                _narrow_tile(flat_b, nr, strip, strip_at, b0, kk, flat_out, at, n, later, bias,
                             j0, biased)  # fmt: skip
            else:
                _wide_tile(flat_b, nr, strip, strip_at, b0, kk, flat_out, at, n, later, bias, j0,
                           biased)  # fmt: skip
            continue
        if later:
            for r in range(rows):
                for j in range(cols):
                    edge[r * nr + j] = flat_out[at + r * n + j]
        elif biased:  # the bias's columns past the edge are not there to read as vectors
            for r in range(rows):
                for j in range(cols):
                    edge[r * nr + j] = bias[j0 + j]
        if mr == MR:
            _tile(flat_b, nr, strip, strip_at, b0, kk, edge, 0, nr, later or biased, bias, 0,
                  False)  # fmt: skip
        elif mr == NARROW_MR:
            _narrow_tile(flat_b, nr, strip, strip_at, b0, kk, edge, 0, nr, later or biased,
                         bias, 0, False)  # fmt: skip
        else:
            _wide_tile(flat_b, nr, strip, strip_at, b0, kk, edge, 0, nr, later or biased, bias,
                       0, False)  # fmt: skip
        for r in range(rows):
            for j in range(cols):
                flat_out[at + r * n + j] = edge[r * nr + j]


@_jit
def _strip_scratch(out, kc, k, nr, mr):  # pragma: no cover - runs compiled
    """A task's scratch: a packed strip (with a vector of slack after it, for the
    transposing copy's last store), an edge tile and the strip's row offsets."""
    width = VECTOR_BYTES // out.itemsize
    return (np.empty(min(kc, k) * mr + width, out.dtype), np.empty(mr * nr, out.dtype),
            np.empty(mr, np.uintp))  # fmt: skip


@_jit
def _tiles(a, by_columns, bp, out, a_of, b_of, kc, k_inner, bias, adding, claims, part,
           parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Part ``part`` of ``parts`` of ``out[t] = A[a_of[t]] @ B[b_of[t]]`` for ``A`` given as
    ``a`` ``[Ba, M, K]``, or as its transpose ``[Ba, K, M]`` where ``by_columns``, ``B``'s
    column panels ``bp`` ``[Bb, N / nr, K, nr]`` and ``out`` ``[batch, M, N]`` (see the
    module doc). A task is one strip of rows of one batch entry (:data:`WIDE_MR` where the
    panels are one vector wide, else :data:`MR`); per block of
    ``kc`` of ``K`` it packs the strip and runs it against every column panel (adding to
    ``out`` where ``adding``, else to ``bias`` where it is not empty, else to zero). With
    ``k_inner`` (all panels fit in L2) a task runs all its blocks before the next task, so
    its output rows stay in L1 (with blocks outer, a ``[2048, 1024] @ [1024, 256]`` product
    re-read its 2 MB output from L3 once a block: 1-5% slower); else each block runs every
    task, so a block of a larger ``B`` (kept panels) is read from L2 by all of them."""
    m = out.shape[1]
    n = out.shape[2]
    k = a.shape[1] if by_columns else a.shape[2]
    nr = bp.shape[3]
    mr = WIDE_MR if nr * out.itemsize == VECTOR_BYTES else MR
    panels = bp.shape[1]
    strips = (m + mr - 1) // mr
    tasks = out.shape[0] * strips
    flat_a = a.reshape(-1)
    flat_b = bp.reshape(-1)
    flat_out = out.reshape(-1)
    strip, edge, row_at = _strip_scratch(out, kc, k, nr, mr)
    blocks = (k + kc - 1) // kc
    piece = np.int64(part)  # a parallel launch's prange index is unsigned
    while piece < parts:  # this call's slice, then those it claims (numba_runtime.claims)
        first, end = tasks * piece // parts, tasks * (piece + 1) // parts
        for step in range((end - first) * blocks):
            if k_inner:  # a strip's output rows stay in L1 over all of K
                task, kb = first + step // blocks, step % blocks
            else:
                task, kb = first + step % (end - first), step // (end - first)
            k0 = kb * kc
            kk = min(kc, k - k0)
            t = task // strips
            i0 = task % strips * mr
            rows = min(mr, m - i0)
            _pack_strip(flat_a, by_columns, a_of[t] * m * k, m, k, i0, rows, k0, kk, strip,
                        row_at, mr)  # fmt: skip
            _run_strip(strip, 0, kk, rows, flat_b, (b_of[t] * panels * k + k0) * nr, k * nr, 0,
                       panels, nr, flat_out, (t * m + i0) * n, n, adding or k0 > 0, edge, bias,
                       mr)  # fmt: skip
        piece = next_part(claims)


@_jit
def _blocks(a, by_columns, b, rows_of_b, bufs, abufs, out, a_of, b_of, kc, nr, by_panels, bias,
            adding, part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """:func:`_tiles` for a product of several blocks of ``K``, with ``B`` packed a block at a
    time (into this part's ``bufs[part]``, where the block stays in L2) instead of all of it
    first (a weight gradient's 8 MB ``B`` came back from memory for every block). A part
    takes a share of the column panels and every strip of ``A`` where ``by_panels``, else a
    share of the strips and every panel (so each part packs the smaller operand whole)."""
    m = out.shape[1]
    n = out.shape[2]
    k = b.shape[1]
    panels = (n + nr - 1) // nr
    strips = (m + MR - 1) // MR
    p0, p1, s0, s1 = 0, panels, 0, strips
    if by_panels:
        p0, p1 = panels * part // parts, panels * (part + 1) // parts
    else:
        s0, s1 = strips * part // parts, strips * (part + 1) // parts
    buf = bufs[part]
    abuf = abufs[part]  # a transposed A's strips, each [kc, MR] and a vector of slack
    stride = kc * MR + VECTOR_BYTES // out.itemsize
    flat_a = a.reshape(-1)
    flat_out = out.reshape(-1)
    strip, edge, row_at = _strip_scratch(out, kc, k, nr, MR)
    for t in range(out.shape[0]):
        for k0 in range(0, k, kc):
            kk = min(kc, k - k0)
            _pack_panels(b, rows_of_b, b_of[t], k0, kk, p0, p1, nr, buf, 0)
            for s in range(s0, s1):
                i0 = s * MR
                rows = min(MR, m - i0)
                out_at = (t * m + i0) * n
                if not by_columns:
                    _pack_strip(flat_a, by_columns, a_of[t] * m * k, m, k, i0, rows, k0, kk,
                                strip, row_at, MR)  # fmt: skip
                    _run_strip(strip, 0, kk, rows, buf, 0, kk * nr, p0, p1, nr, flat_out,
                               out_at, n, adding or k0 > 0, edge, bias, MR)  # fmt: skip
                    continue
                group = (s - s0) % STRIP_GROUP
                if group == 0:
                    _pack_columns(flat_a, a_of[t] * m * k, m, s, min(s + STRIP_GROUP, s1), k0,
                                  kk, abuf, stride)  # fmt: skip
                _run_strip(abuf, group * stride, kk, rows, buf, 0, kk * nr, p0, p1, nr,
                           flat_out, out_at, n, adding or k0 > 0, edge, bias, MR)  # fmt: skip


@_jit
def _across_panels(a, by_columns, bp, out, bias, adding, part, parts):  # pragma: no cover
    """``out[e] = A[e] @ B[e]`` for a stack of ``A`` ``[E, M, K]`` (or its transpose ``[E, K,
    M]`` where ``by_columns``) and all of the ``B``'s column panels ``bp`` ``[E, N / nr, K,
    nr]`` (``nr``: :data:`NR`): a part takes a share of the (entry, panel) pairs and every
    strip of ``A`` against them (:func:`matmul_packed`, and :func:`matmul` for few rows);
    the sums start from ``out``'s values where ``adding``, else from ``bias`` where it is
    not empty."""
    m = out.shape[1]
    n = out.shape[2]
    k = a.shape[1] if by_columns else a.shape[2]
    nr = bp.shape[3]
    mr = MR  # or the narrow tile where it runs fewer rows (16: 16 rather than 24)
    if WIDE and -(-m // NARROW_MR) * NARROW_MR < -(-m // MR) * MR:
        mr = NARROW_MR
    panels = bp.shape[1]
    tasks = out.shape[0] * panels
    lo, hi = tasks * part // parts, tasks * (part + 1) // parts
    flat_a = a.reshape(-1)
    flat_b = bp.reshape(-1)
    flat_out = out.reshape(-1)
    strip, edge, row_at = _strip_scratch(out, k, k, nr, mr)
    for e in range(lo // panels, (hi + panels - 1) // panels):
        p0, p1 = max(lo - e * panels, 0), min(hi - e * panels, panels)
        for i0 in range(0, m, mr):
            rows = min(mr, m - i0)
            _pack_strip(flat_a, by_columns, e * m * k, m, k, i0, rows, 0, k, strip, row_at, mr)
            _run_strip(strip, 0, k, rows, flat_b, (e * panels + p0) * k * nr, k * nr, p0, p1,
                       nr, flat_out, (e * m + i0) * n, n, adding, edge, bias, mr)  # fmt: skip


def _k_block(k: int, n: int, itemsize: int) -> int:
    """Rows of ``B`` per block of ``K``, for a part that packs ``n`` of its columns: their
    panels stay in L2 (about :data:`B_BLOCK_BYTES`) while every strip of ``A`` runs against
    them, and a packed strip of :data:`MR` rows is at most :data:`STRIP_BYTES` (a strip of
    :data:`WIDE_MR` takes as many steps: 1024 steps of float32 ran 2-7% faster than 512)."""
    nr = _NR_BY_ITEMSIZE[itemsize]
    columns = -(-n // nr) * nr
    fits = min(B_BLOCK_BYTES // (columns * itemsize), STRIP_BYTES // (MR * itemsize))
    return min(k, max(K_BLOCK_MIN, fits))


def matmul(a: np.ndarray, b: np.ndarray, threads: int | None = None,
           empty: Callable = np.empty, bias: np.ndarray | None = None,
           into: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """``a @ b`` for ``a`` ``[..., M, K]`` and ``b`` ``[..., K, N]`` (batch dims broadcast,
    as ``np.matmul``), of any strides; returns a new C-contiguous array of their dtype,
    made by ``empty(shape, dtype)`` (a pool's ``take``, say). With ``bias`` (``[N]``, of
    their dtype) it returns ``a @ b + bias``, the sums of each output starting from its
    bias (so the rounding differs from a separate addition's). With ``into`` (a
    C-contiguous array of the output's shape and dtype, apart from ``a`` and ``b``) it adds
    ``a @ b`` to ``into``'s values in place, the sums starting from them, and returns it.

    ``threads`` parts run the kernels (default: one below :data:`PARALLEL_MIN_MACS`
    multiply-adds, else ``EMBER_FUSION_THREADS`` or every core). Raises
    :class:`KernelUnsupported` for what :func:`supports` refuses, a bias not ``[N]`` of
    their dtype, or an ``into`` it cannot add to (with a bias too).
    """
    from ember.backends.fusion.numba_runtime import _run_parts, parts_for

    if not supports(a, b):
        raise KernelUnsupported(
            f"numba matmul: {a.dtype} {a.shape} @ {b.dtype} {b.shape} is not supported"
        )
    dtype = a.dtype
    if bias is None:
        bias = _NO_ROWS[dtype]
    elif type(bias) is not np.ndarray or bias.shape != b.shape[-1:] or bias.dtype != dtype:
        raise KernelUnsupported(f"numba matmul: a bias {getattr(bias, 'shape', bias)} for "
                                f"{dtype} columns {b.shape[-1]}")  # fmt: skip
    else:
        bias = read_only(np.ascontiguousarray(bias))
    nr = NR[dtype]
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = a.shape[:-2]
    if b.ndim > 2 and b.shape[:-2] != batch:  # NumPy's broadcast costs microseconds a call
        batch = b.shape[:-2] if a.ndim == 2 else np.broadcast_shapes(batch, b.shape[:-2])
    adding = into is not None
    if adding:
        if (type(into) is not np.ndarray or into.shape != (*batch, m, n) or into.dtype != dtype
                or not into.flags.c_contiguous or not into.flags.writeable or bias.size
                or np.may_share_memory(into, a) or np.may_share_memory(into, b)):  # fmt: skip
            raise KernelUnsupported(f"numba matmul: cannot add {a.shape} @ {b.shape} into "
                                    f"{getattr(into, 'shape', into)}")  # fmt: skip

        def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            return into.reshape(shape)

    a_of = _batch_map(a.shape[:-2], batch)
    b_of = _batch_map(b.shape[:-2], batch)
    a3, by_columns = _batched_a(a, m, k)
    b3 = read_only(b.reshape(-1, k, n), fresh=True)
    rows_of_b = _rows_of(b3)
    panels = -(-n // nr)
    by_panels = n >= m  # each part packs all of the smaller operand
    panel_bytes = b3.shape[0] * panels * k * nr * dtype.itemsize  # all of K
    constant = immutable(b)
    # Few rows, B in L2 and A's strips in L1: the threads share B's panels.
    across = (not constant and a_of.size == 1 and m <= PANELS_MAX_ROWS
              and panel_bytes <= B_BLOCK_BYTES and k * MR * dtype.itemsize <= STRIP_BYTES)  # fmt: skip
    work = a_of.size * m * n * k
    parts = min(parts_for(work, PARALLEL_MIN_MACS // 4, threads), panels) if across else \
        parts_for(work, PARALLEL_MIN_MACS, threads)  # fmt: skip
    if constant:  # a constant (an imported model's weight): its panels are packed once
        base = owner(b)
        view = (byte_offset(b, base), b.shape, b.strides, dtype.str)
        bp = _kept.get(("gemm_panels", view), (base,), _packed_panels, b3, rows_of_b, parts)
        out = _multiply(a3, by_columns, bp, None, (*batch, m, n), a_of, b_of, threads, empty,
                        bias, adding, parts)  # fmt: skip
    elif panel_bytes > B_BLOCK_BYTES and (panels if by_panels else -(-m // MR)) >= parts:
        out = empty((*batch, m, n), dtype)
        shared = -(-panels // parts) if by_panels else panels
        kc = _k_block(k, shared * nr, dtype.itemsize)  # a part's panels in its L2
        bufs = _scratch("blocks", (parts, shared * kc * nr), dtype)
        strips = min(STRIP_GROUP, -(-m // MR) if by_panels else -(-m // (MR * parts)))
        slack = VECTOR_BYTES // dtype.itemsize
        abufs = _scratch("strips", (parts, strips * (kc * MR + slack) if by_columns else 1), dtype)
        _run_parts(_blocks, [a3, by_columns, b3, rows_of_b, bufs, abufs, out.reshape(-1, m, n),
                             a_of, b_of, kc, nr, by_panels, bias, adding], parts)  # fmt: skip
    elif across and parts > 1:
        bp = _scratch("b", (1, panels, k, nr), dtype)
        _run_parts(_pack, [b3, rows_of_b, bp], parts)
        out = empty((*batch, m, n), dtype)
        _run_parts(_across_panels, [a3, by_columns, bp, out.reshape(1, m, n), bias, adding],
                   parts)  # fmt: skip
    else:
        width = _panel_width(dtype)
        bp = _scratch("b", (b3.shape[0], -(-n // width), k, width), dtype)
        out = _multiply(a3, by_columns, bp, (_pack, [b3, rows_of_b, bp]), (*batch, m, n), a_of,
                        b_of, threads, empty, bias, adding, parts)  # fmt: skip
    return into if adding else out


_NO_ROWS = {dtype: read_only(np.empty(0, dtype), fresh=True) for dtype in NR}


class PackedB:
    """The column panels of one ``[K, N]`` operand or a stack of them, packed once for many
    products by the same ``B`` (:func:`pack_b`, :func:`matmul_packed`): a recurrent layer's
    ``W_hh``, read by every step (one a direction)."""

    __slots__ = ("dtype", "entries", "panels", "shape")

    def __init__(self, panels: np.ndarray, shape: tuple[int, int], dtype: np.dtype) -> None:
        self.panels, self.shape, self.dtype = panels, shape, dtype
        self.entries = panels.shape[0]


def pack_b(b: np.ndarray, threads: int | None = None) -> PackedB:
    """``b`` (``[K, N]`` or a stack ``[E, K, N]``, float32 or float64, any strides) packed
    for :func:`matmul_packed`.

    Raises:
        KernelUnsupported: numba missing, or ``b`` not a 2-D or 3-D float32/float64 array
            of at least a quarter tile of columns.
    """
    if (numba is None or type(b) is not np.ndarray or b.ndim not in (2, 3) or b.dtype not in NR
            or 0 in b.shape or b.shape[-1] < NR[b.dtype] // 4):  # fmt: skip
        raise KernelUnsupported(f"numba matmul: cannot pack {getattr(b, 'dtype', type(b))} "
                                f"{getattr(b, 'shape', '')} as a product's B")  # fmt: skip
    from ember.backends.fusion.numba_runtime import PARALLEL_MIN, parts_for

    k, n = b.shape[-2:]
    b3 = read_only(b.reshape(-1, k, n), fresh=True)
    parts = parts_for(b.size, PARALLEL_MIN, threads)
    return PackedB(_packed_panels(b3, b3, _rows_of(b3), parts, NR[b.dtype]), (k, n), b.dtype)


def matmul_packed(a: np.ndarray, packed: PackedB, out: np.ndarray,
                  threads: int | None = None) -> np.ndarray:  # fmt: skip
    """``a @ B`` into ``out`` for ``B`` packed by :func:`pack_b`: ``a`` ``[M, K]`` (or ``[E,
    M, K]`` for a stack of ``E``) of ``B``'s dtype, C-contiguous or the transpose of a
    C-contiguous array in its last two dims, and ``out`` ``[M, N]`` (``[E, M, N]``)
    C-contiguous. Each thread takes a share of the panels of ``B`` (of every entry) and
    every row of ``a``, so for a product of few rows (a recurrent step's ``[batch, H] @
    W_hh``) its share of ``B`` stays in its cache from one call to the next, and nothing
    is packed again. Returns ``out``.

    Raises:
        KernelUnsupported: shapes, dtypes or layouts other than those.
    """
    from ember.backends.fusion.numba_runtime import _run_parts, parts_for

    k, n = packed.shape
    entries = packed.entries
    stacked = (entries,) if entries > 1 or getattr(a, "ndim", 0) == 3 else ()
    if (type(a) is not np.ndarray or a.ndim != len(stacked) + 2 or a.dtype != packed.dtype
            or a.shape[:-2] != stacked or a.shape[-1] != k or a.shape[-2] == 0
            or type(out) is not np.ndarray or out.shape != (*a.shape[:-1], n)
            or out.dtype != packed.dtype or not out.flags.c_contiguous
            or not out.flags.writeable or np.may_share_memory(out, a)):  # fmt: skip
        raise KernelUnsupported(f"numba matmul: {getattr(a, 'shape', a)} @ packed "
                                f"{entries}x{k}x{n} into {getattr(out, 'shape', out)}")  # fmt: skip
    m = a.shape[-2]
    a3, by_columns = _batched_a(a, m, k)
    # Nothing to pack: a second thread pays off at an eighth of matmul's work (a step's
    # [16, 256] @ [256, 1024]: 55-62 us at two threads, 83 at one; two directions'
    # [16, 128] @ [128, 512], 2.1M multiply-adds: 26 against 44; 1.3M: 50 against 49).
    parts = min(parts_for(entries * m * n * k, PARALLEL_MIN_MACS // 8, threads),
                entries * packed.panels.shape[1])  # fmt: skip
    _run_parts(_across_panels, [a3, by_columns, packed.panels, out.reshape(entries, m, n),
                                _NO_ROWS[a.dtype], False], parts)  # fmt: skip
    return out


def _batched_a(a: np.ndarray, m: int, k: int) -> tuple[np.ndarray, bool]:
    """``(array, by_columns)``: ``a`` as ``[batch, m, k]`` or, where it is a transposed
    C-contiguous array (a weight's gradient reads ``dY``ᵀ), as that array ``[batch, k, m]``
    with ``by_columns`` True; C-contiguous and aligned (copied into scratch where it is not:
    an unaligned array is a type of its own to numba, compiled anew), and typed read-only
    (:func:`read_only`)."""
    by_columns = a.ndim >= 2 and m > 1 and a.swapaxes(-1, -2).flags.c_contiguous
    a3 = a.swapaxes(-1, -2).reshape(-1, k, m) if by_columns else a.reshape(-1, m, k)
    if not (a3.flags.c_contiguous and a3.flags.aligned):
        copy = _scratch("a", a3.shape, a.dtype)
        np.copyto(copy, a3)
        return read_only(copy), by_columns  # the scratch stays writable for the next copy
    return read_only(a3, fresh=True), by_columns


_kept = Kept()
"""The column panels of ``B`` operands nothing can change, per owner array and view."""


def _panel_width(dtype: np.dtype) -> int:
    """Columns of the panels of a ``B`` packed whole (:func:`_tiles`): one vector where the
    24 x 1 tile runs (:data:`WIDE`), else :data:`NR`."""
    return VECTOR_BYTES // dtype.itemsize if WIDE else NR[dtype]


def _rows_of(b3: np.ndarray) -> np.ndarray:
    """A transposed ``b3``'s (a weight's ``Wᵀ``) rows, flat, for :func:`_pack_panels` to
    transpose by whole vectors; empty where ``b3`` is not one."""
    rows = b3.swapaxes(1, 2)
    return rows.reshape(-1) if rows.flags.c_contiguous else _NO_ROWS[b3.dtype]


def _packed_panels(_owner: np.ndarray, b3: np.ndarray, rows_of_b: np.ndarray, parts: int,
                   width: int | None = None) -> np.ndarray:  # fmt: skip
    """``b3``'s column panels (``width`` columns each; default :func:`_panel_width`) in an
    array of their own (:func:`_pack`), to keep."""
    from ember.backends.fusion.numba_runtime import _run_parts

    k, n = b3.shape[1:]
    nr = width or _panel_width(b3.dtype)
    bp = np.empty((b3.shape[0], -(-n // nr), k, nr), b3.dtype)
    _run_parts(_pack, [b3, rows_of_b, bp], parts)
    return bp


def _multiply(a3: np.ndarray, by_columns: bool, bp: np.ndarray, pack: tuple | None,
              shape: tuple[int, ...], a_of: np.ndarray, b_of: np.ndarray, threads: int | None,
              empty: Callable, bias: np.ndarray, adding: bool = False,
              parts: int | None = None) -> np.ndarray:  # fmt: skip
    """Runs ``pack`` (a kernel filling the column panels ``bp``, and its arguments; None:
    ``bp`` is filled) and the tile kernel over ``a3`` (:func:`_batched_a`), its sums
    starting from the output's values where ``adding``, else from ``bias`` where it is not
    empty; returns the output of ``shape``. ``parts`` as :func:`matmul` worked it out (from
    ``threads`` and the sizes where not given)."""
    from ember.backends.fusion.numba_runtime import _run_parts, claims, parts_for

    m, n = shape[-2:]
    k = a3.shape[1] if by_columns else a3.shape[2]
    out = empty(shape, a3.dtype)
    if parts is None:
        parts = parts_for(a_of.size * m * n * k, PARALLEL_MIN_MACS, threads)
    if pack is not None:
        _run_parts(pack[0], pack[1], parts)
    kc = _k_block(k, n, a3.dtype.itemsize)
    k_inner = bp[0].nbytes <= B_BLOCK_BYTES
    # A call a thread, each claiming slices of CLAIM_STRIPS strips as it comes free
    # (k_inner: a strip is one task over all of K, so no two calls add to one output),
    # where fixed halves wait for the slower core.
    mr = WIDE_MR if bp.shape[3] * bp.itemsize == VECTOR_BYTES else MR
    slices = parts
    if parts > 1 and k_inner:
        slices = max(parts, -(-a_of.size * -(-m // mr) // CLAIM_STRIPS))
    _run_parts(_tiles, [a3, by_columns, bp, out.reshape(-1, m, n), a_of, b_of, kc, k_inner,
                        bias, adding, claims(parts)], slices, parts,
               calls=parts)  # fmt: skip
    return out


def supports_dequantized(a: np.ndarray, values: np.ndarray) -> bool:
    """Whether :func:`matmul_dequantized` takes these: numba present, a float32 ``a`` of rank
    >= 2 and Int8 ``values`` ``[K, N]`` with matching ``K`` and a quarter tile of columns."""
    return (numba is not None and type(a) is np.ndarray and type(values) is np.ndarray
            and a.dtype == np.float32 and a.ndim >= 2 and values.dtype == np.int8
            and values.ndim == 2 and a.shape[-1] == values.shape[0] and 0 not in a.shape
            and values.shape[1] >= NR[a.dtype] // 4)  # fmt: skip


def matmul_dequantized(a: np.ndarray, values: np.ndarray, scales: np.ndarray,
                       zero_points: np.ndarray | None, threads: int | None = None,
                       empty: Callable = np.empty) -> np.ndarray:  # fmt: skip
    """``a @ ((values - zero_points) * scales)`` without the dequantized weight: the packing
    that :func:`matmul` does anyway dequantizes as it copies (so the weight is read as
    bytes, and no float copy of it is made).

    ``values`` is Int8 ``[K, N]``; ``scales`` (and ``zero_points``) are ``[KB, NB]`` with
    ``KB`` 1 or a divisor of ``K`` (blocks of ``K / KB`` rows) and ``NB`` 1 or ``N``; each
    value takes the parameters of its row block and column.
    """
    if not supports_dequantized(a, values):
        raise KernelUnsupported(f"numba matmul: {a.dtype} {a.shape} by int8 {values.shape} is "
                                "not supported")  # fmt: skip
    k, n = values.shape
    m = a.shape[-2]
    scales = np.ascontiguousarray(scales, np.float32)
    zero_points = (np.zeros((1, 1), np.int32) if zero_points is None
                   else np.ascontiguousarray(zero_points, np.int32))  # fmt: skip
    rows = math.prod(a.shape[:-1])
    if rows <= GEMV_ROWS:
        # A few rows (a batch of one): packing the whole weight as floats would cost more
        # than the product; read the bytes once instead.
        a2 = np.ascontiguousarray(a.reshape(rows, k))
        out = empty((*a.shape[:-1], n), a.dtype)
        from ember.backends.fusion.numba_runtime import _run_parts, parts_for

        parts = parts_for(rows * n * k, PARALLEL_MIN_MACS, threads)
        _run_parts(_gemv_dequantized, [a2, values, scales, zero_points, out.reshape(rows, n)],
                   parts)  # fmt: skip
        return out
    a3, by_columns = _batched_a(a, m, k)
    width = _panel_width(a.dtype)
    bp = _scratch("b", (1, -(-n // width), k, width), a.dtype)
    a_of = np.arange(a3.shape[0], dtype=np.int64)
    b_of = np.zeros(a3.shape[0], dtype=np.int64)
    pack = (_pack_dequantized, [values, scales, zero_points, bp])
    return _multiply(a3, by_columns, bp, pack, (*a.shape[:-1], n), a_of, b_of, threads,
                     empty, _NO_ROWS[a.dtype])  # fmt: skip


@_jit
def _pack_dequantized(q, scales, zps, bp, part, parts):  # pragma: no cover - runs compiled
    """:func:`_pack` of ``(q - zps) * scales`` (see :func:`matmul_dequantized`)."""
    k = q.shape[0]
    n = q.shape[1]
    nr = bp.shape[3]
    blocks = bp.shape[1]
    rows_per_scale = k // scales.shape[0]
    per_column = scales.shape[1] > 1
    zp_per_column = zps.shape[1] > 1
    zp_rows = zps.shape[0]
    for task in range(blocks * part // parts, blocks * (part + 1) // parts):
        j0 = task * nr
        cols = min(nr, n - j0)
        dst = bp[0, task]
        if cols < nr:
            dst[:, cols:] = 0
        for r in range(k):
            srow = scales[r // rows_per_scale]
            zrow = zps[min(r // rows_per_scale, zp_rows - 1)]
            src = q[r]
            row = dst[r]
            for j in range(cols):
                c = j0 + j
                zero = zrow[c] if zp_per_column else zrow[0]
                scale = srow[c] if per_column else srow[0]
                row[np.uintp(j)] = np.float32(np.int32(src[np.uintp(c)]) - zero) * scale


GEMV_ROWS = 4
"""At most this many rows of ``a``: :func:`matmul_dequantized` reads the weight directly."""
_GEMV_COLUMNS = 512  # columns of one task: its sums stay in L1


@_jit
def _gemv_dequantized(a, q, scales, zps, out, part, parts):  # pragma: no cover - runs compiled
    """``out = a @ ((q - zps) * scales)`` for a few rows of ``a``, reading ``q`` once: per
    block of rows of ``q`` that share a scale, the sums of ``a[i, r] * (q[r, j] - zp)``,
    then scaled into the output's sums."""
    m = a.shape[0]
    k = q.shape[0]
    n = q.shape[1]
    row_blocks = scales.shape[0]
    rows_per_scale = k // row_blocks
    per_column = scales.shape[1] > 1
    zp_per_column = zps.shape[1] > 1
    zp_rows = zps.shape[0]
    width = _GEMV_COLUMNS
    tasks = (n + width - 1) // width
    total = np.empty((m, width), np.float32)
    block = np.empty((m, width), np.float32)
    zero = np.empty(width, np.float32)
    for task in range(tasks * part // parts, tasks * (part + 1) // parts):
        j0 = task * width
        cols = min(width, n - j0)
        total[:, :cols] = 0
        for kb in range(row_blocks):
            zrow = zps[min(kb, zp_rows - 1)]
            for j in range(cols):
                zero[j] = zrow[j0 + j] if zp_per_column else zrow[0]
            block[:, :cols] = 0
            for r in range(kb * rows_per_scale, (kb + 1) * rows_per_scale):
                src = q[r]
                for i in range(m):
                    x = a[i, r]
                    acc = block[i]
                    for j in range(cols):
                        acc[np.uintp(j)] += x * (np.float32(src[np.uintp(j0 + j)]) - zero[np.uintp(j)])
            srow = scales[kb]
            for i in range(m):
                for j in range(cols):
                    scale = srow[j0 + j] if per_column else srow[0]
                    total[i, j] += block[i, j] * scale
        for i in range(m):
            for j in range(cols):
                out[i, j0 + j] = total[i, j]


def _scratch(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A reused scratch array (``ndarray/scratch.py``): a packed ``B`` of a 1024 x 1024
    weight is 4 MB, whose fresh pages would fault in on every call. Valid until this
    thread's next call."""
    return scratch(f"gemm_{name}", shape, dtype)


@functools.lru_cache(maxsize=256)
def _batch_map(shape: tuple[int, ...], batch: tuple[int, ...]) -> np.ndarray:
    """For each entry of the broadcast ``batch``, the flat index of the operand's own batch
    entry (batch dims ``shape``) that it reads; shared between calls, never written (left
    writable: the tile kernel has one compiled signature, of writable arrays)."""
    own = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    return np.broadcast_to(own, batch).reshape(-1).copy()
