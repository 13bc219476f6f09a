"""Conformance of indexing with PyTorch (and NumPy where torch has no equivalent).

Covers Python indexing (``x[key]``: ints, slices with negative bounds and
steps, None, Ellipsis, index lists and 1-d Int tensors), ``slice`` /
``slice_assign`` / ``slice_fill``, ``gather`` / ``scatter`` (which adds, like
``torch.scatter_add``), ``select`` / ``select_assign`` (``index_select`` /
``index_add``), ``mask_where`` / ``mask_fill``, ``argwhere`` / ``nonzero`` and
``one_hot``. Negative slice steps are compared with NumPy, since torch rejects
them. Indexing only moves elements, so comparisons are exact; the adding ops
(scatter, select_assign) use the dtype's tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    assert_close,
    each_case,
    from_torch,
    random_pair,
)

from ember import ArgumentError, DType, EmberIndexError, KindError, ShapeError, Tensor

KIND_DTYPES = [DType.F32, DType.I64, DType.BOOL]  # one dtype per kind: every case runs on these
OTHER_DTYPES = [d for d in ALL_DTYPES if d not in KIND_DTYPES]  # the sweeps add these
NUMERIC_DTYPES = FLOAT_DTYPES + INT_DTYPES


def pair(shape, dtype: DType, device, seed: int = 0) -> tuple[Tensor, torch.Tensor]:
    """An ember tensor and its torch twin, with values spread enough to tell elements apart."""
    return random_pair(tuple(shape), dtype, device, low=-100, high=100, seed=seed)


def small_pair(shape, dtype: DType, device, seed: int = 0) -> tuple[Tensor, torch.Tensor]:
    """Small integral values, so that sums stay exact in every dtype (no i8 / f16 overflow)."""
    return random_pair(tuple(shape), dtype, device, low=-4, high=5, seed=seed, integral=True)


def index_pair(shape, high: int, device, seed: int = 0, dtype: DType = DType.I64):
    """Random indices in ``[0, high)`` as an ember Int tensor of ``dtype`` and a torch int64 twin."""
    values = np.random.default_rng(seed).integers(0, high, shape)
    ref = torch.from_numpy(values).long()
    return from_torch(ref.to(torch.int32) if dtype is DType.I32 else ref, device), ref


def ints(data, device) -> Tensor:
    """An i64 tensor (also for an empty list, which would otherwise be Float)."""
    return Tensor.from_data(np.array(data, dtype=np.int64), device)


def assert_same(actual: Tensor, expected: torch.Tensor) -> None:
    """Exact equality of shape, dtype and elements."""
    assert_close(actual, expected, rtol=0, atol=0)


# ---------------------------------------------------------------- x[key]
def has_negative_step(key) -> bool:
    items = key if isinstance(key, tuple) else (key,)
    return any(isinstance(it, slice) and it.step is not None and it.step < 0 for it in items)


def numpy_index(t: torch.Tensor, key) -> torch.Tensor:
    """``t[key]`` computed by NumPy, which (unlike torch) takes negative steps."""
    array = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
    return torch.from_numpy(np.array(array[key])).to(t.dtype)


def reference_index(t: torch.Tensor, key) -> torch.Tensor:
    return numpy_index(t, key) if has_negative_step(key) else t[key]


def key_case(name: str, key, shape=(4, 5, 6)):
    return pytest.param(shape, key, id=name)


COLON = slice(None)  # the key ``:``
KEYS = [
    key_case("int", 1),
    key_case("negative-int", -1),
    key_case("two-ints", (1, 2)),
    key_case("all-ints-0d", (-1, -2, -3)),
    key_case("slice", slice(1, 3)),
    key_case("slice-step", slice(None, None, 2)),
    key_case("negative-start", (COLON, slice(-3, None))),
    key_case("negative-stop-and-step", (slice(None, -1), slice(1, None, 3))),
    key_case("negative-bounds", (slice(-3, -1), COLON, slice(-5, 5, 2))),
    key_case("stop-past-end", slice(2, 100)),
    key_case("start-before-begin", slice(-100, 2)),
    key_case("empty-slice", slice(3, 1)),
    key_case("start-past-end", (COLON, slice(10, 20))),
    key_case("ellipsis-int", (..., 1)),
    key_case("int-ellipsis", (1, ...)),
    key_case("ellipsis-middle", (1, ..., slice(None, None, 4))),
    key_case("ellipsis-only", ...),
    key_case("empty-tuple", ()),
    key_case("none", None),
    key_case("none-int", (None, 1)),
    key_case("nones-around-ellipsis", (1, None, ..., None)),
    key_case("none-between", (COLON, None, 2, None)),
    key_case("index-list", [0, 2, 2]),
    key_case("index-list-second-dim", (slice(1, 3), [3, 0])),
    key_case("index-list-last", (..., [5, 0, 5])),
    key_case("index-list-negative", (COLON, [-1, 0, -5])),
    key_case("index-list-empty", (COLON, [])),
    key_case("int-and-index-list", (1, COLON, [0, 2])),
    key_case("reverse", slice(None, None, -1)),
    key_case("reverse-step", (COLON, slice(3, 0, -2))),
    key_case("reverse-negative-bounds", slice(-1, -5, -1)),
    key_case("reverse-last", (..., slice(None, None, -4))),
    key_case("reverse-int-reverse", (slice(None, None, -1), 1, slice(None, None, -2))),
    key_case("reverse-empty", slice(0, 3, -1)),
    key_case("reverse-to-start", (COLON, slice(1, None, -1))),
    key_case("reverse-none", (None, slice(None, None, -3), None)),
    key_case("0d-empty-tuple", (), ()),
    key_case("0d-ellipsis", ..., ()),
    key_case("0d-none", None, ()),
    key_case("empty-int", (COLON, 1), (0, 3)),
    key_case("empty-reverse", slice(None, None, -1), (0, 3)),
    key_case("1d-reverse", slice(None, None, -2), (7,)),
]

# The keys the remaining dtypes also run.
SWEEP = {"two-ints", "negative-bounds", "nones-around-ellipsis", "index-list-second-dim",
         "reverse-int-reverse"}  # fmt: skip


def run_key(device, dtype: DType, shape, key) -> None:
    x, t = pair(shape, dtype, device)
    assert_same(x[key], reference_index(t, key))


@pytest.mark.parametrize(("shape", "key"), KEYS)
def test_getitem(device, subtests, shape, key):
    each_case(subtests, lambda dtype: run_key(device, dtype, shape, key), dtype=KIND_DTYPES)


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
def test_getitem_every_dtype(device, subtests, dtype):
    keys = {k.id: k.values for k in KEYS if k.id in SWEEP}
    each_case(subtests, lambda key: run_key(device, dtype, *keys[key]), key=sorted(keys))


@pytest.mark.parametrize("index_dtype", [DType.I64, DType.I32, DType.I16, DType.U8])
@pytest.mark.parametrize(
    "where", [lambda i: i, lambda i: (slice(1, 3), i), lambda i: (1, ..., i)],
    ids=["first-dim", "after-slice", "after-int-and-ellipsis"],
)  # fmt: skip
def test_getitem_int_tensor(device, index_dtype, where):
    x, t = pair((4, 5, 6), DType.F32, device)
    index = ints([3, 0, 3], device).cast(index_dtype)
    assert_same(x[where(index)], t[where(torch.tensor([3, 0, 3]))])


def test_iterating_yields_rows(device):
    x, t = pair((3, 2), DType.I32, device)
    rows = list(x)
    assert len(rows) == len(x) == 3
    for row, ref in zip(rows, t):
        assert_same(row, ref)


GETITEM_ERRORS = [
    pytest.param((4, 5, 6), 4, EmberIndexError, r"index 4 is out of bounds for dim 0 of size 4", id="int-past-end"),
    pytest.param((4, 5, 6), -5, EmberIndexError, r"index -5 is out of bounds for dim 0 of size 4", id="negative-int"),
    pytest.param((4, 5, 6), (COLON, -6), EmberIndexError, r"index -6 is out of bounds for dim 1 of size 5", id="second-dim"),
    pytest.param((0, 3), 0, EmberIndexError, r"index 0 is out of bounds for dim 0 of size 0", id="empty"),
    pytest.param((4, 5, 6), (0, 0, 0, 0), EmberIndexError, r"too many indices \(4\) for a tensor of shape \[4, 5, 6\]",
                 id="too-many"),
    pytest.param((), 0, EmberIndexError, r"too many indices \(1\) for a tensor of shape \[\]", id="0d"),
    pytest.param((4, 5, 6), (..., 0, ...), ArgumentError, r"only one ellipsis", id="two-ellipses"),
    pytest.param((4, 5, 6), slice(None, None, 0), ArgumentError, r"slice step must not be zero", id="zero-step"),
    pytest.param((4, 5, 6), True, ArgumentError, r"a bool is not a valid index", id="bool"),
    pytest.param((4, 5, 6), 1.5, ArgumentError, r"unsupported index 1.5 of type float", id="float"),
    pytest.param((4, 5, 6), ([0], [1]), ArgumentError, r"only one index list", id="two-lists"),
    pytest.param((4, 5, 6), [0, 4], EmberIndexError, r"index 4 is out of bounds for dim 0 of size 4", id="list-past-end"),
    pytest.param((4, 5, 6), (COLON, [-6]), EmberIndexError, r"index -6 is out of bounds for dim 1 of size 5",
                 id="list-negative"),
    pytest.param((4, 5, 6), [0.5], ArgumentError, r"an index list holds ints, got 0.5 of type float", id="list-float"),
]  # fmt: skip


@pytest.mark.parametrize(("shape", "key", "error", "match"), GETITEM_ERRORS)
def test_getitem_errors(device, shape, key, error, match):
    x, _ = pair(shape, DType.F32, device)
    with pytest.raises(error, match=match):
        x[key]


def test_getitem_index_errors_are_index_errors(device):
    x, _ = pair((2, 3), DType.F32, device)
    with pytest.raises(IndexError):  # catchable as the built-in error
        x[2]


def test_getitem_bad_index_tensors(device):
    x, _ = pair((4, 5), DType.F32, device)
    with pytest.raises(ShapeError, match=r"index tensors must be 1-d, got shape \[2, 2\]"):
        x[Tensor.from_data([[0, 1], [1, 0]], device)]
    with pytest.raises(KindError, match=r"select: indices must be a Int tensor, got Float"):
        x[Tensor.from_data([0.0, 1.0], device)]
    with pytest.raises(KindError, match=r"select: indices must be a Int tensor, got Bool"):
        x[Tensor.from_data([True, False, True, False], device)]


def test_setitem_is_refused(device):
    x, t = pair((2, 3), DType.F32, device)
    with pytest.raises(TypeError, match=r"tensors are immutable; use x.slice_assign"):
        x[0] = 1.0
    assert_same(x, t)


# ---------------------------------------------------------------- slice, slice_assign, slice_fill
def ranges_case(name: str, ranges, key, shape=(4, 5, 6)):
    """``ranges`` for ember, ``key`` the Python index of the same region (int ranges keep the dim)."""
    return pytest.param(shape, ranges, key, id=name)


REGIONS = [
    ranges_case("one-range", [(1, 3)], slice(1, 3)),
    ranges_case("two-ranges", [(0, 2), (1, 4)], (slice(0, 2), slice(1, 4))),
    ranges_case("none-and-negative", [None, (-3, None)], (COLON, slice(-3, None))),
    ranges_case("slices", [slice(1, None), None, slice(None, -1)], (slice(1, None), COLON, slice(None, -1))),
    ranges_case("int-keeps-dim", [2, (0, 1)], (slice(2, 3), slice(0, 1))),
    ranges_case("negative-int", [-1], slice(-1, None)),
    ranges_case("clamped", [(-100, 100), (2, 100)], (COLON, slice(2, None))),
    ranges_case("empty-region", [(3, 3)], slice(3, 3)),
    ranges_case("reversed-bounds", [(3, 1)], slice(3, 1)),
    ranges_case("no-ranges", [], ()),
    ranges_case("0d", [], (), shape=()),
    ranges_case("empty-tensor", [None, (1, 3)], (COLON, slice(1, 3)), shape=(0, 4)),
]


@pytest.mark.parametrize(("shape", "ranges", "key"), REGIONS)
def test_slice(device, subtests, shape, ranges, key):
    def check(dtype):
        x, t = pair(shape, dtype, device)
        assert_same(x.slice(ranges), t[key])

    each_case(subtests, check, dtype=KIND_DTYPES + [DType.BF16, DType.U8])


@pytest.mark.parametrize(
    ("ranges", "key"),
    [([(0, 4, 2), (1, 5, 3)], (slice(0, 4, 2), slice(1, 5, 3))),
     ([(5, 1, -1)], slice(5, 1, -1)),
     ([None, slice(None, None, -2)], (COLON, slice(None, None, -2)))],
)  # fmt: skip
def test_slice_with_steps(device, ranges, key):
    x, t = pair((4, 5, 6), DType.I32, device)
    assert_same(x.slice(ranges), reference_index(t, key))


def assigned(t: torch.Tensor, key, values) -> torch.Tensor:
    out = t.clone()
    out[key] = values
    return out


@pytest.mark.parametrize(("shape", "ranges", "key"), REGIONS)
def test_slice_assign(device, subtests, shape, ranges, key):
    def check(dtype):
        x, t = pair(shape, dtype, device)
        v, tv = pair(t[key].shape, dtype, device, seed=1)
        assert_same(x.slice_assign(ranges, v), assigned(t, key, tv))
        assert_same(x, t)  # the input is unchanged

    each_case(subtests, check, dtype=KIND_DTYPES + [DType.F16, DType.I8])


FILL_VALUES = {DType.F32: -2.5, DType.F64: 1e-3, DType.I64: 7, DType.U8: 200, DType.BOOL: True}


@pytest.mark.parametrize(("shape", "ranges", "key"), REGIONS)
def test_slice_fill(device, subtests, shape, ranges, key):
    def check(dtype):
        x, t = pair(shape, dtype, device)
        value = FILL_VALUES[dtype]
        assert_same(x.slice_fill(ranges, value), assigned(t, key, value))

    each_case(subtests, check, dtype=list(FILL_VALUES))


def test_slice_fill_int_value_into_float(device):
    x, t = pair((3, 4), DType.F16, device)
    assert_same(x.slice_fill([(1, 2)], 3), assigned(t, slice(1, 2), 3))


def test_slice_assign_casts_values_to_the_tensor_dtype(device):
    x, t = pair((3, 4), DType.F32, device)
    v, tv = pair((2, 4), DType.F64, device, seed=1)
    assert_same(x.slice_assign([(0, 2)], v), assigned(t, slice(0, 2), tv))


def test_slice_too_many_ranges(device):
    x, _ = pair((4, 5, 6), DType.F32, device)
    with pytest.raises(EmberIndexError, match=r"too many indices \(4\) for a tensor of shape \[4, 5, 6\]"):
        x.slice([None, None, None, (0, 1)])


def assign_error(name: str, op, error, match: str):
    return pytest.param(op, error, match, id=name)


SLICE_ASSIGN_ERRORS = [
    assign_error("values-shape", lambda x, d: x.slice_assign([(0, 1)], Tensor.zeros([2, 5, 6], d)), ShapeError,
                 r"slice_assign: values of shape \[2, 5, 6\] do not fit the slice of shape \[1, 5, 6\]"),
    assign_error("step", lambda x, d: x.slice_assign([(0, 4, 2)], Tensor.zeros([2, 5, 6], d)), ArgumentError,
                 r"slice_assign: ranges need step 1, got 2 for dim 0"),
    assign_error("too-many-ranges", lambda x, d: x.slice_assign([None] * 4, x), ShapeError,
                 r"slice_assign: 4 ranges for a tensor of shape \[4, 5, 6\]"),
    assign_error("values-kind", lambda x, d: x.slice_assign([], Tensor.zeros([4, 5, 6], d, dtype="i64")),
                 KindError, r"slice_assign: values are Int but the tensor is Float"),
    assign_error("values-not-tensor", lambda x, d: x.slice_assign([(0, 1)], 1.0), ArgumentError,
                 r"slice_assign: values must be a tensor, got float"),
    assign_error("bad-range", lambda x, d: x.slice_assign(["a"], x), ArgumentError,
                 r"a range must be \(start, stop\[, step\]\), a slice, an int or None; got 'a'"),
    assign_error("fill-step", lambda x, d: x.slice_fill([None, (0, 5, 2)], 1.0), ArgumentError,
                 r"slice_fill: ranges need step 1, got 2 for dim 1"),
    assign_error("fill-too-many-ranges", lambda x, d: x.slice_fill([None] * 4, 1.0), ShapeError,
                 r"slice_fill: 4 ranges for a tensor of shape \[4, 5, 6\]"),
    assign_error("fill-float-into-int", lambda x, d: x.int().slice_fill([(0, 1)], 0.5), KindError,
                 r"slice_assign: a float scalar \(0.5\) with an Int tensor"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "error", "match"), SLICE_ASSIGN_ERRORS)
def test_slice_assign_errors(device, op, error, match):
    x, _ = pair((4, 5, 6), DType.F32, device)
    with pytest.raises(error, match=match):
        op(x, device)


# ---------------------------------------------------------------- gather and scatter
GATHER_CASES = [  # (input shape, dim, index shape); indices may repeat
    ((3, 4), 0, (2, 4)),
    ((3, 4), 1, (3, 6)),
    ((2, 3, 4), -1, (2, 3, 2)),
    ((3, 4), 1, (2, 2)),  # smaller than the input in the other dims
    ((2, 3, 4), 1, (1, 5, 2)),
    ((5,), 0, (8,)),
    ((3, 4), 0, (0, 4)),
]


@pytest.mark.parametrize("dtype", KIND_DTYPES)
@pytest.mark.parametrize(("shape", "dim", "index_shape"), GATHER_CASES)
def test_gather(device, dtype, shape, dim, index_shape):
    x, t = pair(shape, dtype, device)
    i, ti = index_pair(index_shape, shape[dim], device)
    assert_same(x.gather(dim, i), torch.gather(t, dim, ti))


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
@pytest.mark.parametrize("index_dtype", [DType.I64, DType.I32])
def test_gather_every_dtype(device, dtype, index_dtype):
    x, t = pair((3, 4), dtype, device)
    i, ti = index_pair((3, 2), 4, device, dtype=index_dtype)
    assert_same(x.gather(1, i), torch.gather(t, 1, ti))


@pytest.mark.parametrize(("shape", "dim", "index_shape"), GATHER_CASES)
def test_scatter_adds(device, subtests, shape, dim, index_shape):
    """scatter adds like torch.scatter_add: repeated indices accumulate."""
    i, ti = index_pair(index_shape, shape[dim], device, seed=2)

    def check(dtype):
        x, t = small_pair(shape, dtype, device)
        v, tv = small_pair(index_shape, dtype, device, seed=1)
        assert_close(x.scatter(dim, i, v), torch.scatter_add(t, dim, ti, tv))
        assert_close(x.scatter_add(dim, i, v), torch.scatter_add(t, dim, ti, tv))

    each_case(subtests, check, dtype=NUMERIC_DTYPES)


def test_scatter_repeated_index_accumulates(device):
    x = Tensor.zeros([2, 3], device, dtype="f64")
    i = Tensor.from_data([[0, 0, 1], [0, 0, 0]], device)
    v = Tensor.from_data([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device, dtype="f64")
    assert_close(x.scatter(1, i, v), [[3.0, 3.0, 0.0], [15.0, 0.0, 0.0]])


# ---------------------------------------------------------------- select and select_assign
SELECT_CASES = [  # (input shape, dim, indices)
    ((3, 4), 0, [2, 0, 2]),
    ((3, 4), 1, [3]),
    ((2, 3, 4), -1, [0, 0, 3, 1]),
    ((2, 3, 4), 1, [1, 2, 0]),
    ((3, 4), 0, []),
    ((3,), 0, [1, 1]),
]


@pytest.mark.parametrize("dtype", KIND_DTYPES)
@pytest.mark.parametrize(("shape", "dim", "indices"), SELECT_CASES)
def test_select(device, dtype, shape, dim, indices):
    x, t = pair(shape, dtype, device)
    i = ints(indices, device)
    expected = torch.index_select(t, dim, torch.tensor(indices, dtype=torch.long))
    assert_same(x.select(dim, i), expected)
    if indices:
        assert_same(x.select(dim, indices), expected)  # a plain list works too


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
def test_select_every_dtype(device, dtype):
    x, t = pair((3, 4), dtype, device)
    i, ti = index_pair((5,), 4, device, dtype=DType.I32)
    assert_same(x.select(1, i), torch.index_select(t, 1, ti))


@pytest.mark.parametrize(("shape", "dim", "indices"), SELECT_CASES)
def test_select_assign_adds(device, subtests, shape, dim, indices):
    """select_assign adds like torch.index_add: repeated indices accumulate."""
    i, ti = ints(indices, device), torch.tensor(indices, dtype=torch.long)

    def check(dtype):
        x, t = small_pair(shape, dtype, device)
        v, tv = small_pair(torch.index_select(t, dim, ti).shape, dtype, device, seed=1)
        assert_close(x.select_assign(dim, i, v), torch.index_add(t, dim, ti, tv))

    each_case(subtests, check, dtype=NUMERIC_DTYPES)


def test_scatter_and_select_assign_cast_values(device):
    """Values of another dtype of the same kind are converted to the tensor's dtype."""
    x, t = small_pair((3, 4), DType.F32, device)
    v, tv = small_pair((2, 4), DType.F64, device, seed=1)
    i, ti = index_pair((2, 4), 3, device)
    assert_same(x.scatter(0, i, v), torch.scatter_add(t, 0, ti, tv.float()))
    j = ints([2, 0], device)
    assert_same(x.select_assign(0, j, v), torch.index_add(t, 0, torch.tensor([2, 0]), tv.float()))


