"""ONNX LSTM, GRU and RNN nodes against onnxruntime: the ember-layer path (constant
weights) and the loop path (sequence lengths, peepholes, clip, other activations, every
direction), on NdArray and Torch."""

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

SEQ, BATCH, D_IN, HIDDEN = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEVICES = {"ndarray": lambda: ember.device("ndarray"), "torch": lambda: ember.device("torch")}


@pytest.fixture(params=list(DEVICES))
def device(request):
    return DEVICES[request.param]()


def _model(op, *, directions=1, const_weights=True, bias=True, lens=None, const_lens=False,
           h0=False, c0=False, peep=False, layout=0, outputs=3, seed=0, **attrs):  # fmt: skip
    """One recurrent node; W/R/B (and P) are initializers or graph inputs."""
    rng = np.random.default_rng(seed)
    gates = GATES[op]
    weights = {
        "W": rng.standard_normal((directions, gates * HIDDEN, D_IN)).astype(np.float32) * 0.5,
        "R": rng.standard_normal((directions, gates * HIDDEN, HIDDEN)).astype(np.float32) * 0.5,
    }
    if bias:
        weights["B"] = rng.standard_normal((directions, 2 * gates * HIDDEN)).astype(np.float32)
    if peep:
        weights["P"] = rng.standard_normal((directions, 3 * HIDDEN)).astype(np.float32)
    x_shape = [BATCH, SEQ, D_IN] if layout else [SEQ, BATCH, D_IN]
    state_shape = [BATCH, directions, HIDDEN] if layout else [directions, BATCH, HIDDEN]
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    names = ["X", "W", "R", "B" if bias else "", "", "", "", ""]
    initializers = []
    if lens is not None:
        names[4] = "lens"
        if const_lens:
            initializers.append(numpy_helper.from_array(np.asarray(lens, np.int32), "lens"))
        else:
            feeds["lens"] = np.asarray(lens, dtype=np.int32)
            inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [BATCH]))
    for index, name, wanted in ((5, "h0", h0), (6, "c0", c0)):
        if wanted:
            names[index] = name
            feeds[name] = rng.standard_normal(state_shape).astype(np.float32)
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state_shape))
    if peep:
        names[7] = "P"
    for name, value in weights.items():
        if const_weights:
            initializers.append(numpy_helper.from_array(value, name))
        else:
            feeds[name] = value
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, value.shape))
    while names and not names[-1]:
        names.pop()
    out_names = ["Y", "Y_h", "Y_c"][: min(outputs, 3 if op == "LSTM" else 2)]
    direction = {1: "forward", 2: "bidirectional"}[directions]
    node = helper.make_node(op, names, out_names, hidden_size=HIDDEN,
                            direction=attrs.pop("direction", direction), **attrs)
    if layout:
        node.attribute.append(helper.make_attribute("layout", 1))
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in out_names]
    graph = helper.make_graph([node], "rnn", inputs, outs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return model, feeds


def _check(model, feeds, device, layer: str | None = None):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    conversion = convert(model)
    if layer is not None:
        assert f": {layer}\n" in conversion.source, conversion.source
    else:
        assert "for x_t" in conversion.source
    built = conversion.build(device)
    got = built(*(Tensor.from_data(feeds[n], device) for n in conversion.input_names))
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(g.to_numpy(), e, rtol=1e-4, atol=1e-5, err_msg=f"output {i}")


@pytest.mark.parametrize("case", [
    dict(op="LSTM"),
    dict(op="LSTM", h0=True, c0=True, direction="reverse", directions=1),
    dict(op="LSTM", directions=2, h0=True, c0=True),
    dict(op="LSTM", directions=2, bias=False, h0=True),
    dict(op="GRU", h0=True),
    dict(op="GRU", linear_before_reset=1, bias=False),
    dict(op="LSTM", lens=[SEQ] * BATCH, const_lens=True),
])  # fmt: skip
def test_constant_weights_become_ember_layers(case, device):
    case = dict(case)
    op, directions = case.pop("op"), case.pop("directions", 1)
    model, feeds = _model(op, directions=directions, **case)
    kind = "BiLstm" if directions == 2 else "Lstm" if op == "LSTM" else "Gru"
    _check(model, feeds, device, layer=kind)


def test_layer_path_with_batch_first_layout(device):
    """layout=1 (onnxruntime runs only layout 0): the same weights in both layouts agree."""
    model0, feeds0 = _model("LSTM", directions=2, h0=True, c0=True, seed=3)
    model1, _ = _model("LSTM", directions=2, h0=True, c0=True, seed=3, layout=1)
    session = ort.InferenceSession(model0.SerializeToString(), providers=["CPUExecutionProvider"])
    y, y_h, y_c = session.run(None, feeds0)
    conversion = convert(model1)
    assert ": BiLstm\n" in conversion.source
    feeds1 = {"X": feeds0["X"].swapaxes(0, 1), "h0": feeds0["h0"].swapaxes(0, 1),
              "c0": feeds0["c0"].swapaxes(0, 1)}  # fmt: skip
    got = conversion.build(device)(*(Tensor.from_data(feeds1[n], device)
                                     for n in conversion.input_names))
    np.testing.assert_allclose(got[0].to_numpy(), y.transpose(2, 0, 1, 3), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1].to_numpy(), y_h.swapaxes(0, 1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[2].to_numpy(), y_c.swapaxes(0, 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", [
    dict(op="LSTM", directions=2, lens=[5, 2, 4], h0=True, c0=True, peep=True),
    dict(op="LSTM", direction="reverse", lens=[2, 5, 3], const_lens=True, c0=True),
    dict(op="LSTM", const_weights=False, clip=0.7, input_forget=1),
    dict(op="LSTM", activations=["HardSigmoid", "LeakyRelu", "Softsign"],
         activation_alpha=[0.3, 0.2], activation_beta=[0.4]),
    dict(op="GRU", directions=2, lens=[1, 5, 3], h0=True),
    dict(op="GRU", direction="reverse", lens=[4, 5, 2], linear_before_reset=1),
    dict(op="GRU", const_weights=False, activations=["Sigmoid", "Relu"]),
    dict(op="RNN", directions=2, lens=[3, 5, 1], h0=True),
    dict(op="RNN", activations=["ScaledTanh"], activation_alpha=[0.8], activation_beta=[1.3]),
])  # fmt: skip
def test_other_nodes_run_a_loop(case, device):
    case = dict(case)
    op, directions = case.pop("op"), case.pop("directions", 1)
    model, feeds = _model(op, directions=directions, **case)
    _check(model, feeds, device)


def test_unknown_activation_is_reported():
    model, _ = _model("RNN", activations=["Swish"])
    with pytest.raises(UnsupportedOnnxError, match="activation 'swish' is not supported"):
        convert(model)


def test_directions_with_different_activations_are_reported():
    model, _ = _model("RNN", directions=2, activations=["Tanh", "Relu"])
    with pytest.raises(UnsupportedOnnxError, match="different activations"):
        convert(model)


def test_loop_gradients_equal_the_layer_gradients(device):
    """Gradients flow through the generated loop: with a clip too large to act, the loop
    path's input and weight gradients equal those of the (separately tested) BiLstm."""
    device = device.autodiff()
    layer_model, feeds = _model("LSTM", directions=2, outputs=2, seed=5)
    loop_model, _ = _model("LSTM", directions=2, outputs=2, seed=5, clip=1e6)
    x_grads, w_grads = [], []
    for model in (layer_model, loop_model):
        built = convert(model).build(device)
        x = Tensor.from_data(feeds["X"], device).require_grad()
        y, y_h = built(x)
        grads = ((y * y).sum() + y_h.sum()).backward()
        x_grads.append(x.grad(grads).to_numpy())
        params = dict(built.params())
        if len(x_grads) == 1:  # BiLstm: [d_input, 4 * hidden] per direction, gates i f g o
            w_grads.append(np.stack([
                params[f"{name}.input_transform.weight"].val().grad(grads).to_numpy()
                for name in ("lstm_0.forward_lstm", "lstm_0.reverse_lstm")]))
        else:  # the loop: [directions, d_input, 4 * hidden], ONNX's gates i o f c
            onnx_order = params["lstm_0_w"].val().grad(grads).to_numpy()
            blocks = onnx_order.reshape(2, D_IN, 4, HIDDEN)[:, :, [0, 2, 3, 1]]
            w_grads.append(blocks.reshape(2, D_IN, 4 * HIDDEN))
    np.testing.assert_allclose(x_grads[1], x_grads[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w_grads[1], w_grads[0], rtol=1e-4, atol=1e-5)
