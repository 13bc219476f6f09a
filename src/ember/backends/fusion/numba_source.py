"""Python source of a numba kernel for an ``ir.Block``.

The generated module holds one ``kernel`` and, for blocks with reductions, small helper
functions. Its layout follows from ``Block.key()`` only, never from sizes:

* **Canonical dims.** Dims where every array the kernel touches (inputs and outputs) is 1
  are dropped; neighbours where every array is broadcast alike merge into one group. An
  element-wise block's tasks are (outer positions x chunks of the last group), each a
  plain inner loop over its chunk, or, with one group, each part's slice is one loop (a
  loop over chunks around it cost LLVM's register allocation: 20-30% on a GELU); a block
  with reductions has a task per position outside ``Block.axis`` and runs its passes
  along the axis.
* **Parts.** A kernel's task range is cut into ``parts`` equal contiguous slices, and
  ``span`` runs one of them. A call of ``kernel`` runs slice ``part``, then claims further
  slices from a counter it shares with the other calls of the launch (``err[1]``, taken
  atomically: :func:`numba_math.next_part`) until none is left. So the runtime makes one
  call a thread, each starting at its own slice below the counter's first value: a thread
  that starts late finds the slices taken instead of holding the others up, and moving on
  to the next slice costs no return to Python and no GIL (a Python loop over parts had
  taken 5 us between slices, and layer norm over ``[4096, 1024]`` at two threads went
  from 0.75-0.80 to 0.67-0.68 ms). Kernels release the GIL (``nogil``), and the runtime
  runs the calls on its own threads, so a kernel compiles without numba's parallel
  transform (much faster) and no thread spins between kernels.
* **Loop shape.** With one group, a part's slice is one loop, ``for j in range(lo, hi)``,
  which LLVM vectorizes and unrolls on its own. Asked to (``generate(..., prefetch=True)``;
  the runtime asks where ``numba_prefetch`` measured it faster), it runs instead in runs
  of :data:`PREFETCH_RUN` elements, each first asking for the cache lines its streamed
  arrays will reach :data:`PREFETCH_BYTES` ahead (``numba_math.prefetch_read``, and
  ``prefetch_write`` for outputs, which then arrive owned), then a tail. Which is faster
  depends on the machine. On a 2-vCPU AVX-512 Xeon, left to the hardware's prefetch, a
  loop that computes between its loads reached memory late: alternating processes, the
  GELU over 16M float32 took 10.4-11.0 ms in runs against 13.8-14.6 at one thread, an add
  of two 16M arrays 11.5-12.0 against 13.2-16.1. On an AMD EPYC (Zen 4) the one loop won:
  the add 6.8-7.5 ms against 13.0-13.8 (LLVM unrolls a cheap body's run of 16 elements
  whole and leaves it scalar), the GELU 9.5-9.7 against 11.3-11.8.
* **Arrays** arrive flattened and C-contiguous, indexed with unsigned ints (a signed index
  costs a negative-index check per access that stops LLVM from vectorizing); an array's element stride in a group is 0
  where it is broadcast, so the index of every array is ``base + j * stride`` with the
  inner stride known at compile time (0 or 1 for element-wise blocks: vectorizable).
* **Passes.** A reduction is computed in pass ``1 + (passes its operand needs)``; each
  pass recomputes along the axis the element-wise registers its reductions read (softmax:
  pass 1 max, pass 2 sum of exp(x - max), final loop the quotient). Registers constant
  along the axis are computed once per position, after the pass that makes them available.
  A variance ``mean((x - mean(x))**2)`` (or its sum) is computed in the pass of its mean
  from shifted sums (:func:`variance_pairs`): layer norm walks the axis twice. The sums
  are float32 ones (float32 data, rows of at most :data:`FLOAT32_MOMENTS_MAX`, a walk's
  worth of compute less: layer norm over ``[4096, 1024]`` 0.82-0.87x the time at one
  thread) shifted by the mean of the first :data:`FLOAT32_MOMENTS_SHIFT` values, kept
  only where that shift leaves nothing to cancel and the squares stay within float32's
  range; elsewhere the row is walked again with float64 sums shifted by its first value.
  The last pass stores its operands that an output is computed from in that output's
  array, and the final loop reads them back (``_stash``: softmax computes exp once).
* **Lanes.** When dims follow the reduced axis, a walk along it would stride: the kernel
  then carries :data:`LANES` positions of the last group side by side instead, with array
  accumulators, so every loop along the axis walks contiguous memory innermost.
* **Flags.** Element-wise kernels are compiled with FMA contraction only (NaN, infinities
  and signed zeros as NumPy has them). Reduction kernels add ``reassoc``, which their sums
  need to vectorize: their float results may differ from NumPy's by the order of rounding
  (the approximations of ``numba_math`` stay exact under it). A product scaled by a power
  of two may take the scaling on its factor that is ready first (:func:`early_scalings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.backend.errors import UnsupportedError
from ember.backends.fusion import ir
from ember.backends.fusion.numba_target import CACHE_LINE_BYTES
from ember.tensor.dtype import DType

SUPPORTED = frozenset({DType.F64, DType.F32, DType.I64, DType.I32, DType.I16, DType.I8,
                       DType.U64, DType.U32, DType.U16, DType.U8, DType.BOOL})  # fmt: skip
_CTOR = {d: f"np.{'bool_' if d is DType.BOOL else d.name.replace('F', 'float').replace('I', 'int').replace('U', 'uint').lower()}" for d in SUPPORTED}  # fmt: skip
_BITS = {DType.I64: 64, DType.I32: 32, DType.I16: 16, DType.I8: 8,
         DType.U64: 64, DType.U32: 32, DType.U16: 16, DType.U8: 8}  # fmt: skip

ELEMENTWISE_FLAGS = {"contract"}
PREFETCH_RUN = 16
"""Elements of an element-wise kernel's loop between its prefetches (a line of float32)."""
PREFETCH_BYTES = 4096
"""How far ahead of its loop an element-wise kernel asks for its arrays' lines."""
REDUCTION_FLAGS = {"arcp", "contract", "reassoc"}


def _flags(flags: set[str]) -> str:
    return "{" + ", ".join(repr(f) for f in sorted(flags)) + "}"


class KernelUnsupported(UnsupportedError):
    """The numba runtime cannot compile this block (a dtype such as f16/bf16, or an op it
    does not know): run the block's ops unfused instead."""


def numpy_ctor(dtype: DType) -> str:
    """The NumPy scalar constructor (a cast in numba) of ``dtype`` in generated source."""
    return _CTOR[dtype]


# ---------------------------------------------------------------------- canonical dims
@dataclass(frozen=True)
class Layout:
    """How a block's dims map onto the kernel's groups (a function of ``Block.key()``).

    ``groups`` lists the block dims of each group; ``inner`` is the index of the group the
    inner loop walks (the axis for reductions, else the last group; -1 when none);
    ``broadcast[a][g]`` says whether array ``a`` (inputs, then outputs) is 1 in group ``g``.
    """

    groups: tuple[tuple[int, ...], ...]
    inner: int
    broadcast: tuple[tuple[bool, ...], ...]


