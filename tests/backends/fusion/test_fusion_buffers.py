"""Output buffers of fused blocks under the decorator: a value nobody can read any more goes
back to the numba runtime's pool and the next block writes into it (no fresh pages), while
a value that a handle, a view or an exported array can still read is never handed out
again; and the executor keeps nothing alive after a flush."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import Tensor
from ember.backends.fusion.executor import runtime_named

numba_runtime = pytest.importorskip("ember.backends.fusion.numba_runtime")
if not numba_runtime.available():
    pytest.skip("numba is not installed (pip install 'ember[jit]')", allow_module_level=True)

N = 1 << 14  # 64 KiB of f32: above the pool's smallest class


@pytest.fixture
def device():
    return ember.device("ndarray").fusion(runtime="numba")


@pytest.fixture
def pool():
    pool = runtime_named("numba").pool
    # Earlier tests' records still pending (a finished thread's stream) run now, and their
    # values caught in cycles go back now, not mid-test.
    ember.device("ndarray").fusion(runtime="numba").sync()
    gc.collect()
    pool.clear()
    return pool


def _step(x: Tensor, k: float) -> Tensor:
    y = (x * k).abs().neg()  # one fused block of three exact ops (no contraction to fma)
    x.device.sync()
    return y


def _expected(x: np.ndarray, k: float) -> np.ndarray:
    return -np.abs(x * np.float32(k))


def _data(n: int = N, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def test_a_dropped_result_is_reused_by_the_next_block(device, pool):
    x = Tensor.from_data(_data(), device)
    y = _step(x, 2.0)
    assert pool.idle_bytes() == 0
    del y
    assert pool.idle_bytes() >= N * 4
    hits = pool.hits
    z = _step(x, 3.0)
    assert pool.hits == hits + 1
    np.testing.assert_array_equal(z.to_numpy(), _expected(_data(), 3.0))


def test_a_held_result_is_never_overwritten(device, pool):
    data = _data()
    x = Tensor.from_data(data, device)
    held = _step(x, 2.0)
    for k in range(3, 8):
        _step(x, float(k))  # dropped at once: its buffer cycles through the pool
    np.testing.assert_array_equal(held.to_numpy(), _expected(data, 2.0))


@pytest.mark.parametrize(("view", "part"), [
    (lambda t: t.reshape([N // 64, 64]), slice(None)),
    (lambda t: t.slice([(1, N)]), slice(1, None)),
    (lambda t: t.to_numpy(), slice(None)),
    (lambda t: memoryview(t._prim.slot.prim), slice(None)),
    (lambda t: t._prim.slot.prim[::2], slice(None, None, 2)),
    (lambda t: t.to_numpy()[1:], slice(1, None)),  # the exported array dropped, its view kept
])  # fmt: skip
def test_what_still_views_a_dropped_result_keeps_its_buffer(device, pool, view, part):
    data = _data()
    x = Tensor.from_data(data, device)
    y = _step(x, 2.0)
    kept = view(y)
    device.sync()
    del y
    for k in range(3, 8):
        _step(x, float(k))
    seen = np.asarray(kept.to_numpy() if isinstance(kept, Tensor) else kept).reshape(-1)
    np.testing.assert_array_equal(seen, _expected(data, 2.0)[part])


def test_an_input_dropped_before_its_last_read_is_recycled_after_it(device, pool):
    x = Tensor.from_data(_data(), device)
    y = _step(x, 2.0)
    z = (y * 0.5).exp().sum_dim(0)  # pending: reads y (a reduction: not over y's buffer)
    del y  # the pending record still reads it: not yet
    assert pool.idle_bytes() == 0
    device.sync()
    assert pool.idle_bytes() >= N * 4  # y, once z's block has run
    want = np.exp(_expected(_data(), 2.0) * 0.5).sum(0, keepdims=True)
    np.testing.assert_allclose(z.to_numpy(), want, rtol=1e-5)


def test_an_element_wise_block_writes_over_an_input_at_its_last_use(device, pool):
    x = Tensor.from_data(_data(), device)
    y = _step(x, 2.0)
    address = y._prim.slot.prim.__array_interface__["data"][0]
    z = (y * 0.5).exp()
    w = y + 1.0  # a later record reads y: z's block may not write over it
    device.sync()
    assert z._prim.slot.prim.__array_interface__["data"][0] != address
    del y
    v = (w * 3.0).abs()  # w is held: v gets a buffer of its own
    device.sync()
    held = w._prim.slot.prim.__array_interface__["data"][0]
    assert v._prim.slot.prim.__array_interface__["data"][0] != held
    u = (z * 2.0).neg()  # z's last use, dropped right away
    z_address = z._prim.slot.prim.__array_interface__["data"][0]
    del z
    device.sync()
    assert u._prim.slot.prim.__array_interface__["data"][0] == z_address
    assert pool.idle_bytes() == 0  # nothing went back: u lives in z's buffer
    e = np.exp(_expected(_data(), 2.0) * np.float32(0.5))
    np.testing.assert_allclose(u.to_numpy(), -(e * 2), rtol=2e-6)
    np.testing.assert_allclose(v.to_numpy(), np.abs((_expected(_data(), 2.0) + 1) * 3), rtol=2e-6)
    del u
    assert pool.idle_bytes() >= N * 4  # u's (once z's) buffer is recycled once


def test_a_view_of_an_input_keeps_it_from_being_written_over(device, pool):
    x = Tensor.from_data(_data(), device)
    y = _step(x, 2.0)
    view = y._prim.slot.prim[:4]  # someone holds a NumPy view of y's memory
    before = view.copy()
    z = (y * 0.5).exp()
    del y
    device.sync()
    np.testing.assert_array_equal(view, before)
    np.testing.assert_allclose(z.to_numpy(), np.exp(_expected(_data(), 2.0) * 0.5), rtol=2e-6)


def test_nothing_is_kept_alive_after_a_flush(device, pool):
    x = Tensor.from_data(_data(), device)
    y = _step(x, 2.0)
    array = weakref.ref(y._prim.slot.prim)
    slot = weakref.ref(y._prim.slot)
    del y
    assert slot() is None
    pool.idle_bytes()  # takes back what the slot's finalizer handed over
    assert array() is None


def test_threads_flushing_at_once_each_get_their_own_values(device, pool):
    data = [_data(seed=s) for s in range(4)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            x = Tensor.from_data(data[i], device)
            for k in range(1, 16):
                got = _step(x, float(k + i)).to_numpy()
                np.testing.assert_array_equal(got, _expected(data[i], float(k + i)))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_devices_with_different_runtimes_keep_their_own_streams(pool):
    interpreted = ember.device("ndarray").fusion(runtime="interpreter")
    compiled = ember.device("ndarray").fusion(runtime="numba")
    _step(Tensor.from_data(_data(), interpreted), 2.0)  # this thread's first stream there
    launches = runtime_named("numba").stats.launches
    _step(Tensor.from_data(_data(), compiled), 2.0)
    assert runtime_named("numba").stats.launches == launches + 1


def test_a_cached_plan_that_no_longer_fits_is_explored_anew():
    from ember.backends.fusion import reset_stats, stats
    from ember.backends.fusion.explorer import clear_plans

    device = ember.device("ndarray").fusion(runtime="interpreter")
    clear_plans()
    reset_stats()
    results = []
    for n in (3, 4):  # same pattern; with sizes 3 and 4 the chains cannot share a block
        x = Tensor.from_data(np.arange(3, dtype=np.float32), device)
        w = Tensor.from_data(np.arange(n, dtype=np.float32), device)
        a, b = (x * 2.0).abs(), (w * 3.0).abs()
        device.sync()
        results.append((a.to_numpy(), b.to_numpy()))
    counts = stats()
    assert counts["explorations"] == 2 and counts["cache_hits"] == 0
    np.testing.assert_array_equal(results[1][0], [0, 2, 4])
    np.testing.assert_array_equal(results[1][1], [0, 3, 6, 9])


def test_a_value_another_stream_reads_is_never_written_over(device, pool):
    x = Tensor.from_data(_data(), device)
    y = _step(x, 2.0)  # made by this thread's stream, pooled
    pending = []
    other = threading.Thread(target=lambda t=y: pending.append(t * 3.0))  # its stream, not run
    other.start()
    other.join()
    del other  # with the handle its function held
    z = (y * 0.5).exp()
    del y  # this stream's last use; the other thread's record still reads it
    want = _expected(_data(), 2.0)
    np.testing.assert_allclose(z.to_numpy(), np.exp(want * 0.5), rtol=2e-6)  # runs z's stream
    np.testing.assert_array_equal(pending[0].to_numpy(), want * np.float32(3.0))


def test_a_slot_collected_while_its_thread_holds_the_pool_lock(device, pool):
    # The garbage collector may run a slot's finalizer inside the pool's own work (an
    # allocation in take()): the finalizer must not wait for the lock its thread holds.
    x = Tensor.from_data(_data(), device)
    holder = [_step(x, 2.0)]
    done = threading.Event()

    def work() -> None:
        with pool._lock:
            holder.clear()  # the last reference: the slot's finalizer runs here
        done.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert done.is_set(), "a finalizer waited for the pool's lock"
    assert pool.idle_bytes() >= N * 4  # taken back at the next call into the pool


def test_a_step_repeated_after_dropping_its_result_reuses_one_buffer(device, pool):
    # The pool learns of a dropped result late (from a finalizer) and Python reuses the
    # ids of dead arrays at once: a late notice about an old loan must not void a new one.
    x = Tensor.from_data(_data(), device)
    _step(x, 1.0)  # the first call's buffer
    misses = pool.misses
    for k in range(2, 12):
        y = _step(x, float(k))
        np.testing.assert_array_equal(y.to_numpy(), _expected(_data(), float(k)))
        del y
    assert pool.misses == misses


def test_a_result_read_as_numpy_and_dropped_goes_back_to_the_pool(device, pool):
    # A model's output read with to_numpy call after call: once the caller drops the
    # array (and no view of it is left), its buffer is reused, not freed and faulted anew.
    x = Tensor.from_data(_data(), device)
    _step(x, 1.0).to_numpy()
    misses = pool.misses
    for k in range(2, 8):
        out = _step(x, float(k)).to_numpy()
        np.testing.assert_array_equal(out, _expected(_data(), float(k)))
        del out
    assert pool.misses == misses


def _heads(device, seed: int = 0) -> tuple[np.ndarray, Tensor]:
    """Attention's heads merged back: a reshape of a permuted value, which must copy."""
    x = np.random.default_rng(seed).normal(size=(8, 4, 128, 64)).astype(np.float32)
    merged = Tensor.from_data(x, device).permute([0, 2, 1, 3]).reshape([8, 128, 256])
    return x.transpose(0, 2, 1, 3).reshape(8, 128, 256), merged


