"""Initializers: value statistics, fan rules, orthogonality, errors and saving."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ember
from ember.backend.errors import ArgumentError, ConfigError
from ember.module import Param
from ember.nn import Initializer, LinearConfig
from ember.nn.initializer import (
    Constant,
    KaimingNormal,
    KaimingUniform,
    Normal,
    Ones,
    Orthogonal,
    Uniform,
    XavierNormal,
    XavierUniform,
    Zeros,
)

SHAPE = [300, 400]  # 120k values: sample statistics within ~1% of the truth


def sample(initializer, device, **fans) -> np.ndarray:
    ember.seed(device, 7)
    values = initializer.init(SHAPE, device, **fans).to_numpy()
    assert values.shape == tuple(SHAPE)
    return values.astype(np.float64)


def check_uniform(values: np.ndarray, bound: float, low: float | None = None) -> None:
    low = -bound if low is None else low
    assert values.min() >= low and values.max() < bound
    assert values.min() < low + 0.01 * (bound - low) and values.max() > bound - 0.01 * (bound - low)
    assert abs(values.mean() - (low + bound) / 2) < 0.01 * (bound - low)
    assert abs(values.std() - (bound - low) / math.sqrt(12)) < 0.01 * (bound - low)


def check_normal(values: np.ndarray, mean: float, std: float) -> None:
    assert abs(values.mean() - mean) < 0.02 * std
    assert abs(values.std() - std) < 0.02 * std


def test_constants(base_device):
    assert Constant(0.25).init([2, 2], base_device).tolist() == [[0.25, 0.25], [0.25, 0.25]]
    assert Zeros().init([3], base_device).tolist() == [0.0] * 3
    assert Ones().init([3], base_device).tolist() == [1.0] * 3
    assert Constant(2).init([1], base_device).dtype.value == "f32"


def test_uniform_and_normal(base_device):
    check_uniform(sample(Uniform(-2.0, 6.0), base_device), 6.0, low=-2.0)
    check_normal(sample(Normal(1.5, 0.5), base_device), 1.5, 0.5)


@pytest.mark.parametrize("fan_out_only", [False, True])
def test_kaiming_uses_fan_in_or_fan_out(base_device, fan_out_only):
    fan = 40 if fan_out_only else 90
    gain = math.sqrt(2.0)
    uniform = sample(KaimingUniform(gain, fan_out_only=fan_out_only), base_device, fan_in=90, fan_out=40)
    check_uniform(uniform, gain * math.sqrt(3.0 / fan))
    normal = sample(KaimingNormal(gain, fan_out_only=fan_out_only), base_device, fan_in=90, fan_out=40)
    check_normal(normal, 0.0, gain * math.sqrt(1.0 / fan))


def test_kaiming_fan_out_only_needs_only_fan_out(base_device):
    values = KaimingUniform(1.0, fan_out_only=True).init([10], base_device, fan_out=3).to_numpy()
    assert np.abs(values).max() <= 1.0


def test_xavier_uses_both_fans(base_device):
    check_uniform(sample(XavierUniform(2.0), base_device, fan_in=30, fan_out=70), 2.0 * math.sqrt(6 / 100))
    check_normal(sample(XavierNormal(0.5), base_device, fan_in=30, fan_out=70), 0.0, 0.5 * math.sqrt(2 / 100))


def test_zero_gain_gives_zeros():
    assert KaimingUniform(0.0).init([3], fan_in=4).tolist() == [0.0] * 3


def test_the_device_seed_makes_draws_repeatable(base_device):
    for initializer in (KaimingUniform(1.0), Orthogonal(1.0)):
        first, second = (sample(initializer, base_device, fan_in=4) for _ in range(2))
        np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize(("shape", "wide"), [([3, 5], True), ([5, 3], False), ([4, 2, 3, 3], True), ([20, 2, 3], False)])
def test_orthogonal(base_device, shape, wide):
    w = Orthogonal(2.0).init(shape, base_device).to_numpy().astype(np.float64)
    assert w.shape == tuple(shape)
    matrix = w.reshape(shape[0], -1) / 2.0
    gram = matrix @ matrix.T if wide else matrix.T @ matrix
    np.testing.assert_allclose(gram, np.eye(gram.shape[0]), atol=1e-5)


def test_orthogonal_square_on_an_autodiff_device(ad_device):
    param = Orthogonal(1.0).init_param([6, 6], ad_device)
    w = param.val().to_numpy()
    np.testing.assert_allclose(w @ w.T, np.eye(6), atol=1e-5)
    np.testing.assert_allclose(w.T @ w, np.eye(6), atol=1e-5)
    assert param.val().is_require_grad() and param.device == ad_device


def test_init_param_wraps_in_a_param(ad_device):
    param = Zeros().init_param([2], ad_device, require_grad=False)
    assert isinstance(param, Param) and not param.require_grad
    assert not param.val().is_require_grad()
    assert Ones().init_param([2], ad_device).val().is_require_grad()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: KaimingUniform(1.0).init([2]), r"KaimingUniform: needs fan_in to scale its values"),
        (lambda: KaimingNormal(1.0, fan_out_only=True).init([2], fan_in=3),
         r"KaimingNormal: needs fan_out"),
        (lambda: XavierUniform(1.0).init([2], fan_in=3), r"XavierUniform: needs fan_out"),
        (lambda: XavierNormal(1.0).init([2], fan_out=3), r"XavierNormal: needs fan_in"),
        (lambda: KaimingUniform(1.0).init([2], fan_in=0), r"KaimingUniform: fan_in must be >= 1, got 0"),
        (lambda: Uniform(1.0, 1.0).init([2]), r"Uniform: needs min < max, got min=1.0, max=1.0"),
        (lambda: Orthogonal(1.0).init([4]), r"Orthogonal: needs a shape of rank >= 2 .*got \[4\]"),
    ],
)  # fmt: skip
def test_bad_init_arguments_are_argument_errors(call, message):
    with pytest.raises(ArgumentError, match=message):
        call()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Normal(0.0, -1.0), r"Normal.std: expected greater than or equal to 0"),
        (lambda: KaimingUniform(), r"KaimingUniform.gain: missing required field"),
        (lambda: Constant("1"), r"Constant.value: expected a number"),
        (lambda: Initializer(), r"Initializer is a family of configs; build one of: Constant, Zeros"),
    ],
)  # fmt: skip
def test_bad_configs_are_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


VARIANTS = [Constant(0.5), Zeros(), Ones(), Uniform(-1.0, 1.0), Normal(0.0, 2.0),
            KaimingUniform(1.0), KaimingNormal(2.0, fan_out_only=True), XavierUniform(1.0),
            XavierNormal(0.5), Orthogonal(1.0)]  # fmt: skip


@pytest.mark.parametrize("initializer", VARIANTS, ids=lambda v: type(v).__name__)
def test_every_variant_saves_by_name_and_loads_back(initializer):
    # Orthogonal needs rank >= 2: it cannot fill a bias, in Burn or PyTorch either.
    config = LinearConfig(3, 2, bias=not isinstance(initializer, Orthogonal), initializer=initializer)
    saved = config.to_dict()["initializer"]
    name = type(initializer).__name__
    assert saved == name if name in ("Zeros", "Ones") else list(saved) == [name]
    assert LinearConfig.from_dict(config.to_dict()) == config
    assert getattr(Initializer, name) is type(initializer)
    layer = config.init()
    assert layer.weight.shape == (3, 2)


def test_unknown_or_malformed_variants_in_json_are_config_errors():
    base = {"d_input": 1, "d_output": 1}
    with pytest.raises(ConfigError, match=r"LinearConfig.initializer: expected one of the Initializer"):
        LinearConfig.from_dict({**base, "initializer": {"He": {"gain": 1.0}}})
    with pytest.raises(ConfigError, match=r"LinearConfig.initializer.KaimingUniform.gain: missing"):
        LinearConfig.from_dict({**base, "initializer": {"KaimingUniform": {}}})
    with pytest.raises(ConfigError, match=r"initializer.Zeros.scale: unknown field"):
        LinearConfig.from_dict({**base, "initializer": {"Zeros": {"scale": 1}}})


# PyTorch's initializers for the same layer: torch lays weights out [fan_out, fan_in].
FAN_IN, FAN_OUT = SHAPE


def _torch_sample(fill) -> np.ndarray:
    torch.manual_seed(7)
    weight = torch.empty(FAN_OUT, FAN_IN)
    with torch.no_grad():
        fill(weight)
    return weight.numpy().astype(np.float64)


TORCH_PAIRS = {
    "kaiming_uniform_relu": (KaimingUniform(math.sqrt(2.0)),
                             lambda w: torch.nn.init.kaiming_uniform_(w, nonlinearity="relu")),
    "kaiming_normal_fan_out": (KaimingNormal(math.sqrt(2.0), fan_out_only=True),
                               lambda w: torch.nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")),
    "xavier_uniform": (XavierUniform(1.5), lambda w: torch.nn.init.xavier_uniform_(w, gain=1.5)),
    "xavier_normal": (XavierNormal(0.7), lambda w: torch.nn.init.xavier_normal_(w, gain=0.7)),
    "uniform": (Uniform(-0.5, 2.0), lambda w: torch.nn.init.uniform_(w, -0.5, 2.0)),
    "normal": (Normal(0.3, 1.2), lambda w: torch.nn.init.normal_(w, 0.3, 1.2)),
    # PyTorch's default for nn.Linear weights: kaiming_uniform_ with a = sqrt(5).
    "linear_default": (LinearConfig(FAN_IN, FAN_OUT).initializer,
                       lambda w: torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))),
}  # fmt: skip


@pytest.mark.parametrize("name", list(TORCH_PAIRS))
def test_statistics_match_torch_nn_init(base_device, name):
    initializer, fill = TORCH_PAIRS[name]
    ours = sample(initializer, base_device, fan_in=FAN_IN, fan_out=FAN_OUT)
    theirs = _torch_sample(fill)
    spread = theirs.std()
    assert abs(ours.mean() - theirs.mean()) < 0.02 * spread
    assert abs(ours.std() / spread - 1) < 0.02
    # The same support (uniform) or tails (normal): compare the 0.1% and 99.9% quantiles.
    for q in (0.001, 0.999):
        assert abs(np.quantile(ours, q) - np.quantile(theirs, q)) < 0.05 * spread


def test_orthogonal_matches_torch_orthogonal(base_device):
    ours = Orthogonal(2.0).init([30, 50], base_device).to_numpy().astype(np.float64)
    theirs = _torch_sample(lambda w: torch.nn.init.orthogonal_(w[:30, :50], gain=2.0))[:30, :50]
    np.testing.assert_allclose(ours @ ours.T, theirs @ theirs.T, atol=1e-4)
    assert abs(ours.std() / theirs.std() - 1) < 0.1
