"""Quantized ONNX models imported to ember's quantized ops (``ember.quantization.linear`` /
``conv2d`` with a QuantizedWeight built at import), against onnxruntime on NdArray and Torch.

Tolerances, and why:

* MatMulInteger / ConvInteger give i32 sums: equal (the quantized path is taken only where
  every sum is exact in f32).
* QLinearMatMul / QLinearConv requantize an f32 product (ember: the sums times
  ``a_scale * b_scale``, then divided by ``y_scale``; onnxruntime: the sums times one f32
  multiplier), so a value within an f32 rounding of a half-way point may round the other way:
  at most 1 apart, in at most 2% of the outputs.
* DequantizeLinear weight by a Float activation: on NdArray the float product of the same
  dequantized weight (f32 rounding: rtol 1e-5); on Torch PyTorch's dynamic int8 kernel
  quantizes the activation per call to 7 bits, so each output may move by its bound,
  ``sum_k |w[k, n]| * step`` with ``step = (max(x, 0) - min(x, 0)) / 127``.
* Real quantizer output: outputs within a few quanta of the last QuantizeLinear (a
  requantized value that rounds the other way moves the next layer by one quantum times
  its weights); a tight 1e-5 for the dynamic format, whose sums are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_helpers import graph_model, ort

import ember
from ember.onnx.importer import convert
from ember.onnx.registry import OnnxImportError
from ember.quantization import QTensor

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(16)
DEVICES = ["ndarray", "torch"]
U8, I8, F32, I32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT, TensorProto.INT32
_ELEM = {np.dtype(np.uint8): U8, np.dtype(np.int8): I8}


def _ints(dtype, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


NotImplementedOrt = ort.capi.onnxruntime_pybind11_state.NotImplemented
# Nodes that quantize activations, so that onnxruntime multiplies integers (itself or by
# fusing QDQ pairs); a graph of DequantizeLinear weights only multiplies floats.
QUANTIZED_ACTIVATIONS = {"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv",
                         "QuantizeLinear", "DynamicQuantizeLinear"}  # fmt: skip


def _session(model) -> ort.InferenceSession:
    """An onnxruntime session whose integer products are exact on every x86 CPU: without
    AVX-512 VNNI (or AVX-VNNI), its u8 x s8 kernel adds pairs of products in saturating
    int16 unless ``session.x64quantprecision`` asks for the exact path. That path has
    kernels for u8 activations only (s8 ones are exact anyway), and breaks weight-only
    graphs, so it is asked for only where activations are quantized."""
    data, providers = model.SerializeToString(), ["CPUExecutionProvider"]
    if not any(node.op_type in QUANTIZED_ACTIVATIONS for node in model.graph.node):
        return ort.InferenceSession(data, providers=providers)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    try:
        return ort.InferenceSession(data, options, providers=providers)
    except NotImplementedOrt:
        return ort.InferenceSession(data, providers=providers)


def _run(model, inputs: dict[str, np.ndarray], device_name: str):
    """The imported model's outputs and onnxruntime's, and the conversion."""
    conversion = convert(model)
    device = ember.device(device_name)
    module = conversion.build(device)
    got = module(*(ember.Tensor.from_data(v, device) for v in inputs.values()))
    got = [g.to_numpy() for g in (got if isinstance(got, tuple) else (got,))]
    want = _session(model).run(None, inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
    return got, want, conversion, module


def _quantized_weights(module) -> list[QTensor]:
    """The quantized weights a built model holds (the fields rt.quantized_* read)."""
    from ember.onnx.ops.quantize import QuantizedWeight

    return [v.qtensor() for v in vars(module).values() if isinstance(v, QuantizedWeight)]


def _assert_quantized(conversion, module, count: int = 1) -> None:
    """The import really runs ember's quantized ops: a silent fallback fails here."""
    weights = _quantized_weights(module)
    assert len(weights) == count and all(isinstance(w, QTensor) for w in weights)
    calls = conversion.source.count("rt.quantized_linear(") + conversion.source.count(
        "rt.quantized_conv(")  # fmt: skip
    assert calls == count, conversion.source


