"""Conformance of the reductions and scans against PyTorch (and exact values for Int means).

Conventions under test: full reductions (``sum``, ``max``, ...) give 0-d tensors;
``*_dim`` reductions, ``argmax`` / ``argmin`` and ``var`` keep the reduced dim with
size 1 (compared with torch's ``keepdim=True``); Int reductions keep the input's
dtype (torch widens Int sums and products to int64, so only values are compared
with it); the Int mean truncates toward zero; ``argmax`` / ``argmin`` give the
first of equal extremes as an i64 tensor; NaN propagates through ``max`` / ``min``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    TORCH_DTYPE,
    assert_close,
    from_torch,
    raises_with,
    random_pair,
)

import ember
from ember import DType, Tensor

NUMERIC_DTYPES = FLOAT_DTYPES + INT_DTYPES
NAN, INF = math.nan, math.inf

FULL_REFERENCE = {
    "sum": torch.sum,
    "prod": torch.prod,
    "mean": torch.mean,
    "max": torch.max,
    "min": torch.min,
}
DIM_REDUCTIONS = ["sum_dim", "prod_dim", "mean_dim", "max_dim", "min_dim"]
ALONG = {  # the torch counterpart of each ember op along a dim, (tensor, dim) -> result
    "sum_dim": lambda r, d: torch.sum(r, d, keepdim=True),
    "prod_dim": lambda r, d: torch.prod(r, d, keepdim=True),
    "mean_dim": lambda r, d: torch.mean(r, d, keepdim=True),
    "max_dim": lambda r, d: torch.amax(r, d, keepdim=True),
    "min_dim": lambda r, d: torch.amin(r, d, keepdim=True),
    "argmax": lambda r, d: torch.argmax(r, d, keepdim=True),
    "argmin": lambda r, d: torch.argmin(r, d, keepdim=True),
    "max_dim_with_indices": lambda r, d: torch.max(r, d, keepdim=True),
    "min_dim_with_indices": lambda r, d: torch.min(r, d, keepdim=True),
    "any_dim": lambda r, d: torch.any(r, d, keepdim=True),
    "all_dim": lambda r, d: torch.all(r, d, keepdim=True),
    "cumsum": torch.cumsum,
    "cumprod": torch.cumprod,
    "var": lambda r, d: torch.var(r, d, keepdim=True),
    "var_mean": lambda r, d: torch.var_mean(r, d, keepdim=True),
}
DIM_CASES = [((2, 3, 4), 1), ((2, 3, 4), -1), ((2, 3, 4), -3), ((3, 1, 4), 1), ((5,), -1),
             ((1, 1), 0)]  # fmt: skip


def _pair(op: str, shape: tuple[int, ...], dtype: DType, device, seed: int = 0):
    """Random operands in a range where ``op`` cannot overflow the dtype (prod: near 1)."""
    if op.startswith(("prod", "cumprod")):
        low, high = (0.5, 1.5) if dtype.is_float else (-2, 3)
    else:
        low, high = (-3.0, 3.0) if dtype.is_float else (-5, 6)
    return random_pair(shape, dtype, device, low, high, seed)


def _trunc_mean(values: np.ndarray, dim: int | None = None) -> np.ndarray:
    """The exact Int mean, truncated toward zero (as Rust's integer division)."""
    total = values.astype(np.int64).sum(axis=dim, keepdims=dim is not None)
    count = values.size if dim is None else values.shape[dim]
    return np.sign(total) * (np.abs(total) // count)


def _check(out, expected) -> None:
    """Compares one result, or a pair such as (values, indices), with torch's."""
    if isinstance(out, tuple):
        assert len(out) == len(expected)
        for ours, theirs in zip(out, expected):
            assert_close(ours, theirs)
    else:
        assert_close(out, expected)


def _first_index(op: str, ref: torch.Tensor, dim: int) -> np.ndarray:
    """The index of the first maximum (``argmax``) or minimum (``argmin``), dim kept."""
    values = ref.double().numpy()
    found = np.argmax(values, axis=dim) if op == "argmax" else np.argmin(values, axis=dim)
    return np.expand_dims(found, dim)


# ---------------------------------------------------------------- full reductions
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (1, 1, 3)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(FULL_REFERENCE))
def test_full_reduction_float(device, op, dtype, shape):
    x, ref = _pair(op, shape, dtype, device)
    out = getattr(x, op)()
    assert out.shape == ()
    assert_close(out, FULL_REFERENCE[op](ref))


@pytest.mark.parametrize("shape", [(), (6,), (2, 3)])
@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_full_reduction_int_keeps_dtype(device, op, dtype, shape):
    x, ref = _pair(op, shape, dtype, device)
    out = getattr(x, op)()
    assert out.shape == () and out.dtype is dtype
    assert_close(out, FULL_REFERENCE[op](ref), check_dtype=False)


@pytest.mark.parametrize("shape", [(), (7,), (3, 5)])
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_int_mean_truncates_toward_zero(device, dtype, shape):
    x, ref = random_pair(shape, dtype, device, -9, 10, seed=3)
    out = x.mean()
    assert out.shape == () and out.dtype is dtype
    assert_close(out, _trunc_mean(ref.numpy()))


def test_int_mean_truncates_halves_toward_zero(device):
    x = Tensor.from_data([[-3, -4], [3, 4], [-7, 0]], device)
    assert x.mean_dim(1).tolist() == [[-3], [3], [-3]]  # -3.5 -> -3, 3.5 -> 3, -3.5 -> -3
    assert x.mean_dim(0).tolist() == [[-2, 0]]  # -7 / 3 -> -2
    assert Tensor.from_data([-7, 0], device).mean().item() == -3


# ---------------------------------------------------------------- reductions along a dim
@pytest.mark.parametrize(("shape", "dim"), DIM_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", DIM_REDUCTIONS)
def test_reduce_dim_float(device, op, dtype, shape, dim):
    x, ref = _pair(op, shape, dtype, device)
    assert_close(getattr(x, op)(dim), ALONG[op](ref, dim))


@pytest.mark.parametrize(("shape", "dim"), DIM_CASES[:4])
@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("op", DIM_REDUCTIONS)
def test_reduce_dim_int_keeps_dtype(device, op, dtype, shape, dim):
    x, ref = _pair(op, shape, dtype, device)
    out = getattr(x, op)(dim)
    assert out.dtype is dtype
    if op == "mean_dim":  # torch has no Int mean
        expected = _trunc_mean(ref.numpy(), dim)
    else:
        expected = ALONG[op](ref, dim)
    assert_close(out, expected, check_dtype=False)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_extreme_takes_first_of_ties(device, op, dtype, dim):
    x, ref = random_pair((3, 4, 5), dtype, device, 0, 3, integral=True)  # many ties
    out = getattr(x, op)(dim)
    assert out.kind is ember.Int and out.dtype is DType.I64
    assert_close(out, _first_index(op, ref, dim))
    assert_close(out, getattr(torch, op)(ref, dim, keepdim=True))


@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
@pytest.mark.parametrize("op", ["max", "min"])
def test_extreme_dim_with_indices(device, op, dtype, dim):
    x, ref = random_pair((3, 4, 5), dtype, device, 0, 3, integral=True)
    values, indices = getattr(x, f"{op}_dim_with_indices")(dim)
    assert_close(values, ALONG[f"{op}_dim"](ref, dim))
    assert indices.dtype is DType.I64
    assert_close(indices, _first_index(f"arg{op}", ref, dim))


# ---------------------------------------------------------------- NaN
NAN_DATA = [[1.0, NAN, 3.0, NAN], [2.0, 5.0, 5.0, -INF], [INF, 0.0, -1.0, INF]]
EXTREMES_ALONG = ["max_dim", "min_dim", "argmax", "argmin", "max_dim_with_indices",
                  "min_dim_with_indices"]  # fmt: skip


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", ["max", "min"])
def test_nan_propagates_through_full_extremes(device, op, dtype):
    ref = torch.tensor(NAN_DATA, dtype=TORCH_DTYPE[dtype])
    assert_close(getattr(from_torch(ref, device), op)(), FULL_REFERENCE[op](ref))


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", EXTREMES_ALONG)
def test_nan_propagates_through_extremes_along_a_dim(device, op, dtype, dim):
    ref = torch.tensor(NAN_DATA, dtype=TORCH_DTYPE[dtype])
    _check(getattr(from_torch(ref, device), op)(dim), ALONG[op](ref, dim))


# ---------------------------------------------------------------- any / all
ANY_ALL_DATA = [[[0, 0, 0], [1, 0, 2], [3, 1, 1]], [[1, 2], [3, 4]], [[0, 0]]]


@pytest.mark.parametrize("data", ANY_ALL_DATA, ids=["mixed", "all-true", "all-false"])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", ["any", "all"])
def test_any_all(device, op, dtype, data):
    ref = torch.tensor(data).to(TORCH_DTYPE[dtype])
    x = from_torch(ref, device)
    reference = getattr(torch, op)
    out = getattr(x, op)()
    assert out.shape == () and out.dtype is DType.BOOL
    assert_close(out, reference(ref), check_dtype=False)  # torch gives u8 for u8 input
    for dim in (0, 1, -1):
        out = getattr(x, f"{op}_dim")(dim)
        assert out.dtype is DType.BOOL
        assert_close(out, reference(ref, dim, keepdim=True), check_dtype=False)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_any_all_count_nan_as_true(device, dtype):
    ref = torch.tensor([[NAN, 0.0], [NAN, NAN]], dtype=TORCH_DTYPE[dtype])
    x = from_torch(ref, device)
    assert_close(x.any_dim(1), torch.any(ref, 1, keepdim=True))
    assert_close(x.all_dim(1), torch.all(ref, 1, keepdim=True))
    assert x.any().item() is True and x.all().item() is False


# ---------------------------------------------------------------- scans
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scan(device, op, dtype, dim):
    x, ref = _pair(op, (2, 3, 4), dtype, device)
    out = getattr(x, op)(dim)
    assert out.dtype is dtype
    assert_close(out, getattr(torch, op)(ref, dim), check_dtype=False)  # torch widens Int to i64


# ---------------------------------------------------------------- variance
# The composite computes (x - mean)^2 in the input dtype: f16 / bf16 get a looser bound.
VAR_TOLERANCE = {DType.F16: {"rtol": 1e-2, "atol": 1e-2}, DType.BF16: {"rtol": 5e-2, "atol": 5e-2}}
VAR_CASES = [((3, 5), 1), ((3, 5), 0), ((2, 3, 4), -1), ((2, 3, 4), -2)]


@pytest.mark.parametrize(("shape", "dim"), VAR_CASES)
@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_var(device, dtype, correction, shape, dim):
    x, ref = random_pair(shape, dtype, device, seed=5)
    out = x.var(dim) if correction else x.var_bias(dim)
    tol = VAR_TOLERANCE.get(dtype, {})
    assert_close(out, torch.var(ref, dim, correction=correction, keepdim=True), **tol)


@pytest.mark.parametrize(("shape", "dim"), VAR_CASES)
@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_var_mean(device, dtype, correction, shape, dim):
    x, ref = random_pair(shape, dtype, device, seed=6)
    var, mean = x.var_mean(dim) if correction else x.var_mean_bias(dim)
    expected_var, expected_mean = torch.var_mean(ref, dim, correction=correction, keepdim=True)
    assert_close(var, expected_var, **VAR_TOLERANCE.get(dtype, {}))
    assert_close(mean, expected_mean)


@pytest.mark.filterwarnings("ignore:var")  # torch warns about zero degrees of freedom
@pytest.mark.parametrize("correction", [0, 1])
def test_var_of_size_one_dim(device, correction):
    x, ref = random_pair((4, 1), DType.F64, device)
    out = x.var(1) if correction else x.var_bias(1)
    assert_close(out, torch.var(ref, 1, correction=correction, keepdim=True))  # NaN when unbiased


# ---------------------------------------------------------------- empty and 0-d tensors
EMPTY_FULL = [(op, dtype) for op in ("sum", "prod", "any", "all") for dtype in ALL_DTYPES
              if dtype is not DType.BOOL or op in ("any", "all")]  # fmt: skip
NEUTRAL = {"sum": 0, "prod": 1, "any": False, "all": True}


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3)])
@pytest.mark.parametrize(("op", "dtype"), EMPTY_FULL)
def test_full_reduction_of_empty_tensor(device, op, dtype, shape):
    x, ref = random_pair(shape, dtype, device)
    out = getattr(x, op)()
    assert out.shape == () and out.item() == NEUTRAL[op]
    assert_close(out, getattr(torch, op)(ref), check_dtype=False)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [DType.F32, DType.I64, DType.U8])
