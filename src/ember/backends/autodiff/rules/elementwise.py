"""Backward rules of the element-wise ops: arithmetic, unary math, selection by mask, casts."""

from __future__ import annotations

import math

from ember.backends.autodiff.rule import backward, unbroadcast, zeros


# ------------------------------------------------------------------ arithmetic
# The binary rules compute an operand's gradient only where it needs one (``s.needs``):
# a constant operand (a mask, a direction, an input) takes none.
@backward("add")
def _add(B, g, s):
    return (unbroadcast(B, g, s.shapes[0]) if s.needs[0] else None,
            unbroadcast(B, g, s.shapes[1]) if s.needs[1] else None)  # fmt: skip


@backward("sub")
def _sub(B, g, s):
    return (unbroadcast(B, g, s.shapes[0]) if s.needs[0] else None,
            unbroadcast(B, B.float_neg(g), s.shapes[1]) if s.needs[1] else None)  # fmt: skip


@backward("add_scalar", "sub_scalar")
def _shift(B, g, s):
    return (g,)


@backward("mul", keep="inputs")
def _mul(B, g, s):
    a, b = s.inputs
    return (unbroadcast(B, B.float_mul(g, b), s.shapes[0]) if s.needs[0] else None,
            unbroadcast(B, B.float_mul(g, a), s.shapes[1]) if s.needs[1] else None)  # fmt: skip


@backward("mul_scalar")
def _mul_scalar(B, g, s):
    return (B.float_mul_scalar(g, s.attrs[0]),)


@backward("div", keep="inputs")
def _div(B, g, s):
    a, b = s.inputs
    ga = B.float_div(g, b)
    if not s.needs[1]:
        return unbroadcast(B, ga, s.shapes[0]), None
    gb = B.float_neg(B.float_div(B.float_mul(ga, a), b))  # -g a / b^2
    return unbroadcast(B, ga, s.shapes[0]) if s.needs[0] else None, unbroadcast(B, gb, s.shapes[1])


@backward("div_scalar")
def _div_scalar(B, g, s):
    return (B.float_div_scalar(g, s.attrs[0]),)


@backward("remainder", keep="inputs")
def _remainder(B, g, s):
    a, b = s.inputs
    gb = B.float_neg(B.float_mul(g, B.float_floor(B.float_div(a, b))))
    return unbroadcast(B, g, s.shapes[0]), unbroadcast(B, gb, s.shapes[1])


@backward("remainder_scalar")
def _remainder_scalar(B, g, s):
    return (g,)


@backward("pow", keep=("inputs", "output"))
def _pow(B, g, s):
    # As PyTorch at a zero base: no gradient to a where b == 0, none to b where a == 0 and b >= 0
    # (the formulas alone give 0 * inf = NaN there).
    a, b = s.inputs
    ga = B.float_mul(g, B.float_mul(b, B.float_pow(a, B.float_sub_scalar(b, 1.0))))
    ga = B.float_mask_fill(ga, B.float_equal_elem(b, 0.0), 0.0)
    gb = B.float_mul(g, B.float_mul(s.output, B.float_log(a)))
    gb = B.float_mask_fill(gb, B.bool_and(B.float_equal_elem(a, 0.0), B.float_greater_equal_elem(b, 0.0)), 0.0)
    return unbroadcast(B, ga, s.shapes[0]), unbroadcast(B, gb, s.shapes[1])


@backward("pow_scalar", keep="inputs")
def _pow_scalar(B, g, s):
    (a,), e = s.inputs, s.attrs[0]
    if e == 0:
        return (zeros(B, g),)
    return (B.float_mul(g, B.float_mul_scalar(B.float_pow_scalar(a, e - 1.0), e)),)


def _pair(B, g, a, b, s, keep_a):
    # As PyTorch: ties split the gradient evenly between both operands.
    half = B.float_mul_scalar(g, 0.5)
    tie = B.float_equal(a, b)
    to_a = B.float_mask_where(B.float_mask_fill(g, keep_a, 0.0), tie, half)
    to_b = B.float_mask_where(B.float_mask_fill(g, B.bool_not(keep_a), 0.0), tie, half)
    return unbroadcast(B, to_a, s.shapes[0]), unbroadcast(B, to_b, s.shapes[1])


@backward("max_pair", keep="inputs")
def _max_pair(B, g, s):
    a, b = s.inputs
    return _pair(B, g, a, b, s, B.float_lower(a, b))


@backward("min_pair", keep="inputs")
def _min_pair(B, g, s):
    a, b = s.inputs
    return _pair(B, g, a, b, s, B.float_greater(a, b))


@backward("max_pair_scalar", keep="inputs")
def _max_pair_scalar(B, g, s):
    return (B.float_mask_fill(g, B.float_lower_elem(s.inputs[0], s.attrs[0]), 0.0),)


@backward("min_pair_scalar", keep="inputs")
def _min_pair_scalar(B, g, s):
    return (B.float_mask_fill(g, B.float_greater_elem(s.inputs[0], s.attrs[0]), 0.0),)


@backward("clamp", keep="inputs")
def _clamp(B, g, s):
    (x,), (low, high) = s.inputs, s.attrs
    if low is not None:
        g = B.float_mask_fill(g, B.float_lower_elem(x, low), 0.0)
    if high is not None:
        g = B.float_mask_fill(g, B.float_greater_elem(x, high), 0.0)
    return (g,)


