"""The register tile intrinsic (``numba_tile``) and the tiled convolution built on it,
against float64 NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backend.options import ConvOptions

numba = pytest.importorskip("numba")
numba_tile = pytest.importorskip("ember.backends.fusion.numba_tile")
numba_conv = pytest.importorskip("ember.backends.fusion.numba_conv")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("ob", "nv"), [(8, 3), (2, 1)])
def test_tile_sums_taps_into_strided_rows(dtype, ob, nv):
    tile = numba_tile.tile_kernel(ob, nv)

    @numba.njit
    def run(xq, offs, wt, wstart, q0, taps, acc, a0, stride):
        tile(xq, offs, wt, wstart, q0, taps, acc, a0, stride)

    rng = np.random.default_rng(3)
    span = nv * numba_tile.lanes(np.dtype(dtype).itemsize)
    taps, wstart, q0, a0, stride = 37, 5, 7, 3, span + 11
    xq = rng.standard_normal(600).astype(dtype)
    offs = rng.integers(0, 600 - q0 - span, taps).astype(np.int64)
    wt = rng.standard_normal(wstart + taps * ob).astype(dtype)
    acc = np.full(a0 + ob * stride, -7.0, dtype)
    run(xq, offs, wt, wstart, q0, taps, acc, a0, stride)

    w = wt[wstart:].astype(np.float64).reshape(taps, ob)
    windows = np.stack([xq[o + q0 : o + q0 + span] for o in offs]).astype(np.float64)
    exact = w.T @ windows  # [ob, span]
    bound = np.abs(w.T) @ np.abs(windows)
    tol = {np.float32: 1e-6, np.float64: 1e-15}[dtype]
    for o in range(ob):
        got = acc[a0 + o * stride : a0 + o * stride + span]
        np.testing.assert_array_less(np.abs(got - exact[o]), tol * bound[o] + 1e-30)
        # Between the rows nothing is written.
        gap = acc[a0 + o * stride + span : a0 + (o + 1) * stride]
        assert (gap == -7.0).all()
    assert (acc[:a0] == -7.0).all()


@pytest.mark.parametrize("nv", [2, 3])
def test_spread_tile_places_each_vector_at_its_own_position(nv):
    # A convolution's rows without their padding column: vector v covers positions q_v ..,
    # stored at a0 + o * stride + q_v - q0, and nothing between them is written.
    tile = numba_tile.tile_kernel(4, nv, spread=True)
    width = numba_tile.lanes(4)
    positions = (3, 3 + width + 5, 3 + 2 * width + 17)[:nv]

    q0, more = positions[0], positions[1:]
    if nv == 3:
        run = numba.njit(lambda xq, offs, wt, taps, acc, stride: tile(
            xq, offs, wt, 0, q0, taps, acc, 2, stride, more[0], more[1]))  # fmt: skip
    else:
        run = numba.njit(lambda xq, offs, wt, taps, acc, stride: tile(
            xq, offs, wt, 0, q0, taps, acc, 2, stride, more[0]))  # fmt: skip

    rng = np.random.default_rng(8)
    taps, stride = 23, 3 * width + 40
    xq = rng.standard_normal(500).astype(np.float32)
    offs = rng.integers(0, 400, taps).astype(np.int64)
    wt = rng.standard_normal(taps * 4).astype(np.float32)
    acc = np.full(2 + 4 * stride, -7.0, np.float32)
    run(xq, offs, wt, taps, acc, stride)
    w = wt.astype(np.float64).reshape(taps, 4)
    written = np.zeros(acc.size, bool)
    for q in positions:
        windows = np.stack([xq[o + q : o + q + width] for o in offs]).astype(np.float64)
        exact, bound = w.T @ windows, np.abs(w.T) @ np.abs(windows)
        for o in range(4):
            at = 2 + o * stride + q - positions[0]
            np.testing.assert_array_less(np.abs(acc[at : at + width] - exact[o]), 1e-6 * bound[o])
            written[at : at + width] = True
    assert (acc[~written] == -7.0).all()


def test_spread_needs_the_plain_variant_of_at_most_three_vectors():
    with pytest.raises(ValueError, match="spread"):
        numba_tile.tile_kernel(4, 2, strided=True, spread=True)
    with pytest.raises(ValueError, match="spread"):
        numba_tile.tile_kernel(4, 4, spread=True)


@pytest.mark.parametrize("nv", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_epilogue_tile_stores_outputs_side_by_side(nv, dtype):
    # Loads from each vector's own position; stores clamp(clamp(sum + bias) + res) at a0 +
    # o * stride + v * lanes, each step rounded as NumPy's op, and nothing else.
    tile = numba_tile.tile_kernel(4, nv, epilogue=True)
    width = numba_tile.lanes(np.dtype(dtype).itemsize)
    positions = (3, 3 + width + 5, 3 + 2 * width + 17)

    @numba.njit
    def run(xq, offs, wt, taps, out, stride, bias, bounds, res, has_res):
        tile(xq, offs, wt, 0, positions[0], taps, out, 2, stride, positions[1], positions[2],
             bias, 5, bounds, res, has_res)  # fmt: skip

    rng = np.random.default_rng(9)
    taps, stride = 23, nv * width + 11
    xq = rng.standard_normal(500).astype(dtype)
    xq[7] = np.nan  # one lane's sum is NaN, and stays NaN through both clamps
    offs = rng.integers(0, 400, taps).astype(np.int64)
    offs[0] = 4  # the first vector reads xq[7]
    wt = rng.standard_normal(taps * 4).astype(dtype)
    bias = rng.standard_normal(12).astype(dtype)
    res = rng.standard_normal(2 + 4 * stride).astype(dtype)
    sums = np.empty((4, nv * width), dtype)  # the plain tile's sums, the same products
    plain = numba_tile.tile_kernel(4, 1)
    at = numba.njit(lambda xq, offs, wt, q, taps, acc, a0, stride: plain(
        xq, offs, wt, 0, q, taps, acc, a0, stride))  # fmt: skip
    flat = sums.reshape(-1)
    for v in range(nv):
        at(xq, offs, wt, positions[v], taps, flat, v * width, nv * width)
    for bounds, has_res in [((0.0, 0.5, -0.25, 1.0), True), ((-np.inf, np.inf) * 2, False),
                            ((1.0, -1.0, -np.inf, np.inf), True)]:  # fmt: skip
        out = np.full(2 + 4 * stride, -7.0, dtype)
        run(xq, offs, wt, taps, out, stride, bias, np.array(bounds, dtype), res, has_res)
        lo1, hi1, lo2, hi2 = (dtype(b) for b in bounds)
        want = np.minimum(np.maximum(sums + bias[5:9, None], lo1), hi1)
        written = np.zeros(out.size, bool)
        for o in range(4):
            got = out[2 + o * stride : 2 + o * stride + nv * width]
            row = want[o] + res[2 + o * stride : 2 + o * stride + nv * width] if has_res else want[o]
            np.testing.assert_array_equal(got, np.minimum(np.maximum(row, lo2), hi2))
            written[2 + o * stride : 2 + o * stride + nv * width] = True
        assert np.isnan(out[2]) and (out[~written] == -7.0).all()


def test_epilogue_tile_needs_the_plain_variant():
    with pytest.raises(ValueError, match="plain variant"):
        numba_tile.tile_kernel(4, 2, accumulating=True, epilogue=True)


@pytest.mark.parametrize("prefetch", [0, 4], ids=["no prefetch", "prefetch"])
def test_strided_tile_accumulates_over_evenly_spaced_taps(prefetch):
    # The GEMM's variant: tap t reads xq from t * step + q0, and with ``add`` the sums start
    # from acc's values. Prefetching past the array's end is a hint only: nothing changes.
    tile = numba_tile.tile_kernel(4, 2, accumulating=True, strided=True, prefetch=prefetch)

    @numba.njit
    def run(xq, step, wt, q0, taps, acc, stride, add):
        tile(xq, step, wt, 0, q0, taps, acc, 0, stride, add)

    rng = np.random.default_rng(5)
    span = 2 * numba_tile.lanes(4)
    taps, step, q0 = 29, span + 3, 2
    xq = rng.standard_normal(q0 + (taps - 1) * step + span).astype(np.float32)
    wt = rng.standard_normal(taps * 4).astype(np.float32)
    start = rng.standard_normal(4 * span).astype(np.float32)
    windows = np.stack([xq[t * step + q0 : t * step + q0 + span] for t in range(taps)])
    exact = wt.reshape(taps, 4).T.astype(np.float64) @ windows.astype(np.float64)
    for add in (False, True):
        acc = start.copy()
        run(xq, step, wt, q0, taps, acc, span, add)
        want = exact + (start.reshape(4, span) if add else 0)
        np.testing.assert_allclose(acc.reshape(4, span), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("taps", [0, 29], ids=["no taps", "taps"])
def test_biased_tile_starts_every_row_from_the_bias_vectors(taps):
    # The GEMM's first block of K with a bias: without ``add`` and with ``use_bias``, each of
    # the ob rows starts from bias[bias_at : bias_at + span] (the sums are bit-equal to
    # adding each product to the bias in tap order); ``add`` still starts from acc, and
    # neither flag from zero, the bias unread.
    tile = numba_tile.tile_kernel(4, 2, accumulating=True, strided=True, biased=True)

    @numba.njit
    def run(xq, step, wt, taps, acc, add, bias, bias_at, use_bias):
        tile(xq, step, wt, 0, 0, taps, acc, 0, span, add, bias, bias_at, use_bias)

    rng = np.random.default_rng(6)
    span = 2 * numba_tile.lanes(4)
    step = span + 1
    xq = rng.standard_normal(max(taps - 1, 0) * step + span).astype(np.float32)
    wt = rng.standard_normal(max(taps, 1) * 4).astype(np.float32)
    bias, bias_at = rng.standard_normal(span + 9).astype(np.float32), 5
    start = rng.standard_normal(4 * span).astype(np.float32)
    want = np.empty((4, span), np.float32)
    for o in range(4):  # the tile's own order: an fma per tap, in float32
        total = bias[bias_at : bias_at + span].copy()
        for t in range(taps):
            total = (total.astype(np.float64) + np.float64(wt[t * 4 + o])
                     * xq[t * step : t * step + span].astype(np.float64)).astype(np.float32)  # fmt: skip
        want[o] = total
    acc = start.copy()
    run(xq, step, wt, taps, acc, False, bias, bias_at, True)
    np.testing.assert_array_equal(acc.reshape(4, span), want)
    acc = start.copy()
    run(xq, step, wt, taps, acc, True, bias, bias_at, True)  # add wins
    exact = (wt[: taps * 4].reshape(taps, 4).T.astype(np.float64)
             @ np.stack([xq[t * step : t * step + span] for t in range(taps)] or
                        [np.zeros(span)]).astype(np.float64)) if taps else 0  # fmt: skip
    np.testing.assert_allclose(acc.reshape(4, span), start.reshape(4, span) + exact, rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    acc = start.copy()
    run(xq, step, wt, taps, acc, False, bias[:0], 0, False)  # from zero, no bias read
    np.testing.assert_allclose(acc.reshape(4, span), np.zeros((4, span)) + exact, rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_biased_tile_needs_the_accumulating_variant():
    with pytest.raises(ValueError, match="accumulating"):
        numba_tile.tile_kernel(4, 2, biased=True)


def test_prefetch_needs_the_strided_tile():
    with pytest.raises(ValueError, match="strided"):
        numba_tile.tile_kernel(4, 2, prefetch=8)


def test_tile_with_no_taps_stores_zeros():
    tile = numba_tile.tile_kernel(8, 3)
    span = 3 * numba_tile.lanes(4)  # 48 float32 with AVX-512, 24 with AVX2

    @numba.njit
    def run(xq, offs, wt, acc):
        tile(xq, offs, wt, 0, 0, 0, acc, 0, span)

    acc = np.ones(8 * span, np.float32)
    run(np.ones(64, np.float32), np.zeros(0, np.int64), np.ones(8, np.float32), acc)
    assert (acc == 0).all()


@pytest.mark.parametrize("parts", [1, 3])
def test_conv_of_several_row_tiles_matches_float64(parts):
    """A plane longer than TILE_POSITIONS splits into row tiles; odd channel counts pad
    the last block."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 41, 37)).astype(np.float32)
    w = rng.standard_normal((11, 5, 3, 3)).astype(np.float32)
    b = rng.standard_normal(11).astype(np.float32)
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    assert numba_conv.TILE_POSITIONS < 41 * 39
    got = numba_conv.conv2d(x, w, b, options, threads=parts)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    exact = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64)) + b.reshape(1, -1, 1, 1)
    bound = np.einsum("nchwij,ocij->nohw", np.abs(win), np.abs(w.astype(np.float64)))
    np.testing.assert_array_less(np.abs(got - exact), 2e-6 * (bound + np.abs(b).max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [None, 1, 3, 6, 12])
def test_transpose_writes_rows_as_columns_and_nothing_past_its_slack(dtype, rows):
    transpose = numba_tile.transpose_kernel(rows)

    @numba.njit
    def run(src, s0, step, dst, d0, dstep):
        transpose(src, s0, step, dst, d0, dstep)

    width = numba_tile.lanes(np.dtype(dtype).itemsize)
    count = width if rows is None else rows
    vectors = count <= width  # else (float64 strips of 12) element by element
    rng = np.random.default_rng(5)
    s0, step, d0 = 3, width + 9, 5
    dstep = count + 2  # columns apart: the slack of one store lands in the next column
    src = rng.standard_normal(s0 + count * step + width).astype(dtype)
    dst = np.full(d0 + width * dstep + width, -7.0, dtype)
    run(src, s0, step, dst, d0, dstep)
    block = np.stack([src[s0 + r * step : s0 + r * step + width] for r in range(count)])
    for q in range(width):  # exact: a copy
        np.testing.assert_array_equal(dst[d0 + q * dstep : d0 + q * dstep + count], block[:, q])
    written_to = d0 + (width - 1) * dstep + (width if vectors else count)
    assert (dst[:d0] == -7.0).all() and (dst[written_to:] == -7.0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_copy_moves_one_vector_and_nothing_else(dtype):
    copy = numba_tile.vector_copy()

    @numba.njit
    def run(src, s0, dst, d0):
        copy(src, s0, dst, d0)

    width = numba_tile.lanes(np.dtype(dtype).itemsize)
    src = np.arange(3 * width, dtype=dtype)
    dst = np.full(3 * width, -7.0, dtype)
    run(src, 5, dst, 3)  # neither offset on a vector boundary
    np.testing.assert_array_equal(dst[3 : 3 + width], src[5 : 5 + width])
    assert (dst[:3] == -7.0).all() and (dst[3 + width :] == -7.0).all()


@pytest.mark.parametrize("user", ["numba_conv", "numba_attention", "numba_gemm"])
def test_the_kernels_cache_follows_the_tile_source(user):
    """A kernel's cached machine code inlines the tile: each file whose kernels use it
    names the tile source it was compiled with, so an edit of numba_tile.py must touch
    that file too."""
    import hashlib
    import importlib
    from pathlib import Path

    module = importlib.import_module(f"ember.backends.fusion.{user}")
    digest = hashlib.sha256(Path(numba_tile.__file__).read_bytes()).hexdigest()[:16]
    assert digest == module.TILE_SOURCE_SHA256, (
        f"numba_tile.py changed: set {user}.TILE_SOURCE_SHA256 to {digest} (that edit also "
        "renews numba's cache of its kernels)")  # fmt: skip
