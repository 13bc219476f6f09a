"""A custom op with its own kernels and its own backward rule: fused matmul + add + relu.

This is the op of the backend-extension chapter of the Burn book, in ember:

1. ``custom_op`` adds ``fused_matmul_add_relu`` to the op table with a shape rule
   and a *reference* implementation from the protocol's primitives, so it runs
   (and differentiates) on every backend at once;
2. ``.kernel(Backend)`` gives NdArray and Torch a fused implementation each;
3. ``@backward`` gives it a backward rule, so Autodiff runs the fused kernel
   forward and this rule backward instead of differentiating through the reference.

Run: ``.venv/bin/python examples/custom_op.py``
"""

from __future__ import annotations

import numpy as np

import ember
from ember import Tensor
from ember.backend import AVal, NdArray, custom_op, rules
from ember.backends.autodiff import backward, unbroadcast


def _rule(op: str, lhs: AVal, rhs: AVal, bias: AVal) -> AVal:
    product = rules.matmul(op, lhs, rhs)
    return AVal(rules.broadcast_shapes(op, product.shape, bias.shape), product.dtype)


def _reference(B, lhs, rhs, bias):
    """relu(lhs @ rhs + bias) from primitives: the definition every kernel must match."""
    return B.relu(B.float_add(B.float_matmul(lhs, rhs), bias))


fused_matmul_add_relu = custom_op("fused_matmul_add_relu", ("lhs", "rhs", "bias"), _rule, _reference)


@fused_matmul_add_relu.kernel(NdArray)
def _ndarray_kernel(B, lhs, rhs, bias):
    out = np.matmul(lhs, rhs)  # a fresh buffer nobody else holds: safe to finish in place
    out += bias
    return np.maximum(out, 0, out=out)


def _install_torch_kernel() -> None:
    try:
        import torch

        from ember.backend import Torch
    except ImportError:  # torch is optional
        return

    @fused_matmul_add_relu.kernel(Torch)
    def _torch_kernel(B, lhs, rhs, bias):
        return torch.matmul(lhs, rhs).add_(bias).relu_()


_install_torch_kernel()


def _swap_last(B, x):
    rank = len(B.shape(x))
    return B.float_permute(x, tuple(range(rank - 2)) + (rank - 1, rank - 2))


@backward("fused_matmul_add_relu", keep=("inputs", "output"))
def _fused_backward(B, g, s):
    lhs, rhs, _bias = s.inputs
    grad = B.float_mask_fill(g, B.float_lower_equal_elem(s.output, 0.0), 0.0)  # relu's gate
    grad_lhs = B.float_matmul(grad, _swap_last(B, rhs))
    grad_rhs = B.float_matmul(_swap_last(B, lhs), grad)
    return (
        unbroadcast(B, grad_lhs, s.shapes[0]),
        unbroadcast(B, grad_rhs, s.shapes[1]),
        unbroadcast(B, grad, s.shapes[2]),
    )


def main() -> None:
    device = ember.device("ndarray").autodiff()
    ember.seed(device, 0)
    lhs = Tensor.random([2, 3, 4], ember.Distribution.normal(0.0, 1.0), device).require_grad()
    rhs = Tensor.random([4, 5], ember.Distribution.normal(0.0, 1.0), device).require_grad()
    bias = Tensor.random([5], ember.Distribution.normal(0.0, 1.0), device).require_grad()

    fused = fused_matmul_add_relu(lhs, rhs, bias)
    reference = ember.activation.relu(lhs.matmul(rhs) + bias)
    print("forward matches the reference:", fused.all_close(reference))

    grads_fused = fused.sum().backward()
    grads_reference = reference.sum().backward()
    for name, t in (("lhs", lhs), ("rhs", rhs), ("bias", bias)):
        same = t.grad(grads_fused).all_close(t.grad(grads_reference))
        print(f"gradient of {name} matches the reference:", same)


if __name__ == "__main__":
    main()