@pytest.mark.parametrize("op", ["sum_dim", "prod_dim", "any_dim", "all_dim", "cumsum", "cumprod"])
def test_dim_op_on_empty_tensor(device, op, dtype, dim):
    x, ref = random_pair((2, 0, 3), dtype, device)
    reference = getattr(torch, op.removesuffix("_dim"))
    expected = reference(ref, dim) if op.startswith("cum") else reference(ref, dim, keepdim=True)
    assert_close(getattr(x, op)(dim), expected, check_dtype=False)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns on the mean of nothing
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_float_mean_of_empty_is_nan(device, dtype):
    x, ref = random_pair((2, 0), dtype, device)
    assert_close(x.mean(), torch.mean(ref))
    assert_close(x.mean_dim(1), torch.mean(ref, 1, keepdim=True))
    assert_close(x.mean_dim(0), torch.mean(ref, 0, keepdim=True))  # empty result


@pytest.mark.parametrize("dtype", [DType.F32, DType.I32])
@pytest.mark.parametrize("op", ["max_dim", "min_dim"])
def test_extreme_along_a_full_dim_of_an_empty_tensor(device, op, dtype):
    x, ref = random_pair((2, 0, 3), dtype, device)
    assert_close(getattr(x, op)(0), ALONG[op](ref, 0))


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3)])
@pytest.mark.parametrize("op", ["max", "min"])
def test_full_extreme_of_empty_raises(device, op, shape):
    x = Tensor.zeros(shape, device)
    with raises_with(
        ember.ShapeError, f"{op}: cannot reduce an empty tensor of shape {list(shape)}"
    ):
        getattr(x, op)()