def _assert_requantized(got: np.ndarray, want: np.ndarray) -> None:
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1, diff.max()
    assert (diff != 0).mean() <= 0.02, (diff != 0).mean()


# ----------------------------------------------------------------------- MatMulInteger
@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("zero", ["none", "tensor", "column"])
def test_matmul_integer_with_a_constant_weight_is_exact(device_name, a_dtype, b_dtype, zero):
    a = _ints(a_dtype, 2, 5, 24)
    b = _ints(b_dtype, 24, 7)
    constants = [("b", b)]
    inputs = ["a", "b"]
    if zero != "none":
        constants += [("a_zero", _ints(a_dtype)),
                      ("b_zero", _ints(b_dtype) if zero == "tensor" else _ints(b_dtype, 7))]
        inputs += ["a_zero", "b_zero"]
    model = graph_model([helper.make_node("MatMulInteger", inputs, ["y"])],
                        [("a", _ELEM[a.dtype], ["n", 5, 24])], [("y", I32, None)], constants, 10)
    got, want, conversion, module = _run(model, {"a": a}, device_name)
    np.testing.assert_array_equal(got[0], want[0])
    _assert_quantized(conversion, module)


def test_matmul_integer_keeps_the_exact_path_where_f32_sums_would_round():
    """Sums past 2^24 are not exact in f32: the import keeps the f64 emulation there."""
    k = 600  # 600 * 255 * 128 > 2^24
    a = np.full((2, k), 255, np.uint8)
    b = np.full((k, 3), -128, np.int8)
    model = graph_model([helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
                        [("a", U8, [2, k])], [("y", I32, None)], [("b", b)], 10)
    got, want, conversion, module = _run(model, {"a": a}, "ndarray")
    np.testing.assert_array_equal(got[0], want[0])
    assert "rt.quantized_linear" not in conversion.source and not _quantized_weights(module)


# -------------------------------------------------------------------------- ConvInteger
def _conv_reference(x, x_zero, w, w_zero, pads, strides, group) -> np.ndarray:
    """ConvInteger in f64 (exact for these sums) by PyTorch, per-channel zero points too."""
    import torch

    centered = torch.from_numpy(x.astype(np.float64) - float(x_zero))
    centered = torch.nn.functional.pad(centered, (pads[1], pads[3], pads[0], pads[2]))
    kernel = w.astype(np.float64) - np.asarray(w_zero, np.float64).reshape(-1, 1, 1, 1)
    out = torch.nn.functional.conv2d(centered, torch.from_numpy(kernel), None, strides, 0, 1, group)
    return out.numpy().astype(np.int32)


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("w_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_integer_with_zero_points_and_uneven_pads_is_exact(device_name, w_dtype, per_channel):
    x = _ints(np.uint8, 2, 4, 7, 6)
    w = _ints(w_dtype, 6, 2, 3, 3)
    w_zero = _ints(w_dtype, 6) if per_channel else _ints(w_dtype)
    constants = [("w", w), ("x_zero", np.uint8(131)), ("w_zero", w_zero)]
    pads, strides = [1, 0, 2, 1], [2, 1]
    node = helper.make_node("ConvInteger", ["x", "w", "x_zero", "w_zero"], ["y"], pads=pads,
                            strides=strides, group=2)  # fmt: skip
    model = graph_model([node], [("x", U8, ["n", 4, 7, 6])], [("y", I32, None)], constants, 10)
    conversion = convert(model)
    device = ember.device(device_name)
    module = conversion.build(device)
    got = module(ember.Tensor.from_data(x, device)).to_numpy()
    np.testing.assert_array_equal(got, _conv_reference(x, 131, w, w_zero, pads, strides, 2))
    if not per_channel:  # onnxruntime's ConvInteger takes one weight zero point only
        np.testing.assert_array_equal(got, _session(model).run(None, {"x": x})[0])
    _assert_quantized(conversion, module)


# ------------------------------------------------------------------------ QLinearMatMul
@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_requantizes_as_onnxruntime(device_name, dtype, per_column):
    a = _ints(dtype, 3, 8, 32)
    b = _ints(dtype, 32, 16)
    n = 16 if per_column else 1
    b_scale = RNG.uniform(0.001, 0.01, n).astype(np.float32).reshape(() if n == 1 else (n,))
    b_zero = _ints(dtype, n).reshape(b_scale.shape)
    constants = [("a_scale", np.float32(0.02)), ("a_zero", _ints(dtype)), ("b", b),
                 ("b_scale", b_scale), ("b_zero", b_zero), ("y_scale", np.float32(0.05)),
                 ("y_zero", _ints(dtype))]  # fmt: skip
    node = helper.make_node("QLinearMatMul", ["a", *[c for c, _ in constants]], ["y"])
    model = graph_model([node], [("a", _ELEM[a.dtype], [3, 8, 32])], [("y", _ELEM[a.dtype], None)],
                        constants, 10)  # fmt: skip
    got, want, conversion, module = _run(model, {"a": a}, device_name)
    _assert_requantized(got[0], want[0])
    _assert_quantized(conversion, module)
    weight = _quantized_weights(module)[0]
    assert weight.scheme.granularity == ("axis" if per_column else "tensor")


# -------------------------------------------------------------------------- QLinearConv
@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_with_bias_requantizes_as_onnxruntime(device_name, dtype, per_channel):
    x = _ints(dtype, 2, 3, 9, 8)
    w = _ints(np.int8, 4, 3, 3, 3)
    m = 4 if per_channel else 1
    w_scale = RNG.uniform(0.002, 0.01, m).astype(np.float32).reshape(() if m == 1 else (m,))
    constants = [("x_scale", np.float32(0.03)), ("x_zero", _ints(dtype)), ("w", w),
                 ("w_scale", w_scale), ("w_zero", np.zeros(w_scale.shape, np.int8)),
                 ("y_scale", np.float32(0.08)), ("y_zero", _ints(dtype)),
                 ("bias", RNG.integers(-2000, 2000, 4).astype(np.int32))]  # fmt: skip
    node = helper.make_node("QLinearConv", ["x", *[c for c, _ in constants]], ["y"],
                            pads=[0, 1, 1, 2], strides=[1, 2])
    model = graph_model([node], [("x", _ELEM[x.dtype], [2, 3, 9, 8])],
                        [("y", _ELEM[x.dtype], None)], constants, 10)  # fmt: skip
    got, want, conversion, module = _run(model, {"x": x}, device_name)
    _assert_requantized(got[0], want[0])
    _assert_quantized(conversion, module)


# ------------------------------------------------- DequantizeLinear weights (QDQ format)
def _dq_weight(values: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, **attrs):
    inputs = ["w_q", "w_scale"] + (["w_zero"] if zero is not None else [])
    constants = [("w_q", values), ("w_scale", scale)] + ([("w_zero", zero)] if zero is not None else [])
    return helper.make_node("DequantizeLinear", inputs, ["w"], **attrs), constants


def _dynamic_bound(x: np.ndarray, weight: np.ndarray, levels: int) -> np.ndarray:
    """How far a dynamic int8 kernel may move each output of ``x @ weight``: the activation
    quantized to ``levels`` steps over its range moves each element by at most a step."""
    x = x.reshape(-1, x.shape[-1])
    step = (max(x.max(), 0.0) - min(x.min(), 0.0)) / levels
    return step * np.abs(weight).sum(0) + 1e-5


def _assert_float_product(got, want, x, weight, device_name, offset=0.0) -> None:
    """``got`` against ``x @ weight`` in f64: close on NdArray, within PyTorch's dynamic
    quantization (7 bits) on Torch. onnxruntime (``want``) fuses DequantizeLinear -> MatMul
    into its own dynamic quantization (8 bits): within that bound too. ``offset`` (a bias)
    is added to the reference."""
    reference = (x.astype(np.float64) @ weight.astype(np.float64) + offset).astype(np.float32)
    assert (np.abs(want - reference) <= _dynamic_bound(x, weight, 255)).all()
    if device_name == "ndarray":
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
    else:
        assert (np.abs(got - reference) <= _dynamic_bound(x, weight, 127)).all()


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("per_column", "with_zero"), [(False, False), (False, True), (True, True)])
def test_dequantized_weight_matmul_runs_quantized_linear(device_name, dtype, per_column, with_zero):
    x = RNG.standard_normal((2, 3, 20)).astype(np.float32)
    values = _ints(dtype, 20, 12)
    n = 12 if per_column else 1
    scale = RNG.uniform(0.01, 0.05, n).astype(np.float32).reshape(() if n == 1 else (n,))
    zero = _ints(dtype, n).reshape(scale.shape) if with_zero else None
    dq, constants = _dq_weight(values, scale, zero, axis=1)
    model = graph_model([dq, helper.make_node("MatMul", ["x", "w"], ["y"])],
                        [("x", F32, [2, 3, 20])], [("y", F32, None)], constants, 13)
    got, want, conversion, module = _run(model, {"x": x}, device_name)
    weight = (values.astype(np.float32) - (0 if zero is None else zero.astype(np.float32))) * scale
    _assert_float_product(got[0], want[0], x, weight, device_name)
    _assert_quantized(conversion, module)
    assert _quantized_weights(module)[0].shape == (20, 12)


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("bias", ["row", "matrix", "none"])
def test_dequantized_weight_gemm_respects_trans_b_alpha_and_beta(device_name, bias):
    x = RNG.standard_normal((5, 16)).astype(np.float32)
    values = _ints(np.int8, 10, 16)  # [N, K]: transB
    scale = RNG.uniform(0.01, 0.05, 10).astype(np.float32)
    dq, constants = _dq_weight(values, scale, None, axis=0)
    inputs = ["x", "w"]
    c = 0.0
    if bias != "none":
        c = RNG.standard_normal((10,) if bias == "row" else (5, 10)).astype(np.float32)
        constants.append(("c", c))
        inputs.append("c")
    gemm = helper.make_node("Gemm", inputs, ["y"], transB=1, alpha=1.0 if bias == "row" else 0.5,
                            beta=0.25)  # fmt: skip
    model = graph_model([dq, gemm], [("x", F32, [5, 16])], [("y", F32, None)], constants, 13)
    got, want, conversion, module = _run(model, {"x": x}, device_name)
    weight = values.astype(np.float32).T * scale
    alpha = 1.0 if bias == "row" else 0.5
    _assert_float_product(got[0], want[0], x, weight * alpha, device_name, 0.25 * np.float64(c))
    _assert_quantized(conversion, module)
    assert _quantized_weights(module)[0].shape == (16, 10)
    assert _quantized_weights(module)[0].scheme.axis == 1


@pytest.mark.parametrize("device_name", DEVICES)
def test_dequantized_weight_conv_with_bias_runs_quantized_conv(device_name):
    x = RNG.standard_normal((2, 4, 7, 7)).astype(np.float32)
    values = _ints(np.uint8, 6, 4, 3, 3)
    scale = RNG.uniform(0.005, 0.02, 6).astype(np.float32)
    dq, constants = _dq_weight(values, scale, _ints(np.uint8, 6), axis=0)
    constants.append(("b", RNG.standard_normal(6).astype(np.float32)))
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 0, 1, 2], strides=[2, 1])
    model = graph_model([dq, conv], [("x", F32, [2, 4, 7, 7])], [("y", F32, None)], constants, 13)
    got, want, conversion, module = _run(model, {"x": x}, device_name)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)  # dequantize-then-conv
    _assert_quantized(conversion, module)


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantized_activation_and_weight_run_the_integer_product(device_name, dtype):
    """QuantizeLinear -> DequantizeLinear of the activation, DequantizeLinear of the
    weight, MatMul: the activation enters as a QTensor (exact sums on Torch)."""
    x = RNG.standard_normal((4, 32)).astype(np.float32)
    zero = _ints(dtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"])]
    dq, constants = _dq_weight(_ints(np.int8, 32, 8), RNG.uniform(0.01, 0.02, 8).astype(np.float32),
                               None, axis=1)  # fmt: skip
    constants += [("x_scale", np.float32(0.02)), ("x_zero", zero)]
    model = graph_model([*nodes, dq, helper.make_node("MatMul", ["xd", "w"], ["y"])],
                        [("x", F32, [4, 32])], [("y", F32, None)], constants, 13)
    got, want, conversion, module = _run(model, {"x": x}, device_name)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    _assert_quantized(conversion, module)
    assert "rt.quantized_input(" in conversion.source


@pytest.mark.parametrize("device_name", DEVICES)
def test_blocked_dequantize_linear_weight_is_a_per_block_qtensor(device_name):
    x = RNG.standard_normal((3, 32)).astype(np.float32)
    values = _ints(np.int8, 32, 6)
    scale = RNG.uniform(0.01, 0.05, (4, 6)).astype(np.float32)  # blocks of 8 along K
    dq, constants = _dq_weight(values, scale, _ints(np.int8, 4, 6), axis=0, block_size=8)
    model = graph_model([dq, helper.make_node("MatMul", ["x", "w"], ["y"])],
                        [("x", F32, [3, 32])], [("y", F32, None)], constants, 21)
    got, want, conversion, module = _run(model, {"x": x}, device_name)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    _assert_quantized(conversion, module)
    scheme = _quantized_weights(module)[0].scheme
    assert (scheme.granularity, scheme.axis, scheme.block_size) == ("block", 0, 8)


def test_blocks_that_do_not_divide_the_axis_keep_the_float_emulation():
    x = RNG.standard_normal((3, 30)).astype(np.float32)
    values = _ints(np.int8, 30, 6)
    scale = RNG.uniform(0.01, 0.05, (4, 6)).astype(np.float32)  # blocks of 8: the last is 6
    dq, constants = _dq_weight(values, scale, None, axis=0, block_size=8)
    model = graph_model([dq, helper.make_node("MatMul", ["x", "w"], ["y"])],
                        [("x", F32, [3, 30])], [("y", F32, None)], constants, 21)
    got, want, conversion, module = _run(model, {"x": x}, "ndarray")
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert not _quantized_weights(module) and "rt.quantized" not in conversion.source


# -------------------------------------------------------------------- hostile parameters
def _hostile_dq_matmul(scale: np.ndarray, zero: np.ndarray | None, axis: int = 1):
    dq, constants = _dq_weight(_ints(np.uint8, 8, 4), scale, zero, axis=axis)
    return graph_model([dq, helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                       [("x", F32, [2, 8])], [("y", F32, None)], constants, 13)


@pytest.mark.parametrize(("scale", "zero", "input_name", "words"), [
    (np.float32(0.0), None, "w_scale", "positive and finite"),
    (np.array([0.1, -0.2, 0.1, 0.1], np.float32), None, "w_scale", "positive and finite"),
    (np.array([0.1, 0.1, 0.1], np.float32), None, "w_scale", r"it must be \[4\]"),
    (np.array([0.1] * 4, np.float32), np.zeros(3, np.uint8), "w_zero", "they must match"),
])  # fmt: skip
def test_bad_dequantize_linear_weight_parameters_are_typed_errors(scale, zero, input_name, words):
    with pytest.raises(OnnxImportError, match=words) as error:
        convert(_hostile_dq_matmul(scale, zero))
    assert "'mm'" in str(error.value) and repr(input_name) in str(error.value)


def test_a_zero_point_of_another_dtype_is_a_typed_error():
    b_zero = np.array(300, np.int32)  # a u8 weight's zero point out of its range and dtype
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero",
                                              "y_scale", "y_zero"], ["y"], name="qmm")  # fmt: skip
    constants = [("a_scale", np.float32(0.1)), ("a_zero", np.uint8(0)), ("b", _ints(np.uint8, 4, 2)),
                 ("b_scale", np.float32(0.1)), ("b_zero", b_zero), ("y_scale", np.float32(0.1)),
                 ("y_zero", np.uint8(0))]  # fmt: skip
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", U8, [2, 4])],
                              [helper.make_tensor_value_info("y", U8, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    with pytest.raises(OnnxImportError, match="dtype int32, the values uint8") as error:
        convert(model)
    assert "'qmm'" in str(error.value) and "'b_zero'" in str(error.value)


def test_a_negative_qlinear_weight_scale_is_a_typed_error():
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero",
                                              "y_scale", "y_zero"], ["y"], name="qmm")  # fmt: skip
    constants = [("a_scale", np.float32(0.1)), ("a_zero", np.int8(0)), ("b", _ints(np.int8, 4, 2)),
                 ("b_scale", np.array([0.1, -0.1], np.float32)), ("b_zero", np.zeros(2, np.int8)),
                 ("y_scale", np.float32(0.1)), ("y_zero", np.int8(0))]  # fmt: skip
    model = graph_model([node], [("a", I8, [2, 4])], [("y", I8, None)], constants, 10)
    with pytest.raises(OnnxImportError, match=r"'b_scale' has the scale -0\.1"):
        convert(model)


