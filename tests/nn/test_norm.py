"""BatchNorm: training and inference against torch.nn.BatchNorm1d / 2d, the adapter, errors."""

from __future__ import annotations

import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record

from ember import Tensor
from ember.backend.errors import ConfigError, ShapeError
from ember.nn import BatchNorm, BatchNormConfig
from ember.record.adapter import PYTORCH

SHAPES = {"rank2": (8, 3), "rank3": (4, 3, 5), "rank4": (2, 3, 4, 5)}


def torch_batch_norm(shape, momentum: float = 0.1, epsilon: float = 1e-5) -> torch.nn.Module:
    torch.manual_seed(0)
    kind = torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm1d
    reference = kind(shape[1], eps=epsilon, momentum=momentum)
    with torch.no_grad():  # start away from the defaults, so every tensor is checked
        reference.weight.uniform_(0.5, 1.5)
        reference.bias.uniform_(-0.5, 0.5)
        reference.running_mean.uniform_(-1.0, 1.0)
        reference.running_var.uniform_(0.5, 2.0)
    return reference


def assert_same_state(norm: BatchNorm, reference: torch.nn.Module) -> None:
    assert_close(norm.running_mean.val(), reference.running_mean)
    assert_close(norm.running_var.val(), reference.running_var)


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_training_steps_match_torch(ad_device, shape):
    momentum = 0.3
    reference = torch_batch_norm(shape, momentum).train()
    config = BatchNormConfig(shape[1], momentum=momentum)
    norm = config.init(ad_device).load_record(pytorch_record(reference))
    for step in range(3):
        x_ref = (torch.randn(shape) * (step + 1) + step).requires_grad_(True)
        upstream = torch.randn(shape)
        reference.zero_grad()
        y_ref = reference(x_ref)
        (y_ref * upstream).sum().backward()

        x = from_torch(x_ref, ad_device).require_grad()
        y = norm(x)
        assert_close(y, y_ref, atol=1e-5)
        grads = (y * from_torch(upstream, ad_device)).sum().backward()
        assert_close(x.grad(grads), x_ref.grad, atol=1e-4)
        assert_close(norm.gamma.val().grad(grads), reference.weight.grad, atol=1e-4)
        assert_close(norm.beta.val().grad(grads), reference.bias.grad, atol=1e-4)
        assert norm.running_mean.val().grad(grads) is None
        assert_same_state(norm, reference)

    # valid(): the same weights on the inner device, normalizing with the running statistics
    valid = norm.valid()
    reference.eval()
    x = torch.randn(shape)
    assert_close(valid(from_torch(x, ad_device.inner())), reference(x), atol=1e-5)
    assert_same_state(valid, reference)  # inference leaves the statistics alone


def test_inference_on_a_base_device_matches_torch_eval(base_device):
    reference = torch_batch_norm(SHAPES["rank4"]).eval()
    norm = BatchNormConfig(3).init(base_device).load_record(pytorch_record(reference))
    x = torch.randn(SHAPES["rank4"])
    assert_close(norm(from_torch(x, base_device)), reference(x), atol=1e-5)
    assert_same_state(norm, reference)


def test_pytorch_adapter_renames_and_drops_the_batch_counter():
    reference = torch_batch_norm(SHAPES["rank3"])
    assert "num_batches_tracked" in reference.state_dict()
    adapted = PYTORCH.adapt(BatchNormConfig(3).init(), pytorch_record(reference).tensors)
    assert sorted(adapted) == ["beta", "gamma", "running_mean", "running_var"]
    norm, report = BatchNormConfig(3).init().load_record_partial(pytorch_record(reference))
    assert sorted(report.loaded) == ["beta", "gamma", "running_mean", "running_var"]
    assert not report.missing and not report.unexpected
    assert_close(norm.gamma.val(), reference.weight)


def test_initial_state_and_record():
    norm = BatchNormConfig(4, epsilon=1e-3, momentum=0.05).init()
    assert norm.gamma.val().tolist() == [1.0] * 4 and norm.beta.val().tolist() == [0.0] * 4
    assert norm.running_mean.val().tolist() == [0.0] * 4
    assert norm.running_var.val().tolist() == [1.0] * 4
    assert (norm.num_features, norm.epsilon, norm.momentum) == (4, 1e-3, 0.05)
    assert not norm.running_var.require_grad
    assert sorted(norm.into_record()) == ["beta", "gamma", "running_mean", "running_var"]
    assert norm.num_params() == 16


def test_running_statistics_are_detached_on_an_autodiff_device(ad_device):
    norm = BatchNormConfig(2).init(ad_device)
    norm(Tensor.random([4, 2], device=ad_device).require_grad())
    assert not norm.running_mean.val().is_require_grad()
    assert not norm.running_var.val().is_require_grad()
    assert norm.gamma.val().is_require_grad()


@pytest.mark.parametrize(
    ("shape", "message"),
    [([4], r"BatchNorm: expected an input of shape \[batch, 3 \(num_features\), \.\.\.\], got \[4\]"),
     ([4, 2, 5], r"got \[4, 2, 5\]")],
)  # fmt: skip
def test_input_without_the_channels_is_a_shape_error(ad_device, shape, message):
    with pytest.raises(ShapeError, match=message):
        BatchNormConfig(3).init(ad_device)(Tensor.ones(shape, ad_device))


def test_training_on_one_value_per_channel_is_a_shape_error(ad_device):
    norm = BatchNormConfig(3).init(ad_device)
    with pytest.raises(ShapeError, match=r"training needs more than one value per channel, .*\[1, 3\]"):
        norm(Tensor.ones([1, 3], ad_device))
    assert norm.valid()(Tensor.ones([1, 3], ad_device.inner())).shape == (1, 3)  # fine for inference


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"num_features": 0}, r"BatchNormConfig.num_features: expected greater than or equal to 1"),
     ({"num_features": 2, "momentum": -0.1}, r"BatchNormConfig.momentum: expected greater than"),
     ({"num_features": 2, "epsilon": "small"}, r"BatchNormConfig.epsilon: expected a number")],
)  # fmt: skip
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        BatchNormConfig(**kwargs)


def test_config_round_trips_through_json():
    config = BatchNormConfig(8, momentum=0.01)
    assert BatchNormConfig.load_json(config.to_json()) == config
