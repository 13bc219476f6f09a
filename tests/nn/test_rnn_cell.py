"""The fused cell ops lstm_cell and gru_cell: forward and gradients against torch autograd
(float64 tight, float32), against float64 finite differences, the kernels against the
references written from primitives, broadcasting (BiLstm's direction dim), and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nn_helpers import assert_close, from_torch

import ember
from ember import Tensor
from ember.backend.errors import DTypeError, ShapeError
from ember.nn.rnn_cell import (
    _GRU_CELL,
    _GRU_CELL_BACKWARD,
    _LSTM_CELL,
    _LSTM_CELL_BACKWARD,
    gru_cell,
    lstm_cell,
)

D, BATCH = 3, 2
# Leading dims of [x, hidden, (cell), w_hh]: Lstm's [1, batch, ...] with one weight, and
# BiLstm's two directions, each with its own weight.
LAYOUTS = {"single": ((1,), ()), "directions": ((1, 2), (2,))}


def torch_lstm(x, h, c, w):
    i, f, g, o = (x + h @ w).chunk(4, -1)
    c_new = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c_new.tanh(), c_new


def torch_gru(x, h, w, b):
    hp = h @ w + b
    xr, xz, xn = x.chunk(3, -1)
    hr, hz, hn = hp.chunk(3, -1)
    r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
    n = (xn + r * hn).tanh()
    return (1 - z) * n + z * h


def operands(kind: str, layout: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Random torch operands of one cell, each requiring gradients."""
    torch.manual_seed(0)
    lead, w_lead = LAYOUTS[layout]
    gates = 4 if kind == "lstm" else 3
    shapes = [(*lead, BATCH, gates * D), (*lead, BATCH, D)]
    shapes += [(*lead, BATCH, D), (*w_lead, D, gates * D)] if kind == "lstm" else [
        (*w_lead, D, gates * D), (gates * D,)]  # fmt: skip
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]


def run_torch(kind: str, args: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch_lstm(*args)) if kind == "lstm" else [torch_gru(*args)]


def run_ember(kind: str, args: list[Tensor]) -> list[Tensor]:
    return list(lstm_cell(*args)) if kind == "lstm" else [gru_cell(*args)]


def weighted_sum(outputs, weights):
    return sum((out * w).sum() for out, w in zip(outputs, weights, strict=True))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["f64", "f32"]
)
def test_forward_and_gradients_match_torch(ad_device, kind, layout, dtype, tol):
    ref_args = operands(kind, layout, dtype)
    ref_out = run_torch(kind, ref_args)
    weights = [torch.randn(o.shape, dtype=dtype) for o in ref_out]
    ref_grads = torch.autograd.grad(weighted_sum(ref_out, weights), ref_args)

    args = [from_torch(t, ad_device).require_grad() for t in ref_args]
    out = run_ember(kind, args)
    for actual, expected in zip(out, ref_out, strict=True):
        assert actual.shape == tuple(expected.shape)
        assert_close(actual, expected, atol=tol, rtol=tol)
    grads = weighted_sum(out, [from_torch(w, ad_device) for w in weights]).backward()
    for arg, expected in zip(args, ref_grads, strict=True):
        assert arg.grad(grads).shape == tuple(expected.shape)
        assert_close(arg.grad(grads), expected, atol=10 * tol, rtol=10 * tol)