# ------------------------------------------------------------------ real quantizer output
def _float_mlp() -> onnx.ModelProto:
    """MatMul + Add, Relu, Gemm (transB), as exporters write an MLP."""
    rng = np.random.default_rng(3)
    w1, b1 = rng.standard_normal((16, 32)) * 0.3, rng.standard_normal(32) * 0.1
    w2, b2 = rng.standard_normal((10, 32)) * 0.3, rng.standard_normal(10) * 0.1
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]), helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]  # fmt: skip
    constants = [(k, v.astype(np.float32)) for k, v in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))]
    return graph_model(nodes, [("x", F32, ["n", 16])], [("y", F32, ["n", 10])], constants, 17)


def _float_cnn() -> onnx.ModelProto:
    """Conv + bias, Relu, MaxPool, Flatten, MatMul."""
    rng = np.random.default_rng(4)
    w1, b1 = rng.standard_normal((8, 3, 3, 3)) * 0.3, rng.standard_normal(8) * 0.1
    w2 = rng.standard_normal((128, 5)) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("MatMul", ["f", "w2"], ["y"])]  # fmt: skip
    constants = [(k, v.astype(np.float32)) for k, v in (("w1", w1), ("b1", b1), ("w2", w2))]
    return graph_model(nodes, [("x", F32, ["n", 3, 8, 8])], [("y", F32, ["n", 5])], constants, 17)


