"""Math ops: casts, powers and remainders, variadic Max/Min/Sum/Mean, Clip, rounding,
trigonometric and hyperbolic functions, and Bernoulli sampling.

The helpers :func:`number`, :func:`scalar_literal`, :func:`scalar_operand` and
:func:`legacy_rhs` are shared with the ``logic`` and ``activation`` families.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.ir import ember_dtype, onnx_type_name, require_onnx
from ember.onnx.registry import converter
from ember.tensor import DType
from ember.tensor.data import numpy_dtype

# Opset 1 to 5 nodes carry ``consumed_inputs``, a memory hint with no effect on results.
_LEGACY = ("consumed_inputs",)
_EMBER_DTYPES = ", ".join(d.value for d in DType)


def number(value: Any) -> str:
    """A Python literal for an attribute's number; float32 values print in their shortest
    form (``0.2``, not ``0.20000000298023224``), which rounds back to the same float32."""
    if isinstance(value, float) and np.isfinite(value) and float(np.float32(value)) == value:
        value = float(str(np.float32(value)))
    return literal(value)


def scalar_literal(value: Value, other: Value) -> str | None:
    """``value`` as a literal when it is a one-element constant whose broadcast against
    ``other`` changes no shape (so ``x.pow(2.0)`` needs no field); None otherwise."""
    const = value.const
    if const is None or const.size != 1:
        return None
    if const.ndim and (other.rank is None or const.ndim > other.rank):
        return None
    return _const_literal(const)


def _const_literal(const: np.ndarray) -> str:
    """A one-element constant as a Python literal (a float32 in its shortest form)."""
    item = const.reshape(()).item()
    return number(item) if const.dtype == np.float32 else literal(item)


def scalar_operand(value: Value, other: Value) -> str:
    """The expression of ``value``: its :func:`scalar_literal` if it has one."""
    return scalar_literal(value, other) or value.expr


def legacy_rhs(node: NodeContext) -> str:
    """Input 1 of a binary op before opset 7, where it broadcasts (``broadcast=1``) against
    input 0 with its first dim at ``axis`` of input 0 (trailing dims when no axis)."""
    a, b = node.input(0), node.input(1)
    if not node.attr("broadcast", 0) or "axis" not in node.attrs:
        return b.expr
    if a.rank is None or b.rank is None:
        node.unsupported("broadcast with an axis needs the ranks of both inputs; run ONNX "
                         "shape inference or give the inputs static ranks")
    trailing = a.rank - int(node.attrs["axis"]) % max(a.rank, 1) - b.rank
    if trailing <= 0:
        return b.expr
    return f"rt.unsqueeze({b.expr}, {list(range(b.rank, b.rank + trailing))})"


def dtype_attr(node: NodeContext, name: str) -> DType | None:
    """The ember dtype an ONNX type attribute names (an element type code, or before Cast-6
    its name such as ``"FLOAT"``); None when the attribute is absent."""
    code = node.attr(name, None)
    if code is None:
        return None
    if isinstance(code, str):
        try:
            code = require_onnx().TensorProto.DataType.Value(code.upper())
        except ValueError:
            node.unsupported(f"attribute {name!r} names no ONNX type: {code!r}")
    dtype = ember_dtype(int(code))
    if dtype is None:
        node.unsupported(f"the type {onnx_type_name(int(code))} has no ember dtype (ember has "
                         f"{_EMBER_DTYPES}); strings and complex types are not supported")
    return dtype


def float8_max(dtype: DType) -> float:
    """The largest finite value of a low-precision float dtype (448 for f8e4m3fn)."""
    return float(ml_dtypes.finfo(numpy_dtype(dtype)).max)


def cast_expr(node: NodeContext, x: Value, target: DType, target_expr: str) -> str:
    """``x`` cast to ``target``, honouring ``saturate`` for low-precision float targets: with
    it (the default) values beyond the finite range, infinities included, become the largest
    finite value of their sign; without it they become what the type has for overflow (inf
    for f8e5m2, NaN for the others). f8e8m0fnu follows ``round_mode`` (see
    :func:`ember.onnx.runtime.float8_e8m0`)."""
    cast = f"{x.expr}.cast({target_expr})"
    if not (target.is_float and target.is_low_precision):
        return cast
    if target is DType.F8E8M0FNU:
        round_mode = node.attr("round_mode", "up")
        if round_mode not in ("up", "down", "nearest"):
            node.unsupported(f"round_mode {round_mode!r} is not one of 'up', 'down', 'nearest'")
        saturate = bool(node.attr("saturate", 1))
        return f"rt.float8_e8m0({x.expr}, {round_mode!r}, {saturate})"
    if not node.attr("saturate", 1) or x.dtype is DType.BOOL:
        return cast
    top = literal(float8_max(target))
    if x.dtype is None:
        return (f'({x.expr}.cast("f32").clamp(-{top}, {top}).cast({target_expr}) '
                f"if {x.expr}.dtype.is_float or {x.expr}.dtype.is_int else {cast})")
    source = x.expr
    if x.dtype.is_int or x.dtype.is_low_precision:
        source = f'{source}.cast("f32")'  # exact for every int the clamp keeps, and for float8
    return f"{source}.clamp(-{top}, {top}).cast({target_expr})"


# ---------------------------------------------------------------------------- casts
@converter("Cast", since=1, attrs=("to", "saturate", "round_mode"),
           limits="strings and complex types have no ember dtype")
def cast(node: NodeContext) -> str | None:
    """``saturate`` concerns low-precision float targets (float8, float4): see
    :func:`cast_expr`.

    A constant of a wide unsigned type (a ``uint32`` initializer) is cast at import time,
    so the model also runs on backends that only store those dtypes (Torch).
    """
    target = dtype_attr(node, "to")
    if target is None:
        node.unsupported("the required attribute 'to' is missing")
    x = node.input(0)
    if x.const is not None and x.const.dtype.kind == "u" and x.const.dtype != np.uint8:
        node.set_constant(0, x.const.astype(numpy_dtype(target)))
        return None
    return f"{node.outputs[0]} = {cast_expr(node, x, target, repr(target.value))}"


@converter("CastLike", since=15, attrs=("saturate", "round_mode"),
           limits="strings and complex types have no ember dtype")
def cast_like(node: NodeContext) -> str:
    x, like = node.input(0), node.input(1)
    if like.dtype is not None:
        return f"{node.outputs[0]} = {cast_expr(node, x, like.dtype, repr(like.dtype.value))}"
    return f"{node.outputs[0]} = {x.expr}.cast({like.expr}.dtype)"


# ---------------------------------------------------------------------------- arithmetic
@converter("Pow", since=1, attrs=("broadcast", "axis"))
@converter("Pow", since=7, attrs=())
def pow_(node: NodeContext) -> str:
    """The result has the base's dtype; an exponent of another dtype is cast to it, and an
    Int base with a Float exponent is raised in the exponent's dtype and cast back."""
    x, y = node.input(0), node.input(1)
    out, base = node.outputs[0], x.expr
    dx, dy = x.dtype, y.dtype
    # A literal exponent keeps the base's dtype: any number for a Float base, an int for Int.
    literal_ok = dx is not None and (dx.is_float or (dy is not None and dy.is_int))
    exponent = scalar_literal(y, x) if literal_ok else None
    if exponent is not None:
        return f"{out} = {base}.pow({exponent})"
    exponent = legacy_rhs(node) if node.opset < 7 else y.expr
    if dx is None or dy is None:
        return (f"{out} = {base}.pow({exponent}.cast({base}.dtype)) if {base}.dtype.is_float or "
                f"{exponent}.dtype.is_int else {base}.cast({exponent}.dtype).pow({exponent})"
                f".cast({base}.dtype)")
    if dx is dy:
        return f"{out} = {base}.pow({exponent})"
    if dx.is_float or dy.is_int:
        return f'{out} = {base}.pow({exponent}.cast("{dx.value}"))'
    return f'{out} = {base}.cast("{dy.value}").pow({exponent}).cast("{dx.value}")'


