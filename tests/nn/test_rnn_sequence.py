"""The whole-sequence ops lstm_sequence and gru_sequence: outputs and every gradient (input,
initial states, weights, biases) against PyTorch's nn.LSTM / nn.GRU with autograd (float64
tight, float32), one- and bidirectional, T = 1 and batch 1, given and zero initial states;
against float64 finite differences; the NdArray / Torch kernels (with and without the state
their forward pass keeps) against the references from primitives; and bad operands."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nn_helpers import assert_close, from_torch

import ember
from ember import Tensor
from ember.backend.errors import DTypeError, ShapeError
from ember.nn import rnn_sequence
from ember.nn.rnn_sequence import (
    _GRU_SEQUENCE,
    _GRU_SEQUENCE_BACKWARD,
    _LSTM_SEQUENCE,
    _LSTM_SEQUENCE_BACKWARD,
    gru_sequence,
    lstm_sequence,
)

# (seq, batch, d_input, d_hidden, dirs, initial states given)
CASES = {
    "one-direction": (5, 3, 4, 3, 1, True),
    "zero-state": (4, 2, 3, 5, 1, False),
    "T1-batch1": (1, 1, 2, 3, 1, True),
    "bidirectional": (4, 2, 3, 2, 2, True),
    "bidirectional-zero-state": (3, 1, 2, 3, 2, False),
    # wide enough for NdArray's numba products on every path (a W_hh packed once per
    # direction, the second direction's input gradient added into the first's)
    "bidirectional-wide": (4, 2, 16, 8, 2, True),
}


class Case:
    """A torch layer with random weights and inputs, and the same operands as ember's op takes."""

    def __init__(self, kind: str, case: str, dtype: torch.dtype) -> None:
        steps, batch, d_in, d, dirs, given = CASES[case]
        torch.manual_seed(0)
        layer = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(
            d_in, d, bidirectional=dirs == 2).to(dtype)  # fmt: skip
        self.kind, self.layer, self.dirs, self.d = kind, layer, dirs, d
        self.x = torch.randn(steps, batch, d_in, dtype=dtype, requires_grad=True)
        shape = (dirs, batch, d)
        self.states = [
            torch.randn(shape, dtype=dtype, requires_grad=True) if given
            else torch.zeros(shape, dtype=dtype, requires_grad=True)
            for _ in range(2 if kind == "lstm" else 1)
        ]  # fmt: skip

    def params(self, suffix: str) -> list[torch.Tensor]:
        """torch's ``[weight_ih, weight_hh, bias_ih, bias_hh]`` of every direction, stacked."""
        names = ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
        dirs = ["", "_reverse"][: self.dirs]
        return [torch.stack([getattr(self.layer, n + s) for s in dirs]) for n in names]

    def torch_outputs(self) -> list[torch.Tensor]:
        hx = tuple(self.states) if self.kind == "lstm" else self.states[0]
        seq, final = self.layer(self.x, hx)
        return [seq, *final] if self.kind == "lstm" else [seq, final]

    def torch_leaves(self) -> list[torch.Tensor]:
        return [self.x, *self.states, *self.layer.parameters()]

    def ember_operands(self, device) -> list[Tensor]:
        w_ih, w_hh, b_ih, b_hh = (p.detach() for p in self.params(""))
        weights = [w_ih.transpose(1, 2), w_hh.transpose(1, 2)]
        biases = [b_ih + b_hh] if self.kind == "lstm" else [b_ih, b_hh]
        tensors = [self.x.detach(), *(s.detach() for s in self.states), *weights, *biases]
        return [from_torch(t.contiguous(), device) for t in tensors]

    def run(self, operands: list[Tensor]) -> list[Tensor]:
        if self.kind == "lstm":
            return list(lstm_sequence(*operands))
        return list(gru_sequence(*operands))

    def expected_grads(self, ref_grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """torch's gradients (x, states, then per direction w_ih, w_hh, b_ih, b_hh) in the
        layout of ember's operands."""
        n = 1 + len(self.states)
        head, per_param = ref_grads[:n], ref_grads[n:]
        by_dir = [per_param[4 * k : 4 * k + 4] for k in range(self.dirs)]
        w_ih, w_hh, b_ih, b_hh = (torch.stack([g[i] for g in by_dir]) for i in range(4))
        biases = [b_ih] if self.kind == "lstm" else [b_ih, b_hh]  # b_ih's gradient is b_hh's
        return [*head, w_ih.transpose(1, 2), w_hh.transpose(1, 2), *biases]


def weighted_sum(outputs, weights):
    return sum((out * w).sum() for out, w in zip(outputs, weights, strict=True))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float64, 1e-11), (torch.float32, 2e-5)], ids=["f64", "f32"]
)
def test_forward_and_gradients_match_torch(ad_device, kind, case, dtype, tol):
    ref = Case(kind, case, dtype)
    ref_out = ref.torch_outputs()
    weights = [torch.randn(o.shape, dtype=dtype) for o in ref_out]
    leaves = ref.torch_leaves()
    expected = ref.expected_grads(torch.autograd.grad(weighted_sum(ref_out, weights), leaves))

    operands = [t.require_grad() for t in ref.ember_operands(ad_device)]
    out = ref.run(operands)
    for actual, want in zip(out, ref_out, strict=True):
        assert actual.shape == tuple(want.shape)
        assert_close(actual, want, atol=tol, rtol=tol)
    grads = weighted_sum(out, [from_torch(w, ad_device) for w in weights]).backward()
    for k, (operand, want) in enumerate(zip(operands, expected, strict=True)):
        got = operand.grad(grads)
        assert got.shape == tuple(want.shape), f"operand {k}"
        assert_close(got, want, atol=10 * tol, rtol=10 * tol)


