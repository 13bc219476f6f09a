"""Conformance of the element-wise ops against PyTorch (CPU), the reference.

Covered: Float unary math (with inf, NaN and -0.0 inputs), the numeric unary
ops on Float and Int, binary arithmetic in its tensor, scalar and reflected
scalar forms (methods and operators), Int division (truncating) and remainder
(sign of the divisor), clamp, comparisons, Int bitwise and Bool logical ops,
dtype promotion within a kind, and the errors for kind and shape mismatches.

Inputs are drawn from each op's domain with a fixed seed and stay clear of
overflow in the small int dtypes and of undefined behaviour (division by zero
on ints, shifts by the bit width or more, negative shift amounts).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from reference import EMBER_DTYPE, FLOAT_DTYPES, INT_DTYPES, TORCH_DTYPE, assert_close, from_torch

from ember import ArgumentError, DType, KindError, ShapeError, Tensor

SIGNED_DTYPES = [d for d in INT_DTYPES if d is not DType.U8]
NAN, INF = math.nan, math.inf

# ------------------------------------------------------------------ input domains
Domain = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def uniform(low: float, high: float) -> Domain:
    return lambda rng, shape: rng.uniform(low, high, shape)


def integers(low: int, high: int) -> Domain:
    """Integers in ``[low, high]``."""
    return lambda rng, shape: rng.integers(low, high, shape, endpoint=True)


def away_from_zero(low: float, high: float) -> Domain:
    """Magnitudes in ``[low, high]`` with random signs."""
    return lambda rng, shape: rng.uniform(low, high, shape) * rng.choice([-1.0, 1.0], shape)


def choice(*values) -> Domain:
    return lambda rng, shape: rng.choice(np.array(values), shape)


def absolute(domain: Domain) -> Domain:
    """The magnitudes of ``domain``'s values: its u8 form."""
    return lambda rng, shape: np.abs(domain(rng, shape))


def reference(domain: Domain, shape, dtype: DType, seed: int = 0) -> torch.Tensor:
    """A reference tensor of ``dtype`` with values drawn from ``domain``."""
    values = np.asarray(domain(np.random.default_rng(seed), tuple(shape)))
    return torch.from_numpy(values).to(TORCH_DTYPE[dtype])


# inf, NaN, signed zeros, and values where rounding and domains have edges.
SPECIAL_VALUES = [NAN, INF, -INF, 0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -2.5, 2.0, -2.0]


def specials(dtype: DType) -> torch.Tensor:
    return torch.tensor(SPECIAL_VALUES, dtype=TORCH_DTYPE[dtype])


def assert_zero_signs(actual: Tensor, expected: torch.Tensor) -> None:
    """Where the reference result is a zero, ``actual`` has a zero of the same sign."""
    got = actual.into_data().to_numpy().astype(np.float64)
    want = expected.double().numpy()
    zeros = want == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]),
                                  err_msg="signs of zero results differ")  # fmt: skip


