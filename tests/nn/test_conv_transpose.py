"""ConvTranspose1d / 2d / 3d: against torch.nn.ConvTranspose*d, init bounds, config checks."""

from __future__ import annotations

import math

import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record

import ember
from ember import Tensor
from ember.backend.errors import ConfigError, ShapeError
from ember.nn.conv_transpose import (
    ConvTranspose1d,
    ConvTranspose1dConfig,
    ConvTranspose2d,
    ConvTranspose2dConfig,
    ConvTranspose3d,
    ConvTranspose3dConfig,
)
from ember.nn.initializer import Initializer

# (n, kernel, stride, padding, padding_out, dilation, groups, bias)
CASES = {
    "1d-plain": (1, 3, 1, 0, 0, 1, 1, True),
    "1d-strided-out": (1, 4, 3, 1, 2, 1, 2, False),
    "2d-strided": (2, (3, 2), (2, 2), (1, 0), (1, 1), (1, 1), 1, True),
    "2d-dilated-groups": (2, (2, 3), (1, 2), (0, 1), (0, 1), (2, 1), 2, True),
    "3d": (3, (2, 3, 2), (2, 1, 1), (0, 1, 0), (1, 0, 0), (1, 1, 2), 2, True),
}
CONFIGS = {1: ConvTranspose1dConfig, 2: ConvTranspose2dConfig, 3: ConvTranspose3dConfig}
TORCH = {1: torch.nn.ConvTranspose1d, 2: torch.nn.ConvTranspose2d, 3: torch.nn.ConvTranspose3d}
SPATIAL = {1: (7,), 2: (5, 6), 3: (3, 4, 3)}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_gradients_match_torch(ad_device, case):
    n, kernel, stride, padding, padding_out, dilation, groups, bias = CASES[case]
    torch.manual_seed(0)
    reference = TORCH[n](4, 6, kernel, stride, padding, padding_out, groups, bias, dilation)
    config = CONFIGS[n]([4, 6], kernel, stride=stride, dilation=dilation, groups=groups,
                        padding=padding, padding_out=padding_out, bias=bias)  # fmt: skip
    layer = config.init(ad_device).load_record(pytorch_record(reference))

    x_ref = torch.randn(2, 4, *SPATIAL[n], requires_grad=True)
    y_ref = reference(x_ref)
    upstream = torch.randn(y_ref.shape)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, ad_device).require_grad()
    y = layer(x)
    assert y.shape == tuple(y_ref.shape)
    assert_close(y, y_ref, atol=1e-4)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-4)
    assert_close(layer.weight.val().grad(grads), reference.weight.grad, atol=1e-4)
    if bias:
        assert_close(layer.bias.val().grad(grads), reference.bias.grad, atol=1e-4)


def test_inference_matches_torch(base_device):
    torch.manual_seed(1)
    reference = torch.nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1)
    layer = ConvTranspose2dConfig([3, 2], [4, 4], stride=[2, 2], padding=[1, 1]).init(base_device)
    layer = layer.load_record(pytorch_record(reference))
    x = torch.randn(2, 3, 5, 4)
    assert_close(layer(from_torch(x, base_device)), reference(x), atol=1e-5)


def test_layout_defaults_and_properties():
    config = ConvTranspose2dConfig([6, 4], [3, 2], groups=2)
    assert (config.stride, config.dilation, config.padding, config.padding_out) == (
        (1, 1), (1, 1), (0, 0), (0, 0)
    )  # fmt: skip
    assert config.bias and config.initializer == Initializer.KaimingUniform(gain=1 / math.sqrt(3))
    layer = config.init()
    assert isinstance(layer, ConvTranspose2d)
    assert layer.weight.shape == (6, 2, 3, 2) and layer.bias.shape == (4,)
    assert (layer.channels_in, layer.channels_out, layer.kernel_size) == (6, 4, (3, 2))
    assert isinstance(ConvTranspose1dConfig([2, 3], 1).init(), ConvTranspose1d)
    assert isinstance(ConvTranspose3dConfig([2, 3], [1, 1, 1]).init(), ConvTranspose3d)
    assert ConvTranspose1dConfig([2, 3], 1, bias=False).init().bias is None