@pytest.mark.parametrize("op", ["max_dim", "min_dim", "argmax", "argmin", "max_dim_with_indices",
                                "min_dim_with_indices"])  # fmt: skip
def test_extreme_along_an_empty_dim_raises(device, op):
    x = Tensor.zeros([2, 0, 3], device)
    with raises_with(ember.ShapeError, f"{op}: cannot reduce the empty dim 1 of shape [2, 0, 3]"):
        getattr(x, op)(-2)


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_full_reductions_of_0d_tensor_give_the_element(device, dtype):
    x, ref = random_pair((), dtype, device, 1, 3)
    for op in ("sum", "prod", "mean", "max", "min"):
        out = getattr(x, op)()
        assert out.shape == () and out.dtype is dtype
        assert_close(out, ref)
    assert x.any().item() is True and x.all().item() is True


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(("shape", "dim"), [((2, 3), 2), ((2, 3), -3), ((), 1), ((), -2)])
@pytest.mark.parametrize("op", list(ALONG))
def test_dim_out_of_range_raises(device, op, shape, dim):
    x = Tensor.ones(shape, device)
    message = f"{op}: dim {dim} is out of range for a tensor of rank {len(shape)}"
    with raises_with(ember.ArgumentError, message):
        getattr(x, op)(dim)


