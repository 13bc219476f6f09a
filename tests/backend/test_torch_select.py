"""The Torch backend's branch-free CPU select (``mask_where`` / ``mask_fill`` above a few
thousand elements) against ``torch.where``, bit for bit: every dtype, broadcasting, NaN,
signed zeros and infinities."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_ndarray_select import SELECT_SHAPES  # noqa: E402 - the same cases as NdArray's

from ember.backends.torch.backend import _BITWISE_SELECT_MIN, select  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]  # fmt: skip


def _values(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, 100, shape, generator=generator).to(dtype)
    out = torch.randn(shape, generator=generator).to(dtype)
    if out.numel() >= 4:
        out.view(-1)[:4] = torch.tensor([np.nan, -0.0, np.inf, -np.inf]).to(dtype)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("mask_shape", "a_shape", "b_shape"),
    SELECT_SHAPES,
)
def test_select_is_where_bit_for_bit(dtype, mask_shape, a_shape, b_shape):
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(2)) < 0.5
    a, b = _values(0, a_shape, dtype), _values(1, b_shape, dtype)
    assert max(mask.numel(), a.numel(), b.numel()) >= _BITWISE_SELECT_MIN  # the bitwise path
    got, want = select(mask, a, b), torch.where(mask, a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.contiguous().view(torch.uint8).equal(want.contiguous().view(torch.uint8))


def test_broadcast_views_and_small_selects():
    mask = torch.rand(64, 97, generator=torch.Generator().manual_seed(3)) < 0.5
    a = torch.randn(97).expand(64, 97)  # a zero-stride view
    b = torch.randn(97, 64).t()  # a transposed view
    assert select(mask, a, b).equal(torch.where(mask, a, b))
    small = torch.tensor([True, False])
    assert select(small, torch.ones(2), torch.zeros(2)).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fill", [0.0, -0.0, 1.0])
@pytest.mark.parametrize("mask_shape", [(64, 97), (97,)], ids=str)
def test_select_of_a_scalar_fill(dtype, fill, mask_shape):
    # mask_fill's case; a zero fill takes its own path (b & ~mask).
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(4)) < 0.5
    a, b = torch.tensor(fill).to(dtype), _values(5, (64, 97), dtype)
    got, want = select(mask, a, b), torch.where(mask, a, b)
    assert got.dtype == want.dtype
    assert got.contiguous().view(torch.uint8).equal(want.contiguous().view(torch.uint8))
