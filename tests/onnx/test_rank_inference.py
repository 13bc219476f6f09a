"""Models whose ranks ONNX's shape inference leaves unknown: they import and match
onnxruntime (a Reshape to a run-time shape before opset-11 Softmax, convolutions, an LSTM
and poolings inside If branches, an If nested in a Loop, a Scan), ember's own inference
rules give exact ranks and shapes on small graphs, and rank-generic code runs one import
on inputs of several ranks."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_node_cases import compare  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.facts import Fact, broadcast_shapes, fits, join, merge  # noqa: E402
from ember.onnx.importer import Conversion, convert  # noqa: E402
from ember.onnx.infer import infer, infer_values  # noqa: E402
from ember.onnx.ir import Graph, graph_of  # noqa: E402

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(13)


def _info(name, elem, dims):
    """A value info; ``dims`` None leaves the shape (and so the rank) out."""
    return helper.make_tensor_value_info(name, elem, dims)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "ranks", [_info(*i) for i in inputs],
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k)
                                           for k, v in initializers])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _onnx_shapes(model) -> dict[str, tuple | None]:
    """What ONNX's own inference says of every value, subgraphs included (None: no rank)."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    found: dict[str, tuple | None] = {}

    def visit(graph):
        for info in [*graph.value_info, *graph.input, *graph.output]:
            tensor = info.type.tensor_type
            found[info.name] = (tuple(d.dim_value or d.dim_param or None for d in tensor.shape.dim)
                                if tensor.HasField("shape") else None)  # fmt: skip
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)

    visit(inferred.graph)
    return found


def _check(model, *feeds: tuple[np.ndarray, ...]) -> Conversion:
    """Imports ``model`` once and runs it on each set of inputs in ``feeds``; every output
    must match onnxruntime's."""
    conversion = convert(model)
    device = ember.device("ndarray")
    module = conversion.build(device)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in model.graph.input]
    for inputs in feeds:
        got = module(*(Tensor.from_data(x, device) for x in inputs))
        got = got if isinstance(got, tuple) else (got,)
        want = session.run(None, dict(zip(names, inputs)))
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            compare(g.to_numpy(), np.asarray(w), f"output {i} on inputs of shapes "
                    f"{[np.shape(x) for x in inputs]}")
    return conversion


