"""Fused attention: the numba kernel against NumPy float64, and the attention fuser's segments
on ``fusion(ndarray)`` against the same records unfused (ember's MultiHeadAttention, an
imported model's pattern, a training step through autodiff)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backends.fusion import autotune, reset_stats, stats
from ember.backends.fusion.autotune import UNFUSED, Choice
from ember.nn.attention import MhaInput, MultiHeadAttentionConfig, generate_autoregressive_mask
from ember.tensor.activation import softmax

pytest.importorskip("numba")
numba_attention = pytest.importorskip("ember.backends.fusion.numba_attention")
attention = numba_attention.attention
KernelUnsupported = numba_attention.KernelUnsupported


def reference(q, k, v, scale, mask=None, fill=0.0, bias=None):
    """The unfused ops in float64: context and weights."""
    s = scale * (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2))
    if mask is not None:
        s = np.where(mask, fill, s)
    if bias is not None:
        s = s + bias
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return p @ v.astype(np.float64), p


# ---------------------------------------------------------------------------- the kernel
@pytest.mark.parametrize("seed", range(12))
def test_the_kernel_equals_float64_attention(seed):
    """Random sizes (odd ones: partial tiles, spans and key blocks), broadcast batch entries,
    strided views, masks, biases, weights (C-contiguous or not), one and three parts."""
    rng = np.random.default_rng(seed)
    b0, b1 = rng.integers(1, 4, 2)
    lq, lk = rng.integers(1, 300, 2) if seed % 4 else (131, 517)  # several key blocks
    d, dv = rng.integers(1, 70, 2)
    q = rng.standard_normal((b0, b1, lq, d), dtype=np.float32)
    k = rng.standard_normal((b0, 1 if seed % 3 == 0 else b1, lk, d), dtype=np.float32)
    v = rng.standard_normal((b0, b1, lk, dv), dtype=np.float32)
    if seed % 2:  # head views as attention reads them: features not last in memory
        q = np.ascontiguousarray(q.swapaxes(1, 2)).swapaxes(1, 2)
        k = np.ascontiguousarray(k.swapaxes(2, 3)).swapaxes(2, 3)
    mask = rng.random((b0, 1, lq, lk)) < 0.3 if seed % 3 == 1 else None
    bias = rng.standard_normal((1, b1, 1, lk), dtype=np.float32) if seed % 4 == 2 else None
    weights = np.empty((b0, b1, lq, lk), np.float32) if seed % 5 == 0 else None
    if seed % 5 == 1:  # not C-contiguous: written element by element, not by transposed blocks
        weights = np.empty((b0, b1, lk, lq), np.float32).swapaxes(2, 3)
    out = attention(q, k, v, 0.3, mask=mask, fill=-7.0, bias=bias, weights=weights,
                    threads=1 + 2 * (seed % 2))  # fmt: skip
    want, p = reference(q, k, v, 0.3, mask, -7.0, bias)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6 * np.abs(v).max())
    if weights is not None:
        np.testing.assert_allclose(weights, p, rtol=1e-5, atol=1e-7)


def _features_strided(a: np.ndarray) -> np.ndarray:
    """``a``'s values in memory where the last dim is not contiguous."""
    return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)


@pytest.mark.parametrize("sizes", [(2, 3, 37, 45, 19, 40), (1, 2, 16, 32, 16, 16),
                                   (2, 1, 130, 9, 33, 7)])  # fmt: skip
def test_vector_packing_equals_the_element_by_element_path_bit_for_bit(sizes):
    """Operands whose features are contiguous are packed and written by whole vectors
    (blocks transposed in registers), others element by element: the same sums, so the
    same bits, edges (sizes off the vector and tile widths) included."""
    from ember.backends.fusion.numba_attention import attention_backward

    b0, b1, lq, lk, d, dv = sizes
    rng = np.random.default_rng(lq)
    q, k = (rng.standard_normal((b0, b1, n, d), dtype=np.float32) for n in (lq, lk))
    v = rng.standard_normal((b0, b1, lk, dv), dtype=np.float32)
    d_out = rng.standard_normal((b0, b1, lq, dv), dtype=np.float32)
    results = []
    for layout in (lambda a: a, _features_strided):
        out, q_out = layout(np.zeros((b0, b1, lq, dv), np.float32)), layout(np.zeros_like(q))
        weights = layout(np.zeros((b0, b1, lq, lk), np.float32))
        attention(layout(q), layout(k), layout(v), 0.3, out=out, weights=weights, q_out=q_out,
                  q_factor=0.5, threads=2)  # fmt: skip
        grads = [layout(np.zeros_like(a)) for a in (q, k, v)]
        attention_backward(layout(q), layout(k), layout(v), np.ascontiguousarray(weights),
                           layout(d_out), factor=0.3, d_q=grads[0], d_k=grads[1], d_v=grads[2],
                           q_factor=0.5, threads=2)  # fmt: skip
        results.append([out, weights, q_out, *grads])
    for name, fast, slow in zip(("out", "weights", "q_out", "d_q", "d_k", "d_v"), *results):
        np.testing.assert_array_equal(fast, slow, err_msg=name)
    np.testing.assert_array_equal(results[0][2], q * np.float32(0.5))


