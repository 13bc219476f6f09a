"""Branch-free float32 approximations of exp, log, erf and tanh that numba can vectorize.

PyPI's llvmlite links no vector math library, so ``math.exp`` and friends stay one scalar
call per element and a fused kernel that calls them runs at a fraction of the memory
bound (DESIGN.md section 8). These functions use only arithmetic, comparisons (which
LLVM turns into selects), ``floor`` and bit casts, so the loops that call them vectorize.

Each works in float32 arithmetic only (float64 steps would halve the vector width and cost a
slow float64 division: erf once took twice as long that way) and is accurate to a few ulp
over the whole float32 range, NaN and infinities included (they follow NumPy:
``exp(-inf) = 0``, ``log(0) = -inf``, ``log(-1) = nan``, ``erf(inf) = 1``,
``tanh(-inf) = -1``). float64 kernels call ``math.*`` instead (exact to NumPy, not
vectorized).

The kernel source generator (``numba_source``) calls them as ``fast_exp_f32(x)`` and so on;
numba inlines them into each kernel. A file whose kernels numba caches on disk and that
imports from here names the digest of what it imports (``MATH_SOURCE_SHA256``, checked by
a test): numba's cache follows the kernel's own file only. ``MAX_ULP`` states the maximum
error of each in ulps of the float32 result against NumPy's float64 (the spacing of
float32 numbers at the exact value; 2**-149 among subnormals), held by the tests over
random bit patterns of every exponent, [-6, 6] densely, subnormals and the edges.
Measured there: exp 1.06, log 1.90, tanh 1.41, sigmoid 2.34. erf is odd to the bit and
exactly +-1 beyond its clamp; over every float32 in [2**-8, 4.5] (every 31st below) it is
within 1.435 ulp, and the erfs of ``x / sqrt 2`` and ``x * (1 / sqrt 2)`` computed from
``x`` (below) within 1.447 and 1.429 of the exact ``erf(x / float32(sqrt 2))`` and
``erf(x * float32(1 / sqrt 2))`` over [2**-8, 6].

Beside them live the intrinsics the generated kernels call: bit casts, ``fma_f32``,
``next_part`` (claiming a launch's slices) and ``prefetch_read`` / ``prefetch_write``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# Maximum error in units in the last place of the float32 result, against NumPy float64
# (tests/backends/fusion/test_numba_runtime.py asserts them).
MAX_ULP = {"exp": 2, "log": 2, "erf": 1.5, "tanh": 2, "sigmoid": 2.5}

_F32 = np.float32
_LN2_HI = _F32(0.693145751953125)  # ln 2 in two parts: n * _LN2_HI is exact for |n| < 2**9
_LN2_LO = _F32(1.428606765330187e-06)
_LOG2E = _F32(1.4426950408889634)


@intrinsic
def f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits``."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def f32_bits(typingctx, value):
    """The bit pattern of the float32 ``value`` as an int32."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def fma_f32(typingctx, a, b, c):
    """a * b + c rounded once (LLVM's fma): reassociation never splits it, so the range
    reductions below stay exact in kernels compiled with ``reassoc``."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@intrinsic
def f64_from_bits(typingctx, bits):
    """The float64 whose bit pattern is the int64 ``bits``."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@intrinsic
def f64_bits(typingctx, value):
    """The bit pattern of the float64 ``value`` as an int64."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def next_part(typingctx, state):
    """Claims the next slice of a launch: adds 1 to ``state[1]`` (an int64 array shared by
    the launch's calls) atomically and returns the value before (``numba_source``'s
    "Parts"). The slices are independent, so the claim orders nothing else: the caller
    learns that every call is done through the runtime's own report, after the kernel."""
    if not (isinstance(state, types.Array) and state.dtype == types.int64):
        return None
    sig = types.int64(state)

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        counter = builder.gep(array.data, [ir.Constant(ir.IntType(64), 1)])
        return builder.atomic_rmw("add", counter, ir.Constant(ir.IntType(64), 1), "monotonic")

    return sig, codegen


def prefetch_line(builder, address, write: int, keep: int = 3) -> None:
    """Emits ``llvm.prefetch``: asks for the cache line at ``address`` (to write to it where
    ``write``), kept in the caches ``keep`` (3: every level, L1 too). A hint: it never
    faults, so the address may lie past an array's end."""
    byte_ptr = ir.PointerType(ir.IntType(8))
    i32 = ir.IntType(32)
    fetch = builder.module.declare_intrinsic(
        "llvm.prefetch", [byte_ptr], ir.FunctionType(ir.VoidType(), [byte_ptr] + [i32] * 3)
    )
    flags = [ir.Constant(i32, f) for f in (write, keep, 1)]
    builder.call(fetch, [builder.bitcast(address, byte_ptr), *flags])


