"""Conv1d / 2d / 3d: against torch.nn.Conv1d / 2d / 3d, padding modes, config checks."""

from __future__ import annotations

import math

import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record

import ember
from ember import Tensor
from ember.backend.errors import ConfigError, ShapeError
from ember.nn import Conv1d, Conv1dConfig, Conv2d, Conv2dConfig, Initializer, PaddingConfig
from ember.nn.conv import Conv3d, Conv3dConfig, PaddingConfig3d

Same, Valid, Explicit = PaddingConfig.Same, PaddingConfig.Valid, PaddingConfig.Explicit

# torch notes that its own even-kernel "same" convolution copies the input; so does ember.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")

# (ember padding, torch padding, kernel, stride, dilation, groups, bias)
CASES_1D = {
    "valid": (Valid(), 0, 3, 1, 1, 1, True),
    "explicit-stride": (Explicit(2), 2, 3, 2, 1, 1, True),
    "same-odd-dilated": (Same(), "same", 3, 1, 2, 1, False),
    "same-even": (Same(), "same", 4, 1, 1, 1, True),
    "groups": (Explicit(1), 1, 3, 1, 1, 2, True),
}
CASES_2D = {
    "valid": (Valid(), 0, (3, 3), (1, 1), (1, 1), 1, True),
    "explicit-per-dim": (Explicit(1, 2), (1, 2), (3, 2), (2, 1), (1, 1), 1, True),
    "same-mixed": (Same(), "same", (2, 3), (1, 1), (1, 2), 1, True),
    "same-even-dilated": (Same(), "same", (4, 2), (1, 1), (2, 3), 1, False),
    "depthwise": (Explicit(1), 1, (3, 3), (2, 2), (1, 1), 4, True),
}


