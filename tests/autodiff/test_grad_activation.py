"""Gradients of every function of ``ember.activation`` against PyTorch autograd and finite differences.

Inputs include the points where PyTorch's gradient convention matters (the
kinks 0, -3, 3, 6, the softplus threshold) and large magnitudes where a naive
formula overflows; finite differences use float64 points away from the kinks.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gradcheck import (
    TOLERANCE,
    check_against_torch,
    check_finite_differences,
    ember_grads,
    torch_grads,
)

import ember
from ember import DType, Tensor, TensorData
from ember import activation as A
from ember.backend import NdArray
from ember.backend.ops import OPS
from ember.backends.autodiff import Autodiff
from ember.backends.autodiff.rule import RULES

DTYPES = [DType.F64, DType.F32]


def _quiet_softmax_torch(x, dim):
    # softmax with an extra logit fixed at zero, computed by torch's own softmax.
    if x.dim() == 0:
        return _quiet_softmax_torch(x.reshape(1), 0).reshape(())
    pad_shape = list(x.shape)
    pad_shape[dim] = 1
    full = torch.cat([x, torch.zeros(pad_shape, dtype=x.dtype)], dim)
    return F.softmax(full, dim).narrow(dim, 0, x.shape[dim])


# id -> (ember function, torch function); one input tensor each. An id is the function's name,
# with its arguments in brackets when not the defaults.
ELEMENTWISE = {
    "relu": (A.relu, F.relu),
    "relu6": (A.relu6, F.relu6),
    "leaky_relu": (A.leaky_relu, F.leaky_relu),
    "leaky_relu[0.2]": (lambda x: A.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2)),
    "leaky_relu[-0.5]": (lambda x: A.leaky_relu(x, -0.5), lambda x: F.leaky_relu(x, -0.5)),
    "sigmoid": (A.sigmoid, torch.sigmoid),
    "log_sigmoid": (A.log_sigmoid, F.logsigmoid),
    "hard_sigmoid": (A.hard_sigmoid, F.hardsigmoid),
    "silu": (A.silu, F.silu),
    "hard_swish": (A.hard_swish, F.hardswish),
    "mish": (A.mish, F.mish),
    "gelu": (A.gelu, F.gelu),
    "gelu_tanh": (lambda x: A.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "elu": (A.elu, F.elu),
    "elu[0.5]": (lambda x: A.elu(x, 0.5), lambda x: F.elu(x, 0.5)),
    # alphas whose inverse is exact in float32: torch's celu scales by 1/alpha in float32
    "celu[0.5]": (lambda x: A.celu(x, 0.5), lambda x: F.celu(x, 0.5)),
    "celu[2]": (lambda x: A.celu(x, 2.0), lambda x: F.celu(x, 2.0)),
    "selu": (A.selu, F.selu),
    "softplus": (A.softplus, F.softplus),
    "softplus[2,5]": (lambda x: A.softplus(x, 2.0, 5.0), lambda x: F.softplus(x, 2.0, 5.0)),
    "softplus[0.5,3]": (lambda x: A.softplus(x, 0.5, 3.0), lambda x: F.softplus(x, 0.5, 3.0)),
    "tanh": (A.tanh, torch.tanh),
}

# name -> (ember function, torch function) of (x, dim).
ALONG_DIM = {
    "softmax": (A.softmax, lambda x, d: F.softmax(x, d)),
    "log_softmax": (A.log_softmax, lambda x, d: F.log_softmax(x, d)),
    "softmin": (A.softmin, lambda x, d: F.softmin(x, d)),
    "quiet_softmax": (A.quiet_softmax, _quiet_softmax_torch),
    "glu": (A.glu, lambda x, d: F.glu(x, d)),
}

# torch's hardsigmoid backward multiplies by 1/6 rounded to float32, even in float64.
F64_RTOL = {"hard_sigmoid": 1e-7}

# Every kink and branch point of the functions above (softplus: beta * x == threshold), and
# magnitudes where exp overflows in float32 (> 88) and float64 (> 709).
KINKS = [-1000.0, -100.0, -20.0, -6.0, -3.0, -2.5, -1.0, -0.0, 0.0, 1.0, 2.5, 3.0, 6.0, 20.0, 100.0, 1000.0]
# Away from every kink by more than 0.1: for finite differences.
SMOOTH = [-4.7, -2.2, -0.7, 0.4, 1.3, 2.2, 3.6, 4.4, 7.1, -1.6, 5.3, 2.8]


def _kink_input() -> np.ndarray:
    extra = np.random.default_rng(0).uniform(-8.0, 8.0, size=4)
    return np.concatenate([KINKS, extra]).reshape(4, 5)


def _rows() -> np.ndarray:
    """Rows for the normalizers: random, ties, huge ties, all very negative, mixed extremes."""
    rng = np.random.default_rng(1)
    return np.array([
        rng.uniform(-3.0, 3.0, 6),
        [2.0, 2.0, 2.0, -1.0, 2.0, 0.0],
        [1000.0, 1000.0, -1000.0, 0.0, 3.0, 1000.0],
        [-2000.0, -2001.0, -2000.0, -2500.0, -1999.5, -2003.0],
        [-1000.0, 0.0, 1000.0, 0.0, -3.0, 6.0],
        rng.uniform(-3.0, 3.0, 6),
    ])  # fmt: skip


def _tol(name: str, dtype: DType) -> tuple[float, float]:
    rtol, atol = TOLERANCE[dtype]
    if dtype is DType.F64 and name in F64_RTOL:
        rtol = F64_RTOL[name]
    return rtol, atol


def _assert_close(ember_fn, torch_fn, inputs, device, dtype, name):
    rtol, atol = _tol(name, dtype)
    ours = ember_grads(ember_fn, inputs, device, dtype)
    theirs = torch_grads(torch_fn, inputs, dtype)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a is not None, f"{name}: no gradient for input {i}"
        assert a.dtype is dtype
        got = a.into_data().to_numpy().astype(np.float64)
        assert not np.isnan(got).any() or np.isnan(b.detach().double().numpy()).any(), f"{name}: NaN gradient"
        a.into_data().assert_approx_eq(TensorData(b.detach().numpy()), rtol=rtol, atol=atol)


# ------------------------------------------------------------------ coverage
def test_every_activation_is_covered():
    public = {
        name for name, fn in vars(A).items()
        if inspect.isfunction(fn) and fn.__module__ == A.__name__ and not name.startswith("_")
    }  # fmt: skip
    covered = {name.split("[")[0] for name in ELEMENTWISE}
    covered |= set(ALONG_DIM) | {"prelu"}
    assert public <= covered, f"activations without a gradient test: {sorted(public - covered)}"


FUSED = ["relu", "relu6", "leaky_relu", "prelu", "sigmoid", "log_sigmoid", "hard_sigmoid", "hard_swish",
         "silu", "gelu", "gelu_tanh", "elu", "celu", "softplus", "softmax", "log_softmax", "quiet_softmax"]  # fmt: skip


@pytest.mark.parametrize("name", FUSED)
def test_fused_activations_have_a_rule_and_run_as_one_inner_op(name):
    assert name in RULES
    assert Autodiff.forward_composite(OPS[name])


def test_a_fused_activation_records_one_node(device):
    x = Tensor.from_data([[-1.0, 0.0, 2.0]], device).require_grad()
    assert A.gelu(x)._prim.node.op == "gelu"
    assert A.softmax(x, 1)._prim.node.op == "softmax"
    assert A.selu(x)._prim.node.op == "mul_scalar"  # decomposed: scale * elu(x)


# ------------------------------------------------------------------ against torch autograd
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_activation_vs_torch_at_kinks_and_extremes(device, name, dtype):
    ember_fn, torch_fn = ELEMENTWISE[name]
    _assert_close(ember_fn, torch_fn, [_kink_input()], device, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_activation_vs_torch_non_contiguous(device, name, dtype):
    # A permuted view and a strided slice reach the rule as non-contiguous primitives.
    ember_fn, torch_fn = ELEMENTWISE[name]
    x = np.random.default_rng(2).uniform(-5.0, 5.0, size=(3, 4, 6))
    x[0, 0, :4] = [0.0, 3.0, -3.0, 6.0]
    _assert_close(lambda t: ember_fn(t.permute(2, 0, 1)[:, :, ::2]),
                  lambda t: torch_fn(t.permute(2, 0, 1)[:, :, ::2]), [x], device, dtype, name)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", list(ALONG_DIM))
def test_activation_along_dim_vs_torch(device, name, dim, dtype):
    ember_fn, torch_fn = ALONG_DIM[name]
    x = _rows()
    if dim == 0:
        x = x.T.copy()  # the extreme rows become columns
    _assert_close(lambda t: ember_fn(t, dim), lambda t: torch_fn(t, dim), [x], device, dtype, name)


@pytest.mark.parametrize("name", list(ALONG_DIM))
def test_activation_along_dim_of_a_permuted_3d_input(device, name):
    ember_fn, torch_fn = ALONG_DIM[name]
    x = np.random.default_rng(3).normal(size=(4, 2, 6))
    _assert_close(lambda t: ember_fn(t.permute(1, 2, 0), 1), lambda t: torch_fn(t.permute(1, 2, 0), 1),
                  [x], device, DType.F64, name)  # fmt: skip


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin", "quiet_softmax"])
def test_normalizer_of_a_0d_tensor(device, name):
    ember_fn, torch_fn = ALONG_DIM[name]
    check_against_torch(lambda t: ember_fn(t, 0), lambda t: torch_fn(t, 0), [np.array(0.7)], device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("alpha_shape", [(), (1,), (3,)], ids=str)
def test_prelu_vs_torch(device, alpha_shape, dtype):
    x = np.random.default_rng(4).uniform(-2.0, 2.0, size=(2, 3, 4))
    x[0, :, 0] = 0.0  # the kink: torch takes the slope there
    x[1, 1, :2] = [-1000.0, 1000.0]
    alpha = np.linspace(0.1, 0.3, max(1, int(np.prod(alpha_shape)))).reshape(alpha_shape)
    _assert_close(A.prelu, F.prelu, [x, alpha], device, dtype, "prelu")


def test_prelu_of_a_1d_input(device):
    x = np.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    check_against_torch(A.prelu, F.prelu, [x, np.array([0.2])], device)


def test_the_quiet_softmax_of_a_very_negative_row_has_no_nan(device):
    x = Tensor.from_data([[-3.0e4, -3.0e4 - 1.0]], device).require_grad()
    g = x.grad((A.quiet_softmax(x, 1) * 3.0).sum().backward())
    assert g.tolist() == [[0.0, 0.0]]


def test_elu_of_huge_inputs_has_no_nan(device):
    x = Tensor.from_data([1.0e4, -1.0e4], device).require_grad()
    grads = (A.elu(x) + A.celu(x, 2.0)).sum().backward()
    assert x.grad(grads).tolist() == [2.0, 0.0]


# ------------------------------------------------------------------ finite differences
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_activation_finite_differences(device, name):
    check_finite_differences(ELEMENTWISE[name][0], [np.array(SMOOTH).reshape(3, 4)], device)


@pytest.mark.parametrize("name", list(ALONG_DIM))
def test_activation_along_dim_finite_differences(device, name):
    x = np.random.default_rng(5).uniform(-2.0, 2.0, size=(2, 4))
    check_finite_differences(lambda t: ALONG_DIM[name][0](t, 1), [x], device)
    check_finite_differences(lambda t: ALONG_DIM[name][0](t, 0), [x], device)


@pytest.mark.parametrize("alpha_shape", [(), (3,)], ids=str)
def test_prelu_finite_differences(device, alpha_shape):
    x = np.array(SMOOTH).reshape(2, 3, 2)
    alpha = np.linspace(0.1, 0.3, max(1, int(np.prod(alpha_shape)))).reshape(alpha_shape)
    check_finite_differences(A.prelu, [x, alpha], device)


# ------------------------------------------------------------------ composition and checkpointing
def test_chain_of_activations_vs_torch(device):
    def ember_fn(x):
        h = A.gelu(A.softplus(x, 2.0, 5.0)) - A.relu6(x * 2.0)
        return A.log_softmax(A.hard_swish(h) + A.sigmoid(x), 1)

    def torch_fn(x):
        h = F.gelu(F.softplus(x, 2.0, 5.0)) - F.relu6(x * 2.0)
        return F.log_softmax(F.hardswish(h) + torch.sigmoid(x), 1)

    x = np.random.default_rng(6).uniform(-4.0, 4.0, size=(3, 5))
    check_against_torch(ember_fn, torch_fn, [x], device)
    check_finite_differences(ember_fn, [x], device)


def test_fused_activations_under_balanced_checkpointing():
    plain = Autodiff(NdArray()).default_device()
    ckpt = Autodiff(NdArray(), checkpointing="balanced").default_device()

    def fn(x, a):
        h = A.prelu(A.silu(x) - 0.3, a)
        return A.softmax(A.leaky_relu(h, 0.1) * A.elu(x, 0.5), 1) + A.celu(A.hard_sigmoid(x), 2.0)

    x = np.random.default_rng(7).uniform(-4.0, 4.0, size=(2, 3, 4))
    a = np.array([0.1, 0.2, 0.3])
    expected = ember_grads(fn, [x, a], plain)
    got = ember_grads(fn, [x, a], ckpt)
    for e, g in zip(expected, got):
        g.into_data().assert_approx_eq(e.into_data(), rtol=1e-12, atol=1e-14)


def test_activation_gradient_of_an_untracked_input_is_none(device):
    x = Tensor.from_data([1.0, -1.0], device).require_grad()
    c = Tensor.from_data([0.25], device)
    grads = A.prelu(x.reshape([1, 2]), c).sum().backward()
    assert c.grad(grads) is None
    assert x.grad(grads).tolist() == [1.0, 0.25]


def test_integer_inputs_are_rejected(device):
    with pytest.raises(ember.KindError):
        A.relu(Tensor.arange(3, device=device))
