"""A register-blocked multiply-add tile for numba kernels, written as LLVM IR.

numba vectorizes only innermost loops, so a kernel written in Python keeps its
accumulators in memory: every pass over the taps of a convolution loads and stores them
again. :func:`tile_kernel` builds an intrinsic whose accumulators are SSA values (vector
registers) for the whole loop over the taps, and which touches memory only to load its
operands and, once at the end, to store the sums:

``acc[a0 + o * stride + i] = sum over t < taps of wt[wstart + t * ob + o] * xq[offs[t] + q0 + i]``

for ``o < ob`` output channels and ``i < span = nv * lanes`` positions, where ``lanes``
is the number of elements of a :data:`VECTOR_BYTES` vector of the arrays' dtype (with
AVX-512: 16 float32, 8 float64). Per tap it loads ``nv`` vectors of positions and ``ob``
weights (each broadcast to a vector) and does ``ob * nv`` fused multiply-adds; with
``ob * nv`` about 24 the accumulators, the loaded positions and a weight fill the 32
vector registers of AVX-512 (without it, vectors are AVX2's 32 bytes and the caller
takes a smaller tile).

The arrays must be 1-d and C-contiguous (numba's ``A`` layout is refused); nothing is
bounds-checked: the caller guarantees ``offs[t] + q0 + span <= xq.size`` and the sizes of
``wt`` and ``acc`` (``a0 + (ob - 1) * stride + span <= acc.size``). Sums are fused
multiply-adds in tap order (each lane a sequential sum).

numba's disk cache (``cache=True``) keys a kernel by its own source file only, so the
kernels that use the tile would keep their old machine code after a change here:
``numba_conv.TILE_SOURCE_SHA256`` names this file's digest, and a test fails until it is
updated (which edits ``numba_conv.py`` and so renews their cache).

:func:`transpose_kernel` is the copy that feeds the tile: it writes a block of rows as
columns (a strip of a matrix product's left operand, packed so that each step of ``K``
reads its ``ob`` values side by side), with vector loads, a network of shuffles and vector
stores, where a loop of scalars spent most of its time on one element at a time;
:func:`vector_copy` moves one vector where a short copy is all a packing loop does.
"""

from __future__ import annotations

from functools import cache

from ember.backends.fusion.numba_target import CACHE_LINE_BYTES, vector_bytes

try:  # numba is optional: the kernels that use the tile check numba first
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from ember.backends.fusion.numba_math import prefetch_line
except ImportError:  # pragma: no cover - exercised where numba is missing
    intrinsic = None

__all__ = ["VECTOR_BYTES", "lanes", "tile_kernel", "transpose_kernel", "vector_copy"]


VECTOR_BYTES = vector_bytes()
"""Bytes of one accumulator vector: an AVX-512 register where the host has one and LLVM
may use it (``numba_target.vector_bytes``)."""


def lanes(itemsize: int) -> int:
    """Elements of ``itemsize`` bytes in one vector."""
    return VECTOR_BYTES // itemsize


def _flat(array) -> bool:
    """Whether a numba type is a 1-d C-contiguous array (what the intrinsics index)."""
    return isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"


def _float_arrays(*arrays) -> bool:
    """Whether numba types are 1-d C-contiguous arrays of one float dtype."""
    return (all(_flat(a) for a in arrays) and len({a.dtype for a in arrays}) == 1
            and arrays[0].dtype in (types.float32, types.float64))  # fmt: skip


def _data(context, builder, array_type, value):
    """The data pointer of an array argument."""
    return context.make_array(array_type)(context, builder, value).data


