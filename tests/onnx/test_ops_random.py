"""ONNX random converters (RandomNormal, RandomUniform, their Like forms, Multinomial): the
node suite skips random ops, so these tests check the samples' statistics, dtypes, shapes,
and that every call draws afresh (the seed attribute is ignored)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
from onnx import TensorProto, helper  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

F32, F64, F16 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16


def _model(node, inputs, output, opset=17):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*output)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _call(model, *inputs):
    device = ember.device("ndarray")
    net = convert(model).build(device)
    return lambda: net(*(Tensor.from_data(x, device) for x in inputs)).to_numpy()


def test_random_normal_statistics_shape_and_dtype():
    node = helper.make_node("RandomNormal", [], ["y"], shape=[200, 100], mean=3.0, scale=2.0,
                            dtype=F64, seed=1.0)
    draw = _call(_model(node, [], ("y", F64, [200, 100])))
    y = draw()
    assert y.shape == (200, 100) and y.dtype == np.float64
    assert abs(y.mean() - 3.0) < 0.05 and abs(y.std() - 2.0) < 0.05
    # The seed attribute is ignored: a second call draws other values.
    assert not np.array_equal(y, draw())


def test_random_uniform_statistics_and_default_dtype():
    node = helper.make_node("RandomUniform", [], ["y"], shape=[100, 200], low=-1.0, high=3.0)
    y = _call(_model(node, [], ("y", F32, [100, 200])))()
    assert y.shape == (100, 200) and y.dtype == np.float32
    assert y.min() >= -1.0 and y.max() < 3.0
    assert abs(y.mean() - 1.0) < 0.05 and abs(y.std() - 4 / np.sqrt(12)) < 0.05


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
def test_like_ops_follow_the_input_shape_and_dtype_attribute(op):
    x = np.zeros((50, 40), np.float32)
    node = helper.make_node(op, ["x"], ["y"], dtype=F16)
    y = _call(_model(node, [("x", F32, [50, 40])], ("y", F16, [50, 40])), x)()
    assert y.shape == (50, 40) and y.dtype == np.float16
    expected_mean, expected_std = (0.0, 1.0) if op == "RandomNormalLike" else (0.5, 12 ** -0.5)
    # Unseeded draws of 2000 values: bounds of 5 standard errors (the sample mean's and,
    # as for a normal draw, the sample deviation's), which a correct op misses about once
    # in 1.7 million runs; 0.06 was 2.7 of them for the mean (a failure in 150 runs).
    values = y.astype(np.float64)
    assert abs(values.mean() - expected_mean) < 5 * expected_std / np.sqrt(values.size)
    assert abs(values.std() - expected_std) < 5 * expected_std / np.sqrt(2 * values.size)


def test_like_op_keeps_the_input_dtype_by_default():
    x = np.zeros((3, 4), np.float64)
    node = helper.make_node("RandomUniformLike", ["x"], ["y"], low=5.0, high=6.0)
    y = _call(_model(node, [("x", F64, [3, 4])], ("y", F64, [3, 4])), x)()
    assert y.dtype == np.float64 and ((y >= 5.0) & (y < 6.0)).all()


def test_multinomial_frequencies_follow_the_probabilities():
    probs = np.array([[0.1, 0.6, 0.3], [0.7, 0.0, 0.3]])
    logits = np.log(np.maximum(probs, 1e-30)).astype(np.float32) + 2.0  # unnormalized
    node = helper.make_node("Multinomial", ["x"], ["y"], sample_size=4000, dtype=TensorProto.INT64)
    y = _call(_model(node, [("x", F32, [2, 3])], ("y", TensorProto.INT64, [2, 4000])), logits)()
    assert y.shape == (2, 4000) and y.dtype == np.int64
    freq = np.stack([np.bincount(row, minlength=3) / 4000 for row in y])
    np.testing.assert_allclose(freq, probs, atol=0.03)
    assert (y[1] != 1).all()


def test_multinomial_default_dtype_is_int32():
    node = helper.make_node("Multinomial", ["x"], ["y"])
    y = _call(_model(node, [("x", F32, [2, 5])], ("y", TensorProto.INT32, [2, 1])),
              np.zeros((2, 5), np.float32))()
    assert y.shape == (2, 1) and y.dtype == np.int32 and ((y >= 0) & (y < 5)).all()


def test_integer_dtype_is_unsupported():
    node = helper.make_node("RandomNormal", [], ["y"], shape=[2], dtype=TensorProto.INT32)
    with pytest.raises(UnsupportedOnnxError, match="must name a float type"):
        convert(_model(node, [], ("y", TensorProto.INT32, [2])))