_MODELS = {"mlp": (_float_mlp, (6, 16)), "cnn": (_float_cnn, (3, 3, 8, 8))}
_FORMATS = ["dynamic", "qdq_u8", "qdq_u8_per_channel", "qdq_i8", "qdq_i8_per_channel",
            "qoperator_u8", "qoperator_i8_per_channel"]  # fmt: skip


def _quantized(kind: str, fmt: str, folder) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """``kind``'s float model quantized by onnxruntime's quantizer in ``fmt``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    make, shape = _MODELS[kind]
    source, target = folder / f"{kind}.onnx", folder / f"{kind}_{fmt}.onnx"
    onnx.save(make(), source)
    if fmt == "dynamic":
        quantize_dynamic(source, target)
        return onnx.load(target), shape

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(5)
            self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)}
                                 for _ in range(4)])  # fmt: skip

        def get_next(self):
            return next(self.batches, None)

    activation = QuantType.QUInt8 if "_u8" in fmt else QuantType.QInt8
    quant_format = QuantFormat.QDQ if fmt.startswith("qdq") else QuantFormat.QOperator
    # QOperator's Add and Gemm are com.microsoft ops (QLinearAdd, QGemm), which ember lacks.
    ops = ["MatMul", "Conv"] if quant_format == QuantFormat.QOperator else None
    quantize_static(source, target, Batches(), quant_format=quant_format,
                    per_channel="per_channel" in fmt, activation_type=activation,
                    weight_type=QuantType.QInt8, op_types_to_quantize=ops)  # fmt: skip
    return onnx.load(target), shape


@pytest.fixture(scope="module")
def quantized_models(tmp_path_factory):
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on pre-processing
    folder = tmp_path_factory.mktemp("quantized")
    return {(kind, fmt): _quantized(kind, fmt, folder) for kind in _MODELS for fmt in _FORMATS}


def _output_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear making the model's output (0: a float output)."""
    output = model.graph.output[0].name
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if output in node.output and node.op_type == "DequantizeLinear":
            return float(constants[node.input[1]])
    return 0.0


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("fmt", _FORMATS)
@pytest.mark.parametrize("kind", sorted(_MODELS))
def test_onnxruntime_quantizer_output_imports_to_quantized_ops(quantized_models, kind, fmt,
                                                               device_name):  # fmt: skip
    model, shape = quantized_models[kind, fmt]
    x = np.random.default_rng(6).standard_normal((8, *shape[1:])).astype(np.float32)
    got, want, conversion, module = _run(model, {"x": x}, device_name)
    step = _output_step(model)
    if step:  # a requantized output: within two of its steps, equal in most places
        diff = np.abs(got[0] - want[0])
        assert diff.max() <= 2 * step + 1e-6, (diff.max(), step)
        assert (diff > 1e-6).mean() <= 0.05
    else:
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    # The mlp's Gemm stays float in QOperator format (quantized, it would be com.microsoft's QGemm).
    _assert_quantized(conversion, module, 1 if (kind, fmt[:9]) == ("mlp", "qoperator") else 2)