def index_error(name: str, op, error, match: str):
    return pytest.param(op, error, match, id=name)


INDEX_ERRORS = [
    index_error("gather-rank", lambda x, d: x.gather(0, ints([0, 1, 2], d)), ShapeError,
                r"gather: indices of shape \[3\] must have the rank of the tensor \[3, 4\]"),
    index_error("gather-float-indices", lambda x, d: x.gather(0, x), KindError,
                r"gather: indices must be a Int tensor, got Float \(f32\)"),
    index_error("gather-larger-index", lambda x, d: x.gather(0, ints([[0] * 5] * 2, d)), ShapeError,
                r"gather: indices of shape \[2, 5\] are larger than the tensor \[3, 4\] outside dim 0"),
    index_error("scatter-larger-index", lambda x, d: x.scatter(1, ints([[0]] * 4, d), x.repeat([2, 1])[:4, :1]),
                ShapeError, r"scatter_add: indices of shape \[4, 1\] are larger than the tensor \[3, 4\] outside dim 1"),
    index_error("gather-dim", lambda x, d: x.gather(2, ints([[0]], d)), ArgumentError,
                r"gather: dim 2 is out of range for a tensor of rank 2"),
    index_error("scatter-shapes", lambda x, d: x.scatter(0, ints([[0] * 4] * 2, d), x[:2, :3]), ShapeError,
                r"scatter_add: indices \[2, 4\] and values \[2, 3\] must have one shape"),
    index_error("scatter-values-kind", lambda x, d: x.scatter(0, ints([[0] * 4], d), ints([[1] * 4], d)),
                KindError, r"scatter_add: values are Int but the tensor is Float"),
    index_error("scatter-bool", lambda x, d: x.bool().scatter(0, ints([[0] * 4], d), x.bool()[:1]), KindError,
                r"scatter_add is not defined for Bool tensors"),
    index_error("select-2d-indices", lambda x, d: x.select(0, ints([[0, 1], [1, 0]], d)), ShapeError,
                r"select: indices must be 1-d, got shape \[2, 2\]"),
    index_error("select-float-indices", lambda x, d: x.select(0, x[0]), KindError,
                r"select: indices must be a Int tensor, got Float \(f32\)"),
    index_error("select-dim", lambda x, d: x.select(-3, [0]), ArgumentError,
                r"select: dim -3 is out of range for a tensor of rank 2"),
    index_error("select-assign-shape", lambda x, d: x.select_assign(0, ints([0, 1], d), x), ShapeError,
                r"select_assign: values of shape \[3, 4\] do not match the selection \[2, 4\]"),
    index_error("select-assign-bool", lambda x, d: x.bool().select_assign(0, ints([0], d), x.bool()[:1]),
                KindError, r"select_assign is not defined for Bool tensors"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "error", "match"), INDEX_ERRORS)
