"""ONNX reductions, ArgMax/ArgMin and CumSum/CumProd against ONNX's reference evaluator, in
the forms the node suite leaves out: constant axes inputs, unknown shapes, dynamic dims,
empty inputs at run time, infinities; on NdArray and Torch."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

DEVICES = {"ndarray": lambda: ember.device("ndarray"), "torch": lambda: ember.device("torch")}
REDUCTIONS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]  # fmt: skip


@pytest.fixture(params=list(DEVICES))
def device(request):
    return DEVICES[request.param]()


def _model(op, x_shape, *, consts=(), runtime=(), opset=18, elem=TensorProto.FLOAT, **attrs):
    """One node reading ``x`` and then the named constant or runtime inputs, in order."""
    names = ["x", *(n for n, _ in consts), *(n for n, _ in runtime)]
    inputs = [helper.make_tensor_value_info("x", elem, x_shape)]
    inputs += [helper.make_tensor_value_info(n, TensorProto.INT64, list(v.shape))
               for n, v in runtime]  # fmt: skip
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                              initializer=[numpy_helper.from_array(v, n) for n, v in consts])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, feeds, device):
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    conversion = convert(model)
    built = conversion.build(device)
    got = built(*(Tensor.from_data(feeds[n], device) for n in conversion.input_names)).to_numpy()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return conversion.source


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", REDUCTIONS)
def test_constant_axes_input(op, keepdims, device):
    x = np.random.default_rng(3).uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    axes = np.asarray([-1, 0], dtype=np.int64)
    opset = 13 if op == "ReduceSum" else 18
    model = _model(op, [2, 3, 4], consts=[("axes", axes)], opset=opset, keepdims=keepdims)
    source = _check(model, {"x": x}, device)
    assert "rt.ints" not in source  # the axes were known at import time


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceL2", "ReduceLogSumExp"])
def test_noop_with_empty_axes_reduces_nothing(op, device):
    x = np.random.default_rng(4).uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    axes = np.zeros([0], dtype=np.int64)
    opset = 13 if op == "ReduceSum" else 18
    model = _model(op, [2, 3], consts=[("axes", axes)], opset=opset, noop_with_empty_axes=1)
    _check(model, {"x": x}, device)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp"])
def test_empty_set_with_constant_axes_folds(op, device):
    model = _model(op, [2, 0, 4], consts=[("axes", np.asarray([1], np.int64))], keepdims=1)
    source = _check(model, {"x": np.zeros((2, 0, 4), np.float32)}, device)
    assert "def forward(self, x: Tensor) -> Tensor:\n        return self." in source


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceLogSumExp"])
def test_empty_input_at_run_time(op, device):
    """A dynamic dim that turns out empty: max and min give their identity, not an error."""
    model = _model(op, ["n", 3], runtime=[("axes", np.asarray([0], np.int64))], keepdims=0)
    conversion = convert(model)
    built = conversion.build(device)
    for n in (0, 2):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        axes = np.asarray([0], np.int64)
        (want,) = ReferenceEvaluator(model).run(None, {"x": x, "axes": axes})
        got = built(Tensor.from_data(x, device), Tensor.from_data(axes, device)).to_numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_every_axis_of_an_unknown_shape(device):
    """No shape information: the whole-tensor reduction, reshaped to the input's rank."""
    model = _model("ReduceMean", None, opset=13, keepdims=1)
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    source = _check(model, {"x": x}, device)
    assert ".mean()" in source


def test_log_sum_exp_of_infinities(device):
    x = np.asarray([[np.inf, 1.0, 2.0], [-np.inf, -np.inf, -np.inf], [1000.0, 1000.0, 0.0]],
                   dtype=np.float32)  # fmt: skip
    model = _model("ReduceLogSumExp", [3, 3], opset=13, axes=[1], keepdims=0)
    built = convert(model).build(device)
    got = built(Tensor.from_data(x, device)).to_numpy()
    np.testing.assert_allclose(got, [np.inf, -np.inf, 1000.0 + np.log(2.0)], rtol=1e-6)


def test_bool_max_and_min(device):
    x = np.asarray([[True, False], [False, False]])
    for op, want in (("ReduceMax", [True, False]), ("ReduceMin", [False, False])):
        model = _model(op, [2, 2], consts=[("axes", np.asarray([1], np.int64))], opset=20,
                       elem=TensorProto.BOOL, keepdims=0)
        got = convert(model).build(device)(Tensor.from_data(x, device)).to_numpy()
        np.testing.assert_array_equal(got, want)


def test_out_of_range_axes_are_reported():
    model = _model("ReduceSum", [2, 3], consts=[("axes", np.asarray([2], np.int64))], opset=13)
    with pytest.raises(UnsupportedOnnxError, match=r"axes \[2\] are out of range"):
        convert(model)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reduce_last_index_of_a_dynamic_dim(op, device):
    model = _model(op, [2, "n"], opset=13, axis=-1, keepdims=0, select_last_index=1)
    source = _check(model, {"x": np.asarray([[1, 3, 3, 0], [2, 2, 0, 0]], np.float32)}, device)
    assert "x.shape[1] - 1" in source


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
def test_cumulative_with_dynamic_dims(op, device):
    opset = 26 if op == "CumProd" else 14
    model = _model(op, ["n", 3], consts=[("axis", np.asarray(0, np.int64))], opset=opset,
                   exclusive=1, reverse=1)
    x = np.random.default_rng(6).uniform(0.5, 1.5, (4, 3)).astype(np.float32)
    source = _check(model, {"x": x}, device)
    assert "y.shape[0] - 1" in source