@converter("Mod", since=10, attrs=("fmod",))
def mod(node: NodeContext) -> list[str]:
    """``fmod=0``: the remainder takes the divisor's sign (Python's ``%``); ``fmod=1``: the
    dividend's sign (C's ``fmod``), the first shifted by the divisor where the signs differ."""
    x, y = node.input(0).expr, node.input(1).expr
    out = node.outputs[0]
    if not node.attr("fmod", 0):
        return [f"{out} = {x}.remainder({y})"]
    rem = node.tmp("rem")
    return [
        f"{rem} = {x}.remainder({y})",
        f"{out} = {rem}.mask_where({rem}.not_equal(0).bool_and({x}.lower(0).bool_xor("
        f"{y}.lower(0))), {rem} - {y})",
    ]


def _variadic(node: NodeContext, join: str) -> str:
    """The inputs combined left to right: ``a.max_pair(b).max_pair(c)`` or ``a + b + c``."""
    parts = [v.expr for v in node.inputs if v.present]
    if not parts:
        node.unsupported(f"{node.op_type} needs at least one input")
    if join == "+":
        return " + ".join(parts)
    expr = parts[0]
    for part in parts[1:]:
        expr = f"{expr}.{join}({part})"
    return expr


@converter("Max", since=1, attrs=_LEGACY)
def max_(node: NodeContext) -> str:
    return f"{node.outputs[0]} = {_variadic(node, 'max_pair')}"