# ------------------------------------------------------------------ unary ops
FLOAT_UNARY: dict[str, tuple[Callable, Domain]] = {
    "exp": (torch.exp, uniform(-5, 5)),
    "log": (torch.log, uniform(0.1, 10)),
    "log1p": (torch.log1p, uniform(-0.9, 5)),
    "expm1": (torch.expm1, uniform(-3, 3)),
    "erf": (torch.erf, uniform(-3, 3)),
    "sqrt": (torch.sqrt, uniform(0, 10)),
    "rsqrt": (torch.rsqrt, uniform(0.1, 10)),
    "recip": (torch.reciprocal, away_from_zero(0.1, 10)),
    "sin": (torch.sin, uniform(-4, 4)),
    "cos": (torch.cos, uniform(-4, 4)),
    "tan": (torch.tan, uniform(-1.3, 1.3)),
    "sinh": (torch.sinh, uniform(-3, 3)),
    "cosh": (torch.cosh, uniform(-3, 3)),
    "tanh": (torch.tanh, uniform(-4, 4)),
    "asin": (torch.asin, uniform(-0.99, 0.99)),
    "acos": (torch.acos, uniform(-0.99, 0.99)),
    "atan": (torch.atan, uniform(-10, 10)),
    "round": (torch.round, uniform(-10, 10)),
    "floor": (torch.floor, uniform(-10, 10)),
    "ceil": (torch.ceil, uniform(-10, 10)),
    "trunc": (torch.trunc, uniform(-10, 10)),
    "sigmoid": (torch.sigmoid, uniform(-10, 10)),
    "is_nan": (torch.isnan, choice(0.0, -0.0, 1.5, NAN, INF, -INF)),
    "is_inf": (torch.isinf, choice(0.0, -0.0, 1.5, NAN, INF, -INF)),
}
# (reference, Float domain, signed Int domain); u8 takes the magnitudes.
NUMERIC_UNARY: dict[str, tuple[Callable, Domain, Domain]] = {
    "neg": (torch.neg, uniform(-5, 5), integers(-100, 100)),
    "abs": (torch.abs, uniform(-5, 5), integers(-100, 100)),
    "sign": (torch.sign, choice(-2.5, -0.0, 0.0, 1.5), integers(-3, 3)),
}
UNARY_OPERATORS = {"neg": operator.neg, "abs": abs}


def numeric_unary_cases() -> list[tuple[str, DType]]:
    # neg of a u8 overflows for every element but 0: it is left out.
    return [(name, dtype) for name in NUMERIC_UNARY for dtype in FLOAT_DTYPES + INT_DTYPES
            if not (name == "neg" and dtype is DType.U8)]  # fmt: skip


def unary_reference(name: str, dtype: DType) -> tuple[Callable, Domain]:
    if name in FLOAT_UNARY:
        return FLOAT_UNARY[name]
    fn, float_domain, int_domain = NUMERIC_UNARY[name]
    if dtype.is_float:
        return fn, float_domain
    return fn, absolute(int_domain) if dtype is DType.U8 else int_domain


def check_unary(device, name: str, values: torch.Tensor) -> None:
    """The method (and operator, if any) of ``name`` on ``values`` matches PyTorch."""
    expected = unary_reference(name, EMBER_DTYPE[values.dtype])[0](values)
    x = from_torch(values, device)
    assert_close(getattr(x, name)(), expected)
    if name in UNARY_OPERATORS:
        assert_close(UNARY_OPERATORS[name](x), expected)


UNARY_CASES = [(n, d) for n in FLOAT_UNARY for d in FLOAT_DTYPES] + numeric_unary_cases()


@pytest.mark.parametrize("name, dtype", UNARY_CASES)
def test_unary_matches_torch(device, name, dtype):
    check_unary(device, name, reference(unary_reference(name, dtype)[1], (3, 5), dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", [*FLOAT_UNARY, *NUMERIC_UNARY])
def test_unary_special_values_match_torch(device, name, dtype):
    values = specials(dtype)  # includes NaN: sign(NaN) is 0 on every backend, as in PyTorch
    check_unary(device, name, values)
    expected = unary_reference(name, dtype)[0](values)
    if expected.is_floating_point():
        assert_zero_signs(getattr(from_torch(values, device), name)(), expected)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_round_halves_to_even(device, dtype):
    x = Tensor.from_data([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.5], device, dtype=dtype)
    assert_close(x.round(), [-2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 4.0, -4.0])


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1, 1, 4)])
@pytest.mark.parametrize("name, dtype", [("exp", DType.F32), ("is_inf", DType.F64),
                                         ("abs", DType.I16), ("sign", DType.BF16)])  # fmt: skip
def test_unary_keeps_edge_shapes(device, name, dtype, shape):
    check_unary(device, name, reference(unary_reference(name, dtype)[1], shape, dtype))


# ------------------------------------------------------------------ binary arithmetic
def torch_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """True division on floats; on ints ember truncates toward zero."""
    return torch.div(a, b) if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc")


