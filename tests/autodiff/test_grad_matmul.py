"""Gradients of the matrix product: plain, batched, broadcast batch dims, mixed ranks,
non-contiguous operands; against torch autograd (f64, f32) and finite differences (f64)."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_against_torch, check_finite_differences

from ember import DType

_rng = np.random.default_rng(11)


def _x(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape)


def _mm(a, b):
    return a @ b


def _mm_t(a, b):  # ember's transpose() and torch's mT both swap the last two dims
    return a @ (b.transpose() if hasattr(b, "swap_dims") else b.mT)


def _chain(a, b):
    return (
        (a @ b).tanh() @ b.swap_dims(-1, -2) if hasattr(b, "swap_dims") else (a @ b).tanh() @ b.mT
    )


CASES = [
    ("2d_2d", _mm, [_x(4, 5), _x(5, 3)]),
    ("batched_same", _mm, [_x(2, 4, 5), _x(2, 5, 3)]),
    ("batch_broadcast_4d_3d", _mm, [_x(3, 1, 4, 5), _x(2, 5, 6)]),
    ("batch_unit_dims", _mm, [_x(1, 4, 5), _x(3, 5, 2)]),
    ("2d_3d", _mm, [_x(4, 5), _x(2, 5, 3)]),
    ("3d_2d", _mm, [_x(2, 4, 5), _x(5, 3)]),
    ("4d_2d", _mm, [_x(2, 3, 4, 5), _x(5, 2)]),
    ("2d_4d", _mm, [_x(4, 5), _x(2, 1, 5, 3)]),
    ("vector_like", _mm, [_x(1, 5), _x(5, 1)]),
    ("rhs_transposed", _mm_t, [_x(2, 4, 5), _x(3, 5)]),
    ("rhs_transposed_batched", _mm_t, [_x(2, 4, 5), _x(2, 3, 5)]),
    ("chain_and_reuse", _chain, [_x(2, 3, 4), _x(4, 2)]),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("dtype", [DType.F64, DType.F32], ids=["f64", "f32"])
@pytest.mark.parametrize(("name", "fn", "inputs"), CASES, ids=IDS)
def test_against_torch(device, dtype, name, fn, inputs):
    check_against_torch(fn, fn, inputs, device, dtype)


@pytest.mark.parametrize(("name", "fn", "inputs"), CASES, ids=IDS)
def test_finite_differences(device, name, fn, inputs):
    check_finite_differences(fn, inputs, device)


def test_lhs_permuted_and_sliced(device):
    def ember_fn(a, b):
        return a.permute(1, 0, 2)[:, ::2] @ b

    def torch_fn(a, b):
        return a.permute(1, 0, 2)[:, ::2] @ b

    inputs = [_x(3, 2, 4), _x(4, 2)]
    check_against_torch(ember_fn, torch_fn, inputs, device)
    check_against_torch(ember_fn, torch_fn, inputs, device, DType.F32)
    check_finite_differences(ember_fn, inputs, device)


def test_only_one_operand_tracked(device):
    a = _x(2, 3, 4)
    b = _x(4, 2)
    for differentiable in ([True, False], [False, True]):
        check_against_torch(_mm, _mm, [a, b], device, differentiable=differentiable)
