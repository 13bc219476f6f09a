"""Interpolate1d / 2d: against torch.nn.functional.interpolate (forward, gradient), configs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from nn_helpers import assert_close, from_torch

from ember import Tensor
from ember.backend.errors import ConfigError, ShapeError
from ember.nn.interpolate import (
    Interpolate1d,
    Interpolate1dConfig,
    Interpolate2d,
    Interpolate2dConfig,
    InterpolateMode,
)

Nearest, Linear, Cubic = InterpolateMode.Nearest, InterpolateMode.Linear, InterpolateMode.Cubic


def check_against_torch(layer, reference, x_ref, device):
    x_ref = x_ref.clone().requires_grad_(True)
    y_ref = reference(x_ref)
    upstream = torch.randn(y_ref.shape)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, device).require_grad()
    y = layer(x)
    assert y.shape == tuple(y_ref.shape)
    assert_close(y, y_ref, atol=1e-5)
    grads = (y * from_torch(upstream, device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-5)


def torch_2d(size, mode, align_corners):
    corners = None if mode == "nearest" else align_corners
    return lambda x: TF.interpolate(x, size=size, mode=mode, align_corners=corners)


# (ember config, torch reference): the scale factors map to sizes rounded down, as torch's
# recompute_scale_factor=True does.
Config2d = Interpolate2dConfig
CASES_2D = {
    "nearest-up": (Config2d(output_size=[7, 10]), torch_2d((7, 10), "nearest", None)),
    "nearest-scale-down": (Config2d(scale_factor=[0.6, 0.5]), torch_2d((3, 3), "nearest", None)),
    "linear-corners": (Config2d(output_size=[8, 4], mode=Linear()), torch_2d((8, 4), "bilinear", True)),
    "linear-half-pixel": (Config2d(scale_factor=[1.5, 2.0], mode=Linear(), align_corners=False),
                          torch_2d((7, 12), "bilinear", False)),
    "cubic-corners": (Config2d(output_size=[9, 5], mode=Cubic()), torch_2d((9, 5), "bicubic", True)),
    "cubic-half-pixel": (Config2d(output_size=[3, 11], mode=Cubic(), align_corners=False),
                         torch_2d((3, 11), "bicubic", False)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES_2D))
def test_interpolate2d_matches_torch(ad_device, case):
    config, reference = CASES_2D[case]
    torch.manual_seed(0)
    check_against_torch(config.init(), reference, torch.randn(2, 3, 5, 6), ad_device)


def cubic_1d(size, align_corners):
    # torch has no 1-d bicubic: resize a [N, C, 1, L] image, whose single row maps onto itself.
    return lambda x: torch_2d((1, size), "bicubic", align_corners)(x.unsqueeze(2)).squeeze(2)


CASES_1D = {
    "nearest-scale": (Interpolate1dConfig(scale_factor=2.5), lambda x: TF.interpolate(x, size=17)),
    "linear-corners": (Interpolate1dConfig(output_size=11, mode=Linear()),
                       lambda x: TF.interpolate(x, size=11, mode="linear", align_corners=True)),
    "linear-half-pixel": (Interpolate1dConfig(output_size=4, mode=Linear(), align_corners=False),
                          lambda x: TF.interpolate(x, size=4, mode="linear", align_corners=False)),
    "cubic": (Interpolate1dConfig(output_size=12, mode=Cubic()), cubic_1d(12, True)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES_1D))
def test_interpolate1d_matches_torch(ad_device, case):
    config, reference = CASES_1D[case]
    torch.manual_seed(1)
    check_against_torch(config.init(), reference, torch.randn(2, 3, 7), ad_device)


def test_inference_matches_torch(base_device):
    x = torch.randn(1, 2, 4, 4)
    layer = Interpolate2dConfig(scale_factor=[2.0, 2.0], mode=Linear()).init()
    expected = TF.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=True)
    assert_close(layer(from_torch(x, base_device)), expected, atol=1e-5)


def test_defaults_follow_burn_and_configs_round_trip():
    config = Interpolate2dConfig(output_size=[4, 4])
    assert (config.scale_factor, config.mode, config.align_corners) == (None, Nearest(), True)
    layer = config.init()
    assert isinstance(layer, Interpolate2d) and layer.output_size == (4, 4)
    assert isinstance(Interpolate1dConfig(scale_factor=2.0).init(), Interpolate1d)
    assert layer.num_params() == 0
    for config in (Interpolate2dConfig(scale_factor=[2.0, 0.5], mode=Cubic()),
                   Interpolate1dConfig(output_size=3, mode=Linear(), align_corners=False)):  # fmt: skip
        assert type(config).load_json(config.to_json()) == config
    assert Interpolate1dConfig(output_size=3, mode=Linear()).to_dict()["mode"] == "Linear"
    assert Interpolate2dConfig.from_dict({"output_size": [2, 2], "mode": "Cubic"}).mode == Cubic()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Interpolate2dConfig().init(),
         r"Interpolate2dConfig: needs exactly one of output_size and scale_factor, got neither"),
        (lambda: Interpolate1dConfig(output_size=2, scale_factor=2.0).init(),
         r"Interpolate1dConfig: needs exactly one of output_size and scale_factor, got both"),
        (lambda: Interpolate2dConfig(scale_factor=[2.0, 0.0]),
         r"Interpolate2dConfig.scale_factor\[1\]: expected greater than 0, got 0.0"),
        (lambda: Interpolate1dConfig(output_size=0), r"Interpolate1dConfig.output_size: expected greater"),
        (lambda: Interpolate2dConfig(output_size=[2, 2], mode="Bilinear"),
         r"Interpolate2dConfig.mode: expected one of the InterpolateMode variants "
         r"Nearest, Linear, Cubic"),
    ],
)  # fmt: skip
def test_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


@pytest.mark.parametrize(
    ("layer", "shape", "message"),
    [
        (Interpolate2dConfig(output_size=[2, 2]).init(), [1, 3, 4],
         r"Interpolate2d: expected an input of shape \[batch, channels, height, width\] with "
         r"non-empty spatial dims, got \[1, 3, 4\]"),
        (Interpolate1dConfig(output_size=2).init(), [1, 3, 0],
         r"Interpolate1d: expected an input of shape \[batch, channels, length\] .*got \[1, 3, 0\]"),
        (Interpolate1dConfig(scale_factor=0.2).init(), [1, 1, 4],
         r"Interpolate1d: scale_factor \[0.2\] gives an empty output \[0\] for an input of shape "
         r"\[1, 1, 4\]"),
    ],
)  # fmt: skip
def test_inputs_that_do_not_fit_are_shape_errors(layer, shape, message):
    with pytest.raises(ShapeError, match=message):
        layer(Tensor.ones(shape))


def test_a_layer_built_without_a_size_or_a_factor_says_so():
    layer = Interpolate2d(None, None, Nearest(), True)
    with pytest.raises(ConfigError, match=r"Interpolate2d: needs exactly one of output_size and "
                                          r"scale_factor, got neither"):  # fmt: skip
        layer(Tensor.ones([1, 1, 2, 2]))
