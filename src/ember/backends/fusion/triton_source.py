"""Python source of a Triton kernel for an ``ir.Block`` (the GPU runtime's generator).

The generated module holds one ``@triton.jit`` ``kernel`` and the small math helpers of
:data:`HEADER`; its layout follows from ``Block.key()`` (and :func:`generate`'s ``wide``)
only, never from sizes, so one compiled kernel serves every size of a block's pattern.

* **One rule table.** Each IR op maps to one expression template in :data:`RULES`,
  with the operand kinds it takes. An op (or a dtype) without a rule makes the whole block
  unsupported (:class:`KernelUnsupported`, an ``UnsupportedError``): the executor then
  runs its records unfused, never a block computed wrongly.
* **Canonical dims** are those of the numba generator (``numba_source.layout``): dims
  where every array is 1 are dropped, neighbours broadcast alike are merged. Arrays arrive
  C-contiguous; an array's element stride in a group is the product of the later groups
  it is not broadcast in, computed in the kernel from the group sizes (its arguments), 0
  where it is broadcast (so a broadcast group costs no index arithmetic at all).
* **Element-wise blocks**: program ``p`` computes linear positions ``p * BLOCK ..``
  of the block's shape (masked at the end), decomposes them into group indices (no
  division at all when nothing is broadcast), loads, computes, stores.
* **Reductions** over ``Block.axis``: one program per position outside the axis, which
  walks the axis in ``BLOCK``-long chunks once per pass its reductions need (a register's
  pass is one more than the passes its operand needs, as in ``numba_source``: softmax
  is a max pass, a sum pass, and a final loop that stores). Accumulators are ``BLOCK``-wide
  vectors folded with ``tl.reduce`` after the loop; masked lanes add
  the reduction's neutral element. Registers constant along the axis are scalars of the
  program, computed once after the pass that makes them known. A variance is an ordinary
  second pass over ``(x - mean)**2`` (the numba generator's shifted single-pass sums save
  a walk on the CPU; on the GPU the row is in cache).
* **Scalars** are kernel arguments annotated with the dtype of the instruction's tensor
  operand (so a float64 scalar is not rounded to float32 at launch) and widened with
  ``tl.full((), s, dtype)``, which keeps them exact under the interpreter too.
* **Half precision** (float16, bfloat16) registers are computed in float32 and rounded to
  their dtype after every instruction, as the unfused ops round each result.
* **Only builtins.** Kernels call ``tl`` builtins and the helpers of :data:`HEADER`,
  never Triton's standard library of jit functions (``tl.sum``, ``tl.zeros``,
  ``tl.cdiv``): those are decorated when triton is imported, so under an interpreter
  turned on later (as the tests do) they would be compiled functions that cannot run.
* **Math** uses only ``tl`` builtins that both the compiler and Triton's interpreter have
  (``exp``, ``log``, ``sqrt``, ``erf``, ``sin``, ``cos``, ``floor``, ``ceil``,
  ``exp2``, ``log2``; ``div_rn`` and ``sqrt_rn`` for float32, whose plain forms are
  approximations on a GPU); ``tanh``, ``log1p``, ``expm1``, ``round`` and ``pow``
  are written with them in :data:`HEADER` (CUDA's libdevice is not there under the
  interpreter, and the tests must run the code the GPU runs). Float32 results match the
  unfused ops within a few ulp (``tl.exp``/``tl.log`` are the hardware approximations on
  a GPU: relative 1e-6 is the tests' tolerance); ops with no accurate form here (``sinh``,
  ``cosh``, the inverse trigonometric functions, ``atan2``, ``remainder``, integer ``div``
  and ``pow``, shifts) have no rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.backend.errors import UnsupportedError
from ember.backends.fusion import ir
from ember.backends.fusion.numba_source import Layout, layout
from ember.tensor.dtype import DType

TL_DTYPES = {
    DType.F64: "tl.float64", DType.F32: "tl.float32", DType.F16: "tl.float16",
    DType.BF16: "tl.bfloat16", DType.I64: "tl.int64", DType.I32: "tl.int32",
    DType.I16: "tl.int16", DType.I8: "tl.int8", DType.U8: "tl.uint8", DType.BOOL: "tl.int1",
}  # fmt: skip
"""Dtypes a kernel takes (torch has no arithmetic for uint16/32/64: their blocks run unfused)."""

_HALF = (DType.F16, DType.BF16)


class KernelUnsupported(UnsupportedError):
    """The Triton runtime cannot compile this block (an op or dtype without a rule): run its
    ops unfused instead."""


def compute_type(d: DType) -> str:
    """The Triton type a register of dtype ``d`` is computed in (float32 for half types)."""
    return "tl.float32" if d in _HALF else TL_DTYPES[d]


# ---------------------------------------------------------------------- the rule table
@dataclass(frozen=True)
class Rule:
    """An op's expression: ``template`` formatted with its operands ``x``, ``y``, ``z``
    and the compute type ``t`` of its first operand; ``kinds`` the operand dtypes it takes
    (``"float"``, ``"int"``: signed or unsigned integers, ``"bool"``)."""

    template: str
    kinds: frozenset[str] = frozenset({"float", "int", "bool"})


_F, _I, _B = frozenset({"float"}), frozenset({"int"}), frozenset({"bool"})
_NUM = frozenset({"float", "int"})

# Each op of the IR, once. Results are cast to the instruction's compute type afterwards.
RULES: dict[str, Rule] = {
    "add": Rule("{x} + {y}", _NUM), "sub": Rule("{x} - {y}", _NUM),
    "mul": Rule("{x} * {y}", _NUM), "div": Rule("_div({x}, {y})", _F),
    "pow": Rule("_pow({x}, {y})", _F),
    # NaN wins, as NumPy's maximum/minimum (and clip) have it.
    "max_pair": Rule("tl.where(({x} > {y}) | ({x} != {x}), {x}, {y})", _NUM),
    "min_pair": Rule("tl.where(({x} < {y}) | ({x} != {x}), {x}, {y})", _NUM),
    "bitwise_and": Rule("{x} & {y}", _I), "bitwise_or": Rule("{x} | {y}", _I),
    "bitwise_xor": Rule("{x} ^ {y}", _I), "bitwise_not": Rule("~{x}", _I),
    "and": Rule("{x} & {y}", _B), "or": Rule("{x} | {y}", _B), "xor": Rule("{x} ^ {y}", _B),
    "not": Rule("{x} == 0", _B),
    "equal": Rule("{x} == {y}"), "not_equal": Rule("{x} != {y}"),
    "greater": Rule("{x} > {y}", _NUM), "greater_equal": Rule("{x} >= {y}", _NUM),
    "lower": Rule("{x} < {y}", _NUM), "lower_equal": Rule("{x} <= {y}", _NUM),
    "neg": Rule("-{x}", _NUM), "abs": Rule("tl.abs({x})", _NUM),
    "sign": Rule("tl.where({x} != {x}, {x}, tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0)))", _NUM),
    "exp": Rule("tl.exp({x})", _F), "log": Rule("tl.log({x})", _F),
    "log1p": Rule("_log1p({x})", _F), "expm1": Rule("_expm1({x})", _F),
    "erf": Rule("tl.math.erf({x})", _F), "sqrt": Rule("_sqrt({x})", _F),
    "rsqrt": Rule("_div(tl.full((), 1.0, {t}), _sqrt({x}))", _F),
    "recip": Rule("_div(tl.full((), 1.0, {t}), {x})", _F),
    "sin": Rule("tl.sin({x})", _F), "cos": Rule("tl.cos({x})", _F),
    "tan": Rule("_div(tl.sin({x}), tl.cos({x}))", _F),
    "tanh": Rule("_tanh({x})", _F), "sigmoid": Rule("_sigmoid({x})", _F),
    "floor": Rule("tl.floor({x})", _F), "ceil": Rule("tl.ceil({x})", _F),
    "trunc": Rule("tl.where({x} < 0, tl.ceil({x}), tl.floor({x}))", _F),
    "round": Rule("_rint({x})", _F),
    "is_nan": Rule("{x} != {x}", _F), "is_inf": Rule("tl.abs({x}) == INF", _F),
    "mask_where": Rule("tl.where({y}, {z}, {x})"),
    "mask_fill": Rule("tl.where({y}, {s}, {x})"),
}  # fmt: skip

# A scalar op is its binary op with the scalar as second operand.
SCALAR_OPS = ("add", "sub", "mul", "div", "pow", "max_pair", "min_pair", "bitwise_and",
              "bitwise_or", "bitwise_xor")  # fmt: skip
COMPARES = ("equal", "not_equal", "greater", "greater_equal", "lower", "lower_equal")

HEADER = '''\
# Generated by ember.backends.fusion.triton_source: do not edit.
# key: {key}
import triton
import triton.language as tl

# Globals a kernel reads must be constexpr objects: the compiler refuses an annotated plain
# float (Triton's interpreter does not). No NaN global: the compiler checks that a global
# keeps its value between kernels by equality, which NaN fails; NaN is written INF - INF.
INF = tl.constexpr(float("inf"))
NINF = tl.constexpr(float("-inf"))


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _add_(a, b):
    return a + b


@triton.jit
def _max_(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min_(a, b):
    return tl.minimum(a, b)


# The combines of tl.sum, tl.max and tl.min where this triton has them: its interpreter
# reduces with NumPy for those, and calls any other combine once per element.
_add = getattr(tl.standard, "_sum_combine", _add_)
_max = getattr(tl.standard, "_elementwise_max", _max_)
_min = getattr(tl.standard, "_elementwise_min", _min_)


@triton.jit
def _div(x, y):
    # Correctly rounded: float32 "/" is an approximation on the GPU; float64's is exact.
    if x.dtype == tl.float32:
        return tl.div_rn(x, y.to(tl.float32))
    else:
        return x / y


@triton.jit
def _sqrt(x):
    if x.dtype == tl.float32:
        return tl.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@triton.jit
def _sigmoid(x):
    return _div(tl.full((), 1.0, x.dtype), 1.0 + tl.exp(-x))


@triton.jit
def _log1p(x):
    # Goldberg: log(u) * x / (u - 1) cancels the rounding of u = 1 + x.
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0, x, tl.where(u == INF, u, tl.log(u) * _div(x, tl.where(d == 0, 1.0, d))))


@triton.jit
def _expm1(x):
    # Kahan: (u - 1) * x / log(u) cancels the rounding of u = exp(x).
    u = tl.exp(x)
    d = u - 1.0
    lu = tl.log(u)
    r = tl.where(d == 0, x, tl.where(d == -1.0, d, d * _div(x, tl.where(lu == 0, 1.0, lu))))
    return tl.where(u == INF, u, r)


@triton.jit
def _tanh(x):
    # From expm1, which does not cancel near 0: tanh|x| = -e / (2 + e), e = expm1(-2|x|).
    e = _expm1(-2.0 * tl.abs(x))
    t = _div(-e, 2.0 + e)
    return tl.where(x != x, x, tl.where(x < 0, -t, t))


@triton.jit
def _rint(x):
    # Round half to even, as NumPy's round: the fraction is exact.
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(odd, f + 1.0, f)))


@triton.jit
def _pow(x, y):
    # In float64: exp2(y * log2|x|) with the signs and special values of C's pow.
    # (Selections by nested where, not "&" of comparisons: Triton's interpreter cannot
    # combine a block's comparison with a scalar's.)
    xd = x.to(tl.float64)
    yd = y.to(tl.float64)
    r = tl.exp2(yd * tl.log2(tl.abs(xd)))
    yi = tl.floor(yd)
    whole = yi == yd
    odd = tl.where(tl.abs(yd) != INF, yi - 2.0 * tl.floor(yi * 0.5), 0.0) != 0
    negative = tl.where(xd == 0, _div(tl.full((), 1.0, tl.float64), xd) < 0, xd < 0)  # -0 too
    # A negative base and a fractional exponent: no real power (but for -0 and -inf).
    fraction = tl.where(tl.abs(xd) == INF, r, tl.where(xd == 0, r, INF - INF))
    r = tl.where(negative, tl.where(whole, tl.where(odd, -r, r), fraction), r)
    r = tl.where(tl.abs(yd) == INF, tl.where(xd == -1.0, 1.0, r), r)
    r = tl.where(yd == 0, 1.0, tl.where(xd == 1.0, 1.0, r))
    return r
'''


def check(block: ir.Block) -> None:
    """Raises KernelUnsupported when the block has a dtype or op without a rule."""
    for r in range(len(block.inputs) + len(block.body)):
        if block.register_dtype(r) not in TL_DTYPES:
            raise KernelUnsupported(
                f"triton runtime: dtype {block.register_dtype(r)} is not supported (register {r})"
            )
    if block.axis is None and any(i.op in ir.REDUCTIONS for i in block.body):
        raise KernelUnsupported("triton runtime: a reduction in a block without an axis")
    for instr in block.body:
        if ir.is_total(instr, block.axis):
            raise KernelUnsupported("triton runtime: a total (a sum over another dim than the axis)")
        if instr.op in ir.REDUCTIONS:
            continue
        rule = _rule(instr.op)
        if rule is None:
            raise KernelUnsupported(f"triton runtime: op {instr.op!r} has no rule")
        if instr.args and instr.op not in ("cast", "mask_where", "mask_fill", "clamp"):
            kind = _kind(block.register_dtype(instr.args[0]))
            if kind not in rule.kinds:
                raise KernelUnsupported(f"triton runtime: op {instr.op!r} on {kind} operands "
                                        "has no rule")  # fmt: skip


def _kind(d: DType) -> str:
    return "bool" if d is DType.BOOL else "float" if d.is_float else "int"


def _rule(op: str) -> Rule | None:
    if op in RULES:
        return RULES[op]
    if op in ("cast", "clamp"):
        return Rule("", frozenset({"float", "int", "bool"}))
    if op.endswith("_scalar") and op[: -len("_scalar")] in SCALAR_OPS:
        return RULES[op[: -len("_scalar")]]
    if op.endswith("_elem") and op[: -len("_elem")] in COMPARES:
        return RULES[op[: -len("_elem")]]
    return None


def scalar_dtypes(block: ir.Block) -> list[DType]:
    """The dtype of each scalar argument: that of its instruction's tensor operand."""
    return [block.register_dtype(i.args[0]) for i in block.body for a in i.attrs
            if ir.is_scalar(i, a)]  # fmt: skip


