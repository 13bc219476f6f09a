"""Resize and Upsample converters. The node suite feeds ``scales``, ``sizes`` and ``roi``
as graph inputs, which ember resolves when the model runs (``rt.resize``); here the same
cases run with them as initializers (how exported models carry them), which ember resolves
at import time, and run-time resizing is checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_node_cases import NODE_DIR, _read, compare
from op_helpers import check, node_model, onnx, ort

import ember
from ember.backend.errors import ArgumentError, DTypeError, ShapeError
from ember.onnx import runtime as rt
from ember.onnx.importer import convert

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


def _run_time_model(op: str, x: np.ndarray, names: list[str], values: list[np.ndarray],
                    opset: int, **attrs) -> bytes:  # fmt: skip
    """A model of one resize node whose inputs after ``x`` are graph inputs; H and W of
    ``x`` are dynamic."""
    types = {np.dtype(np.float32): onnx.TensorProto.FLOAT,
             np.dtype(np.int64): onnx.TensorProto.INT64}  # fmt: skip
    inputs = [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                 [*x.shape[:-2], "h", "w"])]  # fmt: skip
    inputs += [onnx.helper.make_tensor_value_info(n, types[v.dtype], list(v.shape))
               for n, v in zip([n for n in names if n], values)]  # fmt: skip
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node(op, ["x", *names], ["y"], **attrs)], "g", inputs,
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    return model.SerializeToString()


RUN_TIME_CASES = [
    ("Resize", ["", "", "sizes"], [np.array([2, 3, 3, 7], np.int64)], 13,
     {"mode": "linear"}),
    ("Resize", ["", "scales"], [np.array([1, 1, 0.5, 2], np.float32)], 13,
     {"mode": "cubic", "coordinate_transformation_mode": "align_corners"}),
    ("Resize", ["roi", "scales"], [np.array([0.1, 0.2, 0.9, 0.7], np.float32),
                                   np.array([2, 0.75], np.float32)], 18,
     {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "axes": [3, 2],
      "extrapolation_value": 5.0}),
    ("Resize", ["", "", "sizes"], [np.array([9, 3], np.int64)], 18,
     {"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": "not_smaller"}),
    ("Upsample", ["scales"], [np.array([1, 1, 2, 1.5], np.float32)], 9, {"mode": "nearest"}),
]  # fmt: skip


@pytest.mark.parametrize("device_name", ["ndarray", "torch"])
@pytest.mark.parametrize(("op", "names", "values", "opset", "attrs"), RUN_TIME_CASES)
def test_run_time_scales_sizes_and_roi_match_onnxruntime(device_name, op, names, values, opset,
                                                         attrs):  # fmt: skip
    model = _run_time_model(op, np.zeros((2, 3, 1, 1), np.float32), names, values, opset, **attrs)
    conversion = convert(model)
    assert "rt.resize(" in conversion.source
    device = ember.device(device_name)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    module = conversion.build(device)
    feeds = dict(zip([n for n in names if n], values))
    # The same module resizes inputs of other heights and widths. Their scaled sizes are
    # whole: for align_corners and tf_crop_and_resize onnxruntime divides by the rounded
    # output size where ONNX's reference (and ember) divide by the unrounded one.
    for shape in [(2, 3, 4, 5), (2, 3, 8, 2)]:
        x = np.random.default_rng(len(shape) + shape[2]).standard_normal(shape).astype(np.float32)
        (expected,) = session.run(None, {"x": x, **feeds})
        got = module(*[ember.Tensor.from_data(v, device) for v in [x, *feeds.values()]])
        np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-4, atol=1e-5)


def test_constant_scales_of_dynamic_dims_resize_at_run_time():
    x = np.random.default_rng(4).standard_normal((1, 2, 3, 5)).astype(np.float32)
    model = _run_time_model("Resize", x, ["", "scales"], [np.array([1, 1, 2, 0.6], np.float32)],
                            13, mode="linear")  # fmt: skip
    model = onnx.load_from_string(model)
    model.graph.initializer.append(onnx.numpy_helper.from_array(
        np.array([1, 1, 2, 0.6], np.float32), "scales"))
    del model.graph.input[1:]
    conversion = check(model.SerializeToString(), x)
    assert "rt.resize(x, None, self." in conversion.source


def test_run_time_resize_errors():
    device = ember.device("ndarray")
    x = ember.Tensor.from_data(np.zeros((1, 2, 3), np.float32), device)
    with pytest.raises(ShapeError, match="Resize: scales has 2 values for 3 resized axes"):
        rt.resize(x, None, [1.0, 2.0], None)
    with pytest.raises(ShapeError, match="dim 2 of size 3 would be resized to 0"):
        rt.resize(x, None, None, [1, 2, 0])
    with pytest.raises(ArgumentError, match="Resize: needs scales or sizes"):
        rt.resize(x, None, None, None)
    with pytest.raises(ArgumentError, match="Resize: mode 'area' is not one of"):
        rt.resize(x, None, [1.0, 1.0, 2.0], None, mode="area")
    with pytest.raises(ArgumentError, match="keep_aspect_ratio_policy 'fit'"):
        rt.resize(x, None, None, [1, 2, 6], policy="fit")
    ints = ember.Tensor.from_data(np.zeros((1, 2, 3), np.int64), device)
    with pytest.raises(DTypeError, match="Resize: linear resizing needs a float tensor"):
        rt.resize(ints, None, [1.0, 1.0, 2.0], None, mode="linear")
    # Nearest resizing of ints picks positions.
    ints = ember.Tensor.from_data(np.arange(3).reshape(1, 1, 3), device)
    assert rt.resize(ints, None, None, [1, 1, 6]).tolist() == [[[0, 0, 1, 1, 2, 2]]]
    assert rt.resize(ints, None, None, [6], axes=[-1]).tolist() == [[[0, 0, 1, 1, 2, 2]]]
