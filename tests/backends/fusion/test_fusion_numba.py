"""Fusion with compiled kernels: the numba runtime under the decorator computes what the
unfused ops compute (within the stated tolerance of its f32 approximations), in fewer
kernels than ops, and a repeated step compiles nothing. Few distinct blocks, since each
compiles once (about a second)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor, activation, nn
from ember.backends.fusion import reset_stats, stats
from ember.backends.fusion.executor import runtime_named

numba_runtime = pytest.importorskip("ember.backends.fusion.numba_runtime")
if not numba_runtime.available():
    pytest.skip("numba is not installed (pip install 'ember[jit]')", allow_module_level=True)

RTOL, ATOL = 2e-6, 2e-6  # a few ulp of f32: the kernels' erf/exp/tanh approximations


@pytest.fixture
def pair():
    return ember.device("ndarray"), ember.device("ndarray").fusion(runtime="numba")


def _both(fn, array, pair):
    eager, fused = pair
    return [fn(Tensor.from_data(array, device)).to_data().to_numpy() for device in (eager, fused)]


def test_gelu_is_one_kernel_and_matches(pair):
    x = np.random.default_rng(0).normal(size=(64, 257)).astype(np.float32) * 4
    reset_stats()
    expected, got = _both(activation.gelu, x, pair)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    counts = stats()
    assert counts["kernels"] == 1 and counts["fused_ops"] >= 4


def test_a_scaled_product_keeps_its_values_whatever_the_scale(pair):
    # The kernel of a stream scaling by 0.5 applies the scale to x first (numba_source's
    # early_scalings); the same stream scaling by 0.3 must not be planned or compiled as it.
    _, fused = pair
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((40, 300)) * 100).astype(np.float32)
    y = rng.uniform(0, 50, (40, 300)).astype(np.float32)
    xt, yt = Tensor.from_data(x, fused), Tensor.from_data(y, fused)
    reset_stats()
    for scale in (0.5, 0.3, 0.25, 3.0, 0.5):
        got = ((xt * (yt.sqrt() + 1.0)) * scale).to_data().to_numpy()
        want = (x * (np.sqrt(y) + np.float32(1))) * np.float32(scale)
        np.testing.assert_array_equal(got, want, err_msg=f"scale {scale}")
    counts = stats()
    assert counts["kernels"] == 5 and counts["unfused_ops"] == 0


def test_an_erf_over_a_divisor_keeps_its_values_whatever_the_divisor(pair):
    # A kernel of erf(x / sqrt 2) computes it from x (numba_source._erf_of_scaled); the same
    # stream dividing by 1.5 must not be planned or compiled as it.
    import math

    _, fused = pair
    x = (np.random.default_rng(6).standard_normal((40, 300)) * 3).astype(np.float32)
    xt = Tensor.from_data(x, fused)
    reset_stats()
    for divisor in (math.sqrt(2.0), 1.5, 1.4142135, 3.0, math.sqrt(2.0)):
        got = (xt / divisor).erf().to_data().to_numpy()
        want = np.vectorize(math.erf)(x.astype(np.float64) / float(np.float32(divisor)))
        # 1.5 ulp, and half an ulp more from the quotient's rounding where it is computed
        np.testing.assert_allclose(got, want, rtol=2.5e-7, atol=1e-30, err_msg=f"{divisor}")
    counts = stats()
    assert counts["kernels"] == 5 and counts["unfused_ops"] == 0


def test_softmax_and_log_softmax_match(pair):
    x = np.random.default_rng(1).normal(size=(33, 130)).astype(np.float32) * 5
    x[0, 3], x[1, :] = np.inf, -np.inf
    for fn in (lambda t: activation.softmax(t, 1), lambda t: activation.log_softmax(t, 1)):
        expected, got = _both(fn, x, pair)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_layer_norm_module_matches(pair):
    eager, fused = pair
    x = np.random.default_rng(2).normal(size=(8, 16, 96)).astype(np.float32)
    norm = nn.LayerNormConfig(96).init(eager)
    expected = norm(Tensor.from_data(x, eager)).to_data().to_numpy()
    got = norm.to_device(fused)(Tensor.from_data(x, fused)).to_data().to_numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_int_and_bool_chains_are_exact(pair):
    x = np.arange(-50, 50, dtype=np.int64).reshape(10, 10)

    def chain(t):
        return ((t * 3 - 7).remainder(5) > 1).int() + t.abs()

    expected, got = _both(chain, x, pair)
    np.testing.assert_array_equal(got, expected)


def test_a_repeated_step_compiles_nothing(pair):
    _, fused = pair
    runtime = runtime_named("numba")

    def step(n):
        x = Tensor.from_data(np.linspace(-3, 3, n * 7, dtype=np.float32).reshape(n, 7), fused)
        return (activation.sigmoid(x) * x + 1.0).sum_dim(1).to_data().to_numpy()

    step(4)
    compiled = runtime.stats.compiled
    step(4)
    step(9)  # other sizes: the same kernel
    assert runtime.stats.compiled == compiled


def _train(seed: int, device: ember.Device, steps: int = 4) -> np.ndarray:
    """A few SGD steps of a GELU layer with a softmax loss on ``device``; blocks of 76,800
    elements, so each kernel runs in parts on the runtime's worker threads."""
    rng = np.random.default_rng(seed)
    x = Tensor.from_data(rng.normal(size=(256, 300)).astype(np.float32), device)
    w = Tensor.from_data(rng.normal(size=(300, 300)).astype(np.float32) * 0.05, device)
    for _ in range(steps):
        w = w.require_grad()
        loss = activation.log_softmax(activation.gelu(x.matmul(w)), 1).mean()
        grad = w.grad(loss.backward())
        w = Tensor.from_inner(w.inner() - grad * 0.5, device)
    return w.to_numpy()


def test_threads_training_at_once_match_one_after_another():
    import threading

    device = ember.device("ndarray").fusion(runtime="numba").autodiff()
    # The tuner picks a kernel per shape on first use (numba's matmul or NumPy's, which
    # round differently): pick them all first, so every run below computes the same way.
    _train(0, device)
    alone = [_train(seed, device) for seed in range(3)]
    together: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            together[seed] = _train(seed, device)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    for seed in range(3):
        np.testing.assert_array_equal(together[seed], alone[seed])
    unfused = _train(0, ember.device("ndarray").autodiff())
    np.testing.assert_allclose(alone[0], unfused, rtol=1e-4, atol=1e-5)