def test_indexing_errors(device, op, error, match):
    x, _ = pair((3, 4), DType.F32, device)
    with pytest.raises(error, match=match):
        op(x, device)


# ---------------------------------------------------------------- mask_where and mask_fill
MASK_CASES = [  # (tensor shape, mask shape, value shape): all three broadcast
    ((2, 3, 4), (2, 3, 4), (2, 3, 4)),
    ((2, 3, 4), (3, 1), (4,)),
    ((2, 3, 4), (4,), (2, 1, 1)),
    ((3, 1), (2, 1, 4), (3, 4)),  # the result is larger than the tensor
    ((), (3,), ()),
    ((0, 3), (3,), (1,)),
]


@pytest.mark.parametrize("dtype", KIND_DTYPES)
@pytest.mark.parametrize(("shape", "mask_shape", "value_shape"), MASK_CASES)
def test_mask_where(device, dtype, shape, mask_shape, value_shape):
    x, t = pair(shape, dtype, device)
    m, tm = pair(mask_shape, DType.BOOL, device, seed=1)
    v, tv = pair(value_shape, dtype, device, seed=2)
    assert_same(x.mask_where(m, v), torch.where(tm, tv, t))


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
def test_mask_where_every_dtype(device, dtype):
    x, t = pair((2, 3), dtype, device)
    m, tm = pair((2, 3), DType.BOOL, device, seed=1)
    v, tv = pair((3,), dtype, device, seed=2)
    assert_same(x.mask_where(m, v), torch.where(tm, tv, t))