def layout(block: ir.Block) -> Layout:
    """Drops dims where every array is 1 and merges neighbours broadcast alike (never across
    the reduced axis)."""
    shapes = [i.shape for i in block.inputs] + [block.register_shape(r) for r in block.outputs]
    rank = len(block.shape)
    flags = [tuple(s[d] == 1 for s in shapes) for d in range(rank)]
    groups: list[list[int]] = []
    for d in range(rank):
        if all(flags[d]) and d != block.axis:
            continue
        mergeable = (groups and d != block.axis and groups[-1][-1] != block.axis
                     and flags[groups[-1][-1]] == flags[d])  # fmt: skip
        if mergeable:
            groups[-1].append(d)
        else:
            groups.append([d])
    if block.axis is not None:
        inner = next(g for g, dims in enumerate(groups) if block.axis in dims)
    else:
        inner = len(groups) - 1
    broadcast = tuple(tuple(flags[dims[0]][a] for dims in groups) for a in range(len(shapes)))
    return Layout(tuple(tuple(g) for g in groups), inner, broadcast)


# ---------------------------------------------------------------------- instructions
def check(block: ir.Block) -> None:
    """Raises KernelUnsupported when the block has a dtype or op this runtime cannot take."""
    registers = len(block.inputs) + len(block.body)
    for r in range(registers):
        if block.register_dtype(r) not in SUPPORTED:
            raise KernelUnsupported(
                f"numba runtime: dtype {block.register_dtype(r)} is not supported (register {r})"
            )
    for instr in block.body:
        if instr.op not in _OPS and instr.op not in ir.REDUCTIONS:
            raise KernelUnsupported(f"numba runtime: op {instr.op!r} is not supported")
    if block.axis is None and any(i.op in ir.REDUCTIONS for i in block.body):
        raise KernelUnsupported("numba runtime: a reduction in a block without an axis")


def _float_unary(f32: str, f64: str):
    def emit(x, t, d):
        return f"{f32}({x})" if d is DType.F32 else f"{t}({f64}({x}))"

    return emit


_BINARY_ARITH = {"add": "+", "sub": "-", "mul": "*"}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
            "and": "&", "or": "|", "xor": "^"}  # fmt: skip
_COMPARE = {"equal": "==", "not_equal": "!=", "greater": ">", "greater_equal": ">=",
            "lower": "<", "lower_equal": "<="}  # fmt: skip
_MATH = {"log1p": "math.log1p", "expm1": "math.expm1", "sin": "math.sin", "cos": "math.cos",
         "tan": "math.tan", "sinh": "math.sinh", "cosh": "math.cosh", "asin": "math.asin",
         "acos": "math.acos", "atan": "math.atan", "floor": "np.floor", "ceil": "np.ceil",
         "trunc": "np.trunc", "round": "rint", "sqrt": "math.sqrt"}  # fmt: skip
_FAST = {"exp": ("fast_exp_f32", "math.exp"), "log": ("fast_log_f32", "math.log"),
         "erf": ("fast_erf_f32", "math.erf"), "tanh": ("fast_tanh_f32", "math.tanh")}  # fmt: skip


def _binary(op: str, x: str, y: str, t: str, d: DType) -> str:
    """A binary op of dtype ``d`` (operands already of ``d``); ``t`` casts back to ``d``
    (numba widens small ints; the cast wraps as NumPy does)."""
    if op in _BINARY_ARITH:
        return f"{t}({x} {_BINARY_ARITH[op]} {y})"
    if op in _BITWISE:
        return (
            f"{t}({x} {_BITWISE[op]} {y})" if d is not DType.BOOL else f"({x} {_BITWISE[op]} {y})"
        )
    if op == "div":
        if d.is_float:
            return f"{t}({x} / {y})"
        return f"{t}({_int_call('div', x, y, d)})"
    if op == "remainder":
        return f"{t}(frem({x}, {y}))" if d.is_float else f"{t}({_int_call('rem', x, y, d)})"
    if op == "pow":
        return f"{t}({x} ** {y})" if d.is_float else f"{t}({_int_call('pow', x, y, d)})"
    if op == "max_pair":
        return f"({x} if (({x} > {y}) | ({x} != {x})) else {y})"
    if op == "min_pair":
        return f"({x} if (({x} < {y}) | ({x} != {x})) else {y})"
    if op == "atan2":
        return f"{t}(math.atan2({x}, {y}))"
    if op == "bitwise_left_shift":
        return f"{t}(shl(np.int64({x}), np.int64({y})))"
    if op == "bitwise_right_shift":
        if d is DType.U64:
            return f"{t}(ushr(np.uint64({x}), np.int64({y})))"
        return f"{t}(shr(np.int64({x}), np.int64({y})))"
    if op in _COMPARE:
        return f"({x} {_COMPARE[op]} {y})"
    raise KernelUnsupported(f"numba runtime: op {op!r} is not supported")


def _int_call(name: str, x: str, y: str, d: DType) -> str:
    """An int helper of ``numba_math`` on operands widened to int64 (uint64 if unsigned)."""
    if d.is_unsigned:
        call = f"u{name}(np.uint64({x}), np.uint64({y})"
    else:
        call = f"i{name}(np.int64({x}), np.int64({y})"
    return call + (", err)" if name == "pow" else ")")


def _unary(op: str, x: str, t: str, d: DType) -> str:
    if op == "neg":
        return f"{t}(-{x})"
    if op == "abs":
        return f"{t}(abs({x}))"
    if op == "sign":
        return f"({t}(1) if {x} > 0 else ({t}(-1) if {x} < 0 else {t}(0)))"
    if op in _FAST:
        fast, exact = _FAST[op]
        return f"{fast}({x})" if d is DType.F32 else f"{t}({exact}({x}))"
    if op == "sigmoid":
        if d is DType.F32:
            return f"fast_sigmoid_f32({x})"
        return f"({t}(1) / ({t}(1) + math.exp(-{x})))"
    if op in _MATH:
        return f"{t}({_MATH[op]}({x}))"
    if op in _UNARY:
        return _UNARY[op].format(t=t, x=x)
    raise KernelUnsupported(f"numba runtime: op {op!r} is not supported")


# The unary ops that are one expression in the result's constructor ``t`` and operand ``x``.
_UNARY = {
    "rsqrt": "({t}(1) / {t}(math.sqrt({x})))",
    "recip": "({t}(1) / {x})",
    "is_nan": "({x} != {x})",
    "is_inf": "(abs({x}) == np.inf)",
    "bitwise_not": "{t}(~{x})",
    "not": "(not {x})",
}


def _cast(x: str, source: DType, target: DType) -> str:
    t = numpy_ctor(target)
    if target is DType.BOOL:
        return f"({x} != 0)"
    if source is DType.BOOL:
        return f"({t}(1) if {x} else {t}(0))"
    if source.is_float and target.is_int:
        # NumPy truncates toward zero; narrower ints wrap from int64 as NumPy's C casts do.
        # NaN, infinities and values beyond int64 give unspecified values (NumPy warns).
        if target is DType.U64:
            return f"(np.uint64({x}) if {x} >= 0 else np.uint64(np.int64({x})))"
        return f"{t}(np.int64({x}))"
    return f"{t}({x})"