def test_the_kernel_writes_the_scaled_query_it_packs():
    rng = np.random.default_rng(15)
    q, k, v = (rng.standard_normal((2, 3, 40, 16), dtype=np.float32) for _ in range(3))
    plain = attention(q, k, v, 0.25 * 0.5)
    q_out = np.full_like(q, np.nan)
    both = attention(q, k, v, 0.25 * 0.5, q_out=q_out, q_factor=0.25)
    np.testing.assert_array_equal(both, plain)
    np.testing.assert_array_equal(q_out, q * np.float32(0.25))  # as the scaling rounds
    with pytest.raises(KernelUnsupported, match="float32"):
        attention(q, k, v, 1.0, q_out=np.zeros((2, 3, 40, 15), np.float32))


def test_the_kernel_writes_a_strided_output():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 20, 8), dtype=np.float32) for _ in range(3))
    buffer = np.full((20, 2, 3, 8), np.nan, np.float32)  # [seq, batch, heads, features]
    out = buffer.transpose(1, 2, 0, 3)
    assert attention(q, k, v, 0.5, out=out) is out
    np.testing.assert_allclose(buffer.transpose(1, 2, 0, 3), reference(q, k, v, 0.5)[0],
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_the_kernel_keeps_the_unfused_nan_rows():
    """A NaN score makes its row NaN; a row whose every score is -inf is NaN (-inf - -inf),
    as in the max-subtract-exp softmax."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, 5, 4), dtype=np.float32) for _ in range(3))
    k[0, 0, 3, 1] = np.nan
    got = attention(q, k, v, 1.0)
    assert np.isnan(got).all()
    k[0, 0, 3, 1] = 0.0
    mask = np.zeros((1, 1, 5, 5), bool)
    mask[0, 0, 2] = True
    got = attention(q, k, v, 1.0, mask=mask, fill=-np.inf)
    with np.errstate(invalid="ignore"):
        want = reference(q, k, v, 1.0, mask, -np.inf)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 0, 2]).all() and not np.isnan(got[0, 0, [0, 1, 3, 4]]).any()


@pytest.mark.parametrize(
    ("q", "k", "v"),
    [
        ((1, 1, 4, 8), (1, 1, 4, 8), (1, 1, 5, 8)),  # keys and values differ in count
        ((1, 1, 4, 8), (1, 1, 4, 6), (1, 1, 4, 8)),  # query and key features differ
        ((2, 1, 4, 8), (3, 1, 4, 8), (1, 1, 4, 8)),  # batches do not broadcast
        ((1, 1, 0, 8), (1, 1, 4, 8), (1, 1, 4, 8)),  # no queries
        ((1, 4, 8), (1, 4, 8), (1, 4, 8)),  # not 4-d
    ],
)
def test_the_kernel_refuses_what_it_does_not_compute(q, k, v):
    arrays = [np.zeros(s, np.float32) for s in (q, k, v)]
    assert not numba_attention.supports(*arrays)
    with pytest.raises(KernelUnsupported, match="numba attention"):
        attention(*arrays, 1.0)
    doubles = [np.zeros((1, 1, 4, 8)) for _ in range(3)]
    assert not numba_attention.supports(*doubles)
    with pytest.raises(KernelUnsupported, match=r"float32 \(1, 1, 4, 5\)"):
        wrong = np.zeros((1, 1, 4, 5), np.float32)
        attention(*(a.astype(np.float32) for a in doubles), 1.0, out=wrong)


# ---------------------------------------------------------------------------- the fuser
_MHA = {}


def _mha(device, masked: bool, x: np.ndarray):
    """One layer per width (the same weights on every device) and its input on ``device``."""
    d_model = x.shape[2]
    if d_model not in _MHA:
        _MHA[d_model] = MultiHeadAttentionConfig(d_model, 4).with_dropout(0.0).init(
            ember.device("ndarray"))  # fmt: skip
    mha = _MHA[d_model].to_device(device)
    inp = MhaInput.self_attn(Tensor.from_data(x, device))
    if masked:
        inp = inp.with_mask_attn(generate_autoregressive_mask(x.shape[0], x.shape[1], device))
    return mha, inp


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("read_weights", [False, True])
@pytest.mark.parametrize("inner", ["ndarray", "torch"])
def test_multi_head_attention_runs_as_one_kernel(masked, read_weights, inner):
    if inner == "torch":
        pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((2, 40, 32)).astype(np.float32)
    mha, inp = _mha(ember.device("ndarray"), masked, x)
    want = mha(inp)
    fused = ember.device(inner).fusion(runtime="numba")  # on torch: its CPU tensors' memory
    mha_f, inp_f = _mha(fused, masked, x)
    reset_stats()
    with autotune.forcing(Choice("fused", 1)):
        out = mha_f(inp_f)
        weights = out.weights.to_numpy() if read_weights else None
        context = out.context.to_numpy()
    assert stats()["attentions"] == 1
    np.testing.assert_allclose(context, want.context.to_numpy(), rtol=1e-5, atol=1e-6)
    if read_weights:
        np.testing.assert_allclose(weights, want.weights.to_numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("masked", [False, True])
def test_a_training_step_through_fused_attention_gives_the_same_gradients(masked, monkeypatch):
    """Autodiff keeps the weights, the heads and the scaled queries for the backward pass:
    the prologue's layout steps run, and the kernel writes the weights and the scaled
    queries (no record scales the query, forwards or backwards); the backward pass runs
    as the gradient kernel."""
    from ember.backends.fusion.executor import Executor

    ran = []
    run_single = Executor.run_single
    monkeypatch.setattr(Executor, "run_single",
                        lambda self, record, *a: ran.append(record.name) or run_single(self, record, *a))  # fmt: skip
    x = np.random.default_rng(4).standard_normal((2, 24, 32)).astype(np.float32)
    grads = []
    for device in (ember.device("ndarray").autodiff(),
                   ember.device("ndarray").fusion(runtime="numba").autodiff()):  # fmt: skip
        mha, inp = _mha(device, masked, x)
        reset_stats()
        with autotune.forcing(Choice("fused", 1)):
            context = mha(inp).context
            g = (context * context).sum().backward()
            grads.append([context.to_numpy()] + [
                p.grad(g).to_numpy() for p in (mha.query.weight.val(), mha.key.weight.val(),
                                               mha.value.weight.val())])  # fmt: skip
    assert stats()["attentions"] == 1 and stats()["attention_grads"] == 1
    assert "float_mul_scalar" not in ran and "float_permute" in ran, ran
    for got, want in zip(grads[1], grads[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5 * np.abs(want).max())


def _replayed_steps(inputs: list, masked: bool, every_param: bool, threads: int, check,
                    separate: bool = False, replayed: bool = True,
                    choice: Choice | None = None) -> list:  # fmt: skip
    """Per device (NdArray, then fusion(NdArray) through ``replay``, or recorded call by
    call where not ``replayed``; the tuner's choices forced to ``choice``, by default the
    fused kernels on ``threads`` threads), per call on
    ``inputs``: the gradients of a training step through the attention, of the input and
    of the projections' weights (``every_param``: of all its parameters);
    ``check(call, stats())`` after each fused call. ``separate``: the key and the value
    are another Tensor object of the input's primitive, so the three projections are three
    products whose input gradients add up (one Tensor for all three makes them one
    product)."""
    from ember.backends.fusion import replay

    per_device = []
    for device in (ember.device("ndarray").autodiff(),
                   ember.device("ndarray").fusion(runtime="numba").autodiff()):  # fmt: skip
        mha, _ = _mha(device, masked, inputs[0])
        params = ([p.val() for _, p in mha.params()] if every_param else
                  (mha.query.weight.val(), mha.key.weight.val(), mha.value.weight.val()))  # fmt: skip

        def step(x: Tensor, mha=mha, params=params) -> list:
            other = Tensor.from_primitive(x.into_primitive(), x.device) if separate else x
            inp = MhaInput(x, other, other)
            if masked:
                inp = inp.with_mask_attn(generate_autoregressive_mask(x.shape[0], x.shape[1], x.device))
            context = mha(inp).context
            g = (context * context).sum().backward()
            return [x.grad(g)] + [p.grad(g) for p in params]

        fused = "fusion" in device.backend.name
        run = replay(step) if fused and replayed else step
        calls = []
        with autotune.forcing(choice or Choice("fused", threads)):
            for call, x in enumerate(inputs):
                reset_stats()
                calls.append([g.to_numpy() for g in run(Tensor.from_data(x, device).require_grad())])
                if fused:
                    check(call, stats())
        per_device.append(calls)
    return per_device


@pytest.mark.parametrize("masked", [False, True])
def test_a_replayed_training_step_runs_its_attention_directly(masked):
    """A training step through the attention (its forward and gradient kernels, the
    scaled queries kept for the backward pass, the heads merged back) replayed on new
    inputs: from the fourth call its launches run directly; on every call, recorded or
    direct, the gradient kernel writes dQ, dK and dV side by side where the packed
    projection's gradient joins them (the join copies nothing); every call's gradients
    equal NdArray's."""
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal((2, 24, 32)).astype(np.float32) for _ in range(5)]

    def check(call, counts):
        assert counts["direct_replays"] == (call >= 3), call
        assert counts["joined_in_place"] == 1, (call, counts["joined_in_place"])
        assert counts["attentions"] == counts["attention_grads"] == 1

    per_device = _replayed_steps(inputs, masked, False, 1, check)
    for call, (got_all, want_all) in enumerate(zip(per_device[1], per_device[0], strict=True)):
        for got, want in zip(got_all, want_all, strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5 * np.abs(want).max(),
                                       err_msg=f"call {call}")  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_a_recorded_training_step_writes_the_join_in_place(masked, threads):
    """Recorded call by call (no replay), the gradient kernel writes dQ, dK and dV where
    the packed projection's gradient joins them, so the join copies nothing; the
    gradients of the input and of every parameter equal NdArray's."""
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((2, 24, 32)).astype(np.float32) for _ in range(3)]

    def check(call, counts):
        assert counts["attention_grads"] == counts["joined_in_place"] == 1, call
        assert counts["direct_replays"] == 0

    per_device = _replayed_steps(inputs, masked, True, threads, check, replayed=False)
    for call, (got_all, want_all) in enumerate(zip(per_device[1], per_device[0], strict=True)):
        scale = max(np.abs(w).max() for w in want_all[:2])
        for got, want in zip(got_all, want_all, strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * scale,
                                       err_msg=f"call {call}")  # fmt: skip


