"""ONNX layout converters on hand-built models: the forms the node suite leaves out
(constant shape operands written as literals, legacy opsets, dynamic dims, folding),
checked against onnxruntime."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime", reason="these tests compare with onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from op_helpers import check_with_ort as _check  # noqa: E402
from op_helpers import graph_model  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

RNG = np.random.default_rng(5)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64
BIG = np.iinfo(np.int64).max


_model = partial(graph_model, opset=18)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(("starts", "ends", "axes", "steps", "code"), [
    ([1, 0], [3, BIG], [0, 2], [1, 1], "x[1:3]"),
    ([-1], [-BIG], [1], [-2], "x[:, ::-2]"),
    ([2, 1], [0, 4], [-1, -2], [-1, 1], "x[:, 1:4, 2:0:-1]"),
    ([10], [20], [0], [1], "x[10:20]"),
])
def test_slice_with_constant_bounds_is_python_indexing(starts, ends, axes, steps, code):
    n = len(starts)
    model = _model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])],
                   [("x", F32, [4, 5, 6])], [("y", F32, None)],
                   [("s", np.array(starts)), ("e", np.array(ends)), ("a", np.array(axes)),
                    ("t", np.array(steps))])
    assert n == len(ends)
    source = _check(model, _x(4, 5, 6))
    assert f"y = {code}" in source


def test_slice_opset1_attributes_and_a_dynamic_dim():
    model = _model([helper.make_node("Slice", ["x"], ["y"], starts=[1, -3], ends=[BIG, -1],
                                     axes=[0, 1])],
                   [("x", F32, ["n", 5])], [("y", F32, None)], opset=9)
    source = _check(model, _x(3, 5))
    assert "x[1:, -3:-1]" in source


def test_slice_of_only_negative_axes_needs_no_rank():
    model = _model([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])],
                   [("x", F32, None)], [("y", F32, None)],
                   [("s", np.array([1])), ("e", np.array([3])), ("a", np.array([-1]))])
    source = _check(model, _x(2, 4))
    assert "x[..., 1:3]" in source


def test_split_constant_sizes_and_uneven_parts():
    sizes = _model([helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1)],
                   [("x", F32, [2, 5])], [("a", F32, None), ("b", F32, None)],
                   [("s", np.array([1, 4]))], opset=13)
    assert ".split([1, 4], 1)" in _check(sizes, _x(2, 5))
    uneven = _model([helper.make_node("Split", ["x"], ["a", "b", "c"], num_outputs=3)],
                    [("x", F32, ["n"])], [("a", F32, None), ("b", F32, None),
                                          ("c", F32, None)])
    _check(uneven, _x(7))
    legacy = _model([helper.make_node("Split", ["x"], ["a", "b"], split=[2, 1])],
                    [("x", F32, [3, 2])], [("a", F32, None), ("b", F32, None)], opset=11)
    _check(legacy, _x(3, 2))


def test_expand_broadcasts_both_ways_and_adds_dims():
    model = _model([helper.make_node("Expand", ["x", "s"], ["y"])],
                   [("x", F32, [3, 1])], [("y", F32, None)], [("s", np.array([2, 1, 4]))])
    source = _check(model, _x(3, 1))
    assert "x.expand([2, 3, 4])" in source


def test_expand_of_an_input_with_unknown_shape():
    model = _model([helper.make_node("Expand", ["x", "s"], ["y"])],
                   [("x", F32, None), ("s", I64, None)], [("y", F32, None)])
    _check(model, _x(3, 1), np.array([2, 1, 4]))


def test_tile_constant_and_legacy():
    model = _model([helper.make_node("Tile", ["x", "r"], ["y"])], [("x", F32, [2, 3])],
                   [("y", F32, None)], [("r", np.array([2, 1]))])
    assert "x.repeat([2, 1])" in _check(model, _x(2, 3))
    legacy = _model([helper.make_node("Tile", ["x", "t", "a"], ["y"])], [("x", F32, [2, 3])],
                    [("y", F32, None)], [("t", np.array(3)), ("a", np.array(1))], opset=5)
    conversion = convert(legacy)
    device = ember.device("ndarray")
    x = _x(2, 3)
    y = conversion.build(device)(Tensor.from_data(x, device))
    np.testing.assert_array_equal(y.to_numpy(), np.tile(x, (1, 3)))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_constant_pads_with_crops_and_axes(mode):
    model = _model([helper.make_node("Pad", ["x", "p", "", "a"], ["y"], mode=mode)],
                   [("x", F32, [2, 3, 4])], [("y", F32, None)],
                   [("p", np.array([2, -1, 1, 2])), ("a", np.array([1, -1]))])
    source = _check(model, _x(2, 3, 4))
    assert "rt.ints" not in source


def test_pad_value_on_an_int_tensor_and_legacy_attributes():
    model = _model([helper.make_node("Pad", ["x", "p", "v"], ["y"])],
                   [("x", TensorProto.INT32, [2, 2])], [("y", TensorProto.INT32, None)],
                   [("p", np.array([0, 1, 1, 0])), ("v", np.array(7, np.int32))])
    source = _check(model, np.arange(4, dtype=np.int32).reshape(2, 2))
    assert "x.pad([1, 0, 0, 1], 7)" in source
    legacy = _model([helper.make_node("Pad", ["x"], ["y"], pads=[1, 0, 0, 2], value=1.5)],
                    [("x", F32, [2, 2])], [("y", F32, None)], opset=2)
    _check(legacy, _x(2, 2))


def test_pad_unknown_mode_is_unsupported():
    model = _model([helper.make_node("Pad", ["x", "p"], ["y"], mode="mirror")],
                   [("x", F32, [2, 2])], [("y", F32, None)], [("p", np.array([1, 1, 1, 1]))])
    with pytest.raises(UnsupportedOnnxError, match="pad mode 'mirror'"):
        convert(model)


def test_center_crop_pad_with_constant_shape():
    model = _model([helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[0, -1])],
                   [("x", F32, [5, 2, 4])], [("y", F32, None)], [("s", np.array([2, 7]))])
    source = _check(model, _x(5, 2, 4))
    assert "x.pad([1, 2, 0, 0, -1, -2])" in source


def test_depth_to_space_with_a_dynamic_batch():
    for mode in ("DCR", "CRD"):
        model = _model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)],
                       [("x", F32, ["n", 8, 2, 3])], [("y", F32, None)])
        _check(model, _x(3, 8, 2, 3))
    model = _model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)],
                   [("x", F32, ["n", 2, 4, 6])], [("y", F32, None)])
    _check(model, _x(2, 2, 4, 6))


def test_constant_of_shape_of_a_dynamic_shape():
    value = numpy_helper.from_array(np.array([3], np.int32))
    model = _model([helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("ConstantOfShape", ["s"], ["y"], value=value)],
                   [("x", F32, ["n", 2])], [("y", TensorProto.INT32, None)])
    _check(model, _x(4, 2))


def test_range_of_constants_folds_and_size_of_a_dynamic_input():
    model = _model([helper.make_node("Range", ["a", "b", "c"], ["r"]),
                    helper.make_node("Size", ["x"], ["n"]),
                    helper.make_node("Add", ["x", "r"], ["y"])],
                   [("x", F32, ["k", 4])], [("y", F32, None), ("n", I64, None)],
                   [("a", np.float32(0.5)), ("b", np.float32(2.3)), ("c", np.float32(0.5))])
    source = _check(model, _x(3, 4))
    assert "arange" not in source and "host.run('Size', 18, [x], {})" in source
