"""Scaled dot-product attention as one numba kernel: ``softmax(scale * q kᵀ [masked]) v``.

Unfused, attention is two batched products and a softmax between them: the scores
``[..., Lq, Lk]`` are written, read back for the softmax, written again as weights and
read by the second product, and the heads' strided views are copied into contiguous
operands first. This kernel keeps a block of scores in cache instead and never writes
them (unless the weights are wanted), as flash attention does.

**The transposed form.** A task is one batch entry and a chunk of up to ``qc`` queries. It
computes the scores transposed, keys by queries (``sᵀ [keys, queries]``), with the
register tile of :func:`numba_tile.tile_kernel`: a tile is :data:`OB` keys by spans of
queries, summed over the head's features, from the queries packed feature-major
(``qᵀ [d, queries]``, scaled as they are packed) and the keys packed by tiles of ``OB``.
In that form every step of the softmax is lane-wise over the queries: the running
maximum, ``exp`` and the sums read whole rows of ``sᵀ``; and ``exp(sᵀ)`` is itself the
packed operand of the second product, ``oᵀ [dv, queries] = vᵀ exp(sᵀ)``, whose tile is
``OB`` value features by spans of queries, summed over the keys. No weight is ever
repacked; the only transposes are the query chunk's (``Lq * d``) and the output's.

**Long rows.** Keys come in blocks of ``kb``; each block updates each query's running
maximum ``m``, sum ``l`` and output as the online softmax does (the earlier blocks'
terms are rescaled by ``exp(m_old - m_new)``), and the output is divided by ``l`` at
the end. Written weights need the final sums, so a call that writes them takes all keys
in one block.

**Parts.** A launch's parts claim their tasks (a batch entry's chunk of queries; a batch
entry, for the gradients) one at a time from a counter they share, as the GEMM's and the
convolution's parts do, so a core that a neighbour slows takes fewer. A task writes its
outputs alone, so the results do not depend on which part ran it.

**What it computes.** Up to float rounding, exactly the unfused ops: a masked score is
replaced by ``fill`` (``mask_fill`` after the scaling), a bias is added after the
scaling, the maximum is the row's (a NaN anywhere in a row makes the row NaN, as the
max-subtract-exp chain does), and ``exp`` is :func:`numba_math.fast_exp_f32` (in its form
for arguments at most 0, as in the fused softmax: a score less the running maximum).
float32 only.

**Arrays.** Every operand is 4-d ``[b0, b1, rows, features]`` of any strides, broadcast
batch entries included (stride 0); the kernel has one compiled signature (numba's
``A`` layout, read-only inputs), compiled on first use. An operand whose features are
contiguous (heads read where they lie in a projection's output, or a pooled array) is
passed a second time as a flat view of its memory (:func:`_flat`), and is packed and
written by whole vectors: blocks of ``LANES`` rows by ``LANES`` features transposed in
registers (``numba_tile.transpose_kernel``), runs of ``OB`` features copied as one. Packed
element by element through the ``A`` views (each access a strided load), the packing and
the output's transposes took half of the kernels' time (at ``nn_step``'s sizes, one thread:
forward 7.6 -> 6.7 ms with the vectors; backward 10.3 -> 9.1, with the scores' gradient
transposed the same way; the same bits).
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from ember.backends.fusion.numba_source import KernelUnsupported
from ember.backends.fusion.numba_tile import VECTOR_BYTES, tile_kernel, transpose_kernel
from ember.backends.fusion.views import read_only, strided

try:  # numba is optional: attention raises KernelUnsupported without it
    import numba

    from ember.backends.fusion.numba_math import next_part
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["KernelUnsupported", "attention", "supports"]

# numba's disk cache keys the kernel by this file only, not by numba_tile.py, whose IR it
# inlines; test_numba_tile.py checks that this names numba_tile.py's digest.
TILE_SOURCE_SHA256 = "47e810bb65cc25cd"
# And the numba_math functions it inlines (test_numba_runtime.py checks this digest).
MATH_SOURCE_SHA256 = "618c14af8418ac53"

OB = 8 if VECTOR_BYTES == 64 else 4
"""Rows (keys, or value features) of one register tile: with :data:`NV` vectors of queries,
24 accumulators on AVX-512 (12 on AVX2), as the convolution's tile."""
NV = 3
LANES = VECTOR_BYTES // 4
"""float32 lanes of a vector: queries are padded to a multiple of this."""
SPAN = NV * LANES

KEY_BLOCK = 256
"""Keys of one block of the online softmax (a block of scores stays in L2)."""
QUERY_CHUNK = 128
"""Queries of one task, at most."""