@backward("atan2", keep="inputs")
def _atan2(B, g, s):
    a, b = s.inputs
    denom = B.float_add(B.float_mul(a, a), B.float_mul(b, b))
    origin = B.float_equal_elem(denom, 0.0)  # atan2(0, 0): gradient 0, as in PyTorch (not 0/0)
    ga = B.float_mask_fill(B.float_div(B.float_mul(g, b), denom), origin, 0.0)
    gb = B.float_mask_fill(B.float_neg(B.float_div(B.float_mul(g, a), denom)), origin, 0.0)
    return unbroadcast(B, ga, s.shapes[0]), unbroadcast(B, gb, s.shapes[1])


# ------------------------------------------------------------------ unary math
@backward("neg")
def _neg(B, g, s):
    return (B.float_neg(g),)


@backward("abs", keep="inputs")
def _abs(B, g, s):
    return (B.float_mul(g, B.float_sign(s.inputs[0])),)


@backward("sign", "round", "floor", "ceil", "trunc")
def _piecewise_constant(B, g, s):
    return (zeros(B, g),)


@backward("exp", keep="output")
def _exp(B, g, s):
    return (B.float_mul(g, s.output),)


@backward("expm1", keep="output")
def _expm1(B, g, s):
    return (B.float_mul(g, B.float_add_scalar(s.output, 1.0)),)


@backward("log", keep="inputs")
def _log(B, g, s):
    return (B.float_div(g, s.inputs[0]),)


@backward("log1p", keep="inputs")
def _log1p(B, g, s):
    return (B.float_div(g, B.float_add_scalar(s.inputs[0], 1.0)),)


@backward("erf", keep="inputs")
def _erf(B, g, s):
    x = s.inputs[0]
    density = B.float_exp(B.float_neg(B.float_mul(x, x)))
    return (B.float_mul(g, B.float_mul_scalar(density, 2.0 / math.sqrt(math.pi))),)


@backward("sqrt", keep="output")
def _sqrt(B, g, s):
    return (B.float_div(g, B.float_mul_scalar(s.output, 2.0)),)


@backward("rsqrt", keep="output")
def _rsqrt(B, g, s):
    cube = B.float_mul(B.float_mul(s.output, s.output), s.output)
    return (B.float_mul(g, B.float_mul_scalar(cube, -0.5)),)


@backward("recip", keep="output")
def _recip(B, g, s):
    return (B.float_neg(B.float_mul(g, B.float_mul(s.output, s.output))),)


@backward("sin", keep="inputs")
def _sin(B, g, s):
    return (B.float_mul(g, B.float_cos(s.inputs[0])),)


@backward("cos", keep="inputs")
def _cos(B, g, s):
    return (B.float_neg(B.float_mul(g, B.float_sin(s.inputs[0]))),)


@backward("tan", keep="output")
def _tan(B, g, s):
    return (B.float_mul(g, B.float_add_scalar(B.float_mul(s.output, s.output), 1.0)),)


@backward("sinh", keep="inputs")
def _sinh(B, g, s):
    return (B.float_mul(g, B.float_cosh(s.inputs[0])),)


@backward("cosh", keep="inputs")
def _cosh(B, g, s):
    return (B.float_mul(g, B.float_sinh(s.inputs[0])),)


@backward("tanh", keep="output")
def _tanh(B, g, s):
    y = s.output
    return (B.float_sub(g, B.float_mul(B.float_mul(g, y), y)),)  # g (1 - y^2), without a ones tensor


def _one_minus_square(B, x):
    return B.float_neg(B.float_sub_scalar(B.float_mul(x, x), 1.0))


@backward("asin", keep="inputs")
def _asin(B, g, s):
    return (B.float_mul(g, B.float_rsqrt(_one_minus_square(B, s.inputs[0]))),)


@backward("acos", keep="inputs")
def _acos(B, g, s):
    return (B.float_neg(B.float_mul(g, B.float_rsqrt(_one_minus_square(B, s.inputs[0])))),)


@backward("atan", keep="inputs")
def _atan(B, g, s):
    x = s.inputs[0]
    return (B.float_div(g, B.float_add_scalar(B.float_mul(x, x), 1.0)),)


# ------------------------------------------------------------------ selection and casts
@backward("mask_where", keep="inputs")
def _mask_where(B, g, s):
    mask = s.inputs[1]
    to_x = B.float_mask_fill(g, mask, 0.0)
    to_value = B.float_mask_fill(g, B.bool_not(mask), 0.0)
    return unbroadcast(B, to_x, s.shapes[0]), None, unbroadcast(B, to_value, s.shapes[2])


@backward("mask_fill", keep="inputs")
def _mask_fill(B, g, s):
    return unbroadcast(B, B.float_mask_fill(g, s.inputs[1], 0.0), s.shapes[0]), None


@backward("cast")
def _cast(B, g, s):
    return (B.float_cast(g, s.dtypes[0]),)


@backward("to_device", keep="inputs")
def _to_device(B, g, s):
    return (B.float_to_device(g, B.device_of(s.inputs[0])),)
