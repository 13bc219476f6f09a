"""ONNX indexing converters on hand-built models: the forms the node suite leaves out
(constant indices mapped at import time, batch dims, higher ranks, partial scatter
regions, dynamic shapes), checked against onnxruntime."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime", reason="these tests compare with onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from op_helpers import check_with_ort as _check  # noqa: E402
from op_helpers import graph_model  # noqa: E402

from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

RNG = np.random.default_rng(9)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


_model = partial(graph_model, opset=18)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_gather_elements_with_constant_negative_indices():
    indices = np.array([[-1, 0, 2], [1, -3, -2]])
    model = _model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=-2)],
                   [("x", F32, [3, 3])], [("y", F32, None)], [("i", indices)])
    source = _check(model, _x(3, 3))
    assert "[[2, 0, 2], [1, 0, 1]]" in source


def test_gather_nd_batch_dims_and_pairs():
    model = _model([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)],
                   [("x", F32, [2, 3, 4, 5]), ("i", I64, [2, 6, 2])], [("y", F32, None)])
    index = np.stack([RNG.integers(-3, 3, (2, 6)), RNG.integers(0, 4, (2, 6))], -1)
    _check(model, _x(2, 3, 4, 5), index)


def test_gather_nd_needs_the_data_shape():
    model = _model([helper.make_node("GatherND", ["x", "i"], ["y"])],
                   [("x", F32, ["n", 3]), ("i", I64, [2, 1])], [("y", F32, None)])
    with pytest.raises(UnsupportedOnnxError, match="static shape of data"):
        convert(model)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_into_part_of_the_data(reduction):
    """Indices smaller than the data outside the axis, a middle axis, repeated targets."""
    model = _model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1,
                                     reduction=reduction)],
                   [("x", F32, [3, 4, 5]), ("i", I64, [2, 3, 4]), ("u", F32, [2, 3, 4])],
                   [("y", F32, None)])
    if reduction == "none":  # a distinct target per update: ONNX leaves duplicates open
        index = np.broadcast_to(np.array([[2], [0], [-1]]), (2, 3, 4)).copy()
    else:
        index = RNG.integers(-4, 4, (2, 3, 4))
    _check(model, _x(3, 4, 5), index, _x(2, 3, 4))


@pytest.mark.parametrize("reduction", ["none", "mul", "max"])
def test_scatter_nd_with_index_pairs(reduction):
    model = _model([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)],
                   [("x", F32, [3, 4, 2]), ("i", I64, [3, 2]), ("u", F32, [3, 2])],
                   [("y", F32, None)])
    index = np.array([[0, 1], [2, -1], [0, 1] if reduction != "none" else [1, 0]])
    _check(model, _x(3, 4, 2), index, _x(3, 2))


def test_one_hot_float_indices_constant_depth_axis_zero():
    model = _model([helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=0)],
                   [("i", F32, [2, 3])], [("y", F32, None)],
                   [("d", np.array(4.0, np.float32)), ("v", np.array([-1.0, 2.0], np.float32))])
    source = _check(model, np.array([[0, 3, -1], [5, -4, 1.7]], np.float32))
    assert "Tensor.arange(4" in source


def test_top_k_constant_k_smallest_with_ties():
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=0, largest=0)],
                   [("x", F32, [6, 2])], [("v", F32, None), ("i", I64, None)],
                   [("k", np.array([3]))])
    x = np.array([[3, 1], [1, 1], [2, 0], [1, 5], [0, 1], [2, 2]], np.float32)
    source = _check(model, x)
    assert "topk_with_indices(3, 0, largest=False)" in source


def test_top_k_opset1_attribute():
    model = _model([helper.make_node("TopK", ["x"], ["v", "i"], k=2)],
                   [("x", F32, [2, 5])], [("v", F32, None), ("i", I64, None)], opset=9)
    _check(model, _x(2, 5))


def test_compress_with_a_constant_condition_and_non_zero():
    model = _model([helper.make_node("Compress", ["x", "c"], ["y"], axis=1),
                    helper.make_node("NonZero", ["x"], ["n"])],
                   [("x", F32, [2, 4])], [("y", F32, None), ("n", I64, None)],
                   [("c", np.array([True, False, True]))])
    x = _x(2, 4)
    x[0, 1] = x[1, 3] = 0.0
    source = _check(model, x)
    assert "Tensor.from_data([0, 2]" in source


def test_reverse_sequence_of_rank_three():
    model = _model([helper.make_node("ReverseSequence", ["x", "s"], ["y"], batch_axis=1,
                                     time_axis=0)],
                   [("x", F32, [5, 3, 2]), ("s", I64, [3])], [("y", F32, None)])
    _check(model, _x(5, 3, 2), np.array([5, 1, 3]))


def test_trilu_constant_k_and_eye_like_of_a_dynamic_shape():
    model = _model([helper.make_node("Trilu", ["x", "k"], ["t"], upper=0),
                    helper.make_node("EyeLike", ["x"], ["e"], k=-1, dtype=TensorProto.INT32)],
                   [("x", F32, ["n", 4])], [("t", F32, None), ("e", TensorProto.INT32, None)],
                   [("k", np.array(1))])
    source = _check(model, _x(3, 4))
    assert ".tril(1)" in source


@pytest.mark.parametrize("indices", [0, -1, [1, 2], [-2, -1], [[0, 1]], [2, 0], [0, 0]],
                         ids=["scalar", "negative", "run", "negative-run", "2d-run",
                              "reversed", "repeated"])  # fmt: skip
@pytest.mark.parametrize("backend", ["ndarray", "fusion"])
def test_gather_with_constant_indices(indices, backend):
    # A run of consecutive indices becomes a view (lazy on a fusion device); the others a
    # gather: both as NumPy's take with ONNX's negative indices.
    import ember
    from ember import Tensor
    from ember.onnx import runtime as rt

    device = ember.device("ndarray")
    if backend == "fusion":
        device = device.fusion(runtime="interpreter")
    x = _x(2, 3, 4)
    got = rt.gather(Tensor.from_data(x, device) * 1.0, indices, 1).to_numpy()
    np.testing.assert_array_equal(got, np.take(x, np.asarray(indices), axis=1))


@pytest.mark.parametrize("indices", [3, [2, 3], -4])
def test_gather_with_constant_indices_out_of_range_raises(indices):
    import ember
    from ember import Tensor
    from ember.backend.errors import EmberIndexError
    from ember.onnx import runtime as rt

    x = Tensor.from_data(_x(2, 3, 4), ember.device("ndarray"))
    with pytest.raises(EmberIndexError):
        rt.gather(x, indices, 1)
