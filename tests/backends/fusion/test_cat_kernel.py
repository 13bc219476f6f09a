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


@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_takes_a_dim_from_the_end(threads):
    rng = np.random.default_rng(threads)
    flat = [rng.standard_normal(n).astype(np.float32) for n in (3, 5)]
    np.testing.assert_array_equal(CAT.run([flat, -1], threads, _nan_filled), np.concatenate(flat))
    cubes = [rng.standard_normal((2, 3, n)).astype(np.float32) for n in (4, 1)]
    np.testing.assert_array_equal(CAT.run([cubes, -1], threads, _nan_filled),
                                  np.concatenate(cubes, axis=-1))  # fmt: skip


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


def test_a_join_in_place_takes_only_pieces_side_by_side_in_one_array():
    """A join in place is a view where its pieces lie side by side in one array (the
    attention gradient wrote them there); pieces that merely happen to be adjacent, of
    other strides, or out of order are joined by copying."""
    from ember.backends.fusion.joins import joined_view as _joined

    whole = np.arange(2 * 3 * 12, dtype=np.float32).reshape(2, 3, 12)
    pieces = [whole[:, :, 0:4], whole[:, :, 4:6], whole[:, :, 6:12]]
    joined = _joined(pieces, 2, whole.shape)
    assert joined is not None and np.shares_memory(joined, whole)
    np.testing.assert_array_equal(joined, whole)
    assert _joined(pieces[::-1], 2, whole.shape) is None  # out of order
    assert _joined([whole[:, :, 0:4], whole[:, :, 6:12]], 2, (2, 3, 10)) is None  # a gap
    raw = np.zeros(64, np.float32)  # adjacent in memory, but views of other arrays
    other = np.lib.stride_tricks.as_strided(raw[32:], (2, 16), (64, 4))
    assert other.base is not raw and raw[:32].reshape(2, 16).base is raw
    assert _joined([raw[:32].reshape(2, 16), other], 0, (4, 16)) is None
    assert _joined([raw[:32].reshape(2, 16), raw[32:].reshape(2, 16)], 0, (4, 16)) is not None
    assert _joined([np.ascontiguousarray(p) for p in pieces], 2, whole.shape) is None


def test_piece_views_lay_each_result_out_where_its_chain_puts_it():
    """``joins.piece_views`` takes each piece's part of the joined array back through its
    chain of layout ops (heads split, then permuted): a result written into its view, then
    run forward through the chain, is exactly the piece's part; a chain whose reshape
    would copy gives None; the allocator hands the views out in turn and refuses a shape
    that is not the next view's."""
    from ember.backend.errors import UnsupportedError
    from ember.backends.fusion.joins import piece_views, taker

    b, s, h, d = 2, 5, 3, 4
    joined = np.zeros((b, s, 3 * h * d), np.float32)
    # result [b, h, s, d] -> permute (0, 2, 1, 3) -> [b, s, h, d] -> reshape [b, s, h * d]
    chain = (("float_permute", (b, h, s, d), (0, 2, 1, 3)),
             ("float_reshape", (b, s, h, d), (b, s, h * d)))  # fmt: skip
    views = piece_views(joined, 2, [h * d] * 3, ((2, chain), (0, chain), (1, chain)))
    rng = np.random.default_rng(0)
    results = [rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3)]
    take = taker(views)
    for result in results:
        take((b, h, s, d), np.float32)[...] = result
    for piece, result in zip((2, 0, 1), results, strict=True):
        forward = result.transpose(0, 2, 1, 3).reshape(b, s, h * d)
        np.testing.assert_array_equal(joined[:, :, piece * h * d : (piece + 1) * h * d], forward)
    with pytest.raises(UnsupportedError, match="none left"):
        take((b, h, s, d), np.float32)
    with pytest.raises(UnsupportedError, match="gathered result"):
        taker(views)((b, s, h, d), np.float32)
    # a reshape that merges dims a permute separated cannot be a view
    merged = (("float_reshape", (b, h * s * d), (b, s, h * d)),)
    assert piece_views(joined, 2, [h * d] * 3, ((0, merged),)) is None