def check_against_torch(layer, reference, x_ref, device):
    """Forward output and gradients of the input, the weight and the bias."""
    x_ref = x_ref.clone().requires_grad_(True)
    y_ref = reference(x_ref)
    upstream = torch.randn(y_ref.shape)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, device).require_grad()
    y = layer(x)
    assert y.shape == tuple(y_ref.shape)
    assert_close(y, y_ref, atol=1e-4)
    grads = (y * from_torch(upstream, device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-4)
    assert_close(layer.weight.val().grad(grads), reference.weight.grad, atol=1e-4)
    if reference.bias is not None:
        assert_close(layer.bias.val().grad(grads), reference.bias.grad, atol=1e-4)


@pytest.mark.parametrize("case", list(CASES_1D))
def test_conv1d_matches_torch(ad_device, case):
    padding, torch_padding, kernel, stride, dilation, groups, bias = CASES_1D[case]
    torch.manual_seed(0)
    reference = torch.nn.Conv1d(4, 6, kernel, stride, torch_padding, dilation, groups, bias)
    config = Conv1dConfig(4, 6, kernel, stride=stride, dilation=dilation, groups=groups,
                          padding=padding, bias=bias)  # fmt: skip
    layer = config.init(ad_device).load_record(pytorch_record(reference))
    check_against_torch(layer, reference, torch.randn(2, 4, 11), ad_device)


@pytest.mark.parametrize("case", list(CASES_2D))
def test_conv2d_matches_torch(ad_device, case):
    padding, torch_padding, kernel, stride, dilation, groups, bias = CASES_2D[case]
    torch.manual_seed(0)
    reference = torch.nn.Conv2d(4, 8, kernel, stride, torch_padding, dilation, groups, bias)
    config = Conv2dConfig([4, 8], kernel, stride=stride, dilation=dilation, groups=groups,
                          padding=padding, bias=bias)  # fmt: skip
    layer = config.init(ad_device).load_record(pytorch_record(reference))
    check_against_torch(layer, reference, torch.randn(2, 4, 9, 10), ad_device)


def test_inference_matches_torch(base_device):
    torch.manual_seed(1)
    reference = torch.nn.Conv2d(3, 5, 3, padding="same")
    layer = Conv2dConfig((3, 5), (3, 3), padding=Same()).init(base_device)
    layer = layer.load_record(pytorch_record(reference))
    x = torch.randn(2, 3, 6, 7)
    assert_close(layer(from_torch(x, base_device)), reference(x), atol=1e-5)


def test_same_padding_keeps_the_size_and_resolves_start_and_end():
    layer = Conv2dConfig([1, 1], [4, 3], dilation=[1, 2], padding=Same()).init()
    assert layer.padding == ((1, 2), (2, 2))
    assert layer(Tensor.ones([1, 1, 7, 8])).shape == (1, 1, 7, 8)
    assert Conv1dConfig(1, 1, 5, padding=Same()).init().padding == ((2, 2),)


def test_layout_and_properties():
    layer = Conv2dConfig([6, 4], [3, 2], groups=2).init()
    assert isinstance(layer, Conv2d)
    assert layer.weight.shape == (4, 3, 3, 2) and layer.bias.shape == (4,)
    assert (layer.channels_in, layer.channels_out, layer.kernel_size) == (6, 4, (3, 2))
    assert isinstance(Conv1dConfig(2, 3, 1).init(), Conv1d)
    assert Conv1dConfig(2, 3, 1, bias=False).init().bias is None


def test_default_initializer_bound_follows_fan_in_with_groups():
    ember.seed(ember.device("ndarray"), 3)
    layer = Conv2dConfig([8, 64], [3, 3], groups=2).init(ember.device("ndarray"))
    bound = 1 / math.sqrt(8 // 2 * 9)  # PyTorch's default bound
    for param in (layer.weight, layer.bias):
        values = param.val().to_numpy()
        assert values.min() >= -bound and values.max() < bound
    assert layer.weight.val().to_numpy().max() > 0.95 * bound


def test_initializer_gets_both_fans():
    # Xavier needs fan_out too: channels_out / groups * prod(kernel).
    config = Conv1dConfig(4, 6, 5, groups=2, initializer=Initializer.XavierUniform(1.0))
    ember.seed(ember.device("ndarray"), 0)
    values = config.init(ember.device("ndarray")).weight.val().to_numpy()
    bound = math.sqrt(6 / (2 * 5 + 3 * 5))
    assert values.min() >= -bound and values.max() < bound and values.max() > 0.9 * bound


def test_config_round_trips_through_json():
    config = Conv2dConfig([3, 8], [5, 5], stride=[2, 2], padding=Explicit(2, 1),
                          initializer=Initializer.KaimingNormal(2.0, fan_out_only=True))  # fmt: skip
    assert Conv2dConfig.load_json(config.to_json()) == config
    assert config.to_dict()["padding"] == {"Explicit": {"sizes": [2, 1]}}
    assert Conv1dConfig.from_dict(
        {"channels_in": 1, "channels_out": 1, "kernel_size": 3, "padding": "Same"}
    ).padding == Same()


def test_padding_aliases_and_equality():
    from ember.nn import PaddingConfig1d, PaddingConfig2d

    assert PaddingConfig1d is PaddingConfig2d is PaddingConfig
    assert Explicit(1) == Explicit(sizes=(1,)) and Same() != Valid()
    assert Explicit(1).with_sizes([1, 2]) == Explicit(1, 2)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Conv2dConfig([4, 6], [3, 3], groups=4).init(),
         r"Conv2dConfig.groups: 4 groups must divide both channels_in \(4\) and channels_out \(6\)"),
        (lambda: Conv1dConfig(3, 6, 3, groups=2).init(),
         r"Conv1dConfig.groups: 2 groups must divide both channels_in \(3\)"),
        (lambda: Conv2dConfig([1, 1], [3, 3], stride=[1, 2], padding=Same()).init(),
         r"Conv2dConfig.padding: Same padding needs stride 1, got stride \[1, 2\]"),
        (lambda: Conv2dConfig([1, 1], [3, 3], padding=Explicit(1, 1, 1)).init(),
         r"Conv2dConfig.padding: Explicit needs 1 or 2 sizes \(one per spatial dim\), got \[1, 1, 1\]"),
        (lambda: Conv1dConfig(1, 1, 3, padding=Explicit(1, 1)).init(),
         r"Conv1dConfig.padding: Explicit needs 1 size"),
        (lambda: Explicit(-1), r"Explicit.sizes\[0\]: expected greater than or equal to 0, got -1"),
        (lambda: Conv2dConfig([1, 1], [0, 3]),
         r"Conv2dConfig.kernel_size\[0\]: expected greater than or equal to 1, got 0"),
        (lambda: Conv2dConfig([1, 1], [3, 3, 3]), r"Conv2dConfig.kernel_size: "),
        (lambda: Conv1dConfig(1, 1, 3, padding=1), r"Conv1dConfig.padding: expected one of the "
         r"PaddingConfig variants Valid, Same, Explicit"),
        (lambda: PaddingConfig(), r"PaddingConfig is a family of configs; build one of: Valid"),
    ],
)  # fmt: skip
def test_config_errors(build, message):
    with pytest.raises(ConfigError, match=message) as info:
        build()
    if "groups" in message:
        assert info.value.fields[0].endswith(".groups")


@pytest.mark.parametrize(
    ("shape", "expected"),
    [([1, 3, 8], r"\[batch, 2 \(channels_in\), height, width\], got \[1, 3, 8\]"),
     ([1, 3, 8, 8], r".*, got \[1, 3, 8, 8\]")],
)  # fmt: skip
def test_input_of_the_wrong_shape_is_a_shape_error(shape, expected):
    layer = Conv2dConfig([2, 4], [3, 3], padding=Same()).init()
    with pytest.raises(ShapeError, match=r"Conv2d: expected an input of shape " + expected):
        layer(Tensor.ones(shape))