def instr_expr(block: ir.Block, instr: ir.Instr, reg, scalar) -> str:
    """Source of one non-reduction instruction's value in its compute type; ``reg(r)``
    names a register, ``scalar()`` the next scalar argument."""
    op = instr.op
    args = [reg(a) for a in instr.args]
    src = block.register_dtype(instr.args[0]) if instr.args else instr.dtype
    t = compute_type(src)
    out = compute_type(instr.dtype)
    if op == "cast":
        if instr.dtype is DType.BOOL:
            expr = f"({args[0]} != 0)"
        else:
            expr = f"{args[0]}.to({out})"
    elif op == "clamp":
        expr = args[0]
        low, high = instr.attrs
        if low is not None:
            expr = RULES["max_pair"].template.format(x=f"({expr})", y=scalar())
        if high is not None:
            expr = RULES["min_pair"].template.format(x=f"({expr})", y=scalar())
    elif op == "mask_fill":
        expr = RULES[op].template.format(x=args[0], y=args[1], s=scalar())
    else:
        rule = _rule(op)
        operands = dict(zip("xyz", args))
        if op.endswith(("_scalar", "_elem")):
            operands["y"] = scalar()
        expr = rule.template.format(t=t, **operands)
    expr = f"({expr}).to({out})"
    if instr.dtype in _HALF:  # the unfused op rounds its result to the half type
        expr = f"{expr}.to({TL_DTYPES[instr.dtype]}).to(tl.float32)"
    return expr