def _prefetch_typing(array, index, write: int):
    """The signature and codegen of a prefetch of ``array[index]`` (see :func:`prefetch_line`)."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
            and index == types.uintp):  # fmt: skip
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        prefetch_line(builder, builder.gep(data, [args[1]]), write)
        return context.get_dummy_value()

    return types.void(array, index), codegen


@intrinsic
def prefetch_read(typingctx, array, index):
    """Asks for the cache line of ``array[index]`` (a ``uintp`` index, past the end too:
    never faults) to read it soon. Element-wise kernels ask a few KiB ahead of their loop
    (``numba_source``): the hardware's own prefetch fell behind a loop that computes
    between its loads."""
    return _prefetch_typing(array, index, 0)


@intrinsic
def prefetch_write(typingctx, array, index):
    """:func:`prefetch_read` for a line about to be written (x86 ``prefetchw``: the line
    arrives owned, so the store does not wait for it)."""
    return _prefetch_typing(array, index, 1)


def _jit(fn):
    # Inlined into each kernel by numba (LLVM alone does not inline them reliably once a
    # loop body grows, and a call per element stops vectorization); they then carry the
    # kernel's fast-math flags, which never include nnan/ninf/nsz, and their range
    # reductions use fma_f32 so that a reduction kernel's ``reassoc`` cannot undo them.
    return numba.njit(inline="always", error_model="numpy", cache=False)(fn)


@_jit
def _exp_parts(x):
    """exp(x) = p 2**n for x in [-104, 89] (or NaN): x = n ln2 + r with |r| <= ln2/2 and
    p = exp(r) by a degree-6 polynomial, in [0.7, 1.42]."""
    n = np.floor(x * _LOG2E + _F32(0.5))
    r = fma_f32(-n, _LN2_LO, fma_f32(-n, _LN2_HI, x))
    p = _F32(0.0013933654084301687)
    p = p * r + _F32(0.008363183108881808)
    p = p * r + _F32(0.0416664648809818)
    p = p * r + _F32(0.16666576957852255)
    p = p * r + _F32(0.5000000013471738)
    p = p * r * r + r + _F32(1.0)
    return n, p


@_jit
def _scaled(p, n, shift):
    """p 2**(n + shift) by adding n + shift to p's exponent field (no float overflow on the
    way); a NaN n adds nothing, so a NaN p stays NaN."""
    step = np.int32(np.int32(n) + shift) if n == n else np.int32(0)
    return f32_from_bits(np.int32(f32_bits(p) + (step << np.int32(23))))


@_jit
def fast_exp_f32(x):
    """exp(x) as p 2**n (:func:`_exp_parts`); results below the normal range get n + 64 in
    p's exponent field and a rounding multiply by 2**-64."""
    x = _F32(89.0) if x > _F32(89.0) else x  # NaN passes both clamps unchanged
    x = _F32(-104.0) if x < _F32(-104.0) else x
    n, p = _exp_parts(x)
    deep = n < _F32(-100.0)
    y = _scaled(p, n, np.int32(64) if deep else np.int32(0))
    y = y * _F32(5.421010862427522e-20) if deep else y
    return _F32(np.inf) if x > _F32(88.72283935546875) else y


@_jit
def fast_exp_nonpositive_f32(x):
    """:func:`fast_exp_f32` for x <= 0 or NaN, bit for bit (a softmax's ``exp(x - max x)``):
    every result then fits p 2**(n + 64) times 2**-64, exact where it is normal, and nothing
    overflows, so none of the range checks run (a softmax over ``[4096, 1024]`` at one
    thread: 1.63 ms against 1.96)."""
    x = _F32(-104.0) if x < _F32(-104.0) else x
    n, p = _exp_parts(x)
    return _scaled(p, n, np.int32(64)) * _F32(5.421010862427522e-20)