# ------------------------------------------------------------- MatMulInteger -> Cast -> Mul
def _scaled_matmul_integer(a_shape, b: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "a_zero"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["acc_f"], to=F32),
             helper.make_node("Mul", ["acc_f", "scale"], ["y"])]  # fmt: skip
    constants = [("b", b), ("a_zero", np.uint8(100)), ("scale", np.float32(1.5e-4))]
    return graph_model(nodes, [("a", U8, list(a_shape))], [("y", F32, None)], constants, 10)


@pytest.mark.parametrize("device_name", DEVICES)
def test_scaled_matmul_integer_takes_the_quantized_op_past_exact_f32_sums(device_name):
    """Sums past 2^24, but the graph scales them to floats: the quantized op, whose f32
    result is within f32 rounding of onnxruntime's."""
    a = _ints(np.uint8, 4, 1024)
    b = np.where(RNG.random((1024, 6)) < 0.5, -128, 127).astype(np.int8)
    got, want, conversion, module = _run(_scaled_matmul_integer(a.shape, b), {"a": a}, device_name)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    _assert_quantized(conversion, module)
    assert 'cast("i32")' not in conversion.source  # no i32 detour


def test_scaled_matmul_integer_of_a_batched_weight_keeps_the_float_emulation():
    a = _ints(np.uint8, 2, 3, 8)
    b = _ints(np.int8, 2, 8, 5)  # one weight per batch: no ember layout
    got, want, _, module = _run(_scaled_matmul_integer(a.shape, b), {"a": a}, "ndarray")
    np.testing.assert_array_equal(got[0], want[0])
    assert not _quantized_weights(module)