def test_a_reshape_that_copies_writes_into_the_pool_and_goes_back(device, pool):
    want, merged = _heads(device)
    hits, misses = pool.hits, pool.misses
    got = merged._prim.slot.prim if not merged._prim.slot.pending else None
    np.testing.assert_array_equal(merged.to_numpy(), want)
    assert pool.hits + pool.misses == hits + misses + 1  # one pooled buffer, not fresh memory
    assert got is None or got.flags.c_contiguous
    del merged
    assert pool.idle_bytes() >= want.nbytes  # back in the pool once dropped
    hits = pool.hits
    want, merged = _heads(device, seed=1)
    np.testing.assert_array_equal(merged.to_numpy(), want)
    assert pool.hits == hits + 1  # the second merge reuses the first one's buffer


def test_a_reshape_that_can_be_a_view_stays_one(device, pool):
    x = np.random.default_rng(2).normal(size=(128, 8, 256)).astype(np.float32)
    t = Tensor.from_data(x, device).permute([1, 0, 2])  # [8, 128, 256], not contiguous
    split = t.reshape([8, 128, 4, 64])  # splits the contiguous last dim: a view
    hits, misses = pool.hits, pool.misses
    np.testing.assert_array_equal(split.to_numpy(), x.transpose(1, 0, 2).reshape(8, 128, 4, 64))
    assert (pool.hits, pool.misses) == (hits, misses)
    assert np.shares_memory(split._prim.slot.prim, t._prim.slot.prim)