# ---------------------------------------------------------------------- the module
class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)


def scalar_param(k: int, d: DType) -> str:
    """Scalar parameter ``k`` of dtype ``d``, annotated so the launch keeps its value; the
    kernel body narrows it (``tl.full``). int8 goes in as int32: Triton 3.6's launcher reads
    an int8 argument as an unsigned byte and refuses a negative one."""
    return f"s{k}: {'tl.int32' if d == DType.I8 else TL_DTYPES[d]}"


def _signature(block: ir.Block, lay: Layout) -> tuple[list[str], list[str]]:
    """The kernel's parameters (with scalar annotations) and the array names."""
    names = ([f"in{i}" for i in range(len(block.inputs))]
             + [f"out{o}" for o in range(len(block.outputs))])  # fmt: skip
    scalars = [scalar_param(k, d) for k, d in enumerate(scalar_dtypes(block))]
    sizes = [f"n{g}" for g in range(len(lay.groups))]
    return [*names, *scalars, *sizes, "total", "BLOCK: tl.constexpr"], names


def generate(block: ir.Block, wide: bool = False) -> str:
    """The source of a module whose ``kernel`` computes ``block``.

    ``kernel[grid](*inputs, *outputs, *scalars, *group_sizes, total, BLOCK=...)`` over
    C-contiguous tensors; ``total`` is the element count (element-wise) or the number of
    positions outside the axis (reductions: the grid); the group sizes are those of
    ``numba_source.layout``. ``wide`` computes indices in int64 (a block of 2**31 or more
    elements). Raises KernelUnsupported for a block without rules.
    """
    check(block)
    lay = layout(block)
    w = _Writer()
    w.lines.extend(HEADER.format(key=repr((block.key(), wide))).rstrip("\n").split("\n"))
    params, names = _signature(block, lay)
    w(0, "")
    w(0, "")
    w(0, "@triton.jit")
    w(0, f"def kernel({', '.join(params)}):")
    for k, d in enumerate(scalar_dtypes(block)):
        w(1, f"s{k} = tl.full((), s{k}, {compute_type(d)})")
    _strides(lay, w, names)
    if block.axis is None:
        _elementwise(block, lay, w, names, wide)
    else:
        _reduction(block, lay, w, names, wide)
    return "\n".join(w.lines) + "\n"