@pytest.mark.parametrize("case", ["one-direction", "bidirectional"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_inference_matches_torch(base_device, kind, case):
    """Without autodiff (nothing kept for a backward pass): the same outputs."""
    ref = Case(kind, case, torch.float32)
    with torch.no_grad():
        ref_out = ref.torch_outputs()
    for actual, want in zip(ref.run(ref.ember_operands(base_device)), ref_out, strict=True):
        assert_close(actual, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", ["ndarray", "torch"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_match_float64_finite_differences(backend, kind):
    """Directional derivatives of a random projection of the outputs, for each operand."""
    device = ember.device(backend).autodiff()
    ref = Case(kind, "bidirectional", torch.float64)
    rng = np.random.default_rng(1)
    operands = [t.require_grad() for t in ref.ember_operands(device)]
    weights = [Tensor.from_data(rng.standard_normal(o.shape), device) for o in ref.run(operands)]
    grads = weighted_sum(ref.run(operands), weights).backward()

    def loss(values: list[np.ndarray]) -> float:
        return weighted_sum(ref.run([Tensor.from_data(v, device) for v in values]), weights).item()

    values = [t.detach().to_numpy() for t in operands]
    eps = 1e-6
    for k, operand in enumerate(operands):
        direction = rng.standard_normal(values[k].shape)
        plus = [v + eps * direction if j == k else v for j, v in enumerate(values)]
        minus = [v - eps * direction if j == k else v for j, v in enumerate(values)]
        numeric = (loss(plus) - loss(minus)) / (2 * eps)
        analytic = float((operand.grad(grads).to_numpy() * direction).sum())
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8), f"operand {k}"


@pytest.mark.parametrize("case", ["one-direction", "bidirectional", "bidirectional-wide"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("save", [True, False], ids=["kept", "recomputed"])
@pytest.mark.parametrize("numba", [True, False], ids=["numba", "numpy"])
def test_kernels_match_the_references(monkeypatch, base_device, kind, case, save, numba):
    """Both ops' NdArray / Torch kernels against the definitions from primitives, the backward
    kernel with what its forward pass kept (save) and with the activations recomputed;
    NdArray's with their numba kernels (the LSTM's step kernels, both ops' products, each
    step's by the directions' ``W_hh`` packed once) and without (numba is an optional
    extra)."""
    steps_run = []
    if not numba:
        if base_device.backend.name != "ndarray":
            pytest.skip("only NdArray's kernels use numba")
        monkeypatch.setattr(rnn_sequence, "_numba_steps", lambda: None)
        monkeypatch.setattr(rnn_sequence, "_numba_gemm", lambda: None)
    elif base_device.backend.name == "ndarray":
        gemm = pytest.importorskip("ember.backends.fusion.numba_gemm")
        pytest.importorskip("numba")
        packed_product = gemm.matmul_packed
        monkeypatch.setattr(gemm, "matmul_packed",
                            lambda *args: steps_run.append(1) or packed_product(*args))  # fmt: skip
    op, op_backward = (_LSTM_SEQUENCE, _LSTM_SEQUENCE_BACKWARD) if kind == "lstm" else (
        _GRU_SEQUENCE, _GRU_SEQUENCE_BACKWARD)  # fmt: skip
    B = base_device.backend
    ref = Case(kind, case, torch.float32)
    prims = [t.into_primitive() for t in ref.ember_operands(base_device)]

    def assert_same(kernel, reference, atol):
        as_numpy = [Tensor.from_primitive(p, base_device).to_numpy() for p in (kernel, reference)]
        np.testing.assert_allclose(*as_numpy, atol=atol, rtol=1e-5)

    out = getattr(B, op.name)(*prims, save)
    if numba and base_device.backend.name == "ndarray":  # a packed product a step (both directions)
        columns = (4 if kind == "lstm" else 3) * ref.d  # of W_hh: a quarter tile at least
        packs = columns >= gemm.NR[np.dtype(np.float32)] // 4
        assert len(steps_run) == (ref.x.shape[0] if packs else 0)
    # On CUDA the kernel is cuDNN's, whose float32 sums run in another order than the
    # reference's products (2.6e-6 apart at most, measured on an H200).
    cuda = base_device.place == "cuda"
    assert_same(out, op.reference(B, *prims, save), 1e-5 if cuda else 1e-6)
    torch.manual_seed(2)
    grad = from_torch(torch.randn(B.shape(out)), base_device).into_primitive()
    for need_x in (True, False):
        args = (grad, *prims, out, need_x)
        assert_same(getattr(B, op_backward.name)(*args), op_backward.reference(B, *args), 1e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_second_order_runs_through_the_backward_reference(kind):
    """Gradients of gradients (the backward op differentiates through its reference) agree
    with torch's double backward, float64."""
    ref = Case(kind, "one-direction", torch.float64)
    seq = ref.torch_outputs()[0]
    (gx,) = torch.autograd.grad((seq * seq).sum(), [ref.x], create_graph=True)
    (expected,) = torch.autograd.grad((gx * gx).sum(), [ref.x])

    device = ember.device("ndarray").autodiff()
    operands = [t.require_grad() for t in ref.ember_operands(device)]
    out = ref.run(operands)[0]
    first = operands[0].grad((out * out).sum().backward(create_graph=True))
    second = operands[0].grad((first * first).sum().backward())
    assert_close(second, expected, atol=1e-9, rtol=1e-9)


def test_half_precision_on_ndarray_runs_the_reference():
    ref = Case("lstm", "one-direction", torch.float32)
    device = ember.device("ndarray").autodiff()
    operands = [t.cast(ember.DType.F16).require_grad() for t in ref.ember_operands(device)]
    seq, _, _ = lstm_sequence(*operands)
    assert seq.dtype is ember.DType.F16
    with torch.no_grad():
        expected = ref.torch_outputs()[0]
    assert_close(seq.cast(ember.DType.F32), expected, atol=1e-2, rtol=1e-2)
    assert operands[3].grad(seq.sum().backward()).dtype is ember.DType.F16


def _lstm_operands(steps=4, batch=2, d_in=3, d=5, dirs=1, **changes):
    shapes = {"x": [steps, batch, d_in], "h0": [dirs, batch, d], "c0": [dirs, batch, d]}
    shapes |= {"w_ih": [dirs, d_in, 4 * d], "w_hh": [dirs, d, 4 * d], "bias": [dirs, 4 * d]}
    shapes.update(changes)
    return [Tensor.zeros(s) for s in shapes.values()]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"x": [2, 3]},
            "expected an input of shape [seq, batch, d_input] with seq >= 1, got [2, 3]",
        ),
        ({"x": [0, 2, 3]}, "with seq >= 1, got [0, 2, 3]"),
        ({"h0": [3, 2, 5], "c0": [3, 2, 5]}, "initial hidden state of shape [dirs (1 or 2), 2"),
        ({"h0": [1, 4, 5], "c0": [1, 4, 5]}, "got [1, 4, 5] for the input [4, 2, 3]"),
        ({"c0": [1, 2, 4]}, "the initial cell state [1, 2, 4] and hidden state [1, 2, 5]"),
        ({"w_ih": [1, 4, 20]}, "expected w_ih of shape [1, 3, 20] [dirs, d_input, 4 * d_hidden]"),
        ({"w_hh": [1, 5, 15]}, "expected w_hh of shape [1, 5, 20]"),
        ({"bias": [2, 20]}, "expected bias 0 of shape [1, 20] [dirs, 4 * d_hidden]"),
    ],
)
def test_lstm_bad_shapes_raise_shape_errors(changes, message):
    with pytest.raises(ShapeError, match="lstm_sequence") as info:
        lstm_sequence(*_lstm_operands(**changes))
    assert message in str(info.value)


def test_gru_bad_shapes_and_dtypes_raise_typed_errors():
    x, h0 = Tensor.zeros([4, 2, 3]), Tensor.zeros([1, 2, 5])
    w_ih, w_hh, b = Tensor.zeros([1, 3, 15]), Tensor.zeros([1, 5, 15]), Tensor.zeros([1, 15])
    with pytest.raises(ShapeError, match=r"gru_sequence: expected bias 1 of shape \[1, 15\]"):
        gru_sequence(x, h0, w_ih, w_hh, b, Tensor.zeros([1, 20]))
    with pytest.raises(ShapeError, match=r"expected w_hh of shape \[1, 5, 15\].*got \[1, 5, 20\]"):
        gru_sequence(x, h0, w_ih, Tensor.zeros([1, 5, 20]), b, b)
    with pytest.raises(DTypeError, match="gru_sequence: operands have different dtypes"):
        gru_sequence(x, h0.cast(ember.DType.F64), w_ih, w_hh, b, b)


@pytest.mark.parametrize("layer", ["lstm", "bilstm", "gru"])
def test_layers_give_the_cell_scans_results(monkeypatch, layer):
    """Lstm / BiLstm / Gru on the sequence ops and on the per-step cell scan they replaced
    (kept as the benchmarks' baseline): same outputs, states and parameter gradients."""
    from ember.nn import rnn

    device = ember.device("ndarray").autodiff()
    configs = {"lstm": rnn.LstmConfig, "bilstm": rnn.BiLstmConfig, "gru": rnn.GruConfig}
    model = configs[layer](3, 4).init(device)
    x = Tensor.from_data(np.random.default_rng(3).standard_normal((2, 5, 3), np.float32), device)

    def run(sequence_ops: bool) -> list[np.ndarray]:
        monkeypatch.setattr(rnn, "_SEQUENCE_OPS", sequence_ops)
        outputs, state = model(x)
        state = list(state) if layer != "gru" else [state]
        loss = (outputs * outputs).sum() + sum((s * s).sum() for s in state)
        grads = loss.backward()
        params = [p.val().grad(grads).to_numpy() for _, p in model.params()]
        return [outputs.to_numpy(), *(s.to_numpy() for s in state), *params]

    for scanned, fused in zip(run(False), run(True), strict=True):
        np.testing.assert_allclose(fused, scanned, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["ndarray", "torch"])
def test_what_a_forward_pass_keeps_goes_with_its_output(backend):
    """The activations (or oneDNN workspace) a training forward pass keeps for its backward
    kernel are released with the op's output; an inference pass keeps nothing."""
    import gc

    ref = Case("lstm", "bidirectional", torch.float32)
    before = len(rnn_sequence._KEPT)
    device = ember.device(backend)
    ref.run(ref.ember_operands(device))
    assert len(rnn_sequence._KEPT) == before
    operands = [t.require_grad() for t in ref.ember_operands(device.autodiff())]
    outputs = ref.run(operands)
    assert len(rnn_sequence._KEPT) == before + 1
    grads = outputs[0].sum().backward()
    assert operands[0].grad(grads).shape == operands[0].shape
    del outputs, grads
    gc.collect()
    assert len(rnn_sequence._KEPT) == before
