"""Optimizer configs: Burn's defaults, validation of hyperparameters, JSON, and clipping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember import Tensor, TensorData
from ember.backend.errors import ArgumentError, ConfigError
from ember.optim.adagrad import AdaGradConfig
from ember.optim.adam import AdamConfig
from ember.optim.adamw import AdamWConfig
from ember.optim.clipping import GradientClippingConfig
from ember.optim.decay import WeightDecayConfig
from ember.optim.momentum import MomentumConfig
from ember.optim.optimizer import OptimizerAdaptor
from ember.optim.rmsprop import RmsPropConfig
from ember.optim.sgd import SgdConfig


def test_burn_defaults():
    assert AdamConfig().model_dump() == {
        "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-5, "weight_decay": None,
        "amsgrad": False, "gradient_clipping": None,
    }  # fmt: skip
    assert AdamWConfig().model_dump() == {
        "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-5, "weight_decay": 1e-4,
        "amsgrad": False, "gradient_clipping": None,
    }  # fmt: skip
    assert MomentumConfig().model_dump() == {"momentum": 0.9, "dampening": 0.1, "nesterov": False}
    assert SgdConfig().model_dump() == {
        "weight_decay": None, "momentum": None, "gradient_clipping": None,
    }  # fmt: skip
    assert RmsPropConfig().model_dump() == {
        "alpha": 0.99, "epsilon": 1e-5, "weight_decay": None, "momentum": 0.0,
        "centered": False, "gradient_clipping": None,
    }  # fmt: skip
    assert AdaGradConfig().model_dump() == {
        "lr_decay": 0.0, "epsilon": 1e-5, "weight_decay": None, "gradient_clipping": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("build", "field", "expected"),
    [
        (lambda: AdamConfig(beta_1=1.0), "AdamConfig.beta_1", "less than 1"),
        (lambda: AdamConfig(beta_2=-0.1), "AdamConfig.beta_2", "greater than or equal to 0"),
        (lambda: AdamConfig(epsilon=-1e-8), "AdamConfig.epsilon", "greater than or equal to 0"),
        (lambda: AdamWConfig(beta_1=1.5), "AdamWConfig.beta_1", "less than 1"),
        (
            lambda: AdamWConfig(weight_decay=-0.1),
            "AdamWConfig.weight_decay",
            "greater than or equal",
        ),
        (lambda: MomentumConfig(momentum=-0.5), "MomentumConfig.momentum", "greater than or equal"),
        (
            lambda: MomentumConfig(dampening=1.5),
            "MomentumConfig.dampening",
            "less than or equal to 1",
        ),
        (
            lambda: WeightDecayConfig(-1.0),
            "WeightDecayConfig.penalty",
            "greater than or equal to 0",
        ),
        (lambda: RmsPropConfig(alpha=1.5), "RmsPropConfig.alpha", "less than or equal to 1"),
        (lambda: RmsPropConfig(momentum=-0.1), "RmsPropConfig.momentum", "greater than or equal"),
        (lambda: RmsPropConfig(epsilon=float("nan")), "RmsPropConfig.epsilon", "greater than or"),
        (lambda: AdaGradConfig(lr_decay=-0.1), "AdaGradConfig.lr_decay", "greater than or equal"),
        (lambda: GradientClippingConfig.Value(0.0), "Value.threshold", "greater than 0"),
        (lambda: GradientClippingConfig.Norm(-1.0), "Norm.max_norm", "greater than 0"),
        (lambda: SgdConfig(momentum=0.9), "SgdConfig.momentum", "MomentumConfig"),
        (lambda: AdamConfig(weight_decay=0.1), "AdamConfig.weight_decay", "WeightDecayConfig"),
    ],
    ids=lambda v: v if isinstance(v, str) and "." in v else None,
)
def test_bad_hyperparameters_are_config_errors(build, field, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        build()
    assert str(info.value).startswith(field)


def test_gradient_clipping_family_needs_a_variant():
    with pytest.raises(
        ConfigError,
        match="GradientClippingConfig is a family of configs; build one of: Value, Norm",
    ):
        GradientClippingConfig()
    with pytest.raises(ConfigError, match=r"SgdConfig\.gradient_clipping"):
        SgdConfig(gradient_clipping=0.5)


@pytest.mark.parametrize(
    "config",
    [
        AdamConfig(weight_decay=WeightDecayConfig(0.1), amsgrad=True,
                   gradient_clipping=GradientClippingConfig.Norm(1.0)),
        SgdConfig(momentum=MomentumConfig(nesterov=True),
                  gradient_clipping=GradientClippingConfig.Value(0.5)),
        AdamWConfig(weight_decay=0.01), RmsPropConfig(centered=True), AdaGradConfig(lr_decay=0.5),
    ],
    ids=["adam", "sgd", "adamw", "rmsprop", "adagrad"],
)  # fmt: skip
def test_configs_round_trip_through_json(config):
    loaded = type(config).load_json(config.to_json())
    assert loaded == config
    assert isinstance(loaded.init(), OptimizerAdaptor)


def test_clipping_is_saved_by_variant_name():
    data = AdamConfig(gradient_clipping=GradientClippingConfig.Norm(2.0)).to_dict()
    assert data["gradient_clipping"] == {"Norm": {"max_norm": 2.0}}
    loaded = AdamConfig.from_dict({"gradient_clipping": {"Value": {"threshold": 0.1}}})
    assert loaded.gradient_clipping == GradientClippingConfig.Value(0.1)


def _torch_clipped(grad: torch.Tensor, clip) -> np.ndarray:
    """``grad`` after ``clip(parameters)`` clipped it as a parameter's gradient."""
    param = torch.nn.Parameter(torch.zeros_like(grad))
    param.grad = grad.clone()
    clip([param])
    return param.grad.numpy()


@pytest.mark.parametrize("device_name", ["ndarray", "torch"])
def test_clipping_matches_torch_on_one_tensor(device_name):
    device = ember.device(device_name)
    generator = torch.Generator().manual_seed(3)
    for scale in (0.1, 10.0):  # below and above the limits
        grad = scale * torch.randn(4, 5, generator=generator)
        ours = Tensor.from_data(TensorData(grad.numpy()), device)
        np.testing.assert_allclose(
            GradientClippingConfig.Norm(1.5).clip(ours).to_numpy(),
            _torch_clipped(grad, lambda p: torch.nn.utils.clip_grad_norm_(p, 1.5)),
            rtol=1e-6,
        )
        np.testing.assert_allclose(
            GradientClippingConfig.Value(0.3).clip(ours).to_numpy(),
            _torch_clipped(grad, lambda p: torch.nn.utils.clip_grad_value_(p, 0.3)),
            rtol=1e-6,
        )


def test_adaptor_argument_errors():
    with pytest.raises(
        ArgumentError, match="OptimizerAdaptor: expected a SimpleOptimizer, got AdamConfig"
    ):
        OptimizerAdaptor(AdamConfig())
    with pytest.raises(
        ArgumentError, match="gradient_clipping must be a GradientClippingConfig or None, got float"
    ):
        OptimizerAdaptor(AdamConfig().init().optimizer, 1.0)
