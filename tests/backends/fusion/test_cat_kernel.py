"""The ``float_cat`` op kernel: pieces joined into pooled memory, by threads."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backends.fusion import autotune, op_kernels
from ember.backends.fusion.autotune import Choice

CAT = op_kernels.NDARRAY_KERNELS["float_cat"]


def _nan_filled(shape, dtype):
    return np.full(shape, np.nan, dtype)  # every element must be written


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_the_kernel_joins_pieces_as_numpy_does(dim, threads):
    rng = np.random.default_rng(dim * 10 + threads)
    sizes = [3, 1, 7]
    pieces = []
    for n in sizes:
        shape = [4, 5, 6]
        shape[dim] = n
        pieces.append(rng.standard_normal(shape).astype(np.float32))
    pieces[1] = np.asfortranarray(pieces[1])  # any strides
    got = CAT.run([pieces, dim], threads, _nan_filled)
    np.testing.assert_array_equal(got, np.concatenate(pieces, axis=dim))


def test_the_kernel_takes_only_float_arrays_of_one_dtype():
    a = np.ones((2, 3), np.float32)
    assert CAT.supports([[a, a], 1])
    assert not CAT.supports([[a], 1])  # one piece: nothing to join
    assert not CAT.supports([[a, a.astype(np.float64)], 1])
    assert not CAT.supports([[a.astype(np.int32)] * 2, 1])
    assert CAT.work([[a, a, a], 0]) == 18
    assert CAT.key([[a, a], 1]) != CAT.key([[a, a], 0])


def test_a_cat_on_a_fusion_device_runs_the_kernel_into_the_pool():
    from ember.backends.fusion import counters
    from ember.backends.fusion.executor import runtime_named

    rng = np.random.default_rng(3)
    host = [rng.standard_normal((16, 64, n)).astype(np.float32) for n in (64, 64, 128)]
    device = ember.device("ndarray").fusion(runtime="numba")
    pool = runtime_named("numba").pool
    pieces = [Tensor.from_data(h, device) * 2.0 for h in host]  # made by the stream
    want = np.concatenate([h * 2.0 for h in host], axis=2)
    with autotune.forcing(Choice("fused", 2)):
        before = counters.stats()["op_kernels"]
        got = Tensor.cat(pieces, 2)
        np.testing.assert_array_equal(got.to_numpy(), want)
        assert counters.stats()["op_kernels"] == before + 1
        del got
        misses = pool.misses
        again = Tensor.cat(pieces, 2)  # the dropped result's buffer comes back
        np.testing.assert_array_equal(again.to_numpy(), want)
    assert pool.misses == misses
