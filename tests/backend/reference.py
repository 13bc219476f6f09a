"""Comparison of ember tensors with PyTorch (the reference) and NumPy float64.

Tolerances: float64 results are compared tightly, float32 with the tolerances
below, f16/bf16 loosely; Int and Bool results must be exact.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np
import pytest
import torch

from ember import DType, Tensor, TensorData

TORCH_DTYPE = {
    DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16,
    DType.BF16: torch.bfloat16, DType.I64: torch.int64, DType.I32: torch.int32,
    DType.I16: torch.int16, DType.I8: torch.int8, DType.U8: torch.uint8, DType.BOOL: torch.bool,
}  # fmt: skip
EMBER_DTYPE = {v: k for k, v in TORCH_DTYPE.items()}

TOLERANCE = {  # (rtol, atol)
    DType.F64: (1e-10, 1e-12),
    DType.F32: (1e-5, 1e-6),
    DType.F16: (2e-3, 2e-3),
    DType.BF16: (2e-2, 2e-2),
}

FLOAT_DTYPES = [DType.F64, DType.F32, DType.F16, DType.BF16]
INT_DTYPES = [DType.I64, DType.I32, DType.I16, DType.I8, DType.U8]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [DType.BOOL]


def to_torch(t: Tensor) -> torch.Tensor:
    """The reference tensor holding the same elements and dtype as ``t``."""
    data = t.into_data()
    array = data.to_numpy()
    if data.dtype is DType.BF16:
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(array))


def from_torch(t: torch.Tensor, device) -> Tensor:
    """An ember tensor with the elements and dtype of a reference tensor."""
    dtype = EMBER_DTYPE[t.dtype]
    if t.dtype == torch.bfloat16:
        data = TensorData(t.float().numpy()).convert(DType.BF16)
    else:
        data = TensorData(t.numpy())
    return Tensor.from_data(data, device, dtype=dtype)


def assert_close(actual: Tensor, expected: Any, rtol: float | None = None, atol: float | None = None,
                 check_dtype: bool = True) -> None:  # fmt: skip
    """Asserts ``actual`` matches ``expected`` (a torch tensor, array or nested list):
    same shape, same dtype (for torch references), values within the dtype's tolerance."""
    data = actual.into_data()
    if isinstance(expected, torch.Tensor):
        if check_dtype:
            assert data.dtype is EMBER_DTYPE[expected.dtype], f"dtype {data.dtype} != reference {expected.dtype}"
        ref = expected.detach().float().numpy() if expected.dtype == torch.bfloat16 else expected.detach().numpy()
    else:
        ref = np.asarray(expected)
    assert data.shape == tuple(ref.shape), f"shape {list(data.shape)} != reference {list(ref.shape)}"
    if data.dtype.is_float:
        default_rtol, default_atol = TOLERANCE[data.dtype]
        data.assert_approx_eq(TensorData(ref), rtol=default_rtol if rtol is None else rtol,
                              atol=default_atol if atol is None else atol)  # fmt: skip
    else:
        data.assert_eq(TensorData(ref).convert(data.dtype), strict=False)


def random_pair(shape: tuple[int, ...], dtype: DType, device, low: float = -3.0, high: float = 3.0,
                seed: int = 0, integral: bool = False) -> tuple[Tensor, torch.Tensor]:  # fmt: skip
    """A random ember tensor of ``dtype`` on ``device`` and the reference tensor with its elements.

    Float values are uniform in ``[low, high)``; Int values (and Float ones when
    ``integral``, which makes many ties) are integers in ``[low, high)``, with
    ``low`` raised to 0 for u8; Bool values are fair coin flips.
    """
    rng = np.random.default_rng(seed)
    if dtype is DType.BOOL:
        values = rng.integers(0, 2, shape).astype(bool)
    elif dtype.is_int or integral:
        values = rng.integers(max(int(low), 0) if dtype is DType.U8 else int(low), int(high), shape)
    else:
        values = rng.uniform(low, high, shape)
    ref = torch.from_numpy(np.asarray(values)).to(TORCH_DTYPE[dtype])
    return from_torch(ref, device), ref


def raises_with(error: type[Exception], message: str):
    """``pytest.raises(error)`` whose message must contain ``message`` literally (no regex)."""
    return pytest.raises(error, match=re.escape(message))


def each_case(subtests, check, **axes) -> None:
    """Runs ``check(**combo)`` for every combination of the ``axes`` values, each as a subtest
    (pytest's ``subtests`` fixture), so one failing combination does not hide the others.

    Example: ``each_case(subtests, lambda dtype: ..., dtype=[DType.F32, DType.I64])``.
    """
    for values in itertools.product(*axes.values()):
        combo = dict(zip(axes, values))
        with subtests.test(**combo):
            check(**combo)
