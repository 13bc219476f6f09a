"""A small MLP and a transformer encoder layer exported from PyTorch (TorchScript exporter,
opset 17, dynamic batch) and imported with ``ember.onnx.import_onnx``: the written module,
loaded with ``load_model`` on NdArray and Torch, gives PyTorch's and onnxruntime's outputs.

An op without a converter fails the test, naming the op (the import raises
``UnsupportedOnnxError``, whose message names the node and op)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx import import_onnx, load_model  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError, canonical_domain, lookup  # noqa: E402

DEVICES = {"ndarray": lambda: ember.device("ndarray"), "torch": lambda: ember.device("torch")}
SEQ, D_MODEL = 6, 32


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(10, 24), torch.nn.GELU(), torch.nn.Linear(24, 16), torch.nn.Tanh(),
            torch.nn.Linear(16, 3),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)


class _Encoder(torch.nn.Module):
    """A ``TransformerEncoderLayer``, called with an explicit ``is_causal=False``: left to its
    default, torch 2.13's TorchScript tracer hands the attention a tensor for it and fails."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(d_model=D_MODEL, nhead=4, dim_feedforward=64,
                                                      dropout=0.0, batch_first=True)  # fmt: skip

    def forward(self, x):
        return self.layer(x, is_causal=False)


# name -> (the module, the shape of one input without its batch dim)
MODELS = {"mlp": (_Mlp, (10,)), "encoder": (_Encoder, (SEQ, D_MODEL))}


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request, tmp_path_factory):
    """(name, the eval-mode PyTorch module, its ONNX file) for each model."""
    name = request.param
    build, shape = MODELS[name]
    torch.manual_seed(5)
    net = build().eval()
    path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter warns about the fast attention path
        torch.onnx.export(net, (torch.randn(2, *shape),), str(path), dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})  # fmt: skip
    return name, net, path


def _missing_converters(path) -> list[str]:
    model = onnx.load(str(path))
    opsets = {canonical_domain(o.domain): o.version for o in model.opset_import}
    return sorted({n.op_type for n in model.graph.node
                   if lookup(n.op_type, canonical_domain(n.domain),
                             opsets.get(canonical_domain(n.domain), 1)) is None})


@pytest.fixture(scope="module")
def imported(exported, tmp_path_factory):
    name, _, path = exported
    missing = _missing_converters(path)
    assert not missing, f"the exported {name} uses ops without a converter: {', '.join(missing)}"
    folder = tmp_path_factory.mktemp(f"{name}_imported")
    try:
        import_onnx(str(path), folder, name=name)
    except UnsupportedOnnxError as error:
        pytest.fail(f"importing the exported {name} failed: {error}")
    return folder


@pytest.mark.parametrize("device_name", list(DEVICES))
@pytest.mark.parametrize("batch", [1, 3])
def test_imported_model_matches_pytorch_and_onnxruntime(exported, imported, device_name, batch):
    name, net, path = exported
    shape = MODELS[name][1]
    device = DEVICES[device_name]()
    model = load_model(imported, device, name=name)
    x = np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)
    got = model(Tensor.from_data(x, device)).to_numpy()
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


# The ember layers each imported model should hold: its matrix products by constant weights
# become Linear layers and its layer norms LayerNorm layers.
LAYERS = {"mlp": {"Linear": 3, "LayerNorm": 0}, "encoder": {"Linear": 4, "LayerNorm": 2}}


def test_constant_weights_become_ember_layers(exported, imported):
    name, _, _ = exported
    source = (imported / f"{name}.py").read_text()
    found = {layer: source.count(f": {layer}\n") for layer in LAYERS[name]}
    assert found == LAYERS[name]
