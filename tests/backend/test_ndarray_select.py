"""NdArray's kernels for large element-wise selections, bit for bit against NumPy's plain
ones: the branch-free select (``mask_where`` / ``mask_fill`` above a few thousand
elements) against ``np.where`` (every dtype, broadcasting, NaN, signed zeros and
infinities), and ``clamp`` (ReLU) against a filled bound against ``np.maximum`` /
``np.minimum`` with the scalar."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ember.backends.ndarray.backend import _BITWISE_SELECT_MIN, NdArray, select

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int64, np.int32, np.int8,
          np.uint8, np.bool_]  # fmt: skip
SELECT_SHAPES = [  # (mask, a, b): each big enough for the bitwise path
    ((64, 97), (64, 97), (64, 97)),
    ((64, 97), (), (64, 97)),  # mask_fill: a scalar value
    ((64, 1), (64, 97), (1, 97)),  # everything broadcast
    ((97,), (64, 97), (64, 97)),
]


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    out = rng.standard_normal(shape).astype(dtype)
    if out.size >= 4:
        out.reshape(-1)[:4] = np.array([np.nan, -0.0, np.inf, -np.inf]).astype(dtype)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(
    ("mask_shape", "a_shape", "b_shape"),
    SELECT_SHAPES,
)
def test_select_is_where_bit_for_bit(dtype, mask_shape, a_shape, b_shape):
    rng = np.random.default_rng(0)
    mask = rng.random(mask_shape) < 0.5
    a, b = _values(rng, a_shape, dtype), _values(np.random.default_rng(1), b_shape, dtype)
    assert max(mask.size, a.size, b.size) >= _BITWISE_SELECT_MIN  # the bitwise path runs
    got, want = select(mask, a, b), np.where(mask, a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_small_and_mixed_dtype_selects_fall_back_to_where():
    mask = np.array([True, False, True])
    a, b = np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0, 6.0], np.float64)
    np.testing.assert_array_equal(select(mask, a, b), np.where(mask, a, b))
    assert select(mask, a, b).dtype == np.float64


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fill", [0.0, -0.0, 1.0])
@pytest.mark.parametrize("mask_shape", [(64, 97), (97,)], ids=str)
def test_select_of_a_scalar_fill(dtype, fill, mask_shape):
    # mask_fill's case; a zero fill takes its own path (b & ~mask).
    rng = np.random.default_rng(3)
    mask = rng.random(mask_shape) < 0.5
    a, b = np.asarray(fill).astype(dtype), _values(rng, (64, 97), dtype)
    got, want = select(mask, a, b), np.where(mask, a, b)
    assert got.dtype == want.dtype and got.tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16],
                         ids=lambda d: np.dtype(d).name)  # fmt: skip
@pytest.mark.parametrize(("low", "high"), [(0.0, None), (None, 6.0), (-0.5, 0.5), (0.0, 0.0)])
@pytest.mark.parametrize("transposed", [False, True])
def test_large_clamp_is_numpys(dtype, low, high, transposed):
    x = _values(np.random.default_rng(4), (64, 97), dtype)
    if transposed:
        x = x.T
    want = x
    if low is not None:
        want = np.maximum(want, low)
    if high is not None:
        want = np.minimum(want, high)
    got = NdArray().float_clamp(x, low, high)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert got.tobytes() == want.astype(x.dtype).tobytes()