@cache
def tile_kernel(ob: int, nv: int, accumulating: bool = False, strided: bool = False,
                prefetch: int = 0, spread: bool = False, epilogue: bool = False,
                biased: bool = False):  # fmt: skip
    """The intrinsic ``tile(xq, offs, wt, wstart, q0, taps, acc, a0, stride)`` for ``ob`` output
    channels by ``nv`` vectors of positions (see the module doc). Two variants serve a
    matrix product's packed panels (``numba_gemm``): ``strided`` takes for ``offs`` an int64
    step, tap ``t`` reading ``xq`` from ``t * offs + q0`` (no load per tap), and
    ``accumulating`` adds a last argument ``add`` (a bool): where true, the sums start from
    ``acc``'s values instead of zero (a product's later blocks of ``K`` add to the earlier
    ones'). ``biased`` (accumulating only) adds three arguments after ``add``: ``bias``
    (an array of ``xq``'s dtype), ``bias_at`` and ``use_bias``; where ``add`` is false and
    ``use_bias`` true, every row's sums start from the vectors ``bias[bias_at + v * lanes
    ...]`` (a product's bias by columns: no rows of it to store and load back).
    ``prefetch`` (strided only) asks for the cache lines of ``xq`` that tap ``t +
    prefetch`` reads at each tap ``t`` (a hint: a line past the array is never loaded).
    ``spread`` (neither of those) places each vector at a position of its own: ``nv - 1``
    more int64 arguments ``q1 ...`` after ``stride``, vector ``v`` covering positions
    ``q_v .. q_v + lanes - 1`` and stored at ``a0 + o * stride + q_v - q0`` (a convolution's
    rows without the padding column between them). ``epilogue`` (spread loads, ``nv - 1``
    of them meaningful) stores finished outputs instead of sums, its vectors side by side
    (``a0 + o * stride + v * lanes``): ``clamp(clamp(sum + bias[oc0 + o], lo1, hi1) + res,
    lo2, hi2)``, each step rounded as the op alone, ``bounds = [lo1, hi1, lo2, hi2]`` and
    ``res`` read where the output goes, only where ``has_res``; the arguments after
    ``stride`` are always ``q1, q2, bias, oc0, bounds, res, has_res``."""
    if intrinsic is None:  # pragma: no cover - exercised where numba is missing
        raise ImportError("numba is not installed")
    if prefetch and not strided:
        raise ValueError("tile_kernel: prefetch needs the strided variant")
    if biased and not accumulating:
        raise ValueError("tile_kernel: a bias start needs the accumulating variant")
    if (spread or epilogue) and (strided or accumulating or nv > 3):
        raise ValueError("tile_kernel: spread vectors are for the plain variant, 3 at most")

    def signature_of(xq, offs, wt, acc):
        if not _float_arrays(xq, wt, acc) or not (strided or _flat(offs)):
            return None
        if (offs if strided else offs.dtype) != types.int64:
            return None
        extra = (types.boolean,) if accumulating else ()
        return types.void(xq, offs, wt, types.int64, types.int64, types.int64, acc, types.int64,
                          types.int64, *extra)  # fmt: skip

    def codegen(context, builder, signature, args):
        xq_v, offs_v, wt_v, wstart_v, q0_v, taps_v, acc_v, a0_v, stride_v = args[:9]
        xq_t, offs_t, wt_t, _, _, _, acc_t, _, _ = signature.args[:9]

        def data(ty, value):
            return _data(context, builder, ty, value)

        xptr, wptr, aptr = data(xq_t, xq_v), data(wt_t, wt_v), data(acc_t, acc_v)
        optr = None if strided else data(offs_t, offs_v)
        fty = context.get_value_type(xq_t.dtype)
        itemsize = context.get_abi_sizeof(fty)
        width = lanes(itemsize)
        vty = ir.VectorType(fty, width)
        vptr = vty.as_pointer()
        i64 = ir.IntType(64)
        zero = ir.Constant(vty, None)
        suffix = f"v{width}f{itemsize * 8}"  # llvm.fma.v16f32: one vector FMA
        fma = builder.module.declare_intrinsic(
            f"llvm.fma.{suffix}", (), ir.FunctionType(vty, [vty] * 3)
        )

        def const(value):
            return ir.Constant(i64, value)

        # Where vector v lies, after the first one: lanes apart, or its own position.
        dense = [const(v * width) for v in range(nv)]
        if spread or epilogue:
            shifts = [const(0), *(builder.sub(q, q0_v) for q in args[9 : 9 + nv - 1])]
        else:
            shifts = dense
        stored_at = dense if epilogue else shifts

        def vector_at(ptr, o, v):
            at = builder.add(builder.add(a0_v, builder.mul(stride_v, const(o))), stored_at[v])
            p = builder.gep(ptr, [at], inbounds=True, source_etype=fty)
            return builder.bitcast(p, vptr)

        def acc_vector(o, v):
            return vector_at(aptr, o, v)

        cells = [(o, v) for o in range(ob) for v in range(nv)]
        start = builder.block
        firsts = {cell: zero for cell in cells}
        if accumulating:  # the sums start from acc's values where ``add``
            load = builder.append_basic_block("tile.load")
            begin = builder.append_basic_block("tile.begin")
            if biased:  # else from the bias's vectors where ``use_bias``
                check = builder.append_basic_block("tile.check")
                from_bias = builder.append_basic_block("tile.bias")
                builder.cbranch(args[_ADD], load, check)
                builder.position_at_end(check)
                builder.cbranch(args[_USE_BIAS], from_bias, begin)
                builder.position_at_end(from_bias)
                bptr = data(signature.args[_START_BIAS], args[_START_BIAS])
                starts = []
                for v in range(nv):
                    at = builder.add(args[_BIAS_AT], dense[v])
                    p = builder.gep(bptr, [at], inbounds=True, source_etype=fty)
                    starts.append(builder.load(builder.bitcast(p, vptr), align=itemsize, typ=vty))
                builder.branch(begin)
                start = check
            else:
                builder.cbranch(args[_ADD], load, begin)
            builder.position_at_end(load)
            loaded = {(o, v): builder.load(acc_vector(o, v), align=itemsize, typ=vty)
                      for o, v in cells}  # fmt: skip
            builder.branch(begin)
            builder.position_at_end(begin)
            for o, v in cells:
                phi = builder.phi(vty)
                phi.add_incoming(zero, start)
                phi.add_incoming(loaded[o, v], load)
                if biased:
                    phi.add_incoming(starts[v], from_bias)
                firsts[o, v] = phi
            start = begin
        if epilogue:
            _prefetch_epilogue(context, builder, signature, args, cells, vector_at)
            start = builder.block
        loop = builder.append_basic_block("tile.loop")
        done = builder.append_basic_block("tile.done")
        builder.cbranch(builder.icmp_signed(">", taps_v, const(0)), loop, done)

        builder.position_at_end(loop)
        t = builder.phi(i64, "t")
        t.add_incoming(const(0), start)
        accs = []
        for o in range(ob):
            row = []
            for v in range(nv):
                phi = builder.phi(vty, f"acc{o}_{v}")
                phi.add_incoming(firsts[o, v], start)
                row.append(phi)
            accs.append(row)
        if strided:
            off = builder.mul(t, offs_v)
        else:
            off = builder.load(builder.gep(optr, [t], inbounds=True, source_etype=i64), typ=i64)
        base = builder.add(off, q0_v)
        if prefetch:
            ahead = builder.add(base, builder.mul(offs_v, const(prefetch)))
            for at in range(0, nv * width, CACHE_LINE_BYTES // itemsize):
                p = builder.gep(xptr, [builder.add(ahead, const(at))], source_etype=fty)
                prefetch_line(builder, p, 0, 3)
        xs = []
        for v in range(nv):
            p = builder.gep(xptr, [builder.add(base, shifts[v])], inbounds=True,
                            source_etype=fty)  # fmt: skip
            xs.append(builder.load(builder.bitcast(p, vptr), align=itemsize, typ=vty))
        wbase = builder.add(wstart_v, builder.mul(t, const(ob)))
        sums = []
        for o in range(ob):
            p = builder.gep(wptr, [builder.add(wbase, const(o))], inbounds=True,
                            source_etype=fty)  # fmt: skip
            wv = _splat(builder, builder.load(p, typ=fty), vty)
            sums.append([builder.call(fma, [xs[v], wv, accs[o][v]]) for v in range(nv)])
        t_next = builder.add(t, const(1))
        body_end = builder.block
        t.add_incoming(t_next, body_end)
        for o in range(ob):
            for v in range(nv):
                accs[o][v].add_incoming(sums[o][v], body_end)
        builder.cbranch(builder.icmp_signed("<", t_next, taps_v), loop, done)

        builder.position_at_end(done)
        finals = []  # every phi first: LLVM wants them at the top of the block
        for o, v in cells:
            final = builder.phi(vty)
            final.add_incoming(firsts[o, v], start)
            final.add_incoming(sums[o][v], body_end)
            finals.append(final)
        if epilogue:
            _store_epilogue(context, builder, signature, args, dict(zip(cells, finals)),
                            vector_at, vty)  # fmt: skip
            return context.get_dummy_value()
        for (o, v), final in zip(cells, finals):
            builder.store(final, acc_vector(o, v), align=itemsize)
        return context.get_dummy_value()

    if epilogue:

        @intrinsic
        def tile(typingctx, xq, offs, wt, wstart, q0, taps, out, a0, stride, q1, q2, bias, oc0,
                 bounds, res, has_res):  # fmt: skip
            sig = signature_of(xq, offs, wt, out)
            if sig is None or not _float_arrays(xq, bias, bounds, res) or has_res != types.boolean:
                return None
            i64 = types.int64
            return types.void(*sig.args, i64, i64, bias, i64, bounds, res, types.boolean), codegen

    elif spread and nv == 3:

        @intrinsic
        def tile(typingctx, xq, offs, wt, wstart, q0, taps, acc, a0, stride, q1, q2):
            sig = signature_of(xq, offs, wt, acc)
            return None if sig is None else (types.void(*sig.args, types.int64, types.int64),
                                             codegen)  # fmt: skip

    elif spread and nv == 2:

        @intrinsic
        def tile(typingctx, xq, offs, wt, wstart, q0, taps, acc, a0, stride, q1):
            sig = signature_of(xq, offs, wt, acc)
            return None if sig is None else (types.void(*sig.args, types.int64), codegen)

    elif biased:

        @intrinsic
        def tile(typingctx, xq, offs, wt, wstart, q0, taps, acc, a0, stride, add, bias, bias_at,
                 use_bias):  # fmt: skip
            sig = signature_of(xq, offs, wt, acc)
            if (sig is None or add != types.boolean or not _float_arrays(xq, bias)
                    or bias_at != types.int64 or use_bias != types.boolean):  # fmt: skip
                return None
            return types.void(*sig.args, bias, types.int64, types.boolean), codegen

    elif accumulating:

        @intrinsic
        def tile(typingctx, xq, offs, wt, wstart, q0, taps, acc, a0, stride, add):
            sig = signature_of(xq, offs, wt, acc)
            return None if sig is None or add != types.boolean else (sig, codegen)

    else:

        @intrinsic
        def tile(typingctx, xq, offs, wt, wstart, q0, taps, acc, a0, stride):
            sig = signature_of(xq, offs, wt, acc)
            return None if sig is None else (sig, codegen)

    return tile


def _splat(builder, value, vty):
    """``value`` in every lane of a vector of type ``vty``."""
    i32 = ir.IntType(32)
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(i32, 0))
    mask = ir.Constant(ir.VectorType(i32, vty.count), None)
    return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined), mask)


