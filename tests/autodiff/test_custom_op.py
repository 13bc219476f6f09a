"""The custom-op example: fused kernels and a backward rule equal the reference implementation."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gradcheck import check_against_torch

import ember
from ember import Tensor, activation
from ember.backend import AVal, custom_op
from ember.backends.autodiff import Autodiff
from ember.backends.trace import Trace


def _load_example():
    name = "ember_example_custom_op"
    if name not in sys.modules:  # the op registers itself once per process
        path = Path(__file__).parents[2] / "examples" / "custom_op.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


fused = _load_example().fused_matmul_add_relu
SHAPES = [((3, 4), (4, 5), (5,)), ((2, 3, 4), (4, 5), (3, 5)), ((2, 1, 3, 4), (2, 4, 5), (1,))]


def _inputs(shapes):
    rng = np.random.default_rng(3)
    return [rng.normal(size=s) for s in shapes]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("name", ["ndarray", "torch"])
def test_kernels_match_the_reference(name, shapes):
    device = ember.device(name)
    lhs, rhs, bias = (Tensor.from_data(a, device) for a in _inputs(shapes))
    expected = activation.relu(lhs.matmul(rhs) + bias)
    fused(lhs, rhs, bias).into_data().assert_approx_eq(expected.into_data(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_gradients_match_torch_autograd(device, shapes):
    def reference(a, b, c):
        return torch.relu(a @ b + c)

    check_against_torch(fused, reference, _inputs(shapes), device)


def test_autodiff_runs_the_fused_kernel_as_one_op():
    seen = []
    device = ember.device("ndarray").wrap(lambda b: Autodiff(Trace(b, seen.append)))
    lhs, rhs, bias = (Tensor.from_data(a, device).require_grad() for a in _inputs(SHAPES[0]))
    seen.clear()
    fused(lhs, rhs, bias).sum().backward()
    forward_ops = [r.op for r in seen]
    assert forward_ops.count("fused_matmul_add_relu") == 1
    assert "relu" not in forward_ops  # the reference did not run


cube = custom_op("test_cube", ("tensor",), lambda op, x: AVal(x.shape, x.dtype),
                 lambda B, x: B.float_mul(B.float_mul(x, x), x))  # fmt: skip


def test_a_custom_op_without_a_rule_differentiates_through_its_reference(device):
    x = Tensor.from_data([1.0, -2.0], device).require_grad()
    assert x.grad(cube(x).sum().backward()).tolist() == [3.0, 12.0]


def test_bad_calls_name_the_op():
    with pytest.raises(ember.ArgumentError, match="fused_matmul_add_relu: expected 3 tensors"):
        fused(Tensor.ones([2, 2]))
    with pytest.raises(ember.KindError, match="fused_matmul_add_relu: needs Float tensors"):
        fused(Tensor.ones([2, 2], kind=ember.Int), Tensor.ones([2, 2]), Tensor.ones([2]))
    with pytest.raises(ember.ShapeError, match="inner dims differ"):
        fused(Tensor.ones([2, 3]), Tensor.ones([2, 2]), Tensor.ones([2]))
    with pytest.raises(ember.ArgumentError, match="already exists"):
        custom_op("fused_matmul_add_relu", ("tensor",), None, None)