@_jit
def fast_log_f32(x):
    """log(x): x = m 2**e with m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s) with
    s = (m - 1) / (m + 1) by its series to s**11; subnormals are scaled by 2**23 first."""
    tiny = x < _F32(1.1754943508222875e-38)
    y = x * _F32(8388608.0) if tiny else x
    bits = f32_bits(y)
    # Shift the mantissa so that m lands in [sqrt(1/2), sqrt(2)): bias by 0x3f3504f3. numba
    # widens int32 arithmetic to int64: the casts keep the vector lanes 32 bits wide.
    shifted = np.int32(bits - np.int32(0x3F3504F3))
    e = np.int32(shifted >> np.int32(23))
    m = f32_from_bits(np.int32(bits - (e << np.int32(23))))
    e = np.int32(e - np.int32(23)) if tiny else e
    f = m - _F32(1.0)
    s = f / (m + _F32(1.0))
    z = s * s
    q = _F32(2.0 / 11.0)
    q = q * z + _F32(2.0 / 9.0)
    q = q * z + _F32(2.0 / 7.0)
    q = q * z + _F32(2.0 / 5.0)
    q = q * z + _F32(2.0 / 3.0)
    ef = _F32(e)
    result = fma_f32(ef, _LN2_HI, fma_f32(ef, _LN2_LO, fma_f32(s * z, q, _F32(2.0) * s)))
    result = _F32(-np.inf) if x == _F32(0.0) else result
    result = _F32(np.nan) if x < _F32(0.0) else result
    return x if ((x == _F32(np.inf)) | (x != x)) else result


# erf in two pieces of a = |x| (scripts/fit_erf.py fits them and prints the sets below):
# * below a split near 0.94: erf(x) / x = c0 + z P(z) with z = x**2 and P of degree 4, the
#   leading coefficient c0 = 2/sqrt(pi) in two float32 parts (rounding it to one float32
#   alone would cost 1 ulp);
# * from the split to the clamp: erfc(a) = Q(a - centre)**4, Q of degree 8 fitting
#   erfc ** (1/4). That root falls slowly enough for a polynomial, where erfc itself needed
#   a rational function, and a division is the slowest instruction in the loop: a GELU over
#   16M floats at one thread took 0.88x the time of the rational's (Zen 4). erf is then
#   fma(-q2, q2, 1) with q2 = Q**2, one rounding for the last two steps. Beyond the clamp
#   erfc < 3e-8 and erf rounds to +-1 in float32.
# A set may fold a constant factor of the argument in: erf(x / sqrt 2), a GELU's, is one
# set in x (the kernel then skips the division as well). Sets hold, in order: c0's two
# parts, P's 5 coefficients, the split, the centre (a multiple of 2**-4, so that a - centre
# is exact), Q's 9 coefficients and the clamp.


def _erf_set(*values: float) -> tuple:
    """One coefficient set of :func:`erf_pieces`, as float32s."""
    assert len(values) == 19, len(values)
    return tuple(_F32(v) for v in values)


# erf(x)
_ERF = _erf_set(  # c0 | P | split, centre | Q | clamp
    1.128379225730896, -5.8635382771399236e-08,
    -0.3761250674724579, 0.11281724274158478, -0.026759684085845947,
    0.00498013012111187, -0.0005915479850955307,
    0.9375, 0.75,
    0.7331069111824036, -0.40798550844192505, -0.03432733193039894, 0.05089502036571503,
    0.004083211068063974, -0.007203938905149698, 0.0011371164582669735, 9.930115629686043e-05,
    -2.7834565116791055e-05, 3.924999952316284)  # fmt: skip
# erf(x / float32(sqrt 2)), as a GELU written with a division computes it op by op.
_ERF_DIV_SQRT2 = _erf_set(  # c0 | P | split, centre | Q | clamp
    0.7978845834732056, -9.015127311329252e-09,
    -0.13298028707504272, 0.01994338259100914, -0.0023650960065424442,
    0.0002199833106715232, -1.3043985745753162e-05,
    1.328125, 1.0625,
    0.7325761318206787, -0.28855279088020325, -0.01706259325146675, 0.017998401075601578,
    0.0010123843094334006, -0.0012739136582240462, 0.00014294935681391507, 8.622304449090734e-06,
    -1.729876657918794e-06, 5.5625)  # fmt: skip
# erf(x * float32(1 / sqrt 2)), as ember's own ``gelu`` computes it op by op.
_ERF_MUL_RSQRT2 = _erf_set(  # c0 | P | split, centre | Q | clamp
    0.7978845238685608, 2.3279092431494064e-08,
    -0.13298028707504272, 0.019943447783589363, -0.00236520916223526,
    0.00022005995560903102, -1.3062029211141635e-05,
    1.328125, 1.0625,
    0.7325761318206787, -0.2885526716709137, -0.017063021659851074, 0.017999326810240746,
    0.0010112783638760448, -0.0012731450842693448, 0.00014264366473071277, 8.686377441335935e-06,
    -1.7353304428979754e-06, 5.5625)  # fmt: skip