TORCH_BINARY: dict[str, Callable] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch_div,
    "remainder": torch.remainder, "pow": torch.pow, "max_pair": torch.maximum,
    "min_pair": torch.minimum, "atan2": torch.atan2,
}  # fmt: skip
BINARY_OPERATORS: dict[str, Callable] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "div": operator.truediv, "remainder": operator.mod, "pow": operator.pow,
}  # fmt: skip
# (lhs, rhs) domains of each op.
FLOAT_BINARY: dict[str, tuple[Domain, Domain]] = {
    "add": (uniform(-10, 10), uniform(-10, 10)),
    "sub": (uniform(-10, 10), uniform(-10, 10)),
    "mul": (uniform(-10, 10), uniform(-10, 10)),
    "div": (uniform(-10, 10), away_from_zero(0.5, 4)),
    "remainder": (uniform(-10, 10), away_from_zero(0.5, 4)),
    "pow": (uniform(0.5, 3), uniform(-2, 2)),
    "max_pair": (uniform(-10, 10), uniform(-10, 10)),
    "min_pair": (uniform(-10, 10), uniform(-10, 10)),
    "atan2": (uniform(-5, 5), uniform(-5, 5)),
}
NONZERO_DIVISORS = choice(-9, -7, -3, -2, -1, 1, 2, 3, 5, 8)
# Signed ints; sized so that no i8 result overflows. u8 takes the magnitudes, except:
INT_BINARY: dict[str, tuple[Domain, Domain]] = {
    "add": (integers(-50, 50), integers(-50, 50)),
    "sub": (integers(-50, 50), integers(-50, 50)),
    "mul": (integers(-11, 11), integers(-11, 11)),
    "div": (integers(-100, 100), NONZERO_DIVISORS),
    "remainder": (integers(-100, 100), NONZERO_DIVISORS),
    "pow": (integers(-3, 3), integers(0, 4)),
    "max_pair": (integers(-100, 100), integers(-100, 100)),
    "min_pair": (integers(-100, 100), integers(-100, 100)),
}
U8_BINARY = {"sub": (integers(50, 100), integers(0, 50))}


def binary_domains(name: str, dtype: DType) -> tuple[Domain, Domain]:
    if dtype.is_float:
        return FLOAT_BINARY[name]
    if dtype is DType.U8:
        return U8_BINARY.get(name) or (absolute(INT_BINARY[name][0]), absolute(INT_BINARY[name][1]))
    return INT_BINARY[name]


def binary_inputs(name: str, dtype: DType, lhs_shape, rhs_shape, seed: int = 0):
    lhs, rhs = binary_domains(name, dtype)
    return reference(lhs, lhs_shape, dtype, seed), reference(rhs, rhs_shape, dtype, seed + 1)


def binary_results(name: str, x: Tensor, y) -> list[Tensor]:
    """``name`` applied through its method and, when it has one, its operator."""
    results = [getattr(x, name)(y)]
    if name in BINARY_OPERATORS:
        results.append(BINARY_OPERATORS[name](x, y))
    return results


BINARY_CASES = [(n, d) for n in FLOAT_BINARY for d in FLOAT_DTYPES] + [
    (n, d) for n in INT_BINARY for d in INT_DTYPES
]
SCALAR_CASES = [(n, d) for n, d in BINARY_CASES if n != "atan2"]


@pytest.mark.parametrize("name, dtype", BINARY_CASES)
def test_binary_matches_torch(device, name, dtype):
    a, b = binary_inputs(name, dtype, (3, 4), (4,))  # broadcast along dim 0
    expected = TORCH_BINARY[name](a, b)
    for result in binary_results(name, from_torch(a, device), from_torch(b, device)):
        assert_close(result, expected)


# The scalar operand of x OP s; u8 takes its magnitude.
FLOAT_SCALARS = {"add": 2.5, "sub": 2.5, "mul": -1.5, "div": -2.5, "remainder": 1.5,
                 "pow": 2.0, "max_pair": 0.5, "min_pair": 0.5}  # fmt: skip
INT_SCALARS = {"add": 7, "sub": 7, "mul": -2, "div": -3, "remainder": -3, "pow": 2,
               "max_pair": 0, "min_pair": 3}  # fmt: skip


