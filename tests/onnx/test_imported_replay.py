"""Imported models replay on a fusion device (``ember.onnx.imported``): the same results as
``forward`` and onnxruntime, new weights honoured, and plain calls everywhere else."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
pytest.importorskip("numba", reason="replaying runs on the numba fusion runtime (ember[jit])")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.backends.fusion import reset_stats, stats  # noqa: E402
from ember.onnx.imported import ImportedModel  # noqa: E402
from ember.onnx.importer import import_onnx, load_model  # noqa: E402

RNG = np.random.default_rng(3)
W = RNG.standard_normal((5, 4)).astype(np.float32)
B = RNG.standard_normal(4).astype(np.float32)


def _graph(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _dense():
    """relu(x @ W + B) * 0.5, from [batch, 5] to [batch, 4]."""
    half = numpy_helper.from_array(np.array(0.5, np.float32))
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Constant", [], ["half"], value=half),
             helper.make_node("Mul", ["r", "half"], ["y"])]  # fmt: skip
    return _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                  [("w", W), ("b", B)])  # fmt: skip


def _reference(x: np.ndarray, w: np.ndarray = W) -> np.ndarray:
    return np.maximum(x.astype(np.float64) @ w + B, 0) * 0.5


@pytest.fixture
def dense(tmp_path):
    import_onnx(_dense().SerializeToString(), tmp_path / "dense", name="dense")
    return lambda device: load_model(tmp_path / "dense", device, name="dense")


def test_generated_model_is_an_imported_model(dense):
    assert isinstance(dense(ember.device("ndarray")), ImportedModel)


def test_calls_on_fusion_replay_with_the_results_of_forward(dense):
    device = ember.device("ndarray").fusion()
    model = dense(device)
    reset_stats()
    for step in range(5):
        x = RNG.standard_normal((3, 5)).astype(np.float32)
        got = model(Tensor.from_data(x, device)).to_numpy()
        np.testing.assert_allclose(got, _reference(x), rtol=1e-5, atol=1e-6,
                                   err_msg=f"call {step}")  # fmt: skip
    counted = stats()
    assert counted["traces"] == 1  # the second call traced; the first ran plainly
    assert counted["replays"] == 3  # calls 3 to 5


def test_new_weights_are_used(dense):
    device = ember.device("ndarray").fusion()
    model = dense(device)
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    inputs = Tensor.from_data(x, device)
    for _ in range(3):
        model(inputs).to_numpy()
    doubled = model.map(lambda path, p: p.with_value(p.val() * 2.0) if path.endswith("weight")
                        else p)  # fmt: skip
    reset_stats()
    got = doubled(inputs).to_numpy()
    np.testing.assert_allclose(got, _reference(x, 2.0 * W), rtol=1e-5, atol=1e-6)
    assert stats()["replays"] == 1  # the same trace, the new module's weights as its inputs
    np.testing.assert_allclose(model(inputs).to_numpy(), _reference(x), rtol=1e-5, atol=1e-6)


def test_a_new_input_shape_warms_up_and_traces_again(dense):
    device = ember.device("ndarray").fusion()
    model = dense(device)
    reset_stats()
    for batch in (2, 2, 2, 7, 7, 7):
        x = RNG.standard_normal((batch, 5)).astype(np.float32)
        got = model(Tensor.from_data(x, device)).to_numpy()
        np.testing.assert_allclose(got, _reference(x), rtol=1e-5, atol=1e-6)
    assert (stats()["traces"], stats()["replays"]) == (2, 2)


@pytest.mark.parametrize("device_name", ["ndarray", "autodiff-fusion"])
def test_other_devices_call_forward(dense, device_name):
    """Elsewhere a call is forward: no trace, and under Autodiff gradients reach the
    weights on every call (a replay would return untracked outputs)."""
    if device_name == "ndarray":
        device = ember.device("ndarray")
    else:
        device = ember.device("ndarray").fusion().autodiff()
    model = dense(device)
    reset_stats()
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    for _ in range(4):
        y = model(Tensor.from_data(x, device))
        np.testing.assert_allclose(y.to_numpy(), _reference(x), rtol=1e-5, atol=1e-6)
        if device_name != "ndarray":
            grads = y.sum().backward()
            weight = dict(model.params())["gemm_0.weight"]  # [in, out], as x @ W
            relu_open = (x.astype(np.float64) @ W + B > 0).astype(np.float64)
            np.testing.assert_allclose(weight.val().grad(grads).to_numpy(),
                                       x.astype(np.float64).T @ (relu_open * 0.5),
                                       rtol=1e-4, atol=1e-5)  # fmt: skip
    assert stats().get("traces", 0) == 0


def test_replay_off_by_environment(dense, monkeypatch):
    monkeypatch.setenv("EMBER_FUSION_REPLAY", "0")
    device = ember.device("ndarray").fusion()
    model = dense(device)
    reset_stats()
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    for _ in range(4):
        np.testing.assert_allclose(model(Tensor.from_data(x, device)).to_numpy(),
                                   _reference(x), rtol=1e-5, atol=1e-6)  # fmt: skip
    assert (stats()["traces"], stats()["replays"]) == (0, 0)


def test_a_graph_whose_shapes_follow_values_runs_plainly(tmp_path):
    """NonZero's output shape depends on the values: the trace is refused and every call
    runs plainly, with each call's own result."""
    nodes = [helper.make_node("NonZero", ["x"], ["y"])]
    model_proto = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                         [helper.make_tensor_value_info("y", TensorProto.INT64, [1, None])])
    import_onnx(model_proto.SerializeToString(), tmp_path / "nz", name="nz")
    device = ember.device("ndarray").fusion()
    model = load_model(tmp_path / "nz", device, name="nz")
    reset_stats()
    for values in ([0, 1, 0, 2, 0, 3], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 5], [1] * 6):
        x = np.array(values, np.float32)
        got = model(Tensor.from_data(x, device)).to_numpy()
        np.testing.assert_array_equal(got, np.stack(np.nonzero(x)))
    assert stats()["replays"] == 0
