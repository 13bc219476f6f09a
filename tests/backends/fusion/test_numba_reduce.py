"""The numba sum and mean over one axis (``numba_reduce``) against NumPy and float64, alone
and as the op kernel a fusion device runs for a lone reduction."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import UnsupportedError
from ember.backends.fusion import autotune, reset_stats, stats
from ember.backends.fusion.autotune import Choice

numba_reduce = pytest.importorskip("ember.backends.fusion.numba_reduce")
pytest.importorskip("numba")

SHAPES = [((8, 64, 256), 2), ((16, 128, 256), 0), ((1, 128, 1000), 1), ((3, 5), 1), ((7,), 0),
          ((2, 3, 33, 2), 2), ((5, 17), 0), ((4, 1, 9), 1), ((2, 40, 3), -2)]  # fmt: skip


def _numpy(x: np.ndarray, dim: int, mean: bool) -> np.ndarray:
    """NdArray's ops: the sum in the array's dtype; the mean of its sum, by the count."""
    if mean:
        return np.mean(x, axis=dim, keepdims=True, dtype=x.dtype).astype(x.dtype)
    return np.sum(x, axis=dim, keepdims=True, dtype=x.dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize(("shape", "dim"), SHAPES)
def test_equals_numpy(shape, dim, mean, dtype):
    """Over another axis than the last: NumPy's bits (rows added in its order). Over the
    last one: within rounding of the float64 sum (partial sums in vectors)."""
    x = np.random.default_rng(len(shape) + dim).standard_normal(shape).astype(dtype)
    want = _numpy(x, dim, mean)
    exact = (x.astype(np.float64).mean if mean else x.astype(np.float64).sum)(
        axis=dim, keepdims=True)  # fmt: skip
    length = shape[dim]
    for threads in (1, 2, 3):
        got = numba_reduce.reduce_dim(x, dim, mean, threads)
        assert got.shape == want.shape and got.dtype == dtype
        if dim % len(shape) != len(shape) - 1:
            np.testing.assert_array_equal(got, want)
        else:
            magnitude = np.abs(x.astype(np.float64)).sum(axis=dim, keepdims=True)
            bound = length * np.finfo(dtype).eps * magnitude / (length if mean else 1)
            assert np.all(np.abs(got - exact) <= bound + np.finfo(dtype).tiny)


def test_nan_and_infinity_propagate_as_in_numpy():
    x = np.ones((4, 6), np.float32)
    x[1, 2], x[2, 0], x[3, 5] = np.nan, np.inf, -np.inf
    for dim in (0, 1):
        for mean in (False, True):
            np.testing.assert_array_equal(numba_reduce.reduce_dim(x, dim, mean, 2),
                                          _numpy(x, dim, mean))  # fmt: skip


def test_the_output_comes_from_the_allocator():
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    given = np.full((2, 1, 4), np.nan)
    out = numba_reduce.reduce_dim(x, 1, False, 1, lambda shape, dtype: given)
    assert out is given
    np.testing.assert_array_equal(given, x.sum(axis=1, keepdims=True))


@pytest.mark.parametrize(("x", "dim"), [
    (np.ones((3, 4), np.int32), 0), (np.ones((3, 4), np.float16), 1),
    (np.ones((4, 3), np.float32).T, 0), (np.ones((3, 0), np.float32), 0),
    (np.ones((3, 4), np.float32), 2), (np.ones((3, 4), np.float32), -3),
    (np.ones((3, 4), np.float32), 1.0), ([1.0, 2.0], 0),
])  # fmt: skip
def test_what_it_does_not_take_raises_a_typed_error(x, dim):
    assert not numba_reduce.supports(x, dim)
    with pytest.raises(UnsupportedError, match="numba reduce_dim"):
        numba_reduce.reduce_dim(x, dim, False)


@pytest.mark.parametrize("op", ["sum_dim", "mean_dim"])
@pytest.mark.parametrize("choice", [Choice("fused", 2), autotune.UNFUSED])
def test_a_lone_reduction_on_fusion_runs_the_kernel_where_chosen(op, choice):
    """A lone sum or mean large enough to tune runs as the op kernel where the tuner
    chose it, the inner op where it did not: NdArray's result either way (the bits, over
    a middle axis)."""
    x = np.random.default_rng(9).standard_normal((16, 128, 64)).astype(np.float32)
    want = getattr(Tensor.from_data(x, ember.device("ndarray")), op)(1).to_numpy()
    device = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()
    with autotune.forcing(choice):
        got = getattr(Tensor.from_data(x, device), op)(1).to_numpy()
    np.testing.assert_array_equal(got, want)
    assert stats()["op_kernels"] == (1 if choice != autotune.UNFUSED else 0)
