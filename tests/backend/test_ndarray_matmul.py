"""NdArray's matmul of a stacked lhs by a matrix: one product over all the lhs's rows (a
permuted lhs's too, in place), compared with the float64 product (and NumPy's own path
where no order of the lhs is contiguous);
stacks of small products (attention's heads) with strided operands."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.ndarray.backend import NdArray

BACKEND = NdArray()


def _check(out, a, b):
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert out.shape == want.shape and out.dtype == a.dtype
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_stacked_lhs_by_a_matrix_is_one_product(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5, 7, 16)).astype(dtype)
    b = rng.standard_normal((16, 9)).astype(dtype)
    _check(BACKEND.float_matmul(a, b), a, b)
    _check(BACKEND.float_matmul(a, b.T.copy().T), a, b)  # a transposed rhs
    _check(BACKEND.float_matmul(a.swapaxes(0, 1), b), a.swapaxes(0, 1), b)  # not contiguous


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_permuted_lhs_is_multiplied_where_it_lies(dtype):
    # Attention's input in [seq, batch, dim], a permute of [batch, seq, dim]: one product of
    # the rows as they lie, the result a view in the lhs's order (no copy of the lhs).
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6, 16)).astype(dtype)
    b = rng.standard_normal((16, 5)).astype(dtype)
    for a in (x.transpose(1, 0, 2), x.reshape(4, 6, 2, 8).transpose(2, 1, 0, 3)[..., :8]):
        w = b[: a.shape[-1]]
        out = BACKEND.float_matmul(a, w)
        _check(out, a, w)
        assert not out.flags.c_contiguous  # the product's rows, in a's order
    for a in (x[:, ::2], x.transpose(2, 1, 0)[..., :4], x[:, :1].transpose(1, 0, 2)):
        w = rng.standard_normal((a.shape[-1], 3)).astype(dtype)  # no order is contiguous
        _check(BACKEND.float_matmul(a, w), a, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stacks_of_small_products(ndarray_threads, dtype):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((5, 3, 12, 8)).astype(dtype)  # [batch, heads, seq, dim]
    k = rng.standard_normal((5, 3, 12, 8)).astype(dtype)
    _check(BACKEND.float_matmul(q, k.swapaxes(-1, -2)), q, k.swapaxes(-1, -2))  # a strided rhs
    heads_last = rng.standard_normal((5, 12, 3, 8)).astype(dtype).transpose(0, 2, 1, 3)
    _check(BACKEND.float_matmul(heads_last, k.swapaxes(-1, -2)), heads_last, k.swapaxes(-1, -2))
    _check(BACKEND.float_matmul(q[:1], k[:1].swapaxes(-1, -2)), q[:1], k[:1].swapaxes(-1, -2))
    a, b = rng.standard_normal((7, 4, 6)).astype(dtype), rng.standard_normal((7, 6, 2)).astype(dtype)
    _check(BACKEND.float_matmul(a, b), a, b)
    empty = BACKEND.float_matmul(a[:0], b[:0])
    assert empty.shape == (0, 4, 2) and empty.dtype == dtype
