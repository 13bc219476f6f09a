"""Normalization and softmax converters on what the node suite leaves out: constant
scales and statistics (ember's layers), old opsets, dynamic batch."""

from __future__ import annotations

import numpy as np
import pytest
from op_helpers import check, node_model, onnx

import ember
from ember.onnx.importer import convert

RNG = np.random.default_rng(5)


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("device_name", ["ndarray", "torch"])
def test_batch_norm_layer_uses_the_running_statistics(device_name):
    x = _randn(3, 4, 5, 2)
    stats = {"scale": _randn(4), "bias": _randn(4), "mean": _randn(4),
             "var": RNG.uniform(0.5, 2, 4).astype(np.float32)}  # fmt: skip
    conversion = check(node_model("BatchNormalization", x, stats, opset=15, epsilon=1e-3,
                                  momentum=0.8), x, device_name)  # fmt: skip
    assert "BatchNormConfig(4, epsilon=0.001, momentum=0.2)" in conversion.source
    check(node_model("BatchNormalization", x, stats, opset=7, epsilon=1e-3), x)


def test_layer_and_rms_norm_layers_over_the_last_dim():
    x = _randn(2, 3, 6)
    conversion = check(node_model("LayerNormalization", x, {"scale": _randn(6), "b": _randn(6)},
                                  epsilon=1e-4), x)  # fmt: skip
    assert "LayerNormConfig(6, epsilon=0.0001)" in conversion.source
    conversion = check(node_model("LayerNormalization", x, {"scale": _randn(6)}), x)
    assert "LayerNorm" in conversion.source  # no bias: a zero shift
    conversion = check(node_model("RMSNormalization", x, {"scale": _randn(6)}, opset=23), x)
    assert "RmsNormConfig(6" in conversion.source


def test_layer_norm_over_two_dims_with_statistics_and_dynamic_batch():
    x = _randn(2, 3, 4)
    check(node_model("LayerNormalization", x, {"scale": _randn(3, 4)}, outputs=3, axis=1), x)


def test_instance_and_group_norm_layers():
    x = _randn(2, 6, 3, 2)
    conversion = check(node_model("InstanceNormalization", x, {"s": _randn(6), "b": _randn(6)},
                                  epsilon=1e-3), x)  # fmt: skip
    assert "InstanceNormConfig(6" in conversion.source
    conversion = check(node_model("GroupNormalization", x, {"s": _randn(6), "b": _randn(6)},
                                  opset=21, num_groups=3), x)  # fmt: skip
    assert "GroupNormConfig(3, 6" in conversion.source


def test_group_norm_of_opset_18_scales_each_group():
    x, scale, bias = _randn(2, 6, 5), _randn(3), _randn(3)
    # onnxruntime has no opset 18 kernel: compare with NumPy.
    model = node_model("GroupNormalization", x, {"s": scale, "b": bias}, opset=18, num_groups=3)
    groups = x.reshape(2, 3, -1)
    normalized = (groups - groups.mean(-1, keepdims=True)) / np.sqrt(groups.var(-1, keepdims=True)
                                                                     + 1e-5)  # fmt: skip
    expected = (normalized * scale[:, None] + bias[:, None]).reshape(x.shape)
    device = ember.device("ndarray")
    y = convert(model).build(device)(ember.Tensor.from_data(x, device)).to_numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    # The same with the scale and bias known only at run time: tensor ops, not the layer.
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)], "g",
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, v.shape)
         for n, v in (("x", x), ("s", scale), ("b", bias))],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, x.shape)],
    )  # fmt: skip
    runtime = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    conversion = convert(runtime)
    assert "GroupNorm" not in conversion.source
    inputs = [ember.Tensor.from_data(v, device) for v in (x, scale, bias)]
    np.testing.assert_allclose(conversion.build(device)(*inputs).to_numpy(), expected, rtol=1e-4,
                               atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_before_opset_13_normalizes_the_flattened_trailing_dims(op, axis):
    x = _randn(2, 3, 4)
    x[0, 1, 2] = x[0, 1, 3]  # a tie: Hardmax takes the first maximum
    check(node_model(op, x, opset=11, axis=axis), x)


def test_lp_normalization_lrn_and_mvn():
    x = _randn(2, 5, 3, 3)
    check(node_model("LpNormalization", x, axis=1, p=1), x)
    check(node_model("LRN", x, size=3, alpha=0.01, beta=0.5, bias=2.0), x)
    # An even size (onnxruntime takes odd sizes only): channels c-1 to c+2, by the spec.
    model = node_model("LRN", x, size=4, alpha=0.01, beta=0.5, bias=2.0)
    squares = np.pad(x * x, [(0, 0), (1, 2), (0, 0), (0, 0)])
    window = sum(squares[:, i : i + 5] for i in range(4))
    expected = x / (2.0 + 0.01 / 4 * window) ** 0.5
    device = ember.device("ndarray")
    got = convert(model).build(device)(ember.Tensor.from_data(x, device)).to_numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    check(node_model("MeanVarianceNormalization", x, axes=[1, 2]), x, atol=1e-4)
