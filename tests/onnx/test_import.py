"""ONNX import of small hand-built models: constants, dynamic dims, folding, errors, the
generated code, training through it and saving it."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.cli import main as cli_main  # noqa: E402
from ember.onnx.coverage import coverage, coverage_table  # noqa: E402
from ember.onnx.importer import convert, import_onnx, load_model  # noqa: E402
from ember.onnx.registry import OnnxFileNotFoundError, OnnxImportError, UnsupportedOnnxError  # noqa: E402
from ember.record import BinFileRecorder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((3, 4)).astype(np.float32)
B1 = RNG.standard_normal(4).astype(np.float32)
W2 = RNG.standard_normal((2, 4)).astype(np.float32)  # used with transB=1: [out, in]
B2 = RNG.standard_normal(2).astype(np.float32)


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "test_graph", inputs, outputs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _float(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _mlp(batch="batch"):
    """Gemm (weights as initializers) -> Relu -> Add of a Constant node -> Gemm (transB)."""
    shift = numpy_helper.from_array(np.full(4, 0.25, np.float32))
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="/fc1/Gemm"),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Constant", [], ["shift"], value=shift),
        helper.make_node("Add", ["r", "shift"], ["s"]),
        helper.make_node("Gemm", ["s", "w2", "b2"], ["y"], name="/fc2/Gemm", transB=1),
    ]
    return _model(nodes, [_float("x", [batch, 3])], [_float("y", [batch, 2])],
                  [("w1", W1), ("b1", B1), ("w2", W2), ("b2", B2)])


def _mlp_reference(x: np.ndarray) -> np.ndarray:
    return (np.maximum(x @ W1 + B1, 0) + 0.25) @ W2.T + B2


DEVICES = {"ndarray": lambda: ember.device("ndarray"), "torch": lambda: ember.device("torch")}


@pytest.fixture(params=list(DEVICES))
def device(request):
    return DEVICES[request.param]()


def test_initializers_and_constant_nodes(device):
    conversion = convert(_mlp())
    assert "fc1_gemm: Linear" in conversion.source and "fc2_gemm: Linear" in conversion.source
    assert "shift: Param" in conversion.source  # the Constant node became a field
    model = conversion.build(device)
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    y = model(Tensor.from_data(x, device)).to_numpy()
    np.testing.assert_allclose(y, _mlp_reference(x), rtol=1e-5, atol=1e-5)


def test_dynamic_batch_stays_dynamic(device):
    conversion = convert(_mlp())
    assert "x: f32 [batch, 3]" in conversion.source
    model = conversion.build(device)
    for batch in (1, 7):
        x = RNG.standard_normal((batch, 3)).astype(np.float32)
        y = model(Tensor.from_data(x, device)).to_numpy()
        np.testing.assert_allclose(y, _mlp_reference(x), rtol=1e-5, atol=1e-5)


def _shape_arithmetic(dims):
    """y = reshape(x, [shape(x)[0], -1]): the pattern exporters write for a flatten."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Constant", [], ["zero"], value_int=0),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    return _model(nodes, [_float("x", dims)], [_float("y", None)],
                  [("axes", np.array([0], np.int64)), ("minus_one", np.array([-1], np.int64))])


def test_shape_arithmetic_folds_to_literals():
    conversion = convert(_shape_arithmetic([2, 3, 4]))
    body = conversion.source.split("def forward", 1)[1].split("def build", 1)[0]
    assert "y = x.reshape([2, 12])" in body
    assert "rt.shape" not in body and "Tensor.cat" not in body
    model = conversion.build(ember.device("ndarray"))
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(model(Tensor.from_data(x)).to_numpy(), x.reshape(2, 12))


@pytest.mark.parametrize("on_host", [True, False])
def test_shape_arithmetic_with_a_dynamic_dim_runs_at_runtime(device, on_host, monkeypatch):
    monkeypatch.setenv("EMBER_ONNX_HOST", "1" if on_host else "0")
    conversion = convert(_shape_arithmetic(["n", 3, 4]))
    # On the host (ember.onnx.host) by default; as tensor ops with EMBER_ONNX_HOST=0.
    assert ("host.run('Shape', 17, [x], {})" in conversion.source) == on_host
    assert ("rt.shape(x)" in conversion.source) != on_host
    model = conversion.build(device)
    for n in (1, 3):
        x = RNG.standard_normal((n, 3, 4)).astype(np.float32)
        np.testing.assert_array_equal(model(Tensor.from_data(x, device)).to_numpy(),
                                      x.reshape(n, 12))


def test_a_mistyped_host_setting_names_itself(monkeypatch):
    monkeypatch.setenv("EMBER_ONNX_HOST", "maybe")
    with pytest.raises(ember.ConfigError, match=r"^EMBER_ONNX_HOST='maybe': expected 1 \(on\)"):
        convert(_shape_arithmetic(["n", 3, 4]))


