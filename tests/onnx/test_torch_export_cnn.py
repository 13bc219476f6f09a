"""A small PyTorch CNN exported to ONNX (TorchScript exporter, opset 17, dynamic batch),
imported with ember.onnx: it matches PyTorch and onnxruntime on NdArray and Torch, and
trains (gradients reach its parameters)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import import_onnx, load_model  # noqa: E402

DEVICES = {"ndarray": lambda: ember.device("ndarray"), "torch": lambda: ember.device("torch")}


class _Cnn(torch.nn.Module):
    """conv -> batch norm -> relu -> max pool -> conv -> relu -> global average pool ->
    flatten -> linear -> softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(6)
        self.conv2 = torch.nn.Conv2d(6, 8, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.norm(self.conv1(x))), 2)
        x = torch.relu(self.conv2(x))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return torch.softmax(self.fc(x), dim=1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The CNN (eval mode, non-trivial running statistics), its ONNX file, and the
    imported module's folder."""
    torch.manual_seed(0)
    net = _Cnn()
    with torch.no_grad():
        net.norm.running_mean.uniform_(-0.5, 0.5)
        net.norm.running_var.uniform_(0.5, 2.0)
        net.norm.weight.uniform_(0.5, 1.5)
        net.norm.bias.uniform_(-0.2, 0.2)
    net.eval()
    folder = tmp_path_factory.mktemp("cnn")
    path = folder / "cnn.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # PRESERVE keeps the BatchNormalization node (EVAL would fold it into the conv).
        torch.onnx.export(net, (torch.randn(2, 3, 12, 12),), str(path), dynamo=False,
                          opset_version=17, training=torch.onnx.TrainingMode.PRESERVE,
                          input_names=["image"], output_names=["probs"],
                          dynamic_axes={"image": {0: "batch"}, "probs": {0: "batch"}})  # fmt: skip
    import_onnx(path, folder / "imported", name="cnn")
    return net, path, folder / "imported"


def test_export_has_the_ops_under_test(exported):
    _, path, folder = exported
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert {"Conv", "BatchNormalization", "MaxPool", "GlobalAveragePool", "Softmax"} <= ops
    source = (folder / "cnn.py").read_text()
    assert "Conv2d" in source and "BatchNorm" in source and "F.max_pool2d" in source


@pytest.mark.parametrize("device_name", list(DEVICES))
@pytest.mark.parametrize("batch", [1, 4])
def test_matches_pytorch_and_onnxruntime(exported, device_name, batch):
    net, path, folder = exported
    device = DEVICES[device_name]()
    model = load_model(folder, device, name="cnn")
    x = np.random.default_rng(batch).standard_normal((batch, 3, 12, 12)).astype(np.float32)
    got = model(Tensor.from_data(x, device)).to_numpy()
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    assert got.shape == (batch, 5)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {"image": x})[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device_name", list(DEVICES))
def test_gradients_reach_the_parameters(exported, device_name):
    _, _, folder = exported
    device = DEVICES[device_name]().autodiff()
    model = load_model(folder, device, name="cnn")
    x = np.random.default_rng(3).standard_normal((3, 3, 12, 12)).astype(np.float32)
    probs = model(Tensor.from_data(x, device))
    target = Tensor.from_data(np.eye(5, dtype=np.float32)[[0, 2, 4]], device)
    grads = (-(probs.log() * target).sum()).backward()
    trainable = [(path, p) for path, p in model.params() if p.require_grad]
    assert len(trainable) >= 8  # two convs, batch norm scale and shift, the linear layer
    for path, param in trainable:
        grad = param.val().grad(grads)
        assert grad is not None, f"no gradient for {path}"
        assert grad.shape == param.shape
        assert np.abs(grad.to_numpy()).sum() > 0, f"zero gradient for {path}"