@pytest.mark.parametrize(("a", "b"), [(DType.F32, DType.F16), (DType.F16, DType.BF16), (DType.I8, DType.I64),
                                      (DType.U8, DType.I8)])  # fmt: skip
def test_mask_where_promotes(device, a, b):
    x, t = pair((2, 3), a, device)
    m, tm = pair((2, 3), DType.BOOL, device, seed=1)
    v, tv = pair((2, 3), b, device, seed=2)
    assert_same(x.mask_where(m, v), torch.where(tm, tv, t))


FILL = {DType.F32: 2.5, DType.F64: -1e10, DType.BF16: 0.5, DType.I64: -7, DType.I8: 100, DType.U8: 255,
        DType.BOOL: True}  # fmt: skip


@pytest.mark.parametrize(("shape", "mask_shape"), [((2, 3), (2, 3)), ((2, 3, 4), (3, 1)), ((), ()),
                                                   ((0, 3), (1, 3)), ((2, 3), ())])  # fmt: skip
def test_mask_fill(device, subtests, shape, mask_shape):
    m, tm = pair(mask_shape, DType.BOOL, device, seed=1)

    def check(dtype):
        x, t = pair(shape, dtype, device)
        assert_same(x.mask_fill(m, FILL[dtype]), t.masked_fill(tm, FILL[dtype]))

    each_case(subtests, check, dtype=list(FILL))