# Where the epilogue tile's own arguments sit (see tile_kernel): the output, then after
# ``stride, q1, q2`` the bias, its first channel, the bounds, the residual and has_res.
_OUT, _BIAS, _OC0, _BOUNDS, _RES, _HAS_RES = 6, 11, 12, 13, 14, 15
# The accumulating tile's after ``stride``: add, then the biased variant's three.
_ADD, _START_BIAS, _BIAS_AT, _USE_BIAS = 9, 10, 11, 12


def _prefetch_epilogue(context, builder, signature, args, cells, vector_at) -> None:
    """The epilogue tile asks, before its taps run, for the lines it will store to and,
    where ``has_res``, the residual's: read only at the end, a line of each of ``ob``
    planes, they missed the caches and stalled the tile (a 32x32 layer with a residual
    block's add took 3-6% longer than with the epilogue's own pass, which streams them
    row by row; with the requests, 2-5% less)."""
    out_p = _data(context, builder, signature.args[_OUT], args[_OUT])
    for cell in cells:
        prefetch_line(builder, vector_at(out_p, *cell), 1, 3)
    with builder.if_then(args[_HAS_RES]):
        res_p = _data(context, builder, signature.args[_RES], args[_RES])
        for cell in cells:
            prefetch_line(builder, vector_at(res_p, *cell), 0, 3)


