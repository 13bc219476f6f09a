"""ONNX activation converters on hand-built models: the ember layers they use (PRelu with
constant per-channel slopes, Dropout), attribute values off the defaults, integer Shrink
and bad attributes."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
from onnx import TensorProto, helper  # noqa: E402
from op_helpers import graph_model as _model  # noqa: E402
from op_helpers import run_model as _run  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

RNG = np.random.default_rng(13)
F32 = TensorProto.FLOAT


def _prelu(x, slope):
    return np.where(x < 0, x * slope, x)


def test_prelu_per_channel_constant_slope_is_an_ember_layer():
    slope = np.array([0.1, -0.5, 2.0], np.float32).reshape(3, 1, 1)
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], [("x", F32, ["n", 3, 2, 2])],
                   [("y", F32, ["n", 3, 2, 2])], [("s", slope)])
    x = RNG.standard_normal((2, 3, 2, 2)).astype(np.float32)
    source, y = _run(model, x)
    assert "PReluConfig(num_parameters=3).init(device)" in source
    np.testing.assert_allclose(y.to_numpy(), _prelu(x, slope), rtol=1e-6)


def test_prelu_slope_along_another_dim_is_a_masked_product():
    slope = RNG.standard_normal(4).astype(np.float32)  # broadcasts along the last dim
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], [("x", F32, [2, 3, 4])],
                   [("y", F32, [2, 3, 4])], [("s", slope)])
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    source, y = _run(model, x)
    assert "PRelu" not in source.split("class Model")[0]  # no layer imported
    np.testing.assert_allclose(y.to_numpy(), _prelu(x, slope), rtol=1e-6)


def test_dropout_is_an_ember_layer_that_drops_only_while_training():
    model = _model([helper.make_node("Dropout", ["x", "r"], ["y"])], [("x", F32, [200, 10])],
                   [("y", F32, [200, 10])], [("r", np.array(0.5, np.float32))], opset=13)
    conversion = convert(model)
    assert "DropoutConfig(0.5).init(device)" in conversion.source
    x = np.ones((200, 10), np.float32)
    inference = ember.device("ndarray")
    np.testing.assert_array_equal(conversion.build(inference)(Tensor.from_data(x, inference))
                                  .to_numpy(), x)  # fmt: skip
    training = inference.autodiff()
    y = conversion.build(training)(Tensor.from_data(x, training)).to_numpy()
    assert set(np.unique(y)) == {0.0, 2.0}


def test_dropout_v7_mask_has_the_input_type():
    model = _model([helper.make_node("Dropout", ["x"], ["y", "m"], ratio=0.3)],
                   [("x", F32, [2, 3])], [("y", F32, [2, 3]), ("m", F32, [2, 3])], opset=7)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    y, mask = _run(model, x)[1]
    np.testing.assert_array_equal(y.to_numpy(), x)
    assert mask.to_numpy().dtype == np.float32 and (mask.to_numpy() == 1).all()


def test_hard_sigmoid_at_pytorch_slope_uses_embers_function():
    model = _model([helper.make_node("HardSigmoid", ["x"], ["y"], alpha=1 / 6, beta=0.5)],
                   [("x", F32, [7])], [("y", F32, [7])])
    x = np.array([-4.0, -3.0, -1.0, 0.0, 1.0, 3.0, 4.0], np.float32)
    source, y = _run(model, x)
    assert "activation.hard_sigmoid(" in source
    np.testing.assert_allclose(y.to_numpy(), np.clip(x / 6 + 0.5, 0, 1), rtol=1e-6)


def test_swish_with_alpha():
    model = _model([helper.make_node("Swish", ["x"], ["y"], alpha=2.0)], [("x", F32, [5])],
                   [("y", F32, [5])], opset=24)
    x = RNG.standard_normal(5).astype(np.float32)
    expected = x / (1 + np.exp(-2.0 * x))
    np.testing.assert_allclose(_run(model, x)[1].to_numpy(), expected, rtol=1e-6)


def test_shrink_on_integers():
    model = _model([helper.make_node("Shrink", ["x"], ["y"], lambd=1.5, bias=1.0)],
                   [("x", TensorProto.INT32, [7])], [("y", TensorProto.INT32, [7])])
    x = np.array([-3, -2, -1, 0, 1, 2, 3], np.int32)
    expected = np.where(x < -1.5, x + 1, np.where(x > 1.5, x - 1, 0)).astype(np.int32)
    np.testing.assert_array_equal(_run(model, x)[1].to_numpy(), expected)


def test_gelu_approximate_must_be_none_or_tanh():
    model = _model([helper.make_node("Gelu", ["x"], ["y"], approximate="erf")],
                   [("x", F32, [3])], [("y", F32, [3])], opset=20)
    with pytest.raises(UnsupportedOnnxError, match=r"approximate must be 'none' or 'tanh'"):
        convert(model)
