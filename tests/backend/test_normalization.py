"""Conformance: ``module.layer_norm`` (the ``layer_norm`` op) against PyTorch's
``layer_norm`` over the last dim, on every backend, and its errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import TORCH_DTYPE, assert_close, from_torch

import ember
from ember import DType, Tensor
from ember.backend.errors import ArgumentError, KindError, ShapeError
from ember.tensor import module

DTYPES = [DType.F64, DType.F32, DType.F16, DType.BF16]
LOOSE = {DType.F64: (1e-10, 1e-12), DType.F32: (2e-5, 2e-5), DType.F16: (1e-2, 1e-2),
         DType.BF16: (6e-2, 6e-2)}  # fmt: skip


def _values(shape, dtype: DType, seed: int = 0, scale: float = 2.0, shift: float = 0.0) -> torch.Tensor:
    data = np.random.default_rng(seed).standard_normal(shape) * scale + shift
    return torch.from_numpy(np.asarray(data)).to(TORCH_DTYPE[dtype])


def _check(device, x: torch.Tensor, weight, bias, epsilon: float = 1e-5) -> None:
    dtype = from_torch(x, device).dtype
    ours = module.layer_norm(from_torch(x, device),
                             None if weight is None else from_torch(weight, device),
                             None if bias is None else from_torch(bias, device), epsilon)  # fmt: skip
    wide = torch.float64 if dtype is DType.F64 else torch.float32
    expected = F.layer_norm(x.to(wide), x.shape[-1:], None if weight is None else weight.to(wide),
                            None if bias is None else bias.to(wide), epsilon).to(x.dtype)  # fmt: skip
    assert_close(ours, expected, *LOOSE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_layer_norm_is_torchs(device, dtype, affine):
    x = _values((3, 4, 24), dtype)
    weight = _values((24,), dtype, seed=1) if affine in ("both", "weight") else None
    bias = _values((24,), dtype, seed=2) if affine in ("both", "bias") else None
    _check(device, x, weight, bias)


@pytest.mark.parametrize("shape", [(7,), (1, 1), (5, 1), (2, 3, 4, 9), (0, 6), (2, 0, 3)], ids=str)
def test_layer_norm_shapes(device, shape):
    _check(device, _values(shape, DType.F64), _values(shape[-1:], DType.F64, 1),
           _values(shape[-1:], DType.F64, 2))  # fmt: skip


@pytest.mark.parametrize("epsilon", [0.0, 1e-12, 0.5, 3])
def test_layer_norm_epsilon(device, epsilon):
    _check(device, _values((4, 16), DType.F64), None, None, epsilon)


def test_layer_norm_of_rows_far_from_zero(device):
    # A large common offset: the variance must not cancel to nothing. Against float64 on the
    # same float32 values, within 5 of their ulps at 1e4 (about 1e-3 each): a float32 mean
    # of such rows is off by about one.
    x = _values((6, 64), DType.F32, scale=1.0, shift=1e4)
    out = module.layer_norm(from_torch(x, device)).to_numpy()
    expected = F.layer_norm(x.double(), (64,)).numpy()
    np.testing.assert_allclose(out, expected, rtol=0, atol=5e-3)


def test_layer_norm_of_constant_rows_is_zero_and_nan_stays_in_its_row(device):
    x = torch.tensor([[2.0, 2.0, 2.0, 2.0], [1.0, math.nan, 0.0, 3.0], [1.0, 2.0, 3.0, 4.0]],
                     dtype=torch.float64)  # fmt: skip
    out = module.layer_norm(from_torch(x, device)).to_numpy()
    np.testing.assert_array_equal(out[0], np.zeros(4))
    assert np.isnan(out[1]).all()
    np.testing.assert_allclose(out[2], F.layer_norm(x[2:], (4,))[0].numpy(), rtol=1e-10)


def test_a_weight_of_another_float_dtype_is_cast_to_the_inputs(device):
    x = _values((2, 8), DType.F32)
    weight, bias = _values((8,), DType.F64, 1), _values((8,), DType.F64, 2)
    out = module.layer_norm(from_torch(x, device), from_torch(weight, device), from_torch(bias, device))
    assert out.dtype is DType.F32
    expected = F.layer_norm(x, (8,), weight.float(), bias.float())
    assert_close(out, expected, *LOOSE[DType.F32])


def test_layer_norm_errors(device):
    x = Tensor.from_data(np.ones((2, 3), np.float32), device)
    with pytest.raises(ShapeError, match=r"weight must have shape \[3\] .*got \[4\]"):
        module.layer_norm(x, Tensor.from_data(np.ones(4, np.float32), device))
    with pytest.raises(ShapeError, match=r"bias must have shape \[3\] .*got \[1, 3\]"):
        module.layer_norm(x, None, Tensor.from_data(np.ones((1, 3), np.float32), device))
    with pytest.raises(ShapeError, match="rank >= 1"):
        module.layer_norm(Tensor.from_data(np.float32(1.0), device))
    with pytest.raises(KindError, match="layer_norm"):
        module.layer_norm(Tensor.from_data(np.ones((2, 3), np.int64), device))
    with pytest.raises(KindError, match="layer_norm"):
        module.layer_norm(x, Tensor.from_data(np.ones(3, np.int64), device))
    for bad in (-1e-5, math.nan, True, "1e-5", None):
        with pytest.raises(ArgumentError, match="epsilon must be a number >= 0"):
            module.layer_norm(x, epsilon=bad)
    other = ember.device("ndarray") if device.backend.name != "ndarray" else ember.device("torch")
    with pytest.raises(ember.EmberError, match="device"):
        module.layer_norm(x, Tensor.from_data(np.ones(3, np.float32), other))
