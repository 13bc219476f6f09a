"""Single-node ONNX models for the converter tests: built, imported and compared with
onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

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
