"""``ember.backends.ndarray.layout``: transposed views copied in tiles, element-wise ops on them."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.ndarray import layout


def _transposed(shape, dtype=np.float32, seed=0):
    """A view of ``shape`` whose last two dims are swapped from a C-contiguous array."""
    base_shape = (*shape[:-2], shape[-1], shape[-2])
    base = (np.random.default_rng(seed).standard_normal(base_shape) * 100).astype(dtype)
    return base.swapaxes(-1, -2)


@pytest.mark.parametrize(
    "shape",
    [(1024, 512), (130, 70), (64, 64), (200, 64), (64, 200), (3, 100, 129), (2, 2, 65, 66)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8])
def test_contiguous_copies_a_transposed_view_exactly(shape, dtype):
    x = _transposed(shape, dtype)
    assert layout.is_transposed(x)
    out = layout.contiguous(x)
    assert out.flags.c_contiguous and out.shape == x.shape and out.dtype == x.dtype
    np.testing.assert_array_equal(out, x)


def test_contiguous_into_a_given_buffer():
    x = _transposed((100, 300))
    buffer = np.full((100, 300), np.nan, np.float32)
    assert layout.contiguous(x, buffer) is buffer
    np.testing.assert_array_equal(buffer, x)


def test_other_layouts_are_copied_by_numpy_or_kept():
    a = np.arange(24.0).reshape(2, 3, 4)
    assert layout.contiguous(a) is a
    strided = a[:, ::2]
    assert not layout.is_transposed(strided)
    np.testing.assert_array_equal(layout.contiguous(strided), strided)
    assert not layout.is_transposed(np.arange(5.0))
    assert not layout.is_transposed(np.ones((1, 4)).T[:, :1])


def test_match_layout_only_touches_a_large_transposed_operand_of_the_same_shape():
    big_t, big = _transposed((300, 400)), np.ones((300, 400), np.float32)
    a, b = layout.match_layout(big_t, big)
    assert a.flags.c_contiguous and b is big
    np.testing.assert_array_equal(a, big_t)
    a, b = layout.match_layout(big, big_t)
    assert a is big and b.flags.c_contiguous
    small_t = _transposed((10, 20))
    assert layout.match_layout(small_t, np.ones((10, 20)))[0] is small_t
    row = np.ones(300, np.float32)
    assert layout.match_layout(big_t, row)[0] is big_t  # broadcasting: left to NumPy
    assert layout.match_layout(big_t, 2.0)[0] is big_t


@pytest.mark.parametrize("name", ["float_add", "float_sub", "float_mul", "float_div"])
@pytest.mark.parametrize("side", ["lhs", "rhs", "both"])
def test_ndarray_ops_on_transposed_operands(name, side):
    from ember.backends.ndarray.backend import NdArray

    backend = NdArray()
    t = _transposed((520, 260), seed=1)
    c = (np.random.default_rng(2).standard_normal((520, 260)) + 3).astype(np.float32)
    lhs, rhs = {"lhs": (t, c), "rhs": (c, t), "both": (t, _transposed((520, 260), seed=3))}[side]
    expected = {"float_add": np.add, "float_sub": np.subtract, "float_mul": np.multiply,
                "float_div": np.true_divide}[name](lhs, rhs)  # fmt: skip
    got = getattr(backend, name)(lhs, rhs)
    np.testing.assert_array_equal(got, expected)
    got_again = getattr(backend, name)(lhs, rhs)  # the scratch copy is reused: results stay
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got_again, expected)
