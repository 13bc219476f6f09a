"""Conformance of sorting (sort, argsort, topk) and matmul against PyTorch.

Sorting is stable in both directions: equal elements keep their original order,
as ``torch.sort(stable=True, descending=...)`` does; NaN sorts as the largest
value (last ascending, first descending). ``topk`` is the head of that stable
sort. Matmul multiplies the last two dims and broadcasts the batch dims; mixed
dtypes of one kind promote as in PyTorch.
"""

from __future__ import annotations

import math

import pytest
import torch
from reference import (
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


def _ties(shape: tuple[int, ...], dtype: DType, device, seed: int = 0):
    """Integer values in [-2, 3) ([0, 3) for u8): every row has many equal elements."""
    return random_pair(shape, dtype, device, -2, 3, seed, integral=True)


def _stable_sort(ref: torch.Tensor, dim: int, descending: bool):
    return torch.sort(ref, dim=dim, descending=descending, stable=True)


# ---------------------------------------------------------------- sort
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_sort_with_indices_is_stable(device, dtype, descending, dim):
    x, ref = _ties((4, 3, 9), dtype, device)
    values, indices = x.sort_with_indices(dim, descending)
    expected = _stable_sort(ref, dim, descending)
    assert values.dtype is dtype and indices.dtype is DType.I64
    assert_close(values, expected.values)
    assert_close(indices, expected.indices)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_sort_and_argsort_are_stable(device, dtype, descending):
    x, ref = _ties((5, 8), dtype, device, seed=1)
    expected = _stable_sort(ref, -2, descending)
    assert_close(x.sort(-2, descending), expected.values)
    assert_close(x.argsort(-2, descending), expected.indices)


def test_sort_defaults_to_ascending_along_the_last_dim(device):
    x, ref = _ties((3, 7), DType.F32, device)
    expected = _stable_sort(ref, -1, False)
    assert_close(x.sort(), expected.values)
    assert_close(x.argsort(), expected.indices)
    values, indices = x.sort_with_indices()
    assert_close(values, expected.values)
    assert_close(indices, expected.indices)


SPECIAL = [3.0, NAN, -INF, 0.0, 1.0, -0.0, INF, NAN, 1.0, -2.0, 0.0]


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sort_places_nan_like_torch(device, dtype, descending):
    ref = torch.tensor([SPECIAL, SPECIAL[::-1]], dtype=TORCH_DTYPE[dtype])
    values, indices = from_torch(ref, device).sort_with_indices(1, descending)
    expected = _stable_sort(ref, 1, descending)
    assert_close(values, expected.values)
    assert_close(indices, expected.indices)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_topk_places_nan_like_torch(device, dtype, largest):
    ref = torch.tensor([SPECIAL], dtype=TORCH_DTYPE[dtype])
    values = from_torch(ref, device).topk(4, largest=largest)
    assert_close(values, torch.topk(ref, 4, largest=largest).values)


@pytest.mark.parametrize(("shape", "dim"), [((0, 4), 1), ((0, 4), 0), ((3, 0), -1), ((3, 1), 1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_of_empty_and_size_one_dims(device, shape, dim, descending):
    x, ref = _ties(shape, DType.F32, device)
    values, indices = x.sort_with_indices(dim, descending)
    expected = _stable_sort(ref, dim, descending)
    assert_close(values, expected.values)
    assert_close(indices, expected.indices)


# ---------------------------------------------------------------- topk
@pytest.mark.parametrize("k", [0, 3, 9])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_topk_is_the_head_of_the_stable_sort(device, dtype, largest, dim, k):
    x, ref = _ties((9, 9), dtype, device, seed=2)
    values, indices = x.topk_with_indices(k, dim, largest)
    expected = _stable_sort(ref, dim, largest)
    assert_close(values, expected.values.narrow(dim, 0, k))
    assert_close(indices, expected.indices.narrow(dim, 0, k))
    assert_close(x.topk(k, dim, largest), torch.topk(ref, k, dim, largest=largest).values)


@pytest.mark.parametrize("k", [-1, 6])
@pytest.mark.parametrize("method", ["topk", "topk_with_indices"])
def test_topk_rejects_bad_k(device, method, k):
    x = Tensor.zeros([2, 5], device)
    with raises_with(ember.ArgumentError, f"topk: k={k} is out of range for dim 1 of size 5"):
        getattr(x, method)(k)


# ---------------------------------------------------------------- bad input to sorting
SORT_METHODS = ["sort", "argsort", "sort_with_indices"]


@pytest.mark.parametrize("method", SORT_METHODS)
def test_sort_rejects_bool(device, method):
    x = Tensor.from_data([True, False], device)
    with raises_with(ember.KindError, f"{method} is not defined for Bool tensors"):
        getattr(x, method)()


@pytest.mark.parametrize("dim", [2, -3])
@pytest.mark.parametrize("method", SORT_METHODS)
def test_sort_rejects_bad_dim(device, method, dim):
    x = Tensor.zeros([2, 3], device)
    with raises_with(
        ember.ArgumentError, f"{method}: dim {dim} is out of range for a tensor of rank 2"
    ):
        getattr(x, method)(dim)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_along_dim_0_of_0d_tensor(device, descending):
    # A 0-d tensor is one element along dim 0, as in PyTorch: the results are 0-d.
    ref = torch.tensor(2.5)
    x = from_torch(ref, device)
    expected = torch.sort(ref, 0, descending)
    assert_close(x.sort(0, descending), expected.values)
    assert_close(x.argsort(0, descending), expected.indices)
    values, indices = x.sort_with_indices(0, descending)
    assert_close(values, expected.values)
    assert_close(indices, expected.indices)


@pytest.mark.parametrize("k", [0, 1])
def test_topk_of_0d_tensor(device, k):
    ref = torch.tensor(2.5)
    values, indices = from_torch(ref, device).topk_with_indices(k, 0)
    expected = torch.topk(ref, k, 0)  # the element, even for k = 0
    assert_close(values, expected.values)
    assert_close(indices, expected.indices)


# ---------------------------------------------------------------- matmul
MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((1, 1), (1, 1)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),  # batch dims [2, 1] and [5] broadcast to [2, 5]
    ((3, 4), (2, 4, 5)),
    ((1, 3, 4), (2, 4, 2)),
    ((2, 0), (0, 3)),  # empty inner dim: zeros
    ((0, 3), (3, 4)),
    ((2, 3, 4), (4, 5)),  # a stacked lhs by a matrix (NdArray: one product over all rows)
    ((2, 2, 3, 4), (4, 5)),
    ((2, 3, 0), (0, 5)),
    ((0, 3, 4), (4, 5)),
]
MATMUL_DTYPES = [*FLOAT_DTYPES, DType.I64, DType.I32]


@pytest.mark.parametrize(("lhs_shape", "rhs_shape"), MATMUL_SHAPES)
@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul(device, dtype, lhs_shape, rhs_shape):
    a, ref_a = random_pair(lhs_shape, dtype, device, seed=1)
    b, ref_b = random_pair(rhs_shape, dtype, device, seed=2)
    assert_close(a.matmul(b), torch.matmul(ref_a, ref_b))


@pytest.mark.parametrize("dtype", [DType.F64, DType.I64])
def test_matmul_operator(device, dtype):
    a, ref_a = random_pair((2, 1, 3, 4), dtype, device, seed=3)
    b, ref_b = random_pair((5, 4, 6), dtype, device, seed=4)
    out = a @ b
    assert out.shape == (2, 5, 3, 6)
    assert_close(out, ref_a @ ref_b)


PROMOTIONS = [
    (DType.F32, DType.F64, DType.F64),
    (DType.F16, DType.BF16, DType.F32),
    (DType.F16, DType.F32, DType.F32),
    (DType.BF16, DType.F64, DType.F64),
    (DType.I32, DType.I64, DType.I64),
]


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize(("lhs", "rhs", "promoted"), PROMOTIONS)
def test_matmul_promotes_dtypes(device, lhs, rhs, promoted, swap):
    if swap:
        lhs, rhs = rhs, lhs
    a, ref_a = random_pair((2, 3, 4), lhs, device, seed=5)
    b, ref_b = random_pair((4, 2), rhs, device, seed=6)
    out = a.matmul(b)
    assert out.dtype is promoted
    target = TORCH_DTYPE[promoted]
    assert_close(out, torch.matmul(ref_a.to(target), ref_b.to(target)))


@pytest.mark.parametrize(
    ("lhs_shape", "rhs_shape"), [((2, 3), (4, 5)), ((7, 2, 3), (7, 2, 3)), ((3, 4), (2, 3, 4))]
)
def test_matmul_inner_dim_mismatch_names_both_shapes(device, lhs_shape, rhs_shape):
    a, b = Tensor.zeros(lhs_shape, device), Tensor.zeros(rhs_shape, device)
    message = f"matmul: inner dims differ: {list(lhs_shape)} @ {list(rhs_shape)}"
    with raises_with(ember.ShapeError, message):
        a.matmul(b)


@pytest.mark.parametrize(
    ("lhs_shape", "rhs_shape"), [((3,), (3, 2)), ((2, 3), (3,)), ((3,), (3,)), ((), (2, 2))]
)
def test_matmul_rejects_rank_below_two(device, lhs_shape, rhs_shape):
    a, b = Tensor.zeros(lhs_shape, device), Tensor.zeros(rhs_shape, device)
    message = f"matmul: both operands need rank >= 2, got {list(lhs_shape)} and {list(rhs_shape)}"
    with raises_with(ember.ShapeError, message):
        a @ b


def test_matmul_batch_mismatch_names_both_shapes(device):
    a, b = Tensor.zeros([2, 3, 4], device), Tensor.zeros([3, 4, 5], device)
    with raises_with(
        ember.ShapeError, "matmul: batch dims of [2, 3, 4] and [3, 4, 5] cannot be broadcast"
    ):
        a.matmul(b)


def test_matmul_rejects_mixed_kinds(device):
    a, b = Tensor.zeros([2, 2], device), Tensor.zeros([2, 2], device, dtype="i64")
    with raises_with(ember.KindError, "matmul: operands have different kinds, Float and Int"):
        a.matmul(b)
    with raises_with(ember.KindError, "matmul: operands have different kinds, Int and Float"):
        b @ a


def test_matmul_rejects_bool_and_non_tensors(device):
    x = Tensor.from_data([[True, False], [False, True]], device)
    with raises_with(ember.KindError, "matmul is not defined for Bool tensors"):
        x.matmul(x)
    with raises_with(ember.ArgumentError, "matmul: expected a tensor, got int"):
        Tensor.zeros([2, 2], device).matmul(3)