def _store_epilogue(context, builder, signature, args, finals, vector_at, vty) -> None:
    """The epilogue tile's stores (:func:`tile_kernel`): each final sum plus its channel's
    bias, clamped, plus the residual where ``has_res``, clamped again, at its output. Plain
    IR instructions without fast-math flags, so each step rounds as NumPy's op does."""
    out_t, bias_t, bounds_t, res_t = (signature.args[i] for i in (_OUT, _BIAS, _BOUNDS, _RES))
    out_v, bias_v, oc0_v, bounds_v, res_v, has_res_v = (
        args[i] for i in (_OUT, _BIAS, _OC0, _BOUNDS, _RES, _HAS_RES))  # fmt: skip
    fty = vty.element
    i64 = ir.IntType(64)

    def splat(ptr, index):
        p = builder.gep(ptr, [index], inbounds=True, source_etype=fty)
        return _splat(builder, builder.load(p, typ=fty), vty)

    def clamp(value, lo, hi):  # NumPy's minimum(maximum(value, lo), hi): a NaN stays NaN
        value = builder.select(builder.fcmp_ordered("<", value, lo), lo, value)
        return builder.select(builder.fcmp_ordered(">", value, hi), hi, value)

    bias_p = _data(context, builder, bias_t, bias_v)
    bounds_p = _data(context, builder, bounds_t, bounds_v)
    lo1, hi1, lo2, hi2 = (splat(bounds_p, ir.Constant(i64, i)) for i in range(4))
    biases = {o: splat(bias_p, builder.add(oc0_v, ir.Constant(i64, o))) for o, _ in finals}
    firsts = {(o, v): clamp(builder.fadd(final, biases[o]), lo1, hi1)
              for (o, v), final in finals.items()}  # fmt: skip
    out_p = _data(context, builder, out_t, out_v)
    itemsize = context.get_abi_sizeof(fty)  # vectors may start anywhere: element alignment
    with builder.if_else(has_res_v) as (with_residual, without):
        with with_residual:
            res_p = _data(context, builder, res_t, res_v)
            for cell, value in firsts.items():
                residual = builder.load(vector_at(res_p, *cell), align=itemsize, typ=vty)
                value = clamp(builder.fadd(value, residual), lo2, hi2)
                builder.store(value, vector_at(out_p, *cell), align=itemsize)
        with without:
            for cell, value in firsts.items():
                builder.store(clamp(value, lo2, hi2), vector_at(out_p, *cell), align=itemsize)


