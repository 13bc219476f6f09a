"""The lone sum and mean over a dim (``numba_reduce``, the ``float_sum_dim`` and
``float_mean_dim`` op kernels): against float64 sums over the last dim, bit for bit against
NumPy's over the others, through a fusion device."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")

from test_cat_kernel import _nan_filled  # every output must be written

import ember
from ember import Tensor
from ember.backends.fusion import autotune, counters, numba_reduce, op_kernels
from ember.backends.fusion.autotune import Choice
from ember.backends.fusion.backend import SMALL_DEFAULT
from ember.tensor import module as F

SUM = op_kernels.NDARRAY_KERNELS["float_sum_dim"]
MEAN = op_kernels.NDARRAY_KERNELS["float_mean_dim"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7,), (1, 1), (5, 1), (3, 4, 33), (8, 64, 256), (2, 3, 4, 1000)])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_sums_and_means_over_the_last_dim_match_float64(shape, dtype, threads):
    rng = np.random.default_rng(len(shape) * 7 + threads)
    x = rng.standard_normal(shape).astype(dtype)
    exact = x.astype(np.float64).sum(-1, keepdims=True)
    # A float32 row of n values: the sum's rounding grows with n and the magnitudes.
    tol = (1e-6 if dtype == np.float32 else 1e-14) * (np.abs(x).sum(-1, keepdims=True) + 1)
    total = numba_reduce.sum_along(x, -1, False, threads, _nan_filled)
    mean = numba_reduce.sum_along(x, -1, True, threads, _nan_filled)
    assert total.shape == mean.shape == (*shape[:-1], 1)
    assert total.dtype == mean.dtype == dtype
    assert np.all(np.abs(total - exact) <= tol)
    assert np.all(np.abs(mean - exact / shape[-1]) <= tol / shape[-1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("shape", "dim"), [((2048, 256), 0), ((5, 3), 0), ((2, 3, 40), 0),
                                            ((4, 7, 3000), 1), ((3, 5, 2), 1), ((6, 1, 9), 1),
                                            ((3, 2049, 2), 1), ((1, 17), 0)])  # fmt: skip
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_sums_and_means_over_other_dims_are_numpys_bit_for_bit(shape, dim, dtype, threads):
    """Rows added in order into the output, as NumPy adds them: the same bits at any thread
    count (parts beyond the tasks included)."""
    x = np.random.default_rng(sum(shape) + threads).standard_normal(shape).astype(dtype)
    for mean, numpy in ((False, np.sum), (True, np.mean)):
        got = numba_reduce.sum_along(x, dim, mean, threads, _nan_filled)
        np.testing.assert_array_equal(got, numpy(x, axis=dim, keepdims=True, dtype=x.dtype))


def test_a_mean_divides_the_sum_by_the_length_as_numpy_does():
    x = np.full((2, 3), 1.0, np.float32)
    x[1] = [1.0, 2.0, 4.0]
    np.testing.assert_array_equal(numba_reduce.sum_along(x, 1, True), x.mean(-1, keepdims=True))
    np.testing.assert_array_equal(numba_reduce.sum_along(x, 1, False), [[3.0], [7.0]])
    np.testing.assert_array_equal(numba_reduce.sum_along(x, 0, True), [[1.0, 1.5, 2.5]])


def test_non_finite_values_carry_through_their_sums_only():
    x = np.ones((4, 40), np.float32)
    x[0, 17] = np.nan
    x[1, 3] = np.inf
    x[2, 5], x[2, 30] = np.inf, -np.inf
    for got in (numba_reduce.sum_along(x, 1, False, 2).ravel(),
                numba_reduce.sum_along(x.T.copy(), 0, False, 2).ravel()):  # fmt: skip
        assert np.isnan(got[0]) and got[1] == np.inf and np.isnan(got[2]) and got[3] == 40.0


def test_the_kernels_take_only_c_contiguous_float_arrays_and_their_dims():
    x = np.ones((4, 6), np.float32)
    assert numba_reduce.supports(x, 1) and numba_reduce.supports(x, -1)
    assert numba_reduce.supports(x, 0) and numba_reduce.supports(x, -2)
    assert not numba_reduce.supports(x, 2) and not numba_reduce.supports(x, -3)
    assert not numba_reduce.supports(x.T, 1)  # not C-contiguous
    assert not numba_reduce.supports(x[:, ::2], 1)
    assert not numba_reduce.supports(x.astype(np.int32), 1)
    assert not numba_reduce.supports(x.astype(np.float16), 1)
    assert not numba_reduce.supports(np.ones((4, 0), np.float32), 1)  # no elements
    assert not numba_reduce.supports([1.0, 2.0], 0)
    assert not numba_reduce.supports(x, 1.0) and not numba_reduce.supports(x, True)
    assert numba_reduce.supports(x, np.int64(1))
    with pytest.raises(numba_reduce.KernelUnsupported, match="int32"):
        numba_reduce.sum_along(x.astype(np.int32), 1, False)
    with pytest.raises(numba_reduce.KernelUnsupported, match=r"\(6, 4\)"):
        numba_reduce.sum_along(x.T, 1, True)
    with pytest.raises(numba_reduce.KernelUnsupported, match="dim 2"):
        numba_reduce.sum_along(x, 2, True)


def test_the_op_kernels_key_their_kernel_and_lengths_and_count_elements():
    a, b = np.ones((8, 256), np.float32), np.ones((8, 4096), np.float32)
    assert SUM.supports([a, 1]) and MEAN.supports([a, -1]) and MEAN.supports([a, 0])
    assert MEAN.key([a, 1]) != MEAN.key([b, 1]) and MEAN.key([a, 1]) != SUM.key([a, 1])
    assert MEAN.key([a, 1]) != MEAN.key([a, 0])  # the other kernel
    assert MEAN.work([a, 1]) == a.size
    np.testing.assert_array_equal(MEAN.run([a * 3, 1], 2), np.full((8, 1), 3.0, np.float32))


@pytest.mark.parametrize("op", ["mean_dim", "sum_dim"])
def test_a_lone_reduction_on_a_fusion_device_runs_the_kernel(op):
    rng = np.random.default_rng(5)
    host = rng.standard_normal((8, 64, 256)).astype(np.float32)
    device = ember.device("ndarray").fusion(runtime="numba")
    x = Tensor.from_data(host, device)
    exact = host.astype(np.float64)
    want = getattr(exact, op.split("_")[0])(axis=2, keepdims=True)
    scale = np.abs(exact).sum(2, keepdims=True) / (256 if op == "mean_dim" else 1)
    with autotune.forcing(Choice("fused", 2)):
        before = counters.stats()["op_kernels"]
        got = getattr(x, op)(2).to_numpy()
        assert counters.stats()["op_kernels"] == before + 1
    assert np.all(np.abs(got - want) <= 1e-6 * scale)


def test_a_reduction_that_fuses_with_what_reads_it_is_not_run_alone(monkeypatch):
    """A mean or sum is an op a fuser takes: on a large made value it is recorded and fuses
    (layer norm's mean with its normalization, one pass over the rows) where a convolution
    or product on made operands with small results runs at once."""
    rng = np.random.default_rng(6)
    host = rng.standard_normal((512, 256)).astype(np.float32)
    device = ember.device("ndarray").fusion(runtime="numba")
    # Small values run at once, as outside the suite (its conftest records every op).
    monkeypatch.setattr(device.backend, "small", SMALL_DEFAULT)
    x = Tensor.from_data(host, device)  # made, large; the sums small
    with autotune.forcing(Choice("fused", 2)):
        before = counters.stats()["op_kernels"]
        centered = (x - x.mean_dim(1)).to_numpy()
        normed = F.layer_norm(x).to_numpy()
        assert counters.stats()["op_kernels"] == before
    exact = host.astype(np.float64)
    np.testing.assert_allclose(centered, exact - exact.mean(1, keepdims=True), atol=1e-5)
    want = (exact - exact.mean(1, keepdims=True)) / np.sqrt(exact.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(normed, want, atol=1e-4)