def test_an_attention_run_record_by_record_leaves_the_join_a_copy():
    """Where the tuner leaves the attention to its records, nothing writes into the array
    laid out for the join: the cat finds its pieces apart and copies them, and the
    gradients equal NdArray's."""
    rng = np.random.default_rng(12)
    inputs = [rng.standard_normal((2, 24, 32)).astype(np.float32) for _ in range(2)]

    def check(call, counts):
        assert counts["attention_grads"] == counts["joined_in_place"] == 0, call

    per_device = _replayed_steps(inputs, False, True, 1, check, replayed=False,
                                 choice=autotune.UNFUSED)  # fmt: skip
    for call, (got_all, want_all) in enumerate(zip(per_device[1], per_device[0], strict=True)):
        scale = max(np.abs(w).max() for w in want_all[:2])
        for got, want in zip(got_all, want_all, strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * scale,
                                       err_msg=f"call {call}")  # fmt: skip


def test_a_join_the_gradient_kernel_could_not_write_in_place_copies(monkeypatch):
    """Where the join's views cannot be made (``joins.piece_views`` finds a reshape that
    would copy), the gradient kernel writes pooled arrays of its own and the cat copies
    them, recorded or replayed: the same gradients, nothing joined in place."""
    from ember.backends.fusion import joins

    monkeypatch.setattr(joins, "piece_views", lambda *args: None)
    rng = np.random.default_rng(8)
    inputs = [rng.standard_normal((2, 24, 32)).astype(np.float32) for _ in range(5)]

    def check(call, counts):
        assert counts["direct_replays"] == (call >= 3) and counts["joined_in_place"] == 0

    per_device = _replayed_steps(inputs, False, True, 2, check)
    for call, (got_all, want_all) in enumerate(zip(per_device[1], per_device[0], strict=True)):
        scale = max(np.abs(w).max() for w in want_all[:2])  # the key's bias: rounding noise
        for got, want in zip(got_all, want_all, strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * scale,
                                       err_msg=f"call {call}")  # fmt: skip