def test_mask_fill_int_value_into_float(device):
    x, t = pair((2, 3), DType.F32, device)
    m, tm = pair((2, 3), DType.BOOL, device, seed=1)
    assert_same(x.mask_fill(m, 3), t.masked_fill(tm, 3))


MASK_ERRORS = [
    index_error("where-mask-kind", lambda x, m: x.mask_where(m.int(), x), KindError,
                r"mask_where: mask must be a Bool tensor, got Int \(i64\)"),
    index_error("where-value-kind", lambda x, m: x.mask_where(m, x.int()), KindError,
                r"mask_where: value is Int but the tensor is Float"),
    index_error("where-mask-shape", lambda x, m: x.mask_where(m[:, :2], x), ShapeError,
                r"mask_where: shapes \[2, 3\] and \[2, 2\] cannot be broadcast"),
    index_error("where-value-shape", lambda x, m: x.mask_where(m, x[:, :2]), ShapeError,
                r"mask_where: shapes \[2, 3\] and \[2, 2\] cannot be broadcast"),
    index_error("fill-mask-kind", lambda x, m: x.mask_fill(x, 1.0), KindError,
                r"mask_fill: mask must be a Bool tensor, got Float \(f32\)"),
    index_error("fill-mask-shape", lambda x, m: x.mask_fill(m[0, :2], 1.0), ShapeError,
                r"mask_fill: shapes \[2, 3\] and \[2\] cannot be broadcast"),
    index_error("fill-float-into-int", lambda x, m: x.int().mask_fill(m, 0.5), KindError,
                r"mask_fill: a float scalar \(0.5\) with an Int tensor"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "error", "match"), MASK_ERRORS)
