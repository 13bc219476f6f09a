"""Conv, ConvTranspose and pooling converters on what the node suite leaves out: constant
weights (ember's layers), 1-d and 3-d, asymmetric pads, groups, Indices, int inputs."""

from __future__ import annotations

import numpy as np
import pytest
from op_helpers import check, node_model, onnx, ort

import ember
from ember.onnx.importer import convert
from ember.onnx.registry import UnsupportedOnnxError

RNG = np.random.default_rng(11)


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("device_name", ["ndarray", "torch"])
def test_conv2d_layer_with_asymmetric_pads_and_groups(device_name):
    x = _randn(2, 4, 7, 6)
    model = node_model("Conv", x, {"w": _randn(6, 2, 3, 2), "b": _randn(6)}, group=2,
                       pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2])
    conversion = check(model, x, device_name)
    assert "Conv2dConfig(channels=(4, 6)" in conversion.source  # ember's layer, not F.conv2d
    assert "groups=2" in conversion.source and ".pad(" in conversion.source


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv1d_and_conv3d_layers_with_auto_pad(auto_pad):
    x1 = _randn(1, 2, 9)
    check(node_model("Conv", x1, {"w": _randn(3, 2, 4)}, auto_pad=auto_pad, strides=[2]), x1)
    x3 = _randn(1, 2, 5, 4, 6)
    conversion = check(node_model("Conv", x3, {"w": _randn(3, 2, 2, 3, 2), "b": _randn(3)},
                                  auto_pad=auto_pad), x3)  # fmt: skip
    assert "Conv3d" in conversion.source


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_weights_known_at_run_time_use_the_functional_ops(op):
    x, w, b = _randn(1, 2, 5, 5), _randn(2, 2, 3, 3), _randn(2)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node(op, ["x", "w", "b"], ["y"], pads=[1, 0, 0, 1], strides=[2, 1])],
        "g", [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, v.shape)
              for n, v in (("x", x), ("w", w), ("b", b))],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    conversion = convert(model)
    assert f"F.{'conv' if op == 'Conv' else 'conv_transpose'}2d(" in conversion.source
    device = ember.device("ndarray")
    got = conversion.build(device)(*(ember.Tensor.from_data(v, device) for v in (x, w, b)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x, "w": w, "b": b})[0]
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"strides": [2, 2], "output_padding": [1, 0], "pads": [1, 0, 0, 1]},
    {"strides": [3, 2], "output_shape": [10, 8]},
    {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"group": 2, "dilations": [2, 1], "pads": [2, 1, 0, 0]},
])  # fmt: skip
def test_conv_transpose2d_layer(attrs):
    x = _randn(2, 4, 3, 4)
    conversion = check(node_model("ConvTranspose", x, {"w": _randn(4, 3, 3, 3), "b": _randn(
        3 * attrs.get("group", 1))}, **attrs), x)  # fmt: skip
    assert "ConvTranspose2dConfig" in conversion.source or "F.conv_transpose2d" in conversion.source


def test_conv_transpose_1d_and_3d_layers():
    x1 = _randn(1, 3, 5)
    conversion = check(node_model("ConvTranspose", x1, {"w": _randn(3, 2, 3)}, strides=[2],
                                  output_padding=[1]), x1)  # fmt: skip
    assert "ConvTranspose1dConfig(channels=(3, 2), kernel_size=3, stride=2, padding_out=1" \
        in conversion.source
    x3 = _randn(1, 2, 3, 2, 3)
    check(node_model("ConvTranspose", x3, {"w": _randn(2, 2, 2, 2, 2), "b": _randn(2)},
                     strides=[2, 1, 2], pads=[1, 0, 0, 0, 1, 1]), x3)  # fmt: skip


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 0, 0, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "dilations": [2, 1]},
    {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
])  # fmt: skip
def test_average_pool_composed_from_a_convolution(attrs):
    x = _randn(2, 3, 7, 8)
    check(node_model("AveragePool", x, opset=19, **attrs), x)


def test_max_pool_3d_asymmetric_and_1d_ceil():
    x3 = _randn(1, 2, 6, 5, 7)
    check(node_model("MaxPool", x3, kernel_shape=[2, 3, 2], strides=[2, 1, 2],
                     pads=[0, 1, 1, 1, 0, 0], ceil_mode=1), x3)  # fmt: skip
    x1 = _randn(2, 3, 10)
    conversion = check(node_model("MaxPool", x1, kernel_shape=[3], strides=[2], ceil_mode=1), x1)
    assert "F.max_pool1d" in conversion.source


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(storage_order):
    x = _randn(2, 3, 6, 5)
    check(node_model("MaxPool", x, outputs=2, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 1, 1, 1],
                     storage_order=storage_order), x)  # fmt: skip


def test_max_pool_indices_with_uneven_pads_is_unsupported():
    x = _randn(1, 1, 4, 4)
    with pytest.raises(UnsupportedOnnxError, match="Indices output"):
        check(node_model("MaxPool", x, outputs=2, kernel_shape=[2, 2], pads=[1, 0, 0, 0]), x)


def test_max_pool_of_uint8_and_lp_pool():
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    check(node_model("MaxPool", x, kernel_shape=[2, 2], pads=[0, 0, 1, 1]), x)
    xf = _randn(1, 2, 5, 6)
    check(node_model("LpPool", xf, opset=18, kernel_shape=[2, 3], p=3, strides=[2, 2],
                     ceil_mode=1), xf)  # fmt: skip
    check(node_model("GlobalMaxPool", xf), xf)
    check(node_model("GlobalLpPool", xf, p=3), xf)
    check(node_model("GlobalLpPool", xf), xf)