def test_a_direct_replay_binds_its_attention_once_and_keeps_no_values(monkeypatch):
    """A direct replay binds each attention step's records to its template once; later
    calls fill the same records with their values (gradients equal NdArray's on every
    call), and between calls those records hold no value (their buffers go back to the
    pool)."""
    from ember.backends.fusion import direct
    from ember.backends.fusion.attention import AttentionTemplate

    binds = []
    bind = AttentionTemplate.bind
    monkeypatch.setattr(AttentionTemplate, "bind",
                        lambda self, records: binds.append(1) or bind(self, records))  # fmt: skip
    rng = np.random.default_rng(9)
    inputs = [rng.standard_normal((2, 24, 32)).astype(np.float32) for _ in range(7)]
    programs = []
    run = direct.run

    def spied(trace, program, tensors):
        programs.append(program)
        return run(trace, program, tensors)

    monkeypatch.setattr(direct, "run", spied)

    def check(call, counts):
        if call >= 3:
            assert counts["direct_replays"] == 1, call
            bound = programs[-1].bound
            assert len(bound) == 2  # the forward and the gradient segments
            for _, made, _, inputs_ in bound.values():
                assert all(slot.prim is None for _, slot in inputs_)
                assert all(s.prim is None for record in made for s in record.outputs)
        if call == 3:
            binds.clear()
        elif call > 3:
            assert not binds, call  # bound on the first direct call, then reused

    per_device = _replayed_steps(inputs, True, False, 1, check)
    for call, (got_all, want_all) in enumerate(zip(per_device[1], per_device[0], strict=True)):
        for got, want in zip(got_all, want_all, strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5 * np.abs(want).max(),
                                       err_msg=f"call {call}")  # fmt: skip