def _floats(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _body(conversion: Conversion, op_type: str, attr: str = "body") -> Graph:
    """The parsed (and inferred) subgraph ``attr`` of the first ``op_type`` node."""
    node = next(n for n in conversion.graph.nodes if n.op_type == op_type)
    return conversion.graph.body(node.attrs[attr])


# ------------------------------------------------------------------ Reshape to a run-time shape
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("length", [3, "k"], ids=["length-known", "rank-unknown"])
def test_reshape_to_runtime_shape_before_opset11_softmax(op, length):
    """The shape comes from an input: with its length known the rank is inferred (ONNX
    gives none); without, the same import runs inputs of rank 2, 3 and 4."""
    model = _model([helper.make_node("Reshape", ["x", "s"], ["r"]),
                    helper.make_node(op, ["r"], ["y"], axis=1)],
                   [("x", F, ["n", 24]), ("s", I64, [length])], ["y"], opset=11)  # fmt: skip
    assert _onnx_shapes(model)["r"] is None
    feeds = [(_floats(2, 24), np.array([2, 3, 8]))]
    if length == "k":
        feeds += [(_floats(2, 24), np.array([4, 12])), (_floats(2, 24), np.array([2, 3, 2, 4]))]
    conversion = _check(model, *feeds)
    if length == 3:
        assert conversion.graph.values["r"].shape == (None, None, None)
    else:
        assert conversion.graph.values["r"].shape is None
        assert "rt.flatten(" in conversion.source


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_shape_concat_reshape_before_opset11_softmax(op):
    """Paddle2ONNX's pattern: the target is the batch dim (Shape, Slice), a dim computed
    from another input, and -1, joined by Concat. ONNX gives Reshape no rank; ember gives
    it ``[n, ?, ?]``."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Slice", ["sx", "zero", "one"], ["batch"]),
        helper.make_node("ReduceMax", ["t"], ["rows"], keepdims=1),
        helper.make_node("Concat", ["batch", "rows", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node(op, ["r"], ["y"], axis=1),
    ]
    model = _model(nodes, [("x", F, ["n", 12]), ("t", I64, [2])], ["y"],
                   [("zero", np.array([0])), ("one", np.array([1])),
                    ("minus_one", np.array([-1]))], opset=11)  # fmt: skip
    assert _onnx_shapes(model)["r"] is None
    conversion = _check(model, (_floats(2, 12), np.array([3, 1])),
                        (_floats(5, 12), np.array([1, 4])))  # fmt: skip
    assert conversion.graph.values["r"].shape == ("n", None, None)
    assert conversion.graph.values["target"].shape == (3,)


@pytest.mark.parametrize("length", [4, "k"], ids=["length-known", "rank-unknown"])
def test_flatten_and_reductions_after_runtime_reshape(length):
    """Flatten, ReduceMean over axes of both signs and over every axis, ReduceLogSumExp
    over every axis: axes are normalized when the model runs where the rank is unknown."""
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["r"]),
        helper.make_node("Flatten", ["r"], ["flat"], axis=2),
        helper.make_node("ReduceMean", ["r"], ["mixed"], axes=[0, -1], keepdims=0),
        helper.make_node("ReduceMean", ["r"], ["every"]),
        helper.make_node("ReduceLogSumExp", ["r"], ["lse"], keepdims=0),
        helper.make_node("ReduceMax", ["r"], ["last"], axes=[-1], keepdims=1),
    ]
    model = _model(nodes, [("x", F, ["n", 24]), ("s", I64, [length])],
                   ["flat", "mixed", "every", "lse", "last"], opset=13)  # fmt: skip
    assert _onnx_shapes(model)["r"] is None
    feeds = [(_floats(2, 24), np.array([2, 3, 2, 4]))]
    if length == "k":
        feeds += [(_floats(2, 24), np.array([2, 6, 4])), (_floats(2, 24), np.array([1, 2, 3, 2, 4]))]
    conversion = _check(model, *feeds)
    if length == 4:
        assert conversion.graph.values["flat"].shape == (None, None)
        assert conversion.graph.values["mixed"].shape == (None, None)
        assert conversion.graph.values["every"].shape == (1, 1, 1, 1)
        assert conversion.graph.values["lse"].shape == ()


# ------------------------------------------------------------------ If branches
def _conv_pool_if_model(length):
    """h = x reshaped to a run-time shape [N, 3, H, W]; then: Conv 3x3 + MaxPool, else:
    Conv 1x1 + AveragePool, chosen by the input ``c``."""
    w3, w1 = _floats(4, 3, 3, 3), _floats(4, 3, 1, 1)
    then = helper.make_graph(
        [helper.make_node("Conv", ["h", "w3"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node("MaxPool", ["a"], ["then_y"], kernel_shape=[2, 2], strides=[2, 2])],
        "then", [], [helper.make_empty_tensor_value_info("then_y")])  # fmt: skip
    otherwise = helper.make_graph(
        [helper.make_node("Conv", ["h", "w1"], ["b"]),
         helper.make_node("AveragePool", ["b"], ["else_y"], kernel_shape=[2, 2], strides=[2, 2])],
        "else", [], [helper.make_empty_tensor_value_info("else_y")])  # fmt: skip
    nodes = [helper.make_node("Reshape", ["x", "s"], ["h"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=otherwise)]
    return _model(nodes, [("x", F, ["n", 48]), ("s", I64, [length]), ("c", BOOL, [])], ["y"],
                  [("w3", w3), ("w1", w1)], opset=13)  # fmt: skip


@pytest.mark.parametrize("taken", [True, False], ids=["then", "else"])
@pytest.mark.parametrize("length", [4, "k"], ids=["length-known", "rank-unknown"])
def test_conv_and_pools_inside_if_branches(taken, length):
    model = _conv_pool_if_model(length)
    shapes = _onnx_shapes(model)
    assert shapes["h"] is None and shapes.get("a") is None
    conversion = _check(model, (_floats(2, 48), np.array([2, 3, 4, 4]), np.array(taken)),
                        (_floats(3, 48), np.array([1, 3, 8, 6]), np.array(taken)))  # fmt: skip
    then = _body(conversion, "If", "then_branch")
    if length == 4:
        assert conversion.graph.values["h"].shape == (None, None, None, None)
        assert then.values["a"].shape == (None, 4, None, None)
        assert conversion.graph.values["y"].shape == (None, 4, None, None)
    else:
        # The rank still comes from the weight (Conv) and the kernel (the pools).
        assert then.values["a"].shape == (None, 4, None, None)


def test_global_pool_inside_if_with_rank_read_at_run_time():
    """GlobalAveragePool / GlobalMaxPool of a value of unknown rank in each branch: one
    import pools 1-d and 2-d inputs."""
    then = helper.make_graph([helper.make_node("GlobalAveragePool", ["h"], ["p"])], "then", [],
                             [helper.make_empty_tensor_value_info("p")])  # fmt: skip
    otherwise = helper.make_graph([helper.make_node("GlobalMaxPool", ["h"], ["q"])], "else", [],
                                  [helper.make_empty_tensor_value_info("q")])  # fmt: skip
    nodes = [helper.make_node("Reshape", ["x", "s"], ["h"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=otherwise)]
    model = _model(nodes, [("x", F, ["n", 24]), ("s", I64, ["k"]), ("c", BOOL, [])], ["y"],
                   opset=13)
    feeds = [(_floats(2, 24), np.array(s), np.array(c)) for s in ([2, 3, 8], [2, 3, 2, 4])
             for c in (True, False)]  # fmt: skip
    conversion = _check(model, *feeds)
    assert "rt.global_pool(" in conversion.source


def _lstm_weights(hidden, features, directions=1):
    gates = 4 * hidden
    return (_floats(directions, gates, features) * 0.5, _floats(directions, gates, hidden) * 0.5,
            _floats(directions, 2 * gates) * 0.1)  # fmt: skip


@pytest.mark.parametrize("taken", [True, False], ids=["then", "else"])
def test_lstm_inside_if_branches(taken):
    """A forward LSTM in one branch, a bidirectional one in the other, on a sequence that
    is the input reshaped to a run-time shape [T, N, 6]."""
    w, r, b = _lstm_weights(5, 6)
    w2, r2, b2 = _lstm_weights(5, 6, 2)
    then = helper.make_graph(
        [helper.make_node("LSTM", ["seq", "w", "r", "b"], ["y1", "h1"], hidden_size=5),
         helper.make_node("Relu", ["h1"], ["then_y"])],
        "then", [], [helper.make_empty_tensor_value_info("then_y")])  # fmt: skip
    otherwise = helper.make_graph(
        [helper.make_node("LSTM", ["seq", "w2", "r2", "b2"], ["y2", "h2"], hidden_size=5,
                          direction="bidirectional"),
         helper.make_node("ReduceMax", ["h2"], ["else_y"], axes=[0], keepdims=1)],
        "else", [], [helper.make_empty_tensor_value_info("else_y")])  # fmt: skip
    nodes = [helper.make_node("Reshape", ["x", "s"], ["seq"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=otherwise)]
    model = _model(nodes, [("x", F, ["t", 12]), ("s", I64, [3]), ("c", BOOL, [])], ["y"],
                   [("w", w), ("r", r), ("b", b), ("w2", w2), ("r2", r2), ("b2", b2)],
                   opset=13)  # fmt: skip
    assert _onnx_shapes(model)["seq"] is None
    conversion = _check(model, (_floats(4, 12), np.array([4, 2, 6]), np.array(taken)),
                        (_floats(3, 12), np.array([3, 2, 6]), np.array(taken)))  # fmt: skip
    # [1, batch, 5] whichever branch runs (ONNX names the batch dims it cannot tell).
    y = conversion.graph.values["y"].shape
    assert len(y) == 3 and (y[0], y[2]) == (1, 5)
    y2 = _body(conversion, "If", "else_branch").values["y2"].shape
    assert len(y2) == 4 and (y2[1], y2[3]) == (2, 5)


# ------------------------------------------------------------------ Loop and Scan
def _loop_model(with_scan: bool):
    """A loop of ``n`` steps carrying ``h``; each step an If on ``c`` convolves h (then) or
    takes its relu (else); with ``with_scan``, each step's channel means are stacked."""
    w = _floats(3, 3, 3, 3) * 0.3
    then = helper.make_graph([helper.make_node("Conv", ["h", "w"], ["a"], pads=[1, 1, 1, 1])],
                             "then", [], [helper.make_empty_tensor_value_info("a")])  # fmt: skip
    otherwise = helper.make_graph([helper.make_node("Relu", ["h"], ["b"])], "else", [],
                                  [helper.make_empty_tensor_value_info("b")])  # fmt: skip
    body_nodes = [helper.make_node("If", ["c"], ["h2"], then_branch=then, else_branch=otherwise),
                  helper.make_node("Identity", ["cond"], ["cond_out"])]
    outputs = [_info("cond_out", BOOL, []), helper.make_empty_tensor_value_info("h2")]
    if with_scan:
        body_nodes.append(helper.make_node("ReduceMean", ["h2"], ["m"], axes=[2, 3], keepdims=0))
        outputs.append(helper.make_empty_tensor_value_info("m"))
    body = helper.make_graph(body_nodes, "body",
                             [_info("i", I64, []), _info("cond", BOOL, []),
                              helper.make_empty_tensor_value_info("h")], outputs)  # fmt: skip
    loop_outputs = ["y", "means"] if with_scan else ["y"]
    nodes = [helper.make_node("Loop", ["n", "", "x"], loop_outputs, body=body)]
    return _model(nodes, [("x", F, ["batch", 3, 6, 6]), ("c", BOOL, []), ("n", I64, [])],
                  loop_outputs, [("w", w)], opset=13)  # fmt: skip


@pytest.mark.parametrize("with_scan", [False, True], ids=["carried", "with-scan-output"])
@pytest.mark.parametrize("taken", [True, False], ids=["then", "else"])
def test_if_nested_in_loop(taken, with_scan):
    """ONNX leaves the loop-carried value's rank unknown inside the body, so the Conv in
    the If had no rank; ember carries [batch, 3, 6, 6] through every step."""
    model = _loop_model(with_scan)
    assert _onnx_shapes(model)["h"] is None
    conversion = _check(model, (_floats(2, 3, 6, 6), np.array(taken), np.array(3)),
                        (_floats(1, 3, 6, 6), np.array(taken), np.array(1)))  # fmt: skip
    body = _body(conversion, "Loop")
    assert body.values["h"].shape == ("batch", 3, 6, 6)
    assert body.body(next(n for n in body.nodes if n.op_type == "If").attrs["then_branch"]) \
        .values["a"].shape == ("batch", 3, 6, 6)
    assert conversion.graph.values["y"].shape == ("batch", 3, 6, 6)
    if with_scan:
        assert conversion.graph.values["means"].shape == (None, "batch", 3)


def test_scan_with_state_of_runtime_shape():
    """A Scan (opset 11) whose state starts as a run-time reshape: each step takes an
    opset-11 LogSoftmax of the state, adds a slice and takes a Softmax of the sum; the
    stacked outputs gain the scan dim (at axes 0 and 1)."""
    # onnxruntime wants the body's outputs declared with shapes; its input acc is not.
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "row"], ["acc_out"]),
         helper.make_node("LogSoftmax", ["acc"], ["before"], axis=1),
         helper.make_node("Softmax", ["acc_out"], ["soft"], axis=1)],
        "body", [helper.make_empty_tensor_value_info("acc"), _info("row", F, [2, 4])],
        [_info("acc_out", F, [2, 4]), _info("before", F, [2, 4]), _info("soft", F, [2, 4])])
    nodes = [helper.make_node("Reshape", ["init", "s"], ["acc0"]),
             helper.make_node("Scan", ["acc0", "xs"], ["final", "befores", "steps"], body=body,
                              num_scan_inputs=1, scan_output_axes=[0, 1])]  # fmt: skip
    model = _model(nodes, [("init", F, [8]), ("s", I64, [2]), ("xs", F, [5, 2, 4])],
                   ["final", "befores", "steps"], opset=11)  # fmt: skip
    shapes = _onnx_shapes(model)
    assert shapes["acc0"] is None and shapes["acc"] is None
    conversion = _check(model, (_floats(8), np.array([2, 4]), _floats(5, 2, 4)))
    # The body's state holds for the start (a run-time reshape: any 2-d) and every step;
    # after five steps, the state is a step's sum.
    assert _body(conversion, "Scan").values["acc"].shape == (None, None)
    assert conversion.graph.values["final"].shape == (2, 4)
    assert conversion.graph.values["befores"].shape == (5, 2, 4)
    assert conversion.graph.values["steps"].shape == (2, 5, 4)


