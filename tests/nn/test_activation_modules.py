"""Activation layers: each against its torch.nn counterpart (forward, gradients), PRelu, errors."""

from __future__ import annotations

import inspect

import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError, ConfigError, KindError, ShapeError
from ember.module import Module
from ember.nn import activation as act
from ember.tensor import activation as functions


def quiet_softmax(x: torch.Tensor) -> torch.Tensor:
    # Softmax with one more logit fixed at zero, which is then dropped.
    padded = torch.cat([x, torch.zeros(*x.shape[:-1], 1)], dim=-1)
    return torch.softmax(padded, dim=-1)[..., :-1]


# (ember layer, torch reference)
CASES = {
    "relu": (act.Relu(), torch.nn.ReLU()),
    "relu6": (act.Relu6(), torch.nn.ReLU6()),
    "leaky_relu": (act.LeakyReluConfig(negative_slope=0.2).init(), torch.nn.LeakyReLU(0.2)),
    "sigmoid": (act.Sigmoid(), torch.nn.Sigmoid()),
    "log_sigmoid": (act.LogSigmoid(), torch.nn.LogSigmoid()),
    "hard_sigmoid-torch": (act.HardSigmoidConfig(alpha=1 / 6).init(), torch.nn.Hardsigmoid()),
    "hard_sigmoid-burn": (act.HardSigmoid(), lambda x: torch.clamp(0.2 * x + 0.5, 0, 1)),
    "silu": (act.Silu(), torch.nn.SiLU()),
    "hard_swish": (act.HardSwish(), torch.nn.Hardswish()),
    "mish": (act.Mish(), torch.nn.Mish()),
    "gelu": (act.GeluConfig().init(), torch.nn.GELU()),
    "gelu-tanh": (act.GeluConfig(approximate="tanh").init(), torch.nn.GELU("tanh")),
    "elu": (act.EluConfig(alpha=0.7).init(), torch.nn.ELU(0.7)),
    "celu": (act.CeluConfig(alpha=1.5).init(), torch.nn.CELU(1.5)),
    "selu": (act.Selu(), torch.nn.SELU()),
    "softplus": (act.SoftplusConfig(beta=2.0, threshold=3.0).init(), torch.nn.Softplus(2.0, 3.0)),
    "tanh": (act.Tanh(), torch.nn.Tanh()),
    "softmax": (act.SoftmaxConfig(dim=1).init(), torch.nn.Softmax(1)),
    "log_softmax": (act.LogSoftmaxConfig(dim=-1).init(), torch.nn.LogSoftmax(-1)),
    "softmin": (act.SoftminConfig(dim=0).init(), torch.nn.Softmin(0)),
    "quiet_softmax": (act.QuietSoftmaxConfig(dim=-1).init(), quiet_softmax),
    "glu": (act.GluConfig(dim=2).init(), torch.nn.GLU(2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_gradient_match_torch(ad_device, case):
    layer, reference = CASES[case]
    torch.manual_seed(0)
    x_ref = (torch.randn(2, 3, 4) * 3).requires_grad_(True)
    y_ref = reference(x_ref)
    upstream = torch.randn(y_ref.shape)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, ad_device).require_grad()
    y = layer(x)
    assert y.shape == tuple(y_ref.shape)
    assert_close(y, y_ref, atol=1e-5)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-5)


def test_every_activation_function_has_a_layer():
    names = {name for name, f in inspect.getmembers(functions, inspect.isfunction)
             if f.__module__ == functions.__name__ and not name.startswith("_")}  # fmt: skip
    covered = {name.split("-")[0] for name in CASES} | {"prelu"}
    assert names == covered
    for name in act.__all__:
        value = getattr(act, name)
        assert value.__doc__ and value.__doc__.strip(), name
        assert issubclass(value, Module) or issubclass(value, ember.Config), name
    assert act.Swish is act.Silu


def test_inference_matches_torch(base_device):
    x = torch.randn(3, 5)
    assert_close(act.Gelu()(from_torch(x, base_device)), torch.nn.GELU()(x), atol=1e-6)
    assert_close(act.Softmax(dim=0)(from_torch(x, base_device)), torch.softmax(x, 0), atol=1e-6)


def test_layers_hold_their_options_and_configs_build_them():
    assert act.LeakyRelu().negative_slope == 0.01  # Burn's and PyTorch's default
    assert act.LeakyReluConfig().init().negative_slope == 0.01
    assert (act.HardSigmoid().alpha, act.HardSigmoid().beta) == (0.2, 0.5)  # Burn's, not PyTorch's
    assert act.GluConfig().init().dim == -1
    softplus = act.SoftplusConfig(beta=3.0).init()
    assert isinstance(softplus, act.Softplus) and (softplus.beta, softplus.threshold) == (3.0, 20.0)
    assert act.Relu().num_params() == 0 and repr(act.Relu()) == "Relu {params: 0}"
    config = act.SoftmaxConfig(dim=2)
    assert act.SoftmaxConfig.load_json(config.to_json()) == config
    assert act.GeluConfig.from_dict({"approximate": "tanh"}).init().approximate == "tanh"


# ---------------------------------------------------------------------- PRelu
@pytest.mark.parametrize("num_parameters", [1, 3])
def test_prelu_matches_torch(ad_device, num_parameters):
    reference = torch.nn.PReLU(num_parameters, init=0.1)
    with torch.no_grad():
        reference.weight.copy_(torch.linspace(0.1, 0.3, num_parameters))
    layer = act.PReluConfig(num_parameters=num_parameters).init(ad_device)
    layer = layer.load_record(pytorch_record(reference))  # PyTorch's "weight" loads as alpha

    torch.manual_seed(0)
    x_ref = torch.randn(2, 3, 4, requires_grad=True)
    y_ref = reference(x_ref)
    upstream = torch.randn(y_ref.shape)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, ad_device).require_grad()
    y = layer(x)
    assert_close(y, y_ref)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad)
    assert_close(layer.alpha.val().grad(grads), reference.weight.grad, atol=1e-5)
    assert_close(layer.valid()(x.inner()), y_ref)


