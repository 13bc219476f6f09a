"""Lstm, BiLstm and Gru against torch.nn.LSTM / GRU: outputs, final states, gradients of the
input, the initial state and every parameter; the PyTorch adapter; defaults; errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record

from ember import Tensor
from ember.backend.errors import ArgumentError, ConfigError, RecordMismatchError, ShapeError
from ember.nn._util import is_training
from ember.nn.initializer import Initializer, XavierNormal
from ember.nn.rnn import BiLstmConfig, GruConfig, LstmConfig, LstmState

D_INPUT, D_HIDDEN, BATCH, SEQ = 3, 4, 2, 5
CONFIGS = {"lstm": LstmConfig, "bilstm": BiLstmConfig, "gru": GruConfig}
TORCH_NAMES = {
    "input_transform.weight": "weight_ih_l0",
    "input_transform.bias": "bias_ih_l0",
    "hidden_transform.weight": "weight_hh_l0",
    "hidden_transform.bias": "bias_hh_l0",
}


def torch_rnn(kind: str, bias: bool = True, batch_first: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    make = torch.nn.GRU if kind == "gru" else torch.nn.LSTM
    return make(D_INPUT, D_HIDDEN, bias=bias, batch_first=batch_first,
                bidirectional=kind == "bilstm")  # fmt: skip


def torch_name(path: str) -> str:
    """The torch parameter name of an ember parameter path."""
    if path.startswith("forward_lstm."):
        return TORCH_NAMES[path.removeprefix("forward_lstm.")]
    if path.startswith("reverse_lstm."):
        return TORCH_NAMES[path.removeprefix("reverse_lstm.")] + "_reverse"
    return TORCH_NAMES[path]


def as_ember_layout(grad: torch.Tensor) -> torch.Tensor:
    return grad.T if grad.dim() == 2 else grad


def state_shape(kind: str) -> list[int]:
    return [2, BATCH, D_HIDDEN] if kind == "bilstm" else [BATCH, D_HIDDEN]


def compare(kind, device, with_state, bias=True, batch_first=True):
    """Runs ember's layer and torch's on the same weights and inputs, forward and backward."""
    reference = torch_rnn(kind, bias, batch_first)
    config = CONFIGS[kind](D_INPUT, D_HIDDEN, bias=bias, batch_first=batch_first)
    layer = config.init(device).load_record(pytorch_record(reference))
    directions = 2 if kind == "bilstm" else 1
    x_shape = (BATCH, SEQ, D_INPUT) if batch_first else (SEQ, BATCH, D_INPUT)
    x_ref = torch.randn(x_shape, requires_grad=True)
    h0_ref = torch.randn(directions, BATCH, D_HIDDEN, requires_grad=True)
    c0_ref = torch.randn(directions, BATCH, D_HIDDEN, requires_grad=True)
    if kind == "gru":
        y_ref, h_ref = reference(x_ref, h0_ref if with_state else None)
        c_ref = None
    else:
        y_ref, (h_ref, c_ref) = reference(x_ref, (h0_ref, c0_ref) if with_state else None)
    shape = state_shape(kind)
    up_y, up_h, up_c = torch.randn(y_ref.shape), torch.randn(shape), torch.randn(shape)
    loss = (y_ref * up_y).sum() + (h_ref.reshape(shape) * up_h).sum()
    if c_ref is not None:
        loss = loss + (c_ref.reshape(shape) * up_c).sum()
    loss.backward()

    training = is_training(device)
    x, h0, c0 = (from_torch(t, device) for t in (x_ref, h0_ref.reshape(shape), c0_ref.reshape(shape)))
    if training:
        x, h0, c0 = x.require_grad(), h0.require_grad(), c0.require_grad()
    if kind == "gru":
        y, h = layer(x, h0 if with_state else None)
        c = None
    else:
        y, (c, h) = layer(x, LstmState(c0, h0) if with_state else None)
    assert y.shape == tuple(y_ref.shape)
    assert_close(y, y_ref)
    assert_close(h, h_ref.reshape(shape))
    if c is not None:
        assert_close(c, c_ref.reshape(shape))
    if not training:
        return
    total = (y * from_torch(up_y, device)).sum() + (h * from_torch(up_h, device)).sum()
    if c is not None:
        total = total + (c * from_torch(up_c, device)).sum()
    grads = total.backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-4)
    if with_state:
        assert_close(h0.grad(grads), h0_ref.grad.reshape(shape), atol=1e-4)
        if kind != "gru":
            assert_close(c0.grad(grads), c0_ref.grad.reshape(shape), atol=1e-4)
    torch_params = dict(reference.named_parameters())
    ember_params = dict(layer.params())
    assert sorted(torch_name(path) for path in ember_params) == sorted(torch_params)
    for path, param in ember_params.items():
        expected = as_ember_layout(torch_params[torch_name(path)].grad)
        assert_close(param.val().grad(grads), expected, atol=1e-4)


@pytest.mark.parametrize("with_state", [True, False], ids=["state", "zero-state"])
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_forward_and_gradients_match_torch(ad_device, kind, with_state):
    compare(kind, ad_device, with_state)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_without_bias_and_sequence_first_match_torch(ad_device, kind):
    compare(kind, ad_device, with_state=True, bias=False, batch_first=False)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_inference_on_a_base_device_matches_torch(base_device, kind):
    compare(kind, base_device, with_state=True)


def test_gru_reset_before_matches_a_torch_reference(ad_device):
    """reset_after=False has no torch.nn layer: compare with the formula written in torch."""
    reference = torch_rnn("gru")
    gru = GruConfig(D_INPUT, D_HIDDEN, reset_after=False).init(ad_device)
    gru = gru.load_record(pytorch_record(reference))
    w_ih, w_hh = reference.weight_ih_l0, reference.weight_hh_l0
    b_ih, b_hh = reference.bias_ih_l0, reference.bias_hh_l0
    x_ref = torch.randn(BATCH, SEQ, D_INPUT, requires_grad=True)
    h_ref = h0_ref = torch.randn(BATCH, D_HIDDEN, requires_grad=True)
    outputs = []
    for t in range(SEQ):
        xr, xz, xn = (x_ref[:, t] @ w_ih.T + b_ih).chunk(3, -1)
        w_hr, w_hz, w_hn = w_hh.chunk(3, 0)
        b_hr, b_hz, b_hn = b_hh.chunk(3, 0)
        r = torch.sigmoid(xr + h_ref @ w_hr.T + b_hr)
        z = torch.sigmoid(xz + h_ref @ w_hz.T + b_hz)
        n = torch.tanh(xn + (r * h_ref) @ w_hn.T + b_hn)
        h_ref = (1 - z) * n + z * h_ref
        outputs.append(h_ref)
    y_ref = torch.stack(outputs, 1)
    (y_ref.pow(2).sum() + h_ref.sum()).backward()

    x = from_torch(x_ref, ad_device).require_grad()
    h0 = from_torch(h0_ref, ad_device).require_grad()
    y, h = gru(x, h0)
    assert_close(y, y_ref)
    assert_close(h, h_ref)
    grads = ((y * y).sum() + h.sum()).backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-4)
    assert_close(h0.grad(grads), h0_ref.grad, atol=1e-4)
    assert_close(gru.hidden_transform.weight.val().grad(grads), w_hh.grad.T, atol=1e-4)
    assert_close(gru.hidden_transform.bias.val().grad(grads), b_hh.grad, atol=1e-4)
    assert_close(gru.input_transform.weight.val().grad(grads), w_ih.grad.T, atol=1e-4)


def test_a_longer_sequence_matches_torch(ad_device):
    """17 steps: blocks of 4 steps and a remainder, in both directions."""
    reference = torch_rnn("bilstm")
    bilstm = BiLstmConfig(D_INPUT, D_HIDDEN).init(ad_device).load_record(pytorch_record(reference))
    x_ref = torch.randn(BATCH, 17, D_INPUT, requires_grad=True)
    y_ref, _ = reference(x_ref)
    y_ref.pow(2).sum().backward()
    x = from_torch(x_ref, ad_device).require_grad()
    y, _ = bilstm(x)
    assert_close(y, y_ref)
    assert_close(x.grad((y * y).sum().backward()), x_ref.grad, atol=1e-4)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_parameter_gradients_of_an_untracked_input_match_torch(ad_device, kind):
    """The input needs no gradient: the fused cells still give every weight its gradient."""
    reference = torch_rnn(kind)
    layer = CONFIGS[kind](D_INPUT, D_HIDDEN).init(ad_device)
    layer = layer.load_record(pytorch_record(reference))
    x_ref = torch.randn(BATCH, SEQ, D_INPUT)
    y_ref, _ = reference(x_ref)
    y_ref.pow(2).sum().backward()
    y, _ = layer(from_torch(x_ref, ad_device))
    assert_close(y, y_ref)
    grads = (y * y).sum().backward()
    torch_params = dict(reference.named_parameters())
    for path, param in layer.params():
        expected = as_ember_layout(torch_params[torch_name(path)].grad)
        assert_close(param.val().grad(grads), expected, atol=1e-4)


def test_outputs_end_with_the_final_hidden_state(base_device):
    lstm = LstmConfig(D_INPUT, D_HIDDEN).init(base_device)
    y, state = lstm(Tensor.random([BATCH, SEQ, D_INPUT], device=base_device))
    np.testing.assert_array_equal(y[:, -1].to_numpy(), state.hidden.to_numpy())
    bilstm = BiLstmConfig(D_INPUT, D_HIDDEN).init(base_device)
    y, state = bilstm(Tensor.random([BATCH, SEQ, D_INPUT], device=base_device))
    # The forward direction ends at the last step, the backward one at the first.
    np.testing.assert_array_equal(y[:, -1, :D_HIDDEN].to_numpy(), state.hidden[0].to_numpy())
    np.testing.assert_array_equal(y[:, 0, D_HIDDEN:].to_numpy(), state.hidden[1].to_numpy())


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_an_empty_sequence_returns_the_initial_state(base_device, kind):
    layer = CONFIGS[kind](D_INPUT, D_HIDDEN).init(base_device)
    width = 2 * D_HIDDEN if kind == "bilstm" else D_HIDDEN
    y, state = layer(Tensor.zeros([BATCH, 0, D_INPUT], base_device))
    assert y.shape == (BATCH, 0, width)
    hidden = state if kind == "gru" else state.hidden
    assert hidden.shape == tuple(state_shape(kind)) and hidden.abs().max().item() == 0.0


def test_defaults_follow_burn():
    for config in (LstmConfig(D_INPUT, D_HIDDEN), BiLstmConfig(D_INPUT, D_HIDDEN)):
        assert (config.bias, config.batch_first) == (True, True)
        assert config.initializer == XavierNormal(gain=1.0)
    gru = GruConfig(D_INPUT, D_HIDDEN)
    assert (gru.bias, gru.reset_after, gru.batch_first) == (True, True, True)
    assert gru.initializer == XavierNormal(gain=1.0)
    lstm = LstmConfig(D_INPUT, D_HIDDEN, bias=False).init()
    assert lstm.input_transform.bias is None and lstm.hidden_transform.bias is None
    assert (lstm.d_input, lstm.d_hidden, lstm.num_params()) == (3, 4, 3 * 16 + 4 * 16)


def test_weights_are_drawn_per_gate_with_xavier_normal():
    """Burn draws each gate as its own layer: fan_out is d_hidden, not 4 * d_hidden."""
    lstm = LstmConfig(200, 300).init()
    expected = math.sqrt(2 / (200 + 300))
    for weight in (lstm.input_transform.weight, lstm.input_transform.bias):
        std = float(weight.val().to_numpy().std())
        assert abs(std - expected) < 0.1 * expected, (std, expected)
    hidden_std = float(lstm.hidden_transform.weight.val().to_numpy().std())
    assert abs(hidden_std - math.sqrt(2 / 600)) < 0.05 * math.sqrt(2 / 600)
    uniform = LstmConfig(2, 8, initializer=Initializer.Uniform(-0.1, 0.1)).init()
    assert uniform.hidden_transform.weight.val().abs().max().item() <= 0.1


def test_pytorch_adapter_maps_names_and_directions():
    reference = torch_rnn("bilstm")
    bilstm, report = BiLstmConfig(D_INPUT, D_HIDDEN).init().load_record_partial(pytorch_record(reference))
    assert not report.missing and not report.unexpected and len(report.loaded) == 8
    assert_close(bilstm.reverse_lstm.hidden_transform.weight.val(), reference.weight_hh_l0_reverse.T)
    assert_close(bilstm.forward_lstm.input_transform.bias.val(), reference.bias_ih_l0)


def test_a_second_torch_layer_is_reported_not_loaded():
    torch.manual_seed(0)
    reference = torch.nn.LSTM(D_INPUT, D_HIDDEN, num_layers=2, batch_first=True)
    lstm, report = LstmConfig(D_INPUT, D_HIDDEN).init().load_record_partial(pytorch_record(reference))
    assert sorted(report.unexpected) == ["bias_hh_l1", "bias_ih_l1", "weight_hh_l1", "weight_ih_l1"]
    assert_close(lstm.input_transform.weight.val(), reference.weight_ih_l0.T)
    with pytest.raises(RecordMismatchError, match=r"weight_ih_l1: in the record but not in the module"):
        LstmConfig(D_INPUT, D_HIDDEN).init().load_record(pytorch_record(reference))


def test_a_record_of_the_wrong_size_is_a_mismatch():
    with pytest.raises(RecordMismatchError, match=r"input_transform.weight: shape \[3, 12\] in the record"):
        GruConfig(D_INPUT, 5).init().load_record(pytorch_record(torch_rnn("gru")))


@pytest.mark.parametrize(
    ("kind", "shape", "message"),
    [("lstm", [2, 5], r"Lstm: expected an input of shape \[batch, seq, 3\] \(d_input\), got \[2, 5\]"),
     ("bilstm", [2, 5, 4], r"BiLstm: expected an input of shape \[batch, seq, 3\] \(d_input\), got \[2, 5, 4\]"),
     ("gru", [1, 2, 5, 3], r"Gru: expected an input of shape \[batch, seq, 3\] \(d_input\), got \[1, 2, 5, 3\]")],
)  # fmt: skip
def test_input_of_the_wrong_shape_is_a_shape_error(base_device, kind, shape, message):
    layer = CONFIGS[kind](D_INPUT, D_HIDDEN).init(base_device)
    with pytest.raises(ShapeError, match=message):
        layer(Tensor.ones(shape, base_device))


def test_sequence_first_names_its_layout_in_errors():
    lstm = LstmConfig(D_INPUT, D_HIDDEN, batch_first=False).init()
    with pytest.raises(ShapeError, match=r"Lstm: expected an input of shape \[seq, batch, 3\]"):
        lstm(Tensor.ones([5, 2, 2]))


def test_initial_states_of_the_wrong_shape_are_shape_errors():
    x = Tensor.ones([BATCH, SEQ, D_INPUT])
    good, bad = Tensor.zeros([BATCH, D_HIDDEN]), Tensor.zeros([BATCH + 1, D_HIDDEN])
    lstm = LstmConfig(D_INPUT, D_HIDDEN).init()
    with pytest.raises(ShapeError, match=r"Lstm: expected the initial cell of shape \[2, 4\] \[batch, d_hidden\], got \[3, 4\]"):
        lstm(x, LstmState(bad, good))
    with pytest.raises(ShapeError, match=r"Lstm: expected the initial hidden of shape \[2, 4\] .*got \[3, 4\]"):
        lstm(x, LstmState(good, bad))
    with pytest.raises(ShapeError, match=r"BiLstm: expected the initial cell of shape \[2, 2, 4\] \[2, batch, d_hidden\], got \[2, 4\]"):
        BiLstmConfig(D_INPUT, D_HIDDEN).init()(x, LstmState(good, good))
    with pytest.raises(ShapeError, match=r"Gru: expected the initial hidden state of shape \[2, 4\] .*got \[3, 4\]"):
        GruConfig(D_INPUT, D_HIDDEN).init()(x, bad)
    # the state follows the input's batch
    with pytest.raises(ShapeError, match=r"Gru: .*of shape \[1, 4\] .*got \[2, 4\]"):
        GruConfig(D_INPUT, D_HIDDEN).init()(Tensor.ones([1, SEQ, D_INPUT]), good)


def test_initial_states_of_the_wrong_type_are_argument_errors():
    x, h = Tensor.ones([BATCH, SEQ, D_INPUT]), Tensor.zeros([BATCH, D_HIDDEN])
    with pytest.raises(ArgumentError, match=r"Lstm: the initial state must be an LstmState\(cell, hidden\), got Tensor"):
        LstmConfig(D_INPUT, D_HIDDEN).init()(x, h)
    with pytest.raises(ArgumentError, match=r"Lstm: the initial cell must be a Tensor, got list"):
        LstmConfig(D_INPUT, D_HIDDEN).init()(x, LstmState([0.0], h))
    with pytest.raises(ArgumentError, match=r"Gru: the initial hidden state must be a Tensor, got LstmState"):
        GruConfig(D_INPUT, D_HIDDEN).init()(x, LstmState(h, h))


@pytest.mark.parametrize(
    ("make", "message"),
    [(lambda: LstmConfig(0, 4), r"LstmConfig.d_input: expected greater than or equal to 1"),
     (lambda: BiLstmConfig(3, 0), r"BiLstmConfig.d_hidden: expected greater than or equal to 1"),
     (lambda: GruConfig(3, 4, reset_after="no"), r"GruConfig.reset_after: expected a boolean"),
     (lambda: GruConfig(3, 4, initializer=0.1), r"GruConfig.initializer"),
     (lambda: LstmConfig(3), r"LstmConfig.d_hidden")],
)  # fmt: skip
def test_config_errors(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_configs_round_trip_through_json():
    for config in [LstmConfig(3, 4, bias=False), BiLstmConfig(3, 4, batch_first=False),
                   GruConfig(3, 4, reset_after=False, initializer=Initializer.Uniform(-1.0, 1.0))]:  # fmt: skip
        assert type(config).load_json(config.to_json()) == config
