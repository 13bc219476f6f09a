"""ONNX NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss on hand-built models: constant
class weights, an ignore_index outside the classes, and the gradient of the loss, checked
against onnxruntime and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime", reason="these tests compare with onnxruntime")
torch = pytest.importorskip("torch")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_node_cases import compare  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402

RNG = np.random.default_rng(5)


def _model(op: str, scores_shape, target_shape, weight=None, outputs: int = 1, **attrs):
    names = [f"y{i}" for i in range(outputs)]
    inputs = ["scores", "target"] + (["weight"] if weight is not None else [])
    graph = helper.make_graph(
        [helper.make_node(op, inputs, names, **attrs)], "g",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, scores_shape),
         helper.make_tensor_value_info("target", TensorProto.INT64, target_shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        initializer=[] if weight is None else [numpy_helper.from_array(weight, "weight")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op, reduction", [("NegativeLogLikelihoodLoss", "mean"),
                                           ("SoftmaxCrossEntropyLoss", "sum"),
                                           ("SoftmaxCrossEntropyLoss", "none")])
def test_constant_weight_and_ignore_index(op: str, reduction: str) -> None:
    scores = RNG.standard_normal((3, 4, 2, 5)).astype(np.float32)
    target = RNG.integers(0, 4, size=(3, 2, 5)).astype(np.int64)
    target[0, 1, :2] = -100
    weight = RNG.uniform(0.5, 2.0, size=4).astype(np.float32)
    outputs = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    model = _model(op, scores.shape, target.shape, weight, outputs, reduction=reduction,
                   ignore_index=-100)
    device = ember.device("ndarray")
    got = convert(model).build(device)(Tensor.from_data(scores, device),
                                       Tensor.from_data(target, device))
    got = got if isinstance(got, tuple) else (got,)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"scores": scores, "target": target})
    for i, (g, e) in enumerate(zip(got, expected)):
        compare(g.to_numpy(), e, f"output {i}")


def test_gradient_matches_torch() -> None:
    scores = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    target = np.array([[0, 2], [1, -1], [2, 2], [-1, 0]], np.int64)
    model = _model("SoftmaxCrossEntropyLoss", scores.shape, target.shape, ignore_index=-1)
    device = ember.device("ndarray").autodiff()
    x = Tensor.from_data(scores, device).require_grad()
    loss = convert(model).build(device)(x, Tensor.from_data(target, device))
    grads = loss.backward()
    t = torch.tensor(scores, requires_grad=True)
    t_loss = torch.nn.functional.cross_entropy(t, torch.tensor(target), ignore_index=-1)
    t_loss.backward()
    np.testing.assert_allclose(loss.to_numpy(), t_loss.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(x.grad(grads).to_numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)