def test_a_fused_node_refuses_what_its_own_converter_refuses():
    """An attribute MatMul's converter does not know stays an error when the weight is a
    DequantizeLinear: fusing never widens what imports."""
    from ember.onnx.registry import UnsupportedOnnxError

    dq, constants = _dq_weight(_ints(np.int8, 8, 4), np.float32(0.1), None)
    matmul = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm", bogus=1)
    model = graph_model([dq, matmul], [("x", F32, [2, 8])], [("y", F32, None)], constants, 13)
    with pytest.raises(UnsupportedOnnxError, match="'bogus'"):
        convert(model)


def test_a_1d_qlinear_conv_keeps_the_float_emulation_and_declares_nothing_quantized():
    """ember's quantized convolution is 2-d: a 1-d QLinearConv stays emulated, exactly as
    onnxruntime, and leaves no unused quantized weight or bias behind."""
    x = _ints(np.uint8, 2, 3, 11)
    constants = [("x_scale", np.float32(0.03)), ("x_zero", np.uint8(120)), ("w", _ints(np.int8, 4, 3, 3)),
                 ("w_scale", np.float32(0.01)), ("w_zero", np.int8(0)), ("y_scale", np.float32(0.05)),
                 ("y_zero", np.uint8(128)), ("bias", RNG.integers(-500, 500, 4).astype(np.int32))]  # fmt: skip
    node = helper.make_node("QLinearConv", ["x", *[c for c, _ in constants]], ["y"], pads=[1, 1])
    model = graph_model([node], [("x", U8, [2, 3, 11])], [("y", U8, None)], constants, 10)
    got, want, conversion, module = _run(model, {"x": x}, "ndarray")
    np.testing.assert_array_equal(got[0], want[0])
    assert not _quantized_weights(module) and "_bias" not in conversion.source


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize(("elem", "blocked"), [(TensorProto.INT4, True), (TensorProto.UINT4, False)])
def test_int4_dequantize_linear_weights_are_int4_qtensors(device_name, elem, blocked):
    """Opset-21 4-bit weights (per block along K, or per column with zero points)."""
    signed = elem == TensorProto.INT4
    values = RNG.integers(-8 if signed else 0, 8 if signed else 16, (32, 6))
    params = (4, 6) if blocked else (6,)
    scale = RNG.uniform(0.05, 0.2, params).astype(np.float32)
    zero = RNG.integers(-8 if signed else 0, 8 if signed else 16, params)
    tensors = [helper.make_tensor("w_q", elem, [32, 6], values.reshape(-1).tolist()),
               numpy_helper.from_array(scale, "w_scale"),
               helper.make_tensor("w_zero", elem, list(params), zero.reshape(-1).tolist())]  # fmt: skip
    attrs = {"axis": 0, "block_size": 8} if blocked else {"axis": 1}
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], **attrs),
             helper.make_node("MatMul", ["x", "w"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [3, 32])],
                              [helper.make_tensor_value_info("y", F32, None)], tensors)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = RNG.standard_normal((3, 32)).astype(np.float32)
    got, want, conversion, module = _run(model, {"x": x}, device_name)
    zero_full = np.repeat(zero, 8, axis=0) if blocked else zero
    scale_full = np.repeat(scale, 8, axis=0) if blocked else scale
    weight = ((values - zero_full) * scale_full).astype(np.float32)
    _assert_float_product(got[0], want[0], x, weight, device_name)
    _assert_quantized(conversion, module)
    assert _quantized_weights(module)[0].scheme.value == "int4"