def _strides(lay: Layout, w: _Writer, names: list[str]) -> None:
    """Element strides of each array in each group it is not broadcast in."""
    for a, name in enumerate(names):
        flags = lay.broadcast[a]
        for g in range(len(lay.groups)):
            if not flags[g]:
                later = [f"n{h}" for h in range(g + 1, len(lay.groups)) if not flags[h]]
                w(1, f"st_{name}_{g} = {' * '.join(later) if later else '1'}")


def _offsets(lay: Layout, w: _Writer, indent: int, var: str, names: list[str],
             groups: list[int], suffix: str = "") -> None:  # fmt: skip
    """Decomposes ``var`` over ``groups`` (the last fastest) and writes each array's offset
    ``o_<name><suffix>`` from the group indices."""
    if not groups:
        for name in names:
            w(indent, f"o_{name}{suffix} = 0")
        return
    rest = var
    for pos, g in enumerate(reversed(groups)):
        if pos == len(groups) - 1:
            w(indent, f"i{g} = {rest}")
        else:
            w(indent, f"i{g} = {rest} % n{g}")
            w(indent, f"q{g} = {rest} // n{g}")
            rest = f"q{g}"
    for a, name in enumerate(names):
        terms = [f"i{g} * st_{name}_{g}" for g in groups if not lay.broadcast[a][g]]
        w(indent, f"o_{name}{suffix} = {' + '.join(terms) if terms else '0'}")


