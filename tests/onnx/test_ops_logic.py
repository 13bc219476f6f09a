"""ONNX logic converters on hand-built models: forms the node suite leaves out (constant
scalar operands written as literals, legacy broadcasting, IsInf detecting nothing, Where
broadcasting all three inputs)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
from onnx import TensorProto, helper  # noqa: E402
from op_helpers import graph_model as _model  # noqa: E402
from op_helpers import run_model as _run  # noqa: E402

from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

RNG = np.random.default_rng(12)
F32, BOOL = TensorProto.FLOAT, TensorProto.BOOL


def test_comparison_with_a_constant_scalar_is_a_literal():
    model = _model([helper.make_node("GreaterOrEqual", ["x", "t"], ["y"])], [("x", F32, [2, 3])],
                   [("y", BOOL, [2, 3])], [("t", np.array(0.2, np.float32))])
    x = np.array([[0.1, 0.2, 0.3], [-1.0, 0.2000001, 5.0]], np.float32)
    source, y = _run(model, x)
    assert ".greater_equal(0.2)" in source and "Param" not in source
    np.testing.assert_array_equal(y.to_numpy(), x >= np.float32(0.2))


def test_legacy_equal_broadcasts_along_an_axis():
    model = _model([helper.make_node("Equal", ["a", "b"], ["y"], broadcast=1, axis=0)],
                   [("a", TensorProto.INT64, [2, 3]), ("b", TensorProto.INT64, [2])],
                   [("y", BOOL, [2, 3])], opset=1)
    a = np.array([[1, 2, 1], [4, 4, 0]], np.int64)
    b = np.array([1, 4], np.int64)
    np.testing.assert_array_equal(_run(model, a, b)[1].to_numpy(), a == b[:, None])


def test_isinf_detecting_neither_sign_is_all_false():
    model = _model([helper.make_node("IsInf", ["x"], ["y"], detect_positive=0, detect_negative=0)],
                   [("x", F32, [3])], [("y", BOOL, [3])])
    y = _run(model, np.array([np.inf, -np.inf, 1.0], np.float32))[1].to_numpy()
    assert y.dtype == np.bool_ and not y.any() and y.shape == (3,)


def test_bitshift_by_a_constant():
    model = _model([helper.make_node("BitShift", ["x", "s"], ["y"], direction="RIGHT")],
                   [("x", TensorProto.UINT8, [4])], [("y", TensorProto.UINT8, [4])],
                   [("s", np.array([2], np.uint8))])
    x = np.array([255, 16, 7, 0], np.uint8)
    source, y = _run(model, x)
    assert ".bitwise_right_shift(2)" in source
    np.testing.assert_array_equal(y.to_numpy(), x >> 2)


def test_bitshift_direction_must_be_left_or_right():
    model = _model([helper.make_node("BitShift", ["x", "s"], ["y"], direction="UP")],
                   [("x", TensorProto.UINT8, [4]), ("s", TensorProto.UINT8, [4])],
                   [("y", TensorProto.UINT8, [4])])
    with pytest.raises(UnsupportedOnnxError, match=r"direction must be 'LEFT' or 'RIGHT'"):
        convert(model)


def test_where_broadcasts_condition_and_both_branches():
    model = _model([helper.make_node("Where", ["c", "x", "y"], ["z"])],
                   [("c", BOOL, [3, 1]), ("x", F32, [1, 4]), ("y", F32, [])], [("z", F32, [3, 4])])
    c = np.array([[True], [False], [True]])
    x = RNG.standard_normal((1, 4)).astype(np.float32)
    y = np.array(-7.0, np.float32)
    np.testing.assert_array_equal(_run(model, c, x, y)[1].to_numpy(), np.where(c, x, y))
