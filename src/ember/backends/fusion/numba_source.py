"""Python source of a numba kernel for an ``ir.Block``.

The generated module holds one ``kernel`` and, for blocks with reductions, small helper
functions. Its layout follows from ``Block.key()`` only, never from sizes:

* **Canonical dims.** Dims where every array the kernel touches (inputs and outputs) is 1
  are dropped; neighbours where every array is broadcast alike merge into one group. An
  element-wise block iterates its groups as ``prange`` over (outer positions x chunks of
  the last group) with a plain inner loop over the chunk; a block with reductions iterates
  ``prange`` over the positions outside ``Block.axis`` and runs its passes along the axis.
* **Arrays** arrive flattened and C-contiguous, indexed with unsigned ints (a signed index
  costs a negative-index check per access that stops LLVM from vectorizing); an array's element stride in a group is 0
  where it is broadcast, so the index of every array is ``base + j * stride`` with the
  inner stride known at compile time (0 or 1 for element-wise blocks: vectorizable).
* **Passes.** A reduction is computed in pass ``1 + (passes its operand needs)``; each
  pass recomputes along the axis the element-wise registers its reductions read (softmax:
  pass 1 max, pass 2 sum of exp(x - max), final loop the quotient). Registers constant
  along the axis are computed once per position, after the pass that makes them available.
* **Flags.** Element-wise kernels are compiled with FMA contraction only (NaN, infinities
  and signed zeros as NumPy has them). Reduction kernels add ``reassoc``, which their sums
  need to vectorize: their float results may differ from NumPy's by the order of rounding
  (the approximations of ``numba_math`` stay exact under it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.backend.errors import UnsupportedError
from ember.backends.fusion import ir
from ember.tensor.dtype import DType

SUPPORTED = frozenset({DType.F64, DType.F32, DType.I64, DType.I32, DType.I16, DType.I8,
                       DType.U64, DType.U32, DType.U16, DType.U8, DType.BOOL})  # fmt: skip
_CTOR = {d: f"np.{'bool_' if d is DType.BOOL else d.name.replace('F', 'float').replace('I', 'int').replace('U', 'uint').lower()}" for d in SUPPORTED}  # fmt: skip
_BITS = {DType.I64: 64, DType.I32: 32, DType.I16: 16, DType.I8: 8,
         DType.U64: 64, DType.U32: 32, DType.U16: 16, DType.U8: 8}  # fmt: skip

ELEMENTWISE_FLAGS = {"contract"}
REDUCTION_FLAGS = {"contract", "reassoc"}


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
    if op == "rsqrt":
        return f"({t}(1) / {t}(math.sqrt({x})))"
    if op == "recip":
        return f"({t}(1) / {x})"
    if op == "is_nan":
        return f"({x} != {x})"
    if op == "is_inf":
        return f"(abs({x}) == np.inf)"
    if op == "bitwise_not":
        return f"{t}(~{x})"
    if op == "not":
        return f"(not {x})"
    raise KernelUnsupported(f"numba runtime: op {op!r} is not supported")


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
    return _unary(op, args[0], t, src)


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
# key: {key}
import math

import numba
import numpy as np
from numba import prange

from ember.backends.fusion.numba_math import (
    fast_erf_f32, fast_exp_f32, fast_log_f32, fast_sigmoid_f32, fast_tanh_f32, frem, idiv,
    from_order_key_f32, from_order_key_f64, ipow, irem, order_key_f32, order_key_f64, rint, shl,
    shr, udiv, upow, urem, ushr)

"""


@dataclass
class _Writer:
    lines: list[str] = field(default_factory=list)

    def __call__(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)


def generate(block: ir.Block) -> str:
    """The source of a module whose ``kernel`` computes ``block`` (see the module doc).

    ``kernel(*inputs, *outputs, *scalars, *sizes, chunk, err)``: flat C-contiguous arrays,
    the scalars cast to :func:`scalar_dtypes`, the size of each group of :func:`layout`,
    the inner chunk length (element-wise blocks) and a 1-element int64 array the kernel
    sets to 1 when NumPy would have raised (an int raised to a negative power).
    """
    check(block)
    lay = layout(block)
    w = _Writer()
    w(0, _HEADER.format(key=repr(block.key())).rstrip("\n"))
    n_in, n_out, n_sc = len(block.inputs), len(block.outputs), len(block.scalars())
    params = ([f"in{i}" for i in range(n_in)] + [f"out{o}" for o in range(n_out)]
              + [f"s{s}" for s in range(n_sc)] + [f"n{g}" for g in range(len(lay.groups))]
              + ["chunk", "err"])  # fmt: skip
    if block.axis is None:
        _elementwise(block, lay, w, params)
    else:
        _reduction(block, lay, w, params)
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