def _elementwise(block: ir.Block, lay: Layout, w: _Writer, names: list[str], wide: bool) -> None:
    n_in = len(block.inputs)
    pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    w(1, f"idx = {pid} * BLOCK + tl.arange(0, BLOCK)")
    w(1, "mask = idx < total")
    _offsets(lay, w, 1, "idx", names, list(range(len(lay.groups))))
    for i, spec in enumerate(block.inputs):
        at = f"o_in{i}" if _moves(lay, i) else "tl.full([BLOCK], 0, tl.int32)"  # a block of pointers
        load = f"tl.load(in{i} + {at}, mask=mask, other=0)"
        w(1, f"r{i} = {_widen(load, spec.dtype)}")
    scalar = _counter()
    for k, instr in enumerate(block.body):
        w(1, f"r{n_in + k} = {instr_expr(block, instr, lambda r: f'r{r}', scalar)}")
    for o, r in enumerate(block.outputs):
        value = _narrow(f"r{r}", block.register_dtype(r))
        at = f"o_out{o}" if _moves(lay, n_in + o) else "tl.full([BLOCK], 0, tl.int32)"
        w(1, f"tl.store(out{o} + {at}, {value}, mask=mask)")


def _moves(lay: Layout, array: int) -> bool:
    """Whether an array's offset depends on the position (it is not broadcast everywhere)."""
    return not all(lay.broadcast[array])


def _widen(load: str, d: DType) -> str:
    return f"{load}.to(tl.float32)" if d in _HALF else load


def _narrow(value: str, d: DType) -> str:
    return f"{value}.to({TL_DTYPES[d]})" if d in _HALF else value


def _counter():
    count = iter(range(1 << 30))
    return lambda: f"s{next(count)}"