@pytest.mark.parametrize("old_numpy", [False, True])
def test_reshape_view_tells_a_view_from_a_copy(monkeypatch, old_numpy):
    from ember.backends.fusion import executor

    if old_numpy:  # NumPy before 2.1 has no copy= argument
        plain = np.reshape

        def reshape(a, shape, **kwargs):
            if kwargs:
                raise TypeError("reshape() got an unexpected keyword argument 'copy'")
            return plain(a, shape)

        monkeypatch.setattr(executor.np, "reshape", reshape)
    x = np.arange(24.0).reshape(2, 3, 4).transpose(1, 0, 2)
    assert executor.reshape_view(x, (3, 8)) is None  # merging permuted dims: a copy
    view = executor.reshape_view(x, (3, 2, 2, 2))  # splitting the contiguous last dim
    assert view is not None and np.shares_memory(view, x)
    np.testing.assert_array_equal(view, x.reshape(3, 2, 2, 2))


@pytest.mark.parametrize("choice", ["fused", "unfused"])
def test_a_large_lone_element_wise_op_runs_as_a_kernel_of_its_own(device, pool, choice):
    """A bias added to a product (no block takes the add: its reader is a reshape) runs as
    a one-op kernel into pooled memory where the tuner chose it, else as the inner op;
    both equal NdArray."""
    from ember.backends.fusion import autotune, executor, reset_stats, stats

    rng = np.random.default_rng(4)
    # 512 x 256 results: within the sizes the tuner times (its choice is forced here)
    x, w = rng.normal(size=(512, 64)).astype(np.float32), rng.normal(size=(64, 256)).astype(np.float32)
    b = rng.normal(size=256).astype(np.float32)
    want = (x @ w + b).reshape(512, 8, 32)
    forced = autotune.Choice("fused", 1) if choice == "fused" else autotune.UNFUSED
    reset_stats()
    with pytest.MonkeyPatch.context() as patch, autotune.forcing(forced):
        patch.setattr(executor, "LONE_KERNEL_MIN", 1 << 16)
        t = Tensor.from_data(x, device).matmul(Tensor.from_data(w, device))
        got = (t + Tensor.from_data(b, device)).reshape([512, 8, 32]).to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert stats()["kernels"] == (1 if choice == "fused" else 0)
    assert stats()["fused_ops"] == (1 if choice == "fused" else 0)