# ------------------------------------------------------------------ convolution by rank at run time
def test_conv_whose_rank_is_read_at_run_time():
    """Input and weight of unknown shape: ``rt.conv`` picks the 1-d or 2-d convolution and
    computes SAME padding (uneven for a kernel of 2) from the tensors; one import runs
    both."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], auto_pad="SAME_UPPER"),
             helper.make_node("Conv", ["x", "w"], ["z"])]
    model = _model(nodes, [("x", F, None), ("w", F, None), ("b", F, None)], ["y", "z"])
    conversion = _check(model, (_floats(1, 2, 7), _floats(3, 2, 3), _floats(3)),
                        (_floats(2, 2, 7, 6), _floats(3, 2, 3, 2), _floats(3)))  # fmt: skip
    assert "rt.conv(" in conversion.source


def test_conv_rank_from_weight_and_pool_rank_from_kernel():
    """An input of unknown rank: Conv takes its rank from the constant weight (an ember
    Conv2d layer), MaxPool from kernel_shape."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], strides=[2, 2]),
             helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[2, 2])]
    model = _model(nodes, [("x", F, None)], ["y"], [("w", _floats(2, 3, 3, 3))])
    conversion = _check(model, (_floats(1, 3, 9, 9),))
    assert "Conv2d" in conversion.source
    assert conversion.graph.values["a"].shape == (None, 2, None, None)
    assert conversion.graph.values["y"].shape == (None, 2, None, None)


