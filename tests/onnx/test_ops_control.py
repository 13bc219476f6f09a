"""Control flow (If, Loop, Scan) on hand-built models: outer-scope reads, constant
conditions, while loops, empty loops, reversed scans, nesting, both backends, gradients
through a loop, and sequence-typed bodies (unsupported, with a clear error)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

RNG = np.random.default_rng(3)
W = RNG.standard_normal((4, 4)).astype(np.float32)
DEVICES = ["ndarray", "torch"]


def _info(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _f(name, dims):
    return _info(name, TensorProto.FLOAT, dims)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "control", inputs, outputs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, feeds: dict[str, np.ndarray], device_name: str = "ndarray"):
    """Runs ``model`` in ember and in onnxruntime on ``feeds``; every output must match."""
    data = model.SerializeToString()
    conversion = convert(data)
    device = ember.device(device_name)
    got = conversion.build(device)(*(Tensor.from_data(feeds[n], device)
                                     for n in conversion.input_names))
    got = got if isinstance(got, tuple) else (got,)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = g.to_numpy()
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    return conversion


# ---------------------------------------------------------------------------------- If
def _if_model():
    """y = x @ w + 1 if sum(x) > 0 else -relu(x) * scale; ``scale`` is computed in the main
    graph and read only inside the else branch, ``w`` is an initializer read by then."""
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), _const("one", np.float32(1.0)),
         helper.make_node("Add", ["xw", "one"], ["then_y"])],
        "then", [], [_f("then_y", ["n", 4])])  # fmt: skip
    else_ = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "scale"], ["m"]),
         helper.make_node("Neg", ["m"], ["else_y"])],
        "else", [], [_f("else_y", ["n", 4])])  # fmt: skip
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        _const("zero", np.float32(0.0)),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        _const("half", np.float32(0.5)),
        helper.make_node("Add", ["half", "half"], ["scale_base"]),
        helper.make_node("Mul", ["scale_base", "x_scale"], ["scale"]),
        helper.make_node("If", ["positive"], ["y"], then_branch=then, else_branch=else_),
    ]
    return _model(nodes, [_f("x", ["n", 4]), _f("x_scale", [1])], [_f("y", ["n", 4])],
                  [("w", W)])


@pytest.mark.parametrize("device_name", DEVICES)
def test_if_takes_the_branch_of_the_runtime_condition(device_name):
    model = _if_model()
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    scale = np.array([2.5], np.float32)
    for sign in (1.0, -1.0):
        xs = (np.abs(x) * sign).astype(np.float32)
        conversion = _check(model, {"x": xs, "x_scale": scale}, device_name)
    source = conversion.source
    assert "if positive:" in source and "else:" in source


def test_if_with_a_constant_condition_keeps_only_the_taken_branch():
    then = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["a"])], "then", [], [_f("a", [2])])
    else_ = helper.make_graph([helper.make_node("Tanh", ["x"], ["b"])], "else", [], [_f("b", [2])])
    const_then = helper.make_graph([_const("c", np.array([1.0, 2.0], np.float32))], "then", [],
                                   [_f("c", [2])])  # fmt: skip
    nodes = [
        _const("flag", np.array(False)),
        helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=else_),
        helper.make_node("Not", ["flag"], ["flag2"]),
        helper.make_node("If", ["flag2"], ["k"], then_branch=const_then, else_branch=else_),
        helper.make_node("Add", ["y", "k"], ["z"]),
    ]
    model = _model(nodes, [_f("x", [2])], [_f("z", [2])])
    conversion = _check(model, {"x": np.array([0.3, -1.2], np.float32)})
    forward = conversion.source.split("def forward", 1)[1].split("def build", 1)[0]
    assert "if " not in forward and "sigmoid" not in forward and ".tanh()" in forward


def test_a_weight_chosen_by_a_constant_condition_stays_trainable():
    then = helper.make_graph([helper.make_node("Identity", ["w"], ["a"])], "then", [],
                             [_f("a", [4, 4])])  # fmt: skip
    else_ = helper.make_graph([_const("b", np.zeros((4, 4), np.float32))], "else", [],
                              [_f("b", [4, 4])])  # fmt: skip
    nodes = [_const("flag", np.array(True)),
             helper.make_node("If", ["flag"], ["chosen"], then_branch=then, else_branch=else_),
             helper.make_node("Mul", ["x", "chosen"], ["y"])]
    model = _model(nodes, [_f("x", [4, 4])], [_f("y", [4, 4])], [("w", W)])
    x_np = RNG.standard_normal((4, 4)).astype(np.float32)
    _check(model, {"x": x_np})
    device = ember.device("ndarray").autodiff()
    net = convert(model.SerializeToString()).build(device)
    grads = net(Tensor.from_data(x_np, device)).sum().backward()
    trainable = [p for _, p in net.params() if p.require_grad]
    assert len(trainable) == 1, "w should stay a trainable parameter"
    np.testing.assert_allclose(trainable[0].val().grad(grads).to_numpy(), x_np, rtol=1e-6)


# ---------------------------------------------------------------------------------- Loop
def _loop_model(trip: bool, cond: bool):
    """Carried (acc, count): acc = acc @ w * 0.5 + bias (``bias`` from the outer graph),
    count += i; cond_out = sum(acc) < limit; the scan output is acc's row sums."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["acc_in", "w"], ["prod"]),
            _const("h", np.float32(0.5)),
            helper.make_node("Mul", ["prod", "h"], ["scaled"]),
            helper.make_node("Add", ["scaled", "bias"], ["acc_out"]),
            helper.make_node("Add", ["count_in", "i"], ["count_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
            helper.make_node("Less", ["s", "limit"], ["cond_out"]),
            helper.make_node("ReduceSum", ["acc_out", "axes1"], ["rows"], keepdims=0),
        ],
        "body",
        [_info("i", TensorProto.INT64, []), _info("c", TensorProto.BOOL, []),
         _f("acc_in", [2, 4]), _info("count_in", TensorProto.INT64, [])],
        [_info("cond_out", TensorProto.BOOL, []), _f("acc_out", [2, 4]),
         _info("count_out", TensorProto.INT64, []), _f("rows", [2])],
    )  # fmt: skip
    nodes = [
        helper.make_node("Relu", ["x"], ["bias"]),
        _const("zero", np.int64(0)),
        helper.make_node("Loop", ["m" if trip else "", "go" if cond else "", "x", "zero"],
                         ["acc", "count", "trace"], body=body),
    ]
    inputs = [_f("x", [2, 4]), _f("limit", [])]
    if trip:
        inputs.append(_info("m", TensorProto.INT64, []))
    if cond:
        inputs.append(_info("go", TensorProto.BOOL, []))
    outputs = [_f("acc", [2, 4]), _info("count", TensorProto.INT64, []), _f("trace", [None, 2])]
    return _model(nodes, inputs, outputs, [("w", W), ("axes1", np.array([1], np.int64))])