@converter("Min", since=1, attrs=_LEGACY)
def min_(node: NodeContext) -> str:
    return f"{node.outputs[0]} = {_variadic(node, 'min_pair')}"


@converter("Sum", since=1, attrs=_LEGACY)
def sum_(node: NodeContext) -> str:
    return f"{node.outputs[0]} = {_variadic(node, '+')}"


@converter("Mean", since=1, attrs=_LEGACY)
def mean(node: NodeContext) -> str:
    count = sum(1 for v in node.inputs if v.present)
    total = _variadic(node, "+")
    return f"{node.outputs[0]} = {total if count == 1 else f'({total}) / {count}'}"


# ---------------------------------------------------------------------------- clip
def _bound(value: Value) -> tuple[str, Any] | None:
    """A Clip bound input: its expression and, when a one-element constant, its number."""
    if not value.present:
        return None
    const = value.const
    if const is not None and const.size == 1:
        return _const_literal(const), const.reshape(()).item()
    return value.expr, None


def _clip(node: NodeContext, low: tuple[str, Any] | None, high: tuple[str, Any] | None) -> str:
    """``min(max(x, low), high)``: where ``low > high`` every element becomes ``high``, as
    ONNX says, so one ``clamp`` serves only bounds known to be in order."""
    out, x = node.outputs[0], node.input(0).expr
    if low is not None and high is not None and low[1] is not None and high[1] is not None \
            and low[1] <= high[1]:
        return f"{out} = {x}.clamp({low[0]}, {high[0]})"
    expr = x
    if low is not None:
        expr += f".clamp_min({low[0]})" if low[1] is not None else f".max_pair({low[0]})"
    if high is not None:
        expr += f".clamp_max({high[0]})" if high[1] is not None else f".min_pair({high[0]})"
    return f"{out} = {expr}"


@converter("Clip", since=1, attrs=("min", "max", *_LEGACY))
def clip_v1(node: NodeContext) -> str:
    """Bounds as attributes; an absent bound does not clip (ONNX's default is +-FLT_MAX)."""
    low, high = node.attr("min", None), node.attr("max", None)
    return _clip(node, None if low is None else (number(low), low),
                 None if high is None else (number(high), high))