def test_threads_replay_a_training_step_through_attention_side_by_side():
    """Three threads replaying one training step through the attention at once (its
    launches direct after the first calls) each get the gradients of a plain call."""
    import threading

    from ember.backends.fusion import replay

    device = ember.device("ndarray").fusion(runtime="numba").autodiff()
    mha, _ = _mha(device, False, np.zeros((2, 24, 32), np.float32))
    params = (mha.query.weight.val(), mha.value.weight.val())

    def step(x: Tensor) -> list:
        context = mha(MhaInput.self_attn(x)).context
        g = (context * context).sum().backward()
        return [x.grad(g)] + [p.grad(g) for p in params]

    run = replay(step)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(8):
                x = rng.standard_normal((2, 24, 32)).astype(np.float32)
                got = [g.to_numpy() for g in run(Tensor.from_data(x, device).require_grad())]
                want = [g.to_numpy() for g in step(Tensor.from_data(x, device).require_grad())]
                for a, b in zip(got, want, strict=True):
                    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-5 * np.abs(b).max())
        except BaseException as error:  # re-raised below, on the test's thread
            errors.append(error)

    with autotune.forcing(Choice("fused", 1)):
        run(Tensor.from_data(np.ones((2, 24, 32), np.float32), device).require_grad())
        reset_stats()
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert stats()["direct_replays"] > 0 and stats()["attention_grads"] > 0


def _imported_pattern(q, k, v, scale, bias):
    """Attention as a PyTorch ONNX export writes it: both operands scaled by a one-element
    tensor, the key transposed first, an additive mask."""
    root = scale.sqrt()
    scores = (q * root).matmul(k.swap_dims(2, 3) * root) + bias
    return softmax(scores, 3).matmul(v)


def test_an_imported_models_attention_runs_as_one_kernel():
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((2, 3, 33, 16)).astype(np.float32) for _ in range(3)]
    bias = np.where(rng.random((2, 1, 1, 33)) < 0.2, -1e4, 0.0).astype(np.float32)
    scale = np.array([0.25], np.float32)
    eager, fused = ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")
    want = _imported_pattern(*(Tensor.from_data(a, eager) for a in (*arrays, scale, bias)))
    reset_stats()
    with autotune.forcing(Choice("fused", 1)):
        got = _imported_pattern(*(Tensor.from_data(a, fused) for a in (*arrays, scale, bias)))
        got = got.to_numpy()
    assert stats()["attentions"] == 1 and stats()["fused_ops"] == 11  # every record
    np.testing.assert_allclose(got, want.to_numpy(), rtol=1e-5, atol=1e-6)
    with autotune.forcing(Choice("fused", 1)):  # the same stream again: no fuser runs
        again = _imported_pattern(*(Tensor.from_data(a, fused) for a in (*arrays, scale, bias)))
        np.testing.assert_array_equal(again.to_numpy(), got)
    assert stats()["attentions"] == 2 and stats()["explorations"] == 1


def test_where_the_scores_are_read_later_the_records_run_one_by_one():
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal((1, 2, 40, 8)).astype(np.float32) for _ in range(3)]
    results = []
    for device in (ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")):
        q, k, v = (Tensor.from_data(a, device) for a in arrays)
        reset_stats()
        with autotune.forcing(Choice("fused", 1)):
            scores = (q * 0.5).matmul(k.swap_dims(2, 3))  # held: read after the segment
            context = softmax(scores, 3).matmul(v)
            results.append((context.to_numpy(), scores.to_numpy()))
    assert stats()["attentions"] == 0
    for got, want in zip(results[1], results[0], strict=True):
        np.testing.assert_array_equal(got, want)


def test_where_the_tuner_chose_the_records_they_run_one_by_one():
    x = np.random.default_rng(7).standard_normal((2, 40, 32)).astype(np.float32)
    mha, inp = _mha(ember.device("ndarray"), False, x)
    want = mha(inp).context.to_numpy()
    mha_f, inp_f = _mha(ember.device("ndarray").fusion(runtime="numba"), False, x)
    reset_stats()
    with autotune.forcing(UNFUSED):
        got = mha_f(inp_f).context.to_numpy()
    assert stats()["attentions"] == 0
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["softmax over another dim", "no second product",
                                  "scaled after the mask", "float64"])  # fmt: skip
def test_what_is_not_attention_is_not_fused(case):
    rng = np.random.default_rng(8)
    dtype = np.float64 if case == "float64" else np.float32
    arrays = [rng.standard_normal((1, 2, 40, 8)).astype(dtype) for _ in range(3)]
    mask = rng.random((1, 1, 40, 40)) < 0.5

    def almost_attention(q: Tensor, k: Tensor, v: Tensor, m: Tensor) -> Tensor:
        scores = q.matmul(k.swap_dims(2, 3))
        if case == "scaled after the mask":
            scores = scores.mask_fill(m, -1e4) * 0.5
        weights = softmax(scores, 2 if case == "softmax over another dim" else 3)
        return weights if case == "no second product" else weights.matmul(v)

    results = []
    for device in (ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")):
        tensors = [Tensor.from_data(a, device) for a in (*arrays, mask)]
        reset_stats()
        with autotune.forcing(Choice("fused", 1)):  # no inner value held: only the match decides
            results.append(almost_attention(*tensors).to_numpy())
    assert stats()["attentions"] == 0
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-7)


