"""AvgPool / MaxPool / AdaptiveAvgPool 1d and 2d: against torch.nn, padding modes, config checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from nn_helpers import assert_close, from_torch

from ember import Tensor
from ember.backend.errors import ConfigError, ShapeError
from ember.nn.conv import PaddingConfig
from ember.nn.pool import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool1dConfig,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool2dConfig,
    AvgPool1d,
    AvgPool1dConfig,
    AvgPool2d,
    AvgPool2dConfig,
    MaxPool1d,
    MaxPool1dConfig,
    MaxPool2d,
    MaxPool2dConfig,
)

Same, Valid, Explicit = PaddingConfig.Same, PaddingConfig.Valid, PaddingConfig.Explicit


def check_against_torch(layer, reference, x_ref, device):
    """Forward output and the input's gradient (pools have no parameters)."""
    x_ref = x_ref.clone().requires_grad_(True)
    y_ref = reference(x_ref)
    upstream = torch.randn(y_ref.shape)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, device).require_grad()
    y = layer(x)
    assert y.shape == tuple(y_ref.shape)
    assert_close(y, y_ref)
    grads = (y * from_torch(upstream, device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad)


# (ember config, torch module)
CASES = {
    "avg1d-default": (AvgPool1dConfig(3), torch.nn.AvgPool1d(3)),
    "avg1d-pad-exclude-ceil": (
        AvgPool1dConfig(3, stride=2, padding=Explicit(1), count_include_pad=False, ceil_mode=True),
        torch.nn.AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False),
    ),
    "avg2d-pad-include": (
        AvgPool2dConfig([3, 2], stride=[1, 2], padding=Explicit(1, 1)),
        torch.nn.AvgPool2d((3, 2), (1, 2), (1, 1)),
    ),
    "avg2d-same-odd": (
        AvgPool2dConfig([3, 3], stride=[1, 1], padding=Same(), count_include_pad=False),
        torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False),
    ),
    "max1d-dilated": (
        MaxPool1dConfig(2, stride=1, dilation=2, padding=Explicit(1)),
        torch.nn.MaxPool1d(2, 1, 1, dilation=2),
    ),
    "max2d-default": (MaxPool2dConfig([2, 2]), torch.nn.MaxPool2d(2)),
    "max2d-pad-ceil": (
        MaxPool2dConfig([3, 3], stride=[2, 2], padding=Explicit(1), ceil_mode=True),
        torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True),
    ),
    "max2d-same-odd-dilated": (
        MaxPool2dConfig([3, 1], stride=[1, 1], dilation=[1, 2], padding=Same()),
        torch.nn.MaxPool2d((3, 1), 1, (1, 0), dilation=(1, 2)),
    ),
    "adaptive1d": (AdaptiveAvgPool1dConfig(3), torch.nn.AdaptiveAvgPool1d(3)),
    "adaptive2d": (AdaptiveAvgPool2dConfig([3, 4]), torch.nn.AdaptiveAvgPool2d((3, 4))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_gradients_match_torch(ad_device, case):
    config, reference = CASES[case]
    torch.manual_seed(0)
    spatial = (7,) if "1d" in case else (7, 9)
    check_against_torch(config.init(ad_device), reference, torch.randn(2, 3, *spatial), ad_device)


def test_inference_matches_torch(base_device):
    x = torch.randn(2, 3, 8, 6)
    for config, reference in [
        (MaxPool2dConfig([3, 3], stride=[2, 2], padding=Explicit(1)), torch.nn.MaxPool2d(3, 2, 1)),
        (AvgPool2dConfig([2, 2]), torch.nn.AvgPool2d(2)),
        (AdaptiveAvgPool2dConfig([5, 5]), torch.nn.AdaptiveAvgPool2d(5)),
    ]:
        assert_close(config.init()(from_torch(x, base_device)), reference(x))


def test_uneven_same_padding_goes_at_the_end(ad_device):
    # An even window: PyTorch has no such padding, so its reference pads first, then pools.
    x_ref = torch.randn(1, 2, 6, 5)
    maxpool = MaxPool2dConfig([2, 4], stride=[1, 1], padding=Same()).init()
    assert maxpool.padding == ((0, 1), (1, 2))

    def max_reference(x):
        return TF.max_pool2d(TF.pad(x, (1, 2, 0, 1), value=float("-inf")), (2, 4), 1)

    def avg_reference(x):
        return TF.avg_pool2d(TF.pad(x, (1, 2, 0, 1)), (2, 4), 1)

    check_against_torch(maxpool, max_reference, x_ref, ad_device)
    avgpool = AvgPool2dConfig([2, 4], stride=[1, 1], padding=Same()).init()
    check_against_torch(avgpool, avg_reference, x_ref, ad_device)
    assert avgpool(from_torch(x_ref, ad_device)).shape == tuple(x_ref.shape)


def test_uneven_same_padding_without_counting_the_zeros(ad_device):
    # Kernel 4, Same: output i averages the real elements of the window [i - 1, i + 2].
    n = 6
    x_np = np.random.default_rng(0).standard_normal((1, 1, n)).astype(np.float32)
    windows = [range(max(i - 1, 0), min(i + 3, n)) for i in range(n)]
    expected = [x_np[0, 0, list(w)].mean() for w in windows]
    # The gradient of the sum: each input gets 1 / len(window) from every window holding it.
    expected_grad = [sum(1 / len(w) for w in windows if j in w) for j in range(n)]

    layer = AvgPool1dConfig(4, stride=1, padding=Same(), count_include_pad=False).init()
    x = Tensor.from_data(x_np, ad_device).require_grad()
    y = layer(x)
    np.testing.assert_allclose(y.to_numpy()[0, 0], expected, rtol=1e-5, atol=1e-6)
    grads = y.sum().backward()
    np.testing.assert_allclose(x.grad(grads).to_numpy()[0, 0], expected_grad, rtol=1e-5)


def test_configs_defaults_follow_burn():
    avg = AvgPool2dConfig([2, 3])
    assert (avg.stride, avg.padding) == (None, Valid())
    assert avg.count_include_pad and not avg.ceil_mode
    assert avg.init().stride == (2, 3)  # the stride defaults to the window
    assert avg.with_stride([1, 1]).init().stride == (1, 1)
    maxpool = MaxPool1dConfig(3)
    assert (maxpool.dilation, maxpool.init().stride, maxpool.init().padding) == (1, (3,), ((0, 0),))
    assert isinstance(AvgPool1dConfig(2).init(), AvgPool1d)
    assert isinstance(AvgPool2dConfig([2, 2]).init(), AvgPool2d)
    assert isinstance(MaxPool1dConfig(2).init(), MaxPool1d)
    assert isinstance(MaxPool2dConfig([2, 2]).init(), MaxPool2d)
    assert isinstance(AdaptiveAvgPool1dConfig(2).init(), AdaptiveAvgPool1d)
    assert isinstance(AdaptiveAvgPool2dConfig([2, 2]).init(), AdaptiveAvgPool2d)
    assert MaxPool2dConfig([2, 2]).init().num_params() == 0


def test_configs_round_trip_through_json():
    config = MaxPool2dConfig([3, 3], stride=[2, 1], padding=Same(), dilation=[2, 2])
    assert MaxPool2dConfig.load_json(config.to_json()) == config
    assert AvgPool1dConfig.from_dict({"kernel_size": 2, "padding": {"Explicit": {"sizes": [1]}}}) \
        == AvgPool1dConfig(2, padding=Explicit(1))
    adaptive = AdaptiveAvgPool2dConfig([7, 7])
    assert AdaptiveAvgPool2dConfig.load_json(adaptive.to_json()).output_size == (7, 7)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: AvgPool2dConfig([3, 3], padding=Same()).init(),
         r"AvgPool2dConfig.padding: Same padding needs stride 1, got stride \[3, 3\]"),
        (lambda: MaxPool1dConfig(3, padding=Explicit(2)).init(),
         r"MaxPool1dConfig.padding: at most half the kernel size \[3\] per side, got \[\[2, 2\]\]"),
        (lambda: MaxPool2dConfig([3, 3], padding=Explicit(1, 1, 1)).init(),
         r"MaxPool2dConfig.padding: Explicit needs 1 or 2 sizes"),
        (lambda: AvgPool1dConfig(0), r"AvgPool1dConfig.kernel_size: expected greater"),
        (lambda: MaxPool2dConfig([2, 2], stride=[0, 1]), r"MaxPool2dConfig.stride\[0\]: expected greater"),
        (lambda: AdaptiveAvgPool2dConfig([2]), r"AdaptiveAvgPool2dConfig.output_size\[1\]: missing"),
        (lambda: AdaptiveAvgPool1dConfig(0), r"AdaptiveAvgPool1dConfig.output_size: expected greater"),
    ],
)  # fmt: skip
def test_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


@pytest.mark.parametrize(
    ("layer", "shape", "message"),
    [
        (AvgPool2dConfig([2, 2]).init(), [2, 3, 4],
         r"AvgPool2d: expected an input of shape \[batch, channels, height, width\], got \[2, 3, 4\]"),
        (MaxPool1dConfig(2).init(), [2, 3, 4, 4],
         r"MaxPool1d: expected an input of shape \[batch, channels, length\], got \[2, 3, 4, 4\]"),
        (AdaptiveAvgPool1dConfig(2).init(), [4],
         r"AdaptiveAvgPool1d: expected an input of shape \[batch, channels, length\], got \[4\]"),
        (AdaptiveAvgPool2dConfig([2, 2]).init(), [1, 1, 0, 3],
         r"AdaptiveAvgPool2d: the input's spatial dims must not be empty, got \[1, 1, 0, 3\]"),
        (MaxPool2dConfig([3, 3]).init(), [1, 1, 2, 5], r"max_pool2d: input \[1, 1, 2, 5\] is too small"),
    ],
)  # fmt: skip
def test_inputs_of_the_wrong_shape_are_shape_errors(layer, shape, message):
    with pytest.raises(ShapeError, match=message):
        layer(Tensor.ones(shape))
