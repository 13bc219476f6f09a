"""Gradients of gradients (``backward(create_graph=True)``) against PyTorch's double backward.

The cases are the first-order suites' own (element-wise ops and reductions, activations,
layout ops, matrix products, convolutions / pooling / resampling / embeddings): each runs
its second derivative along fixed directions in float64, on smooth inputs, against
PyTorch (or, where PyTorch has no double backward, finite differences of the first
derivatives). Every backward rule's ops have rules of their own, so every case passes; an
op without one would make a node that raises :class:`FirstOrderOnlyError` naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gradcheck import check_second_order_against_torch
from test_grad_activation import ALONG_DIM, ELEMENTWISE, SMOOTH
from test_grad_elementwise import CASES as ELEMENTWISE_CASES
from test_grad_layout import CASES as LAYOUT_CASES
from test_grad_matmul import CASES as MATMUL_CASES
from test_grad_module import CASES as MODULE_CASES

import ember
from ember import Tensor
from ember.backends.autodiff.backend import FirstOrderOnlyError

SKIPPED = {
    # A zero base: the second derivatives hold 0 * log(0); PyTorch's double backward spreads
    # the NaN over every entry of the broadcast exponent, ember's keeps it to the zero's row.
    "elementwise:pow_zero_base",
}


def _cases():
    for name, case in ELEMENTWISE_CASES.items():
        if f"elementwise:{name}" in SKIPPED:
            continue
        inputs = (case.smooth or case.inputs)()
        yield f"elementwise:{name}", case.ember_fn, case.torch_fn, inputs, case.differentiable
    smooth = np.array(SMOOTH).reshape(3, 4)
    for name, (ember_fn, torch_fn) in ELEMENTWISE.items():
        yield f"activation:{name}", ember_fn, torch_fn, [smooth], None
    rows = np.random.default_rng(2).uniform(-3, 3, (3, 6))
    for name, (ember_fn, torch_fn) in ALONG_DIM.items():
        yield (f"activation:{name}", lambda x, f=ember_fn: f(x, 1), lambda x, f=torch_fn: f(x, 1),
               [rows], None)  # fmt: skip
    for name, ember_fn, torch_fn, inputs in LAYOUT_CASES:
        yield f"layout:{name}", ember_fn, torch_fn, inputs, None
    for name, fn, inputs in MATMUL_CASES:
        yield f"matmul:{name}", fn, fn, inputs, None
    for param in MODULE_CASES:
        ember_fn, torch_fn, inputs, _fd, differentiable = param.values
        yield f"module:{param.id}", ember_fn, torch_fn, inputs, differentiable


CASES = list(_cases())



@pytest.mark.parametrize(("name", "ember_fn", "torch_fn", "inputs", "differentiable"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_second_derivative_vs_torch(name, ember_fn, torch_fn, inputs, differentiable):
    check_second_order_against_torch(ember_fn, torch_fn, inputs, ember.device("ndarray").autodiff(),
                                     differentiable)  # fmt: skip


OTHER_INNERS = {
    "autodiff-torch": lambda: ember.device("torch").autodiff(),
    "autodiff-fusion": lambda: ember.device("ndarray").fusion(runtime="interpreter").autodiff(),
}


@pytest.mark.parametrize("name", list(OTHER_INNERS))
@pytest.mark.parametrize("case", ["matmul:chain_and_reuse", "activation:softmax",
                                  "module:conv2d_stride_padding", "module:max_pool2d"])  # fmt: skip
def test_second_derivatives_on_other_inner_backends(name, case):
    found = {c[0]: c for c in CASES}
    if case not in found:
        pytest.skip(f"no case {case!r} in the first-order suites")
    _, ember_fn, torch_fn, inputs, differentiable = found[case]
    check_second_order_against_torch(ember_fn, torch_fn, inputs, OTHER_INNERS[name](),
                                     differentiable)  # fmt: skip


THIRD_ORDER = {
    "exp": (lambda x: x.exp(), torch.exp),
    "sin": (lambda x: x.sin(), torch.sin),
    "tanh": (lambda x: x.tanh(), torch.tanh),
    "softmax": (lambda x: ember.activation.softmax(x, 1), lambda x: torch.softmax(x, 1)),
    "matmul": (lambda x: x.matmul(x.swap_dims(0, 1)).matmul(x), lambda x: x @ x.T @ x),
    # Each order runs leaky_relu_backward's own rule: the gradient reaching the activation
    # depends on x (through exp), and the one leaving it goes on to sin.
    "leaky_relu": (lambda x: ember.activation.leaky_relu(x.sin(), 0.2).exp(),
                   lambda x: torch.nn.functional.leaky_relu(x.sin(), 0.2).exp()),
}


@pytest.mark.parametrize("name", list(THIRD_ORDER))
def test_third_derivatives_vs_torch(name):
    ember_fn, torch_fn = THIRD_ORDER[name]
    array = np.random.default_rng(4).uniform(-1.5, 1.5, (3, 3))
    v = [np.random.default_rng(10 + k).uniform(0.5, 1.5, (3, 3)) for k in range(3)]
    x = Tensor.from_data(array, ember.device("ndarray").autodiff()).cast("f64").require_grad()
    value = ember_fn(x)
    for k in range(3):  # d/dx <d/dx <... , v_k>>: three nested passes
        weights = Tensor.from_data(v[k], x.device).cast("f64")
        grad = x.grad((value * weights).sum().backward(create_graph=k < 2))
        value = grad
    xt = torch.from_numpy(array).requires_grad_(True)
    value_t = torch_fn(xt)
    for k in range(3):
        (value_t,) = torch.autograd.grad((value_t * torch.from_numpy(v[k])).sum(), xt,
                                         create_graph=k < 2)  # fmt: skip
    np.testing.assert_allclose(value.to_numpy(), value_t.numpy(), rtol=1e-9, atol=1e-10)


def test_an_op_without_a_rule_of_its_own_is_first_order_only(monkeypatch):
    from ember.backends.autodiff import Autodiff
    from ember.backends.autodiff.rule import RULES
    from ember.tensor import module as M

    monkeypatch.delitem(RULES, "avg_pool2d_backward")
    device = ember.device("ndarray").wrap(Autodiff)  # a new instance: no rule looked up yet
    x = Tensor.from_data(np.ones((1, 1, 4, 4)), device).require_grad()
    pooled = M.avg_pool2d(x * x, 2)
    first = x.grad(pooled.sum().backward(create_graph=True))  # first order still works
    np.testing.assert_allclose(first.to_numpy(), np.full((1, 1, 4, 4), 0.5))
    with pytest.raises(FirstOrderOnlyError, match=r"'avg_pool2d_backward'.*first order only"):
        (first * first).sum().backward()