_SIGN_BIT = np.int32(-0x80000000)


@_jit
def erf_pieces(x, c):
    """erf of ``x`` times the factor that the coefficient set ``c`` folds in (see above);
    branch-free: both pieces are computed and one selected, so the loop vectorizes."""
    a = abs(x)
    a = c[18] if a > c[18] else a  # NaN passes unchanged, +-inf become the clamp
    z = a * a
    p = fma_f32(c[6], z, c[5])
    p = fma_f32(p, z, c[4])
    p = fma_f32(p, z, c[3])
    p = fma_f32(p, z, c[2])
    small = fma_f32(a, c[0], a * fma_f32(p, z, c[1]))
    t = a - c[8]
    q = fma_f32(c[17], t, c[16])
    q = fma_f32(q, t, c[15])
    q = fma_f32(q, t, c[14])
    q = fma_f32(q, t, c[13])
    q = fma_f32(q, t, c[12])
    q = fma_f32(q, t, c[11])
    q = fma_f32(q, t, c[10])
    q = fma_f32(q, t, c[9])
    q2 = q * q
    r = small if a < c[7] else fma_f32(-q2, q2, _F32(1.0))
    return f32_from_bits(f32_bits(r) | (f32_bits(x) & _SIGN_BIT))


@_jit
def fast_erf_f32(x):
    """erf(x) (:func:`erf_pieces`)."""
    return erf_pieces(x, _ERF)


@_jit
def fast_erf_div_sqrt2_f32(x):
    """erf(x / float32(sqrt 2)) from x itself, without the quotient's rounding."""
    return erf_pieces(x, _ERF_DIV_SQRT2)


@_jit
def fast_erf_mul_rsqrt2_f32(x):
    """erf(x * float32(1 / sqrt 2)) from x itself, without the product's rounding."""
    return erf_pieces(x, _ERF_MUL_RSQRT2)


@_jit
def fast_tanh_f32(x):
    """tanh(x): x P(x**2) for |x| < 0.625, 1 - 2e / (1 + e) with e = exp(-2|x|) beyond (|x|
    clamped at 10, where tanh rounds to 1 in float32; an exp of an argument at most 0)."""
    a = abs(x)
    z = x * x
    p = _F32(0.0021469000902658176)
    p = p * z + _F32(-0.008181560070023665)
    p = p * z + _F32(0.021702225056492688)
    p = p * z + _F32(-0.05394696606643545)
    p = p * z + _F32(0.13333205979043733)
    p = p * z + _F32(-0.3333333063897754)
    p = p * z + _F32(0.9999999999416274)
    small = x * p
    c = _F32(10.0) if a > _F32(10.0) else a
    e = fast_exp_nonpositive_f32(_F32(-2.0) * c)
    large = _F32(1.0) - (e + e) / (_F32(1.0) + e)
    large = -large if x < _F32(0.0) else large
    return small if ((a < _F32(0.625)) | (x != x)) else large


@_jit
def fast_sigmoid_f32(x):
    """1 / (1 + exp(-x)), as e / (1 + e) with e = exp(x) for x < 0 so that results down to
    the subnormals do not flush to 0 where exp(-x) overflows. The numerator is selected
    before the one division (a multiply by 1 / (1 + e) would round once more: 2.67 ulp)."""
    e = fast_exp_nonpositive_f32(-abs(x))
    return (e if x < _F32(0.0) else _F32(1.0)) / (_F32(1.0) + e)


REFERENCE = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "erf": np.vectorize(math.erf),
             "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}  # fmt: skip
"""float64 references of the approximations, as the tests measure them."""


# ---------------------------------------------------------------------- exact helpers
# NumPy's semantics for the ops LLVM leaves undefined or Python defines differently; the
# generated kernels pass ints as int64 (uint64 for unsigned) and cast the result back.
@_jit
def frem(a, b):
    """NumPy's float remainder: the sign of the divisor, NaN for b == 0."""
    r = np.fmod(a, b)
    if r != 0 and ((r < 0) != (b < 0)):
        r = r + b
    if r == 0:
        r = np.copysign(r, b) if b == b else r
    return r


