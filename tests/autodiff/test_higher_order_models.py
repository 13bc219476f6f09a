"""What researchers use gradients of gradients for, against PyTorch: a WGAN-GP gradient
penalty on a small critic and one MAML step through an inner SGD update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember import Tensor, nn
from ember import activation as A

RNG = np.random.default_rng(21)


def _critic(device):
    first = nn.LinearConfig(6, 16).init(device)
    second = nn.LinearConfig(16, 1).init(device)
    return first, second


def _torch_linear(layer) -> tuple[torch.Tensor, torch.Tensor]:
    weight = torch.from_numpy(layer.weight.val().inner().to_numpy().astype(np.float64).T.copy())
    bias = torch.from_numpy(layer.bias.val().inner().to_numpy().astype(np.float64).copy())
    return weight.requires_grad_(True), bias.requires_grad_(True)


@pytest.mark.parametrize("inner", ["ndarray", "torch"])
def test_wgan_gp_penalty_gradients_equal_pytorchs(inner):
    device = ember.device(inner).autodiff()
    first, second = _critic(device)
    first = first.map(lambda _, p: p.with_value(p.val().cast("f64").detach().require_grad()))
    second = second.map(lambda _, p: p.with_value(p.val().cast("f64").detach().require_grad()))
    real, fake = RNG.standard_normal((8, 6)), RNG.standard_normal((8, 6))
    alpha = RNG.uniform(size=(8, 1))
    mixed = alpha * real + (1 - alpha) * fake

    x = Tensor.from_data(mixed, device).require_grad()
    score = second(A.leaky_relu(first(x), 0.2))
    grad_x = x.grad(score.sum().backward(create_graph=True))
    norms = (grad_x * grad_x).sum_dim(1).sqrt()
    penalty = ((norms - 1.0) * (norms - 1.0)).mean()
    grads = penalty.backward()

    w1, b1 = _torch_linear(first)
    w2, b2 = _torch_linear(second)
    xt = torch.from_numpy(mixed).requires_grad_(True)
    score_t = torch.nn.functional.leaky_relu(xt @ w1.T + b1, 0.2) @ w2.T + b2
    (grad_t,) = torch.autograd.grad(score_t.sum(), xt, create_graph=True)
    penalty_t = ((grad_t.norm(dim=1) - 1) ** 2).mean()
    expected = torch.autograd.grad(penalty_t, [w1, b1, w2, b2], allow_unused=True)

    assert penalty.item() == pytest.approx(penalty_t.item(), rel=1e-10)
    got = [first.weight, first.bias, second.weight, second.bias]
    for param, want, transpose in zip(got[:3], expected[:3], (True, False, True)):
        have = param.val().grad(grads)
        # The first bias moves only the ReLU's kinks: a zero gradient, which ember leaves out.
        have = np.zeros(param.shape) if have is None else have.to_numpy()
        want = want.numpy().T if transpose else want.numpy()
        np.testing.assert_allclose(have, want, rtol=1e-9, atol=1e-12)
    # The critic's last bias shifts the score, not its slope: no gradient on either side.
    assert expected[3] is None and second.bias.val().grad(grads) is None


def _mlp(params, x):
    w1, b1, w2, b2 = params
    return (x.matmul(w1) + b1).tanh().matmul(w2) + b2


def test_maml_outer_gradient_through_an_inner_sgd_step_equals_pytorchs():
    device = ember.device("ndarray").autodiff()
    arrays = [RNG.standard_normal(s) * 0.5 for s in ((3, 8), (8,), (8, 1), (1,))]
    support_x, support_y = RNG.standard_normal((10, 3)), RNG.standard_normal((10, 1))
    query_x, query_y = RNG.standard_normal((10, 3)), RNG.standard_normal((10, 1))
    lr = 0.1

    params = [Tensor.from_data(a, device).require_grad() for a in arrays]

    def loss(ps, x, y):
        diff = _mlp(ps, Tensor.from_data(x, device)) - Tensor.from_data(y, device)
        return (diff * diff).mean()

    inner = loss(params, support_x, support_y).backward(create_graph=True)
    adapted = [p - p.grad(inner) * lr for p in params]
    outer = loss(adapted, query_x, query_y).backward()

    ts = [torch.from_numpy(a).requires_grad_(True) for a in arrays]

    def loss_t(ps, x, y):
        w1, b1, w2, b2 = ps
        out = torch.tanh(torch.from_numpy(x) @ w1 + b1) @ w2 + b2
        return ((out - torch.from_numpy(y)) ** 2).mean()

    inner_t = torch.autograd.grad(loss_t(ts, support_x, support_y), ts, create_graph=True)
    adapted_t = [p - g * lr for p, g in zip(ts, inner_t)]
    expected = torch.autograd.grad(loss_t(adapted_t, query_x, query_y), ts)
    for p, want in zip(params, expected):
        np.testing.assert_allclose(p.grad(outer).to_numpy(), want.numpy(), rtol=1e-9, atol=1e-12)


def test_a_hessian_vector_product_equals_pytorchs():
    device = ember.device("ndarray").autodiff()
    array, v = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    x = Tensor.from_data(array, device).require_grad()
    f = (x.sin() * x).sum() + (x.matmul(x.swap_dims(0, 1))).exp().sum() * 0.01
    g = x.grad(f.backward(create_graph=True))
    hvp = x.grad((g * Tensor.from_data(v, device)).sum().backward())

    xt = torch.from_numpy(array)
    _, hvp_t = torch.autograd.functional.hvp(
        lambda t: (t.sin() * t).sum() + (t @ t.T).exp().sum() * 0.01, xt, torch.from_numpy(v))  # fmt: skip
    np.testing.assert_allclose(hvp.to_numpy(), hvp_t.numpy(), rtol=1e-9, atol=1e-12)
