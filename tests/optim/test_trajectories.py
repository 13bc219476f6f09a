"""Every optimizer follows torch.optim's parameter trajectory for 20 steps of one loss."""

from __future__ import annotations

import pytest
import torch
from optim_helpers import assert_trajectories_close, ember_mlp, torch_mlp, train_ember, train_torch

from ember.optim.adagrad import AdaGradConfig
from ember.optim.adam import AdamConfig
from ember.optim.adamw import AdamWConfig
from ember.optim.clipping import GradientClippingConfig
from ember.optim.decay import WeightDecayConfig
from ember.optim.momentum import MomentumConfig
from ember.optim.rmsprop import RmsPropConfig
from ember.optim.sgd import SgdConfig

STEPS = 20
EPS = 1e-5  # Burn's epsilon, given to torch explicitly (its defaults are smaller)


def _clip_value(threshold):
    def clip(param):
        acted = bool((param.grad.abs() > threshold).any())
        torch.nn.utils.clip_grad_value_([param], threshold)
        return acted

    return clip


def _clip_norm(max_norm):
    def clip(param):
        # One call per parameter tensor: Burn's (and ember's) per-parameter rule.
        return bool(torch.nn.utils.clip_grad_norm_([param], max_norm) > max_norm)

    return clip


# id: (ember config, lr, torch optimizer factory, torch clipping or None)
CASES = {
    "sgd": (SgdConfig(), 0.1, lambda p: torch.optim.SGD(p, lr=0.1), None),
    "sgd-decay-momentum": (
        SgdConfig(weight_decay=WeightDecayConfig(0.01), momentum=MomentumConfig()),
        0.05,
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
        None,
    ),
    "sgd-nesterov": (
        SgdConfig(momentum=MomentumConfig(momentum=0.8, dampening=0.0, nesterov=True)),
        0.05,
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
        None,
    ),
    "adam": (AdamConfig(), 0.01, lambda p: torch.optim.Adam(p, lr=0.01, eps=EPS), None),
    "adam-decay-amsgrad": (
        AdamConfig(beta_1=0.8, beta_2=0.99, weight_decay=WeightDecayConfig(0.05), amsgrad=True),
        0.02,
        lambda p: torch.optim.Adam(
            p, lr=0.02, betas=(0.8, 0.99), eps=EPS, weight_decay=0.05, amsgrad=True
        ),
        None,
    ),
    "adamw": (
        AdamWConfig(),
        0.01,
        lambda p: torch.optim.AdamW(p, lr=0.01, eps=EPS, weight_decay=1e-4),
        None,
    ),
    "adamw-amsgrad": (
        AdamWConfig(weight_decay=0.5, amsgrad=True),
        0.02,
        lambda p: torch.optim.AdamW(p, lr=0.02, eps=EPS, weight_decay=0.5, amsgrad=True),
        None,
    ),
    "rmsprop": (
        RmsPropConfig(),
        0.01,
        lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.99, eps=EPS),
        None,
    ),
    "rmsprop-centered-momentum-decay": (
        RmsPropConfig(alpha=0.9, centered=True, momentum=0.5, weight_decay=WeightDecayConfig(0.01)),
        0.005,
        lambda p: torch.optim.RMSprop(
            p, lr=0.005, alpha=0.9, eps=EPS, centered=True, momentum=0.5, weight_decay=0.01
        ),
        None,
    ),
    "adagrad": (AdaGradConfig(), 0.1, lambda p: torch.optim.Adagrad(p, lr=0.1, eps=EPS), None),
    "adagrad-lr-decay-decay": (
        AdaGradConfig(lr_decay=0.1, weight_decay=WeightDecayConfig(0.01)),
        0.1,
        lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.1, weight_decay=0.01, eps=EPS),
        None,
    ),
    "clip-value": (
        AdamConfig(gradient_clipping=GradientClippingConfig.Value(0.05)),
        0.01,
        lambda p: torch.optim.Adam(p, lr=0.01, eps=EPS),
        _clip_value(0.05),
    ),
    "clip-norm": (
        SgdConfig(momentum=MomentumConfig(), gradient_clipping=GradientClippingConfig.Norm(0.5)),
        0.05,
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1),
        _clip_norm(0.5),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trajectory_matches_torch(ad_device, case):
    config, lr, make_torch_optimizer, clip = CASES[case]
    reference = torch_mlp()
    model = ember_mlp(reference, ad_device)

    expected, clipped = train_torch(make_torch_optimizer, reference, STEPS, clip)
    _, actual = train_ember(config.init(), model, lr, STEPS, ad_device)

    if clip is not None:
        assert clipped, "the clipping threshold never acted: the case would not test clipping"
    assert_trajectories_close(actual, expected)


def test_norm_clipping_is_per_parameter_not_global(ad_device):
    """Per-parameter clipping differs from PyTorch's global clip_grad_norm_ on this model."""
    config = SgdConfig(gradient_clipping=GradientClippingConfig.Norm(0.5))
    reference = torch_mlp()
    model = ember_mlp(reference, ad_device)
    _, actual = train_ember(config.init(), model, 0.1, 1, ad_device)

    def clip_globally(params):
        params = list(params)
        optimizer = torch.optim.SGD(params, lr=0.1)
        original = optimizer.step

        def step():
            torch.nn.utils.clip_grad_norm_(params, 0.5)  # one norm over all gradients
            original()

        optimizer.step = step
        return optimizer

    global_, _ = train_torch(clip_globally, torch_mlp(), 1)
    per_param, _ = train_torch(
        lambda p: torch.optim.SGD(p, lr=0.1), torch_mlp(), 1, _clip_norm(0.5)
    )
    assert_trajectories_close(actual, per_param)
    with pytest.raises(AssertionError):
        assert_trajectories_close(actual, global_)