def _acc(instr: ir.Instr, src: DType) -> tuple[str, str]:
    """The accumulator's Triton type and neutral element (a Triton expression)."""
    op = instr.op
    if op == "mean_dim" and not src.is_float:
        return "tl.float64", "0.0"
    if src.is_float:
        t = "tl.float64" if src is DType.F64 else "tl.float32"
        neutral = {"sum_dim": "0.0", "mean_dim": "0.0", "prod_dim": "1.0",
                   "max_dim": "NINF", "min_dim": "INF"}[op]  # fmt: skip
        return t, neutral
    if op in ("sum_dim", "prod_dim"):
        t = "tl.uint64" if src is DType.U8 else "tl.int64"
        return t, "0" if op == "sum_dim" else "1"
    t = TL_DTYPES[src]
    if src is DType.BOOL:
        return t, "0" if op == "max_dim" else "1"
    # the lowest (max) or highest (min) value of the integer type, from its bit pattern
    return t, f"tl.full((), {_int_extreme(src, op == 'min_dim')}, {t})"


def _int_extreme(d: DType, high: bool) -> int:
    bits = {DType.I64: 64, DType.I32: 32, DType.I16: 16, DType.I8: 8, DType.U8: 8}[d]
    if d is DType.U8:
        return (1 << bits) - 1 if high else 0
    return (1 << (bits - 1)) - 1 if high else -(1 << (bits - 1))