def test_a_lone_kernel_writes_over_an_input_only_at_its_last_use(device, pool):
    """Two lone ops read a pooled block output nobody holds: the first must leave it for
    the second (it wrote over it, and the second read a value that was gone: an
    AttributeError), and the second, its last reader, may write over it."""
    from ember.backends.fusion import autotune, executor, reset_stats, stats

    rng = np.random.default_rng(7)
    x, w = rng.normal(size=(512, 256)).astype(np.float32), rng.normal(size=(256, 64)).astype(np.float32)
    reset_stats()
    with pytest.MonkeyPatch.context() as patch, autotune.forcing(autotune.Choice("fused", 1)):
        patch.setattr(executor, "LONE_KERNEL_MIN", 1 << 10)
        u = Tensor.from_data(x, device).exp()  # a block of its own: the product below cuts
        product = u.matmul(Tensor.from_data(w, device))
        doubled = (u * 2.0).reshape([512, 8, 32])  # lone ops: their readers are layout ops
        shifted = (u + 1.0).reshape([512, 8, 32])
        del u
        np.testing.assert_allclose(doubled.to_numpy(), (np.exp(x) * 2).reshape(512, 8, 32), rtol=1e-5)
        np.testing.assert_allclose(shifted.to_numpy(), (np.exp(x) + 1).reshape(512, 8, 32), rtol=1e-5)
        want = np.exp(x.astype(np.float64)) @ w
        np.testing.assert_allclose(product.to_numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert stats()["in_place"] == 1  # the last reader's


_ROWS, _COLS = 48, 96  # 18 KiB of f32: pooled, so blocks may write over their inputs


def _random_op(values: list, weight: Tensor, bias: Tensor, step: tuple) -> Tensor | None:
    from ember.tensor import activation

    kind, i, j, scalar = step
    a, b = values[-1 - i % len(values)], values[-1 - j % len(values)]  # recent ones, mostly
    if kind == "add":
        return a + b
    if kind == "mul":
        return a * b.tanh()
    if kind == "affine":
        return (a * scalar + 0.5).clamp(-4.0, 4.0)
    if kind == "relu":
        return activation.relu(a)
    if kind == "bias":
        return a + bias
    if kind == "matmul":  # cuts the blocks: the ops after it may run as lone kernels
        return a.matmul(weight)
    if kind == "heads":  # layout ops around an add
        return (a.reshape([_ROWS, 8, 12]) + 1.0).reshape([_ROWS, _COLS])
    if kind == "swap":  # a permuted view's reshape copies (into the pool) and back
        return a.reshape([_ROWS, 8, 12]).permute([1, 0, 2]).reshape([8, _ROWS * 12]) \
            .reshape([8, _ROWS, 12]).permute([1, 0, 2]).reshape([_ROWS, _COLS]) * scalar  # fmt: skip
    if kind == "transposed":  # a product whose one reader swaps it: computed transposed
        return a.matmul(weight).transpose().transpose() - b
    if kind == "rows":
        return a - a.sum_dim(-1) * (1.0 / _COLS)
    if kind == "cols":  # a reduction over the first axis, broadcast back
        return a * (a.max_dim(0) - a.min_dim(0) + 1.0).recip()
    if kind == "select":  # a comparison's mask, a fill and a where
        return a.mask_where(a.greater(b), b).mask_fill(b.greater(scalar), 0.25)
    if kind == "casts":  # through float64 and back: other dtypes never share a buffer
        return (a.cast("f64") * scalar).exp().clamp(0.0, 8.0).cast("f32") + b
    a.device.sync()  # "sync": what is recorded so far runs as a stream of its own
    return None


_RANDOM_STEPS = st.lists(
    st.tuples(st.sampled_from(["add", "mul", "affine", "relu", "bias", "matmul", "matmul", "heads",
                               "swap", "transposed", "rows", "cols", "select", "casts", "sync"]),
              st.integers(0, 3), st.integers(0, 3), st.sampled_from([-1.5, 0.5, 2.0])),
    min_size=2, max_size=8,
)  # fmt: skip


_KEPT = st.lists(st.booleans(), min_size=11, max_size=11)


def _graph_values(steps: list, kept: list, x: Tensor, y: Tensor, weight: Tensor,
                  bias: Tensor) -> dict[int, Tensor]:  # fmt: skip
    """The values of the graph of ``steps`` on ``x`` and ``y`` that ``kept`` picks (the
    last one where it picks none), by position; the rest are dropped, so their buffers may
    be written over and lent again."""
    values = [x, y]
    for step in steps:
        made = _random_op(values, weight, bias, step)
        if made is not None:
            values.append(made)
    chosen = [n for n, keep in enumerate(kept[: len(values)]) if keep] or [len(values) - 1]
    return {n: values[n] for n in chosen}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(steps=_RANDOM_STEPS, kept=_KEPT, reversed_reads=st.booleans())
def test_random_graphs_with_dropped_values_equal_ndarray(steps, kept, reversed_reads):
    """Random chains of element-wise ops, products (after which ops run as lone kernels),
    layout ops and syncs, of which the caller keeps some values and drops the rest before
    reading: blocks write over inputs nobody reads any more and the pool lends buffers
    again, and every kept value still equals NdArray's. The interpreter runtime shares
    the numba runtime's memory rules and compiles nothing, so it takes many graphs."""
    _check_random_graph("interpreter", steps, kept, reversed_reads)


@settings(max_examples=8, deadline=None, derandomize=True)  # each new block compiles
@given(steps=_RANDOM_STEPS, kept=_KEPT, reversed_reads=st.booleans())
def test_random_graphs_with_dropped_values_equal_ndarray_on_numba(steps, kept, reversed_reads):
    _check_random_graph("numba", steps, kept, reversed_reads)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(steps=_RANDOM_STEPS, kept=_KEPT)
def test_random_graphs_replayed_equal_ndarray(steps, kept):
    """The same graphs through ``fusion.replay``, called on new inputs each time: traced,
    replayed from records, then (where the flush allows) launched directly; every call's
    values equal NdArray's."""
    _check_random_graph("interpreter", steps, kept, False, calls=5)


@settings(max_examples=6, deadline=None, derandomize=True)  # each new block compiles
@given(steps=_RANDOM_STEPS, kept=_KEPT)
def test_random_graphs_replayed_equal_ndarray_on_numba(steps, kept):
    _check_random_graph("numba", steps, kept, False, calls=5)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(steps=_RANDOM_STEPS, kept=_KEPT, replayed=st.booleans())
def test_random_graphs_differentiated_equal_ndarray(steps, kept, replayed):
    """The gradients of the kept values (each weighted by a fixed probe) with respect to
    the inputs, the weight and the bias, on ``fusion(...).autodiff()`` (``replayed``: the
    whole step through ``fusion.replay``, called on new inputs four times): the backward
    pass records, fuses and writes over its intermediates too, and equals NdArray's."""
    _check_random_gradients("interpreter", steps, kept, replayed)


@settings(max_examples=6, deadline=None, derandomize=True)  # each new block compiles
@given(steps=_RANDOM_STEPS, kept=_KEPT, replayed=st.booleans())
def test_random_graphs_differentiated_equal_ndarray_on_numba(steps, kept, replayed):
    _check_random_gradients("numba", steps, kept, replayed)


def _check_random_gradients(runtime: str, steps: list, kept: list, replayed: bool) -> None:
    """Compares the gradients of the graph of ``steps`` (its ``kept`` values, each
    weighted by a fixed probe) on NdArray and on ``fusion(runtime).autodiff()``."""
    from ember.backends.fusion import autotune, executor, replay

    rng = np.random.default_rng(len(steps))
    host_weight = (rng.normal(size=(_COLS, _COLS)) / np.sqrt(_COLS)).astype(np.float32)
    host_bias = rng.normal(size=_COLS).astype(np.float32)
    probes = [rng.normal(size=(_ROWS, _COLS)).astype(np.float32) for _ in kept]
    inputs = [[rng.normal(size=(_ROWS, _COLS)).astype(np.float32) for _ in range(2)]
              for _ in range(4 if replayed else 1)]  # fmt: skip
    results = {}
    for name, on in (("ndarray", ember.device("ndarray").autodiff()),
                     ("fusion", ember.device("ndarray").fusion(runtime=runtime).autodiff())):  # fmt: skip
        probed = [Tensor.from_data(p, on) for p in probes]

        def grads_of(x: Tensor, y: Tensor, weight: Tensor, bias: Tensor,
                     probed: list = probed) -> list:  # fmt: skip
            held = _graph_values(steps, kept, x, y, weight, bias)
            grads = sum((value * probed[n]).sum() for n, value in held.items()).backward()
            return [leaf.grad(grads) for leaf in (x, y, weight, bias)]

        step_fn = replay(grads_of) if replayed and name == "fusion" else grads_of
        results[name] = []
        with pytest.MonkeyPatch.context() as patch, autotune.forcing(autotune.Choice("fused", 1)):
            patch.setattr(executor, "LONE_KERNEL_MIN", 1 << 10)
            patch.setattr(executor, "POOLED_COPY_MIN", 1 << 10)
            for x, y in inputs:
                leaves = [Tensor.from_data(h, on).require_grad() for h in (x, y, host_weight, host_bias)]
                results[name].append([None if g is None else g.to_numpy() for g in step_fn(*leaves)])
    for call, (got_all, want_all) in enumerate(zip(results["fusion"], results["ndarray"], strict=True)):
        for k, (got, want) in enumerate(zip(got_all, want_all, strict=True)):
            where = f"gradient {k} of call {call} of {steps}"
            assert (got is None) == (want is None), where
            if want is not None:
                np.testing.assert_allclose(got, want, rtol=1e-4,
                                           atol=1e-4 * max(1.0, np.abs(want).max()), err_msg=where)  # fmt: skip


def _check_random_graph(runtime: str, steps: list, kept: list, reversed_reads: bool,
                        calls: int = 0) -> None:  # fmt: skip
    """Runs the graph of ``steps`` on NdArray and on a fusion device of ``runtime`` (with
    ``calls``, as a replayed function called that many times on new inputs) and compares
    the values ``kept`` picks."""
    from ember.backends.fusion import autotune, executor, replay

    rng = np.random.default_rng(len(steps))
    host_weight = (rng.normal(size=(_COLS, _COLS)) / np.sqrt(_COLS)).astype(np.float32)
    host_bias = rng.normal(size=_COLS).astype(np.float32)
    inputs = [[rng.normal(size=(_ROWS, _COLS)).astype(np.float32) for _ in range(2)]
              for _ in range(max(1, calls))]  # fmt: skip
    results = {}
    for name, on in (("ndarray", ember.device("ndarray")),
                     ("fusion", ember.device("ndarray").fusion(runtime=runtime))):  # fmt: skip
        weight, bias = Tensor.from_data(host_weight, on), Tensor.from_data(host_bias, on)

        def graph(x: Tensor, y: Tensor, weight: Tensor = weight, bias: Tensor = bias) -> dict:
            return _graph_values(steps, kept, x, y, weight, bias)

        run = replay(graph) if calls and name == "fusion" else graph
        with pytest.MonkeyPatch.context() as patch, autotune.forcing(autotune.Choice("fused", 1)):
            patch.setattr(executor, "LONE_KERNEL_MIN", 1 << 10)
            patch.setattr(executor, "POOLED_COPY_MIN", 1 << 10)
            results[name] = []
            for x, y in inputs:
                held = run(Tensor.from_data(x, on), Tensor.from_data(y, on))
                order = sorted(held, reverse=reversed_reads)
                results[name].append({n: held[n].to_numpy() for n in order})
                del held
    for call, (got, wanted) in enumerate(zip(results["fusion"], results["ndarray"], strict=True)):
        for n, want in wanted.items():
            np.testing.assert_allclose(got[n], want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"value {n} of call {call} of {steps}")  # fmt: skip


def test_the_interpreter_writes_over_an_input_after_reading_every_result():
    """A block whose first output is written over its input while its second output is
    that input itself (a cast to its own dtype hands the operand back): the second output
    keeps the input's values."""
    from ember.backends.fusion.interpreter import InterpreterRuntime
    from ember.backends.fusion.ir import Block, Input, Instr
    from ember.tensor.dtype import DType

    f32 = DType.F32
    block = Block((4,), (Input((4,), f32),),
                  (Instr("mul_scalar", (0,), (2.0,), (4,), f32), Instr("cast", (0,), (f32,), (4,), f32)),
                  outputs=(1, 2))  # fmt: skip
    x = np.arange(4, dtype=np.float32)
    doubled, same = InterpreterRuntime().run(block, [x], [x, None])
    assert doubled is x
    np.testing.assert_array_equal(doubled, [0.0, 2.0, 4.0, 6.0])
    np.testing.assert_array_equal(same, [0.0, 1.0, 2.0, 3.0])


def test_a_transposed_input_of_a_block_is_read_right(device, pool):
    """A block reading a transposed view (a gradient through a transpose) gets it made
    contiguous tile by tile: its values are NdArray's."""
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(96, 160)).astype(np.float32), rng.normal(size=(160, 96)).astype(np.float32)
    ta = Tensor.from_data(a, device).transpose()  # [160, 96], a transposed view once made
    ta.device.sync()
    got = ((ta + Tensor.from_data(b, device)) * 2.0).to_numpy()
    np.testing.assert_allclose(got, (a.T + b) * 2.0, rtol=1e-6)