@_jit
def idiv(a, b):
    """Integer division truncating toward zero (ember's int div); 0 for b == 0; MIN // -1
    wraps (LLVM's sdiv would trap)."""
    if b == 0:
        return a - a
    if b == -1:
        return -a
    q = a // b
    if a % b != 0 and ((a < 0) != (b < 0)):
        q = q + 1
    return q


@_jit
def udiv(a, b):
    """Unsigned integer division; 0 for b == 0."""
    return a - a if b == 0 else a // b


@_jit
def irem(a, b):
    """NumPy's integer remainder (the sign of the divisor); 0 for b == 0 and b == -1."""
    if b == 0 or b == -1:
        return a - a
    return a % b


@_jit
def urem(a, b):
    """Unsigned integer remainder; 0 for b == 0."""
    return a - a if b == 0 else a % b


@_jit
def ipow(a, b, err):
    """a ** b by squaring, wrapping; a negative exponent sets ``err[0]`` (NumPy raises)."""
    if b < 0:
        err[0] = 1
        return a - a
    result = np.int64(1)
    base = a
    e = b
    while e > 0:
        if e & 1:
            result = result * base
        base = base * base
        e = e >> 1
    return result


@_jit
def upow(a, b, err):
    """Unsigned a ** b by squaring, wrapping."""
    result = np.uint64(1)
    base = a
    e = b
    while e > np.uint64(0):
        if e & np.uint64(1):
            result = result * base
        base = base * base
        e = e >> np.uint64(1)
    return result


@_jit
def shl(a, b):
    """NumPy's left shift of int64 values: 0 for counts outside [0, 64)."""
    return a - a if (b < 0 or b >= 64) else a << b


@_jit
def shr(a, b):
    """NumPy's arithmetic right shift of int64 values: the sign for counts outside [0, 64)."""
    if b < 0 or b >= 64:
        return a - a - 1 if a < 0 else a - a
    return a >> b


@_jit
def ushr(a, b):
    """NumPy's right shift of uint64 values: 0 for counts outside [0, 64)."""
    if b < 0 or b >= 64:
        return a - a
    return a >> np.uint64(b)


@_jit
def rint(x):
    """Round half to even, as NumPy's round."""
    return np.rint(x)


# ---------------------------------------------------------------------- ordered keys
# LLVM vectorizes a float max/min reduction only under ``nnan``, which would also void
# NumPy's NaN propagation. Reductions therefore run on ints ordered as the floats are
# (the sign-magnitude bits flipped for negatives), with NaN mapped to the end that wins.
_I32_MAX, _I32_MIN = np.int32(0x7FFFFFFF), np.int32(-0x80000000)
_I64_MAX, _I64_MIN = np.int64(0x7FFFFFFFFFFFFFFF), np.int64(-0x8000000000000000)


@_jit
def order_key_f32(x, nan_key):
    """An int32 ordered as the float32 ``x``; ``nan_key`` for NaN."""
    b = f32_bits(x)
    # numba widens int32 arithmetic to int64: the casts keep the reduction at 8 lanes (AVX2),
    # 5x faster than the widened one.
    k = np.int32(b ^ _I32_MAX) if b < np.int32(0) else b
    return np.int32(nan_key) if x != x else k


@_jit
def from_order_key_f32(k, nan_key):
    """The float32 of an :func:`order_key_f32` (NaN for ``nan_key``)."""
    x = f32_from_bits(np.int32(k ^ _I32_MAX) if k < np.int32(0) else k)
    return _F32(np.nan) if k == nan_key else x


@_jit
def order_key_f64(x, nan_key):
    """An int64 ordered as the float64 ``x``; ``nan_key`` for NaN."""
    b = f64_bits(x)
    k = b ^ _I64_MAX if b < np.int64(0) else b
    return np.int64(nan_key) if x != x else k


@_jit
def from_order_key_f64(k, nan_key):
    """The float64 of an :func:`order_key_f64` (NaN for ``nan_key``)."""
    x = f64_from_bits(k ^ _I64_MAX if k < np.int64(0) else k)
    return np.float64(np.nan) if k == nan_key else x


# ---------------------------------------------------------------------- shifted sums
@_jit
def variance_sum(s1, s2, n):
    """sum((x - mean)**2) from s1 = sum(x - sh) and s2 = sum((x - sh)**2) over ``n`` values
    (any shift sh): 0 for no values, never below 0 (rounding may take an exact 0 a hair
    below it), NaN stays NaN."""
    if n == 0:
        return np.float64(0)
    q = s2 - s1 * (s1 / n)
    return np.float64(0) if q < 0 else q