def test_the_quantized_weights_save_and_load_with_the_generated_module(quantized_models, tmp_path):
    """``import_onnx`` writes the QuantizedWeight fields' parts to the record; ``load_model``
    gives the same weights and outputs."""
    from ember.onnx.importer import import_onnx, load_model

    model, shape = quantized_models["mlp", "qdq_u8_per_channel"]
    x = ember.Tensor.from_data(np.random.default_rng(7).standard_normal((4, *shape[1:]))
                               .astype(np.float32))  # fmt: skip
    import_onnx(model, tmp_path, name="qmlp")
    loaded = load_model(tmp_path, name="qmlp")
    built = convert(model).build(ember.device("ndarray"))
    np.testing.assert_array_equal(loaded(x).to_numpy(), built(x).to_numpy())
    pairs = list(zip(_quantized_weights(loaded), _quantized_weights(built), strict=True))
    assert len(pairs) == 2
    for reloaded, imported in pairs:
        assert reloaded.scheme == imported.scheme and reloaded.shape == imported.shape
        np.testing.assert_array_equal(reloaded.values.to_numpy(), imported.values.to_numpy())
        np.testing.assert_array_equal(reloaded.scales.to_numpy(), imported.scales.to_numpy())
    assert "QuantizedWeight" in (tmp_path / "qmlp.py").read_text(encoding="utf-8")