def test_mask_errors(device, op, error, match):
    x, _ = pair((2, 3), DType.F32, device)
    m, _ = pair((2, 3), DType.BOOL, device, seed=1)
    with pytest.raises(error, match=match):
        op(x, m)


# ---------------------------------------------------------------- argwhere, nonzero, one_hot
def sparse_pair(shape, dtype: DType, device, density: float = 0.5):
    """Values of which about ``1 - density`` are zero (False)."""
    _, t = pair(shape, dtype, device)
    keep = torch.from_numpy(np.asarray(np.random.default_rng(1).random(shape) < density))
    t = torch.where(keep, t, torch.zeros((), dtype=t.dtype))
    return from_torch(t, device), t


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (5,), (), (0, 3)])
def test_argwhere(device, subtests, shape):
    def check(dtype):
        x, t = sparse_pair(shape, dtype, device)
        assert_same(x.argwhere(), torch.argwhere(t))

    each_case(subtests, check, dtype=ALL_DTYPES)


@pytest.mark.parametrize("dtype", KIND_DTYPES)
@pytest.mark.parametrize("fill", [0, 1], ids=["none-true", "all-true"])
def test_argwhere_extremes(device, dtype, fill):
    x, t = sparse_pair((2, 3), dtype, device, density=fill)
    assert_same(x.argwhere(), torch.argwhere(t))