@cache
def transpose_kernel(rows: int | None = None):
    """The intrinsic ``transpose(src, s0, step, dst, d0, dstep)``: ``dst[d0 + q * dstep + r] =
    src[s0 + r * step + q]`` for ``r < rows`` and ``q < lanes`` (a vector's elements of the
    arrays' dtype; ``rows`` None: ``lanes`` too). ``rows`` vectors of ``src`` (rows ``step``
    apart) are loaded, transposed in registers by halving blocks (``log2(lanes)`` rounds of
    two-vector shuffles, each swapping the off-diagonal blocks of its pairs of rows) and
    stored as ``lanes`` vectors in order of ``q``. Each store writes a whole vector: with
    ``rows < lanes`` its last ``lanes - rows`` elements land past the column (the next
    store, ``dstep >= rows`` later, overwrites them; the last one needs that many elements
    of slack after it). Where ``rows`` exceeds ``lanes`` (float64 strips of 12 rows), the
    copy is element by element. Arrays 1-d, C-contiguous, of one float dtype; nothing is
    bounds-checked."""
    if intrinsic is None:  # pragma: no cover - exercised where numba is missing
        raise ImportError("numba is not installed")

    def codegen(context, builder, signature, args):
        src_v, s0_v, step_v, dst_v, d0_v, dstep_v = args
        src_t, dst_t = signature.args[0], signature.args[3]
        sptr, dptr = _data(context, builder, src_t, src_v), _data(context, builder, dst_t, dst_v)
        fty = context.get_value_type(src_t.dtype)
        itemsize = context.get_abi_sizeof(fty)
        width = lanes(itemsize)
        count = width if rows is None else rows
        vty = ir.VectorType(fty, width)
        mask_ty = ir.VectorType(ir.IntType(32), width)
        i64 = ir.IntType(64)

        def at(ptr, base, scale, index):
            offset = builder.add(base, builder.mul(scale, ir.Constant(i64, index)))
            return builder.gep(ptr, [offset], inbounds=True, source_etype=fty)

        if count > width:
            for r in range(count):
                for q in range(width):
                    x = builder.load(builder.gep(at(sptr, s0_v, step_v, r), [ir.Constant(i64, q)],
                                                 inbounds=True, source_etype=fty), typ=fty)  # fmt: skip
                    builder.store(x, builder.gep(at(dptr, d0_v, dstep_v, q), [ir.Constant(i64, r)],
                                                 inbounds=True, source_etype=fty))  # fmt: skip
            return context.get_dummy_value()
        vptr = vty.as_pointer()
        vectors = [builder.load(builder.bitcast(at(sptr, s0_v, step_v, r), vptr), align=itemsize,
                                typ=vty) if r < count else ir.Constant(vty, ir.Undefined)
                   for r in range(width)]  # fmt: skip
        half = width // 2
        while half:  # rows i and i + half trade the blocks off the diagonal of their pair
            low = [lane if not lane & half else width + lane - half for lane in range(width)]
            high = [lane + half if not lane & half else width + lane for lane in range(width)]
            for i in (i for i in range(width) if not i & half):
                a, b = vectors[i], vectors[i + half]
                vectors[i] = builder.shuffle_vector(a, b, ir.Constant(mask_ty, low))
                vectors[i + half] = builder.shuffle_vector(a, b, ir.Constant(mask_ty, high))
            half //= 2
        for q in range(width):
            builder.store(vectors[q], builder.bitcast(at(dptr, d0_v, dstep_v, q), vptr),
                          align=itemsize)  # fmt: skip
        return context.get_dummy_value()

    @intrinsic
    def transpose(typingctx, src, s0, step, dst, d0, dstep):
        if not _float_arrays(src, dst):
            return None
        i64 = types.int64
        return types.void(src, i64, i64, dst, i64, i64), codegen

    return transpose


