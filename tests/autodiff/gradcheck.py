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


def _second_order_ember(ember_fn: Callable, inputs: Sequence[np.ndarray], device: ember.Device,
                        differentiable: Sequence[bool]) -> list:  # fmt: skip
    tensors = [Tensor.from_data(TensorData(a), device).cast(DType.F64).require_grad() if d
               else Tensor.from_data(TensorData(a), device)
               for a, d in zip(inputs, differentiable)]  # fmt: skip
    out = ember_fn(*tensors)
    w = Tensor.from_data(TensorData(_weights(out.shape)), device).cast(out.dtype)
    grads = (out * w).sum().backward(create_graph=True)
    firsts = [t.grad(grads) if d else None for t, d in zip(tensors, differentiable)]
    # The second order along fixed directions v: d/dx sum_i <grad_i, v_i>.
    terms = [(g * Tensor.from_data(TensorData(_weights(g.shape, 99 + i)), device).cast(g.dtype)).sum()
             for i, g in enumerate(firsts) if g is not None]  # fmt: skip
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    if not total.is_require_grad():  # the first derivatives are constants
        return [np.zeros(a.shape) if d else None for a, d in zip(inputs, differentiable)]
    seconds = total.backward()
    return [None if not d else (np.zeros(a.shape) if t.grad(seconds) is None
                                else t.grad(seconds).to_numpy())
            for t, a, d in zip(tensors, inputs, differentiable)]  # fmt: skip


def _second_order_torch(torch_fn: Callable, inputs: Sequence[np.ndarray],
                        differentiable: Sequence[bool]) -> list:  # fmt: skip
    tensors = [torch.from_numpy(np.array(a)).to(torch.float64).requires_grad_(True) if d
               else torch.from_numpy(np.array(a)) for a, d in zip(inputs, differentiable)]  # fmt: skip
    out = torch_fn(*tensors)
    w = torch.from_numpy(_weights(tuple(out.shape))).to(out.dtype)
    leaves = [t for t, d in zip(tensors, differentiable) if d]
    firsts = torch.autograd.grad((out * w).sum(), leaves, create_graph=True, allow_unused=True)
    total = sum((g * torch.from_numpy(_weights(tuple(g.shape), 99 + i))).sum()
                for i, g in enumerate(firsts) if g is not None)  # fmt: skip
    if not torch.is_tensor(total) or not total.requires_grad:
        return [np.zeros(a.shape) if d else None for a, d in zip(inputs, differentiable)]
    seconds = iter(torch.autograd.grad(total, leaves, allow_unused=True))
    out_list = []
    for a, d in zip(inputs, differentiable):
        if not d:
            out_list.append(None)
            continue
        g = next(seconds)
        zero = g is None or g._is_zerotensor()  # PyTorch's symbolic zeros (abs'' = 0)
        out_list.append(np.zeros(a.shape) if zero else g.detach().numpy())
    return out_list


def check_second_order_against_torch(ember_fn: Callable, torch_fn: Callable,
                                     inputs: Sequence[np.ndarray], device: ember.Device,
                                     differentiable: Sequence[bool] | None = None) -> None:  # fmt: skip
    """Asserts float64 second derivatives (``backward(create_graph=True)``, then the
    gradient of ``sum_i <grad_i, v_i>`` for fixed ``v``) equal PyTorch's double backward."""
    differentiable = differentiable or [True] * len(inputs)
    ours = _second_order_ember(ember_fn, inputs, device, differentiable)
    try:
        theirs = _second_order_torch(torch_fn, inputs, differentiable)
        rtol, atol = 1e-8, 1e-9
    except RuntimeError as e:  # PyTorch has no double backward for this op
        if "not implemented" not in str(e):
            raise
        theirs, rtol, atol = _second_order_fd(ember_fn, inputs, device, differentiable), 1e-5, 1e-6
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if b is not None:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"input {i}")


def _second_order_fd(ember_fn: Callable, inputs: Sequence[np.ndarray], device: ember.Device,
                     differentiable: Sequence[bool], eps: float = 1e-6) -> list:  # fmt: skip
    """Central differences of ``sum_i <grad_i, v_i>`` (first derivatives, float64)."""

    def objective(arrays) -> float:
        firsts = ember_grads(ember_fn, arrays, device, DType.F64, differentiable)
        return sum(float(np.sum(g.to_numpy() * _weights(g.shape, 99 + i)))
                   for i, g in enumerate(f for f in firsts if f is not None))  # fmt: skip

    out = []
    for i, (array, d) in enumerate(zip(inputs, differentiable)):
        if not d:
            out.append(None)
            continue
        numeric = np.zeros(array.shape)
        for j in range(array.size):
            plus = [np.array(a, dtype=np.float64) if di else a for a, di in zip(inputs, differentiable)]
            minus = [np.array(a, dtype=np.float64) if di else a for a, di in zip(inputs, differentiable)]
            plus[i].reshape(-1)[j] += eps
            minus[i].reshape(-1)[j] -= eps
            numeric.reshape(-1)[j] = (objective(plus) - objective(minus)) / (2 * eps)
        out.append(numeric)
    return out