def _instr_expr(block: ir.Block, instr: ir.Instr, reg, scalar) -> str:
    """Source of one non-reduction instruction's value; ``reg(r)`` names a register,
    ``scalar()`` the next scalar argument."""
    op, d = instr.op, instr.dtype
    args = [reg(a) for a in instr.args]
    src = block.register_dtype(instr.args[0]) if instr.args else d
    t = numpy_ctor(src)
    if op == "cast":
        return _cast(args[0], src, d)
    if op == "clamp":
        expr = args[0]
        low, high = instr.attrs
        if low is not None:
            expr = _binary("max_pair", f"({expr})", scalar(), t, src)
        if high is not None:
            expr = _binary("min_pair", f"({expr})", scalar(), t, src)
        return f"{t}({expr})"
    if op == "mask_where":
        return f"({args[2]} if {args[1]} else {args[0]})"
    if op == "mask_fill":
        return f"({scalar()} if {args[1]} else {args[0]})"
    if op.endswith("_scalar"):
        return _binary(op[: -len("_scalar")], args[0], scalar(), t, src)
    if op.endswith("_elem"):
        return _binary(op[: -len("_elem")], args[0], scalar(), t, src)
    if len(args) == 2:
        return _binary(op, args[0], args[1], t, src)
    if op == "exp" and src is DType.F32 and _at_most_zero(block, instr.args[0]):
        return f"fast_exp_nonpositive_f32({args[0]})"
    if op == "erf" and src is DType.F32:
        folded = _erf_of_scaled(block, instr.args[0])
        if folded is not None:
            return f"{folded[0]}({reg(folded[1])})"
    return _unary(op, args[0], t, src)


def _erf_of_scaled(block: ir.Block, r: int) -> tuple[str, int] | None:
    """Where float32 register ``r`` is ``x / sqrt 2`` or ``x * (1 / sqrt 2)`` (a GELU's,
    ``ir.BY_SQRT2``): the ``numba_math`` function giving its erf from ``x``, and ``x``'s
    register. The erf is then computed without the quotient's rounding (closer to the exact
    value than op by op, within the same stated ulp), and the loop skips the division, its
    slowest instruction: the GELU over 16M float32 at one thread in 0.83-0.86x the time. The
    quotient is still computed where something else reads it."""
    n_in = len(block.inputs)
    if r < n_in:
        return None
    scaling = block.body[r - n_in]
    if scaling.op not in _ERF_OF_SCALED or scaling.dtype is not DType.F32:
        return None
    if ir.attr_tag(scaling.op, scaling.attrs[0]) != ir.BY_SQRT2:
        return None
    return _ERF_OF_SCALED[scaling.op], scaling.args[0]


_ERF_OF_SCALED = {"div_scalar": "fast_erf_div_sqrt2_f32", "mul_scalar": "fast_erf_mul_rsqrt2_f32"}


def _at_most_zero(block: ir.Block, r: int) -> bool:
    """Whether register ``r`` is ``x - max_dim(x)``, so never above 0 (the max's fiber holds
    each element itself), or NaN (``x`` NaN, or infinite with ``inf - inf``): a softmax's
    shift."""
    n_in = len(block.inputs)
    if r < n_in or block.body[r - n_in].op != "sub":
        return False
    x, m = block.body[r - n_in].args
    return m >= n_in and block.body[m - n_in].op == "max_dim" and block.body[m - n_in].args == (x,)


_OPS = frozenset(
    [*_BINARY_ARITH, *_BITWISE, *_COMPARE, *_MATH, *_FAST, "div", "remainder", "pow",
     "max_pair", "min_pair", "atan2", "bitwise_left_shift", "bitwise_right_shift", "neg", "abs",
     "sign", "sigmoid", "rsqrt", "recip", "is_nan", "is_inf", "bitwise_not", "not", "cast",
     "clamp", "mask_where", "mask_fill"]
    + [f"{n}_scalar" for n in (*_BINARY_ARITH, "div", "remainder", "pow", "max_pair",
                                "min_pair", "bitwise_and", "bitwise_or", "bitwise_xor",
                                "bitwise_left_shift", "bitwise_right_shift")]
    + [f"{n}_elem" for n in _COMPARE]
)  # fmt: skip


def scalar_dtypes(block: ir.Block) -> list[DType]:
    """The dtype each scalar argument is cast to: that of the instruction's tensor operand."""
    return [block.register_dtype(i.args[0]) for i in block.body for a in i.attrs
            if ir.is_scalar(i, a)]  # fmt: skip


# ---------------------------------------------------------------------- the module
_HEADER = """\
# Generated by ember.backends.fusion.numba_source: do not edit.
import math

import numba
import numpy as np

from ember.backends.fusion.numba_math import (
    fast_erf_div_sqrt2_f32, fast_erf_f32, fast_erf_mul_rsqrt2_f32, fast_exp_f32,
    fast_exp_nonpositive_f32, fast_log_f32, fast_sigmoid_f32, fast_tanh_f32, frem, idiv,
    from_order_key_f32, from_order_key_f64, ipow, irem, order_key_f32, order_key_f64, rint, shl,
    next_part, prefetch_read, prefetch_write, shr, udiv, upow, urem, ushr, variance_sum)

"""


@dataclass
class _Writer:
    lines: list[str] = field(default_factory=list)

    def __call__(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)


def streams_in_one_loop(block: ir.Block) -> bool:
    """Whether ``block``'s kernel walks its arrays in one loop (an element-wise block of one
    group with an array along it), whose shape ``generate``'s ``prefetch`` chooses."""
    if block.axis is not None:
        return False
    lay = layout(block)
    return len(lay.groups) == 1 and not all(flags[0] for flags in lay.broadcast)


def generate(block: ir.Block, prefetch: bool = False) -> str:
    """The source of a module whose ``kernel`` computes ``block`` (see the module doc);
    ``prefetch``: a loop of :func:`streams_in_one_loop` runs in runs that prefetch.

    ``kernel(*inputs, *outputs, *scalars, *sizes, chunk, err, part, parts)``: flat
    C-contiguous arrays, the scalars cast to :func:`scalar_dtypes`, the size of each group
    of :func:`layout`, the inner chunk length (element-wise blocks), a 2-element int64 array
    (``err[0]``: set to 1 when NumPy would have raised, an int raised to a negative power;
    ``err[1]``: the next slice to claim, which the caller sets to the number of calls it
    makes), and the call's own slice of ``parts`` slices of the tasks (module doc).
    """
    check(block)
    lay = layout(block)
    w = _Writer()
    w(0, _HEADER.rstrip("\n"))
    n_in, n_out, n_sc = len(block.inputs), len(block.outputs), len(block.scalars())
    params = ([f"in{i}" for i in range(n_in)] + [f"out{o}" for o in range(n_out)]
              + [f"s{s}" for s in range(n_sc)] + [f"n{g}" for g in range(len(lay.groups))]
              + ["chunk", "err", "part", "parts"])  # fmt: skip
    if block.axis is None:
        _elementwise(block, lay, w, params, prefetch)
    else:
        _reduction(block, lay, w, params)
    # The claims wrap a call of ``span`` rather than its loop: nested in a loop, a GELU's
    # loop compiled to slower code (3-5% at one thread), as it did inside a loop over chunks.
    w(0, "")
    w(0, "")
    w(0, "@numba.njit(nogil=True, error_model='numpy', cache=True)")
    w(0, f"def kernel({', '.join(params)}):")
    w(1, "while part < parts:")
    w(2, f"span({', '.join(params)})")
    w(2, "part = next_part(err)")
    return "\n".join(w.lines) + "\n"