@pytest.mark.parametrize("backend", ["ndarray", "torch"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_match_float64_finite_differences(backend, kind):
    """Directional derivatives of a random projection of the outputs, for each input."""
    device = ember.device(backend).autodiff()
    ref_args = operands(kind, "directions", torch.float64)
    rng = np.random.default_rng(1)
    args = [from_torch(t, device).require_grad() for t in ref_args]
    weights = [
        Tensor.from_data(rng.standard_normal(o.shape), device) for o in run_ember(kind, args)
    ]
    grads = weighted_sum(run_ember(kind, args), weights).backward()

    def loss(values: list[np.ndarray]) -> float:
        tensors = [Tensor.from_data(v, device) for v in values]
        return weighted_sum(run_ember(kind, tensors), weights).item()

    values = [t.detach().numpy() for t in ref_args]
    eps = 1e-6
    for k, arg in enumerate(args):
        direction = rng.standard_normal(values[k].shape)
        plus = [v + eps * direction if j == k else v for j, v in enumerate(values)]
        minus = [v - eps * direction if j == k else v for j, v in enumerate(values)]
        numeric = (loss(plus) - loss(minus)) / (2 * eps)
        analytic = float((arg.grad(grads).to_numpy() * direction).sum())
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8), f"input {k}"


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_kernels_match_the_references(base_device, kind):
    """The NdArray / Torch kernels of both ops (forward and backward part) against the
    definitions from primitives, on the same operands."""
    op, op_backward = (_LSTM_CELL, _LSTM_CELL_BACKWARD) if kind == "lstm" else (
        _GRU_CELL, _GRU_CELL_BACKWARD)  # fmt: skip
    B = base_device.backend
    args = operands(kind, "directions", torch.float32)
    prims = [from_torch(t, base_device).into_primitive() for t in args]

    def assert_same(kernel, reference):
        as_numpy = [Tensor.from_primitive(p, base_device).to_numpy() for p in (kernel, reference)]
        np.testing.assert_allclose(*as_numpy, atol=1e-6)

    out = getattr(B, op.name)(*prims)
    assert_same(out, op.reference(B, *prims))
    torch.manual_seed(2)
    grad = from_torch(torch.randn(B.shape(out)), base_device).into_primitive()
    state = prims[2] if kind == "lstm" else prims[1]  # the cell (LSTM) or hidden (GRU) state
    backward_args = (grad, state, out)
    assert_same(
        getattr(B, op_backward.name)(*backward_args), op_backward.reference(B, *backward_args)
    )


def test_half_precision_on_ndarray_runs_the_reference():
    device = ember.device("ndarray").autodiff()
    ref_args = operands("lstm", "single", torch.float32)
    args = [from_torch(t, device).cast(ember.DType.F16).require_grad() for t in ref_args]
    h, c = lstm_cell(*args)
    assert h.dtype is ember.DType.F16
    expected_h, expected_c = torch_lstm(*ref_args)
    assert_close(h.cast(ember.DType.F32), expected_h, atol=1e-2, rtol=1e-2)
    assert_close(c.cast(ember.DType.F32), expected_c, atol=1e-2, rtol=1e-2)
    grads = (h.sum() + c.sum()).backward()
    assert args[3].grad(grads).dtype is ember.DType.F16


def test_only_the_tracked_inputs_get_gradients(ad_device):
    ref_args = operands("lstm", "single", torch.float32)
    torch_grad = torch.autograd.grad(sum(o.sum() for o in torch_lstm(*ref_args)), ref_args[3])[0]
    args = [from_torch(t, ad_device) for t in ref_args]
    args[3] = args[3].require_grad()
    h, c = lstm_cell(*args)
    grads = (h.sum() + c.sum()).backward()
    assert_close(args[3].grad(grads), torch_grad)
    assert args[0].grad(grads) is None


def test_gru_cell_without_a_hidden_bias_is_a_zero_bias(base_device):
    ref_args = operands("gru", "single", torch.float32)
    with torch.no_grad():
        ref_args[3].zero_()
    h = gru_cell(*(from_torch(t, base_device) for t in ref_args[:3]))
    assert_close(h, torch_gru(*ref_args))


@pytest.mark.parametrize(
    ("shapes", "error", "message"),
    [
        ([[2, 11], [2, 3], [2, 3], [3, 12]], ShapeError, "4 * d_hidden = 12 features"),
        ([[2, 12], [2, 3], [2, 3], [3, 9]], ShapeError, "hidden weight of shape [..., 3, 12]"),
        ([[2, 12], [2, 3], [2, 4], [3, 12]], ShapeError, "the cell state [2, 4]"),
        ([[12], [3], [3], [3, 12]], ShapeError, "need rank >= 2"),
        ([[3, 12], [2, 3], [2, 3], [3, 12]], ShapeError, "lstm_cell"),
    ],
)
def test_lstm_cell_shape_errors(shapes, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("*", r"\*")):
        lstm_cell(*(Tensor.zeros(s) for s in shapes))


def test_gru_cell_errors():
    x, h, w = Tensor.zeros([2, 9]), Tensor.zeros([2, 3]), Tensor.zeros([3, 9])
    with pytest.raises(ShapeError, match=r"gru_cell: expected a hidden bias of 9"):
        gru_cell(x, h, w, Tensor.zeros([6]))
    with pytest.raises(DTypeError, match="gru_cell: operands have different dtypes"):
        gru_cell(x, h.cast(ember.DType.F64), w)