def test_input_smaller_than_the_kernel_is_a_shape_error():
    with pytest.raises(ShapeError, match="conv1d"):
        Conv1dConfig(1, 1, 5).init()(Tensor.ones([1, 1, 3]))


# ---------------------------------------------------------------------- Conv3d
CASES_3D = {
    "valid": (Valid(), 0, (2, 3, 2), (1, 1, 1), (1, 1, 1), 1, True),
    "explicit-strided-groups":
        (Explicit(1, 0, 1), (1, 0, 1), (3, 2, 3), (2, 1, 2), (1, 1, 1), 2, True),
    "same-even-dilated": (Same(), "same", (2, 3, 2), (1, 1, 1), (1, 2, 1), 1, False),
}


@pytest.mark.parametrize("case", list(CASES_3D))
def test_conv3d_matches_torch(ad_device, case):
    padding, torch_padding, kernel, stride, dilation, groups, bias = CASES_3D[case]
    torch.manual_seed(0)
    reference = torch.nn.Conv3d(4, 6, kernel, stride, torch_padding, dilation, groups, bias)
    config = Conv3dConfig([4, 6], kernel, stride=stride, dilation=dilation, groups=groups,
                          padding=padding, bias=bias)  # fmt: skip
    layer = config.init(ad_device).load_record(pytorch_record(reference))
    check_against_torch(layer, reference, torch.randn(2, 4, 5, 6, 5), ad_device)


def test_conv3d_inference_matches_torch(base_device):
    torch.manual_seed(2)
    reference = torch.nn.Conv3d(2, 3, (3, 1, 2))
    layer = Conv3dConfig([2, 3], [3, 1, 2]).init(base_device).load_record(pytorch_record(reference))
    x = torch.randn(1, 2, 4, 3, 5)
    assert_close(layer(from_torch(x, base_device)), reference(x), atol=1e-5)


def test_conv3d_layout_defaults_and_json():
    assert PaddingConfig3d is PaddingConfig
    config = Conv3dConfig([6, 4], [3, 2, 1], groups=2)
    assert (config.stride, config.dilation, config.padding) == ((1, 1, 1), (1, 1, 1), Valid())
    assert config.bias
    layer = config.init()
    assert isinstance(layer, Conv3d)
    assert layer.weight.shape == (4, 3, 3, 2, 1) and layer.bias.shape == (4,)
    assert (layer.channels_in, layer.channels_out, layer.kernel_size) == (6, 4, (3, 2, 1))
    again = Conv3dConfig.load_json(config.with_padding(Explicit(1, 2, 0)).to_json())
    assert again.padding == Explicit(1, 2, 0) and again.kernel_size == (3, 2, 1)


def test_conv3d_default_initializer_bound():
    ember.seed(ember.device("ndarray"), 4)
    layer = Conv3dConfig([4, 32], [2, 2, 2], groups=2).init(ember.device("ndarray"))
    bound = 1 / math.sqrt(4 // 2 * 8)  # PyTorch's default bound
    values = layer.weight.val().to_numpy()
    assert values.min() >= -bound and values.max() < bound and values.max() > 0.9 * bound


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Conv3dConfig([4, 6], [3, 3, 3], groups=4).init(),
         r"Conv3dConfig.groups: 4 groups must divide both channels_in \(4\) and channels_out \(6\)"),
        (lambda: Conv3dConfig([1, 1], [3, 3, 3], padding=Explicit(1, 1)).init(),
         r"Conv3dConfig.padding: Explicit needs 1 or 3 sizes \(one per spatial dim\), got \[1, 1\]"),
        (lambda: Conv3dConfig([1, 1], [3, 3]),
         r"Conv3dConfig.kernel_size\[2\]: missing required field"),
        (lambda: Conv3dConfig([1, 1], [3, 3, 3], stride=[1, 0, 1]),
         r"Conv3dConfig.stride\[1\]: expected greater than or equal to 1, got 0"),
    ],
)  # fmt: skip
def test_conv3d_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_conv3d_input_of_the_wrong_shape_is_a_shape_error():
    layer = Conv3dConfig([2, 4], [1, 1, 1]).init()
    expected = r"Conv3d: expected an input of shape \[batch, 2 \(channels_in\), depth, height, width\]"
    with pytest.raises(ShapeError, match=expected + r", got \[1, 2, 3, 3\]"):
        layer(Tensor.ones([1, 2, 3, 3]))
    with pytest.raises(ShapeError, match=expected + r", got \[1, 3, 3, 3, 3\]"):
        layer(Tensor.ones([1, 3, 3, 3, 3]))