def test_nodes_on_constants_fold_at_import():
    # Transpose of a weight and a Gemm of constants only: no code is left for them.
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"]),
        helper.make_node("MatMul", ["c", "wt"], ["folded"]),
        helper.make_node("Add", ["x", "folded"], ["y"]),
    ]
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    c = RNG.standard_normal((2, 3)).astype(np.float32)
    model = _model(nodes, [_float("x", [2, 4])], [_float("y", [2, 4])], [("w", w), ("c", c)])
    conversion = convert(model)
    assert "Linear" not in conversion.source and "permute" not in conversion.source
    assert "folded: Param" in conversion.source
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    got = conversion.build(ember.device("ndarray"))(Tensor.from_data(x)).to_numpy()
    np.testing.assert_allclose(got, x + c @ w.T, rtol=1e-5, atol=1e-6)


def test_legacy_broadcast_with_axis():
    nodes = [helper.make_node("Add", ["x", "b"], ["y"], broadcast=1, axis=1)]
    b = np.arange(3, dtype=np.float32)
    model = _model(nodes, [_float("x", [2, 3, 4])], [_float("y", [2, 3, 4])], [("b", b)], opset=6)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    got = convert(model).build(ember.device("ndarray"))(Tensor.from_data(x)).to_numpy()
    np.testing.assert_allclose(got, x + b[:, None], rtol=1e-6)


def test_unsupported_op_error_names_node_op_and_opset():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("FancyOp", ["r"], ["y"], name="my_fancy_node")]
    model = _model(nodes, [_float("x", [2])], [_float("y", [2])], opset=15)
    with pytest.raises(UnsupportedOnnxError) as info:
        convert(model)
    message = str(info.value)
    assert "'my_fancy_node'" in message and "FancyOp" in message and "opset 15" in message
    assert "converter" in message and "needed" in message
    assert (info.value.node, info.value.op_type, info.value.opset) == ("my_fancy_node", "FancyOp", 15)
    assert isinstance(info.value, NotImplementedError) and isinstance(info.value, ember.EmberError)


def test_unsupported_attribute_error_lists_the_supported_ones():
    nodes = [helper.make_node("Flatten", ["x"], ["y"], axis=1, mystery=3)]
    model = _model(nodes, [_float("x", [2, 3])], [_float("y", [2, 3])])
    with pytest.raises(UnsupportedOnnxError, match=r"attribute 'mystery' is not supported "
                                                    r"\(supported attributes: axis\)"):
        convert(model)


def test_dead_nodes_are_not_translated():
    nodes = [helper.make_node("FancyOp", ["x"], ["unused"]), helper.make_node("Neg", ["x"], ["y"])]
    model = _model(nodes, [_float("x", [2])], [_float("y", [2])])
    got = convert(model).build(ember.device("ndarray"))(Tensor.from_data([1.0, -2.0]))
    assert got.tolist() == [-1.0, 2.0]


def test_bad_model_bytes_raise_import_error():
    with pytest.raises(OnnxImportError, match="not an ONNX model"):
        from ember.onnx.ir import parse

        parse(Path(__file__))


def test_missing_files_raise_a_typed_error(tmp_path):
    with pytest.raises(OnnxFileNotFoundError, match="no model file"):
        convert(tmp_path / "absent.onnx")
    with pytest.raises(FileNotFoundError, match="no generated module"):
        load_model(tmp_path)
    with pytest.raises(OnnxImportError, match="not a Python identifier"):
        convert(_mlp(), name="not-a-name")


def test_generated_code_is_ruff_clean(tmp_path):
    result = import_onnx(_shape_arithmetic(["n", 3, 4]), tmp_path / "pkg", name="flat")
    import_onnx(_mlp(), tmp_path / "pkg", name="mlp")
    files = [str(result.code), str(tmp_path / "pkg" / "mlp.py")]
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                          str(ROOT / "pyproject.toml"), *files],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    source = (tmp_path / "pkg" / "mlp.py").read_text()
    assert "class Model(ImportedModel):" in source and "def forward(self, x: Tensor) -> Tensor:" in source


