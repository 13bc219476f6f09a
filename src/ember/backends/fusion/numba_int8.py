"""int8 x int8 -> int32 matrix products as numba kernels, on AVX-512 VNNI.

:func:`matmul_int8` returns the exact int32 products ``a @ b`` of an int8 ``a`` ``[..., M,
K]`` and an int8 weight ``b`` ``[K, N]``; :func:`linear_int8` the scaled float32 result of a
quantized linear layer, ``a_scale * b_scales * ((a - a_zero_point) @ b) + bias``. The weight
is packed once by :func:`pack_weight` (the caller keeps the :class:`PackedWeight`).

* **The instruction.** ``vpdpbusd`` multiplies 64 unsigned bytes by 64 signed bytes and
  adds each group of 4 products into one of 16 int32 lanes: 64 multiply-adds an
  instruction, 4 times float32's FMA. Its left operand is unsigned, so ``a`` is fed as
  ``a + 128`` (the sign bit flipped: a byte ``u = a ^ 0x80``) and the extra ``128 * b``,
  with the zero point, is taken back through the weight's column sums:
  ``sum_k (a - zp) * b = sum_k (a + 128) * b - (zp + 128) * colsum(b)``. The accumulators
  start at ``-(zp + 128) * colsum(b)`` (per column), so the sums the instruction leaves are
  the result. All of it is int32 arithmetic modulo 2**32 (``vpdpbusd`` wraps, it does not
  saturate), exact wherever the true result fits int32: ``|a - zp| <= 255`` and ``|b| <=
  128``, so any ``K <= MAX_K`` (65793).
* **Packing.** The weight becomes column panels of :data:`NR` (64) columns, ``[K / 4, NR,
  4]`` each: per group of 4 consecutive ``k``, the 4 bytes of each column side by side, so
  one 64-byte load is the right operand of one instruction for 16 columns. ``K`` is padded
  to a multiple of 4 and ``N`` to whole panels with zero bytes (a zero weight adds nothing
  whatever ``a`` holds there). ``a`` is copied per call into rows of ``K / 4`` groups of 4
  unsigned bytes (``a ^ 0x80``), which also takes any strides.
* **Register tile.** :func:`_tile_kernel` writes the inner loop as LLVM IR (numba has no
  vector types; as ``numba_tile``): a tile of ``mr`` rows by ``NR`` columns keeps its ``mr
  * 4`` accumulators in vector registers for the whole sum over ``K`` (or a block of
  ``K``, below); per group of 4
  ``k`` it loads 4 vectors of the panel, broadcasts 4 bytes of each row and issues ``mr *
  4`` ``vpdpbusd``. The tile's store is the epilogue: the int32 sums as they are, or
  converted to float32, times the column's and the row's scales, plus the bias. A tile
  at the last panel, where the panel runs past ``N``, is stored through a scratch tile.
* **Tasks.** A task is one column panel and a run of :data:`ROW_BLOCKS_PER_TASK` row
  blocks (the panel stays in cache while the rows stream past). A ``K`` longer than
  :data:`K_BLOCK_GROUPS` groups is summed in even blocks: each row block sums the panel's
  slice of one block (in L2 cache) and carries its partial sums, in scratch, to the next
  (measured: 1.1-1.3x faster for ``K`` of 16384-32768). The tasks are split in ``parts``
  as ``numba_gemm`` does (``numba_runtime._run_parts``); each output is computed by the
  same instructions whatever the split, so any thread count gives the same bits. A single
  row (batch-1 inference) reads the weight once, each panel by one task.

Measured (Zen 5, one thread, thread time, busy machine; ``benchmarks/bench_int8_kernels.py``,
int8 multiply-adds counted as 2 operations): ``[64, 4096] @ [4096, 4096]`` in 2.5 ms (860
GOP/s), 6x the float32 ``numba_gemm`` and 1.6x ``torch._int_mm``; the transformer encoder's
``[1024, 256] @ [256, 1024]`` in 0.59 ms (920 GOP/s), 3.7x ``numba_gemm`` and 0.95x
``torch._int_mm`` (which stores its int32 sums unscaled; :func:`matmul_int8` 1.0x); batch 1,
``[1, 4096] @ [4096, 4096]``, in 0.5 ms from a cold cache (0.2 ms with the 16 MB weight in
L3), 12x ``numba_gemm`` (which packs the whole weight each call) and 3.7x ``torch._int_mm``.
With its operands in cache the tile runs at about 1000 GOP/s: two ``vpdpbusd`` a cycle (6-row
tiles measured no faster).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ember.backend.errors import ArgumentError, DTypeError, ShapeError, fmt_shape
from ember.backends.fusion.numba_gemm import _scratch
from ember.backends.fusion.numba_runtime import _run_parts, parts_for
from ember.backends.fusion.numba_source import KernelUnsupported

try:  # numba is optional: supports() is False without it
    import numba
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["MAX_K", "NR", "KernelUnsupported", "PackedWeight", "has_vnni", "linear_int8",
           "matmul_int8", "pack_weight", "supports"]

NR = 64
"""Columns of a weight panel and of a register tile: four vectors of 16 int32 sums."""
VECTORS = NR // 16
MR = 4
"""Rows of a register tile (4 x 4 accumulators; a tile of fewer rows covers the last rows)."""
ROW_BLOCKS_PER_TASK = 16
"""Row blocks a task runs against one column panel (64 rows)."""
K_BLOCK_GROUPS = 1024
"""Groups of 4 ``k`` a task sums over before its next row block at most (4096 ``k``): a
panel's slice of 256 KB that stays in L2 cache while the task's rows pass it (a whole panel
of a longer ``K`` would not)."""
MAX_K = (2**31 - 1) // (255 * 128)
"""The longest sum that is exact in int32 for any values and zero point (65793)."""
PARALLEL_MIN_MACS = 1 << 24
"""Products of fewer multiply-adds than this run on one thread (as ``numba_gemm``)."""


@functools.cache
def has_vnni() -> bool:
    """Whether numba compiles for a CPU with AVX-512 VNNI: the host's features, as LLVM
    reports them, when numba targets the host (its default)."""
    if numba is None:
        return False
    if numba.config.CPU_NAME not in (None, "host"):
        return False  # a fixed target (NUMBA_CPU_NAME) may lack the instruction
    from ember.backends.fusion.numba_target import host_features

    features = host_features()
    return bool(features.get("avx512vnni", False) and features.get("avx512bw", False))


def _supports_shape(a: np.ndarray, k: int, n: int) -> bool:
    return (has_vnni() and type(a) is np.ndarray and a.dtype == np.int8 and a.ndim >= 2
            and a.shape[-1] == k and 0 not in a.shape and n > 0 and 0 < k <= MAX_K)  # fmt: skip


def supports(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether :func:`matmul_int8` / :func:`linear_int8` take ``a`` by the weight ``b``:
    numba present on a host with AVX-512 VNNI, ``a`` int8 ``[..., M, K]`` (any leading
    dims, read as ``M`` rows each), ``b`` int8 ``[K, N]``, no empty dim, and ``K <=``
    :data:`MAX_K` (longer sums may overflow int32)."""
    return (type(b) is np.ndarray and b.dtype == np.int8 and b.ndim == 2
            and _supports_shape(a, b.shape[0], b.shape[1]))  # fmt: skip


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """An int8 weight ``[k, n]`` in the layout the kernels read (see the module doc).

    ``panels`` is int8 ``[ceil(n / NR), ceil(k / 4), NR, 4]`` and ``padded_sums`` int32
    ``[ceil(n / NR) * NR]``, the weight's column sums; both zero padded and read-only."""

    panels: np.ndarray
    padded_sums: np.ndarray
    k: int
    n: int

    def __post_init__(self) -> None:
        # The kernels index these arrays unchecked: one built by hand must fit exactly.
        panels, groups = -(-self.n // NR), -(-self.k // 4)
        fits = (isinstance(self.k, int) and isinstance(self.n, int) and 0 < self.k <= MAX_K
                and self.n > 0 and _is_c_array(self.panels, np.int8, (panels, groups, NR, 4))
                and _is_c_array(self.padded_sums, np.int32, (panels * NR,)))  # fmt: skip
        if not fits:
            raise ShapeError(
                f"numba int8: a PackedWeight of k={self.k!r}, n={self.n!r} needs int8 panels "
                f"[{panels}, {groups}, {NR}, 4] and int32 sums [{panels * NR}] (C-contiguous; "
                "made by pack_weight)"
            )

    @property
    def col_sums(self) -> np.ndarray:
        """The weight's column sums, int32 ``[n]``."""
        return self.padded_sums[: self.n]

    @property
    def groups(self) -> int:
        """Groups of 4 ``k`` of each panel."""
        return self.panels.shape[1]


def _is_c_array(x, dtype, shape: tuple[int, ...]) -> bool:
    return (type(x) is np.ndarray and x.dtype == dtype and x.shape == shape
            and x.flags.c_contiguous)  # fmt: skip


def pack_weight(b: np.ndarray) -> PackedWeight:
    """Packs the int8 weight ``b`` ``[K, N]`` (any strides) for :func:`matmul_int8` and
    :func:`linear_int8`; a pure function of ``b``'s values. Raises
    :class:`KernelUnsupported` for a weight :func:`supports` would refuse."""
    if not (type(b) is np.ndarray and b.dtype == np.int8 and b.ndim == 2 and 0 not in b.shape
            and b.shape[0] <= MAX_K):  # fmt: skip
        raise KernelUnsupported(
            f"numba int8: a weight must be int8 [K, N] with 0 < K <= {MAX_K}, got "
            f"{getattr(b, 'dtype', type(b).__name__)} {fmt_shape(getattr(b, 'shape', ()))}"
        )
    k, n = b.shape
    groups, panels = -(-k // 4), -(-n // NR)
    padded = np.zeros((groups * 4, panels * NR), np.int8)
    padded[:k, :n] = b
    # [g, 4, p, NR] -> [p, g, NR, 4]: per panel and group, each column's 4 bytes together.
    data = np.ascontiguousarray(padded.reshape(groups, 4, panels, NR).transpose(2, 0, 3, 1))
    sums = np.zeros(panels * NR, np.int32)
    sums[:n] = b.sum(axis=0, dtype=np.int64)  # |sum| <= 128 * MAX_K: fits int32
    data.flags.writeable = False
    sums.flags.writeable = False
    return PackedWeight(data, sums, k, n)


def matmul_int8(a: np.ndarray, packed: PackedWeight, threads: int | None = None,
                empty: Callable = np.empty) -> np.ndarray:  # fmt: skip
    """The exact products ``a @ b`` (int32 ``[..., M, N]``, made by ``empty(shape, dtype)``)
    of int8 ``a`` ``[..., M, K]`` (any strides) and the weight packed in ``packed``. Every
    value is exact (see :data:`MAX_K`). ``threads`` as ``numba_gemm.matmul``."""
    rows, ap, lda = _prepare(a, packed)
    out = _output(empty, (*a.shape[:-1], packed.n), np.int32)
    parts = _parts(rows, packed, threads)
    _run([ap, lda, rows, packed.panels.reshape(-1), packed.groups, packed.padded_sums,
          _shift(0), _UNUSED, _UNUSED, _UNUSED, out.reshape(rows, packed.n)], parts)  # fmt: skip
    return out


def linear_int8(a: np.ndarray, a_scale: np.ndarray, a_zero_point: int | np.ndarray,
                packed: PackedWeight, b_scales: np.ndarray, bias: np.ndarray | None,
                threads: int | None = None, empty: Callable = np.empty) -> np.ndarray:  # fmt: skip
    """A quantized linear layer: float32 ``[..., M, N]`` (made by ``empty``) with
    ``out[m, n] = a_scale[m] * b_scales[n] * sum_k (a[m, k] - a_zero_point) * b[k, n]
    (+ bias[n])``, the sum exact in int32 and the rest in float32.

    ``a`` is int8 ``[..., M, K]`` (any strides; its rows numbered through the leading dims);
    ``a_scale`` float32, one (shape ``()`` or ``[1]``) or one per row (``rows`` values: shape
    ``[rows]`` or ``a``'s shape without ``K``); ``a_zero_point`` an int in ``[-128, 127]``
    (or a 0-d integer array); ``b_scales`` float32 of shape ``()``, ``[1]`` or ``[N]``
    (symmetric weight: no weight zero point); ``bias`` float32 ``[N]`` or None.
    """
    rows, ap, lda = _prepare(a, packed)
    n = packed.n
    row_scales = _scales(a_scale, rows, "a_scale", a.shape[:-1])
    zero_point = _zero_point(a_zero_point)
    panels_n = packed.panels.shape[0] * NR
    col_scales = np.zeros(panels_n, np.float32)
    col_scales[:n] = _scales(b_scales, n, "b_scales", (n,))
    col_bias = np.zeros(panels_n, np.float32)
    if bias is not None:
        bias = np.asarray(bias)
        if bias.shape != (n,) or bias.dtype != np.float32:
            error = ShapeError if bias.dtype == np.float32 else DTypeError
            raise error(f"numba int8: bias must be float32 [{n}], got {bias.dtype} "
                        f"{fmt_shape(bias.shape)}")  # fmt: skip
        col_bias[:n] = bias
    out = _output(empty, (*a.shape[:-1], n), np.float32)
    parts = _parts(rows, packed, threads)
    _run([ap, lda, rows, packed.panels.reshape(-1), packed.groups, packed.padded_sums,
          _shift(zero_point), row_scales, col_scales, col_bias, out.reshape(rows, n)],
         parts)  # fmt: skip
    return out


# ---------------------------------------------------------------------- argument handling
def _prepare(a: np.ndarray, packed: PackedWeight) -> tuple[int, np.ndarray, int]:
    """Checks ``a`` against the weight; returns its row count and its rows as unsigned
    bytes (``a ^ 0x80``), flat in scratch, ``lda`` bytes apart (``K`` rounded up to 4)."""
    if not isinstance(packed, PackedWeight):
        raise KernelUnsupported(f"numba int8: the weight must be a PackedWeight (from "
                                f"pack_weight), got {type(packed).__name__}")  # fmt: skip
    if not _supports_shape(a, packed.k, packed.n):
        raise KernelUnsupported(
            f"numba int8: {getattr(a, 'dtype', type(a).__name__)} "
            f"{fmt_shape(getattr(a, 'shape', ()))} by int8 [{packed.k}, {packed.n}] is not "
            "supported (int8 [..., M, K] on a host with AVX-512 VNNI)"
        )
    k = packed.k
    rows = math.prod(a.shape[:-1])
    lda = packed.groups * 4
    ap = _scratch("int8_rows", (rows, lda), np.dtype(np.uint8))
    # The sign bit flipped: a + 128 as an unsigned byte. The padding columns meet zero
    # weights; they are set only so that no stale byte is ever read.
    rows_view = ap.reshape(*a.shape[:-1], lda)[..., :k]  # a view: ap is contiguous
    np.bitwise_xor(a.view(np.uint8), np.uint8(0x80), out=rows_view)
    if lda > k:
        ap[:, k:] = 0x80
    return rows, ap.reshape(-1), lda


def _output(empty: Callable, shape: tuple[int, ...], dtype) -> np.ndarray:
    """``empty(shape, dtype)``, checked: the kernel writes it as flat C-contiguous memory."""
    out = empty(shape, dtype)
    if not (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.c_contiguous and out.flags.writeable):  # fmt: skip
        raise ShapeError(f"numba int8: empty() must give a writable C-contiguous {np.dtype(dtype)} "
                         f"array of shape {fmt_shape(shape)}")  # fmt: skip
    return out


def _scales(value, count: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as ``count`` contiguous float32 scales: one broadcast, or ``count`` of them
    (1-d, or of ``shape``)."""
    value = np.asarray(value)
    if value.dtype != np.float32:
        raise DTypeError(f"numba int8: {name} must be float32, got {value.dtype}")
    if value.size == 1 and value.ndim <= 1:
        return np.full(count, value.reshape(()), np.float32)
    if value.shape in ((count,), tuple(shape)):
        return np.ascontiguousarray(value.reshape(count))
    raise ShapeError(f"numba int8: {name} must have shape [] or [1] or {fmt_shape((count,))}, "
                     f"got {fmt_shape(value.shape)}")  # fmt: skip


def _zero_point(value) -> int:
    if isinstance(value, np.ndarray):
        if value.ndim != 0 or value.dtype.kind not in "iu":
            raise ArgumentError(f"numba int8: a_zero_point must be an int or a 0-d integer "
                                f"array, got {value.dtype} {fmt_shape(value.shape)}")  # fmt: skip
        value = int(value)
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"numba int8: a_zero_point must be an int, got {value!r}")
    if not -128 <= value <= 127:
        raise ArgumentError(f"numba int8: a_zero_point must be in [-128, 127], got {value}")
    return int(value)


def _shift(zero_point: int) -> int:
    """The factor of the column sums that the accumulators start from (see the module doc):
    they start at ``shift * colsum``, multiplied in int32 (exact modulo 2**32)."""
    return -(zero_point + 128)


def _parts(rows: int, packed: PackedWeight, threads: int | None) -> int:
    return parts_for(rows * packed.n * packed.k, PARALLEL_MIN_MACS, threads)


_UNUSED = np.zeros(0, np.float32)  # the scales and bias of int32 products: never read


def _run(args: list, parts: int) -> None:
    """Runs :func:`_products` on ``args`` in ``parts`` parts."""
    if parts == 1:
        _products(*args, 0, 1)
    else:
        _run_parts(_products, args, parts)


# ---------------------------------------------------------------------- the register tile
_TILE_ARGS = ("ap", "a0", "lda", "bp", "b0", "g0", "g1", "sums", "shift", "j0", "carry", "c0",
              "first", "last", "rscale", "r0", "cscale", "bias", "out", "o0", "ldo")  # fmt: skip
_TILE_ARRAYS = {"ap": types.uint8, "bp": types.int8, "sums": types.int32, "carry": types.int32,
                "rscale": types.float32, "cscale": types.float32, "bias": types.float32,
                "out": None} if numba is not None else {}  # fmt: skip


@functools.cache
def _tile_kernel(mr: int):
    """The intrinsic of an ``mr`` x :data:`NR` tile (see the module doc):

    ``tile(ap, a0, lda, bp, b0, g0, g1, sums, shift, j0, carry, c0, first, last, rscale, r0,
    cscale, bias, out, o0, ldo)`` sums over the groups ``g0 <= g < g1`` of 4 ``k``: row
    ``r`` reads the bytes ``ap[a0 + r * lda + 4 g ...]``, the panel's group ``g`` is
    ``bp[b0 + g * 4 NR ...]``. The sums start at ``shift * sums[j0:j0 + NR]`` (int32
    products) where ``first`` is true, else at the partial sums ``carry[c0 + r * NR ...]``
    of the groups before ``g0``. Where ``last`` is false they are stored back there; where it
    is true they are stored at ``out[o0 + r * ldo + j]``: as they are for an int32 ``out``,
    for a float32 one times ``cscale[j0 + j] * rscale[r0 + r]`` plus ``bias[j0 + j]`` (the
    scales and bias are not read for an int32 ``out``). Nothing is bounds-checked: the caller
    keeps every index in its array."""

    @intrinsic
    def tile(typingctx, ap, a0, lda, bp, b0, g0, g1, sums, shift, j0, carry, c0, first, last,
             rscale, r0, cscale, bias, out, o0, ldo):  # fmt: skip
        args = dict(zip(_TILE_ARGS, (ap, a0, lda, bp, b0, g0, g1, sums, shift, j0, carry, c0,
                                     first, last, rscale, r0, cscale, bias, out, o0, ldo)))  # fmt: skip
        for name, dtype in _TILE_ARRAYS.items():
            x = args[name]
            if not (isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C"):
                return None
            if dtype is not None and x.dtype != dtype:
                return None
        if out.dtype not in (types.int32, types.float32):
            return None
        sig = types.void(*(args[name] if name in _TILE_ARRAYS else types.int64
                           for name in _TILE_ARGS))  # fmt: skip
        return sig, functools.partial(_tile_codegen, mr, out.dtype == types.float32)

    return tile


def _tile_codegen(mr: int, floats: bool, context, builder, signature, values) -> None:
    """Emits the LLVM IR of :func:`_tile_kernel`'s tile (``floats``: a float32 ``out``)."""
    e = _Emitter(context, builder, signature, values)
    i8, i32, vi32 = e.i8, e.i32, e.vi32
    ap, bp, sums, carry = e.data("ap"), e.data("bp"), e.data("sums"), e.data("carry")
    a0, lda, b0, j0, c0 = e.value("a0"), e.value("lda"), e.value("b0"), e.value("j0"), e.value("c0")
    g0, g1 = e.value("g0"), e.value("g1")
    first = builder.icmp_signed("!=", e.value("first"), e.const(0))
    last = builder.icmp_signed("!=", e.value("last"), e.const(0))
    # The pre-LLVM-21 signature (i32 vectors); newer LLVM upgrades it to its i8 vectors.
    dot = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", (),
                                           ir.FunctionType(vi32, [vi32] * 3))  # fmt: skip

    # The sums' start: shift * column sums, or the partial sums carried from the last block
    # (carry is the caller's scratch: loading it where ``first`` is true is harmless).
    shift = e.splat(builder.trunc(e.value("shift"), i32), vi32)
    fresh = [builder.mul(e.load(sums, i32, e.add(j0, 16 * v), vi32), shift)
             for v in range(VECTORS)]  # fmt: skip
    carried = [e.add(c0, r * NR) for r in range(mr)]
    starts = [[builder.select(first, fresh[v], e.load(carry, i32, e.add(carried[r], 16 * v),
                                                      vi32)) for v in range(VECTORS)]
              for r in range(mr)]  # fmt: skip

    # The loop over groups of 4 k: every sum an SSA value (a register) throughout.
    entry = builder.block
    loop = builder.append_basic_block("tile.loop")
    done = builder.append_basic_block("tile.done")
    builder.cbranch(builder.icmp_signed("<", g0, g1), loop, done)
    builder.position_at_end(loop)
    g = builder.phi(e.i64, "g")
    g.add_incoming(g0, entry)
    accs = [[builder.phi(vi32, f"acc{r}_{v}") for v in range(VECTORS)] for r in range(mr)]
    for r in range(mr):
        for v in range(VECTORS):
            accs[r][v].add_incoming(starts[r][v], entry)
    panel = builder.add(b0, builder.mul(g, e.const(4 * NR)))
    weights = [e.load(bp, i8, e.add(panel, 64 * v), vi32) for v in range(VECTORS)]
    four = builder.mul(g, e.const(4))
    summed = []
    for r in range(mr):
        row = builder.add(builder.add(a0, builder.mul(lda, e.const(r))), four)
        x = e.splat(builder.load(builder.bitcast(e.at(ap, i8, row), i32.as_pointer()), align=1,
                                 typ=i32), vi32)  # fmt: skip
        summed.append([builder.call(dot, [accs[r][v], x, weights[v]]) for v in range(VECTORS)])
    g_next = builder.add(g, e.const(1))
    body_end = builder.block
    g.add_incoming(g_next, body_end)
    for r in range(mr):
        for v in range(VECTORS):
            accs[r][v].add_incoming(summed[r][v], body_end)
    builder.cbranch(builder.icmp_signed("<", g_next, g1), loop, done)

    builder.position_at_end(done)
    finals = [[builder.phi(vi32) for _ in range(VECTORS)] for _ in range(mr)]
    for r in range(mr):
        for v in range(VECTORS):
            finals[r][v].add_incoming(starts[r][v], entry)
            finals[r][v].add_incoming(summed[r][v], body_end)
    with builder.if_else(last) as (to_out, to_carry):
        with to_out:
            _store_tile(e, finals, floats)
        with to_carry:
            for r in range(mr):
                for v in range(VECTORS):
                    e.store(finals[r][v], carry, i32, e.add(carried[r], 16 * v))


def _store_tile(e: _Emitter, finals: list, floats: bool) -> None:
    """The tile's epilogue: its sums into ``out``, as int32 or scaled to float32."""
    builder, f32 = e.builder, e.f32
    out, o0, ldo, j0 = e.data("out"), e.value("o0"), e.value("ldo"), e.value("j0")
    if floats:
        rscale, cscale, bias, r0 = e.data("rscale"), e.data("cscale"), e.data("bias"), e.value("r0")
        col_scales = [e.load(cscale, f32, e.add(j0, 16 * v), e.vf32) for v in range(VECTORS)]
        biases = [e.load(bias, f32, e.add(j0, 16 * v), e.vf32) for v in range(VECTORS)]
    for r, row in enumerate(finals):
        base = builder.add(o0, builder.mul(ldo, e.const(r)))
        if floats:
            row_scale = e.splat(builder.load(e.at(rscale, f32, e.add(r0, r)), typ=f32), e.vf32)
        for v, result in enumerate(row):
            if floats:
                # Column scale, then row scale, then the bias: in float32, as documented.
                scaled = builder.fmul(builder.sitofp(result, e.vf32), col_scales[v])
                result = builder.fadd(builder.fmul(scaled, row_scale), biases[v])
            e.store(result, out, f32 if floats else e.i32, e.add(base, 16 * v))


class _Emitter:
    """The codegen's vocabulary: the tile's arguments by name, and the loads, stores and
    broadcasts of 16-lane vectors it is written in."""

    def __init__(self, context, builder, signature, values) -> None:
        self.context, self.builder, self.signature, self.values = (context, builder, signature,
                                                                   values)  # fmt: skip
        self.i8, self.i32, self.i64, self.f32 = (ir.IntType(8), ir.IntType(32), ir.IntType(64),
                                                 ir.FloatType())  # fmt: skip
        self.vi32, self.vf32 = ir.VectorType(self.i32, 16), ir.VectorType(self.f32, 16)
        self._index = {name: i for i, name in enumerate(_TILE_ARGS)}

    def value(self, name: str):
        return self.values[self._index[name]]

    def data(self, name: str):
        """The data pointer of the array argument ``name``."""
        ty = self.signature.args[self._index[name]]
        return self.context.make_array(ty)(self.context, self.builder, self.value(name)).data

    def const(self, number: int):
        return ir.Constant(self.i64, number)

    def add(self, offset, number: int):
        return self.builder.add(offset, self.const(number))

    def at(self, pointer, etype, offset):
        return self.builder.gep(pointer, [offset], inbounds=True, source_etype=etype)

    def load(self, pointer, etype, offset, vty):
        """The vector of type ``vty`` at element ``offset`` of ``pointer`` (any alignment)."""
        p = self.builder.bitcast(self.at(pointer, etype, offset), vty.as_pointer())
        return self.builder.load(p, align=1, typ=vty)

    def store(self, vector, pointer, etype, offset) -> None:
        p = self.builder.bitcast(self.at(pointer, etype, offset), vector.type.as_pointer())
        self.builder.store(vector, p, align=1)

    def splat(self, scalar, vty):
        """``scalar`` in every lane of a ``vty``."""
        one = self.builder.insert_element(ir.Constant(vty, ir.Undefined), scalar,
                                          ir.Constant(self.i32, 0))  # fmt: skip
        return self.builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                           ir.Constant(ir.VectorType(self.i32, 16), None))  # fmt: skip


def _jit(fn):
    if numba is None:  # pragma: no cover - exercised where numba is missing
        return fn
    return numba.njit(nogil=True, cache=True, error_model="numpy")(fn)


if numba is not None:
    _tile4, _tile2, _tile1 = (_tile_kernel(mr) for mr in (4, 2, 1))


@_jit
def _products(ap, lda, m, bp, groups, sums, shift, rscale, cscale, bias, out, part,
              parts):  # pragma: no cover - runs compiled  # fmt: skip
    """``out`` (``[m, n]``, int32 or float32) for the tasks of slice ``part`` of ``parts``
    (see the module doc): per task, the K blocks in turn, and in each the task's row blocks
    against the panel's slice of the block, their partial sums carried in scratch."""
    n = out.shape[1]
    panels = sums.size // NR
    row_blocks = (m + MR - 1) // MR
    chunks = (row_blocks + ROW_BLOCKS_PER_TASK - 1) // ROW_BLOCKS_PER_TASK
    tasks = panels * chunks
    k_blocks = (groups + K_BLOCK_GROUPS - 1) // K_BLOCK_GROUPS
    flat = out.reshape(-1)
    edge = np.empty((MR, NR), out.dtype)  # the tiles of the last panel, when it runs past n
    edge_flat = edge.reshape(-1)
    carry = np.empty(ROW_BLOCKS_PER_TASK * MR * NR, np.int32)
    for task in range(tasks * part // parts, tasks * (part + 1) // parts):
        jp = task // chunks
        chunk = task % chunks
        j0 = jp * NR
        b0 = jp * groups * 4 * NR
        whole = j0 + NR <= n
        first_block = chunk * ROW_BLOCKS_PER_TASK
        end_block = min(row_blocks, (chunk + 1) * ROW_BLOCKS_PER_TASK)
        for kb in range(k_blocks):
            # Even blocks: groups * kb // k_blocks, never a short last one.
            g0 = groups * kb // k_blocks
            g1 = groups * (kb + 1) // k_blocks
            first = kb == 0
            last = kb == k_blocks - 1
            for ib in range(first_block, end_block):
                i0 = ib * MR
                count = min(MR, m - i0)
                dst, o0, ldo = (flat, i0 * n + j0, n) if whole else (edge_flat, 0, NR)
                c0 = (ib - first_block) * MR * NR
                r = 0
                while r < count:
                    a0 = (i0 + r) * lda
                    if count - r >= 4:
                        _tile4(ap, a0, lda, bp, b0, g0, g1, sums, shift, j0, carry, c0 + r * NR,
                               first, last, rscale, i0 + r, cscale, bias, dst, o0 + r * ldo,
                               ldo)  # fmt: skip
                        r += 4
                    elif count - r >= 2:
                        _tile2(ap, a0, lda, bp, b0, g0, g1, sums, shift, j0, carry, c0 + r * NR,
                               first, last, rscale, i0 + r, cscale, bias, dst, o0 + r * ldo,
                               ldo)  # fmt: skip
                        r += 2
                    else:
                        _tile1(ap, a0, lda, bp, b0, g0, g1, sums, shift, j0, carry, c0 + r * NR,
                               first, last, rscale, i0 + r, cscale, bias, dst, o0 + r * ldo,
                               ldo)  # fmt: skip
                        r += 1
                if last and not whole:
                    for rr in range(count):
                        for j in range(n - j0):
                            out[i0 + rr, j0 + j] = edge[rr, j]
