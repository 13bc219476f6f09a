"""Matrix multiply as a numba kernel: a candidate beside NdArray's ``np.matmul``.

:func:`matmul` computes what NdArray's ``float_matmul`` computes (``[..., M, K] @ [..., K,
N]``, batch dims broadcast) for float32 and float64, by the classic packed, register-blocked
GEMM. NumPy's OpenBLAS is held to AVX2 kernels in some environments
(``OPENBLAS_CORETYPE=Haswell``); on an AVX-512 CPU this kernel is then faster.

* **Packing.** ``B`` is copied once per call, from any strides, into column panels of
  ``NR`` columns, ``[K, NR]`` each (zeros past the last column, so every tile runs the
  same loop), that the inner loop reads contiguously; a broadcast batch entry is packed
  once. ``A`` is read in place, a tile's :data:`MR` rows side by side (rows past the last
  one read it again and are never stored); only an ``A`` that is not C-contiguous and
  writable is copied first. (Packing ``A`` into ``[K, MR]`` blocks as well measured as
  fast on the linear layers and 15-25% slower on the small batched attention products.)
* **Register tile.** A tile of ``MR x NR`` outputs lives in registers for the whole sum over
  ``K``: per ``k`` the loop reads ``NR`` values of ``B`` (``NR / lanes`` vectors), ``MR``
  values of ``A`` (broadcast) and does ``MR * NR / lanes`` vector FMAs; the outputs are
  stored once, at the end. With ``4 x 64`` float32 (``4 x 32`` float64) that is 16 of the
  32 AVX-512 registers of accumulators: 16 FMAs per 4 vector loads (AVX2: ``3 x 32``, 12 of
  16 registers, see :data:`NR`). (A tile of 6 rows or of
  48 columns spilled and ran 10x slower; 4 x 32 and 8 x 16 ran 10-25% slower than 4 x 64.)
* **How numba gets there.** numba has no vector types, so the tile is written as ``MR *
  NR`` scalar variables and LLVM's SLP vectorizer packs them into vectors. numba turns SLP
  off by default (``NUMBA_SLP_VECTORIZE``), so the tile kernel is compiled once with it on,
  under numba's compiler lock (:func:`_tile_kernel`); that scalar source is generated
  (:func:`_tile_source`) into the fusion cache folder so numba's ``cache=True`` keeps the
  machine code. Its flags are FMA contraction only: with ``reassoc`` LLVM vectorizes the
  ``k`` loop as reductions instead (measured 8x slower).
* **Blocking.** A task is one column panel of one batch entry and a run of row blocks:
  the panel (``K * NR`` values) stays in cache while the rows of ``A`` stream past it.
  The shapes this targets (transformer layers, ``K`` up to about 1024) need no blocking
  of ``K``.

**Parts.** The kernels take ``part, parts`` and run that contiguous slice of their tasks;
:func:`matmul` runs them with ``numba_runtime._run_parts`` (part 0 on the calling thread).

Measured (Zen 5, one thread, thread time, busy machine; ``benchmarks/bench_matmul_kernels.py``):
float32 about 210-240 GFLOP/s on the ONNX encoder's linear layers (``[1024, 256] @ [256,
768]`` and the like), 1.6-1.9x NumPy's Haswell OpenBLAS and 2x torch; 170-200 GFLOP/s on
its batched attention products (1.5x NumPy); float64 about 100 GFLOP/s (1.5-2x NumPy).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import sys
import threading
from collections.abc import Callable

import numpy as np

from ember.atomic import atomic_write
from ember.backends.fusion.numba_source import KernelUnsupported
from ember.backends.fusion.numba_tile import VECTOR_BYTES
from ember.backends.ndarray.scratch import scratch

try:  # numba is optional: matmul raises KernelUnsupported without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["MR", "NR", "KernelUnsupported", "matmul", "matmul_dequantized", "supports",
           "supports_dequantized"]

MR = 4 if VECTOR_BYTES == 64 else 3
"""Rows of a register tile."""
NR = {np.dtype(np.float32): VECTOR_BYTES, np.dtype(np.float64): VECTOR_BYTES // 2}
"""Columns of a register tile per dtype: four vectors (AVX-512's, or AVX2's where the host
has no AVX-512: there the 4 x 64 tile needs 32 accumulator registers of 16 and ran at 11-17
GFLOP/s on Zen 3, the 3 x 32 tile at 40-75, about OpenBLAS's speed; 5 x 16 measured
32-64, 6 x 16 and 4 x 24 15-30, the SLP vectorizer packing them worse)."""
ROW_BLOCKS_PER_TASK = 16
"""Row blocks a task runs against one column panel (64 rows): enough tasks for the parts
of a single matrix, enough rows to reuse the panel from cache."""
PARALLEL_MIN_MACS = 1 << 24
"""Products of fewer multiply-adds than this run on one thread (as ``numba_conv``)."""

_FLAGS = {"contract"}


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
def _pack(b, bp, part, parts):  # pragma: no cover - runs compiled
    """Packs ``b`` ``[Bb, K, N]`` into column panels ``bp`` ``[Bb, N / nr, K, nr]`` (zeros
    past the last column). A task is one panel; it walks ``b`` along its smaller stride:
    rows (a copy that vectorizes) or, for a transposed ``b``, columns."""
    k = b.shape[1]
    n = b.shape[2]
    nr = bp.shape[3]
    blocks = bp.shape[1]
    tasks = bp.shape[0] * blocks
    for task in range(tasks * part // parts, tasks * (part + 1) // parts):
        t = task // blocks
        j0 = task % blocks * nr
        cols = min(nr, n - j0)
        dst = bp[t, task % blocks]
        if cols < nr:
            dst[:, cols:] = 0
        if b.strides[2] <= b.strides[1]:
            for q in range(k):
                src = b[t, q]
                row = dst[q]
                for j in range(cols):
                    row[np.uintp(j)] = src[np.uintp(j0 + j)]
        else:
            for j in range(cols):
                src = b[t, :, j0 + j]
                for q in range(k):
                    dst[q, j] = src[np.uintp(q)]


def _tile_source(mr: int, nr: int) -> str:
    """Python source of the tile kernel ``tiles(a, bp, out, a_of, b_of, edge, part,
    parts)`` for ``mr x nr`` tiles: ``a`` is ``[Ba, M, K]`` (C-contiguous), ``bp`` ``B``'s
    column panels, ``out`` ``[batch, M, N]``, ``a_of[t]`` / ``b_of[t]`` the operands' batch
    entries of batch entry ``t``, ``edge`` an ``[mr, nr]`` scratch tile each tile is
    stored through (its rows and columns inside the matrix are copied out). Rows past
    ``M`` read row ``M - 1`` again (never stored)."""
    flags = "{" + ", ".join(repr(f) for f in sorted(_FLAGS)) + "}"
    cells = [(r, j) for r in range(mr) for j in range(nr)]
    lines = [
        "import numba",
        "import numpy as np",
        "",
        "",
        f"@numba.njit(nogil=True, cache=True, fastmath={flags}, error_model='numpy')",
        "def tiles(a, bp, out, a_of, b_of, edge, part, parts):",
        "    m = out.shape[1]",
        "    n = out.shape[2]",
        "    k = a.shape[2]",
        f"    row_blocks = (m + {mr - 1}) // {mr}",
        "    col_blocks = bp.shape[1]",
        f"    chunks = (row_blocks + {ROW_BLOCKS_PER_TASK - 1}) // {ROW_BLOCKS_PER_TASK}",
        "    tasks = out.shape[0] * col_blocks * chunks",
        "    zero = out.dtype.type(0)",
        "    for task in range(tasks * part // parts, tasks * (part + 1) // parts):",
        "        t = task // (col_blocks * chunks)",
        "        jb = task // chunks % col_blocks",
        "        chunk = task % chunks",
        "        bpanel = bp[b_of[t], jb].reshape(-1)",
        f"        j0 = jb * {nr}",
        f"        for ib in range(chunk * {ROW_BLOCKS_PER_TASK},"
        f" min(row_blocks, (chunk + 1) * {ROW_BLOCKS_PER_TASK})):",
        f"            i0 = ib * {mr}",
        *(f"            row{r} = a[a_of[t], min(i0 + {r}, m - 1)]" for r in range(mr)),
        *(f"            c{r}_{j} = zero" for r, j in cells),
        "            for q in range(k):",
        f"                pb = np.uintp(q * {nr})",
        *(f"                a{r} = row{r}[np.uintp(q)]" for r in range(mr)),
        *(f"                b{j} = bpanel[pb + np.uintp({j})]" for j in range(nr)),
        *(f"                c{r}_{j} += a{r} * b{j}" for r, j in cells),
        # Through the scratch tile: one store block (compile time) for whole and edge tiles.
        *(f"            edge[{r}, {j}] = c{r}_{j}" for r, j in cells),
        f"            for r in range(min({mr}, m - i0)):",
        "                src = edge[r]",
        "                dst = out[t, i0 + r]",
        f"                for j in range(min({nr}, n - j0)):",
        "                    dst[np.uintp(j0 + j)] = src[np.uintp(j)]",
    ]
    return "\n".join(lines) + "\n"


_tiles: dict[np.dtype, Callable] = {}
_tiles_lock = threading.Lock()


def _tile_kernel(dtype: np.dtype) -> Callable:
    """The tile kernel for ``dtype``, compiled with SLP vectorization on (see the module
    doc)."""
    with _tiles_lock:
        found = _tiles.get(dtype)
        if found is None:
            found = _tiles[dtype] = _compile(_tile_module(dtype).tiles, dtype)
    return found


def _tile_module(dtype: np.dtype):
    """The module of the tile kernel for ``dtype``: its generated source is written into the
    fusion cache folder (so numba can cache its machine code beside it) and imported."""
    from ember.backends.fusion.numba_runtime import cache_dir

    source = _tile_source(MR, NR[dtype])
    name = f"gemm_{dtype.name}_{hashlib.sha256(source.encode()).hexdigest()[:24]}"
    module_name = f"ember_fusion_kernels.{name}"  # as numba_runtime names its kernels
    if module_name in sys.modules:
        return sys.modules[module_name]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    # Rewriting an identical file would change its time stamp and void numba's cache.
    if not path.exists() or path.read_bytes() != source.encode():
        atomic_write(path, source.encode())
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module_name] = module
    return module


def _compile(tiles: Callable, dtype: np.dtype) -> Callable:
    """Compiles (or loads from numba's cache) the one signature of ``tiles`` that
    :func:`matmul` calls (all arrays C-contiguous and writable), with SLP vectorization on;
    no other signature is compiled after it."""
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:  # no other compilation sees the flag
        saved = numba.config.SLP_VECTORIZE
        numba.config.SLP_VECTORIZE = 1
        try:
            a, out, index = np.zeros((1, 1, 1), dtype), np.zeros((1, 1, 1), dtype), np.zeros(1, int)
            panels, edge = np.zeros((1, 1, 1, NR[dtype]), dtype), np.zeros((MR, NR[dtype]), dtype)
            tiles(a, panels, out, index, index, edge, 0, 1)
        finally:
            numba.config.SLP_VECTORIZE = saved
    tiles.disable_compile()  # a call of another signature raises instead of compiling slowly
    return tiles


def matmul(a: np.ndarray, b: np.ndarray, threads: int | None = None,
           empty: Callable = np.empty) -> np.ndarray:  # fmt: skip
    """``a @ b`` for ``a`` ``[..., M, K]`` and ``b`` ``[..., K, N]`` (batch dims broadcast,
    as ``np.matmul``), of any strides; returns a new C-contiguous array of their dtype,
    made by ``empty(shape, dtype)`` (a pool's ``take``, say).

    ``threads`` parts run the kernels (default: one below :data:`PARALLEL_MIN_MACS`
    multiply-adds, else ``EMBER_FUSION_THREADS`` or every core). Raises
    :class:`KernelUnsupported` for what :func:`supports` refuses.
    """
    if not supports(a, b):
        raise KernelUnsupported(
            f"numba matmul: {a.dtype} {a.shape} @ {b.dtype} {b.shape} is not supported"
        )
    dtype = a.dtype
    nr = NR[dtype]
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a_of = _batch_map(a.shape[:-2], batch)
    b_of = _batch_map(b.shape[:-2], batch)
    a3 = _batched_rows(a, m, k)
    b3 = b.reshape(-1, k, n)
    bp = _scratch("b", (b3.shape[0], -(-n // nr), k, nr), dtype)
    return _multiply(a3, bp, (_pack, [b3, bp]), (*batch, m, n), a_of, b_of, threads, empty)


def _batched_rows(a: np.ndarray, m: int, k: int) -> np.ndarray:
    """``a`` as ``[batch, m, k]``, C-contiguous, writable and aligned (copied into scratch
    where it is not): the tile kernel has one compiled signature (~5-10 s each), and
    read-only or unaligned arrays are types of their own to numba."""
    a3 = a.reshape(-1, m, k)
    if not (a3.flags.c_contiguous and a3.flags.writeable and a3.flags.aligned):
        a3 = _scratch("a", a3.shape, a.dtype)
        np.copyto(a3, a.reshape(-1, m, k))
    return a3


def _multiply(a3: np.ndarray, bp: np.ndarray, pack: tuple, shape: tuple[int, ...],
              a_of: np.ndarray, b_of: np.ndarray, threads: int | None,
              empty: Callable) -> np.ndarray:  # fmt: skip
    """Runs ``pack`` (a kernel filling the column panels ``bp``, and its arguments) and the
    tile kernel over ``a3``; returns the output of ``shape``."""
    from ember.backends.fusion.numba_runtime import _run_parts, parts_for

    dtype = a3.dtype
    m, k, n, nr = shape[-2], a3.shape[2], shape[-1], bp.shape[3]
    out = empty(shape, dtype)
    parts = parts_for(a_of.size * m * n * k, PARALLEL_MIN_MACS, threads)
    tiles = _tile_kernel(dtype)
    _run_parts(pack[0], pack[1], parts)
    if parts == 1:
        _run_parts(tiles, [a3, bp, out.reshape(-1, m, n), a_of, b_of, np.empty((MR, nr), dtype)],
                   1)  # fmt: skip
    else:
        _run_parts(_tiles_with_own_edge, [tiles, a3, bp, out.reshape(-1, m, n), a_of, b_of],
                   parts)  # fmt: skip
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
    nr = NR[a.dtype]
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
    a3 = _batched_rows(a, m, k)
    bp = _scratch("b", (1, -(-n // nr), k, nr), a.dtype)
    a_of = np.arange(a3.shape[0], dtype=np.int64)
    b_of = np.zeros(a3.shape[0], dtype=np.int64)
    pack = (_pack_dequantized, [values, scales, zero_points, bp])
    return _multiply(a3, bp, pack, (*a.shape[:-1], n), a_of, b_of, threads, empty)


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


def _tiles_with_own_edge(tiles, a, bp, out, a_of, b_of, part, parts) -> None:
    """Runs part ``part`` of the tile kernel with a scratch edge tile of its own."""
    tiles(a, bp, out, a_of, b_of, np.empty((MR, bp.shape[3]), out.dtype), part, parts)


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