@cache
def vector_copy():
    """The intrinsic ``copy(src, s0, dst, d0)``: ``dst[d0 : d0 + lanes] = src[s0 : s0 +
    lanes]`` as one vector load and one store (a short copy numba leaves element by element
    where it cannot tell the arrays apart). Arrays 1-d, C-contiguous, of one float dtype;
    nothing is bounds-checked."""
    if intrinsic is None:  # pragma: no cover - exercised where numba is missing
        raise ImportError("numba is not installed")

    def codegen(context, builder, signature, args):
        src_v, s0_v, dst_v, d0_v = args
        src_t, dst_t = signature.args[0], signature.args[2]
        fty = context.get_value_type(src_t.dtype)
        itemsize = context.get_abi_sizeof(fty)
        vptr = ir.VectorType(fty, lanes(itemsize)).as_pointer()

        def at(array_t, array_v, offset):
            data = _data(context, builder, array_t, array_v)
            return builder.bitcast(builder.gep(data, [offset], inbounds=True, source_etype=fty), vptr)

        value = builder.load(at(src_t, src_v, s0_v), align=itemsize, typ=vptr.pointee)
        builder.store(value, at(dst_t, dst_v, d0_v), align=itemsize)
        return context.get_dummy_value()

    @intrinsic
    def copy(typingctx, src, s0, dst, d0):
        if not _float_arrays(src, dst):
            return None
        return types.void(src, types.int64, dst, types.int64), codegen

    return copy
