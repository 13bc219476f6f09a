"""Reading a value on a fusion device: small arithmetic beside larger pending work runs
alone (the rest stays pending, to fuse with what comes next); anything else runs the
stream. Results always equal NumPy's, whatever ran when."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backends.fusion import reset_stats, stats
from ember.backends.fusion.stream import SMALL

BIG = (64, 256)  # more than SMALL elements


@pytest.fixture(params=["interpreter", "numba"])
def device(request) -> ember.Device:
    if request.param == "numba":
        pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    return ember.device("ndarray").fusion(runtime=request.param)


def _pending(t: Tensor) -> bool:
    return t._prim.slot.pending


def _data(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_shape_arithmetic_runs_at_once_and_leaves_the_pending_work(device):
    x = Tensor.from_data(_data(BIG), device)
    big = (x * 2.0).exp()  # pending, large
    dims = Tensor.from_data(np.array([4, -1], np.int64), device) * 2  # small ints: at once
    assert not _pending(dims) and _pending(big)
    assert dims.tolist() == [8, -2] and _pending(big)


def test_a_small_read_runs_without_the_pending_work(device):
    x = Tensor.from_data(_data(BIG), device)
    big = (x * 2.0).exp()  # pending, large
    scale = Tensor.from_data(np.array([0.5, 4.0], np.float32), device) * 2.0  # pending, small
    reset_stats()
    assert scale.tolist() == [1.0, 8.0]
    assert _pending(big) and stats()["records"] == 1
    later = (big + 1.0).reshape([16, -1])  # still fuses with the pending work
    np.testing.assert_allclose(later.to_numpy(), (np.exp(_data(BIG) * 2) + 1).reshape(16, -1),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    assert stats()["kernels"] == 1 and stats()["fused_ops"] >= 3


def test_a_value_the_rest_reads_is_written_out_though_nobody_holds_it(device):
    x = Tensor.from_data(_data((8,)), device)
    hidden = x * 3.0 + 1.0  # small; only a pending record and the read below use it
    wide = Tensor.from_data(_data(BIG, 1), device) * hidden.reshape([1, 8]).repeat_dim(1, 32)
    hidden_sum = hidden.sum()
    del hidden  # no handle left: the value lives on only in the pending records
    np.testing.assert_allclose(hidden_sum.item(), (_data((8,)) * 3 + 1).sum(), rtol=1e-5)
    assert _pending(wide)  # the large product waited
    expected = _data(BIG, 1) * np.tile((_data((8,)) * 3 + 1)[None, :], (1, 32))
    np.testing.assert_allclose(wide.to_numpy(), expected, rtol=1e-6, atol=1e-6)


def test_small_values_the_rest_reads_are_never_written_over(device):
    # A chain of small element-wise blocks may write over its input at its last use in
    # the records that run; a pending record reading that input must still see it.
    base = _data((16,), 2)
    x = Tensor.from_data(base, device)
    first = (x * 2.0).exp()
    wide = Tensor.from_data(_data(BIG, 3), device) + first.reshape([1, 16]).repeat_dim(1, 16)
    second = ((first + 1.0) * 0.5).sum()
    del first
    np.testing.assert_allclose(second.item(), ((np.exp(base * 2) + 1) * 0.5).sum(), rtol=1e-5)
    expected = _data(BIG, 3) + np.tile(np.exp(base * 2)[None, :], (1, 16))
    np.testing.assert_allclose(wide.to_numpy(), expected, rtol=1e-6, atol=1e-6)


def test_reading_a_value_made_from_large_values_runs_the_stream(device):
    x = Tensor.from_data(_data(BIG), device)
    loss = (x * 2.0).exp().mean()
    other = (x - 1.0).abs()  # independent, pending
    loss.item()
    assert not _pending(other)  # one run made both


def test_reading_one_of_several_small_results_runs_them_all(device):
    x = Tensor.from_data(_data((SMALL,)), device)
    p, q = x * 2.0 + 1.0, x * 3.0 + 1.0
    reset_stats()
    p.tolist()
    assert not _pending(q) and stats()["flushes"] == 1


def test_random_ops_keep_their_recording_order(device):
    uniform = ember.Distribution.uniform(0, 1)
    device.seed(5)
    big = Tensor.random(list(BIG), uniform, device) * 1.0
    small = Tensor.random([4], uniform, device) + 0.0
    got_small = small.to_numpy()  # its draw comes after the big one's, as recorded
    eager = ember.device("ndarray")  # the inner device: the generator the fusion one uses
    eager.seed(5)
    expected_big = Tensor.random(list(BIG), uniform, eager).to_numpy()
    expected_small = Tensor.random([4], uniform, eager).to_numpy()
    np.testing.assert_array_equal(got_small, expected_small)
    np.testing.assert_array_equal(big.to_numpy(), expected_big)
