"""Linear: against torch.nn.Linear (forward, gradients), the PyTorch adapter, the config."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record

import ember
from ember import Tensor, TensorData
from ember.backend.errors import ConfigError, RecordMismatchError, ShapeError
from ember.module import Param, ParamId
from ember.nn import Initializer, Linear, LinearConfig
from ember.record.adapter import PYTORCH
from ember.record.imported import ImportedRecord


def torch_linear(d_in: int, d_out: int, bias: bool) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(d_in, d_out, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch", [(), (5,), (2, 3)], ids=["rank1", "rank2", "rank3"])
def test_forward_and_gradients_match_torch(ad_device, batch, bias):
    reference = torch_linear(4, 3, bias)
    layer = LinearConfig(4, 3, bias=bias).init(ad_device).load_record(pytorch_record(reference))

    x_ref = torch.randn(*batch, 4, requires_grad=True)
    upstream = torch.randn(*batch, 3)
    y_ref = reference(x_ref)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, ad_device).require_grad()
    y = layer(x)
    assert_close(y, y_ref)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad)
    assert_close(layer.weight.val().grad(grads), reference.weight.grad.T)  # ember: [in, out]
    if bias:
        assert_close(layer.bias.val().grad(grads), reference.bias.grad)


def test_a_permuted_input_matches_torch(ad_device):
    # Attention's input in [seq, batch, dim] (a permute of [batch, seq, dim]): the rank-3
    # path multiplies it as it lies.
    reference = torch_linear(8, 5, True)
    layer = LinearConfig(8, 5).init(ad_device).load_record(pytorch_record(reference))
    x_ref = torch.randn(2, 6, 8, requires_grad=True)
    upstream = torch.randn(6, 2, 5)
    y_ref = reference(x_ref.permute(1, 0, 2))
    (y_ref * upstream).sum().backward()
    x = from_torch(x_ref, ad_device).require_grad()
    y = layer(x.permute([1, 0, 2]))
    assert_close(y, y_ref)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad)
    assert_close(layer.weight.val().grad(grads), reference.weight.grad.T)


def test_inference_matches_torch(base_device):
    reference = torch_linear(6, 2, True)
    layer = LinearConfig(6, 2).init(base_device).load_record(pytorch_record(reference))
    x = torch.randn(7, 6)
    assert_close(layer(from_torch(x, base_device)), reference(x))


def test_valid_gives_the_layer_on_the_inner_device(ad_device):
    layer = LinearConfig(3, 2).init(ad_device)
    valid = layer.valid()
    assert valid.weight.device == ad_device.inner()
    x = Tensor.ones([1, 3], ad_device)
    np.testing.assert_allclose(valid(x.inner()).to_numpy(), layer(x).to_numpy())


def test_weight_layout_is_input_by_output():
    layer = LinearConfig(4, 3).init(ember.device("ndarray"))
    assert layer.weight.shape == (4, 3) and layer.bias.shape == (3,)
    assert (layer.d_input, layer.d_output) == (4, 3)
    assert LinearConfig(4, 3, bias=False).init().bias is None


def test_adapter_transposes_both_record_forms_and_keeps_ids():
    weight = np.arange(6, dtype=np.float32).reshape(3, 2)  # PyTorch layout [out=3, in=2]
    kept = ParamId.new()
    bare = PYTORCH.adapt(Linear(Param(Tensor.zeros([2, 3]))), {"weight": TensorData(weight)})
    assert bare["weight"].tolist() == weight.T.tolist()
    wrapped = PYTORCH.adapt(
        Linear(Param(Tensor.zeros([2, 3]))), {"weight": {"id": str(kept), "param": TensorData(weight)}}
    )
    assert wrapped["weight"]["param"].tolist() == weight.T.tolist()
    assert wrapped["weight"]["id"] == str(kept)
    layer = Linear(Param(Tensor.zeros([2, 3]))).load_record(
        ImportedRecord({"weight": TensorData(weight)}, adapter=PYTORCH)
    )
    assert layer.weight.val().tolist() == weight.T.tolist()


def test_adapter_leaves_a_weight_of_the_wrong_rank_for_the_loader_to_report():
    record = ImportedRecord({"weight": TensorData(np.zeros(6, np.float32))}, adapter=PYTORCH)
    with pytest.raises(RecordMismatchError, match=r"weight: shape \[6\] in the record, \[2, 3\]"):
        LinearConfig(2, 3, bias=False).init().load_record(record)


def test_ember_records_load_without_the_adapter():
    layer = LinearConfig(3, 2).init()
    again = LinearConfig(3, 2).init().load_record(layer.into_record())
    assert again.weight.val().tolist() == layer.weight.val().tolist()
    assert again.weight.id == layer.weight.id


def test_default_initializer_is_uniform_within_one_over_sqrt_fan_in():
    ember.seed(ember.device("ndarray"), 1)
    layer = LinearConfig(100, 400).init(ember.device("ndarray"))
    bound = 1 / math.sqrt(100)
    for param in (layer.weight, layer.bias):
        values = param.val().to_numpy()
        assert values.min() >= -bound and values.max() < bound
        assert values.max() > 0.9 * bound  # spread over the whole interval
    std = layer.weight.val().to_numpy().std()
    assert abs(std - bound / math.sqrt(3)) < 0.01 * bound


def test_parameters_are_tracked_on_an_autodiff_device(ad_device):
    layer = LinearConfig(2, 2).init(ad_device)
    assert layer.weight.val().is_require_grad() and layer.bias.val().is_require_grad()
    assert layer.num_params() == 6


def test_config_round_trips_through_json():
    config = LinearConfig(8, 4, bias=False, initializer=Initializer.XavierNormal(2.0))
    assert LinearConfig.load_json(config.to_json()) == config
    assert config.to_dict()["initializer"] == {"XavierNormal": {"gain": 2.0}}
    assert LinearConfig.from_dict({"d_input": 1, "d_output": 1, "initializer": "Zeros"}).initializer \
        == Initializer.Zeros()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_input": 0, "d_output": 3}, r"LinearConfig.d_input: expected greater than or equal to 1"),
        ({"d_input": 2, "d_output": 3.0}, r"LinearConfig.d_output: expected an integer"),
        ({"d_input": 2, "d_output": 3, "initializer": "He"}, r"LinearConfig.initializer: expected one of"),
        ({"d_input": 2, "d_output": 3, "initializer": 0.1}, r"variants Constant, Zeros, .*, got 0.1"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LinearConfig(**kwargs)


@pytest.mark.parametrize("shape", [[], [2, 5]])
def test_input_of_the_wrong_size_is_a_shape_error(shape):
    layer = LinearConfig(4, 3).init()
    x = Tensor.ones(shape) if shape else Tensor.from_data(1.0)
    with pytest.raises(ShapeError, match=r"Linear: expected an input of shape \[\.\.\., 4\] \(d_input\)"):
        layer(x)


def test_float64_device_keeps_float64():
    device = ember.device("ndarray", float_dtype="f64")
    layer = LinearConfig(3, 2).init(device)
    assert layer.weight.dtype.value == "f64"
    assert layer(Tensor.ones([1, 3], device)).dtype.value == "f64"