@pytest.mark.parametrize("dtype", KIND_DTYPES + [DType.BF16, DType.U8])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (5,), (0, 3)])
def test_nonzero(device, dtype, shape):
    x, t = sparse_pair(shape, dtype, device)
    found, expected = x.nonzero(), torch.nonzero(t, as_tuple=True)
    assert len(found) == len(expected)
    for got, ref in zip(found, expected):
        assert_same(got, ref)


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("shape", [(5,), (2, 3), (), (0,)])
def test_one_hot(device, dtype, shape):
    i, ti = index_pair(shape, 4, device)
    assert_same(i.cast(dtype).one_hot(4), F.one_hot(ti, 4))


def test_one_hot_errors(device):
    with pytest.raises(KindError, match=r"one_hot: needs an Int tensor of class indices, got Float"):
        Tensor.from_data([0.0, 1.0], device).one_hot(3)
    with pytest.raises(ArgumentError, match=r"one_hot: num_classes must be positive, got 0"):
        Tensor.from_data([0, 1], device).one_hot(0)


# ---------------------------------------------------------------- Hypothesis: slicing vs NumPy
bounds = st.none() | st.integers(-7, 7)
steps = st.none() | st.sampled_from([1, 2, 3, -1, -2, -3])


@st.composite
def index_items(draw, sizes) -> list:
    """One int or slice (any bounds, steps of both signs) per size, with a None now and then."""
    items: list = []
    for size in sizes:
        if draw(st.integers(0, 3)) == 0:
            items.append(None)
        if size and draw(st.booleans()):
            items.append(draw(st.integers(-size, size - 1)))
        else:
            items.append(slice(draw(bounds), draw(bounds), draw(steps)))
    return items