def scalar_for(name: str, dtype: DType) -> float | int:
    if dtype.is_float:
        return FLOAT_SCALARS[name]
    return abs(INT_SCALARS[name]) if dtype is DType.U8 else INT_SCALARS[name]


@pytest.mark.parametrize("name, dtype", SCALAR_CASES)
def test_binary_with_scalar_matches_torch(device, name, dtype):
    a, _ = binary_inputs(name, dtype, (2, 3), ())
    scalar = scalar_for(name, dtype)
    expected = TORCH_BINARY[name](a, torch.full_like(a, scalar))  # keeps the tensor's dtype
    for result in binary_results(name, from_torch(a, device), scalar):
        assert_close(result, expected)


# The scalar of s OP x, x drawn from the op's rhs domain: no result overflows.
REFLECTED_SCALARS = {
    "add": (2.5, 7), "sub": (2.5, 60), "mul": (-1.5, 2), "div": (2.5, 60),
    "remainder": (2.5, 60), "pow": (2.0, 2),
}  # fmt: skip
REFLECTED_CASES = [(n, d) for n, d in SCALAR_CASES if n in REFLECTED_SCALARS]


@pytest.mark.parametrize("name, dtype", REFLECTED_CASES)
def test_reflected_scalar_matches_torch(device, name, dtype):
    _, b = binary_inputs(name, dtype, (), (2, 3))
    scalar = REFLECTED_SCALARS[name][0 if dtype.is_float else 1]
    expected = TORCH_BINARY[name](torch.full_like(b, scalar), b)
    assert_close(BINARY_OPERATORS[name](scalar, from_torch(b, device)), expected)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_float_tensor_with_int_scalar_keeps_its_dtype(device, dtype):
    a = reference(uniform(0.5, 3), (4,), dtype)
    x = from_torch(a, device)
    assert_close(x + 2, a + 2)
    assert_close(x**3, a**3)
    assert_close(1 / x, 1 / a)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", list(FLOAT_BINARY))
def test_binary_special_values_match_torch(device, name, dtype):
    values = specials(dtype)
    a, b = values[:, None], values[None, :]  # every pair of special values
    expected = TORCH_BINARY[name](a, b)
    for result in binary_results(name, from_torch(a, device), from_torch(b, device)):
        assert_close(result, expected)


@pytest.mark.parametrize("dtype", SIGNED_DTYPES)
def test_int_div_truncates_and_remainder_takes_divisor_sign(device, dtype):
    x = Tensor.from_data([7, -7, 7, -7, 0, 6, -1], device, dtype=dtype)
    y = Tensor.from_data([2, 2, -2, -2, 3, -3, 5], device, dtype=dtype)
    assert_close(x / y, [3, -3, -3, 3, 0, -2, 0])
    assert_close(x % y, [1, 1, -1, -1, 0, 0, 4])
    assert_close(x.div(-2), [-3, 3, -3, 3, 0, -3, 0])
    assert_close(x.remainder(-2), [-1, -1, -1, -1, 0, 0, -1])
    assert_close(-7 / y, [-3, -3, 3, 3, -2, 2, -1])


@pytest.mark.parametrize(
    "name, dtype, lhs_shape, rhs_shape",
    [
        ("add", DType.F32, (), ()),
        ("mul", DType.I32, (), (2, 3)),
        ("sub", DType.F64, (0,), (1,)),
        ("max_pair", DType.I8, (2, 0, 3), (3,)),
        ("div", DType.F16, (1, 3), (2, 1)),
        ("remainder", DType.I64, (4, 1, 2), (1, 3, 1)),
        ("pow", DType.BF16, (2, 1, 1, 3), (1, 2, 3)),
    ],
)
def test_binary_broadcasts_edge_shapes(device, name, dtype, lhs_shape, rhs_shape):
    a, b = binary_inputs(name, dtype, lhs_shape, rhs_shape)
    expected = TORCH_BINARY[name](a, b)
    assert_close(getattr(from_torch(a, device), name)(from_torch(b, device)), expected)
    assert_close(
        getattr(from_torch(b, device), name)(from_torch(a, device)), TORCH_BINARY[name](b, a)
    )


