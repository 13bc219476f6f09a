"""Resize and Upsample converters. The node suite feeds ``scales``, ``sizes`` and ``roi``
as graph inputs, which ember resolves at import time only; here the same cases run with
them as initializers (how exported models carry them)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_node_cases import NODE_DIR, _read, compare
from op_helpers import check, node_model, onnx

import ember
from ember.onnx.importer import convert
from ember.onnx.registry import UnsupportedOnnxError

CASES = sorted(p.name for p in NODE_DIR.glob("test_resize_*")) + ["test_upsample_nearest"]


@pytest.mark.parametrize("case", CASES)
def test_node_case_with_constant_scales_sizes_and_roi(case):
    folder = NODE_DIR / case
    model = onnx.load(str(folder / "model.onnx"))
    data = folder / "test_data_set_0"
    inputs = [_read(p) for p in sorted(data.glob("input_*.pb"))]
    expected = _read(data / "output_0.pb")
    graph = model.graph
    for info, value in list(zip(graph.input, inputs))[1:]:
        graph.initializer.append(onnx.numpy_helper.from_array(value, info.name))
    first = graph.input[0]
    del graph.input[:]
    graph.input.append(first)
    device = ember.device("ndarray")
    got = convert(model).build(device)(ember.Tensor.from_data(inputs[0], device))
    compare(got.to_numpy(), expected, case)


@pytest.mark.parametrize("device_name", ["ndarray", "torch"])
@pytest.mark.parametrize(("mode", "coordinates"), [("linear", "half_pixel"),
                                                   ("cubic", "align_corners"),
                                                   ("nearest", "asymmetric")])  # fmt: skip
def test_common_resizes_are_ember_interpolate(device_name, mode, coordinates):
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 5)).astype(np.float32)
    scales = np.array([1, 1, 2, 3], np.float32)
    model = node_model("Resize", x, {"roi": None, "scales": scales}, opset=13, mode=mode,
                       coordinate_transformation_mode=coordinates, nearest_mode="floor")
    conversion = check(model, x, device_name)
    assert "F.interpolate(" in conversion.source


def test_resize_of_the_last_dim_and_ints_by_selection():
    x = np.random.default_rng(3).integers(0, 9, (2, 3, 7)).astype(np.uint8)
    model = node_model("Resize", x, {"roi": None, "scales": None,
                                     "sizes": np.array([4], np.int64)}, opset=18, axes=[-1])
    conversion = check(model, x)
    assert ".select(2, [" in conversion.source


def test_scales_known_only_at_run_time_are_unsupported():
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Resize", ["x", "", "scales"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 2, 2]),
         onnx.helper.make_tensor_value_info("scales", onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedOnnxError, match="'scales' must be a constant"):
        convert(model)