# ------------------------------------------------------------------ the rules on small graphs
def _inferred(nodes, inputs, constants=(), opset=17) -> dict:
    """Shapes after ember's inference alone (ONNX's is not run): name -> (elem, shape)."""
    proto = helper.make_graph(nodes, "rules", [_info(*i) for i in inputs], [],
                              initializer=[numpy_helper.from_array(np.asarray(v), k)
                                           for k, v in constants])  # fmt: skip
    graph = graph_of(proto, {"": opset})
    infer(graph)
    return {name: (info.elem_type, info.shape) for name, info in graph.values.items()}


def _n(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, **attrs)


class _T(NamedTuple):
    """An expected element type and shape (a bare shape checks the shape alone)."""

    elem: int
    shape: tuple | None


# (id, nodes, inputs, constants, opset, expected {name: shape or (elem, shape)})
RULE_CASES = [
    ("broadcast", [_n("Add", ["a", "b"], ["y"])], [("a", F, ["n", 1, 4]), ("b", F, [3, 1])],
     (), 17, {"y": _T(F, ("n", 3, 4))}),
    ("compare-bool", [_n("Less", ["a", "b"], ["y"])], [("a", F, [2, 3]), ("b", F, [3])],
     (), 17, {"y": _T(BOOL, (2, 3))}),
    ("where", [_n("Where", ["c", "a", "b"], ["y"])],
     [("c", BOOL, [2, 1]), ("a", I64, [1, 3]), ("b", I64, [2, 3])], (), 17, {"y": _T(I64, (2, 3))}),
    ("reshape-computed-shape",
     [_n("Shape", ["x"], ["sx"]), _n("Gather", ["sx", "zero"], ["batch"]),
      _n("Unsqueeze", ["batch", "axes0"], ["batch1"]), _n("Concat", ["batch1", "m1"], ["s"], axis=0),
      _n("Reshape", ["x", "s"], ["y"])],
     [("x", F, ["n", 3, 4])],
     [("zero", np.array(0)), ("axes0", np.array([0])), ("m1", np.array([-1]))], 17,
     {"sx": _T(I64, (3,)), "batch": _T(I64, ()), "s": _T(I64, (2,)), "y": _T(F, ("n", None))}),
    ("reshape-static", [_n("Reshape", ["x", "s"], ["y"])], [("x", F, [2, 3, 4])],
     [("s", np.array([0, -1]))], 17, {"y": (2, 12)}),
    ("reshape-length-known", [_n("Reshape", ["x", "s"], ["y"])],
     [("x", F, ["n", 12]), ("s", I64, [3])], (), 17, {"y": (None, None, None)}),
    ("reshape-length-unknown", [_n("Reshape", ["x", "s"], ["y"])],
     [("x", F, ["n", 12]), ("s", I64, ["k"])], (), 17, {"y": None}),
    ("reshape-v1-attr", [_n("Reshape", ["x"], ["y"], shape=[-1, 6])], [("x", F, [4, 3])], (), 1,
     {"y": (2, 6)}),
    ("flatten", [_n("Flatten", ["x"], ["a"], axis=2), _n("Flatten", ["x"], ["b"], axis=0),
                 _n("Flatten", ["x"], ["c"], axis=-1)],
     [("x", F, ["n", 3, 4, 5])], (), 17, {"a": (None, 20), "b": (1, None), "c": (None, 5)}),
    ("flatten-unknown-rank", [_n("Flatten", ["x"], ["y"], axis=1)], [("x", F, None)], (), 17,
     {"y": (None, None)}),
    ("transpose", [_n("Transpose", ["x"], ["a"], perm=[2, 0, 1]), _n("Transpose", ["x"], ["b"])],
     [("x", F, ["n", 3, 4])], (), 17, {"a": (4, "n", 3), "b": (4, 3, "n")}),
    ("unsqueeze-attr", [_n("Unsqueeze", ["x"], ["y"], axes=[0, -1])], [("x", F, [3, 4])], (), 11,
     {"y": (1, 3, 4, 1)}),
    ("unsqueeze-input", [_n("Unsqueeze", ["x", "ax"], ["y"])], [("x", F, [3, 4])],
     [("ax", np.array([1]))], 13, {"y": (3, 1, 4)}),
    ("squeeze", [_n("Squeeze", ["x"], ["a"]), _n("Squeeze", ["x", "ax"], ["b"])],
     [("x", F, [1, 3, 1])], [("ax", np.array([-1]))], 13, {"a": (3,), "b": (1, 3)}),
    ("squeeze-dynamic-dims", [_n("Squeeze", ["x"], ["y"])], [("x", F, ["n", 1])], (), 13,
     {"y": None}),
    ("slice", [_n("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], [("x", F, ["n", 10])],
     [("st", np.array([2])), ("en", np.array([-1])), ("ax", np.array([1])),
      ("sp", np.array([2]))], 17, {"y": ("n", 4)}),
    ("slice-runtime-bounds", [_n("Slice", ["x", "st", "en"], ["y"])],
     [("x", F, ["n", 10]), ("st", I64, [1]), ("en", I64, [1])], (), 17, {"y": (None, None)}),
    ("expand", [_n("Expand", ["x", "s"], ["y"])], [("x", F, [3, 1])], [("s", np.array([2, 1, 4]))],
     17, {"y": (2, 3, 4)}),
    ("expand-length-known", [_n("Expand", ["x", "s"], ["y"])], [("x", F, [3, 1]), ("s", I64, [3])],
     (), 17, {"y": (None, None, None)}),
    ("cast", [_n("Cast", ["x"], ["y"], to=I64)], [("x", F, [2, 3])], (), 17, {"y": _T(I64, (2, 3))}),
    ("concat", [_n("Concat", ["a", "b"], ["y"], axis=-1)], [("a", F, ["n", 3]), ("b", F, [None, 4])],
     (), 17, {"y": ("n", 7)}),
    ("split", [_n("Split", ["x", "sp"], ["a", "b"], axis=1)], [("x", F, ["n", 10])],
     [("sp", np.array([3, 7]))], 17, {"a": ("n", 3), "b": ("n", 7)}),
    ("gather-indices", [_n("Gather", ["x", "i"], ["y"], axis=1)],
     [("x", F, ["n", 5, 6]), ("i", I64, [2, 3])], (), 17, {"y": ("n", 2, 3, 6)}),
    ("reduce-attr", [_n("ReduceMean", ["x"], ["a"], axes=[1], keepdims=0),
                     _n("ReduceMax", ["x"], ["b"], keepdims=0)],
     [("x", F, ["n", 3, 4])], (), 13, {"a": ("n", 4), "b": ()}),
    ("reduce-input", [_n("ReduceSum", ["x", "ax"], ["a"]), _n("ReduceSum", ["x", "rt"], ["b"]),
                      _n("ReduceSum", ["x", "rt"], ["c"], keepdims=0),
                      _n("ReduceSum", ["x"], ["d"], noop_with_empty_axes=1)],
     [("x", F, ["n", 3, 4]), ("rt", I64, [1])], [("ax", np.array([-1]))], 13,
     {"a": ("n", 3, 1), "b": (None, None, None), "c": None, "d": ("n", 3, 4)}),
    ("argmax", [_n("ArgMax", ["x"], ["y"], axis=-1, keepdims=0)], [("x", F, ["n", 3, 4])], (), 17,
     {"y": _T(I64, ("n", 3))}),
    ("matmul", [_n("MatMul", ["a", "w"], ["y1"]), _n("MatMul", ["v", "b"], ["y2"]),
                _n("MatMul", ["b", "v"], ["y3"]), _n("MatMul", ["v", "v"], ["y4"])],
     [("a", F, ["n", 3, 4]), ("w", F, [4, 5]), ("v", F, [4]), ("b", F, [2, 4, 4])], (), 17,
     {"y1": ("n", 3, 5), "y2": (2, 4), "y3": (2, 4), "y4": ()}),
    ("gemm", [_n("Gemm", ["a", "b"], ["y"], transA=1, transB=1)], [("a", F, [4, 3]), ("b", F, [5, 4])],
     (), 17, {"y": (3, 5)}),
    ("conv", [_n("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
              _n("Conv", ["y", "w"], ["b"], auto_pad="SAME_UPPER", strides=[2, 2]),
              _n("Conv", ["u", "w"], ["c"], dilations=[2, 2])],
     [("x", F, ["n", 3, 32, 32]), ("y", F, [1, 3, 31, 31]), ("u", F, None)],
     [("w", np.zeros((8, 3, 3, 3), np.float32))], 17,
     {"a": ("n", 8, 16, 16), "b": (1, 8, 16, 16), "c": (None, 8, None, None)}),
    ("conv-transpose", [_n("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], group=1)],
     [("x", F, [1, 4, 5, 5])], [("w", np.zeros((4, 2, 3, 3), np.float32))], 17,
     {"y": (1, 2, 11, 11)}),
    ("pools", [_n("MaxPool", ["x"], ["a", "ai"], kernel_shape=[2, 2], strides=[2, 2]),
               _n("AveragePool", ["v"], ["b"], kernel_shape=[3], pads=[1, 1]),
               _n("GlobalAveragePool", ["x"], ["c"]),
               _n("MaxPool", ["x"], ["d"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
               _n("MaxPool", ["u"], ["e"], kernel_shape=[3])],
     [("x", F, ["n", 3, 8, 8]), ("v", F, ["n", 3, 10]), ("u", F, None)], (), 17,
     {"a": ("n", 3, 4, 4), "ai": _T(I64, ("n", 3, 4, 4)), "b": ("n", 3, 10), "c": ("n", 3, 1, 1),
      "d": ("n", 3, None, None), "e": (None, None, None)}),
    ("softmax-dropout-identity",
     [_n("Softmax", ["x"], ["a"], axis=1), _n("Dropout", ["a"], ["b", "mask"]),
      _n("Identity", ["b"], ["c"])], [("x", F, ["n", 3, 4])], (), 17,
     {"a": ("n", 3, 4), "mask": _T(BOOL, ("n", 3, 4)), "c": _T(F, ("n", 3, 4))}),
    ("lstm", [_n("LSTM", ["x", "w", "r"], ["y", "h", "c"], hidden_size=4,
                 direction="bidirectional")],
     [("x", F, [7, "n", 5]), ("w", F, [2, 16, 5]), ("r", F, [2, 16, 4])], (), 17,
     {"y": (7, 2, "n", 4), "h": (2, "n", 4), "c": (2, "n", 4)}),
    ("lstm-layout", [_n("LSTM", ["x", "w", "r"], ["y", "h"], hidden_size=4, layout=1)],
     [("x", F, ["n", 7, 5]), ("w", F, [1, 16, 5]), ("r", F, [1, 16, 4])], (), 14,
     {"y": ("n", 7, 1, 4), "h": ("n", 1, 4)}),
    ("gru-hidden-from-r", [_n("GRU", ["x", "w", "r"], ["y"])],
     [("x", F, [7, 2, 5])], [("w", np.zeros((1, 12, 5), np.float32)),
                             ("r", np.zeros((1, 12, 4), np.float32))], 17, {"y": (7, 1, 2, 4)}),
    ("norms", [_n("LayerNormalization", ["x", "g"], ["y", "mean", "inv"], axis=1),
               _n("BatchNormalization", ["z", "s", "s", "s", "s"], ["b"])],
     [("x", F, ["n", 3, 4]), ("g", F, [3, 4]), ("z", F, ["n", 3, 5, 5]), ("s", F, [3])], (), 17,
     {"y": ("n", 3, 4), "mean": _T(F, ("n", 1, 1)), "b": ("n", 3, 5, 5)}),
    ("shape-size-constant-of-shape",
     [_n("Shape", ["x"], ["s"], start=1), _n("ConstantOfShape", ["s"], ["k"]),
      _n("Size", ["x"], ["count"]), _const("c", np.array([[1, 2, 3]]))],
     [("x", F, ["n", 3, 4])], (), 17,
     {"s": _T(I64, (2,)), "k": _T(F, (3, 4)), "count": _T(I64, ()), "c": _T(I64, (1, 3))}),
    ("range", [_n("Range", ["a", "b", "d"], ["y"])], [],
     [("a", np.array(1)), ("b", np.array(10)), ("d", np.array(3))], 17, {"y": _T(I64, (3,))}),
    ("unknown-ops", [_n("Einsum", ["x"], ["a"], equation="ij->ji"), _n("Relu", ["a"], ["b"]),
                     helper.make_node("Foo", ["x"], ["c"], domain="com.example")],
     [("x", F, [2, 3])], (), 17, {"a": None, "b": None, "c": None}),
    ("hostile-lengths", [_n("Reshape", ["x", "s"], ["r"]), _n("ConstantOfShape", ["s"], ["k"]),
                         _n("Expand", ["x", "s"], ["e"])],
     [("x", F, [2, 3]), ("s", I64, [10**12])], (), 17, {"r": None, "k": None, "e": None}),
    ("malformed-nodes", [_n("Concat", ["x", "x"], ["a"], axis=5),
                         _n("Transpose", ["x"], ["b"], perm=[0, 0]),
                         _n("Gather", ["x", "i"], ["c"], axis=-7),
                         _n("Split", ["x"], ["d", "e"], axis=9)],
     [("x", F, [2, 3]), ("i", I64, [2])], (), 17,
     {"a": None, "b": None, "c": None, "d": None, "e": None}),
]


@pytest.mark.parametrize("nodes,inputs,constants,opset,expected",
                         [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_rule(nodes, inputs, constants, opset, expected):
    values = _inferred(nodes, inputs, constants, opset)
    for name, want in expected.items():
        elem, shape = values.get(name, (0, None))
        if isinstance(want, _T):
            assert (elem, shape) == tuple(want), name
        else:
            assert shape == want, name


def _if_graph(then_dims, else_dims):
    then = helper.make_graph([_n("Reshape", ["x", "ts"], ["t"])], "then", [],
                             [helper.make_empty_tensor_value_info("t")],
                             initializer=[numpy_helper.from_array(np.array(then_dims), "ts")])
    otherwise = helper.make_graph([_n("Reshape", ["x", "es"], ["e"])], "else", [],
                                  [helper.make_empty_tensor_value_info("e")],
                                  initializer=[numpy_helper.from_array(np.array(else_dims), "es")])
    return [_n("If", ["c"], ["y"], then_branch=then, else_branch=otherwise)]


@pytest.mark.parametrize("then_dims,else_dims,expected", [
    ([2, 12], [2, 12], (2, 12)),
    ([2, 12], [4, 6], (None, None)),
    ([2, 12], [2, 3, 4], None),
], ids=["agree", "dims-differ", "ranks-differ"])
def test_if_output_is_what_both_branches_tell(then_dims, else_dims, expected):
    values = _inferred(_if_graph(then_dims, else_dims), [("x", F, [24]), ("c", BOOL, [])])
    assert values["y"][1] == expected


def test_loop_carried_value_that_grows_keeps_its_rank():
    """A carried [n, k] that doubles its second dim each step: [n, ?] holds at every step;
    the scan output gains the trip count (3, no condition) as its first dim."""
    body = helper.make_graph(
        [_n("Concat", ["v", "v"], ["v2"], axis=1), _n("Identity", ["cond"], ["cond_out"]),
         _n("ReduceMax", ["v2"], ["total"], axes=[1], keepdims=0)],
        "body", [_info("i", I64, []), _info("cond", BOOL, []),
                 helper.make_empty_tensor_value_info("v")],
        [_info("cond_out", BOOL, []), helper.make_empty_tensor_value_info("v2"),
         helper.make_empty_tensor_value_info("total")])  # fmt: skip
    nodes = [_n("Loop", ["three", "", "x"], ["y", "totals"], body=body)]
    values = _inferred(nodes, [("x", F, ["n", 1])], [("three", np.array(3))])
    assert values["y"] == _T(F, ("n", None))
    assert values["totals"] == _T(F, (3, "n"))


def test_scan_outputs_gain_the_sequence_dim():
    body = helper.make_graph(
        [_n("Add", ["s", "row"], ["s2"]), _n("Relu", ["s2"], ["out"])], "body",
        [helper.make_empty_tensor_value_info("s"), helper.make_empty_tensor_value_info("row")],
        [helper.make_empty_tensor_value_info("s2"), helper.make_empty_tensor_value_info("out")])
    nodes = [_n("Scan", ["s0", "xs"], ["final", "a"], body=body, num_scan_inputs=1),
             _n("Scan", ["s0", "xs"], ["final2", "b"], body=body, num_scan_inputs=1,
                scan_output_axes=[-1])]
    values = _inferred(nodes, [("s0", F, [2, 4]), ("xs", F, ["t", 2, 4])], opset=11)
    assert values["final"][1] == (2, 4)
    assert values["a"][1] == ("t", 2, 4)
    assert values["b"][1] == (2, 4, "t")


def test_shape_arithmetic_carries_elements():
    """Integer tensors of shape arithmetic carry their elements (a dim's name where the
    model gives one, None where nothing tells): what PyTorch and Paddle exports compute
    their reshape targets with."""
    nodes = [
        _n("Shape", ["x"], ["sx"]),
        _n("Slice", ["sx", "one", "big"], ["tail"]),
        _n("Gather", ["sx", "last"], ["width"]),
        _n("Div", ["width", "two"], ["half"]),
        _n("Mul", ["half", "three"], ["more"]),
        _n("Unsqueeze", ["half", "axes0"], ["half1"]),
        _n("Concat", ["half1", "t", "tail"], ["target"], axis=0),
        _n("Cast", ["target"], ["as_int"], to=TensorProto.INT32),
        _n("Slice", ["sx", "big_neg", "minus_big", "zero1", "minus_one"], ["reversed"]),
    ]
    proto = helper.make_graph(nodes, "values", [_info("x", F, ["n", 3, 8]), _info("t", I64, [2])],
                              [], initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (
                                  ("one", [1]), ("big", [2**62]), ("last", -1), ("two", 2),
                                  ("three", 3), ("axes0", [0]), ("big_neg", [-1]),
                                  ("minus_big", [-(2**62)]), ("zero1", [0]),
                                  ("minus_one", [-1]))])  # fmt: skip
    facts = infer_values(graph_of(proto, {"": 17}))
    assert facts["sx"].value == ("n", 3, 8)
    assert facts["tail"].value == (3, 8)
    assert facts["width"] == Fact(I64, (), (8,))
    assert facts["half"].value == (4,) and facts["more"].value == (12,)
    assert facts["target"] == Fact(I64, (5,), (4, None, None, 3, 8))
    assert facts["as_int"] == Fact(TensorProto.INT32, (5,), (4, None, None, 3, 8))
    assert facts["reversed"].value == (8, 3, "n")


def test_shape_arithmetic_stays_bounded():
    """Squaring a known int 300 times would make a number of 2^300 digits: elements past
    int64 are dropped, quickly."""
    nodes = [_n("Mul", [f"v{i}", f"v{i}"], [f"v{i + 1}"]) for i in range(300)]
    proto = helper.make_graph(nodes, "squares", [], [],
                              initializer=[numpy_helper.from_array(np.array([3]), "v0")])
    start = time.perf_counter()
    facts = infer_values(graph_of(proto, {"": 17}))
    assert time.perf_counter() - start < 5
    assert facts["v5"].value == (3**32,)
    assert facts["v6"].value == (None,) and facts["v300"] == Fact(I64, (1,), (None,))


def test_facts_merge_join_fit():
    """ONNX's word stands (its rank, its sizes); rules fill the gaps."""
    assert merge(Fact(1, (2, None)), Fact(0, (None, 3))) == Fact(1, (2, 3))
    assert merge(Fact(1, (2, 3)), Fact(1, (2, 3, 4))) == Fact(1, (2, 3))
    assert merge(Fact(0, None), Fact(7, ("n",), ("n",))) == Fact(7, ("n",), ("n",))
    assert merge(Fact(1, ("a",)), Fact(1, (5,))).shape == (5,)
    assert join(Fact(1, (2, "n")), Fact(1, (3, "n"))) == Fact(1, (None, "n"))
    assert join(Fact(1, (2,)), Fact(6, (2, 1))) == Fact(0, None)
    assert fits(Fact(1, (2, 3)), Fact(1, (None, 3)))
    assert not fits(Fact(1, (2, 4)), Fact(1, (None, 3)))
    assert not fits(Fact(1, None), Fact(1, (None,)))
    assert broadcast_shapes([("n", 1, 4), (3, 1), ()]) == ("n", 3, 4)
    assert broadcast_shapes([(2, 3), (4, 3)]) == (None, 3)  # sizes that do not broadcast
    assert broadcast_shapes([("a", 3), ("b", 3)]) == (None, 3)
    assert broadcast_shapes([(2,), None]) is None


def test_nested_loops_stay_within_budget():
    """Loops nested 14 deep would take 3^14 body walks; the walk stops at its budget and
    leaves the graph as ONNX's inference had it, quickly."""
    body = helper.make_graph([_n("Identity", ["v"], ["v_out"]),
                              _n("Identity", ["cond"], ["cond_out"])], "body0",
                             [_info("i", I64, []), _info("cond", BOOL, []),
                              helper.make_empty_tensor_value_info("v")],
                             [_info("cond_out", BOOL, []),
                              helper.make_empty_tensor_value_info("v_out")])  # fmt: skip
    for depth in range(1, 15):
        # Each level's carried value grows by one dim per step, so every level needs all
        # three walks of its body.
        inner = _n("Loop", ["two", "", "g"], ["g_out"], body=body)
        body = helper.make_graph(
            [_n("Unsqueeze", ["v", "zero"], ["g"]), inner, _n("Identity", ["cond"], ["cond_out"])],
            f"body{depth}", [_info("i", I64, []), _info("cond", BOOL, []),
                             helper.make_empty_tensor_value_info("v")],
            [_info("cond_out", BOOL, []), helper.make_empty_tensor_value_info("g_out")])
    nodes = [_n("Loop", ["two", "", "x"], ["y"], body=body)]
    start = time.perf_counter()
    values = _inferred(nodes, [("x", F, [2])], [("two", np.array(2)), ("zero", np.array([0]))])
    assert time.perf_counter() - start < 10
    assert values["y"][1] is None


# ------------------------------------------------------------------ more ops on inputs of unknown rank
def _x(*shape):
    return _floats(*shape)


# (id, nodes, inputs, constants, opset, feeds): ``x`` is declared without a shape; each
# feed is one set of inputs, of different ranks where the op allows.
GENERIC_CASES = [
    ("hardmax-13", [_n("Hardmax", ["x"], ["y"], axis=1)], [("x", F, None)], (), 13,
     [(_x(2, 3),), (_x(2, 3, 4),)]),
    ("batch-norm-runtime-stats", [_n("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
     [("x", F, None), ("s", F, [3]), ("b", F, [3]), ("m", F, [3]), ("v", F, [3])], (), 15,
     [(_x(2, 3, 4), _x(3), _x(3), _x(3), np.abs(_x(3)) + 0.5),
      (_x(2, 3, 4, 5), _x(3), _x(3), _x(3), np.abs(_x(3)) + 0.5)]),
    ("batch-norm-layer", [_n("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
     [("x", F, None)], [("s", _x(3)), ("b", _x(3)), ("m", _x(3)), ("v", np.abs(_x(3)) + 0.5)], 15,
     [(_x(2, 3, 4, 5),)]),
    ("batch-norm-training", [_n("BatchNormalization", ["x", "s", "b", "m", "v"],
                                ["y", "running_mean", "running_var"], training_mode=1)],
     [("x", F, None)], [("s", _x(3)), ("b", _x(3)), ("m", _x(3)), ("v", np.abs(_x(3)) + 0.5)], 15,
     [(_x(2, 3, 4),), (_x(2, 3, 4, 5),)]),
    ("rms-norm", [_n("RMSNormalization", ["x", "g"], ["y"], axis=-2)], [("x", F, None)],
     [("g", _x(3, 4))], 23, [(_x(3, 4),), (_x(2, 3, 4),)]),
    ("layer-norm-last", [_n("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"])],
     [("x", F, None)], [("g", _x(4)), ("b", _x(4))], 17, [(_x(3, 4),), (_x(2, 3, 4),)]),
    ("layer-norm-axis-1", [_n("LayerNormalization", ["x", "g"], ["y", "mean", "inv"], axis=1)],
     [("x", F, None)], [("g", _x(3, 4))], 17, [(_x(2, 3, 4),)]),
    ("gather-elements", [_n("GatherElements", ["x", "i"], ["y"], axis=-1)],
     [("x", F, None), ("i", I64, None)], (), 13,
     [(_x(3, 4), np.array([[0, -1], [2, 3], [1, 1]])),
      (_x(2, 3, 4), np.array([[[0, -1]] * 3] * 2))]),
    ("scatter-elements", [_n("ScatterElements", ["x", "i", "u"], ["y"], axis=-1)],
     [("x", F, None), ("i", I64, None), ("u", F, None)], (), 13,
     [(_x(3, 4), np.array([[0], [3], [-1]]), _x(3, 1)),
      (_x(2, 3, 4), np.array([[[1]] * 3] * 2), _x(2, 3, 1))]),
    ("one-hot", [_n("OneHot", ["i", "depth", "values"], ["y"], axis=0),
                 _n("OneHot", ["i", "depth", "values"], ["z"])],
     [("i", I64, None)], [("depth", np.array(4)), ("values", np.array([0.0, 1.0], np.float32))],
     11, [(np.array([0, 3, -1]),), (np.array([[1, 2], [0, -4]]),)]),
    ("reverse-sequence", [_n("ReverseSequence", ["x", "lens"], ["y"], time_axis=0, batch_axis=1)],
     [("x", F, None), ("lens", I64, [2])], (), 10,
     [(_x(4, 2), np.array([3, 1])), (_x(4, 2, 3), np.array([4, 2]))]),
    ("pad-rank-from-pads", [_n("Pad", ["x", "pads"], ["y"], mode="reflect")], [("x", F, None)],
     [("pads", np.array([1, 0, 2, 1]))], 13, [(_x(3, 4),)]),
    ("quantize-per-axis", [_n("QuantizeLinear", ["x", "scale", "zero"], ["y"], axis=1)],
     [("x", F, None)], [("scale", np.array([0.1, 0.2, 0.05], np.float32)),
                        ("zero", np.array([0, 10, 128], np.uint8))], 13,
     [(_x(2, 3),), (_x(2, 3, 4),)]),
    ("conv-transpose-rank-from-weight", [_n("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])],
     [("x", F, None)], [("w", _x(3, 2, 3, 3))], 13, [(_x(1, 3, 4, 4),)]),
    ("instance-norm", [_n("InstanceNormalization", ["x", "s", "b"], ["y"])],
     [("x", F, None)], [("s", _x(3)), ("b", _x(3))], 13, [(_x(2, 3, 5),), (_x(2, 3, 4, 5),)]),
    ("transpose-default", [_n("Transpose", ["x"], ["y"])], [("x", F, None)], (), 13,
     [(_x(2, 3),), (_x(2, 3, 4),)]),
]


@pytest.mark.parametrize("nodes,inputs,constants,opset,feeds", [c[1:] for c in GENERIC_CASES],
                         ids=[c[0] for c in GENERIC_CASES])
def test_op_on_input_of_unknown_rank(nodes, inputs, constants, opset, feeds):
    outputs = [o for node in nodes for o in node.output]
    model = _model(nodes, inputs, outputs, constants, opset)
    assert _onnx_shapes(model)[inputs[0][0]] is None
    _check(model, *feeds)


# ------------------------------------------------------------------ a real export
def test_pytorch_export_with_convolutions_inside_if():
    """A scripted PyTorch module (TorchScript exporter, opset 11) whose ``if`` on a tensor
    becomes an If with a Conv and a pooling in each branch, on a reshape to a run-time
    shape, then an LSTM and a Softmax: ONNX gives the Conv's input no rank."""
    torch = pytest.importorskip("torch")
    import io
    import warnings

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(3, 4, 1)
            self.lstm = torch.nn.LSTM(4, 5, batch_first=True)

        def forward(self, x, flag):
            h = x.reshape(x.shape[0], 3, -1, 4)
            if bool(flag.sum() > 0):
                y = torch.nn.functional.max_pool2d(self.conv(h), 2)
            else:
                y = torch.nn.functional.avg_pool2d(self.conv2(h), 2)
            out, (last, _) = self.lstm(y.flatten(2).transpose(1, 2))
            return torch.softmax(out, dim=-1), last

    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(Net().eval()), (torch.randn(2, 48), torch.ones(1)),
                          buffer, dynamo=False, opset_version=11, input_names=["x", "flag"],
                          dynamic_axes={"x": {0: "batch", 1: "length"}})  # fmt: skip
    model = onnx.load_from_string(buffer.getvalue())
    assert any(n.op_type == "If" for n in model.graph.node)
    _check(model, (_floats(3, 48), np.array([1.0], np.float32)),
           (_floats(2, 96), np.array([-1.0], np.float32)))  # fmt: skip