@pytest.mark.parametrize(("trip", "cond"), [(True, False), (True, True), (False, True)])
def test_loop_with_trip_count_condition_or_both(trip, cond):
    model = _loop_model(trip, cond)
    x = np.abs(RNG.standard_normal((2, 4))).astype(np.float32)
    feeds = {"x": x, "limit": np.array(40.0, np.float32)}
    if trip:
        feeds["m"] = np.array(6)
    if cond:
        feeds["go"] = np.array(True)
    _check(model, feeds)


def test_loop_on_torch_and_with_zero_iterations():
    model = _loop_model(True, True)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    feeds = {"x": x, "limit": np.array(1e9, np.float32), "m": np.array(4), "go": np.array(True)}
    _check(model, feeds, "torch")
    # No iteration: the carried values come back as given and the scan output is empty.
    _check(model, {**feeds, "m": np.array(0)})
    _check(model, {**feeds, "go": np.array(False)})


def test_gradients_flow_through_a_loop():
    model = _loop_model(True, False)
    device = ember.device("ndarray").autodiff()
    net = convert(model.SerializeToString()).build(device)
    x_np = RNG.standard_normal((2, 4)).astype(np.float32)
    x = Tensor.from_data(x_np, device).require_grad()
    acc, _, trace = net(x, Tensor.from_data(np.float32(0.0), device),
                        Tensor.from_data(np.int64(3), device))
    grads = ((acc * acc).sum() + trace.sum()).backward()
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x_np, requires_grad=True)
    wt = torch.tensor(W, requires_grad=True)
    acc_t, rows = xt, []
    for _ in range(3):
        acc_t = acc_t @ wt * 0.5 + torch.relu(xt)
        rows.append(acc_t.sum(1))
    ((acc_t * acc_t).sum() + torch.stack(rows).sum()).backward()
    np.testing.assert_allclose(x.grad(grads).to_numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    # The MatMul by the initializer w became a Linear layer, whose weight is w as is.
    weight = next(p for path, p in net.params() if path.endswith("weight"))
    np.testing.assert_allclose(weight.val().grad(grads).to_numpy(), wt.grad.numpy(), rtol=1e-4,
                               atol=1e-5)


# ---------------------------------------------------------------------------------- Scan
def test_scan_with_axes_directions_and_two_states():
    """State a sums the steps, state b multiplies them by w; x is scanned along axis 1 from
    the end, the per-step output is stacked along axis 1 in reverse."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a_in", "step"], ["a_out"]),
         helper.make_node("MatMul", ["step", "w"], ["sw"]),
         helper.make_node("Mul", ["b_in", "sw"], ["b_out"]),
         helper.make_node("Sub", ["a_out", "b_out"], ["diff"])],
        "body", [_f("a_in", [3, 4]), _f("b_in", [3, 4]), _f("step", [3, 4])],
        [_f("a_out", [3, 4]), _f("b_out", [3, 4]), _f("diff", [3, 4])],
    )  # fmt: skip
    node = helper.make_node("Scan", ["a0", "b0", "x"], ["a", "b", "d"], body=body,
                            num_scan_inputs=1, scan_input_axes=[1], scan_input_directions=[1],
                            scan_output_axes=[-1], scan_output_directions=[1])
    model = _model([node], [_f("a0", [3, 4]), _f("b0", [3, 4]), _f("x", [3, 5, 4])],
                   [_f("a", [3, 4]), _f("b", [3, 4]), _f("d", [3, 4, 5])], [("w", W * 0.3)])
    feeds = {"a0": RNG.standard_normal((3, 4)).astype(np.float32),
             "b0": RNG.standard_normal((3, 4)).astype(np.float32),
             "x": RNG.standard_normal((3, 5, 4)).astype(np.float32)}
    for device_name in DEVICES:
        _check(model, feeds, device_name)


# ---------------------------------------------------------------------------------- nesting
def test_if_inside_a_loop_reads_values_of_both_enclosing_graphs():
    """Each step adds ``x`` (main graph) when the step index is even, else ``odd`` (a value
    of the loop body)."""
    then = helper.make_graph([helper.make_node("Add", ["v_in", "x"], ["t"])], "then", [],
                             [_f("t", [3])])  # fmt: skip
    else_ = helper.make_graph([helper.make_node("Sub", ["v_in", "odd"], ["e"])], "else", [],
                              [_f("e", [3])])  # fmt: skip
    body = helper.make_graph(
        [_const("two", np.int64(2)), helper.make_node("Mod", ["i", "two"], ["r"]),
         _const("z", np.int64(0)), helper.make_node("Equal", ["r", "z"], ["even"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "fi"], ["odd"]),
         helper.make_node("If", ["even"], ["v_out"], then_branch=then, else_branch=else_),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "body", [_info("i", TensorProto.INT64, []), _info("c", TensorProto.BOOL, []),
                 _f("v_in", [3])],
        [_info("c_out", TensorProto.BOOL, []), _f("v_out", [3])],
    )  # fmt: skip
    nodes = [_const("m", np.int64(5)),
             helper.make_node("Loop", ["m", "", "x"], ["v"], body=body)]
    model = _model(nodes, [_f("x", [3])], [_f("v", [3])])
    _check(model, {"x": np.array([1.0, -2.0, 0.5], np.float32)})


def test_an_unsupported_op_inside_a_body_is_named():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("SequenceConstruct", ["v_in", "x"], ["seq"], name="pack"),
         helper.make_node("ConcatFromSequence", ["seq"], ["v_out"], axis=0)],
        "body", [_info("i", TensorProto.INT64, []), _info("c", TensorProto.BOOL, []),
                 _f("v_in", [None])],
        [_info("c_out", TensorProto.BOOL, []), _f("v_out", [None])],
    )  # fmt: skip
    model = _model([helper.make_node("Loop", ["m", "", "x"], ["v"], body=body)],
                   [_f("x", [2]), _info("m", TensorProto.INT64, [])], [_f("v", [None])])
    with pytest.raises(UnsupportedOnnxError, match=r"node 'pack' \(op SequenceConstruct"):
        convert(model.SerializeToString())