def _split_heads(qkv: Tensor, part: int, heads: int) -> Tensor:
    """An exported model's head split: a slice of the ``[seq, batch, 3 * d]`` projection
    (a permuted buffer), ``reshape`` to ``[seq, batch * heads, d_k]`` (which copies
    unfused), ``permute``, ``reshape`` to ``[batch, heads, seq, d_k]``."""
    seq, batch, width = qkv.shape
    d = width // 3
    x = qkv[:, :, part * d : (part + 1) * d]
    x = x.reshape([seq, batch * heads, d // heads]).permute([1, 0, 2])
    return x.reshape([batch, heads, seq, d // heads])


def _imported_heads(qkv: Tensor, root: Tensor) -> Tensor:
    q, k, v = (_split_heads(qkv, part, 4) for part in range(3))
    return softmax((q * root).matmul(k.swap_dims(2, 3) * root), 3).matmul(v)


def test_the_heads_are_read_in_place_through_their_layout_steps():
    rng = np.random.default_rng(9)
    qkv = rng.standard_normal((3, 48, 96)).astype(np.float32)  # [batch, seq, 3 * d]
    root = np.array([0.5], np.float32)
    eager, fused = ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")
    want = _imported_heads(Tensor.from_data(qkv, eager).permute([1, 0, 2]),
                           Tensor.from_data(root, eager)).to_numpy()  # fmt: skip
    reset_stats()
    with autotune.forcing(Choice("fused", 1)):
        got = _imported_heads(Tensor.from_data(qkv, fused).permute([1, 0, 2]),
                              Tensor.from_data(root, fused)).to_numpy()  # fmt: skip
    counts = stats()
    assert counts["attentions"] == 1
    # The segment holds the three head splits (a slice and 3 steps each), the key's
    # transpose, the two scalings, the products and the softmax: nothing is copied.
    assert counts["fused_ops"] == 12 + 1 + 2 + 2 + 5 and counts["unfused_ops"] == 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_where_the_layout_steps_make_no_view_the_prologue_runs_first():
    rng = np.random.default_rng(10)
    arrays = [rng.standard_normal((2, 200, 16)).astype(np.float32) for _ in range(3)]

    def heads(x: Tensor) -> Tensor:  # [b, s, d] -> [s, b, d] -> [b, s, d]: no single view
        return x.permute([1, 0, 2]).reshape([2, 200, 16]).reshape([2, 1, 200, 16])

    def attend(q, k, v):
        return softmax((heads(q) * 0.25).matmul(heads(k).swap_dims(2, 3)), 3).matmul(heads(v))

    eager, fused = ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")
    want = attend(*(Tensor.from_data(a, eager) for a in arrays)).to_numpy()
    reset_stats()
    with autotune.forcing(Choice("fused", 1)):
        got = attend(*(Tensor.from_data(a, fused) for a in arrays)).to_numpy()
    assert stats()["attentions"] == 1
    assert stats()["fused_ops"] == 7  # the products and the softmax; the heads ran first
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_query_broadcast_over_the_batch_runs_as_one_kernel():
    """One query for every batch entry and head (a learned query, as in attention pooling):
    the products broadcast it; so does the kernel."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 1, 24, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 3, 300, 16)).astype(np.float32) for _ in range(2))
    results = []
    for device in (ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")):
        qt, kt, vt = (Tensor.from_data(a, device) for a in (q, k, v))
        reset_stats()
        with autotune.forcing(Choice("fused", 1)):
            weights = softmax((qt * 0.25).matmul(kt.swap_dims(2, 3)), 3)
            results.append(weights.matmul(vt).to_numpy())
    assert stats()["attentions"] == 1
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- the gradient
def grad_reference(q, k, v, weights, d_out, factor=1.0, mask=None):
    """The gradient records' values in float64: ``(dQ, dK, dV)``."""
    q, k, v, p, g = (a.astype(np.float64) for a in (q, k, v, weights, d_out))
    dp = g @ np.swapaxes(v, -1, -2)
    ds = (dp * p - p * (dp * p).sum(-1, keepdims=True)) * factor
    if mask is not None:
        ds = np.where(mask, 0.0, ds)
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("seed", range(8))
def test_the_gradient_kernel_equals_float64(seed):
    rng = np.random.default_rng(seed)
    b0, b1 = (int(n) for n in rng.integers(1, 4, 2))
    lq, lk = (int(n) for n in rng.integers(1, 200, 2))
    d, dv = (int(n) for n in rng.integers(1, 70, 2))
    q = rng.standard_normal((b0, b1, lq, d), dtype=np.float32)
    k = rng.standard_normal((b0, b1, lk, d), dtype=np.float32)
    v = rng.standard_normal((b0, b1, lk, dv), dtype=np.float32)
    if seed % 2:  # head views
        q = np.ascontiguousarray(q.swapaxes(1, 2)).swapaxes(1, 2)
        v = np.ascontiguousarray(v.swapaxes(2, 3)).swapaxes(2, 3)
    weights = _softmax_rows(q @ np.swapaxes(k, -1, -2))
    d_out = rng.standard_normal((b0, b1, lq, dv), dtype=np.float32)
    mask = rng.random((b0, 1, lq, lk)) < 0.3 if seed % 3 == 1 else None
    d_k = np.full((b0, b1, d, lk), np.nan, np.float32).swapaxes(2, 3)  # written through a view
    got = numba_attention.attention_backward(q, k, v, weights, d_out, factor=0.7, mask=mask,
                                             d_k=d_k, threads=1 + seed % 2)  # fmt: skip
    assert got[1] is d_k
    for g, want in zip(got, grad_reference(q, k, v, weights, d_out, 0.7, mask), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_parts_that_claim_tasks_take_each_once_in_any_order(monkeypatch):
    # The kernels run a call a thread, each taking a task at a time from a counter they
    # share: run one after another, last call first, the last claims every task but the
    # others' own, and forward and gradients have one part's bits.
    from ember.backends.fusion import numba_runtime

    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 3, 40, 16), dtype=np.float32) for _ in range(3))
    d_out = rng.standard_normal((2, 3, 40, 16), dtype=np.float32)
    weights = np.empty((2, 3, 40, 40), np.float32)
    one = numba_attention.attention(q, k, v, 0.25, weights=weights, threads=1)
    grads = numba_attention.attention_backward(q, k, v, weights, d_out, factor=0.25, threads=1)
    claims = []

    def in_reverse(kernel, args, parts, threads=None, calls=None):
        claims.append(args[-1])
        for part in reversed(range(min(calls or parts, parts))):  # the runtime makes `calls` calls
            kernel(*args, part, parts)

    monkeypatch.setattr(numba_runtime, "_run_parts", in_reverse)
    for parts in (2, 3):
        claims.clear()
        again = np.empty_like(weights)
        got = numba_attention.attention(q, k, v, 0.25, weights=again, threads=parts)
        np.testing.assert_array_equal(got, one)
        np.testing.assert_array_equal(again, weights)
        for g, want in zip(numba_attention.attention_backward(
                q, k, v, weights, d_out, factor=0.25, threads=parts), grads, strict=True):  # fmt: skip
            np.testing.assert_array_equal(g, want)
        # the counter: its start (a call a part) and a claim per task (batch entries, by
        # chunks of queries forward), found or empty
        forward, backward = claims
        chunks = numba_attention.chunk_sizes(6, 40, 40, parts, True)[0]
        assert forward[1] == 6 * -(-40 // chunks) + parts and backward[1] == 6 + parts


def test_the_gradient_kernel_stores_the_query_gradient_scaled():
    rng = np.random.default_rng(13)
    q, k, v, d_out = (rng.standard_normal((2, 2, 30, 8), dtype=np.float32) for _ in range(4))
    weights = _softmax_rows(q @ np.swapaxes(k, -1, -2))
    plain = numba_attention.attention_backward(q, k, v, weights, d_out, factor=0.7)
    scaled = numba_attention.attention_backward(q, k, v, weights, d_out, factor=0.7,
                                                q_factor=0.25)  # fmt: skip
    np.testing.assert_array_equal(scaled[0], plain[0] * np.float32(0.25))  # as the scaling rounds
    for got, want in zip(scaled[1:], plain[1:], strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_query_gradient_read_before_its_scaling_keeps_both_values():
    # dQ' itself is read after the segment: the kernel may not store only its scaling.
    rng = np.random.default_rng(14)
    q, k, v, d_out = (rng.standard_normal((2, 3, 40, 16)).astype(np.float32) for _ in range(4))
    weights = _softmax_rows(q @ np.swapaxes(k, -1, -2))
    results = []
    for device in (ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")):
        tq, tk, tv, tw, to = (Tensor.from_data(a, device) for a in (q, k, v, weights, d_out))
        reset_stats()
        with autotune.forcing(Choice("fused", 1)):
            d_p = to.matmul(tv.swap_dims(2, 3))
            d_v = tw.swap_dims(2, 3).matmul(to)
            t = d_p * tw
            d_s = t - tw * t.sum_dim(3)
            d_q_raw = d_s.matmul(tk)
            d_q = d_q_raw * 0.5
            d_k = tq.swap_dims(2, 3).matmul(d_s).swap_dims(2, 3)
            results.append([a.to_numpy() for a in (d_q, d_q_raw, d_k, d_v)])
    for got, want in zip(results[1], results[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_the_gradient_kernel_refuses_what_it_does_not_compute():
    q = k = v = d_out = np.zeros((1, 1, 600, 8), np.float32)
    weights = np.zeros((1, 1, 600, 600), np.float32)  # more scores than it holds in cache
    assert not numba_attention.supports_backward(q, k, v, weights, d_out)
    with pytest.raises(KernelUnsupported, match="numba attention backward"):
        numba_attention.attention_backward(q, k, v, weights, d_out)
    small = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(KernelUnsupported, match=r"d_q float32 \(1, 1, 4, 9\)"):
        numba_attention.attention_backward(small, small, small, np.zeros((1, 1, 4, 4), np.float32),
                                           small, d_q=np.zeros((1, 1, 4, 9), np.float32))  # fmt: skip


def _gradient_records(q, k, v, weights, d_out, hold_ds=False):
    """The records autodiff writes for attention's backward pass, written by hand."""
    d_p = d_out.matmul(v.swap_dims(2, 3))
    d_v = weights.swap_dims(2, 3).matmul(d_out)
    t = d_p * weights
    d_s = t - weights * t.sum_dim(3)
    d_q = d_s.matmul(k) * 0.5
    d_k = q.swap_dims(2, 3).matmul(d_s).swap_dims(2, 3)
    return (d_q, d_k, d_v, d_s) if hold_ds else (d_q, d_k, d_v)


@pytest.mark.parametrize("hold_ds", [False, True])
def test_the_gradient_records_run_as_one_kernel(hold_ds):
    rng = np.random.default_rng(12)
    q, k, v, d_out = (rng.standard_normal((2, 3, 40, 16)).astype(np.float32) for _ in range(4))
    weights = _softmax_rows(q @ np.swapaxes(k, -1, -2))
    results = []
    for device in (ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")):
        tensors = [Tensor.from_data(a, device) for a in (q, k, v, weights, d_out)]
        reset_stats()
        with autotune.forcing(Choice("fused", 1)):
            outs = _gradient_records(*tensors, hold_ds=hold_ds)
            results.append([o.to_numpy() for o in outs])
    # A held inner value (the scores' gradient) runs the records one by one, exactly.
    assert stats()["attention_grads"] == (0 if hold_ds else 1)
    if not hold_ds:  # dQ's scaling is stored by the kernel; the swap of dK' runs after it
        assert stats()["unfused_ops"] == 1
    for got, want in zip(results[1], results[0], strict=True):
        if hold_ds:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_threads_running_attention_at_once_get_what_they_get_alone():
    import threading

    fused = ember.device("ndarray").fusion(runtime="numba")
    inputs = [np.random.default_rng(20 + i).standard_normal((2, 40, 32)).astype(np.float32)
              for i in range(4)]  # fmt: skip
    mha = _mha(fused, False, inputs[0])[0]
    reset_stats()

    def attend(x: np.ndarray) -> np.ndarray:
        return mha(MhaInput.self_attn(Tensor.from_data(x, fused))).context.to_numpy()

    together: list = [None] * len(inputs)

    def run(i: int) -> None:
        for _ in range(5):
            together[i] = attend(inputs[i])

    with autotune.forcing(Choice("fused", 2)):  # one choice for every thread (a global)
        alone = [attend(x) for x in inputs]
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert stats()["attentions"] >= 24
    for got, want in zip(together, alone, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("divided", ["scores by the scale", "the scale by the scores"])
def test_scores_divided_by_a_one_element_tensor(divided):
    """BERT's export divides the scores by ``sqrt(d)`` held as a tensor: a scaling. A
    tensor divided by the scores is none: not attention."""
    rng = np.random.default_rng(13)
    arrays = [rng.standard_normal((2, 3, 40, 16)).astype(np.float32) for _ in range(3)]
    root = np.array([4.0], np.float32)
    results = []
    for device in (ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")):
        q, k, v, r = (Tensor.from_data(a, device) for a in (*arrays, root))
        reset_stats()
        with autotune.forcing(Choice("fused", 1)):
            product = q.matmul(k.swap_dims(2, 3))
            scaled = product / r if divided == "scores by the scale" else r / product
            del product  # held by no one: the fuser may leave it unwritten
            out = softmax(scaled, 3).matmul(v)
            del scaled
            results.append(out.to_numpy())
    assert stats()["attentions"] == (1 if divided == "scores by the scale" else 0)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


def test_a_replayed_training_step_sums_its_input_gradient_in_place(monkeypatch):
    """At sizes the runtime pools: the input gradient's terms (the three projections'
    products) are added into the running sum's array by the GEMM, the projections' biases
    start their products' sums, dQ's scaling is the kernel's; every call's gradients (of
    the input, the weights and the biases) equal NdArray's."""
    from ember.backends.fusion import executor

    monkeypatch.setattr(executor, "LONE_KERNEL_MIN", 1 << 12)  # the sums run as kernels
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((4, 64, 64)).astype(np.float32) for _ in range(5)]

    def check(call, counts):
        if call >= 3:
            assert counts["direct_replays"] == 1 and counts["in_place"] >= 2, counts

    per_device = _replayed_steps(inputs, False, True, 2, check, separate=True)
    for call, (got_all, want_all) in enumerate(zip(per_device[1], per_device[0], strict=True)):
        for got, want in zip(got_all, want_all, strict=True):
            # The key's bias has no gradient (softmax ignores a constant a row): its values
            # are rounding noise, held to the size of the others.
            scale = max(np.abs(w).max() for w in want_all[:2])
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * scale,
                                       err_msg=f"call {call}")  # fmt: skip