def _positions(lay: Layout, w: _Writer, indent: int, var: str, names: list[str]) -> None:
    """Decomposes the outer position ``var`` into group indices and array bases."""
    outer = [g for g in range(len(lay.groups)) if g != lay.inner]
    rest = var  # fresh names at each step: numba refuses writes to a prange index's alias
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


def _elementwise(block: ir.Block, lay: Layout, w: _Writer, params: list[str]) -> None:
    names = [f"in{i}" for i in range(len(block.inputs))] + [
        f"out{o}" for o in range(len(block.outputs))
    ]
    w(
        0,
        f"@numba.njit(parallel=True, fastmath={_flags(ELEMENTWISE_FLAGS)}, error_model='numpy', cache=True)",
    )
    w(0, f"def kernel({', '.join(params)}):")
    _strides(lay, w, names)
    outer = [f"n{g}" for g in range(len(lay.groups)) if g != lay.inner]
    inner = f"n{lay.inner}" if lay.groups else "1"
    w(1, f"nchunk = ({inner} + chunk - 1) // chunk")
    w(1, f"tasks = {' * '.join([*outer, 'nchunk'])}")
    w(1, "for task in prange(tasks):")
    w(2, "row = task // nchunk")
    w(2, "start = (task - row * nchunk) * chunk")
    w(2, f"stop = min(start + chunk, {inner})")
    _positions(lay, w, 2, "row", names)
    w(2, "for j in range(start, stop):")
    scalar = _scalar_counter()
    n_in = len(block.inputs)
    for i in range(n_in):
        step = "" if not lay.groups or lay.broadcast[i][lay.inner] else " + j"
        w(3, f"r{i} = in{i}[np.uintp(b_in{i}{step})]")
    for k, instr in enumerate(block.body):
        w(3, f"r{n_in + k} = {_instr_expr(block, instr, lambda r: f'r{r}', scalar)}")
    for o, r in enumerate(block.outputs):
        step = "" if not lay.groups or lay.broadcast[n_in + o][lay.inner] else " + j"
        w(3, f"out{o}[np.uintp(b_out{o}{step})] = r{r}")


