"""Gradients of the element-wise and reduction rules against PyTorch autograd and finite differences.

Each case is one function written twice (ember, torch) over NumPy inputs. Every
case runs on plain inputs and on non-contiguous ones (a permuted view, a strided
slice) in float64 and float32 against torch autograd, and in float64 against
central finite differences on inputs away from kinks and ties. A Hypothesis test
builds small random graphs mixing these ops and compares them with torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gradcheck import check_against_torch, check_finite_differences
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember
from ember import DType, Tensor
from ember import activation as A

DTYPES = [DType.F64, DType.F32]
RNG = np.random.default_rng


@dataclass
class Case:
    ember_fn: object
    torch_fn: object
    inputs: object  # () -> list of arrays (may hold kinks and ties: checked against torch only)
    smooth: object = None  # () -> inputs away from kinks, for finite differences (default: inputs)
    differentiable: list | None = None
    fd: bool = True  # False: a kink or tie in every input, or a cast through float32
    layouts: tuple = ("plain", "permuted", "sliced")


def _u(lo, hi, shape, seed=0):
    return lambda: [RNG(seed).uniform(lo, hi, size=shape)]


def _u2(lo, hi, shape_a, shape_b, seed=0, lo_b=None, hi_b=None):
    def make():
        r = RNG(seed)
        return [r.uniform(lo, hi, size=shape_a), r.uniform(lo if lo_b is None else lo_b, hi if hi_b is None else hi_b, size=shape_b)]

    return make


def _with_values(make, index, values):
    """Inputs from ``make`` with the first elements of input ``index`` set to ``values``."""

    def out():
        arrays = make()
        arrays[index].reshape(-1)[: len(values)] = values
        return arrays

    return out


def _tied_pair():
    # max_pair / min_pair: equal operands at several places, and a broadcast operand.
    r = RNG(3)
    a = np.round(r.uniform(-2, 2, size=(2, 3, 4)), 0)
    b = np.round(r.uniform(-2, 2, size=(3, 4)), 0)
    b[0, :2] = a[0, 0, :2]
    return [a, b]


def _tied_rows():
    # max / min along a dim with repeated extremes (torch's amax / amin split the gradient evenly).
    x = np.round(RNG(4).uniform(-2, 2, size=(3, 4, 5)), 0)
    x[0, 0, :] = 1.5
    x[1, :, 2] = -7.0
    x[2, 1, 1:4] = 9.0
    return [x]


def _distinct(shape, seed=5):
    # a permutation: no ties anywhere, so every max / min / sort has one winner.
    n = int(np.prod(shape))
    return lambda: [(RNG(seed).permutation(n).reshape(shape) - n / 2) * 0.37 + 0.1]


def _away_from_integers(lo, hi, shape, seed):
    """Values whose ratio to 1.5 and to the divisors below stays away from integers."""
    x = RNG(seed).uniform(lo, hi, size=shape)
    return np.floor(x) + 0.3 + 0.4 * (x - np.floor(x))


def _remainder_inputs():
    a = _away_from_integers(-6, 6, (2, 3, 4), 6)
    b = np.array([1.25, -2.5, 3.0, 0.75])
    q = a / b
    a = np.where(np.abs(q - np.round(q)) < 0.05, a + 0.11, a)
    return [a, b]


def _atan2_origin():
    a, b = RNG(12).uniform(-2, 2, size=(2, 3)), RNG(13).uniform(0.3, 2, size=(2, 3))
    a[0, :2], b[0, :2] = 0.0, 0.0
    return [a, b]


def _zero_base_pow():
    # zero bases with zero and positive exponents: torch's convention, not 0 * inf = NaN
    a = RNG(11).uniform(0.5, 2.0, size=(2, 3, 4))
    a[:, :, :2] = 0.0
    return [a, np.array([[0.0], [2.0], [1.0]])]


def _mask_inputs():
    r = RNG(7)
    return [r.normal(size=(2, 3, 4)), r.uniform(size=(3, 1)) > 0.5, r.normal(size=(4,))]


def _mask_fill_inputs():
    r = RNG(8)
    return [r.normal(size=(2, 3, 4)), r.uniform(size=(2, 1, 4)) > 0.5]


T = torch
# fmt: off
CASES: dict[str, Case] = {
    # ---------------------------------------------------------------- binary, with broadcasting
    "add": Case(lambda a, b: a + b, lambda a, b: a + b, _u2(-2, 2, (2, 3, 4), (3, 1))),
    "sub": Case(lambda a, b: a - b, lambda a, b: a - b, _u2(-2, 2, (3, 1), (2, 3, 4))),
    "mul": Case(lambda a, b: a * b, lambda a, b: a * b, _u2(-2, 2, (2, 3, 4), (4,))),
    "mul_self": Case(lambda a: a * a, lambda a: a * a, _u(-2, 2, (2, 3, 4))),
    "div": Case(lambda a, b: a / b, lambda a, b: a / b, _u2(-2, 2, (2, 3, 4), (3, 1), lo_b=0.5, hi_b=2.0)),
    "div_negative": Case(lambda a, b: a / b, lambda a, b: a / b, _u2(-2, 2, (1, 4), (2, 3, 4), lo_b=-2.0, hi_b=-0.5)),
    "remainder": Case(lambda a, b: a % b, T.remainder, _remainder_inputs),
    "pow": Case(lambda a, b: a.pow(b), T.pow, _u2(0.5, 2.0, (2, 3, 4), (3, 1), lo_b=-2.0, hi_b=3.0)),
    "pow_zero_base": Case(lambda a, b: a.pow(b), T.pow, _zero_base_pow, fd=False),
    "max_pair": Case(lambda a, b: a.max_pair(b), T.maximum, _tied_pair, smooth=_u2(-2, 2, (2, 3, 4), (3, 4))),
    "min_pair": Case(lambda a, b: a.min_pair(b), T.minimum, _tied_pair, smooth=_u2(-2, 2, (2, 3, 4), (3, 4))),
    "max_pair_self": Case(lambda a: a.max_pair(a), lambda a: T.maximum(a, a), _u(-2, 2, (2, 3, 4))),
    "atan2": Case(lambda a, b: a.atan2(b), T.atan2, _u2(-2, 2, (2, 3, 4), (4,), lo_b=0.3, hi_b=2.0)),
    "atan2_origin": Case(lambda a, b: a.atan2(b), T.atan2, _atan2_origin, fd=False),
    "atan2_negative": Case(lambda a, b: a.atan2(b), T.atan2, _u2(-2, 2, (3, 1), (2, 3, 4), lo_b=-2.0, hi_b=-0.3)),
    # ---------------------------------------------------------------- with a scalar
    "add_scalar": Case(lambda a: a + 2.5, lambda a: a + 2.5, _u(-2, 2, (2, 3, 4))),
    "sub_scalar": Case(lambda a: a - 2.5, lambda a: a - 2.5, _u(-2, 2, (2, 3, 4))),
    "rsub_scalar": Case(lambda a: 2.5 - a, lambda a: 2.5 - a, _u(-2, 2, (2, 3, 4))),
    "mul_scalar": Case(lambda a: a * -1.5, lambda a: a * -1.5, _u(-2, 2, (2, 3, 4))),
    "div_scalar": Case(lambda a: a / 0.3, lambda a: a / 0.3, _u(-2, 2, (2, 3, 4))),
    "rdiv_scalar": Case(lambda a: 2.0 / a, lambda a: 2.0 / a, _u(0.5, 2.0, (2, 3, 4))),
    "remainder_scalar": Case(lambda a: a % 1.5, lambda a: T.remainder(a, 1.5),
                             lambda: [_away_from_integers(-6, 6, (2, 3, 4), 9) * 1.5]),
    "pow_scalar_3": Case(lambda a: a**3, lambda a: a**3, _u(-2, 2, (2, 3, 4))),
    "pow_scalar_half": Case(lambda a: a**0.5, lambda a: a**0.5, _u(0.5, 2, (2, 3, 4))),
    "pow_scalar_neg2": Case(lambda a: a**-2.0, lambda a: a**-2.0, _u(0.5, 2, (2, 3, 4))),
    "pow_scalar_0": Case(lambda a: a**0, lambda a: a**0, _with_values(_u(-2, 2, (2, 3, 4)), 0, [0.0])),
    "pow_scalar_1": Case(lambda a: a**1, lambda a: a**1, _with_values(_u(-2, 2, (2, 3, 4)), 0, [0.0])),
    "rpow_scalar": Case(lambda a: 2.0**a, lambda a: 2.0**a, _u(-2, 2, (2, 3, 4))),
    "max_pair_scalar": Case(lambda a: a.max_pair(0.5), lambda a: T.clamp_min(a, 0.5),
                            _with_values(_u(-2, 2, (2, 3, 4)), 0, [0.5, 0.5]), smooth=_u(0.6, 2, (2, 3))),
    "min_pair_scalar": Case(lambda a: a.min_pair(0.5), lambda a: T.clamp_max(a, 0.5),
                            _with_values(_u(-2, 2, (2, 3, 4)), 0, [0.5, 0.5]), smooth=_u(-2, 0.4, (2, 3))),
    "clamp": Case(lambda a: a.clamp(-0.5, 1.0), lambda a: T.clamp(a, -0.5, 1.0),
                  _with_values(_u(-2, 2, (2, 3, 4)), 0, [-0.5, 1.0, -0.5, 1.0]), smooth=_u(-0.4, 0.9, (2, 3))),
    "clamp_min": Case(lambda a: a.clamp_min(0.0), lambda a: T.clamp(a, min=0.0),
                      _with_values(_u(-2, 2, (2, 3, 4)), 0, [0.0]), smooth=_u(0.1, 2, (2, 3))),
    "clamp_max": Case(lambda a: a.clamp_max(0.0), lambda a: T.clamp(a, max=0.0),
                      _with_values(_u(-2, 2, (2, 3, 4)), 0, [0.0]), smooth=_u(-2, -0.1, (2, 3))),
    # ---------------------------------------------------------------- unary
    "neg": Case(lambda a: -a, lambda a: -a, _u(-2, 2, (2, 3, 4))),
    "abs": Case(lambda a: a.abs(), T.abs, _with_values(_u(-2, 2, (2, 3, 4)), 0, [0.0, -0.0]),
                smooth=_u(0.1, 2, (2, 3))),
    "exp": Case(lambda a: a.exp(), T.exp, _u(-3, 3, (2, 3, 4))),
    "log": Case(lambda a: a.log(), T.log, _u(0.2, 3, (2, 3, 4))),
    "log1p": Case(lambda a: a.log1p(), T.log1p, _u(-0.8, 3, (2, 3, 4))),
    "expm1": Case(lambda a: a.expm1(), T.expm1, _u(-3, 3, (2, 3, 4))),
    "erf": Case(lambda a: a.erf(), T.erf, _u(-3, 3, (2, 3, 4))),
    "sqrt": Case(lambda a: a.sqrt(), T.sqrt, _u(0.2, 3, (2, 3, 4))),
    "rsqrt": Case(lambda a: a.rsqrt(), T.rsqrt, _u(0.2, 3, (2, 3, 4))),
    "recip": Case(lambda a: a.recip(), T.reciprocal, _u(0.3, 3, (2, 3, 4))),
    "recip_negative": Case(lambda a: a.recip(), T.reciprocal, _u(-3, -0.3, (2, 3, 4))),
    "sin": Case(lambda a: a.sin(), T.sin, _u(-4, 4, (2, 3, 4))),
    "cos": Case(lambda a: a.cos(), T.cos, _u(-4, 4, (2, 3, 4))),
    "tan": Case(lambda a: a.tan(), T.tan, _u(-1.2, 1.2, (2, 3, 4))),
    "sinh": Case(lambda a: a.sinh(), T.sinh, _u(-3, 3, (2, 3, 4))),
    "cosh": Case(lambda a: a.cosh(), T.cosh, _u(-3, 3, (2, 3, 4))),
    "tanh": Case(lambda a: a.tanh(), T.tanh, _u(-3, 3, (2, 3, 4))),
    "asin": Case(lambda a: a.asin(), T.asin, _u(-0.9, 0.9, (2, 3, 4))),
    "acos": Case(lambda a: a.acos(), T.acos, _u(-0.9, 0.9, (2, 3, 4))),
    "atan": Case(lambda a: a.atan(), T.atan, _u(-3, 3, (2, 3, 4))),
    "sign": Case(lambda a: a.sign() * a, lambda a: a.sign() * a, _u(-2, 2, (2, 3, 4))),
    "round_floor_ceil_trunc": Case(lambda a: a.round() + a.floor() * 2.0 + a.ceil() * 3.0 + a.trunc() * 4.0 + a,
                                   lambda a: a.round() + a.floor() * 2.0 + a.ceil() * 3.0 + a.trunc() * 4.0 + a,
                                   lambda: [_away_from_integers(-3, 3, (2, 3, 4), 10)]),
    # ---------------------------------------------------------------- selection and casts
    "mask_where": Case(lambda x, m, v: x.mask_where(m, v), lambda x, m, v: T.where(m, v, x), _mask_inputs,
                       differentiable=[True, False, True], layouts=("plain",)),
    "mask_fill": Case(lambda x, m: x.mask_fill(m, 3.0), lambda x, m: x.masked_fill(m, 3.0), _mask_fill_inputs,
                      differentiable=[True, False], layouts=("plain",)),
    "cast_roundtrip": Case(lambda a: (a.cast(DType.F32) * 2.0).cast(DType.F64) * a,
                           lambda a: (a.float() * 2.0).double() * a, _u(-2, 2, (2, 3, 4)), fd=False),
    "cast_f64_f32": Case(lambda a: a.cast(DType.F64).exp().cast(DType.F32),
                         lambda a: a.double().exp().float(), _u(-2, 2, (2, 3, 4)), fd=False),
    "mixed_dtypes_promote": Case(lambda a: a * a.cast(DType.F32), lambda a: a * a.float(), _u(-2, 2, (2, 3, 4)),
                                 fd=False),
    # ---------------------------------------------------------------- reductions
    "sum": Case(lambda a: a.sum(), T.sum, _u(-2, 2, (2, 3, 4))),
    "mean": Case(lambda a: a.mean(), T.mean, _u(-2, 2, (2, 3, 4))),
    "prod": Case(lambda a: a.prod(), T.prod, _u(0.5, 1.5, (2, 3, 4))),
    "prod_negative": Case(lambda a: a.prod(), T.prod, _u(-1.5, -0.5, (2, 3))),
    "sum_dim": Case(lambda a: a.sum_dim(1), lambda a: a.sum(1, keepdim=True), _u(-2, 2, (2, 3, 4))),
    "mean_dim": Case(lambda a: a.mean_dim(2), lambda a: a.mean(2, keepdim=True), _u(-2, 2, (2, 3, 4))),
    "prod_dim": Case(lambda a: a.prod_dim(0), lambda a: a.prod(0, keepdim=True), _u(-1.5, 1.5, (2, 3, 4))),
    "max": Case(lambda a: a.max(), T.amax, _tied_rows, smooth=_distinct((2, 3))),
    "min": Case(lambda a: a.min(), T.amin, _tied_rows, smooth=_distinct((2, 3))),
    "max_all_tied": Case(lambda a: a.max(), T.amax, lambda: [np.full((2, 3), 0.5)], fd=False),
    "max_dim": Case(lambda a: a.max_dim(2), lambda a: T.amax(a, 2, keepdim=True), _tied_rows,
                    smooth=_distinct((2, 3, 2))),
    "min_dim": Case(lambda a: a.min_dim(1), lambda a: T.amin(a, 1, keepdim=True), _tied_rows,
                    smooth=_distinct((2, 3, 2))),
    "max_dim_with_indices": Case(lambda a: a.max_dim_with_indices(1)[0],
                                 lambda a: T.max(a, 1, keepdim=True).values, _distinct((3, 4, 2))),
    "min_dim_with_indices": Case(lambda a: a.min_dim_with_indices(0)[0],
                                 lambda a: T.min(a, 0, keepdim=True).values, _distinct((3, 4, 2))),
    "cumsum": Case(lambda a: a.cumsum(1), lambda a: a.cumsum(1), _u(-2, 2, (2, 3, 4))),
    "cumprod": Case(lambda a: a.cumprod(2), lambda a: a.cumprod(2), _u(0.5, 1.5, (2, 3, 4))),
    "cumprod_negative": Case(lambda a: a.cumprod(0), lambda a: a.cumprod(0), _u(-1.5, -0.5, (3, 2, 2))),
    "sort": Case(lambda a: a.sort(1) * a.sort(1), lambda a: T.sort(a, 1).values ** 2, _distinct((3, 4, 2))),
    "sort_descending": Case(lambda a: a.sort(-1, descending=True), lambda a: T.sort(a, -1, descending=True).values,
                            _distinct((3, 4, 2))),
    "sort_with_indices": Case(lambda a: a.sort_with_indices(0)[0], lambda a: T.sort(a, 0).values,
                              _distinct((3, 4, 2))),
    "topk": Case(lambda a: a.topk(2, 1), lambda a: T.topk(a, 2, 1).values, _distinct((3, 4, 2))),
    "topk_smallest": Case(lambda a: a.topk(3, -1, largest=False), lambda a: T.topk(a, 3, -1, largest=False).values,
                          _distinct((3, 2, 4))),
    "var": Case(lambda a: a.var(1), lambda a: T.var(a, 1, keepdim=True), _u(-2, 2, (2, 3, 4))),
    "var_bias": Case(lambda a: a.var_bias(2), lambda a: T.var(a, 2, keepdim=True, correction=0),
                     _u(-2, 2, (2, 3, 4))),
    "var_mean": Case(lambda a: (lambda v, m: v * m + v)(*a.var_mean(0)),
                     lambda a: (lambda v, m: v * m + v)(*T.var_mean(a, 0, keepdim=True)), _u(-2, 2, (2, 3, 4))),
    "var_mean_bias": Case(lambda a: (lambda v, m: v - m * m)(*a.var_mean_bias(1)),
                          lambda a: (lambda v, m: v - m * m)(*T.var_mean(a, 1, keepdim=True, correction=0)),
                          _u(-2, 2, (2, 3, 4))),
}
# fmt: on


# ------------------------------------------------------------------ layouts
def _transform(layout: str, i: int, rank: int):
    """How input ``i`` of a given rank is made non-contiguous: ember and torch versions."""
    if layout == "plain" or rank == 0:
        return (lambda t: t), (lambda t: t)
    if layout == "permuted" and rank >= 2:
        axes = list(range(rank))[::-1] if i % 2 == 0 else [*range(1, rank), 0]
        inverse = list(np.argsort(axes))
        # the input is stored with axes ``axes`` and permuted back: same values, strided view
        return (lambda t: t.permute(inverse)), (lambda t: t.permute(inverse))
    # sliced: every other element of the last dim of an input twice as wide
    return (lambda t: t[..., ::2]), (lambda t: t[..., ::2])


def _layout_inputs(layout: str, arrays: list) -> list:
    out = []
    for i, a in enumerate(arrays):
        if a.dtype == bool or a.ndim == 0 or layout == "plain":
            out.append(a)
        elif layout == "permuted" and a.ndim >= 2:
            axes = list(range(a.ndim))[::-1] if i % 2 == 0 else [*range(1, a.ndim), 0]
            out.append(np.ascontiguousarray(np.transpose(a, axes)))
        else:
            wide = np.repeat(a, 2, axis=-1)
            wide[..., 1::2] = 1e6  # never read
            out.append(wide)
    return out


def _wrapped(case: Case, layout: str, arrays: list):
    if layout == "plain":
        return case.ember_fn, case.torch_fn, arrays
    transforms = [_transform(layout, i, a.ndim) if a.dtype != bool else ((lambda t: t),) * 2
                  for i, a in enumerate(arrays)]  # fmt: skip

    def ember_fn(*ts):
        return case.ember_fn(*[tr[0](t) for tr, t in zip(transforms, ts)])

    def torch_fn(*ts):
        return case.torch_fn(*[tr[1](t) for tr, t in zip(transforms, ts)])

    return ember_fn, torch_fn, _layout_inputs(layout, arrays)


def _params():
    for name, case in CASES.items():
        for layout in case.layouts:
            yield pytest.param(name, layout, id=f"{name}-{layout}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "layout"), list(_params()))
def test_rule_vs_torch(device, name, layout, dtype):
    case = CASES[name]
    ember_fn, torch_fn, inputs = _wrapped(case, layout, case.inputs())
    check_against_torch(ember_fn, torch_fn, inputs, device, dtype, case.differentiable)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.fd])
def test_rule_finite_differences(device, name):
    case = CASES[name]
    inputs = (case.smooth or case.inputs)()
    # keep finite differences cheap: at most a few dozen elements per input
    assert all(a.size <= 48 for a in inputs), name
    check_finite_differences(case.ember_fn, inputs, device, case.differentiable)


def test_a_non_contiguous_leaf_gets_a_gradient_of_its_own_shape(device):
    # The leaf itself is a strided view of an inner primitive (not made by a tracked op).
    base = Tensor.from_data(np.arange(24.0).reshape(2, 3, 4) / 10.0, device.inner()).cast(DType.F64)
    view = Tensor.from_inner(base.permute(2, 0, 1)[::2], device).require_grad()
    grads = (view.exp() * view.sin()).sum_dim(1).max_dim(0).sum().backward()
    x = torch.from_numpy(np.arange(24.0).reshape(2, 3, 4) / 10.0).permute(2, 0, 1)[::2].detach().requires_grad_()
    (x.exp() * x.sin()).sum(1, keepdim=True).amax(0, keepdim=True).sum().backward()
    g = view.grad(grads)
    assert tuple(g.shape) == tuple(x.shape)
    g.into_data().assert_approx_eq(ember.TensorData(x.grad.numpy()), rtol=1e-12, atol=1e-12)


def test_an_untracked_operand_gets_no_gradient(device):
    # An untracked operand (a constant) gets no gradient; the tracked one still does.
    x = Tensor.from_data([[1.0, 2.0]], device).require_grad()
    c = Tensor.from_data([[3.0], [4.0]], device)
    grads = (x.pow(c) + c.atan2(x)).sum().backward()
    assert c.grad(grads) is None
    expected = torch.tensor([[1.0, 2.0]], dtype=torch.float32, requires_grad=True)
    (expected.pow(torch.tensor([[3.0], [4.0]])) + torch.atan2(torch.tensor([[3.0], [4.0]]), expected)).sum().backward()
    x.grad(grads).into_data().assert_approx_eq(ember.TensorData(expected.grad.numpy()), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ random graphs (Hypothesis)
# Ops that are defined on all reals (so any random graph is valid) and whose gradient
# conventions at kinks and ties match torch's, so the comparison may hit them too.
UNARY = {
    "neg": (lambda x: -x, lambda x: -x),
    "abs": (lambda x: x.abs(), T.abs),
    "square": (lambda x: x * x, lambda x: x * x),
    "tanh": (lambda x: x.tanh(), T.tanh),
    "sin": (lambda x: x.sin(), T.sin),
    "atan": (lambda x: x.atan(), T.atan),
    "erf": (lambda x: x.erf(), T.erf),
    "exp_tanh": (lambda x: x.tanh().exp(), lambda x: x.tanh().exp()),
    "log1p_sq": (lambda x: (x * x).log1p(), lambda x: (x * x).log1p()),
    "sqrt_1p_sq": (lambda x: (x * x + 1.0).sqrt(), lambda x: (x * x + 1.0).sqrt()),
    "rsqrt_1p_sq": (lambda x: (x * x + 1.0).rsqrt(), lambda x: (x * x + 1.0).rsqrt()),
    "recip_1p_sq": (lambda x: (x * x + 1.0).recip(), lambda x: (x * x + 1.0).reciprocal()),
    "clamp": (lambda x: x.clamp(-1.0, 1.0), lambda x: x.clamp(-1.0, 1.0)),
    "relu": (A.relu, F.relu),
    "sigmoid": (A.sigmoid, T.sigmoid),
    "gelu": (A.gelu, F.gelu),
    "softplus": (A.softplus, F.softplus),
    "scale": (lambda x: x * 0.7 - 0.2, lambda x: x * 0.7 - 0.2),
    "pow_scalar": (lambda x: x**2.0, lambda x: x**2.0),
    "max_scalar": (lambda x: x.max_pair(0.1), lambda x: x.clamp_min(0.1)),
}
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div_safe": (lambda a, b: a / (b * b + 1.0), lambda a, b: a / (b * b + 1.0)),
    "max_pair": (lambda a, b: a.max_pair(b), T.maximum),
    "min_pair": (lambda a, b: a.min_pair(b), T.minimum),
    "atan2_safe": (lambda a, b: a.atan2(b * b + 0.5), lambda a, b: T.atan2(a, b * b + 0.5)),
}


# Reductions: the whole tensor, or along a dim picked at run time; dims are kept, so every
# value stays broadcastable with the others.
REDUCE = {
    "sum": (lambda x, d: x.sum(), lambda x, d: x.sum()),
    "mean": (lambda x, d: x.mean(), lambda x, d: x.mean()),
    "max": (lambda x, d: x.max(), lambda x, d: x.amax()),
    "min": (lambda x, d: x.min(), lambda x, d: x.amin()),
    "sum_dim": (lambda x, d: x.sum_dim(d), lambda x, d: x.sum(d, keepdim=True)),
    "mean_dim": (lambda x, d: x.mean_dim(d), lambda x, d: x.mean(d, keepdim=True)),
    "max_dim": (lambda x, d: x.max_dim(d), lambda x, d: x.amax(d, keepdim=True)),
    "min_dim": (lambda x, d: x.min_dim(d), lambda x, d: x.amin(d, keepdim=True)),
    "cumsum": (lambda x, d: x.cumsum(d), lambda x, d: x.cumsum(d)),
    "softmax": (lambda x, d: A.softmax(x, d), lambda x, d: F.softmax(x, d)),
    "log_softmax": (lambda x, d: A.log_softmax(x, d), lambda x, d: F.log_softmax(x, d)),
    "var_bias": (lambda x, d: x.var_bias(d), lambda x, d: x.var(d, keepdim=True, correction=0)),
    "sort": (lambda x, d: x.sort(d), lambda x, d: x.sort(d).values),
}


@st.composite
def graphs(draw):
    rank = draw(st.integers(0, 3))
    base = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    n_inputs = draw(st.integers(1, 3))
    shapes = []
    for _ in range(n_inputs):
        lead = draw(st.integers(0, rank))  # broadcasting may drop leading dims ...
        shapes.append(tuple(s if draw(st.booleans()) else 1 for s in base[lead:]))  # ... and stretch others
    values = st.floats(-3.0, 3.0, allow_nan=False, width=64) | st.sampled_from([0.0, 1.0, -1.0, 0.5])
    arrays = [np.array(draw(st.lists(values, min_size=int(np.prod(s)), max_size=int(np.prod(s)))),
                       dtype=np.float64).reshape(s) for s in shapes]  # fmt: skip
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce"]))
        table = {"unary": UNARY, "binary": BINARY, "reduce": REDUCE}[kind]
        steps.append((kind, draw(st.sampled_from(sorted(table))), draw(st.integers(0, 1000)),
                      draw(st.integers(0, 1000))))  # fmt: skip
    return arrays, steps


def _run_graph(inputs, steps, side):
    """Runs the drawn steps on ``inputs`` (ember tensors: side 0, torch: side 1); sums every value made."""
    pool = list(inputs)
    for kind, name, i, j in steps:
        a, b = pool[i % len(pool)], pool[j % len(pool)]
        if kind == "unary":
            pool.append(UNARY[name][side](a))
        elif kind == "binary":
            pool.append(BINARY[name][side](a, b))
        else:
            rank = len(a.shape)
            if rank == 0:  # nothing to reduce along: reduce the whole (one-element) tensor
                name = {"softmax": "sum", "log_softmax": "mean", "cumsum": "sum", "sort": "max"}.get(name, name)
                name = name.removesuffix("_dim") if name != "var_bias" else "mean"
            pool.append(REDUCE[name][side](a, j % max(rank, 1)))
    out = pool[0]
    for value in pool[1:]:  # every input and every step reaches the output
        out = out + value
    return out


@pytest.mark.parametrize("backend", ["ndarray", "torch"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_vs_torch(backend, graph):
    arrays, steps = graph
    device = ember.device(backend).autodiff()
    check_against_torch(lambda *ts: _run_graph(ts, steps, 0), lambda *ts: _run_graph(ts, steps, 1),
                        arrays, device, DType.F64)  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [[[2.0, 0.0, 3.0], [0.0, 0.0, 4.0]], [[1.5, -2.0, 0.5], [3.0, 0.25, -1.0]], [[0.0, 1.0, 2.0], [5.0, 6.0, 7.0]]],
    ids=["two-zeros", "no-zero", "one-zero"],
)
@pytest.mark.parametrize("reduction", ["prod", "prod_dim0", "prod_dim1"])
def test_prod_gradient_is_exact_with_zeros(device, values, reduction):
    def ember_fn(x):
        return x.prod() if reduction == "prod" else x.prod_dim(int(reduction[-1]))

    def torch_fn(x):
        return x.prod() if reduction == "prod" else x.prod(int(reduction[-1]), keepdim=True)

    check_against_torch(ember_fn, torch_fn, [np.array(values)], device)