# ------------------------------------------------------------------ clamp
FLOAT_BOUNDS = [(-1.5, 2.0), (None, 0.5), (-0.5, None), (1.0, 1.0)]
INT_BOUNDS = [(-3, 4), (None, 2), (-2, None), (3, 3)]
U8_BOUNDS = [(1, 4), (None, 2), (3, None), (3, 3)]
CLAMP_CASES = [(d, lo, hi) for d in FLOAT_DTYPES for lo, hi in FLOAT_BOUNDS] + [
    (d, lo, hi) for d in INT_DTYPES for lo, hi in (U8_BOUNDS if d is DType.U8 else INT_BOUNDS)
]


def clamp_input(dtype: DType) -> torch.Tensor:
    if dtype.is_float:  # NaN stays NaN, infinities are clamped
        return torch.cat([reference(uniform(-3, 3), (12,), dtype), specials(dtype)])
    return reference(integers(0, 8) if dtype is DType.U8 else integers(-6, 6), (3, 4), dtype)


@pytest.mark.parametrize("dtype, low, high", CLAMP_CASES)
def test_clamp_matches_torch(device, dtype, low, high):
    a = clamp_input(dtype)
    expected = torch.clamp(a, low, high)
    x = from_torch(a, device)
    assert_close(x.clamp(low, high), expected)
    if high is None:
        assert_close(x.clamp_min(low), expected)
    if low is None:
        assert_close(x.clamp_max(high), expected)


# ------------------------------------------------------------------ comparisons
COMPARISONS: dict[str, tuple[Callable, Callable]] = {
    "equal": (torch.eq, operator.eq), "not_equal": (torch.ne, operator.ne),
    "greater": (torch.gt, operator.gt), "greater_equal": (torch.ge, operator.ge),
    "lower": (torch.lt, operator.lt), "lower_equal": (torch.le, operator.le),
}  # fmt: skip
COMPARE_DOMAINS = {  # few distinct values, so that ties occur
    "float": choice(-2.0, -1.0, -0.0, 0.0, 1.0, 2.0, NAN),
    "signed": integers(-2, 2),
    "u8": integers(0, 3),
    "bool": choice(False, True),
}
COMPARE_CASES = [(n, d) for n in COMPARISONS for d in FLOAT_DTYPES + INT_DTYPES] + [
    (n, DType.BOOL) for n in ("equal", "not_equal")
]


def compare_domain(dtype: DType) -> Domain:
    if dtype.is_float:
        return COMPARE_DOMAINS["float"]
    if dtype is DType.BOOL:
        return COMPARE_DOMAINS["bool"]
    return COMPARE_DOMAINS["u8" if dtype is DType.U8 else "signed"]


@pytest.mark.parametrize("name, dtype", COMPARE_CASES)
def test_comparison_matches_torch(device, name, dtype):
    a = reference(compare_domain(dtype), (3, 4), dtype, seed=0)
    b = reference(compare_domain(dtype), (4,), dtype, seed=1)
    fn, op = COMPARISONS[name]
    x, y = from_torch(a, device), from_torch(b, device)
    assert_close(getattr(x, name)(y), fn(a, b))
    assert_close(op(x, y), fn(a, b))


@pytest.mark.parametrize("name, dtype", COMPARE_CASES)
def test_comparison_with_scalar_matches_torch(device, name, dtype):
    a = reference(compare_domain(dtype), (3, 4), dtype)
    scalar = True if dtype is DType.BOOL else 1
    full = torch.full_like(a, scalar)
    fn, op = COMPARISONS[name]
    x = from_torch(a, device)
    assert_close(getattr(x, name)(scalar), fn(a, full))
    assert_close(op(x, scalar), fn(a, full))
    assert_close(op(scalar, x), fn(full, a))  # reflected: 1 < x is x > 1


