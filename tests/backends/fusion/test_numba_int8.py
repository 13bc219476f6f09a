"""The int8 VNNI kernels (``numba_int8``) against exact int64 NumPy products and the float64
formula of a quantized linear layer."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backend.errors import ArgumentError, DTypeError, EmberError, ShapeError

pytest.importorskip("numba", reason="numba_int8 needs numba (the jit extra)")
q = pytest.importorskip("ember.backends.fusion.numba_int8")
if not q.has_vnni():
    pytest.skip("numba_int8 needs a CPU with AVX-512 VNNI (and numba targeting the host)",
                allow_module_level=True)  # fmt: skip

rng = np.random.default_rng(16)


def _int8(*shape: int) -> np.ndarray:
    return rng.integers(-128, 128, shape, dtype=np.int8)


def _exact(a: np.ndarray, b: np.ndarray, zero_point: int = 0) -> np.ndarray:
    return (a.astype(np.int64) - zero_point) @ b.astype(np.int64)


def _formula(a, a_scale, zero_point, b, b_scales, bias):
    """The layer in float64, and the magnitude its float32 rounding is relative to."""
    rows = np.asarray(a_scale, np.float64)
    rows = rows.reshape(()) if rows.size == 1 else rows.reshape(*a.shape[:-1], 1)
    products = rows * np.asarray(b_scales, np.float64) * _exact(a, b, zero_point)
    extra = 0.0 if bias is None else bias.astype(np.float64)
    return products + extra, np.abs(products) + np.abs(extra)


def _check_linear(a, a_scale, zero_point, b, b_scales, bias, threads=1):
    got = q.linear_int8(a, a_scale, zero_point, q.pack_weight(b), b_scales, bias, threads)
    want, size = _formula(a, a_scale, zero_point, b, b_scales, bias)
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    # Three float32 roundings (the sum's conversion, two scales) and the bias's addition.
    assert np.all(np.abs(got - want) <= 1e-6 * size + 1e-30), np.abs(got - want).max()
    return got


@pytest.mark.parametrize("m", [1, 3, 4, 5, 17, 64])
def test_products_are_exact_over_tile_edges(m):
    for k in (1, 3, 4, 64, 257):
        for n in (1, 15, 16, 17, 64, 100):
            a, b = _int8(m, k), _int8(k, n)
            got = q.matmul_int8(a, q.pack_weight(b))
            assert got.dtype == np.int32 and got.shape == (m, n), (m, k, n)
            np.testing.assert_array_equal(got, _exact(a, b), err_msg=f"{m}x{k}x{n}")


def test_extreme_values_give_the_largest_exact_sums():
    k = 65536  # raw sums up to 128 * 128 * K = 2**30
    a = np.full((5, k), -128, np.int8)
    a[1] = 127
    a[2, ::2] = 127  # alternating signs
    b = np.full((k, 17), -128, np.int8)
    b[:, 3] = 127
    b[::3, 5] = 127
    packed = q.pack_weight(b)
    np.testing.assert_array_equal(q.matmul_int8(a, packed), _exact(a, b))
    # With a zero point the sums reach (a - zp) * b = -255 * -128 per term: 2,139,095,040
    # for K = 65536, past what the unsigned + column-sum form holds before it wraps. Unit
    # scales make the output float32 of the exact sum.
    one = np.float32(1.0)
    for zp in (-128, 0, 127):
        got = q.linear_int8(a, one, zp, packed, one, None)
        np.testing.assert_array_equal(got, _exact(a, b, zp).astype(np.float32), err_msg=str(zp))
    assert _exact(a, b, 127).max() > 2**31 - 2**24  # the case above is near int32's limit


def test_long_sums_run_in_blocks_of_k():
    k = 3 * 4 * q.K_BLOCK_GROUPS + 5  # three whole blocks and a few k more: four even blocks
    a, b = _int8(7, k), _int8(k, 70)
    packed = q.pack_weight(b)
    got = q.matmul_int8(a, packed)
    np.testing.assert_array_equal(got, _exact(a, b))
    np.testing.assert_array_equal(q.matmul_int8(a, packed, threads=2), got)
    a_scale = rng.uniform(1e-4, 1e-3, 7).astype(np.float32)
    _check_linear(a, a_scale, -3, b, np.float32(0.01), rng.standard_normal(70).astype(np.float32))


def test_the_longest_exact_sum_is_accepted_and_a_longer_one_refused():
    a = np.full((1, q.MAX_K), -128, np.int8)
    b = np.full((q.MAX_K, 16), -128, np.int8)
    assert q.supports(a, b)
    got = q.linear_int8(a, np.float32(1), 127, q.pack_weight(b), np.float32(1), None)
    np.testing.assert_array_equal(got, _exact(a, b, 127).astype(np.float32))
    longer = np.zeros((q.MAX_K + 1, 16), np.int8)
    assert not q.supports(np.zeros((1, q.MAX_K + 1), np.int8), longer)
    with pytest.raises(q.KernelUnsupported):
        q.pack_weight(longer)


@pytest.mark.parametrize("zero_point", [-128, 0, 127])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_the_float64_formula(zero_point, per_row, with_bias):
    for m, k, n in [(1, 257, 100), (3, 64, 17), (7, 5, 70), (17, 3, 64), (64, 130, 15)]:
        a, b = _int8(m, k), _int8(k, n)
        a_scale = (rng.uniform(1e-3, 1e-1, m) if per_row else np.array(0.02)).astype(np.float32)
        b_scales = rng.uniform(1e-3, 1e-1, n).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) * 10 if with_bias else None
        _check_linear(a, a_scale, zero_point, b, b_scales, bias)


def test_scale_and_zero_point_forms():
    a, b = _int8(6, 40), _int8(40, 20)
    packed = q.pack_weight(b)
    want = q.linear_int8(a, np.float32(0.5), 3, packed, np.full(20, 0.25, np.float32), None)
    forms = [(np.array([0.5], np.float32), np.array(3), np.float32(0.25)),
             (np.full(6, 0.5, np.float32), np.int8(3), np.array([0.25], np.float32)),
             (np.full((6, 1), 0.5, np.float32)[:, 0], np.array(3, np.int64),
              np.array(0.25, np.float32))]  # fmt: skip
    for a_scale, zp, b_scales in forms:
        got = q.linear_int8(a, a_scale, zp, packed, b_scales, None)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, _exact(a, b, 3).astype(np.float32) * np.float32(0.125))


def test_leading_dims_are_rows():
    b = _int8(33, 70)
    packed = q.pack_weight(b)
    a = _int8(2, 3, 5, 33)
    got = q.matmul_int8(a, packed)
    assert got.shape == (2, 3, 5, 70)
    np.testing.assert_array_equal(got, _exact(a, b))
    a_scale = rng.uniform(0.01, 0.1, (2, 3, 5)).astype(np.float32)  # per row, a's shape
    b_scales = rng.uniform(0.01, 0.1, 70).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    got = _check_linear(a, a_scale, -7, b, b_scales, bias)
    flat = q.linear_int8(a.reshape(30, 33), a_scale.reshape(30), -7, packed, b_scales, bias)
    np.testing.assert_array_equal(got.reshape(30, 70), flat)
    swapped = a.transpose(1, 0, 2, 3)[:, :, ::2]  # [3, 2, 3, 33], no two dims contiguous
    np.testing.assert_array_equal(q.matmul_int8(swapped, packed), _exact(swapped, b))


def test_non_contiguous_inputs():
    x = _int8(70, 90)
    b = _int8(90, 40)
    packed = q.pack_weight(b)
    # Reversed columns, every other row, column-major.
    for a in (x[:33, ::-1], x[::2, :90], np.ascontiguousarray(x[:, :90].T).T[:21]):
        assert not a.flags.c_contiguous
        np.testing.assert_array_equal(q.matmul_int8(a, packed), _exact(a, b))
    transposed = _int8(90, 12).T  # [12, 90], column-major
    np.testing.assert_array_equal(q.matmul_int8(transposed, packed), _exact(transposed, b))
    readonly = x[:, :90].copy()
    readonly.flags.writeable = False
    np.testing.assert_array_equal(q.matmul_int8(readonly, packed), _exact(readonly, b))
    # A weight of any strides packs the same as its contiguous copy.
    strided = _int8(40, 90).T
    np.testing.assert_array_equal(q.matmul_int8(x[:, :90], q.pack_weight(strided)),
                                  _exact(x[:, :90], strided))  # fmt: skip


def test_threads_split_the_work_without_changing_a_bit():
    a, b = _int8(2, 150, 300), _int8(300, 200)
    packed = q.pack_weight(b)
    a_scale, b_scales = np.float32(0.01), rng.uniform(0.01, 0.1, 200).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    ints = q.matmul_int8(a, packed, threads=1)
    floats = q.linear_int8(a, a_scale, 5, packed, b_scales, bias, threads=1)
    np.testing.assert_array_equal(ints, _exact(a, b))
    for threads in (2, 3, 7):
        np.testing.assert_array_equal(q.matmul_int8(a, packed, threads=threads), ints)
        np.testing.assert_array_equal(
            q.linear_int8(a, a_scale, 5, packed, b_scales, bias, threads=threads), floats
        )
    one_row = a[0, :1]  # batch-1 inference: the tasks are the weight's panels
    np.testing.assert_array_equal(q.matmul_int8(one_row, packed, threads=2),
                                  q.matmul_int8(one_row, packed, threads=1))  # fmt: skip


def test_output_comes_from_empty():
    a, b = _int8(3, 10), _int8(10, 5)
    made = []

    def empty(shape, dtype):
        made.append((shape, np.dtype(dtype)))
        return np.full(shape, 99, dtype)

    got = q.linear_int8(a, np.float32(1), 0, q.pack_weight(b), np.float32(1), None, empty=empty)
    assert made == [((3, 5), np.dtype(np.float32))]
    np.testing.assert_array_equal(got, _exact(a, b).astype(np.float32))
    # An output the kernel could not write in place would lose the result: refused.
    for wrong in (lambda shape, dtype: np.empty(shape[::-1], dtype).T,
                  lambda shape, dtype: np.empty(shape, np.float64),
                  lambda shape, dtype: np.empty((3, 6), dtype)):  # fmt: skip
        with pytest.raises(ShapeError):
            q.matmul_int8(a, q.pack_weight(b), empty=wrong)


def test_packing_is_pure_and_read_only():
    b = _int8(257, 100)
    before = b.copy()
    first, second = q.pack_weight(b), q.pack_weight(b)
    np.testing.assert_array_equal(b, before)
    np.testing.assert_array_equal(first.panels, second.panels)
    np.testing.assert_array_equal(first.col_sums, b.sum(axis=0, dtype=np.int64))
    assert first.panels.shape == (2, 65, q.NR, 4) and (first.k, first.n) == (257, 100)
    assert not first.panels.flags.writeable and not first.col_sums.flags.writeable
    # The layout: column j, k = 4 g + i lies at panels[j // NR, g, j % NR, i]; zeros past.
    assert first.panels[1, 64, 35, 0] == b[256, 64 + 35]
    assert first.panels[0, 10, 7, 2] == b[42, 7]
    assert not first.panels[1, :, 36:].any() and not first.panels[:, 64, :, 1:].any()


def test_what_supports_refuses_raises_a_typed_error():
    b = _int8(8, 16)
    packed = q.pack_weight(b)
    bad = [np.zeros((2, 8), np.uint8), np.zeros((2, 8), np.float32), np.zeros(8, np.int8),
           np.zeros((2, 9), np.int8), np.zeros((0, 8), np.int8)]  # fmt: skip
    for a in bad:
        assert not q.supports(a, b)
        with pytest.raises(q.KernelUnsupported):
            q.matmul_int8(a, packed)
        with pytest.raises(q.KernelUnsupported):
            q.linear_int8(a, np.float32(1), 0, packed, np.float32(1), None)
    assert q.supports(_int8(2, 8), b) and not q.supports(_int8(2, 8), b.astype(np.int16))
    assert not q.supports(_int8(2, 8), _int8(2, 8, 16))  # a 2-d weight only
    for weight in (b.astype(np.int32), _int8(8), np.zeros((8, 0), np.int8), [[1, 2]]):
        with pytest.raises(q.KernelUnsupported):
            q.pack_weight(weight)
    with pytest.raises(q.KernelUnsupported, match="PackedWeight"):
        q.matmul_int8(_int8(2, 8), b)


def test_bad_scales_zero_points_and_bias_are_typed_errors():
    a, packed = _int8(4, 8), q.pack_weight(_int8(8, 16))
    one = np.float32(1)
    cases = [
        (np.ones(3, np.float32), 0, one, None, ShapeError),  # neither 1 nor 4 row scales
        (np.float64(1), 0, one, None, DTypeError),  # not float32
        (one, 0, 0.5, None, DTypeError),  # a Python float is float64
        (one, 0, np.ones(15, np.float32), None, ShapeError),
        (one, 0, one, np.ones(15, np.float32), ShapeError),
        (one, 0, one, np.ones(16, np.float64), DTypeError),
        (one, 128, one, None, ArgumentError),
        (one, -129, one, None, ArgumentError),
        (one, 1.5, one, None, ArgumentError),
        (one, np.array([1]), one, None, ArgumentError),
        (one, True, one, None, ArgumentError),
    ]
    for a_scale, zp, b_scales, bias, error in cases:
        with pytest.raises(error) as raised:
            q.linear_int8(a, a_scale, zp, packed, b_scales, bias)
        assert isinstance(raised.value, EmberError)


def test_a_packed_weight_that_does_not_fit_its_sizes_is_refused():
    import dataclasses

    packed = q.pack_weight(_int8(10, 70))
    for change in ({"k": 13}, {"n": 200}, {"n": 0}, {"k": q.MAX_K + 1},
                   {"panels": packed.panels[:, :2]}, {"panels": packed.panels.astype(np.int16)},
                   {"padded_sums": packed.padded_sums[:70]},
                   {"panels": np.asfortranarray(packed.panels)}):  # fmt: skip
        with pytest.raises(ShapeError):
            dataclasses.replace(packed, **change)
    assert dataclasses.replace(packed, k=9).k == 9  # same panels: 9 and 10 are 3 groups of 4