def supports(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """Whether :func:`attention` takes these operands: numba present, float32, 4-d, one
    batch shape (after broadcasting), matching features and key counts, nothing empty."""
    if numba is None or not all(type(a) is np.ndarray for a in (q, k, v)):
        return False
    if not all(a.dtype == np.float32 and a.ndim == 4 for a in (q, k, v)):
        return False
    if q.shape[3] != k.shape[3] or k.shape[2] != v.shape[2] or 0 in (*q.shape, *k.shape, *v.shape):
        return False
    try:
        _batch_shape(q, k, v)
    except ValueError:
        return False
    return True


def _batch_shape(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[int, ...]:
    """The operands' two batch dims, broadcast (NumPy's function costs microseconds a call,
    and self-attention's operands share theirs)."""
    if q.shape[:2] == k.shape[:2] == v.shape[:2]:
        return q.shape[:2]
    return np.broadcast_shapes(q.shape[:2], k.shape[:2], v.shape[:2])


def _jit(fn):
    if numba is None:  # pragma: no cover - exercised where numba is missing
        return fn
    return numba.njit(nogil=True, cache=True, fastmath={"contract"}, error_model="numpy")(fn)


if numba is not None:
    from ember.backends.fusion.numba_math import fast_exp_nonpositive_f32

    _tile3 = tile_kernel(OB, 3)
    _tile2 = tile_kernel(OB, 2)
    _tile1 = tile_kernel(OB, 1)
    _transpose = transpose_kernel()  # LANES rows by LANES lanes
    _transpose_ob = transpose_kernel(OB)  # OB rows by LANES lanes


def _tiled(i, j, n):  # pragma: no cover - runs compiled
    """Where element ``(i, j)`` of an ``[n, m]`` matrix lies when its ``j`` dim goes in tiles
    of ``OB``, each tile ``[n, OB]`` row-major: the layout the register tile reads its
    broadcast operand in (``OB`` values side by side per step)."""
    return (j // OB * n + i) * OB + j % OB


if numba is not None:
    _tiled = numba.njit(inline="always")(_tiled)


@_jit
def _spans(xq, offs, wt, wstart, taps, acc, a0, stride, width):  # pragma: no cover - compiled
    """One tile row: ``OB`` rows by every span of ``width`` lanes (a multiple of LANES)."""
    for s0 in range(0, width, SPAN):
        rest = min(SPAN, width - s0) // LANES
        if rest == 3:
            _tile3(xq, offs, wt, wstart, s0, taps, acc, a0 + s0, stride)
        elif rest == 2:
            _tile2(xq, offs, wt, wstart, s0, taps, acc, a0 + s0, stride)
        else:
            _tile1(xq, offs, wt, wstart, s0, taps, acc, a0 + s0, stride)


@_jit
def _transposed(src, s0, sstep, rows, cols, dst, d0, dstep):  # pragma: no cover - compiled
    """``dst[d0 + c * dstep + r] = src[s0 + r * sstep + c]`` for ``r < rows``, ``c < cols``
    (1-d arrays): blocks of LANES by LANES transposed in registers, the edges element by
    element."""
    u = np.uintp
    whole_rows, whole_cols = rows // LANES * LANES, cols // LANES * LANES
    for r0 in range(0, whole_rows, LANES):
        for c0 in range(0, whole_cols, LANES):
            _transpose(src, s0 + r0 * sstep + c0, sstep, dst, d0 + c0 * dstep + r0, dstep)
    for r in range(rows):
        for c in range(whole_cols if r < whole_rows else 0, cols):
            dst[u(d0 + c * dstep + r)] = src[u(s0 + r * sstep + c)]


def _row_at(strides, i, b0, b1, r):  # pragma: no cover - runs compiled
    """Where row ``[b0, b1, r]`` of operand ``i`` starts in its flat view."""
    return b0 * strides[i, 0] + b1 * strides[i, 1] + r * strides[i, 2]


if numba is not None:
    _row_at = numba.njit(inline="always")(_row_at)


@_jit
def _read_transposed(x, b0, b1, r0, rows, cols, flat, strides, i, fast, dst,
                     dstep):  # fmt: skip  # pragma: no cover - runs compiled
    """``dst[c * dstep + r] = x[b0, b1, r0 + r, c]`` for ``r < rows``, ``c < cols``: by
    blocks in registers where operand ``i`` comes flat (bit ``i`` of ``fast``), else element
    by element through ``x``."""
    if fast >> i & 1:
        _transposed(flat, _row_at(strides, i, b0, b1, r0), strides[i, 2], rows, cols, dst, 0,
                    dstep)  # fmt: skip
        return
    for r in range(rows):
        src = x[b0, b1, r0 + r]
        for c in range(cols):
            dst[np.uintp(c * dstep + r)] = src[c]


@_jit
def _write_transposed(src, sstep, rows, cols, x, b0, b1, r0, flat, strides, i,
                      fast):  # fmt: skip  # pragma: no cover - runs compiled
    """``x[b0, b1, r0 + r, c] = src[c * sstep + r]`` for ``r < rows``, ``c < cols``
    (:func:`_read_transposed` the other way)."""
    if fast >> i & 1:
        _transposed(src, 0, sstep, cols, rows, flat, _row_at(strides, i, b0, b1, r0),
                    strides[i, 2])  # fmt: skip
        return
    for r in range(rows):
        dst = x[b0, b1, r0 + r]
        for c in range(cols):
            dst[c] = src[np.uintp(c * sstep + r)]


@_jit
def _read_tiles_transposed(x, b0, b1, r0, rows, cols, flat, strides, i, fast,
                           dst):  # fmt: skip  # pragma: no cover - runs compiled
    """``dst[_tiled(c, r, cols)] = x[b0, b1, r0 + r, c]`` for ``r < rows``, ``c < cols``:
    where operand ``i`` comes flat, tiles of OB rows by LANES columns transposed in registers
    (each store spills ``LANES - OB`` values into the next column's place, written next, or
    into ``dst``'s slack), the edges element by element."""
    u = np.uintp
    whole_rows, whole_cols = 0, 0
    if fast >> i & 1:
        whole_rows, whole_cols = rows // OB * OB, cols // LANES * LANES
        at, step = _row_at(strides, i, b0, b1, r0), strides[i, 2]
        for t0 in range(0, whole_rows, OB):
            for c0 in range(0, whole_cols, LANES):
                _transpose_ob(flat, at + t0 * step + c0, step, dst, t0 * cols + c0 * OB, OB)
    for r in range(rows):
        src = x[b0, b1, r0 + r]
        for c in range(whole_cols if r < whole_rows else 0, cols):
            dst[u(_tiled(c, r, cols))] = src[c]


@_jit
def _read_tiles(x, b0, b1, r0, rows, cols, flat, strides, i, fast,
                dst):  # fmt: skip  # pragma: no cover - runs compiled
    """``dst[_tiled(r, c, rows)] = x[b0, b1, r0 + r, c]`` for ``r < rows``, ``c < cols``:
    where operand ``i`` comes flat, runs of OB contiguous values copied as vectors."""
    u = np.uintp
    if fast >> i & 1:
        at, step = _row_at(strides, i, b0, b1, r0), strides[i, 2]
        whole_cols = cols // OB * OB
        for r in range(rows):
            src = at + r * step
            for c0 in range(0, whole_cols, OB):
                to = c0 * rows + r * OB
                for c in range(OB):
                    dst[u(to + c)] = flat[u(src + c0 + c)]
            for c in range(whole_cols, cols):
                dst[u(_tiled(r, c, rows))] = flat[u(src + c)]
        return
    for r in range(rows):
        src = x[b0, b1, r0 + r]
        for c in range(cols):
            dst[u(_tiled(r, c, rows))] = src[c]


@_jit
def _attend(q, k, v, out, weights, q_out, mask, bias, scale, q_factor, fill, flags, qc, kb,
            flat_q, flat_k, flat_v, flat_out, flat_q_out, flat_weights, strides, fast, claims,
            part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Tasks ``part`` of ``parts`` (see the module doc). ``flags``: 1 writes ``weights``
    (then ``kb`` covers every key), 2 applies ``mask``, 4 adds ``bias``, 8 writes ``q *
    q_factor`` into ``q_out`` as it packs the queries. ``fast`` bit ``i`` says operand
    ``i`` of ``(q, k, v, out, q_out, weights)`` has contiguous features and is also given as
    ``flat_*``, its memory from its first element, with ``strides[i]`` in elements (see
    :func:`_flat`): it is then packed or written by whole vectors."""
    u = np.uintp
    b0n, b1n, lq, d = out.shape[0], out.shape[1], q.shape[2], q.shape[3]
    lk = k.shape[2]
    dv = v.shape[3]
    one = np.float32(1)
    qcp = (qc + LANES - 1) // LANES * LANES
    key_tiles = (kb + OB - 1) // OB
    value_tiles = (dv + OB - 1) // OB
    # Slack after each tile source and target: a span reads and writes whole vectors.
    qt = np.zeros(d * qcp + SPAN, np.float32)
    kp = np.zeros(key_tiles * d * OB + LANES, np.float32)  # slack: a transpose's last store
    st = np.zeros(key_tiles * OB * qcp + SPAN, np.float32)
    vp = np.zeros(value_tiles * kb * OB, np.float32)
    block_out = np.zeros(value_tiles * OB * qcp + SPAN, np.float32)
    acc = np.zeros(value_tiles * OB * qcp + SPAN, np.float32)
    m = np.empty(qcp, np.float32)
    m_new = np.empty(qcp, np.float32)
    alpha = np.empty(qcp, np.float32)
    total = np.empty(qcp, np.float32)
    offs_q = np.arange(d) * qcp
    offs_s = np.arange(kb) * qcp
    write_weights, masked, biased, write_q = flags & 1, flags & 2, flags & 4, flags & 8
    blocks = (lk + kb - 1) // kb
    chunks = (lq + qc - 1) // qc
    tasks = b0n * b1n * chunks
    piece = np.int64(part)  # a parallel launch's prange index is unsigned
    while piece < parts:  # this call's slice, then those it claims (numba_runtime.claims)
        for task in range(tasks * piece // parts, tasks * (piece + 1) // parts):
            b0 = task // (b1n * chunks)
            b1 = task // chunks % b1n
            i0 = task % chunks * qc
            rows = min(qc, lq - i0)
            width = (rows + LANES - 1) // LANES * LANES
            qb0, qb1 = min(b0, q.shape[0] - 1), min(b1, q.shape[1] - 1)
            kb0, kb1 = min(b0, k.shape[0] - 1), min(b1, k.shape[1] - 1)
            vb0, vb1 = min(b0, v.shape[0] - 1), min(b1, v.shape[1] - 1)
            _read_transposed(q, qb0, qb1, i0, rows, d, flat_q, strides, 0, fast, qt, qcp)
            for c in range(d):
                row = c * qcp
                for r in range(rows):
                    qt[u(row + r)] *= scale
            if write_q and fast & 17 == 17:
                at, to = _row_at(strides, 0, qb0, qb1, i0), _row_at(strides, 4, qb0, qb1, i0)
                for r in range(rows):
                    src_at, dst_at = at + r * strides[0, 2], to + r * strides[4, 2]
                    for c in range(d):
                        flat_q_out[u(dst_at + c)] = flat_q[u(src_at + c)] * q_factor
            elif write_q:
                for r in range(rows):
                    src = q[qb0, qb1, i0 + r]
                    dst = q_out[qb0, qb1, i0 + r]
                    for c in range(d):
                        dst[c] = src[c] * q_factor
            for r in range(width):
                m[u(r)] = -np.inf
                total[u(r)] = 0
            for j0 in range(0, lk, kb):
                keys = min(kb, lk - j0)
                _read_tiles_transposed(k, kb0, kb1, j0, keys, d, flat_k, strides, 1, fast, kp)
                for t in range((keys + OB - 1) // OB):
                    _spans(qt, offs_q, kp, t * d * OB, d, st, t * OB * qcp, qcp, width)
                if masked or biased:
                    for r in range(rows):
                        mrow = mask[min(b0, mask.shape[0] - 1), min(b1, mask.shape[1] - 1),
                                    min(i0 + r, mask.shape[2] - 1)]  # fmt: skip
                        brow = bias[min(b0, bias.shape[0] - 1), min(b1, bias.shape[1] - 1),
                                    min(i0 + r, bias.shape[2] - 1)]  # fmt: skip
                        for j in range(keys):
                            at = u(j * qcp + r)
                            if masked and mrow[min(j0 + j, mrow.shape[0] - 1)]:
                                st[at] = fill
                            if biased:
                                st[at] += brow[min(j0 + j, brow.shape[0] - 1)]
                # The running maximum, lane by lane (a NaN is skipped here and poisons the
                # sums below, as it poisons the unfused softmax).
                for r in range(width):
                    m_new[u(r)] = m[u(r)]
                for j in range(keys):
                    row = j * qcp
                    for r in range(width):
                        x = st[u(row + r)]
                        m_new[u(r)] = x if x > m_new[u(r)] else m_new[u(r)]
                for r in range(width):
                    alpha[u(r)] = fast_exp_nonpositive_f32(m[u(r)] - m_new[u(r)])
                    total[u(r)] *= alpha[u(r)]
                    m[u(r)] = m_new[u(r)]
                for j in range(keys):
                    row = j * qcp
                    for r in range(width):
                        e = fast_exp_nonpositive_f32(st[u(row + r)] - m_new[u(r)])
                        st[u(row + r)] = e
                        total[u(r)] += e
                _read_tiles(v, vb0, vb1, j0, keys, dv, flat_v, strides, 2, fast, vp)
                target = acc if blocks == 1 else block_out
                for t in range(value_tiles):
                    _spans(st, offs_s, vp, t * keys * OB, keys, target, t * OB * qcp, qcp, width)
                if blocks > 1:
                    for c in range(dv):
                        row = c * qcp
                        if j0 == 0:
                            for r in range(width):
                                acc[u(row + r)] = block_out[u(row + r)]
                        else:
                            for r in range(width):
                                acc[u(row + r)] = (acc[u(row + r)] * alpha[u(r)]
                                                   + block_out[u(row + r)])
            for r in range(width):
                total[u(r)] = one / total[u(r)]
            for c in range(dv):
                row = c * qcp
                for r in range(rows):
                    acc[u(row + r)] *= total[u(r)]
            _write_transposed(acc, qcp, rows, dv, out, b0, b1, i0, flat_out, strides, 3, fast)
            if write_weights:  # one block: st holds every key's exp
                for j in range(lk):
                    row = j * qcp
                    for r in range(rows):
                        st[u(row + r)] *= total[u(r)]
                _write_transposed(st, qcp, rows, lk, weights, b0, b1, i0, flat_weights, strides, 5,
                                  fast)  # fmt: skip
        piece = next_part(claims)


_ready: set = set()  # the dispatchers compiled for their one signature
_compiling = threading.Lock()  # threads asking for a kernel at once compile it once


def _compiled_once(dispatcher, *args):
    """``dispatcher`` compiled (or loaded from numba's cache) for the one signature of
    ``args`` (numba types), then closed to any other: a call of another signature raises
    instead of compiling slowly."""
    with _compiling:
        if dispatcher not in _ready:
            dispatcher.compile(numba.types.void(*args))
            dispatcher.disable_compile()
            _ready.add(dispatcher)
    return dispatcher


def _array_types():
    """The kernels' array types: read-only float32 and bool inputs of any layout, writable
    float32 outputs."""
    t = numba.types
    return (t.Array(t.float32, 4, "A", readonly=True), t.Array(t.boolean, 4, "A", readonly=True),
            t.Array(t.float32, 4, "A"))  # fmt: skip


@functools.cache
def _kernel():
    """The forward kernel, compiled for its one signature (made once: building numba's
    types took about 50 us a call)."""
    floats, flags, target = _array_types()
    flat_in, flat_out, strides = _flat_types()
    i64, f32 = numba.types.int64, numba.types.float32
    return _compiled_once(_attend, floats, floats, floats, target, target, target, flags, floats,
                          f32, f32, f32, i64, i64, i64, flat_in, flat_in, flat_in, flat_out,
                          flat_out, flat_out, strides, i64, _CLAIMS, i64, i64)  # fmt: skip


_CLAIMS = numba.types.Array(numba.types.int64, 1, "C") if numba is not None else None


def _flat_types():
    """The types of the flat views (:func:`_flat`): read-only and writable 1-d float32,
    and their strides, int64 ``[operands, 4]``."""
    t = numba.types
    return (t.Array(t.float32, 1, "C", readonly=True), t.Array(t.float32, 1, "C"),
            t.Array(t.int64, 2, "C", readonly=True))  # fmt: skip


_NO_FLAT = np.zeros(1, np.float32)


def _flat(array: np.ndarray | None) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """``array`` (4-d) as a 1-d view of its memory from its first element, and its strides
    in elements (0 along a dim of one), where its last dim is contiguous and no stride is
    negative; else None. An element ``[i, j, r, c]`` lies at ``i * s0 + j * s1 + r * s2 +
    c`` of the view, which spans exactly the array's elements (and what lies between)."""
    if array is None:
        return None
    item = array.itemsize
    if array.strides[-1] != item:
        return None
    strides, span = [], 1
    for n, s in zip(array.shape, array.strides):  # a loop: generators cost a call a step
        if s < 0 or s % item:
            return None
        lane = 0 if n == 1 else s // item
        strides.append(lane)
        span += (n - 1) * lane
    return strided(array, (span,), (item,)), tuple(strides)


def _flats(inputs: tuple, outputs: tuple) -> tuple[list, np.ndarray, int]:
    """For each of ``inputs`` (read-only arrays) and ``outputs``, its flat view
    (:func:`_flat`) or a dummy; their strides (``[operands, 4]``); and the bits of those
    that have one."""
    arrays = (*inputs, *outputs)
    views, strides, fast = [], np.zeros((len(arrays), 4), np.int64), 0
    for i, array in enumerate(arrays):
        found = _flat(array)
        if found is None:
            views.append(read_only(_NO_FLAT) if i < len(inputs) else _NO_FLAT)
            continue
        views.append(found[0])
        strides[i] = found[1]
        fast |= 1 << i
    strides.flags.writeable = False
    return views, strides, fast


def chunk_sizes(batch: int, lq: int, lk: int, parts: int, whole_rows: bool) -> tuple[int, int]:
    """``(qc, kb)``: queries per task (enough tasks for ``parts``, at most
    :data:`QUERY_CHUNK`) and keys per block (every key where the weights are written)."""
    qc = min(lq, QUERY_CHUNK)
    while qc > LANES and batch * -(-lq // qc) < 4 * parts:
        qc = max(LANES, qc // 2)
    kb = lk if whole_rows else min(lk, KEY_BLOCK)
    return qc, kb


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, *,
              mask: np.ndarray | None = None, fill: float = 0.0, bias: np.ndarray | None = None,
              out: np.ndarray | None = None, weights: np.ndarray | None = None,
              threads: int | None = None, q_out: np.ndarray | None = None,
              q_factor: float = 1.0) -> np.ndarray:  # fmt: skip
    """``softmax(scale * q @ kᵀ, masked, biased) @ v`` over the last dim of the scores.

    Args:
        q: ``[b0, b1, Lq, d]`` float32, any strides.
        k: ``[b0, b1, Lk, d]`` (keys by rows: pass ``kᵀ`` swapped back).
        v: ``[b0, b1, Lk, dv]``.
        scale: multiplies the scores before the mask and the bias.
        mask: bool, broadcasting to ``[b0, b1, Lq, Lk]``; True scores become ``fill``.
        bias: float32, broadcasting to the scores; added after the mask.
        out: ``[b0, b1, Lq, dv]`` float32 to write (any strides); a new array if None.
        weights: ``[b0, b1, Lq, Lk]`` float32 to write the softmax into, or None.
        threads: parts to run (default: every core above a small problem).
        q_out: ``q``'s shape, float32: where to write ``q * q_factor`` (a scaled query
            kept for the backward pass; ``scale`` includes ``q_factor``), or None.
        q_factor: see ``q_out``.

    Returns ``out``. Raises :class:`KernelUnsupported` for what :func:`supports` refuses.

    Example:
        >>> import numpy as np
        >>> from ember.backends.fusion.numba_attention import attention
        >>> q = k = v = np.eye(2, dtype=np.float32).reshape(1, 1, 2, 2)
        >>> attention(q, k, v, 1.0).round(3)[0, 0]
        array([[0.731, 0.269],
               [0.269, 0.731]], dtype=float32)
    """
    from ember.backends.fusion.numba_runtime import _run_parts, claims, parts_for

    if not supports(q, k, v):
        raise KernelUnsupported(f"numba attention: q {q.dtype} {q.shape}, k {k.dtype} {k.shape}, "
                                f"v {v.dtype} {v.shape} are not supported")  # fmt: skip
    batch = _batch_shape(q, k, v)
    lq, lk, d, dv = q.shape[2], k.shape[2], q.shape[3], v.shape[3]
    scores = (*batch, lq, lk)
    if out is None:
        out = np.empty((*batch, lq, dv), np.float32)
    flags = 0
    dummy = np.zeros((1, 1, 1, 1), np.float32)
    if weights is not None:
        flags |= 1
    if mask is not None:
        flags |= 2
        mask = np.broadcast_to(mask, scores)
    if bias is not None:
        flags |= 4
        bias = np.broadcast_to(bias, scores)
    if q_out is not None:
        flags |= 8
    wanted = [(out, (*batch, lq, dv), np.float32), (weights, scores, np.float32),
              (mask, scores, np.bool_), (bias, scores, np.float32),
              (q_out, q.shape, np.float32)]  # fmt: skip
    for array, shape, dtype in wanted:
        if array is not None and (array.shape != shape or array.dtype != dtype):
            raise KernelUnsupported(f"numba attention: {array.dtype} {array.shape} where "
                                    f"{np.dtype(dtype)} {shape} is needed")  # fmt: skip
    work = math.prod(batch) * lq * lk * (d + dv)
    parts = parts_for(work, 1 << 22, threads)
    qc, kb = chunk_sizes(math.prod(batch), lq, lk, parts, weights is not None)
    q, k, v = read_only(q), read_only(k), read_only(v)
    flat, strides, fast = _flats((q, k, v), (out, q_out, weights))
    args = [q, k, v, out, dummy if weights is None else weights,
            dummy if q_out is None else q_out,
            read_only(np.zeros((1, 1, 1, 1), np.bool_) if mask is None else mask),
            read_only(dummy if bias is None else bias),
            np.float32(scale), np.float32(q_factor), np.float32(fill), flags, qc, kb,
            *flat, strides, fast, claims(parts)]  # fmt: skip
    # A call a thread, each claiming a task at a time as it comes free.
    tasks = math.prod(batch) * -(-lq // qc) if parts > 1 else 1
    _run_parts(_kernel(), args, tasks, parts, calls=parts)
    return out


# ---------------------------------------------------------------------------- backward
BACKWARD_MAX_SCORES = 1 << 18
"""Scores of one batch entry, at most, that the backward kernel takes (``Lq * Lk``): it
holds a batch entry's whole scores gradient, in both layouts, in cache."""


def _row_dot(a, b, at, n):  # pragma: no cover - runs compiled
    """``sum(a[at:at + n] * b[at:at + n])``, reassociated into vector lanes."""
    total = a.dtype.type(0)
    for j in range(n):
        total += a[np.uintp(at + j)] * b[np.uintp(at + j)]
    return total


if numba is not None:
    _row_dot = numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"},
                          error_model="numpy")(_row_dot)  # fmt: skip


@_jit
def _attend_backward(q, k, v, weights, d_out, d_q, d_k, d_v, mask, factor, q_factor, masked,
                     flat_q, flat_k, flat_v, flat_d_out, flat_d_q, flat_d_k, flat_d_v, strides,
                     fast, claims, part, parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Batch entries ``part`` of ``parts`` of :func:`attention_backward`; ``fast`` bit ``i``:
    operand ``i`` of ``(q, k, v, d_out, d_q, d_k, d_v)`` is given flat too (see
    :func:`_attend`)."""
    u = np.uintp
    b0n, b1n, lq, d = d_q.shape[0], d_q.shape[1], q.shape[2], q.shape[3]
    lk = k.shape[2]
    dv = v.shape[3]
    kbp = (lk + LANES - 1) // LANES * LANES
    qcp = (lq + LANES - 1) // LANES * LANES
    q_tiles = (lq + OB - 1) // OB
    d_tiles = (d + OB - 1) // OB
    v_tiles = (dv + OB - 1) // OB
    out_q = np.zeros(dv * q_tiles * OB + LANES, np.float32)  # dO by query tiles, feature-major
    vt = np.zeros(dv * kbp, np.float32)  # vᵀ [dv, keys]
    dp = np.zeros(q_tiles * OB * kbp, np.float32)  # dP [queries, keys]
    pp = np.zeros(lq * kbp, np.float32)  # P [queries, keys]
    ds = np.zeros(lq * kbp, np.float32)  # dS [queries, keys]
    dst = np.zeros(lk * qcp, np.float32)  # dSᵀ [keys, queries]
    q_f = np.zeros(d_tiles * lq * OB, np.float32)  # q by feature tiles, query-major
    out_f = np.zeros(v_tiles * lq * OB, np.float32)  # dO by feature tiles, query-major
    k_f = np.zeros(d_tiles * lk * OB, np.float32)  # k by feature tiles, key-major
    dkt = np.zeros(d_tiles * OB * kbp, np.float32)  # dKᵀ [d, keys]
    dvt = np.zeros(v_tiles * OB * kbp, np.float32)  # dVᵀ [dv, keys]
    dqt = np.zeros(d_tiles * OB * qcp, np.float32)  # dQᵀ [d, queries]
    offs_c = np.arange(max(dv, 1)) * kbp
    offs_r = np.arange(lq) * kbp
    offs_j = np.arange(lk) * qcp
    tasks = b0n * b1n
    piece = np.int64(part)  # a parallel launch's prange index is unsigned
    while piece < parts:  # this call's slice, then those it claims (numba_runtime.claims)
        for task in range(tasks * piece // parts, tasks * (piece + 1) // parts):
            b0 = task // b1n
            b1 = task % b1n
            qb0, qb1 = min(b0, q.shape[0] - 1), min(b1, q.shape[1] - 1)
            kb0, kb1 = min(b0, k.shape[0] - 1), min(b1, k.shape[1] - 1)
            vb0, vb1 = min(b0, v.shape[0] - 1), min(b1, v.shape[1] - 1)
            for r in range(lq):
                p_row = weights[b0, b1, r]
                for j in range(lk):
                    pp[u(r * kbp + j)] = p_row[j]
            _read_tiles_transposed(d_out, b0, b1, 0, lq, dv, flat_d_out, strides, 3, fast, out_q)
            _read_tiles(d_out, b0, b1, 0, lq, dv, flat_d_out, strides, 3, fast, out_f)
            _read_tiles(q, qb0, qb1, 0, lq, d, flat_q, strides, 0, fast, q_f)
            _read_transposed(v, vb0, vb1, 0, lk, dv, flat_v, strides, 2, fast, vt, kbp)
            _read_tiles(k, kb0, kb1, 0, lk, d, flat_k, strides, 1, fast, k_f)
            # dP = dO vᵀ, then dS = P (dP - rowsum(dP P)), scaled, masked to 0
            for t in range(q_tiles):
                _spans(vt, offs_c, out_q, t * dv * OB, dv, dp, t * OB * kbp, kbp, kbp)
            for r in range(lq):
                at = r * kbp
                total = _row_dot(dp, pp, at, lk)
                for j in range(lk):
                    ds[u(at + j)] = pp[u(at + j)] * (dp[u(at + j)] - total) * factor
                if masked:
                    mrow = mask[min(b0, mask.shape[0] - 1), min(b1, mask.shape[1] - 1),
                                min(r, mask.shape[2] - 1)]  # fmt: skip
                    for j in range(lk):
                        if mrow[min(j, mrow.shape[0] - 1)]:
                            ds[u(at + j)] = 0
            _transposed(ds, 0, kbp, lq, lk, dst, 0, qcp)  # dSᵀ, by blocks in registers
            # dKᵀ = qᵀ dS, dVᵀ = dOᵀ P, dQᵀ = kᵀ dSᵀ: feature rows by key (query) lanes
            for t in range(d_tiles):
                _spans(ds, offs_r, q_f, t * lq * OB, lq, dkt, t * OB * kbp, kbp, kbp)
                _spans(dst, offs_j, k_f, t * lk * OB, lk, dqt, t * OB * qcp, qcp, qcp)
            for t in range(v_tiles):
                _spans(pp, offs_r, out_f, t * lq * OB, lq, dvt, t * OB * kbp, kbp, kbp)
            for c in range(d):
                row = c * qcp
                for r in range(lq):
                    dqt[u(row + r)] *= q_factor
            _write_transposed(dkt, kbp, lk, d, d_k, b0, b1, 0, flat_d_k, strides, 5, fast)
            _write_transposed(dvt, kbp, lk, dv, d_v, b0, b1, 0, flat_d_v, strides, 6, fast)
            _write_transposed(dqt, qcp, lq, d, d_q, b0, b1, 0, flat_d_q, strides, 4, fast)
        piece = next_part(claims)


@functools.cache
def _backward_kernel():
    """The backward kernel, compiled for its one signature (the weights C-contiguous: read
    row by row)."""
    floats, flags, target = _array_types()
    rows = numba.types.Array(numba.types.float32, 4, "C", readonly=True)
    flat_in, flat_out, strides = _flat_types()
    i64, f32 = numba.types.int64, numba.types.float32
    return _compiled_once(_attend_backward, floats, floats, floats, rows, floats, target,
                          target, target, flags, f32, f32, i64, flat_in, flat_in, flat_in,
                          flat_in, flat_out, flat_out, flat_out, strides, i64, _CLAIMS, i64,
                          i64)  # fmt: skip


def supports_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, weights: np.ndarray,
                      d_out: np.ndarray) -> bool:  # fmt: skip
    """Whether :func:`attention_backward` takes these: as :func:`supports`, the weights and
    the output gradient of the full batch and of float32, and at most
    :data:`BACKWARD_MAX_SCORES` scores per batch entry."""
    if not supports(q, k, v) or not all(type(a) is np.ndarray for a in (weights, d_out)):
        return False
    batch = _batch_shape(q, k, v)
    lq, lk = q.shape[2], k.shape[2]
    return (weights.shape == (*batch, lq, lk) and d_out.shape == (*batch, lq, v.shape[3])
            and weights.dtype == d_out.dtype == np.float32 and lq * lk <= BACKWARD_MAX_SCORES)  # fmt: skip


def attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, weights: np.ndarray,
                       d_out: np.ndarray, *, factor: float = 1.0, mask: np.ndarray | None = None,
                       d_q: np.ndarray | None = None, d_k: np.ndarray | None = None,
                       d_v: np.ndarray | None = None, threads: int | None = None,
                       q_factor: float = 1.0,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The gradients of ``softmax(q @ kᵀ * factor, masked) @ v`` given the softmax
    ``weights`` and the output's gradient ``d_out``: ``(d_q, d_k, d_v)``, each of its
    operand's shape (summed over broadcast batch entries by the caller: here every output
    has the full batch).

    The scores' gradient is ``dS = weights * (dP - rowsum(dP * weights))`` with ``dP =
    d_out @ vᵀ``, times ``factor``, 0 where ``mask`` is True; then ``d_q = dS @ k``,
    ``d_k = dSᵀ @ q``, ``d_v = weightsᵀ @ d_out``; ``d_q`` is stored times ``q_factor``
    (the gradient of a query scaled before the product). A batch entry's scores are held whole in
    cache (:data:`BACKWARD_MAX_SCORES`), never written out. Outputs may be given (any
    strides); new arrays otherwise. Raises :class:`KernelUnsupported` for what
    :func:`supports_backward` refuses.
    """
    from ember.backends.fusion.numba_runtime import _run_parts, claims, parts_for

    if not supports_backward(q, k, v, weights, d_out):
        raise KernelUnsupported("numba attention backward: q, k, v, weights, d_out "
                                f"{[(a.dtype.name, a.shape) for a in (q, k, v, weights, d_out)]} "
                                "are not supported")  # fmt: skip
    batch = weights.shape[:2]
    lq, lk, d, dv = q.shape[2], k.shape[2], q.shape[3], v.shape[3]
    wanted = {"d_q": (batch + (lq, d), d_q), "d_k": (batch + (lk, d), d_k),
              "d_v": (batch + (lk, dv), d_v)}  # fmt: skip
    made = []
    for name, (shape, array) in wanted.items():
        if array is None:
            array = np.empty(shape, np.float32)
        elif array.shape != shape or array.dtype != np.float32:
            raise KernelUnsupported(f"numba attention backward: {name} {array.dtype} "
                                    f"{array.shape} where float32 {shape} is needed")  # fmt: skip
        made.append(array)
    flags = np.zeros((1, 1, 1, 1), np.bool_) if mask is None else np.broadcast_to(
        mask, batch + (lq, lk))  # fmt: skip
    work = math.prod(batch) * lq * lk * (2 * d + 2 * dv)
    parts = parts_for(work, 1 << 22, threads)
    weights = np.ascontiguousarray(weights)  # read row by row: a copy only if it is a view
    q, k, v, d_out = read_only(q), read_only(k), read_only(v), read_only(d_out)
    flat, strides, fast = _flats((q, k, v, d_out), tuple(made))
    parts = min(parts, math.prod(batch))
    args = [q, k, v, read_only(weights), d_out, *made, read_only(flags), np.float32(factor),
            np.float32(q_factor), int(mask is not None), *flat, strides, fast, claims(parts)]  # fmt: skip
    tasks = math.prod(batch) if parts > 1 else 1
    _run_parts(_backward_kernel(), args, tasks, parts, calls=parts)
    return made[0], made[1], made[2]