# ------------------------------------------------------------------ Int bitwise
BITWISE: dict[str, tuple[Callable, Callable]] = {
    "bitwise_and": (torch.bitwise_and, operator.and_),
    "bitwise_or": (torch.bitwise_or, operator.or_),
    "bitwise_xor": (torch.bitwise_xor, operator.xor),
    "bitwise_left_shift": (torch.bitwise_left_shift, operator.lshift),
    "bitwise_right_shift": (torch.bitwise_right_shift, operator.rshift),
}
# (lhs, rhs, scalar) for signed dtypes; u8 takes magnitudes. Left shifts of small
# non-negative values stay in range; shift amounts stay below the bit width.
BITWISE_DOMAINS: dict[str, tuple[Domain, Domain, int]] = {
    "bitwise_and": (integers(-100, 100), integers(-100, 100), 0x0F),
    "bitwise_or": (integers(-100, 100), integers(-100, 100), 0x21),
    "bitwise_xor": (integers(-100, 100), integers(-100, 100), 0x55),
    "bitwise_left_shift": (integers(0, 15), integers(0, 3), 2),
    "bitwise_right_shift": (integers(-100, 100), integers(0, 6), 2),
}
BITWISE_CASES = [(n, d) for n in BITWISE for d in INT_DTYPES]


def bitwise_inputs(name: str, dtype: DType, lhs_shape, rhs_shape):
    lhs, rhs, _ = BITWISE_DOMAINS[name]
    if dtype is DType.U8:
        lhs, rhs = absolute(lhs), absolute(rhs)
    return reference(lhs, lhs_shape, dtype, seed=0), reference(rhs, rhs_shape, dtype, seed=1)


@pytest.mark.parametrize("name, dtype", BITWISE_CASES)
def test_bitwise_matches_torch(device, name, dtype):
    a, b = bitwise_inputs(name, dtype, (3, 4), (4,))
    fn, op = BITWISE[name]
    x, y = from_torch(a, device), from_torch(b, device)
    assert_close(getattr(x, name)(y), fn(a, b))
    assert_close(op(x, y), fn(a, b))


@pytest.mark.parametrize("name, dtype", BITWISE_CASES)
def test_bitwise_with_scalar_matches_torch(device, name, dtype):
    a, _ = bitwise_inputs(name, dtype, (3, 4), ())
    scalar = BITWISE_DOMAINS[name][2]
    fn, op = BITWISE[name]
    expected = fn(a, torch.full_like(a, scalar))
    x = from_torch(a, device)
    assert_close(getattr(x, name)(scalar), expected)
    assert_close(op(x, scalar), expected)
    if "shift" not in name:  # and, or, xor commute: 3 & x is x & 3
        assert_close(op(scalar, x), expected)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_bitwise_not_matches_torch(device, dtype):
    a = reference(integers(0, 255) if dtype is DType.U8 else integers(-100, 100), (3, 4), dtype)
    x = from_torch(a, device)
    assert_close(x.bitwise_not(), torch.bitwise_not(a))
    assert_close(~x, torch.bitwise_not(a))


# ------------------------------------------------------------------ Bool logical
LOGICAL: dict[str, tuple[Callable, Callable]] = {
    "bool_and": (torch.logical_and, operator.and_),
    "bool_or": (torch.logical_or, operator.or_),
    "bool_xor": (torch.logical_xor, operator.xor),
}


@pytest.mark.parametrize("name", list(LOGICAL))
def test_logical_matches_torch(device, name):
    a = torch.tensor([[False], [True]])  # with b: every pair of truth values
    b = torch.tensor([False, True])
    fn, op = LOGICAL[name]
    x, y = from_torch(a, device), from_torch(b, device)
    assert_close(getattr(x, name)(y), fn(a, b))
    assert_close(op(x, y), fn(a, b))
    empty = torch.zeros((2, 0, 1), dtype=torch.bool)  # an empty operand broadcasts too
    assert_close(op(from_torch(empty, device), y), fn(empty, b))


def test_logical_not_matches_torch(device):
    a = torch.tensor([[True, False], [False, False]])
    x = from_torch(a, device)
    assert_close(x.bool_not(), torch.logical_not(a))
    assert_close(~x, torch.logical_not(a))