@st.composite
def shape_and_key(draw):
    """A shape and a key: items for leading dims, then maybe an ellipsis and items for trailing dims."""
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=4)))
    lead = draw(st.integers(0, len(shape)))
    key = draw(index_items(shape[:lead]))
    if draw(st.booleans()):
        trail = draw(st.integers(lead, len(shape)))
        key += [..., *draw(index_items(shape[trail:]))]
    return shape, tuple(key)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=shape_and_key())
def test_slicing_matches_numpy(device, case):
    shape, key = case
    expected = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)[key]
    x = Tensor.from_data(np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape), device)
    out = x[key]
    assert out.shape == expected.shape
    assert out.dtype is DType.I32
    assert_close(out, expected)


@pytest.mark.parametrize("op", ["gather", "select", "scatter", "select_assign"])
def test_indices_out_of_range_are_index_errors(device, op):
    if device.place == "cuda":
        pytest.skip("an out-of-range index is a device-side assert on CUDA, fatal to the process")
    x = Tensor.from_data([[1.0, 2.0], [3.0, 4.0]], device)
    bad = Tensor.from_data([[0, 5]], device) if op in ("gather", "scatter") else Tensor.from_data([5], device)
    call = {
        "gather": lambda: x.gather(1, bad),
        "select": lambda: x.select(1, bad),
        "scatter": lambda: x.scatter(1, bad, Tensor.ones([1, 2], device)),
        "select_assign": lambda: x.select_assign(1, bad, Tensor.ones([2, 1], device)),
    }[op]
    with pytest.raises(EmberIndexError, match=rf"{op}(_add)?: an index is outside \[0, 2\) along dim 1 of a tensor of shape \[2, 2\]"):
        call()