def _strides(lay: Layout, w: _Writer, names: list[str]) -> None:
    """Element strides of each array in each group (0 where broadcast)."""
    for a, name in enumerate(names):
        flags = lay.broadcast[a]
        for g in range(len(lay.groups)):
            if flags[g]:
                w(1, f"st_{name}_{g} = 0")
            else:
                later = [f"n{h}" for h in range(g + 1, len(lay.groups)) if not flags[h]]
                w(1, f"st_{name}_{g} = {' * '.join(later) if later else '1'}")


def _positions(lay: Layout, w: _Writer, indent: int, var: str, names: list[str],
               skip: tuple[int, ...] | None = None) -> None:  # fmt: skip
    """Decomposes the outer position ``var`` into group indices and array bases (over the
    groups other than ``skip``, default the inner one)."""
    skip = (lay.inner,) if skip is None else skip
    outer = [g for g in range(len(lay.groups)) if g not in skip]
    rest = var  # fresh names at each step: one name per value keeps the loop easy to vectorize
    for g in reversed(outer):
        if g == outer[0]:
            w(indent, f"i{g} = {rest}")
        else:
            w(indent, f"i{g} = {rest} % n{g}")
            w(indent, f"q{g} = {rest} // n{g}")
            rest = f"q{g}"
    for name in names:
        terms = [f"i{g} * st_{name}_{g}" for g in outer]
        w(indent, f"b_{name} = {' + '.join(terms) if terms else '0'}")


def _scalar_counter():
    count = iter(range(1 << 30))
    return lambda: f"s{next(count)}"


