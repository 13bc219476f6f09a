"""ONNX Unique, NonMaxSuppression, RoiAlign and MaxRoiPool converters on hand-built models:
the forms the node suite leaves out (runtime thresholds, unsorted slices along an axis,
sampling ratios, the opset 10 RoiAlign, MaxRoiPool, which has no node case), checked
against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime", reason="these tests compare with onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx_node_cases import compare  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

RNG = np.random.default_rng(4)
_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}


def _model(op: str, inputs: dict[str, np.ndarray], outputs: int = 1, opset: int = 18, **attrs):
    """One ``op`` node whose inputs are all graph inputs (runtime values)."""
    names = [f"y{i}" for i in range(outputs)]
    graph = helper.make_graph(
        [helper.make_node(op, list(inputs), names, **attrs)], "g",
        [helper.make_tensor_value_info(k, _TYPES[v.dtype], v.shape) for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(n) for n in names])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, inputs: dict[str, np.ndarray]) -> None:
    device = ember.device("ndarray")
    got = convert(model).build(device)(*(Tensor.from_data(v, device) for v in inputs.values()))
    got = got if isinstance(got, tuple) else (got,)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        compare(g.to_numpy(), e, f"output {i}")


@pytest.mark.parametrize("ordered", [0, 1])
def test_unique_along_axis(ordered: int) -> None:
    # Columns 0 and 3 are equal; columns 1 and 4 differ only in their last element.
    x = np.array([[2, 1, 0, 2, 1, 1], [5, 3, 1, 5, 3, 3], [1, 7, 0, 1, 6, 7]], np.float32)
    _check(_model("Unique", {"x": x}, outputs=4, axis=1, sorted=ordered), {"x": x})


def test_unique_flattened_unsorted() -> None:
    x = RNG.integers(-3, 4, size=(4, 5)).astype(np.int64)
    _check(_model("Unique", {"x": x}, outputs=4, sorted=0), {"x": x})


def test_non_max_suppression_runtime_thresholds() -> None:
    corners = RNG.uniform(0, 10, size=(2, 12, 2, 2)).astype(np.float32)
    boxes = np.concatenate([corners[..., 0, :], corners[..., 0, :] + RNG.uniform(
        -3, 3, size=(2, 12, 2)).astype(np.float32)], -1)
    inputs = {"boxes": boxes, "scores": RNG.uniform(size=(2, 3, 12)).astype(np.float32),
              "limit": np.array([4], np.int64), "iou": np.array([0.2], np.float32),
              "score": np.array([0.3], np.float32)}
    _check(_model("NonMaxSuppression", inputs), inputs)


@pytest.mark.parametrize("opset, attrs", [
    (10, {"sampling_ratio": 2, "spatial_scale": 0.5}),
    (16, {"mode": "max", "coordinate_transformation_mode": "output_half_pixel"}),
])  # fmt: skip
def test_roi_align(opset: int, attrs: dict) -> None:
    inputs = {"x": RNG.standard_normal((2, 3, 6, 7)).astype(np.float32),
              "rois": np.array([[0, 0, 6, 5], [1.5, 0.5, 3, 9], [-2, -1, 4.2, 2.8]], np.float32),
              "batch": np.array([1, 0, 1], np.int64)}
    _check(_model("RoiAlign", inputs, opset=opset, output_height=3, output_width=2, **attrs),
           inputs)


def test_max_roi_pool() -> None:
    inputs = {"x": RNG.standard_normal((2, 3, 8, 10)).astype(np.float32),
              "rois": np.array([[0, 1, 1, 6, 5], [1, -3, -2, 20, 30], [0, 2.4, 3.6, 4.5, 4.5],
                                [1, 5, 5, 4, 4]], np.float32)}
    _check(_model("MaxRoiPool", inputs, pooled_shape=[3, 4], spatial_scale=0.5), inputs)


def test_roi_align_unknown_mode() -> None:
    inputs = {"x": np.zeros((1, 1, 4, 4), np.float32), "rois": np.zeros((1, 4), np.float32),
              "batch": np.zeros(1, np.int64)}
    with pytest.raises(UnsupportedOnnxError, match="mode 'median' is not one of avg, max"):
        convert(_model("RoiAlign", inputs, mode="median"))