def _torch_mlp_loss_and_grads(x: np.ndarray):
    torch = pytest.importorskip("torch")
    w1 = torch.tensor(W1, requires_grad=True)
    w2 = torch.tensor(W2, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    y = (torch.relu(xt @ w1 + torch.tensor(B1)) + 0.25) @ w2.T + torch.tensor(B2)
    (y * y).sum().backward()
    return w1.grad.numpy(), w2.grad.numpy(), xt.grad.numpy()


def test_gradients_flow_through_the_generated_model(device):
    device = device.autodiff()
    model = convert(_mlp()).build(device)
    x_np = RNG.standard_normal((4, 3)).astype(np.float32)
    x = Tensor.from_data(x_np, device).require_grad()
    y = model(x)
    grads = (y * y).sum().backward()
    w1, w2, gx = _torch_mlp_loss_and_grads(x_np)
    # Linear stores [d_input, d_output]: fc1 holds W1 as is, fc2 holds W2 transposed.
    np.testing.assert_allclose(model.fc1_gemm.weight.val().grad(grads).to_numpy(), w1,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.fc2_gemm.weight.val().grad(grads).to_numpy(), w2.T,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(x.grad(grads).to_numpy(), gx, rtol=1e-4, atol=1e-5)
    assert model.shift.val().grad(grads) is None  # Constant nodes are not trained


def test_initializer_params_are_trainable_and_int_constants_are_not(monkeypatch):
    # Shape arithmetic on the host reads its small constants as literals: no params.
    model = convert(_shape_arithmetic(["n", 3, 4])).build(ember.device("ndarray"))
    assert dict(model.params()) == {}
    monkeypatch.setenv("EMBER_ONNX_HOST", "0")
    model = convert(_shape_arithmetic(["n", 3, 4])).build(ember.device("ndarray"))
    # "axes" is read at import time (Unsqueeze's axes); only "minus_one" is read at run time.
    assert {path: p.require_grad for path, p in model.params()} == {"minus_one": False}
    mlp = convert(_mlp()).build(ember.device("ndarray"))
    assert all(p.require_grad for path, p in mlp.params() if path != "shift")


def test_import_save_and_load_with_recorders(tmp_path, device):
    result = import_onnx(_mlp(), tmp_path, name="mlp")
    assert result.code.is_file() and result.weights == tmp_path / "mlp.mpk"
    assert result.inputs == ("x",) and result.outputs == ("y",)
    model = load_model(tmp_path, device, name="mlp")
    x = RNG.standard_normal((3, 3)).astype(np.float32)
    expected = _mlp_reference(x)
    np.testing.assert_allclose(model(Tensor.from_data(x, device)).to_numpy(), expected,
                               rtol=1e-5, atol=1e-5)
    path = model.save_file(tmp_path / "again", BinFileRecorder())
    fresh = sys.modules[type(model).__module__].build(device)
    reloaded = fresh.load_file(path, BinFileRecorder())
    np.testing.assert_allclose(reloaded(Tensor.from_data(x, device)).to_numpy(), expected,
                               rtol=1e-5, atol=1e-5)


def test_double_precision_weights_keep_their_precision(tmp_path):
    w = np.array([[1.0 + 1e-12]], np.float64)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 1])],
                   [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 1])], [("w", w)])
    import_onnx(model, tmp_path)
    assert "DoublePrecision" in (tmp_path / "model.py").read_text()
    loaded = load_model(tmp_path, ember.device("ndarray"))
    got = loaded(Tensor.from_data(np.ones((1, 1)))).to_numpy()
    assert got.dtype == np.float64 and got[0, 0] == w[0, 0]


def test_torch_exported_mlp_matches_torch_and_onnxruntime(device):
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3),
                              torch.nn.Sigmoid())  # fmt: skip
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(2, 6),), buffer, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    model = convert(buffer.getvalue()).build(device)
    got = model(Tensor.from_data(x, device)).to_numpy()
    with torch.no_grad():
        np.testing.assert_allclose(got, net(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_coverage_table_lists_supported_and_unsupported_ops():
    rows = {r.op: r for r in coverage()}
    assert rows["Add"].since == (1, 7) and rows["Add"].status == "supported"
    assert rows["Constant"].status == "partial" and "sparse" in rows["Constant"].limits
    assert rows["SequenceAt"].limits == "out of scope: sequence op"
    table = coverage_table()
    assert "| Gemm | ai.onnx | 1 | supported |  |" in table


def test_cli_imports_and_reports_errors(tmp_path, capsys):
    onnx.save(_mlp(), str(tmp_path / "mlp.onnx"))
    assert cli_main(["import", str(tmp_path / "mlp.onnx"), "--out", str(tmp_path / "out"),
                     "--name", "net"]) == 0  # fmt: skip
    assert (tmp_path / "out" / "net.py").is_file() and (tmp_path / "out" / "net.mpk").is_file()
    bad = _model([helper.make_node("FancyOp", ["x"], ["y"])], [_float("x", [1])],
                 [_float("y", [1])])  # fmt: skip
    onnx.save(bad, str(tmp_path / "bad.onnx"))
    assert cli_main(["import", str(tmp_path / "bad.onnx"), "--out", str(tmp_path / "b")]) == 1
    assert "FancyOp" in capsys.readouterr().err