def _elementwise(block: ir.Block, lay: Layout, w: _Writer, params: list[str],
                 prefetch: bool) -> None:  # fmt: skip
    names = [f"in{i}" for i in range(len(block.inputs))] + [
        f"out{o}" for o in range(len(block.outputs))
    ]
    w(
        0,
        f"@numba.njit(nogil=True, fastmath={_flags(ELEMENTWISE_FLAGS)}, error_model='numpy', cache=True)",
    )
    w(0, f"def span({', '.join(params)}):")
    _strides(lay, w, names)
    outer = [f"n{g}" for g in range(len(lay.groups)) if g != lay.inner]
    inner = f"n{lay.inner}" if lay.groups else "1"
    n_in = len(block.inputs)
    dtypes = [i.dtype for i in block.inputs] + [block.register_dtype(r) for r in block.outputs]
    streamed = [k for k in range(len(names)) if lay.groups and not lay.broadcast[k][lay.inner]]

    early = early_scalings(block)

    def body(indent: int) -> None:
        count = _scalar_counter()  # the same names each time the body is written
        named: dict[int, str] = {}  # mul_scalar's register -> its scalar's name

        for i in range(n_in):
            step = " + j" if i in streamed else ""
            w(indent, f"r{i} = in{i}[np.uintp(b_in{i}{step})]")
        for k, instr in enumerate(block.body):
            r = n_in + k

            def scalar(r=r) -> str:
                named[r] = count()
                return named[r]

            expr = _instr_expr(block, instr, lambda a: f"r{a}", scalar)
            if r in early:
                ready, late, scaling = early[r]
                t = numpy_ctor(instr.dtype)
                expr = f"{t}({t}(r{ready} * {named[scaling]}) * r{late})"
            w(indent, f"r{r} = {expr}")
        for o, r in enumerate(block.outputs):
            step = " + j" if n_in + o in streamed else ""
            w(indent, f"out{o}[np.uintp(b_out{o}{step})] = r{r}")

    # A parallel launch's part is unsigned: mixed with int64 sizes, numba would make every
    # index below a float64 (converted back at each element, not vectorized).
    w(1, "part = np.int64(part)")
    if not outer:
        # One group: the part's slice of it is one loop nest. Nested in a loop over chunks,
        # the same body compiled to 93 instructions a vector instead of 52 (LLVM reloaded
        # each of an erf's constants from the constant pool, two instructions each, where
        # one loop keeps them in stack slots): a GELU over 16M floats took 28 ms, not 19.
        for name in names:
            w(1, f"b_{name} = 0")
        w(1, f"lo = {inner} * part // parts")
        w(1, f"hi = {inner} * (part + 1) // parts")
        if not (prefetch and streamed):
            w(1, "for j in range(lo, hi):")
            body(2)
            return
        # The slice runs in runs of PREFETCH_RUN elements, each first asking for the lines
        # its streamed arrays will reach PREFETCH_BYTES ahead (module doc), then a tail.
        w(1, f"runs = (hi - lo) // {PREFETCH_RUN}")
        w(1, "for run in range(runs):")
        w(2, f"at = lo + run * {PREFETCH_RUN}")
        for k in streamed:
            ask = "prefetch_read" if k < n_in else "prefetch_write"
            size = dtypes[k].itemsize
            for line in range(0, max(1, PREFETCH_RUN * size // CACHE_LINE_BYTES)):
                ahead = (PREFETCH_BYTES + line * CACHE_LINE_BYTES) // size
                w(2, f"{ask}({names[k]}, np.uintp(b_{names[k]} + at + {ahead}))")
        w(2, f"for i in range({PREFETCH_RUN}):")
        w(3, "j = at + i")
        body(3)
        w(1, f"for j in range(lo + runs * {PREFETCH_RUN}, hi):")
        body(2)
        return
    w(1, f"nchunk = ({inner} + chunk - 1) // chunk")
    w(1, f"tasks = {' * '.join([*outer, 'nchunk'])}")
    w(1, "for task in range(tasks * part // parts, tasks * (part + 1) // parts):")
    w(2, "row = task // nchunk")
    w(2, "start = (task - row * nchunk) * chunk")
    w(2, f"stop = min(start + chunk, {inner})")
    _positions(lay, w, 2, "row", names)
    # Not in runs here: on a row's chunk, a bias's add and a column's product took 5-15%
    # longer with the prefetches, a GELU of a sum with a bias 0-15% less.
    w(2, "for j in range(start, stop):")
    body(3)


_LONG_OPS = frozenset({"erf", "exp", "log", "tanh", "sigmoid", "div", "div_scalar", "sqrt",
                       "rsqrt", "recip", "pow", "pow_scalar", "log1p", "expm1", "sin", "cos",
                       "atan2", "remainder", "remainder_scalar"})  # fmt: skip
"""Ops whose values take a kernel many instructions (or a long-latency one) to compute."""


def early_scalings(block: ir.Block) -> dict[int, tuple[int, int, int]]:
    """Products of a float register and a power-of-two scaling whose scaling a kernel
    applies to the factor ready first: ``{product register: (ready, late, the scaling's
    register)}``, the product then computed as ``(ready * scale) * late``.

    A GELU ends ``(x * (erf(x / sqrt 2) + 1)) * 0.5``, or as ember's ``gelu`` writes it
    ``x * ((erf(...) + 1) * 0.5)``. At one thread its loop waits on that chain more than on
    its count of operations: scaling ``x`` instead, off the chain, took the kernel over 16M
    float32 from 9.2-9.5 to 8.0-8.2 ms on a Zen 4 (fewer operations on a shorter chain did
    not always win: Estrin's scheme for erf's pieces was slower). Scaling by ``2**k``
    commutes with rounding, so the value is the same but where a product on the way
    overflows or lands below the normal range (the same kind of difference as the
    multiply-adds that ``contract`` makes). Which scalar is a power of two is part of the
    block's key (``ir.attr_tag``); a product counts when its other factor, or the scaled
    one, is read by nothing else and is not an output, and is later to compute (by
    :data:`_LONG_OPS`)."""
    if block.axis is not None:
        return {}
    n_in = len(block.inputs)
    reads: dict[int, int] = {}
    for instr in block.body:
        for a in instr.args:
            reads[a] = reads.get(a, 0) + 1
    depth = [0] * n_in
    for instr in block.body:
        cost = 8 if instr.op in _LONG_OPS else 1
        depth.append(cost + max([depth[a] for a in instr.args], default=0))

    def inner(r: int, op: str) -> ir.Instr | None:
        """The instruction of ``r`` where it is an ``op`` whose value only one reads."""
        if r < n_in or reads.get(r) != 1 or r in block.outputs:
            return None
        instr = block.body[r - n_in]
        return instr if instr.op == op else None

    def scaled(instr: ir.Instr) -> bool:
        return ir.attr_tag("mul_scalar", instr.attrs[0]) == ir.POWER_OF_TWO

    found = {}
    for k, instr in enumerate(block.body):
        r = n_in + k
        if instr.dtype not in (DType.F32, DType.F64):
            continue
        if instr.op == "mul_scalar" and scaled(instr):  # (a * b) * 2**k
            product = inner(instr.args[0], "mul")
            if product is not None:
                a, b = product.args
                ready, late = (a, b) if depth[a] <= depth[b] else (b, a)
                if depth[ready] < depth[late]:
                    found[r] = (ready, late, r)
        elif instr.op == "mul":  # a * (b * 2**k)
            for ready, other in (instr.args, instr.args[::-1]):
                scaling = inner(other, "mul_scalar")
                if scaling is not None and scaled(scaling):
                    late = scaling.args[0]
                    if depth[ready] < depth[late]:
                        found[r] = (ready, late, other)
                        break
    return found


_MAX_CALL_ARGS = 24
"""Helpers taking more parameters than this take them as one tuple (see ``helper`` in
:func:`_reduction`)."""

FLOAT32_MOMENTS_MAX = 4096
"""The longest axis whose variance's shifted sums a kernel first tries in float32 (longer
ones, and float64 operands, sum in float64): the vectorized loop's float32 partial sums
then add at most a few hundred terms each."""
FLOAT32_MOMENTS_SHIFT = 16
"""Values along the axis whose mean shifts float32 moments (near the mean, so that the
sum of squares does not cancel; see :func:`_reduction`)."""

LANES = 256
"""Positions after the axis that a reduction kernel over a non-last axis carries side by
side: its accumulators are arrays of this length (they stay in L1) and its inner loop walks
them contiguously, so it vectorizes where a walk along the axis would stride."""


def variance_pairs(block: ir.Block) -> dict[int, tuple[int, int]]:
    """The registers ``v = mean_dim or sum_dim of (x - m) * (x - m)`` with ``m =
    mean_dim(x)`` (floats of one dtype), as ``{v: (m, x)}``: the kernel computes such a
    ``v`` in the pass of ``m``, from shifted sums (see :func:`_reduction`)."""
    n_in = len(block.inputs)

    def instr(r: int) -> ir.Instr | None:
        return block.body[r - n_in] if r >= n_in else None

    pairs = {}
    for k, v in enumerate(block.body):
        if v.op not in ("mean_dim", "sum_dim") or not v.dtype.is_float or ir.is_total(v, block.axis):
            continue
        sq = instr(v.args[0])
        if sq is None or sq.op != "mul" or sq.args[0] != sq.args[1]:
            continue
        d = instr(sq.args[0])
        if d is None or d.op != "sub":
            continue
        x, m = d.args
        mean = instr(m)
        if mean is None or mean.op != "mean_dim" or mean.args != (x,):
            continue
        same = len({v.dtype, sq.dtype, d.dtype, mean.dtype, block.register_dtype(x)}) == 1
        if same and block.register_shape(x)[block.axis] != 1:
            pairs[n_in + k] = (m, x)
    return pairs


def _reduction(block: ir.Block, lay: Layout, w: _Writer, params: list[str]) -> None:
    """A kernel with reductions along ``block.axis`` (see the module doc).

    Row mode (the axis is the last group): a task per position outside the axis, registers
    constant along the axis are scalars. Lane mode (groups follow the axis): the last group
    is cut into :data:`LANES`-wide chunks, a task per (other position x chunk); each loop along the axis walks the chunk innermost, and registers
    constant along the axis (accumulators included) are arrays over the chunk.

    Totals (``ir.is_total``, row mode only): a task is a position outside the axis and the
    totals' dim, whose positions along that dim it runs in order, adding each total's
    operand along the axis into an accumulator row of its dtype (``tot{o}``) in its final
    loop; the row is written after the last of them. No two tasks share a total's element,
    so the parts need no lock, and each element's sum adds the same values in the same
    order and precision as NumPy's sum over that dim (which adds rows in order): it
    overflows where NumPy's does.
    """
    n_in = len(block.inputs)
    n_regs = n_in + len(block.body)
    axis = block.axis
    inner = lay.inner
    lanes = inner != len(lay.groups) - 1
    last = len(lay.groups) - 1
    totals = {n_in + k: i.attrs[0] for k, i in enumerate(block.body) if ir.is_total(i, axis)}
    if totals and (lanes or len(set(totals.values())) != 1):
        raise KernelUnsupported("numba runtime: totals of a block in lane mode, or of two dims")
    varies = [block.register_shape(r)[axis] != 1 for r in range(n_regs)]
    instr_of = {n_in + k: instr for k, instr in enumerate(block.body)}
    pairs = variance_pairs(block)
    shifted = {m: x for m, x in pairs.values()}
    # A register's stage: the number of passes that must run before it is known. A variance
    # of ``pairs`` is known in the pass of its mean.
    stage = [0] * n_regs
    for k, instr in enumerate(block.body):
        r = n_in + k
        before = max((stage[a] for a in instr.args), default=0)
        stage[r] = before + 1 if instr.op in ir.REDUCTIONS and r not in totals else before
        if r in pairs:
            stage[r] = stage[pairs[r][0]]
    passes = max(stage, default=0)
    scalar_names: dict[int, list[str]] = {}
    counter = _scalar_counter()
    for k, instr in enumerate(block.body):
        scalar_names[n_in + k] = [counter() for a in instr.attrs if ir.is_scalar(instr, a)]

    def name(r: int) -> str:
        """A register at a call site: a lane array's element in lane mode."""
        return f"rb{r}[jj]" if lanes and r >= n_in and not varies[r] else f"r{r}"

    def closure(targets: list[int], stop: frozenset[int] = frozenset()) -> list[int]:
        """The axis-varying non-input registers ``targets`` need, in body order (those in
        ``stop`` are read from memory instead)."""
        need: set[int] = set()
        todo = list(targets)
        while todo:
            r = todo.pop()
            if r in need or r < n_in or not varies[r] or r in stop:
                continue
            need.add(r)
            todo.extend(instr_of[r].args)
        return sorted(need)

    helpers: list[str] = []

    def helper(fname: str, regs: list[int], results: list[str]) -> str:
        """A helper evaluating ``regs`` (in order) from the registers they read; returns the
        call expression and records the definition."""
        defined = set(regs)
        reads = sorted({a for r in regs for a in instr_of[r].args if a not in defined})
        scalars = [s for r in regs for s in scalar_names[r]]
        taken = [*(f"r{a}" for a in reads), *scalars, "err"]
        passed = [*(name(a) for a in reads), *scalars, "err"]
        hw = _Writer()
        hw(0, "@numba.njit(inline='always', error_model='numpy')")
        if len(taken) > _MAX_CALL_ARGS:
            # CPython compiles a call of more arguments as a call with *args, which numba
            # cannot inline: the arguments travel as one tuple instead.
            hw(0, f"def {fname}(packed):")
            hw(1, f"{', '.join(taken)}, = packed")
            passed = [f"({', '.join(passed)},)"]
        else:
            hw(0, f"def {fname}({', '.join(taken)}):")
        for r in regs:
            names = iter(scalar_names[r])
            expr = _instr_expr(block, instr_of[r], lambda a: f"r{a}", names.__next__)
            hw(1, f"r{r} = {expr}")
        hw(1, f"return ({', '.join(results)},)")
        text = "\n".join(hw.lines)
        if text not in helpers:  # the same walk written for two lengths of the axis
            helpers.append(text)
        return f"{fname}({', '.join(passed)})"

    names = [f"in{i}" for i in range(n_in)] + [f"out{o}" for o in range(len(block.outputs))]
    body: list[str] = []  # the kernel's loop body, written after the helpers
    kw = _Writer(body)
    top = 3 if totals else 2  # the indent of the per-position code

    def index(array: str, along: str | None) -> str:
        idx = f"b_{array}"
        if along is not None:
            idx += f" + {along} * st_{array}_{inner}"
        if lanes:
            idx += f" + j * st_{array}_{last}"
        return f"np.uintp({idx})"

    def load(indent: int, regs, along: str | None) -> None:
        """Loads the inputs among ``regs``: those varying along the axis at ``along``."""
        for i in sorted(regs):
            if i < n_in and (varies[i] == (along is not None) or lanes):
                at = along if varies[i] else None
                kw(indent, f"r{i} = in{i}[{index(f'in{i}', at)}]")

    def per_lane(indent: int) -> int:
        """Opens the loop over the chunk's lanes in lane mode; the indent inside."""
        if not lanes:
            return indent
        kw(indent, "for jj in range(width):")
        kw(indent + 1, "j = start + jj")
        return indent + 1

    def reads_of(regs: list[int], extra: set[int]) -> set[int]:
        return {a for r in regs for a in instr_of[r].args} | extra

    def outer_stage(s: int) -> None:
        """Registers constant along the axis that become known at stage ``s``, and the
        outputs among them."""
        regs = [r for r in range(n_in, n_regs) if not varies[r] and stage[r] == s
                and instr_of[r].op not in ir.REDUCTIONS]  # fmt: skip
        outs = [(o, r) for o, r in enumerate(block.outputs) if not varies[r] and stage[r] == s]
        if not regs and not outs:
            return
        ind = per_lane(top)
        if regs:
            if lanes:
                load(ind, reads_of(regs, set()), None)
            call = helper(f"outer{s}", regs, [f"r{r}" for r in regs])
            kw(ind, f"{', '.join(name(r) for r in regs)}, = {call}")
        for o, r in outs:
            if r < n_in:
                load(ind, {r}, None)
            kw(ind, f"out{o}[{index(f'out{o}', None)}] = {name(r)}")

    def values(indent: int, operands: list[int], results: list[str], hname: str,
               along: str, stop: frozenset[int] = frozenset()) -> None:  # fmt: skip
        """Evaluates ``operands`` at ``along`` into the names ``results``."""
        need = closure(operands, stop)
        load(indent, reads_of(need, set(operands)), along)
        computed = [(res, a) for res, a in zip(results, operands) if a in need]
        if computed:
            call = helper(hname, need, [f"r{a}" for _, a in computed])
            kw(indent, f"{', '.join(res for res, _ in computed)}, = {call}")
        for res, a in zip(results, operands):
            if a not in need:
                kw(indent, f"{res} = {name(a)}")

    def acc(r: int, part: str = "acc") -> str:
        return f"{part}{r}[jj]" if lanes else f"{part}{r}"

    if not lanes:
        load(top, range(n_in), None)
    else:
        regs = [r for r in range(n_in, n_regs) if not varies[r]]
        for r in regs:
            if instr_of[r].op in ir.REDUCTIONS and r not in pairs and r not in shifted:
                ctor, _ = _acc_init(instr_of[r], block)
                kw(top, f"acc{r} = np.empty(width, {ctor})")
            kw(top, f"rb{r} = np.empty(width, {numpy_ctor(block.register_dtype(r))})")
        for m in shifted:
            for part in ("sh", "s1_", "s2_"):
                kw(top, f"{part}{m} = np.empty(width, np.float64)")
    finals = [(o, r) for o, r in enumerate(block.outputs) if varies[r]]
    stash = _stash(block, [(o, r) for o, r in finals if r not in totals], stage, passes, pairs,
                   closure)  # fmt: skip
    outer_stage(0)

    def shift64(indent: int, means: list[int], evaluated: list[int], hname: str) -> None:
        """The shift of ``means``' float64 shifted sums: the first element along the axis (0
        when it is not finite, which then makes the mean and variance NaN or infinite as
        NumPy's), the operands of ``evaluated`` (reductions) computed there."""
        for r in means:
            kw(indent, f"{acc(r, 'sh')} = np.float64(0)")
        kw(indent, f"if n{inner} > 0:")
        values(indent + 1, [instr_of[r].args[0] for r in evaluated],
               [f"v{r}" for r in evaluated], hname, "0")  # fmt: skip
        for r in means:
            kw(indent + 1, f"t{r} = np.float64(v{r})")
            kw(indent + 1, f"{acc(r, 'sh')} = t{r} if abs(t{r}) < np.inf else np.float64(0)")

    def step64(indent: int, r: int) -> None:
        """Adds ``v{r}`` into the float64 shifted sums of the mean ``r``."""
        kw(indent, f"d{r} = np.float64(v{r}) - {acc(r, 'sh')}")
        kw(indent, f"{acc(r, 's1_')} += d{r}")
        kw(indent, f"{acc(r, 's2_')} += d{r} * d{r}")

    def walk(p: int, reds: list[int], operands: list[int], base: int, fast: list[int]) -> None:
        """Pass ``p``'s walk along the axis at indent ``base``: its reductions, the shifted
        sums of ``shifted`` means (those of ``fast`` in float32, see below) and the stash."""
        slow = [r for r in reds if r in shifted and r not in fast]
        if slow:
            shift64(per_lane(base), slow, reds, f"first{p}")
        if fast:
            # The shift of float32 shifted sums: the mean of the first values along the axis.
            for r in fast:
                kw(base, f"msum{r} = np.float32(0)")
            kw(base, f"mhead = min(n{inner}, {FLOAT32_MOMENTS_SHIFT})")
            kw(base, "for k in range(mhead):")
            values(base + 1, [instr_of[r].args[0] for r in fast], [f"v{r}" for r in fast],
                   f"head{p}", "k")  # fmt: skip
            for r in fast:
                kw(base + 1, f"msum{r} += v{r}")
            for r in fast:
                kw(base, f"mshift{r} = np.float32(msum{r} / np.float32(max(mhead, 1)))")
        ind = per_lane(base)
        for r in reds:
            if r in fast:
                kw(ind, f"m1_{r} = np.float32(0)")
                kw(ind, f"m2_{r} = np.float32(0)")
            elif r in shifted:
                kw(ind, f"{acc(r, 's1_')} = np.float64(0)")
                kw(ind, f"{acc(r, 's2_')} = np.float64(0)")
            else:
                ctor, value = _acc_init(instr_of[r], block)
                kw(ind, f"{acc(r)} = {ctor}({value})")
        kw(base, f"for k in range(n{inner}):")
        ind = per_lane(base + 1)
        values(ind, operands, [f"v{r}" for r in reds], f"pass{p}", "k")
        if p == passes:
            for e, o in stash.items():
                red = next(r for r, a in zip(reds, operands) if a == e)
                kw(ind, f"out{o}[{index(f'out{o}', 'k')}] = v{red}")
        for r in reds:
            if r in fast:
                kw(ind, f"md{r} = np.float32(v{r} - mshift{r})")
                kw(ind, f"m1_{r} += md{r}")
                kw(ind, f"m2_{r} += md{r} * md{r}")
            elif r in shifted:
                step64(ind, r)
            else:
                kw(ind, _acc_step(instr_of[r], acc(r), f"v{r}", block))
        for r in fast:
            # Kept where the shift was near the mean (no cancellation to speak of) and the
            # sum of squares in float32's comfortable range; else the float64 walk.
            n = f"np.float32(n{inner})"
            kw(base, f"if (m2_{r} < np.float32(2.0 ** 100) and m2_{r} >= np.float32(2.0 ** -96) * {n}"
                     f" and m1_{r} * m1_{r} <= np.float32(0.25) * {n} * m2_{r}):")  # fmt: skip
            kw(base + 1, f"sh{r} = np.float64(mshift{r})")
            kw(base + 1, f"s1_{r} = np.float64(m1_{r})")
            kw(base + 1, f"s2_{r} = np.float64(m2_{r})")
            kw(base, "else:")
            shift64(base + 1, [r], [r], f"again{p}r{r}")
            kw(base + 1, f"s1_{r} = np.float64(0)")
            kw(base + 1, f"s2_{r} = np.float64(0)")
            kw(base + 1, f"for k in range(n{inner}):")
            values(base + 2, [instr_of[r].args[0]], [f"v{r}"], f"again{p}r{r}", "k")
            step64(base + 2, r)

    for p in range(1, passes + 1):
        reds = [r for r in range(n_in, n_regs) if stage[r] == p
                and instr_of[r].op in ir.REDUCTIONS and r not in pairs and r not in totals]  # fmt: skip
        operands = [instr_of[r].args[0] for r in reds]
        fast = [r for r in reds if r in shifted and not lanes
                and block.register_dtype(instr_of[r].args[0]) is DType.F32]  # fmt: skip
        if fast:  # float32 moments on axes short enough for float32's partial sums
            kw(top, f"if n{inner} <= {FLOAT32_MOMENTS_MAX}:")
            walk(p, reds, operands, top + 1, fast)
            kw(top, "else:")
            walk(p, reds, operands, top + 1, [])
        else:
            walk(p, reds, operands, top, [])
        ind = per_lane(top)
        for r in reds:
            if r in shifted:
                kw(ind, f"{name(r)} = {_shifted_mean(r, block, lay, lanes)}")
                for v, (m, _) in pairs.items():
                    if m == r:
                        kw(ind, f"{name(v)} = {_shifted_variance(v, m, block, lay, lanes)}")
            else:
                kw(ind, f"{name(r)} = {_acc_final(instr_of[r], acc(r), block, lay)}")
        outer_stage(p)
    # An output that holds its own stashed value was written by the last pass: the final
    # loop leaves it be (a gradient and the sum of it over the batch: one pass fewer).
    finals = [(o, r) for o, r in finals if stash.get(r) != o]
    if finals:
        # A total's operand is computed here, then added into the total's row.
        sources = [instr_of[r].args[0] if r in totals else r for _, r in finals]
        need = closure(sources, frozenset(stash))
        read = {a for r in need for a in instr_of[r].args} | set(sources)
        kw(top, f"for k in range(n{inner}):")
        ind = per_lane(top + 1)
        for e, o in stash.items():
            if e in read:
                kw(ind, f"r{e} = out{o}[{index(f'out{o}', 'k')}]")
        values(ind, sources, [f"f{o}" for o, _ in finals], "final", "k",
               frozenset(stash))  # fmt: skip
        for o, r in finals:
            if r in totals:
                kw(ind, f"tot{o}[k] += f{o}")
            else:
                kw(ind, f"out{o}[{index(f'out{o}', 'k')}] = f{o}")

    for h in helpers:
        w(0, "")
        w(0, "")
        w.lines.extend(h.split("\n"))
    w(0, "")
    w(0, "")
    w(
        0,
        f"@numba.njit(nogil=True, fastmath={_flags(REDUCTION_FLAGS)}, error_model='numpy', cache=True)",
    )
    w(0, f"def span({', '.join(params)}):")
    _strides(lay, w, names)
    skip = (inner, last) if lanes else (inner,)
    outer = [f"n{g}" for g in range(len(lay.groups)) if g not in skip]
    if lanes:
        w(1, f"nchunk = (n{last} + {LANES} - 1) // {LANES}")
        w(1, f"tasks = {' * '.join([*outer, 'nchunk'])}")
        w(1, "for task in range(tasks * part // parts, tasks * (part + 1) // parts):")
        w(2, "pos = task // nchunk")
        w(2, f"start = (task - pos * nchunk) * {LANES}")
        w(2, f"width = min(start + {LANES}, n{last}) - start")
    elif totals:
        _total_tasks(block, lay, w, names, totals, body, index)
        return
    else:
        w(1, f"tasks = {' * '.join(outer) if outer else '1'}")
        w(1, "for pos in range(tasks * part // parts, tasks * (part + 1) // parts):")
    _positions(lay, w, 2, "pos", names, skip)
    w.lines.extend(body)


def _total_tasks(block: ir.Block, lay: Layout, w: _Writer, names: list[str], totals: dict,
                 body: list[str], index) -> None:  # fmt: skip
    """The task loop of a row-mode kernel with totals (see :func:`_reduction`): ``body``
    runs at each position along the totals' dim ``d`` of a task's position outside it."""
    (d,) = set(totals.values())
    gd = next((g for g, dims in enumerate(lay.groups) if dims == (d,)), None)
    if gd is None:
        raise KernelUnsupported(f"numba runtime: a total's dim {d} shares a loop with another")
    inner = lay.inner
    outer = [g for g in range(len(lay.groups)) if g != inner]
    outs = [o for o, r in enumerate(block.outputs) if r in totals]
    types = {o: numpy_ctor(block.register_dtype(block.outputs[o])) for o in outs}
    for o in outs:
        w(1, f"tot{o} = np.empty(n{inner}, {types[o]})")
    w(1, f"after = {' * '.join(f'n{g}' for g in outer if g > gd) or '1'}")
    w(1, f"tasks = {' * '.join(f'n{g}' for g in outer if g != gd) or '1'}")
    w(1, "for task in range(tasks * part // parts, tasks * (part + 1) // parts):")
    w(2, "head = task // after")
    w(2, "tail = task - head * after")
    # The totals' bases, the same at every position along d (their stride there is 0).
    w(2, f"pos = head * n{gd} * after + tail")
    _positions(lay, w, 2, "pos", names, (inner,))
    w(2, f"for k in range(n{inner}):")
    for o in outs:
        w(3, f"tot{o}[k] = {types[o]}(0)")
    w(2, f"for along in range(n{gd}):")
    w(3, f"pos = (head * n{gd} + along) * after + tail")
    _positions(lay, w, 3, "pos", names, (inner,))
    w.lines.extend(body)
    w(2, f"for k in range(n{inner}):")
    for o in outs:
        w(3, f"out{o}[{index(f'out{o}', 'k')}] = tot{o}[k]")


def _stash(block: ir.Block, finals, stage, passes: int, pairs, closure) -> dict[int, int]:
    """Operands of the last pass's reductions that the final loop would compute again
    (softmax: exp(x - max)), each mapped to an output of the block's shape and of its dtype
    whose array holds them in between: the last pass stores them there, the final loop
    reads them back instead of recomputing. Only for outputs that do not alias an input
    (the runtime sees to it)."""
    n_in = len(block.inputs)
    operands = [i.args[0] for k, i in enumerate(block.body)
                if i.op in ir.REDUCTIONS and stage[n_in + k] == passes
                and n_in + k not in pairs and not ir.is_total(i, block.axis)]  # fmt: skip
    stash: dict[int, int] = {}
    for o, r in finals:
        if block.register_shape(r) != block.shape:
            continue
        need = closure([r])
        for e in operands:
            fits = (e >= n_in and e not in stash and e in need and block.register_shape(e)
                    == block.shape and block.register_dtype(e) == block.register_dtype(r))  # fmt: skip
            if fits:
                stash[e] = o
                break
    return stash


def _acc_init(instr: ir.Instr, block: ir.Block) -> tuple[str, str]:
    """The accumulator's NumPy type and its starting value."""
    d = block.register_dtype(instr.args[0])
    op = instr.op
    if op in ("sum_dim", "mean_dim"):
        if d.is_float:
            return numpy_ctor(d), "0"
        if op == "mean_dim":
            return "np.float64", "0"
        return ("np.uint64", "0") if d.is_unsigned else ("np.int64", "0")
    if op == "prod_dim":
        if d.is_float:
            return numpy_ctor(d), "1"
        return ("np.uint64", "1") if d.is_unsigned else ("np.int64", "1")
    t = numpy_ctor(d)
    if d.is_float:  # an order key (see numba_math): the opposite end of the key's range
        t = "np.int32" if d is DType.F32 else "np.int64"
    return t, f"np.iinfo({t}).min" if op == "max_dim" else f"np.iinfo({t}).max"


def _acc_step(instr: ir.Instr, a: str, v: str, block: ir.Block) -> str:
    """Folds the value ``v`` into the accumulator ``a``."""
    op = instr.op
    d = block.register_dtype(instr.args[0])
    if op == "sum_dim" or op == "mean_dim":
        return f"{a} += {v}"
    if op == "prod_dim":
        return f"{a} *= {v}"
    cmp = ">" if op == "max_dim" else "<"
    if d.is_float:
        key = f"order_key_{d.value}({v}, {_nan_key(op, d)})"
        return f"{a} = max({a}, {key})" if op == "max_dim" else f"{a} = min({a}, {key})"
    return f"{a} = {v} if {v} {cmp} {a} else {a}"


def _nan_key(op: str, d: DType) -> str:
    """The order key NaN maps to: the one that wins the reduction, as NaN does in NumPy."""
    bits = "int32" if d is DType.F32 else "int64"
    return f"np.iinfo(np.{bits}).max" if op == "max_dim" else f"np.iinfo(np.{bits}).min"


def _acc_final(instr: ir.Instr, a: str, block: ir.Block, lay: Layout) -> str:
    """The reduction's value from its accumulator ``a``."""
    d = instr.dtype
    t = numpy_ctor(d)
    if instr.op == "mean_dim":
        if d.is_float:
            return f"{t}({a} / {t}(n{lay.inner}))"
        return _cast(f"({a} / n{lay.inner})", DType.F64, d)
    if instr.op in ("max_dim", "min_dim") and d.is_float:
        return f"from_order_key_{d.value}({a}, {_nan_key(instr.op, d)})"
    return f"{t}({a})"


# Shifted sums: with a shift sh, s1 = sum(x - sh) and s2 = sum((x - sh)**2) give mean = sh
# + s1 / n and sum((x - mean)**2) = s2 - s1**2 / n, whose rounding error scales with
# ((mean - sh)**2 / variance) ulps of the sums: with sh a sample of the data, a large mean
# (1e4 + N(0, 1)) does not cancel away the variance, as plain sums of squares in float32
# would. In float32 the kernel keeps them only where s1**2 <= n s2 / 4 (the shift, the
# first values' mean, within half a standard deviation or so of the mean: a factor under
# 4/3), else sums again in float64 from the first element, where any shift holds.
def _shifted_mean(m: int, block: ir.Block, lay: Layout, lanes: bool) -> str:
    t = numpy_ctor(block.register_dtype(m))
    j = "[jj]" if lanes else ""
    return f"{t}(sh{m}{j} + s1_{m}{j} / n{lay.inner})"


def _shifted_variance(v: int, m: int, block: ir.Block, lay: Layout, lanes: bool) -> str:
    t = numpy_ctor(block.register_dtype(v))
    j = "[jj]" if lanes else ""
    n = f"n{lay.inner}"
    ss = f"variance_sum(s1_{m}{j}, s2_{m}{j}, {n})"
    mean = block.body[v - len(block.inputs)].op == "mean_dim"
    return f"{t}({ss} / {n})" if mean else f"{t}({ss})"