def test_prelu_config_defaults_follow_burn():
    config = act.PReluConfig()
    assert (config.num_parameters, config.alpha) == (1, 0.25)
    layer = act.PReluConfig(num_parameters=4, alpha=0.5).init(ember.device("ndarray"))
    assert layer.alpha.val().tolist() == [0.5] * 4 and layer.num_parameters == 4
    assert layer.num_params() == 4


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("layer", "x", "error", "message"),
    [
        (act.Relu(), Tensor.from_data([1, 2]), KindError, r"Relu: relu is not defined for Int tensors"),
        (act.Softmax(dim=2), Tensor.ones([2, 2]), ArgumentError,
         r"Softmax: softmax: dim 2 is out of range for a tensor of rank 2"),
        (act.Glu(dim=1), Tensor.ones([2, 3]), ShapeError,
         r"Glu: glu: dim 1 of shape \[2, 3\] must have an even size"),
        (act.PReluConfig(num_parameters=3).init(), Tensor.ones([2, 4]), ShapeError,
         r"PRelu: prelu: alpha of shape \[3\] must have 1 element or one per channel \(dim 1\) "
         r"of input \[2, 4\]"),
        (act.Gelu(approximate="fast"), Tensor.ones([2]), ArgumentError,
         r"Gelu: gelu: approximate must be 'none' or 'tanh', got 'fast'"),
    ],
)  # fmt: skip
def test_bad_inputs_raise_the_functions_error_with_the_layers_name(layer, x, error, message):
    with pytest.raises(error, match=message):
        layer(x)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: act.CeluConfig(alpha=0.0), r"CeluConfig.alpha: value error, must not be zero"),
        (lambda: act.SoftplusConfig(beta=0.0), r"SoftplusConfig.beta: expected greater than 0"),
        (lambda: act.GeluConfig(approximate="fast"),
         r"GeluConfig.approximate: expected 'none' or 'tanh'"),
        (lambda: act.SoftmaxConfig(), r"SoftmaxConfig.dim: missing required field"),
        (lambda: act.LeakyReluConfig(negative_slope="0.1"),
         r"LeakyReluConfig.negative_slope: expected a number"),
        (lambda: act.PReluConfig(num_parameters=0),
         r"PReluConfig.num_parameters: expected greater than or equal to 1"),
    ],
)  # fmt: skip
def test_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