# ------------------------------------------------------------------ dtype promotion
PROMOTION_PAIRS = [
    (a, b) for kind in (FLOAT_DTYPES, INT_DTYPES) for a in kind for b in kind if a is not b
]


@pytest.mark.parametrize("name", ["add", "lower"])
@pytest.mark.parametrize("lhs_dtype, rhs_dtype", PROMOTION_PAIRS)
def test_promotion_matches_torch(device, name, lhs_dtype, rhs_dtype):
    domain = uniform(-4, 4) if lhs_dtype.is_float else integers(0, 50)
    a = reference(domain, (2, 3), lhs_dtype, seed=0)
    b = reference(domain, (3,), rhs_dtype, seed=1)
    fn = {"add": torch.add, "lower": torch.lt}[name]
    expected = fn(a, b)
    x, y = from_torch(a, device), from_torch(b, device)
    assert_close(getattr(x, name)(y), expected)
    assert_close(getattr(y, name)(x), fn(b, a))


@pytest.mark.parametrize("lhs_dtype, rhs_dtype, result", [
    (DType.F16, DType.BF16, DType.F32), (DType.I32, DType.I64, DType.I64),
    (DType.U8, DType.I8, DType.I16), (DType.F16, DType.F64, DType.F64),
])  # fmt: skip
def test_promotion_examples(device, lhs_dtype, rhs_dtype, result):
    x = Tensor.ones([2], device, dtype=lhs_dtype)
    y = Tensor.ones([2], device, dtype=rhs_dtype)
    assert (x + y).dtype is result
    assert (
        EMBER_DTYPE[torch.promote_types(TORCH_DTYPE[lhs_dtype], TORCH_DTYPE[rhs_dtype])] is result
    )


# ------------------------------------------------------------------ errors
def _operands(device) -> tuple[Tensor, Tensor, Tensor]:
    return (Tensor.from_data([[1.0, 2.0]], device), Tensor.from_data([[1, 2]], device),
            Tensor.from_data([[True, False]], device))  # fmt: skip


KIND_ERRORS = [
    ("float + int", lambda f, i, b: f + i, r"add: operands have different kinds, Float and Int"),
    ("int * float", lambda f, i, b: i * f, r"mul: operands have different kinds, Int and Float"),
    (
        "float == bool",
        lambda f, i, b: f == b,
        r"equal: operands have different kinds, Float and Bool",
    ),
    ("bool & int", lambda f, i, b: b & i, r"and: operands have different kinds, Bool and Int"),
    ("int + 1.5", lambda f, i, b: i + 1.5, r"add: a float scalar \(1\.5\) with an Int tensor"),
    ("1.5 - int", lambda f, i, b: 1.5 - i, r"sub: a float scalar \(1\.5\) with an Int tensor"),
    (
        "int.div(0.5)",
        lambda f, i, b: i.div(0.5),
        r"div: a float scalar \(0\.5\) with an Int tensor",
    ),
    ("int > 0.5", lambda f, i, b: i > 0.5, r"greater: a float scalar \(0\.5\) with an Int tensor"),
    ("int << 1.0", lambda f, i, b: i << 1.0, r"bitwise_left_shift: a float scalar \(1\.0\)"),
    ("int.clamp(0.5)", lambda f, i, b: i.clamp(0.5, 2), r"clamp: a float scalar \(0\.5\)"),
    ("int.exp", lambda f, i, b: i.exp(), r"exp is not defined for Int tensors"),
    ("int.sigmoid", lambda f, i, b: i.sigmoid(), r"sigmoid is not defined for Int tensors"),
    ("int.is_nan", lambda f, i, b: i.is_nan(), r"is_nan is not defined for Int tensors"),
    ("int.atan2", lambda f, i, b: i.atan2(i), r"atan2 is not defined for Int tensors"),
    ("bool.exp", lambda f, i, b: b.exp(), r"exp is not defined for Bool tensors"),
    ("bool + bool", lambda f, i, b: b + b, r"add is not defined for Bool tensors"),
    ("bool + 1", lambda f, i, b: b + 1, r"add_scalar is not defined for Bool tensors"),
    ("-bool", lambda f, i, b: -b, r"neg is not defined for Bool tensors"),
    ("bool > bool", lambda f, i, b: b > b, r"greater is not defined for Bool tensors"),
    ("bool.clamp", lambda f, i, b: b.clamp(0, 1), r"clamp is not defined for Bool tensors"),
    ("float & float", lambda f, i, b: f & f, r"bitwise_and is not defined for Float tensors"),
    ("~float", lambda f, i, b: ~f, r"bitwise_not is not defined for Float tensors"),
    ("float << 1", lambda f, i, b: f << 1, r"bitwise_left_shift_scalar is not defined for Float"),
    ("int.bool_and", lambda f, i, b: i.bool_and(i), r"and is not defined for Int tensors"),
]


