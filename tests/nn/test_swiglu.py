"""SwiGlu: against the same computation in PyTorch (two nn.Linear and F.silu), config, errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF
from nn_helpers import assert_close, from_torch, pytorch_record

import ember
from ember import Tensor
from ember.backend.errors import ConfigError, ShapeError
from ember.nn.initializer import Initializer
from ember.nn.linear import Linear
from ember.nn.swiglu import SwiGlu, SwiGluConfig


class TorchSwiGlu(torch.nn.Module):
    def __init__(self, d_input: int, d_output: int, bias: bool):
        super().__init__()
        self.linear_inner = torch.nn.Linear(d_input, d_output, bias=bias)
        self.linear_outer = torch.nn.Linear(d_input, d_output, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return TF.silu(self.linear_inner(x)) * self.linear_outer(x)


@pytest.mark.parametrize("bias", [False, True])
def test_forward_and_gradients_match_torch(ad_device, bias):
    torch.manual_seed(0)
    reference = TorchSwiGlu(4, 6, bias)
    layer = SwiGluConfig(4, 6, bias=bias).init(ad_device).load_record(pytorch_record(reference))

    x_ref = torch.randn(2, 3, 4, requires_grad=True)
    y_ref = reference(x_ref)
    upstream = torch.randn(y_ref.shape)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, ad_device).require_grad()
    y = layer(x)
    assert y.shape == (2, 3, 6)
    assert_close(y, y_ref)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad)
    for name in ("linear_inner", "linear_outer"):
        ours, theirs = getattr(layer, name), getattr(reference, name)
        assert_close(ours.weight.val().grad(grads), theirs.weight.grad.T)  # ember: [in, out]
        if bias:
            assert_close(ours.bias.val().grad(grads), theirs.bias.grad)


def test_inference_matches_torch(base_device):
    torch.manual_seed(1)
    reference = TorchSwiGlu(3, 2, False)
    layer = SwiGluConfig(3, 2).init(base_device).load_record(pytorch_record(reference))
    x = torch.randn(5, 3)
    assert_close(layer(from_torch(x, base_device)), reference(x))


def test_defaults_follow_burn_and_build_two_linears():
    config = SwiGluConfig(8, 16)
    assert config.bias is False
    assert config.initializer == Initializer.KaimingUniform(gain=1 / math.sqrt(3))
    device = ember.device("ndarray")
    ember.seed(device, 0)
    layer = config.init(device)
    assert isinstance(layer, SwiGlu)
    assert isinstance(layer.linear_inner, Linear) and isinstance(layer.linear_outer, Linear)
    assert layer.linear_inner.weight.shape == (8, 16) and layer.linear_outer.bias is None
    assert layer.num_params() == 2 * 8 * 16
    inner = layer.linear_inner.weight.val().to_numpy()
    outer = layer.linear_outer.weight.val().to_numpy()
    assert (inner != outer).any()  # two independent draws
    assert abs(inner).max() < 1 / math.sqrt(8)
    assert SwiGluConfig.load_json(config.with_bias(True).to_json()) == config.with_bias(True)


def test_config_errors():
    with pytest.raises(ConfigError, match=r"SwiGluConfig.d_output: expected greater than or equal to 1"):
        SwiGluConfig(4, 0)
    with pytest.raises(ConfigError, match=r"SwiGluConfig.bias: expected a boolean"):
        SwiGluConfig(4, 2, bias=1)


@pytest.mark.parametrize("shape", [[2, 5], [3]])
def test_input_of_the_wrong_size_is_a_shape_error(shape):
    layer = SwiGluConfig(4, 3).init()
    with pytest.raises(ShapeError, match=r"SwiGlu: expected an input of shape \[\.\.\., 4\] \(d_input\), "
                                         rf"got \[{', '.join(map(str, shape))}\]"):  # fmt: skip
        layer(Tensor.ones(shape))
