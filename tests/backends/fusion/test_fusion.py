"""The fusion decorator: laziness is invisible, fused results equal unfused ones, plans are
cached, and each thread has its own stream. Blocks run on the interpreter runtime here
(exact, nothing to compile); ``test_fusion_numba.py`` runs them compiled."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import Tensor, activation
from ember.backend.errors import EmberIndexError
from ember.backends.fusion import Fusion, reset_stats, stats
from ember.backends.fusion.explorer import clear_plans


@pytest.fixture
def device() -> ember.Device:
    return ember.device("ndarray").fusion(runtime="interpreter")


def _pending(t: Tensor) -> bool:
    return t._prim.slot.pending


def test_ops_are_recorded_not_run_until_read(device):
    x = Tensor.from_data([1.0, -2.0], device)
    y = (x * 3.0).abs()
    assert _pending(y) and y.shape == (2,) and y.dtype == ember.DType.F32
    assert y.tolist() == [3.0, 6.0]
    assert not _pending(y)


def test_sync_runs_the_stream(device):
    y = Tensor.from_data([1.0], device) + 1.0
    device.sync()
    assert not _pending(y)


def test_an_index_error_raises_at_the_op(device):
    x = Tensor.from_data([[1.0, 2.0]], device) * 2.0
    bad = Tensor.from_data([[0, 5]], device, kind=ember.Kind.INT)
    eager = ember.device("ndarray")
    with pytest.raises(EmberIndexError) as fused_error:
        x.gather(1, bad)
    with pytest.raises(EmberIndexError) as eager_error:
        Tensor.from_data([[2.0, 4.0]], eager).gather(
            1, Tensor.from_data([[0, 5]], eager, kind=ember.Kind.INT)
        )
    assert str(fused_error.value) == str(eager_error.value)


INDEXED_CALLS = {  # op: (its call on x [2, 3] and indices, the indices' shape)
    "gather": (lambda x, i: x.gather(1, i), (2, 2)),
    "select": (lambda x, i: x.select(1, i), (2,)),
    "scatter": (lambda x, i: x.scatter(1, i, x[:, :2] * 0.5), (2, 2)),
    "select_assign": (lambda x, i: x.select_assign(1, i, x[:, :2] + 1.0), (2,)),
}


@pytest.mark.parametrize("op", list(INDEXED_CALLS))
def test_indexed_ops_are_recorded_where_their_indices_fit(op):
    """A gather (a cross-entropy's) or scatter (its gradient) by made indices within the dim
    is recorded like any op; indices that do not fit (negative ones, which NumPy wraps, or
    pending ones) run the op at once, as before, with the same results as NdArray's."""
    call, shape = INDEXED_CALLS[op]
    device = ember.device("ndarray").fusion(runtime="interpreter", small=0)  # records all
    eager = ember.device("ndarray")
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    for index in ([2, 0, 1, 2], [-1, 0, 2, -3]):
        chosen = np.array(index[: int(np.prod(shape))], np.int64).reshape(shape)
        want = call(Tensor.from_data(data, eager), Tensor.from_data(chosen, eager)).to_numpy()
        x = Tensor.from_data(data, device) * 1.0  # pending
        reset_stats()
        got = call(x, Tensor.from_data(chosen, device))
        fits = index[0] >= 0
        assert _pending(got) == fits
        assert stats()["eager_ops"] == (0 if fits else 1) + 1  # + from_data, always at once
        np.testing.assert_array_equal(got.to_numpy(), want)
    x = Tensor.from_data(data, device)
    ones = Tensor.from_data(np.zeros(100, np.int64), device) + 1  # over 64: not shape arithmetic
    pending = ones[: int(np.prod(shape))].reshape(list(shape))
    assert _pending(pending)
    reset_stats()
    got = call(x, pending)
    assert stats()["eager_ops"] == 1 and not _pending(got)


def test_random_draws_keep_the_inner_order_and_rng_state_works(device):
    eager = ember.device("ndarray")
    draws = []
    for d in (device, eager):
        d.seed(7)
        a = Tensor.random([3], ember.Distribution.uniform(0, 1), d) * 2.0
        state = d.backend.rng_state(d)
        b = Tensor.random([3], ember.Distribution.uniform(0, 1), d)
        d.backend.set_rng_state(d, state)
        c = Tensor.random([3], ember.Distribution.uniform(0, 1), d)
        draws.append((a.tolist(), b.tolist(), c.tolist()))
    assert draws[0] == draws[1]
    assert draws[0][1] == draws[0][2]


def test_fusion_off_runs_every_op_at_once():
    code = (
        "import ember; from ember import Tensor\n"
        "d = ember.device('ndarray').fusion(runtime='interpreter')\n"
        "y = Tensor.from_data([1.0], d) + 1.0\n"
        "assert not y._prim.slot.pending and not d.backend.lazy\n"
        "print(y.tolist())\n"
    )
    env = {"EMBER_FUSION": "0", "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2.0]"


def test_debug_logs_each_block():
    code = (
        "import ember; from ember import Tensor\n"
        "d = ember.device('ndarray').fusion(runtime='interpreter', small=0)\n"
        "print(((Tensor.from_data([1.0], d) + 1.0) * 2.0).tolist())\n"
    )
    env = {"EMBER_FUSION_DEBUG": "1", "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "[ember.fusion] block of 2 ops (add_scalar mul_scalar)" in out.stderr


def test_fewer_kernels_than_ops_and_intermediates_not_written(device):
    x = Tensor.from_data(np.arange(6, dtype=np.float32).reshape(2, 3), device)
    b = Tensor.from_data(np.ones(3, dtype=np.float32), device)
    reset_stats()
    y = ((x * 2.0 + b).exp() - 1.0).clamp(0.0, 10.0).tolist()
    counts = stats()
    assert counts["kernels"] == 1 and counts["fused_ops"] == 5 and counts["unfused_ops"] == 0
    expected = np.clip(np.exp(np.arange(6, dtype=np.float32).reshape(2, 3) * 2 + 1) - 1, 0, 10)
    np.testing.assert_array_equal(np.array(y, np.float32), expected)


def test_softmax_is_one_block(device):
    x = Tensor.from_data(np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32), device)
    eager = Tensor.from_data(x.to_data().to_numpy(), ember.device("ndarray"))
    reset_stats()
    fused = activation.softmax(x, 1).to_data().to_numpy()
    assert stats()["kernels"] == 1
    np.testing.assert_array_equal(fused, activation.softmax(eager, 1).to_data().to_numpy())


def test_second_identical_step_explores_nothing(device):
    clear_plans()

    def step(n: int) -> list:
        x = Tensor.from_data(np.ones((n, 3), np.float32), device)
        return activation.gelu(x * 0.5 + 1.0).sum_dim(1).tolist()

    step(2)
    reset_stats()
    step(2)
    step(5)  # other sizes, same plan
    counts = stats()
    assert counts["explorations"] == 0 and counts["cache_hits"] == 2


def test_a_stream_with_nothing_to_fuse_is_not_planned(device):
    # Matmuls, views and lone element-wise ops between them: no two neighbours fuse.
    clear_plans()
    rng = np.random.default_rng(3)
    a, b = (rng.normal(size=(4, 4)).astype(np.float32) for _ in range(2))
    reset_stats()
    x, w = Tensor.from_data(a, device), Tensor.from_data(b, device)
    got = (x.matmul(w).transpose().exp().matmul(w).reshape([16]) * 2.0).tolist()
    counts = stats()
    assert counts["explorations"] == 0 and counts["cache_hits"] == 0
    assert counts["kernels"] == 0 and counts["unfused_ops"] == 6
    np.testing.assert_allclose(got, (np.exp((a @ b).T) @ b).reshape(16) * 2.0, rtol=1e-6)


def test_a_product_read_only_transposed_is_computed_transposed(device):
    # (a @ b)^T + c, as a second-order gradient sums a weight's two terms: the product is
    # computed as b^T @ a^T, so the sum reads two C-contiguous operands
    rng = np.random.default_rng(4)
    a, b, c = (rng.normal(size=s).astype(np.float32) for s in ((6, 3), (3, 5), (5, 6)))
    x, w, other = (Tensor.from_data(v, device) for v in (a, b, c))
    reset_stats()
    transposed = x.matmul(w).transpose()
    total = transposed + other
    np.testing.assert_allclose(total.to_numpy(), (a @ b).T + c, rtol=1e-6)
    assert stats()["transposed_products"] == 1
    assert transposed._prim.slot.prim.flags.c_contiguous
    # Read as it is too (or swapped otherwise, or by a handle): the product as usual
    reset_stats()
    product = x.matmul(w)
    both = product.transpose() + other
    np.testing.assert_allclose((both + product.transpose()).to_numpy(), 2 * (a @ b).T + c,
                               rtol=1e-6)  # fmt: skip
    stacked = Tensor.from_data(np.stack([a, a]), device).matmul(w).permute([2, 1, 0])
    np.testing.assert_allclose(stacked.to_numpy(), np.stack([a @ b] * 2).transpose(2, 1, 0))
    assert stats()["transposed_products"] == 0


def _norm_step(device, n: int, d: int = 6) -> np.ndarray:
    """A layer norm and a softmax over a batch of ``n`` rows (reductions, broadcasts, a
    scalar, several blocks and unfused records)."""
    rng = np.random.default_rng(n)
    x = Tensor.from_data(rng.normal(size=(n, d)).astype(np.float32), device)
    w = Tensor.from_data(rng.normal(size=(d,)).astype(np.float32), device)
    centred = x - x.mean_dim(1)
    normed = centred / (centred.powf_scalar(2.0).mean_dim(1) + 1e-5).sqrt() * w
    return (
        activation.softmax(normed.matmul(w.reshape([d, 1]) * 0.5 + normed.transpose()), 1)
        .to_data()
        .to_numpy()
    )


def test_a_cache_hit_binds_templates_without_the_fusers(device, monkeypatch):
    from ember.backends.fusion.elementwise import ElementwiseFuser

    offered = []
    fuse = ElementwiseFuser.fuse
    monkeypatch.setattr(
        ElementwiseFuser, "fuse", lambda self, r: (offered.append(r), fuse(self, r))
    )
    for n in (3, 8, 1, 64):  # 1: unit dims change the key, so it explores its own plan
        clear_plans()
        reset_stats()
        fresh = _norm_step(device, n)
        assert stats()["explorations"] > 0 and offered
        offered.clear()
        reset_stats()
        for m in (n, n + 5) if n > 1 else (n,):
            got = _norm_step(device, m)
            counts = stats()
            assert offered == [] and counts["explorations"] == 0 and counts["kernels"] > 0
            clear_plans()
            expected = _norm_step(device, m)  # explored from scratch
            np.testing.assert_array_equal(got, expected)
            if m == n:
                np.testing.assert_array_equal(got, fresh)
            _norm_step(device, n)  # the templates again, for the next size
            offered.clear()
            reset_stats()


def test_a_bound_block_shares_its_templates_kernel_key(device, monkeypatch):
    from ember.backends.fusion.interpreter import InterpreterRuntime

    keys = []
    run = InterpreterRuntime.run

    def spy(self, block, *args, **kwargs):
        keys.append((block.key(), block._pattern_key()))
        return run(self, block, *args, **kwargs)

    monkeypatch.setattr(InterpreterRuntime, "run", spy)
    clear_plans()
    for n in (3, 3, 9):  # explored, then bound twice (the same sizes, then others)
        _norm_step(device, n)
    assert len(keys) >= 6 and all(shared == fresh for shared, fresh in keys)


def test_a_bound_block_is_reused_only_for_the_same_sizes_and_scalars(device, monkeypatch):
    from ember.backends.fusion.interpreter import InterpreterRuntime

    blocks = []
    run = InterpreterRuntime.run
    monkeypatch.setattr(InterpreterRuntime, "run",
                        lambda self, block, *a, **k: (blocks.append(block), run(self, block, *a, **k))[1])  # fmt: skip
    clear_plans()
    x = np.array([[0.5, 2.0, 4.0]], np.float32)

    def step(rows: int, scale) -> np.ndarray:
        t = Tensor.from_data(np.repeat(x, rows, 0), device)
        return (1.0 / ((t.abs() + 1.0) * scale)).to_numpy()

    calls = [(2, 2.0), (2, 2.0), (2, 2.0), (4, 2.0), (4, 2.0), (4, 3.0), (4, 0.0), (4, -0.0),
             (4, -0.0), (4, 0.0)]  # fmt: skip
    for rows, scale in calls:
        got = step(rows, scale)
        with np.errstate(divide="ignore"):
            want = 1.0 / ((np.abs(np.repeat(x, rows, 0)) + 1.0) * np.float32(scale))
        np.testing.assert_array_equal(got, want)  # -0.0 gives -inf: the scalar's sign kept
    assert len(blocks) == len(calls)
    reused = [blocks[i] is blocks[i - 1] for i in range(1, len(calls))]
    # Explored, then bound: the same sizes and scalars bind the same block again; another
    # size or scalar (a zero of the other sign too) builds its own.
    assert reused == [False, True, False, True, False, False, False, True, False]


def test_a_template_whose_sizes_disagree_falls_back_to_the_fusers(device):
    clear_plans()

    def step(a: int, b: int) -> tuple:
        x = Tensor.from_data(np.ones((a, 3), np.float32), device)
        y = Tensor.from_data(np.full((b, 3), 2.0, np.float32), device)
        p, q = x * 2.0 + 1.0, y * 3.0 + 1.0  # one flush runs both
        return p.tolist(), q.tolist()

    reset_stats()
    step(2, 2)
    assert stats()["kernels"] == 1 and stats()["fused_ops"] == 4  # one block of four records
    reset_stats()
    got = step(2, 4)  # same key; the two chains no longer share a block shape
    assert stats()["explorations"] == 1
    assert got == ([[3.0] * 3] * 2, [[7.0] * 3] * 4)


def test_each_thread_has_its_own_stream(device):
    results = {}

    def work(k: int) -> None:
        x = Tensor.from_data(np.full(4, k, np.float32), device)
        y = x
        for _ in range(20):
            y = y * 1.5 - 0.5
        results[k] = y.tolist()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        expected = np.full(4, k, np.float32)
        for _ in range(20):
            expected = expected * np.float32(1.5) - np.float32(0.5)
        assert results[k] == expected.tolist()


def test_a_value_from_another_threads_stream(device):
    x = Tensor.from_data([1.0, 2.0], device) * 2.0  # pending in this thread's stream
    out = []
    thread = threading.Thread(target=lambda: out.append((x + 1.0).tolist()))
    thread.start()
    thread.join()
    assert out == [[3.0, 5.0]]


def test_backward_through_fusion():
    device = ember.device("ndarray").fusion(runtime="interpreter").autodiff()
    x = Tensor.from_data([[0.5, -1.0, 2.0]], device).require_grad()
    grads = (activation.softmax(x * 2.0, 1) * 3.0).sum().backward()
    g = x.grad(grads).to_data().to_numpy()
    np.testing.assert_allclose(g, np.zeros((1, 3)), atol=1e-6)  # softmax sums to 1 per row
    assert isinstance(device.backend.inner, Fusion)


# ---------------------------------------------------------------- random graphs
UNARY = ["exp", "tanh", "abs", "neg", "sigmoid", "sqrt_abs", "square"]
BINARY = ["add", "sub", "mul", "max_pair", "where_greater"]


def _apply(values: list[Tensor], step: tuple) -> Tensor:
    kind, name, i, j, scalar = step
    a, b = values[i % len(values)], values[j % len(values)]
    if kind == "u":
        if name == "sqrt_abs":
            return a.abs().sqrt()
        if name == "square":
            return a * a
        if name == "sigmoid":
            return activation.sigmoid(a)
        return getattr(a, name)()
    if kind == "s":
        return (a * scalar + 0.25).clamp(-3.0, 3.0)
    if kind == "r":
        return a.sum_dim(-1) if name == "sum" else a.max_dim(-1)
    if name == "where_greater":
        return a.mask_where(a > b, b)
    if name == "max_pair":
        return a.max_pair(b)
    return a + b if name == "add" else a - b if name == "sub" else a * b


STEPS = st.lists(
    st.tuples(
        st.sampled_from(["u", "b", "s", "r"]),
        st.sampled_from(UNARY + BINARY + ["sum", "max"]),
        st.integers(0, 20), st.integers(0, 20),
        st.floats(-2, 2, allow_nan=False, width=32),
    ),
    min_size=1, max_size=12,
)  # fmt: skip
SHAPES = st.sampled_from(
    [[(3, 4), (1, 4), (3, 1)], [(2, 3, 4), (3, 4), (2, 1, 4)], [(5,), (1,), (5,)]]
)


def _graph(device: ember.Device, shapes, steps, seed: int) -> list:
    rng = np.random.default_rng(seed)
    values = [Tensor.from_data(rng.normal(size=s).astype(np.float32), device) for s in shapes]
    for step in steps:
        if step[0] == "u" and step[1] not in UNARY:
            step = ("u", "exp", *step[2:])
        if step[0] == "b" and step[1] not in BINARY:
            step = ("b", "add", *step[2:])
        values.append(_apply(values, step))
    return [v.to_data().to_numpy() for v in values[len(shapes) :]]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(shapes=SHAPES, steps=STEPS, seed=st.integers(0, 3))
def test_random_graphs_fused_equal_unfused(shapes, steps, seed):
    # Unfused: the same decorator running each op at once (activations decompose alike).
    eager = ember.device("ndarray").fusion(runtime="interpreter")
    eager.backend.lazy = False
    unfused = _graph(eager, shapes, steps, seed)
    reset_stats()
    fused = _graph(ember.device("ndarray").fusion(runtime="interpreter"), shapes, steps, seed)
    for f, u in zip(fused, unfused, strict=True):
        np.testing.assert_array_equal(f, u)
    # Whatever fused, each block replaced at least two ops.
    assert stats()["kernels"] * 2 <= stats()["fused_ops"]


def test_random_graphs_fuse():
    reset_stats()
    shapes = [(3, 4), (1, 4), (3, 1)]
    steps = [("b", "add", 0, 1, 0.0), ("u", "exp", 3, 0, 0.0), ("s", "", 4, 0, 1.5),
             ("b", "where_greater", 5, 2, 0.0), ("r", "sum", 6, 0, 0.0)]  # fmt: skip
    _graph(ember.device("ndarray").fusion(runtime="interpreter"), shapes, steps, 0)
    counts = stats()
    assert counts["kernels"] == 1 and counts["fused_ops"] == 8  # the scalar step is 3 ops