def test_a_block_of_inputs_permuted_alike_runs_in_their_memory_order(device, pool):
    """A product's rows in its operand's order ([seq, batch, d] over a [batch, seq, d]
    buffer) plus a bias: the block reads them where they lie and writes its result laid out
    the same way, a pooled buffer that goes back when dropped (no copy first)."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(8, 96, 64)).astype(np.float32)
    b = rng.normal(size=64).astype(np.float32)
    t = Tensor.from_data(x, device).permute([1, 0, 2])  # [96, 8, 64], a view once made
    bias = Tensor.from_data(b, device)
    t.device.sync()
    y = (t + bias) * 2.0
    np.testing.assert_array_equal(y.to_numpy(), (x.transpose(1, 0, 2) + b) * np.float32(2.0))
    made = y._prim.slot.prim
    assert made.transpose(1, 0, 2).flags.c_contiguous and not made.flags.c_contiguous
    del y, made
    assert pool.idle_bytes() >= x.nbytes  # back in the pool once dropped
    hits = pool.hits
    z = (t + bias) * 3.0
    np.testing.assert_array_equal(z.to_numpy(), (x.transpose(1, 0, 2) + b) * np.float32(3.0))
    assert pool.hits == hits + 1


@pytest.mark.parametrize("order", [(1, 0, 2), (2, 0, 1), None])
def test_the_pool_lends_arrays_laid_out_in_an_order(pool, order):
    array = pool.take((6, 40, 50), np.float32, order)
    assert array.shape == (6, 40, 50)
    assert (array if order is None else array.transpose(order)).flags.c_contiguous
    array[...] = 1.0  # writable, and each element its own
    assert array.sum() == array.size
    assert pool.release(array) and pool.idle_bytes() >= array.nbytes
