"""PyTorch's recurrent layers exported to ONNX (TorchScript exporter, opset 17) and imported
with ``ember.onnx.import_onnx``: the files it writes run on NdArray and Torch and give
PyTorch's and onnxruntime's outputs."""

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
from ember.onnx.registry import canonical_domain, lookup  # noqa: E402

BATCH, SEQ, D_IN, HIDDEN = 2, 5, 4, 6

LAYERS = {
    "lstm": lambda: torch.nn.LSTM(D_IN, HIDDEN, batch_first=True),
    "bilstm": lambda: torch.nn.LSTM(D_IN, HIDDEN, batch_first=True, bidirectional=True),
    "gru": lambda: torch.nn.GRU(D_IN, HIDDEN, batch_first=True),
}
# The ember layer each export should become.
EMBER_LAYER = {"lstm": "Lstm", "bilstm": "BiLstm", "gru": "Gru"}
DEVICES = {"ndarray": lambda: ember.device("ndarray"), "torch": lambda: ember.device("torch")}


@pytest.fixture(params=list(DEVICES))
def device(request):
    return DEVICES[request.param]()


@pytest.fixture(scope="module", params=list(LAYERS))
def exported(request, tmp_path_factory):
    """(name, ONNX file, input, PyTorch's outputs) for one layer with seeded weights."""
    name = request.param
    torch.manual_seed(11)
    layer = LAYERS[name]().eval()
    x = torch.randn(BATCH, SEQ, D_IN)
    outputs = ["y", "h"] if name == "gru" else ["y", "h", "c"]
    path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter warns about batch_first and RNN sizes
        torch.onnx.export(layer, (x,), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=outputs)
    with torch.no_grad():
        y, state = layer(x)
    states = [state] if name == "gru" else list(state)
    expected = [t.numpy() for t in (y, *states)]
    return name, path, x.numpy(), expected


def _missing_converter(model) -> str | None:
    """An op of the exported graph that no converter serves yet (another family's)."""
    opsets = {canonical_domain(o.domain): o.version for o in model.opset_import}
    for node in model.graph.node:
        domain = canonical_domain(node.domain)
        if lookup(node.op_type, domain, opsets.get(domain, 1)) is None:
            return node.op_type
    return None


def test_exported_layer_imports_and_matches(exported, device, tmp_path):
    name, path, x, expected = exported
    model = onnx.load(str(path))
    missing = _missing_converter(model)
    if missing is not None:
        pytest.skip(f"the export uses {missing}, which has no converter yet")
    result = import_onnx(str(path), tmp_path / "imported", name=name)
    source = result.code.read_text()
    assert f": {EMBER_LAYER[name]}\n" in source, "the constant weights should make an ember layer"
    imported = load_model(tmp_path / "imported", device, name=name)
    got = imported(Tensor.from_data(x, device))
    got = got if isinstance(got, tuple) else (got,)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    from_ort = session.run(None, {"x": x})
    assert len(got) == len(expected) == len(from_ort)
    for i, (g, want, other) in enumerate(zip(got, expected, from_ort)):
        g = g.to_numpy()
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6, err_msg=f"{name} output {i}")
        np.testing.assert_allclose(g, other, rtol=1e-4, atol=1e-6, err_msg=f"{name} output {i}")