def test_scalars_become_tensors_for_ops_without_a_scalar_form(device):
    x = torch.tensor([[0.5, -1.0], [2.0, -3.0]], dtype=torch.float64)
    assert_close(from_torch(x, device).atan2(2.0), torch.atan2(x, torch.tensor(2.0, dtype=torch.float64)))
    mask = torch.tensor([True, False, True])
    for other in (True, False):
        assert_close(from_torch(mask, device) & other, mask & other)
        assert_close(from_torch(mask, device) | other, mask | other)
        assert_close(from_torch(mask, device) ^ other, mask ^ other)


@pytest.mark.parametrize("call, match", [pytest.param(c, m, id=i) for i, c, m in KIND_ERRORS])
def test_kind_mismatch_raises_kind_error(device, call, match):
    with pytest.raises(KindError, match=match):
        call(*_operands(device))


@pytest.mark.parametrize("name, kind_dtype", [("add", DType.F32), ("greater", DType.I64),
                                              ("bitwise_xor", DType.I32), ("bool_or", DType.BOOL)])  # fmt: skip
def test_unbroadcastable_shapes_raise_shape_error(device, name, kind_dtype):
    x = Tensor.zeros([2, 3], device, dtype=kind_dtype)
    y = Tensor.zeros([4], device, dtype=kind_dtype)
    op = name.removeprefix("bool_")
    with pytest.raises(ShapeError, match=rf"{op}: shapes \[2, 3\] and \[4\] cannot be broadcast"):
        getattr(x, name)(y)


def test_non_number_operand_raises_argument_error(device):
    x = Tensor.zeros([2], device)
    with pytest.raises(ArgumentError, match=r"add: expected a tensor or a number, got str"):
        x + "1"


def test_clamp_bad_bounds_raise_argument_error(device):
    x = Tensor.zeros([2], device)
    with pytest.raises(ArgumentError, match=r"clamp: min 3\.0 is greater than max 1\.0"):
        x.clamp(3.0, 1.0)
    with pytest.raises(ArgumentError, match=r"clamp: give min, max or both"):
        x.clamp()


# ------------------------------------------------------------------ Hypothesis
_FIXTURE_OK = settings(suppress_health_check=[*settings.default.suppress_health_check,
                                              HealthCheck.function_scoped_fixture])  # fmt: skip
SHAPE_PAIRS = hnp.mutually_broadcastable_shapes(
    num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4
)


@_FIXTURE_OK
@given(shapes=SHAPE_PAIRS, case=st.sampled_from(BINARY_CASES), seed=st.integers(0, 2**16))
def test_broadcasting_binary_matches_torch_hypothesis(device, shapes, case, seed):
    name, dtype = case
    a, b = binary_inputs(name, dtype, *shapes.input_shapes, seed=seed)
    x, y = from_torch(a, device), from_torch(b, device)
    assert_close(getattr(x, name)(y), TORCH_BINARY[name](a, b))
    assert_close(x.greater_equal(y), torch.ge(a, b))


@_FIXTURE_OK
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4),
       case=st.sampled_from(UNARY_CASES), seed=st.integers(0, 2**16))  # fmt: skip
def test_unary_matches_torch_hypothesis(device, shape, case, seed):
    name, dtype = case
    check_unary(device, name, reference(unary_reference(name, dtype)[1], shape, dtype, seed))
