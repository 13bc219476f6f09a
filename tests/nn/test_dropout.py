"""Dropout: statistics and scaling while training, identity for inference, config."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import ConfigError
from ember.nn.dropout import Dropout, DropoutConfig


def test_inference_is_the_identity(base_device):
    x = Tensor.random([4, 5], device=base_device)
    np.testing.assert_array_equal(DropoutConfig(0.7).init()(x).to_numpy(), x.to_numpy())


@pytest.mark.parametrize("prob", [0.2, 0.5])
def test_training_drops_the_expected_fraction_and_scales_the_rest(ad_device, prob):
    n = 20_000
    x = (Tensor.random([n], device=ad_device) + 1.0).require_grad()
    y = DropoutConfig(prob).init(ad_device)(x)
    values, inputs = y.to_numpy(), x.to_numpy()
    dropped = values == 0
    # 5 standard deviations of the binomial fraction
    assert abs(dropped.mean() - prob) < 5 * np.sqrt(prob * (1 - prob) / n)
    np.testing.assert_allclose(values[~dropped], inputs[~dropped] / (1 - prob), rtol=1e-6)
    # the gradient is the same mask and scale
    grad = y.sum().backward()
    expected = np.where(dropped, 0.0, 1 / (1 - prob))
    np.testing.assert_allclose(x.grad(grad).to_numpy(), expected, rtol=1e-6)


def test_zero_probability_keeps_the_input_while_training(ad_device):
    x = Tensor.random([3, 4], device=ad_device)
    np.testing.assert_array_equal(DropoutConfig(0.0).init()(x).to_numpy(), x.to_numpy())


def test_probability_one_gives_zeros_and_zero_gradients(ad_device):
    x = Tensor.random([3, 4], device=ad_device).require_grad()
    y = Dropout(1.0)(x)
    assert not y.to_numpy().any()
    assert not x.grad(y.sum().backward()).to_numpy().any()


def test_the_mask_follows_the_seed():
    device = ember.device("ndarray").autodiff()
    x = Tensor.ones([64], device)
    ember.seed(device, 7)
    first = Dropout(0.5)(x).to_numpy()
    ember.seed(device, 7)
    np.testing.assert_array_equal(Dropout(0.5)(x).to_numpy(), first)
    assert not np.array_equal(Dropout(0.5)(x).to_numpy(), first)  # the generator moved on


def test_valid_turns_dropout_off(ad_device):
    x = Tensor.ones([50], ad_device)
    layer = DropoutConfig(0.9).init(ad_device)
    np.testing.assert_array_equal(layer.valid()(x.inner()).to_numpy(), np.ones(50, np.float32))


def test_keeps_the_input_dtype():
    device = ember.device("ndarray", float_dtype="f64").autodiff()
    assert Dropout(0.5)(Tensor.ones([8], device)).dtype.value == "f64"


@pytest.mark.parametrize("prob", [-0.1, 1.5])
def test_probability_outside_zero_one_is_a_config_error(prob):
    with pytest.raises(ConfigError, match=r"DropoutConfig\.prob"):
        DropoutConfig(prob)


def test_config_round_trips_through_json():
    config = DropoutConfig(0.25)
    assert DropoutConfig.load_json(config.to_json()) == config
    assert config.init().prob == 0.25 and Dropout().prob == 0.5
