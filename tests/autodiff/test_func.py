"""``ember.func`` against ``torch.func``: grad, value_and_grad, vjp, jvp, hvp, jacobian,
hessian and functional_call, on small functions and an MLP loss, nested, and careless calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.func as tf

import ember
from ember import Tensor, nn
from ember.func import functional_call, grad, hessian, hvp, jacobian, jvp, value_and_grad, vjp

RNG = np.random.default_rng(31)
A = RNG.standard_normal((3, 4))
B = RNG.standard_normal((4,))


@pytest.fixture(params=["ndarray", "torch"])
def device(request):
    return ember.device(request.param).autodiff()


def _e(array, device) -> Tensor:
    return Tensor.from_data(array, device)


def _t(array) -> torch.Tensor:
    return torch.from_numpy(np.array(array))


def f_ember(x, y):
    return ((x.sin() * y).tanh() + x * x * y).sum()


def f_torch(x, y):
    return ((x.sin() * y).tanh() + x * x * y).sum()


def _close(got, want):
    np.testing.assert_allclose(got.to_numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_grad_and_value_and_grad(device):
    gx, gy = grad(f_ember, (0, 1))(_e(A, device), _e(B, device))
    tx, ty = tf.grad(f_torch, (0, 1))(_t(A), _t(B))
    _close(gx, tx)
    _close(gy, ty)
    value, g = value_and_grad(f_ember, 1)(_e(A, device), _e(B, device))
    _close(value, f_torch(_t(A), _t(B)))
    _close(g, ty)


def test_grad_of_grad_nests(device):
    def cube_sum(x):
        return (x * x * x).sum()

    x = _e(np.array([1.5]), device)
    assert grad(grad(cube_sum))(x).tolist() == pytest.approx([9.0])  # 6 x
    assert grad(grad(grad(cube_sum)))(x).tolist() == pytest.approx([6.0])


def test_vjp_and_jvp(device):
    def g(x, y):
        return (x * y).exp().matmul(x.swap_dims(0, 1))

    value, pullback = vjp(g, _e(A, device), _e(B, device))
    cotangent = RNG.standard_normal(tuple(value.shape))
    got = pullback(_e(cotangent, device))
    value_t, pullback_t = tf.vjp(lambda x, y: (x * y).exp() @ x.T, _t(A), _t(B))
    want = pullback_t(_t(cotangent))
    _close(value, value_t)
    for a, b in zip(got, want):
        _close(a, b)

    tangents = (RNG.standard_normal(A.shape), RNG.standard_normal(B.shape))
    value, out = jvp(g, (_e(A, device), _e(B, device)), [_e(t, device) for t in tangents])
    value_t, out_t = tf.jvp(lambda x, y: (x * y).exp() @ x.T, (_t(A), _t(B)),
                            tuple(_t(t) for t in tangents))  # fmt: skip
    _close(value, value_t)
    _close(out, out_t)


def test_hvp_jacobian_and_hessian_of_small_functions(device):
    x = RNG.standard_normal((3,))
    v = RNG.standard_normal((3,))

    def h(x):
        return (x.exp() * x.sin()).sum() + (x * x).sum() * x.sum()

    def h_t(x):
        return (x.exp() * x.sin()).sum() + (x * x).sum() * x.sum()

    (got,) = hvp(h, (_e(x, device),), (_e(v, device),))
    _close(got, torch.autograd.functional.hvp(h_t, _t(x), _t(v))[1])
    _close(hessian(h)(_e(x, device)), tf.hessian(h_t)(_t(x)))
    _close(jacobian(lambda x: x.exp() * x.sum())(_e(x, device)),
           tf.jacrev(lambda x: x.exp() * x.sum())(_t(x)))  # fmt: skip


def test_hessian_of_an_mlp_loss_and_functional_call(device):
    ember.seed(device, 3)
    layer = nn.LinearConfig(3, 2).init(device)
    layer = layer.map(lambda _, p: p.with_value(p.val().cast("f64").detach().require_grad()))
    inputs, targets = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 2))
    weight = layer.weight.val().inner().to_numpy()
    bias = layer.bias.val().inner().to_numpy()

    def loss(w):
        out = functional_call(layer, {"weight": w}, _e(inputs, device))
        return ((out - _e(targets, device)).tanh() ** 2).mean()

    module = torch.nn.Linear(3, 2).double()

    def loss_t(w):
        out = tf.functional_call(module, {"weight": w.T, "bias": _t(bias)}, (_t(inputs),))
        return ((out - _t(targets)).tanh() ** 2).mean()

    _close(hessian(loss)(_e(weight, device)), tf.hessian(loss_t)(_t(weight)))
    assert np.array_equal(layer.weight.val().inner().to_numpy(), weight)  # unchanged


def test_careless_calls_name_what_was_wrong(device):
    x = _e(A, device)
    with pytest.raises(ember.ShapeError, match=r"grad: the function must return a scalar .*\[3, 4\]"):
        grad(lambda x: x * 2.0)(x)
    with pytest.raises(ember.ArgumentError, match="argnums 2 is out of range for 1 argument"):
        grad(lambda x: x.sum(), 2)(x)
    with pytest.raises(ember.UnsupportedError, match=r"grad: argument 0 is on .* no autodiff"):
        grad(lambda x: x.sum())(Tensor.from_data(A, ember.device("ndarray")))
    with pytest.raises(ember.KindError, match="grad: argument 0 must be a Float tensor"):
        grad(lambda x: x.sum())(Tensor.from_data(np.arange(3), device))
    with pytest.raises(ember.ShapeError, match="jvp: tangent 0 has shape"):
        jvp(lambda x: x * 2.0, (x,), (_e(B, device),))
    with pytest.raises(ember.ShapeError, match="vjp: the cotangent has shape"):
        vjp(lambda x: x * 2.0, x)[1](_e(B, device))
    layer = nn.LinearConfig(3, 2).init(device)
    with pytest.raises(ember.ArgumentError, match="functional_call: no parameter at 'wieght'"):
        functional_call(layer, {"wieght": x}, x)
    with pytest.raises(ember.ShapeError, match="functional_call: 'weight' has shape"):
        functional_call(layer, {"weight": x}, x)