@converter("Clip", since=11, attrs=())
def clip(node: NodeContext) -> str:
    """Bounds as optional inputs: literals when constant, tensors otherwise."""
    return _clip(node, _bound(node.input(1)), _bound(node.input(2)))


# ---------------------------------------------------------------------------- unary math
# op type: (the opset it starts at, the expression of the output from the input ``x``).
_UNARY = {
    "Sign": (9, "{x}.sign()"),
    "Round": (11, "{x}.round()"),
    "Floor": (1, "{x}.floor()"),
    "Ceil": (1, "{x}.ceil()"),
    "Reciprocal": (1, "{x}.recip()"),
    "Erf": (9, "{x}.erf()"),
    "Sin": (7, "{x}.sin()"),
    "Cos": (7, "{x}.cos()"),
    "Tan": (7, "{x}.tan()"),
    "Asin": (7, "{x}.asin()"),
    "Acos": (7, "{x}.acos()"),
    "Atan": (7, "{x}.atan()"),
    "Sinh": (9, "{x}.sinh()"),
    "Cosh": (9, "{x}.cosh()"),
}


def _unary(node: NodeContext) -> str:
    return f"{node.outputs[0]} = " + _UNARY[node.op_type][1].format(x=node.input(0).expr)


for _op, (_since, _) in _UNARY.items():
    converter(_op, since=_since, attrs=_LEGACY if _since == 1 else ())(_unary)


@converter("Asinh", since=9, attrs=())
def asinh(node: NodeContext) -> list[str]:
    """``sign(x) * log1p(a + a / (1/a + sqrt(1/a^2 + 1)))`` with ``a = |x|``: the log of
    ``a + sqrt(a^2 + 1)``, written to stay accurate near zero and not to square ``a``."""
    x, a, r = node.input(0).expr, node.tmp("abs"), node.tmp("inv")
    return [f"{a} = {x}.abs()",
            f"{r} = {a}.recip()",
            f"{node.outputs[0]} = ({a} + {a} / ({r} + ({r} * {r} + 1.0).sqrt())).log1p()"
            f" * {x}.sign()"]  # fmt: skip


@converter("Acosh", since=9, attrs=())
def acosh(node: NodeContext) -> list[str]:
    """``log1p(t + sqrt(t) * sqrt(x + 1))`` with ``t = x - 1``: ``log(x + sqrt(x^2 - 1))``
    without squaring ``x`` (no overflow) and accurate near 1; NaN below 1."""
    x, t = node.input(0).expr, node.tmp("t")
    return [f"{t} = {x} - 1.0",
            f"{node.outputs[0]} = ({t} + {t}.sqrt() * ({x} + 1.0).sqrt()).log1p()"]  # fmt: skip


@converter("Atanh", since=9, attrs=())
def atanh(node: NodeContext) -> str:
    """``(log1p(x) - log1p(-x)) / 2``: ``log((1 + x) / (1 - x)) / 2``, accurate near 0 and +-1."""
    x = node.input(0).expr
    return f"{node.outputs[0]} = ({x}.log1p() - (-{x}).log1p()) * 0.5"


# ---------------------------------------------------------------------------- sampling
@converter("Bernoulli", since=15, attrs=("dtype", "seed"), foldable=False,
           limits="the seed attribute is ignored: samples come from the device's generator "
                  "(ember.seed)")  # fmt: skip
def bernoulli(node: NodeContext) -> str:
    """1 with probability ``x`` (element-wise), else 0: a uniform sample below ``x``."""
    x = node.input(0).expr
    target = dtype_attr(node, "dtype") or node.input(0).dtype
    to = f'"{target.value}"' if target is not None else f"{x}.dtype"
    return (f"{node.outputs[0]} = Tensor.random({x}.shape, device={x}.device, dtype={x}.dtype)"
            f".lower({x}).cast({to})")
