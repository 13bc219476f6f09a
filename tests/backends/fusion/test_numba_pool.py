"""The numba pooling kernels against NdArray's pooling (itself tested against PyTorch).

Max pooling must agree exactly (values and indices: ties, NaNs, -inf windows); average
pooling to rounding (sums in another order), and to a float64 NumPy reference.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ember.backend.options import PoolOptions
from ember.backends.ndarray import pool as ndarray_pool

numba_pool = pytest.importorskip("ember.backends.fusion.numba_pool")
pytest.importorskip("numba")


def random_options(rng, h, w):
    """Window, stride, padding (at most half the window), dilation and modes with an output
    of at least 1x1 for an ``h x w`` plane, or None."""
    k = tuple(int(v) for v in rng.integers(1, 5, 2))
    stride = tuple(int(v) for v in rng.integers(1, 4, 2))
    dil = tuple(int(v) for v in rng.integers(1, 3, 2))
    pad = tuple(int(rng.integers(0, kk // 2 + 1)) for kk in k)
    options = PoolOptions(k, stride, pad, dil, bool(rng.random() < 0.5), bool(rng.random() < 0.5))
    fits = all(s + 2 * p >= d * (kk - 1) + 1 for s, p, d, kk in zip((h, w), pad, dil, k))
    return options if fits else None


def cases(seed, count):
    rng = np.random.default_rng(seed)
    made = 0
    while made < count:
        n, c = (int(v) for v in rng.integers(1, 4, 2))
        h, w = (int(v) for v in rng.integers(1, 13, 2))
        options = random_options(rng, h, w)
        if options is not None:
            made += 1
            yield rng, (n, c, h, w), options


def avg_reference(x, options):
    """Float64 average pooling by explicit windows (no code shared with either kernel)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (
        options.kernel_size, options.stride, options.padding, options.dilation,
    )  # fmt: skip
    n, c, h, w = x.shape
    oh, ow = ndarray_pool.avg_pool2d(x, options).shape[2:]
    out = np.zeros((n, c, oh, ow))
    for r in range(oh):
        for s in range(ow):
            total, count = np.zeros((n, c)), 0
            for i in range(kh):
                for j in range(kw):
                    y, z = r * sh - ph + i * dh, s * sw - pw + j * dw
                    inside = 0 <= y < h and 0 <= z < w
                    padded = -ph <= y < h + ph and -pw <= z < w + pw
                    if inside:
                        total += x[:, :, y, z]
                    count += inside or (options.count_include_pad and padded)
            out[:, :, r, s] = total / max(count, 1)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_matches_ndarray_exactly(dtype):
    for rng, shape, options in cases(7, 60):
        # Few distinct values: many ties. Some NaNs and infinities too.
        x = rng.integers(-3, 4, shape).astype(dtype)
        special = rng.random(shape)
        x[special < 0.05] = np.nan
        x[(special >= 0.05) & (special < 0.15)] = -np.inf
        values, indices = numba_pool.max_pool2d_with_indices(x, options)
        want_v, want_i = ndarray_pool.max_pool2d_with_indices(x, options)
        assert values.dtype == dtype and indices.dtype == np.int64
        np.testing.assert_array_equal(values, want_v)
        np.testing.assert_array_equal(indices, want_i, err_msg=str(options))


def test_max_pool_of_only_minus_infinity_reports_the_first_in_bounds_element():
    x = np.full((1, 1, 4, 4), -np.inf, np.float32)
    options = PoolOptions((3, 3), (2, 2), (1, 1), (1, 1))
    values, indices = numba_pool.max_pool2d_with_indices(x, options)
    np.testing.assert_array_equal(values, np.full((1, 1, 2, 2), -np.inf, np.float32))
    np.testing.assert_array_equal(indices, [[[[0, 1], [4, 5]]]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_avg_pool_matches_ndarray_and_a_float64_reference(dtype):
    tol = {np.float32: 1e-6, np.float64: 1e-15}[dtype]
    for rng, shape, options in cases(8, 40):
        x = rng.standard_normal(shape).astype(dtype)
        got = numba_pool.avg_pool2d(x, options)
        assert got.dtype == dtype and got.flags.c_contiguous
        exact = avg_reference(x.astype(np.float64), options)
        bound = avg_reference(np.abs(x).astype(np.float64), options) * 16 * tol + 1e-300
        np.testing.assert_array_less(np.abs(got - exact), bound)
        np.testing.assert_array_less(np.abs(got - ndarray_pool.avg_pool2d(x, options)), 2 * bound)


def test_strided_input_and_parts():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 10, 9, 14)).astype(np.float32).transpose(0, 1, 3, 2)[:, ::3]
    options = PoolOptions((3, 2), (2, 1), (1, 1), (1, 2), ceil_mode=True)
    want_v, want_i = ndarray_pool.max_pool2d_with_indices(x, options)
    for parts in (1, 2, 5):
        values, indices = numba_pool.max_pool2d_with_indices(x, options, threads=parts)
        np.testing.assert_array_equal(values, want_v)
        np.testing.assert_array_equal(indices, want_i)
        np.testing.assert_array_equal(
            numba_pool.avg_pool2d(x, options, threads=parts), numba_pool.avg_pool2d(x, options)
        )


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int64])
def test_other_dtypes_raise_a_typed_error(dtype):
    x = np.ones((1, 1, 4, 4), dtype)
    options = PoolOptions((2, 2), (2, 2), (0, 0), (1, 1))
    with pytest.raises(numba_pool.KernelUnsupported, match="dtype"):
        numba_pool.max_pool2d_with_indices(x, options)
    with pytest.raises(numba_pool.KernelUnsupported, match="dtype"):
        numba_pool.avg_pool2d(x, options)