def _reduction(block: ir.Block, lay: Layout, w: _Writer, names: list[str], wide: bool) -> None:
    """A kernel with reductions along ``block.axis`` (see the module doc)."""
    n_in = len(block.inputs)
    n_regs = n_in + len(block.body)
    axis, inner = block.axis, lay.inner
    varies = [block.register_shape(r)[axis] != 1 for r in range(n_regs)]
    instr_of = {n_in + k: instr for k, instr in enumerate(block.body)}
    # A reduction of a value of length 1 along the axis (a softmax over an axis of 1) is
    # that value: computed as a constant of the program, in no pass.
    trivial = {n_in + k for k, i in enumerate(block.body)
               if i.op in ir.REDUCTIONS and not varies[i.args[0]]}  # fmt: skip
    stage = [0] * n_regs
    for k, instr in enumerate(block.body):
        r = n_in + k
        before = max((stage[a] for a in instr.args), default=0)
        stage[r] = before + 1 if instr.op in ir.REDUCTIONS and r not in trivial else before
    passes = max(stage, default=0)
    scalar_names: dict[int, list[str]] = {}
    counter = _counter()
    for k, instr in enumerate(block.body):
        scalar_names[n_in + k] = [counter() for a in instr.attrs if ir.is_scalar(instr, a)]

    def closure(targets: list[int]) -> list[int]:
        """The axis-varying body registers ``targets`` need, in body order."""
        need: set[int] = set()
        todo = list(targets)
        while todo:
            r = todo.pop()
            if r in need or r < n_in or not varies[r]:
                continue
            need.add(r)
            todo.extend(instr_of[r].args)
        return sorted(need)

    def emit(indent: int, regs: list[int], reg) -> None:
        for r in regs:
            instr = instr_of[r]
            if r in trivial:
                w(indent, f"{reg(r)} = ({reg(instr.args[0])}).to({compute_type(instr.dtype)})")
                continue
            names_ = iter(scalar_names[r])
            w(indent, f"{reg(r)} = {instr_expr(block, instr, reg, names_.__next__)}")

    pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    w(1, f"row = {pid}")
    outer = [g for g in range(len(lay.groups)) if g != inner]
    _offsets(lay, w, 1, "row", names, outer)
    w(1, f"cols = tl.arange(0, BLOCK){'.to(tl.int64)' if wide else ''}")
    # Inputs constant along the axis: one value per program.
    for i, spec in enumerate(block.inputs):
        if not varies[i]:
            w(1, f"r{i} = {_widen(f'tl.load(in{i} + o_in{i})', spec.dtype)}")

    def loop(tag: str, targets: list[int]) -> dict[int, str]:
        """Opens a loop over the axis computing ``targets``; names of the values."""
        w(1, f"for start in range(0, n{inner}, BLOCK):")
        w(2, "k = start + cols")
        w(2, f"m = k < n{inner}")
        need = closure(targets)

        def reg(r: int) -> str:
            return f"{tag}{r}" if varies[r] else f"r{r}"

        reads = {a for r in need for a in instr_of[r].args} | set(targets)
        for i in sorted(reads):
            if i < n_in and varies[i]:
                along = f" + k * st_in{i}_{inner}" if not lay.broadcast[i][inner] else ""
                load = f"tl.load(in{i} + o_in{i}{along}, mask=m, other=0)"
                w(2, f"{tag}{i} = {_widen(load, block.inputs[i].dtype)}")
        emit(2, need, reg)
        return {r: reg(r) for r in targets}

    def constants(s: int) -> None:
        """Registers constant along the axis known at stage ``s``, and their outputs."""
        regs = [r for r in range(n_in, n_regs) if not varies[r] and stage[r] == s
                and (instr_of[r].op not in ir.REDUCTIONS or r in trivial)]  # fmt: skip
        emit(1, regs, lambda r: f"r{r}")
        for o, r in enumerate(block.outputs):
            if not varies[r] and stage[r] == s:
                d = block.register_dtype(r)
                w(1, f"tl.store(out{o} + o_out{o}, {_narrow(f'r{r}', d)})")

    constants(0)
    for p in range(1, passes + 1):
        reds = [r for r in range(n_in, n_regs) if stage[r] == p
                and instr_of[r].op in ir.REDUCTIONS and r not in trivial]  # fmt: skip
        if not reds:
            constants(p)
            continue
        for r in reds:
            t, neutral = _acc(instr_of[r], block.register_dtype(instr_of[r].args[0]))
            w(1, f"acc{r} = tl.full([BLOCK], {neutral}, {t})")
            if _nan_tracked(instr_of[r], block):
                w(1, f"nan{r} = tl.full([BLOCK], 0, tl.int32)")
        values = loop(f"p{p}_", [instr_of[r].args[0] for r in reds])
        for r in reds:
            instr = instr_of[r]
            t, neutral = _acc(instr, block.register_dtype(instr.args[0]))
            v = f"tl.where(m, {values[instr.args[0]]}.to({t}), {neutral})"
            if instr.op in ("sum_dim", "mean_dim"):
                w(2, f"acc{r} += {v}")
            elif instr.op == "prod_dim":
                w(2, f"acc{r} = acc{r} * {v}")
            else:
                fn = "tl.maximum" if instr.op == "max_dim" else "tl.minimum"
                w(2, f"acc{r} = {fn}(acc{r}, {v})")
                if _nan_tracked(instr, block):
                    x = values[instr.args[0]]
                    w(2, f"nan{r} = nan{r} | (m & ({x} != {x})).to(tl.int32)")
        for r in reds:
            w(1, f"r{r} = {_final(instr_of[r], block, r, inner)}")
        constants(p)
    finals = [(o, r) for o, r in enumerate(block.outputs) if varies[r]]
    if finals:
        values = loop("f_", [r for _, r in finals])
        for o, r in finals:
            along = (f" + k * st_out{o}_{inner}"
                     if not lay.broadcast[n_in + o][inner] else "")  # fmt: skip
            value = _narrow(values[r], block.register_dtype(r))
            w(2, f"tl.store(out{o} + o_out{o}{along}, {value}, mask=m)")


def _nan_tracked(instr: ir.Instr, block: ir.Block) -> bool:
    """Whether a max/min reduction tracks NaN (which wins it, as in NumPy)."""
    return instr.op in ("max_dim", "min_dim") and block.register_dtype(instr.args[0]).is_float


def _final(instr: ir.Instr, block: ir.Block, r: int, inner: int) -> str:
    """A reduction's value (in its compute type) from its accumulator."""
    op = instr.op
    out = compute_type(instr.dtype)
    if op in ("sum_dim", "mean_dim"):
        value = f"tl.reduce(acc{r}, 0, _add)"
        if op == "mean_dim":
            value = f"({value} / n{inner})"
    elif op == "prod_dim":
        value = f"tl.reduce(acc{r}, 0, _mul)"
    else:
        value = f"tl.reduce(acc{r}, 0, {'_max' if op == 'max_dim' else '_min'})"
        if _nan_tracked(instr, block):
            value = f"tl.where(tl.reduce(nan{r}, 0, _max) > 0, INF - INF, {value})"
    value = f"({value}).to({out})"
    if instr.dtype in _HALF:
        value = f"{value}.to({TL_DTYPES[instr.dtype]}).to(tl.float32)"
    return value