@pytest.mark.filterwarnings("ignore:var")  # torch warns about zero degrees of freedom
@pytest.mark.parametrize("op", list(ALONG))
def test_dim_0_of_0d_tensor_is_its_one_element(device, op):
    # As in PyTorch (and ember's softmax): the result is 0-d again.
    ref = torch.tensor(2.5, dtype=torch.float64)
    _check(getattr(from_torch(ref, device), op)(0), ALONG[op](ref, 0))


@pytest.mark.parametrize("op", ["sum", "prod", "mean", "max", "min", "argmax", "cumsum", "var"])
def test_numeric_reductions_reject_bool(device, op):
    x = Tensor.from_data([[True, False]], device)
    with raises_with(ember.KindError, f"{op} is not defined for Bool tensors"):
        getattr(x, op)() if op in FULL_REFERENCE else getattr(x, op)(1)


@pytest.mark.parametrize("op", ["var", "var_bias", "var_mean", "var_mean_bias"])
def test_variance_rejects_int(device, op):
    x = Tensor.from_data([[1, 2, 3]], device)
    with raises_with(ember.KindError, f"{op.removesuffix('_bias')} is not defined for Int tensors"):
        getattr(x, op)(1)


# ---------------------------------------------------------------- random shapes
@st.composite
def _shape_and_dim(draw) -> tuple[tuple[int, ...], int]:
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    return shape, draw(st.integers(-len(shape), len(shape) - 1))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_shape_and_dim(), op=st.sampled_from(["sum_dim", "mean_dim", "max_dim"]),
       dtype=st.sampled_from([DType.F64, DType.F32]), seed=st.integers(0, 2**16))  # fmt: skip
def test_reduce_dim_random_shapes(device, case, op, dtype, seed):
    shape, dim = case
    x, ref = random_pair(shape, dtype, device, seed=seed)
    assert_close(getattr(x, op)(dim), ALONG[op](ref, dim))
