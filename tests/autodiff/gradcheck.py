"""Gradient checks: ember's autodiff against PyTorch autograd and against finite differences.

A check takes one function written twice over the same inputs, ``ember_fn``
on ember tensors and ``torch_fn`` on torch tensors, and compares the
gradients of ``sum(fn(inputs) * weights)`` for every input (the fixed random
weights make every output element matter). Inputs are NumPy arrays; the
check builds the tensors itself on the autodiff device under test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

import ember
from ember import DType, Tensor, TensorData

TOLERANCE = {DType.F64: (1e-9, 1e-10), DType.F32: (1e-4, 1e-5)}
_TORCH = {DType.F64: torch.float64, DType.F32: torch.float32}


def _weights(shape, seed: int = 1234) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 1.5, size=shape)


def ember_grads(ember_fn: Callable, inputs: Sequence[np.ndarray], device: ember.Device,
                dtype: DType = DType.F64, differentiable: Sequence[bool] | None = None) -> list:  # fmt: skip
    """Gradients of ``sum(ember_fn(*inputs) * w)`` for each input (None where not differentiable)."""
    differentiable = differentiable or [True] * len(inputs)
    tensors = []
    for array, diff in zip(inputs, differentiable):
        t = Tensor.from_data(TensorData(array), device)
        if diff:
            t = t.cast(dtype).require_grad()
        tensors.append(t)
    out = ember_fn(*tensors)
    w = Tensor.from_data(TensorData(_weights(out.shape)), device).cast(out.dtype)
    grads = (out * w).sum().backward()
    return [t.grad(grads) if d else None for t, d in zip(tensors, differentiable)]


def torch_grads(torch_fn: Callable, inputs: Sequence[np.ndarray], dtype: DType = DType.F64,
                differentiable: Sequence[bool] | None = None) -> list:  # fmt: skip
    differentiable = differentiable or [True] * len(inputs)
    tensors = []
    for array, diff in zip(inputs, differentiable):
        t = torch.from_numpy(np.array(array))
        if diff:
            t = t.to(_TORCH[dtype]).requires_grad_(True)
        tensors.append(t)
    out = torch_fn(*tensors)
    w = torch.from_numpy(_weights(tuple(out.shape))).to(out.dtype)
    (out * w).sum().backward()
    return [
        (t.grad if t.grad is not None else torch.zeros_like(t)) if d else None
        for t, d in zip(tensors, differentiable)
    ]


def check_against_torch(ember_fn: Callable, torch_fn: Callable, inputs: Sequence[np.ndarray],
                        device: ember.Device, dtype: DType = DType.F64,
                        differentiable: Sequence[bool] | None = None) -> None:  # fmt: skip
    """Asserts ember's gradients equal torch autograd's within the dtype's tolerance."""
    rtol, atol = TOLERANCE[dtype]
    ours = ember_grads(ember_fn, inputs, device, dtype, differentiable)
    theirs = torch_grads(torch_fn, inputs, dtype, differentiable)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if b is None:
            continue
        assert a is not None, f"input {i}: ember computed no gradient, torch did"
        assert a.dtype is dtype, f"input {i}: gradient dtype {a.dtype}, expected {dtype}"
        a.into_data().assert_approx_eq(TensorData(b.detach().numpy()), rtol=rtol, atol=atol)


def check_finite_differences(ember_fn: Callable, inputs: Sequence[np.ndarray], device: ember.Device,
                             differentiable: Sequence[bool] | None = None, eps: float = 1e-6,
                             rtol: float = 1e-5, atol: float = 1e-7) -> None:  # fmt: skip
    """Asserts float64 gradients equal central differences of ``sum(fn * w)``."""
    differentiable = differentiable or [True] * len(inputs)
    grads = ember_grads(ember_fn, inputs, device, DType.F64, differentiable)

    def objective(arrays) -> float:
        tensors = [
            Tensor.from_data(TensorData(a), device).cast(DType.F64) if d else Tensor.from_data(TensorData(a), device)
            for a, d in zip(arrays, differentiable)
        ]
        out = ember_fn(*tensors).inner().into_data().to_numpy().astype(np.float64)
        return float(np.sum(out * _weights(out.shape)))

    for i, (array, d) in enumerate(zip(inputs, differentiable)):
        if not d:
            continue
        numeric = np.zeros(array.shape)
        flat = numeric.reshape(-1)
        for j in range(array.size):
            plus = [np.array(a, dtype=np.float64) if di else a for a, di in zip(inputs, differentiable)]
            minus = [np.array(a, dtype=np.float64) if di else a for a, di in zip(inputs, differentiable)]
            plus[i].reshape(-1)[j] += eps
            minus[i].reshape(-1)[j] -= eps
            flat[j] = (objective(plus) - objective(minus)) / (2 * eps)
        grads[i].into_data().assert_approx_eq(TensorData(numeric), rtol=rtol, atol=atol)
