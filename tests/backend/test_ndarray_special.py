"""The NumPy backend's erf / erfc (Cody's approximations) against PyTorch and ``math``."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

try:
    from ember.backends.ndarray import special
except Exception:  # the package may be mid-edit: load the module on its own
    _PATH = Path(__file__).parents[2] / "src" / "ember" / "backends" / "ndarray" / "special.py"
    _SPEC = importlib.util.spec_from_file_location("_ember_ndarray_special", _PATH)
    special = importlib.util.module_from_spec(_SPEC)
    _SPEC.loader.exec_module(special)

erf, erfc = special.erf, special.erfc

SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 1e-310, -1e-310,
            1e-300, 1e-30, -1e-30, 1e-8, 0.46875, -0.46875, 0.5, -0.5, 4.0, -4.0, 5.9, 6.0,
            -6.0, 26.5, 27.0, 30.0, -30.0, 1e300, -1e300, 1.7e308, -1.7e308]  # fmt: skip


def _grid64() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([
        np.linspace(-30.0, 30.0, 600_001),
        np.linspace(-0.6, 0.6, 100_001),  # around the first break points
        np.linspace(3.9, 6.1, 20_001),
        rng.standard_normal(100_000) * 2.0,
        np.geomspace(1e-300, 1.0, 10_000),
        -np.geomspace(1e-300, 1.0, 10_000),
        SPECIALS,
    ])  # fmt: skip


def _ulps(ours: np.ndarray, exact: np.ndarray, mantissa_bits: int, min_exp: int) -> np.ndarray:
    """|ours - exact| in units of the last place of ``exact`` in the narrower format."""
    ours, exact = ours.astype(np.float64), exact.astype(np.float64)
    _, e = np.frexp(exact)
    ulp = np.ldexp(1.0, np.maximum(e - 1 - mantissa_bits, min_exp))
    err = np.abs(ours - exact) / ulp
    err[np.isnan(ours) & np.isnan(exact)] = 0.0
    err[ours == exact] = 0.0  # inf == inf
    return err


def _torch(fn, x: np.ndarray) -> np.ndarray:
    return getattr(torch, fn)(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("fn", ["erf", "erfc"])
def test_float64_matches_torch(fn):
    x = _grid64()
    ours = getattr(special, fn)(x)
    ref = _torch(fn, x)
    assert ours.dtype == np.float64
    # erfc's subnormal results (past x = 26.55) have fewer significant digits.
    np.testing.assert_allclose(ours, ref, rtol=1e-14, atol=0.0 if fn == "erf" else 1e-300)
    assert np.array_equal(np.isnan(ours), np.isnan(x))
    # Both are within a few ulp of the exact values: erf 2 + torch's 1; erfc 8 + 1.
    limit = 3.0 if fn == "erf" else 9.0
    assert _ulps(ours, ref, 52, -1074).max() <= limit


def test_float64_erf_matches_math():
    x = np.concatenate([np.linspace(-7.0, 7.0, 140_001), np.geomspace(1e-20, 0.6, 20_000)])
    ref = np.array([math.erf(v) for v in x])
    err = _ulps(erf(x), ref, 52, -1074)
    assert err.max() <= 2.0
    assert np.mean(err) < 0.1  # nearly all results agree with math.erf


def test_erfc_tail_is_relatively_accurate():
    x = np.linspace(4.0, 26.5, 50_001)
    ref = np.array([math.erfc(v) for v in x])
    np.testing.assert_allclose(erfc(x), ref, rtol=2e-15, atol=0.0)
    np.testing.assert_allclose(erfc(-x), 2.0 - ref, rtol=1e-16, atol=0.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_special_values(dtype):
    x = np.array([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan], dtype)
    r = erf(x)
    assert r.dtype == dtype
    np.testing.assert_array_equal(r[:4], [0.0, -0.0, 1.0, -1.0])
    assert np.signbit(r[1]) and not np.signbit(r[0])
    assert np.isnan(r[4:]).all()
    rc = erfc(x)
    np.testing.assert_array_equal(rc[:4], [1.0, 1.0, 0.0, 2.0])
    assert np.isnan(rc[4:]).all()


def test_float32_within_2_ulp():
    rng = np.random.default_rng(1)
    x = np.concatenate([
        np.linspace(-8.0, 8.0, 1_600_001, dtype=np.float32),
        rng.standard_normal(1_000_000, dtype=np.float32),
        np.geomspace(1e-38, 1.0, 100_000, dtype=np.float32),
        np.array([v for v in SPECIALS if abs(v) < 3e38], np.float32),
    ])  # fmt: skip
    x = np.concatenate([x, -x])
    exact = _torch("erf", x.astype(np.float64))
    ours = erf(x)
    assert ours.dtype == np.float32
    assert _ulps(ours, exact, 23, -149).max() <= 2.0
    assert np.array_equal(np.signbit(ours), np.signbit(x))
    np.testing.assert_array_max_ulp(ours, _torch("erf", x), maxulp=3)

    exact_c = _torch("erfc", x.astype(np.float64))
    ours_c = erfc(x)
    assert ours_c.dtype == np.float32
    assert _ulps(ours_c, exact_c, 23, -149).max() <= 2.0


@pytest.mark.parametrize("low", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_is_float32_rounded(low):
    x = np.linspace(-5.0, 5.0, 20_001).astype(low)
    ours = erf(x)
    assert ours.dtype == np.dtype(low)
    expected = erf(x.astype(np.float32)).astype(low)
    np.testing.assert_array_equal(ours, expected)
    exact = _torch("erf", x.astype(np.float64)).astype(low).astype(np.float32)
    step = np.abs(np.spacing(exact.astype(low)).astype(np.float32))
    assert np.all(np.abs(ours.astype(np.float32) - exact) <= step)
    assert erfc(x).dtype == np.dtype(low)


def test_dtypes_and_shapes():
    assert erf(np.arange(-3, 4)).dtype == np.float64
    assert erf(np.array([True, False])).dtype == np.float64
    np.testing.assert_array_equal(erf(np.arange(-3, 4)), erf(np.arange(-3.0, 4.0)))
    scalar = erf(np.array(0.5))
    assert scalar.shape == () and isinstance(scalar, np.ndarray)
    assert erf(np.zeros((0, 3), np.float32)).shape == (0, 3)
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    assert erf(x).shape == (2, 3, 4)
    view = x.transpose(2, 0, 1)[:, :, ::2]  # not contiguous
    np.testing.assert_array_equal(erf(view), erf(np.ascontiguousarray(view)))
    np.testing.assert_array_equal(x, np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4))
    with pytest.raises(TypeError):
        erf(np.array([1j]))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blocks_of_every_kind(dtype):
    """Whole blocks of small, middle, large and NaN values, and blocks that mix them."""
    block = (special._K32 if dtype == np.float32 else special._K64).block
    kinds = [np.full(block, 0.25), np.full(block, 2.0), np.full(block, 9.0),
             np.full(block, np.nan), np.linspace(-10, 10, block)]  # fmt: skip
    rng = np.random.default_rng(2)
    for parts in ([0, 1, 2, 3, 4], [3, 0, 4, 2, 1], [2, 2, 4, 0, 0]):
        x = np.concatenate([kinds[p] * rng.choice([-1.0, 1.0], block) for p in parts])
        x = x.astype(dtype)
        bits, min_exp = (23, -149) if dtype == np.float32 else (52, -1074)
        for fn in (erf, erfc):
            ref = _torch(fn.__name__, x.astype(np.float64))
            assert _ulps(fn(x), ref, bits, min_exp).max() <= (3.0 if fn is erf else 9.0)