def test_default_initializer_bounds_are_pytorchs():
    # PyTorch: weight [in, out / groups, *k], fan_in = out / groups * prod(k), for weight and bias.
    device = ember.device("ndarray")
    ember.seed(device, 5)
    layer = ConvTranspose2dConfig([64, 6], [3, 3], groups=2).init(device)
    bound = 1 / math.sqrt(6 // 2 * 9)
    for param in (layer.weight, layer.bias):
        values = param.val().to_numpy()
        assert values.min() >= -bound and values.max() < bound
    assert layer.weight.val().to_numpy().max() > 0.95 * bound
    torch_bound = 1 / math.sqrt(torch.nn.init._calculate_fan_in_and_fan_out(
        torch.nn.ConvTranspose2d(64, 6, 3, groups=2).weight)[0])  # fmt: skip
    assert math.isclose(bound, torch_bound)


def test_xavier_gets_both_fans():
    config = ConvTranspose1dConfig([8, 4], 3, groups=2, initializer=Initializer.XavierUniform(1.0))
    ember.seed(ember.device("ndarray"), 0)
    values = config.init(ember.device("ndarray")).weight.val().to_numpy()
    bound = math.sqrt(6 / (4 // 2 * 3 + 8 // 2 * 3))
    assert values.min() >= -bound and values.max() < bound and values.max() > 0.9 * bound


def test_config_round_trips_through_json():
    config = ConvTranspose3dConfig([2, 4], [3, 3, 1], stride=[2, 2, 1], padding_out=[1, 0, 0])
    assert ConvTranspose3dConfig.load_json(config.to_json()) == config
    assert config.to_dict()["padding_out"] == [1, 0, 0]
    assert ConvTranspose1dConfig.from_dict({"channels": [1, 2], "kernel_size": 3}).padding == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ConvTranspose2dConfig([4, 6], [3, 3], groups=4).init(),
         r"ConvTranspose2dConfig.groups: 4 groups must divide both channels_in \(4\) "
         r"and channels_out \(6\)"),
        (lambda: ConvTranspose1dConfig([2, 2], 3, stride=2, padding_out=2).init(),
         r"ConvTranspose1dConfig.padding_out: each size must be smaller than the stride or the "
         r"dilation of its dim, got padding_out \[2\] with stride \[2\] and dilation \[1\]"),
        (lambda: ConvTranspose2dConfig([2, 2], [3, 3], padding_out=[0, 1]).init(),
         r"ConvTranspose2dConfig.padding_out: .* got padding_out \[0, 1\]"),
        (lambda: ConvTranspose2dConfig([2, 2], [3, 3], padding=[-1, 0]),
         r"ConvTranspose2dConfig.padding\[0\]: expected greater than or equal to 0, got -1"),
        (lambda: ConvTranspose3dConfig([2, 2], [3, 3]),
         r"ConvTranspose3dConfig.kernel_size\[2\]: missing required field"),
        (lambda: ConvTranspose1dConfig([2, 0], 3),
         r"ConvTranspose1dConfig.channels\[1\]: expected greater than or equal to 1, got 0"),
    ],
)  # fmt: skip
def test_config_errors(build, message):
    with pytest.raises(ConfigError, match=message) as info:
        build()
    if "groups:" in message:
        assert info.value.fields == ("ConvTranspose2dConfig.groups",)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [([1, 2, 5], r"\[batch, 2 \(channels_in\), height, width\], got \[1, 2, 5\]"),
     ([1, 3, 5, 5], r".*, got \[1, 3, 5, 5\]")],
)  # fmt: skip
def test_input_of_the_wrong_shape_is_a_shape_error(shape, expected):
    layer = ConvTranspose2dConfig([2, 4], [3, 3]).init()
    with pytest.raises(ShapeError, match=r"ConvTranspose2d: expected an input of shape " + expected):
        layer(Tensor.ones(shape))


def test_padding_that_empties_the_output_is_a_shape_error():
    layer = ConvTranspose1dConfig([1, 1], 1, padding=2).init()
    with pytest.raises(ShapeError, match=r"conv_transpose1d: output size \[-3\] is not positive"):
        layer(Tensor.ones([1, 1, 1]))