def _reduction(block: ir.Block, lay: Layout, w: _Writer, params: list[str]) -> None:
    n_in = len(block.inputs)
    n_regs = n_in + len(block.body)
    axis = block.axis
    varies = [block.register_shape(r)[axis] != 1 for r in range(n_regs)]
    # A register's stage: the number of passes that must run before it is known.
    stage = [0] * n_regs
    for k, instr in enumerate(block.body):
        before = max((stage[a] for a in instr.args), default=0)
        stage[n_in + k] = before + 1 if instr.op in ir.REDUCTIONS else before
    passes = max(stage, default=0)
    instr_of = {n_in + k: instr for k, instr in enumerate(block.body)}
    scalar_names: dict[int, list[str]] = {}
    counter = _scalar_counter()
    for k, instr in enumerate(block.body):
        scalar_names[n_in + k] = [counter() for a in instr.attrs if ir.is_scalar(instr, a)]

    def closure(targets: list[int]) -> list[int]:
        """The axis-varying non-input registers ``targets`` need, in body order."""
        need: set[int] = set()
        todo = list(targets)
        while todo:
            r = todo.pop()
            if r in need or r < n_in or not varies[r]:
                continue
            need.add(r)
            todo.extend(instr_of[r].args)
        return sorted(need)

    helpers: list[str] = []

    def helper(name: str, regs: list[int], results: list[str]) -> str:
        """A helper evaluating ``regs`` (in order) from the registers they read; returns the
        call expression and records the definition."""
        defined = set(regs)
        reads = sorted({a for r in regs for a in instr_of[r].args if a not in defined})
        scalars = [s for r in regs for s in scalar_names[r]]
        args = [f"r{a}" for a in reads] + scalars
        hw = _Writer()
        hw(0, "@numba.njit(inline='always', error_model='numpy')")
        hw(0, f"def {name}({', '.join([*args, 'err'])}):")
        for r in regs:
            names = iter(scalar_names[r])
            expr = _instr_expr(block, instr_of[r], lambda a: f"r{a}", names.__next__)
            hw(1, f"r{r} = {expr}")
        hw(1, f"return ({', '.join(results)},)")
        helpers.append("\n".join(hw.lines))
        return f"{name}({', '.join([*args, 'err'])})"

    names = [f"in{i}" for i in range(n_in)] + [f"out{o}" for o in range(len(block.outputs))]
    body: list[str] = []  # the kernel's loop body, written after the helpers
    kw = _Writer(body)

    def load(indent: int, regs, along: bool) -> None:
        for i in regs:
            if i < n_in and varies[i] == along:
                idx = f"b_in{i} + k * st_in{i}_{lay.inner}" if along else f"b_in{i}"
                kw(indent, f"r{i} = in{i}[np.uintp({idx})]")

    def outer_stage(s: int) -> None:
        """Registers constant along the axis that become known at stage ``s``, and the
        outputs among them."""
        regs = [r for r in range(n_in, n_regs) if not varies[r] and stage[r] == s
                and instr_of[r].op not in ir.REDUCTIONS]  # fmt: skip
        if regs:
            call = helper(f"outer{s}", regs, [f"r{r}" for r in regs])
            kw(2, f"{', '.join(f'r{r}' for r in regs)}, = {call}")
        for o, r in enumerate(block.outputs):
            if not varies[r] and stage[r] == s:
                kw(2, f"out{o}[np.uintp(b_out{o})] = r{r}")

    load(2, range(n_in), along=False)
    outer_stage(0)
    for p in range(1, passes + 1):
        reds = [r for r in range(n_in, n_regs) if stage[r] == p and instr_of[r].op in ir.REDUCTIONS]
        operands = [instr_of[r].args[0] for r in reds]
        for r in reds:
            kw(2, f"acc{r} = {_acc_init(instr_of[r], block)}")
        kw(2, f"for k in range(n{lay.inner}):")
        need = closure(operands)
        load(3, sorted({a for r in need for a in instr_of[r].args} | set(operands)), along=True)
        if need:
            call = helper(f"pass{p}", need, [f"r{a}" for a in operands])
            kw(3, f"{', '.join(f'v{r}' for r in reds)}, = {call}")
        else:
            for r, a in zip(reds, operands):
                kw(3, f"v{r} = r{a}")
        for r in reds:
            kw(3, _acc_step(instr_of[r], r, block))
        for r in reds:
            kw(2, f"r{r} = {_acc_final(instr_of[r], r, block, lay)}")
        outer_stage(p)
    finals = [(o, r) for o, r in enumerate(block.outputs) if varies[r]]
    if finals:
        kw(2, f"for k in range(n{lay.inner}):")
        need = closure([r for _, r in finals])
        load(3, sorted({a for r in need for a in instr_of[r].args} | {r for _, r in finals}),
             along=True)  # fmt: skip
        if need:
            call = helper("final", need, [f"r{r}" for _, r in finals])
            kw(3, f"{', '.join(f'f{o}' for o, _ in finals)}, = {call}")
        else:
            for o, r in finals:
                kw(3, f"f{o} = r{r}")
        for o, _ in finals:
            kw(3, f"out{o}[np.uintp(b_out{o} + k * st_out{o}_{lay.inner})] = f{o}")

    for h in helpers:
        w(0, "")
        w(0, "")
        w.lines.extend(h.split("\n"))
    w(0, "")
    w(0, "")
    w(
        0,
        f"@numba.njit(parallel=True, fastmath={_flags(REDUCTION_FLAGS)}, error_model='numpy', cache=True)",
    )
    w(0, f"def kernel({', '.join(params)}):")
    _strides(lay, w, names)
    outer = [f"n{g}" for g in range(len(lay.groups)) if g != lay.inner]
    w(1, f"for pos in prange({' * '.join(outer) if outer else '1'}):")
    _positions(lay, w, 2, "pos", names)
    w.lines.extend(body)


def _acc_init(instr: ir.Instr, block: ir.Block) -> str:
    d = block.register_dtype(instr.args[0])
    op = instr.op
    if op in ("sum_dim", "mean_dim"):
        if d.is_float:
            return f"{numpy_ctor(d)}(0)"
        return (
            "np.uint64(0)"
            if d.is_unsigned and op == "sum_dim"
            else ("np.int64(0)" if op == "sum_dim" else "np.float64(0)")
        )
    if op == "prod_dim":
        if d.is_float:
            return f"{numpy_ctor(d)}(1)"
        return "np.uint64(1)" if d.is_unsigned else "np.int64(1)"
    t = numpy_ctor(d)
    if d.is_float:  # an order key (see numba_math): the opposite end of the key's range
        bits = "int32" if d is DType.F32 else "int64"
        return f"np.iinfo(np.{bits}).min" if op == "max_dim" else f"np.iinfo(np.{bits}).max"
    return f"np.iinfo({t}).min" if op == "max_dim" else f"np.iinfo({t}).max"


def _acc_step(instr: ir.Instr, r: int, block: ir.Block) -> str:
    op, a, v = instr.op, f"acc{r}", f"v{r}"
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


def _acc_final(instr: ir.Instr, r: int, block: ir.Block, lay: Layout) -> str:
    d = instr.dtype
    t = numpy_ctor(d)
    if instr.op == "mean_dim":
        if d.is_float:
            return f"{t}(acc{r} / {t}(n{lay.inner}))"
        return _cast(f"(acc{r} / n{lay.inner})", DType.F64, d)
    if instr.op in ("max_dim", "min_dim") and d.is_float:
        return f"from_order_key_{d.value}(acc{r}, {_nan_key(instr.op, d)})"
    return f"{t}(acc{r})"
