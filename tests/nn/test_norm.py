"""Normalization layers against PyTorch: BatchNorm (training and inference), LayerNorm,
GroupNorm, InstanceNorm and RmsNorm (forward and gradients); the adapter; errors."""

from __future__ import annotations

import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record

from ember import Tensor
from ember.backend.errors import ConfigError, ShapeError
from ember.nn import BatchNorm, BatchNormConfig
from ember.nn.norm import GroupNormConfig, InstanceNormConfig, LayerNormConfig, RmsNormConfig
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


# ---------------------------------------------------------------- LayerNorm, GroupNorm, InstanceNorm, RmsNorm
# Each case: the ember config, the PyTorch reference with the same defaults spelled out, an input shape.
NORMS = {
    "layer": (lambda: LayerNormConfig(6), lambda: torch.nn.LayerNorm(6, eps=1e-5), (2, 3, 6)),
    "layer-rank1": (lambda: LayerNormConfig(5, epsilon=1e-3),
                    lambda: torch.nn.LayerNorm(5, eps=1e-3), (5,)),
    "group": (lambda: GroupNormConfig(2, 4), lambda: torch.nn.GroupNorm(2, 4, eps=1e-5), (3, 4, 5)),
    "group-rank4": (lambda: GroupNormConfig(3, 6, epsilon=1e-3),
                    lambda: torch.nn.GroupNorm(3, 6, eps=1e-3), (2, 6, 3, 2)),
    "group-rank2": (lambda: GroupNormConfig(2, 6), lambda: torch.nn.GroupNorm(2, 6), (4, 6)),
    "instance1d": (lambda: InstanceNormConfig(3),
                   lambda: torch.nn.InstanceNorm1d(3, eps=1e-5, affine=True), (2, 3, 7)),
    "instance2d": (lambda: InstanceNormConfig(3),
                   lambda: torch.nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 5)),
    "rms": (lambda: RmsNormConfig(6), lambda: torch.nn.RMSNorm(6, eps=1e-5), (2, 3, 6)),
}  # fmt: skip


def torch_norm(case: str) -> tuple[torch.nn.Module, tuple[int, ...]]:
    torch.manual_seed(1)
    _, make, shape = NORMS[case]
    reference = make()
    with torch.no_grad():  # away from the identity, so loading the weights is checked
        for param in reference.parameters():
            param.uniform_(-1.5, 1.5)
    return reference, shape


def params_of(norm) -> dict[str, object]:
    return {name: param for name, param in norm.params()}


@pytest.mark.parametrize("case", list(NORMS))
def test_norm_forward_and_gradients_match_torch(ad_device, case):
    reference, shape = torch_norm(case)
    norm = NORMS[case][0]().init(ad_device).load_record(pytorch_record(reference))
    x_ref = (torch.randn(shape) * 3 + 1).requires_grad_(True)
    upstream = torch.randn(shape)
    y_ref = reference(x_ref)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, ad_device).require_grad()
    y = norm(x)
    assert y.shape == shape
    assert_close(y, y_ref, atol=1e-5)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-4)
    torch_grads = {"gamma": reference.weight.grad}
    if getattr(reference, "bias", None) is not None:
        torch_grads["beta"] = reference.bias.grad
    ember_params = params_of(norm)
    assert sorted(ember_params) == sorted(torch_grads)
    for name, expected in torch_grads.items():
        assert_close(ember_params[name].val().grad(grads), expected, atol=1e-4)

    # valid(): the same function on the inner device (these layers keep no batch statistics)
    x_valid = torch.randn(shape)
    assert_close(norm.valid()(from_torch(x_valid, ad_device.inner())), reference(x_valid), atol=1e-5)


@pytest.mark.parametrize("case", ["layer", "group-rank4", "instance2d", "rms"])
def test_norm_inference_on_a_base_device_matches_torch(base_device, case):
    reference, shape = torch_norm(case)
    norm = NORMS[case][0]().init(base_device).load_record(pytorch_record(reference))
    x = torch.randn(shape)
    assert_close(norm(from_torch(x, base_device)), reference(x), atol=1e-5)


@pytest.mark.parametrize("kind", ["group", "instance"])
def test_norms_without_affine_match_torch(ad_device, kind):
    if kind == "group":
        norm, reference = GroupNormConfig(2, 4, affine=False), torch.nn.GroupNorm(2, 4, affine=False)
    else:
        norm, reference = InstanceNormConfig(4, affine=False), torch.nn.InstanceNorm1d(4)
    norm = norm.init(ad_device)
    assert norm.gamma is None and norm.beta is None and norm.num_params() == 0
    x_ref = torch.randn(2, 4, 6, requires_grad=True)
    reference(x_ref).pow(3).sum().backward()
    x = from_torch(x_ref, ad_device).require_grad()
    y = norm(x)
    assert_close(y, reference(x_ref), atol=1e-5)
    assert_close(x.grad((y * y * y).sum().backward()), x_ref.grad, atol=1e-4)


