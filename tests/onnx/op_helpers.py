"""Single-node ONNX models for the converter tests: built, imported and compared with
onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_node_cases import compare  # noqa: E402

import ember  # noqa: E402
from ember.onnx.importer import Conversion, convert  # noqa: E402

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
          np.dtype(np.int64): TensorProto.INT64, np.dtype(np.uint8): TensorProto.UINT8}


def node_model(op: str, x: np.ndarray, constants: dict[str, np.ndarray | None] | None = None,
               opset: int = 17, outputs: int = 1, **attrs) -> bytes:  # fmt: skip
    """A model of one ``op`` node: graph input ``x`` (dynamic batch), then ``constants`` as
    initializers in input order (None: an absent optional input)."""
    constants = constants or {}
    inputs = ["x"] + [name if value is not None else "" for name, value in constants.items()]
    names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, inputs, names, **attrs)
    shape = ["batch", *x.shape[1:]]
    graph = helper.make_graph(
        [node], "node", [helper.make_tensor_value_info("x", _TYPES[x.dtype], shape)],
        [helper.make_empty_tensor_value_info(n) for n in names],
        initializer=[numpy_helper.from_array(v, k) for k, v in constants.items() if v is not None],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model = onnx.shape_inference.infer_shapes(model)
    return model.SerializeToString()


def check(model: bytes, x: np.ndarray, device_name: str = "ndarray", rtol: float = 1e-4,
          atol: float = 1e-5) -> Conversion:  # fmt: skip
    """Imports ``model``, runs it on ``x`` and compares every output with onnxruntime."""
    conversion = convert(model)
    device = ember.device(device_name)
    got = conversion.build(device)(ember.Tensor.from_data(x, device))
    got = got if isinstance(got, tuple) else (got,)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = g.to_numpy()
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return conversion


def graph_model(nodes, inputs, outputs, constants=(), opset: int = 17):
    """A model of ``nodes``: inputs and outputs are ``(name, elem_type, dims)``, constants
    ``(name, array)`` pairs stored as initializers."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in constants])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_model(model, *inputs, device=None):
    """Imports ``model`` and runs it on ``inputs``: ``(generated source, outputs)``."""
    conversion = convert(model)
    device = device or ember.device("ndarray")
    out = conversion.build(device)(*(ember.Tensor.from_data(x, device) for x in inputs))
    return conversion.source, out


def check_with_ort(model, *inputs) -> str:
    """Runs the import on NdArray, compares every output with onnxruntime's, and returns
    the generated source."""
    source, got = run_model(model, *inputs)
    got = got if isinstance(got, tuple) else (got,)
    names = [i.name for i in model.graph.input]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, dict(zip(names, inputs)))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        compare(g.to_numpy(), np.asarray(w), f"output {i}")
    return source