def test_default_configs_follow_burn():
    layer = LayerNormConfig(4).init()
    assert (layer.d_model, layer.epsilon) == (4, 1e-5)
    assert layer.gamma.val().tolist() == [1.0] * 4 and layer.beta.val().tolist() == [0.0] * 4
    group = GroupNormConfig(2, 4)
    assert (group.epsilon, group.affine) == (1e-5, True)
    group_norm = group.init()
    assert group_norm.gamma.val().tolist() == [1.0] * 4 and group_norm.beta.val().tolist() == [0.0] * 4
    instance = InstanceNormConfig(3)
    assert (instance.epsilon, instance.affine) == (1e-5, True)
    assert instance.init().num_params() == 6
    rms = RmsNormConfig(5).init()
    assert (rms.d_model, rms.epsilon) == (5, 1e-5)
    assert sorted(rms.into_record()) == ["gamma"] and rms.gamma.val().tolist() == [1.0] * 5


def test_pytorch_adapter_renames_weight_and_bias():
    reference, _ = torch_norm("layer")
    adapted = PYTORCH.adapt(LayerNormConfig(6).init(), pytorch_record(reference).tensors)
    assert sorted(adapted) == ["beta", "gamma"]
    rms_reference, _ = torch_norm("rms")
    rms, report = RmsNormConfig(6).init().load_record_partial(pytorch_record(rms_reference))
    assert report.loaded == ["gamma"] and not report.missing and not report.unexpected
    assert_close(rms.gamma.val(), rms_reference.weight)


@pytest.mark.parametrize(
    ("config", "shape", "message"),
    [(LayerNormConfig(4), [2, 3], r"LayerNorm: expected an input of shape \[\.\.\., 4\] \(d_model\), got \[2, 3\]"),
     (LayerNormConfig(4), [], r"LayerNorm: .*got \[\]"),
     (RmsNormConfig(3), [3, 4], r"RmsNorm: expected an input of shape \[\.\.\., 3\] \(d_model\), got \[3, 4\]"),
     (GroupNormConfig(2, 4), [2, 3, 5], r"GroupNorm: expected an input of shape \[batch, 4 \(num_channels\), \.\.\.\], got \[2, 3, 5\]"),
     (GroupNormConfig(2, 4), [4], r"GroupNorm: .*got \[4\]"),
     (InstanceNormConfig(2), [3, 2], r"InstanceNorm: expected an input of shape \[batch, 2 \(num_channels\), \*spatial\] with at least one spatial dim, got \[3, 2\]"),
     (InstanceNormConfig(2), [3, 4, 5], r"InstanceNorm: .*got \[3, 4, 5\]")],
)  # fmt: skip
def test_norm_input_of_the_wrong_shape_is_a_shape_error(ad_device, config, shape, message):
    norm = config.init(ad_device)
    with pytest.raises(ShapeError, match=message):
        norm(Tensor.ones(shape, ad_device))


def test_num_groups_must_divide_num_channels():
    config = GroupNormConfig(3, 4)  # valid on its own: the check is at init, as Burn's
    with pytest.raises(ConfigError, match=r"GroupNormConfig.num_groups: 3 groups must divide num_channels \(4\)"):
        config.init()


@pytest.mark.parametrize(
    ("make", "message"),
    [(lambda: LayerNormConfig(0), r"LayerNormConfig.d_model: expected greater than or equal to 1"),
     (lambda: LayerNormConfig(4, epsilon=-1.0), r"LayerNormConfig.epsilon: expected greater than"),
     (lambda: GroupNormConfig(0, 4), r"GroupNormConfig.num_groups: expected greater than or equal to 1"),
     (lambda: GroupNormConfig(2, 4, affine="yes"), r"GroupNormConfig.affine: expected a boolean"),
     (lambda: InstanceNormConfig(num_channels=2.5), r"InstanceNormConfig.num_channels"),
     (lambda: RmsNormConfig(), r"RmsNormConfig.d_model")],
)  # fmt: skip
def test_norm_config_errors(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_norm_configs_round_trip_through_json():
    for config in [LayerNormConfig(8, epsilon=1e-6), GroupNormConfig(2, 8, affine=False),
                   InstanceNormConfig(4), RmsNormConfig(3)]:  # fmt: skip
        assert type(config).load_json(config.to_json()) == config
