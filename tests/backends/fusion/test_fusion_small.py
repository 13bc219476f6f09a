"""Small values run at once (``EMBER_FUSION_SMALL``, ``Fusion(small=...)``): an op whose
operands are all made and small (or a convolution's or product's results) runs on the
inner backend when it is called, and computes exactly what the same op computes on the inner backend; anything
large or pending is still recorded and fused.

The rest of the suite records every op (``tests/conftest.py`` sets ``EMBER_FUSION_SMALL=0``);
these tests choose the limit per device."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import Tensor, activation
from ember.backend.errors import ArgumentError, ConfigError, ShapeError
from ember.backends.fusion import reset_stats, stats
from ember.backends.fusion.backend import SMALL_DEFAULT, small_limit
from ember.tensor import module

LIMIT = 16  # elements: the tests' "small"


def _fused(small: int = LIMIT, runtime: str = "interpreter") -> ember.Device:
    return ember.device("ndarray").fusion(runtime=runtime, small=small)


def _pending(t: Tensor) -> bool:
    return t._prim.slot.pending


def _array(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


# ---------------------------------------------------------------- the limit
def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("EMBER_FUSION_SMALL")
    assert small_limit() == SMALL_DEFAULT
    monkeypatch.setenv("EMBER_FUSION_SMALL", "  ")
    assert small_limit() == SMALL_DEFAULT
    monkeypatch.setenv("EMBER_FUSION_SMALL", "0")
    assert small_limit() == 0
    monkeypatch.setenv("EMBER_FUSION_SMALL", "4096")
    assert ember.device("ndarray").fusion(runtime="interpreter").backend.small == 4096


@pytest.mark.parametrize("text", ["-1", "1.5", "many", "1e9", "0x10"])
def test_a_bad_limit_in_the_environment_is_a_config_error(monkeypatch, text):
    monkeypatch.setenv("EMBER_FUSION_SMALL", text)
    with pytest.raises(ConfigError, match="EMBER_FUSION_SMALL"):
        ember.device("ndarray").fusion(runtime="interpreter")


@pytest.mark.parametrize("small", [-1, 2.5, True, "16"])
def test_a_bad_limit_argument_is_an_argument_error(small):
    with pytest.raises(ArgumentError, match="small="):
        ember.device("ndarray").fusion(runtime="interpreter", small=small)


# ---------------------------------------------------------------- what runs at once
def test_small_ops_on_made_values_run_at_once_and_equal_the_inner_ops():
    device, eager = _fused(), ember.device("ndarray")
    a, b = _array(3, 4), _array(1, 4, seed=1)
    reset_stats()
    y = (Tensor.from_data(a, device) * Tensor.from_data(b, device) + 1.0).exp()
    assert not _pending(y)
    counts = stats()
    assert counts["small_ops"] == 3 and counts["records"] == 0 and counts["kernels"] == 0
    expected = (Tensor.from_data(a, eager) * Tensor.from_data(b, eager) + 1.0).exp()
    np.testing.assert_array_equal(y.to_data().to_numpy(), expected.to_data().to_numpy())


def test_a_large_value_is_recorded_and_fused():
    device = _fused()
    x = Tensor.from_data(_array(4, 8), device)  # 32 elements > LIMIT
    reset_stats()
    y = (x * 2.0 + 1.0).tanh()
    assert _pending(y)
    np.testing.assert_allclose(y.to_data().to_numpy(), np.tanh(_array(4, 8) * 2 + 1), rtol=1e-6)
    counts = stats()
    assert counts["small_ops"] == 0 and counts["kernels"] == 1 and counts["fused_ops"] == 3


def test_a_small_result_of_a_pending_value_stays_in_the_stream():
    device = _fused()
    x = Tensor.from_data(_array(4, 8), device)
    reset_stats()
    rows = (x * 3.0).sum_dim(1)  # [4, 1]: small, but made from a pending value
    z = (rows + 1.0).abs()
    assert _pending(rows) and _pending(z)
    assert stats()["small_ops"] == 0
    np.testing.assert_allclose(
        z.to_data().to_numpy(), np.abs((_array(4, 8) * 3).sum(1, keepdims=True) + 1), rtol=1e-5
    )


def test_a_reduction_of_a_large_made_value_stays_in_the_stream():
    device = _fused()
    x = Tensor.from_data(_array(4, 8), device)
    reset_stats()
    centred = x - x.mean_dim(1)  # the mean is small, but fuses with what reads it
    assert _pending(centred) and stats()["small_ops"] == 0
    np.testing.assert_allclose(centred.to_data().to_numpy(),
                               _array(4, 8) - _array(4, 8).mean(1, keepdims=True), atol=1e-6)  # fmt: skip
    assert stats()["kernels"] == 1


def test_small_operands_run_at_once_whatever_their_result():
    device = _fused()
    col, row = Tensor.from_data(_array(8, 1), device), Tensor.from_data(_array(1, 8), device)
    big = Tensor.from_data(_array(4, 8), device)
    reset_stats()
    outer = col * row  # 64 elements from two of 8
    assert not _pending(outer) and stats()["small_ops"] == 1
    np.testing.assert_array_equal(outer.to_data().to_numpy(), _array(8, 1) * _array(1, 8))
    assert _pending(big * 2.0 + big)  # large operands, a large result: recorded


def test_a_product_with_a_small_result_runs_at_once_on_its_kernel():
    pytest.importorskip("numba")
    device = _fused(runtime="numba")  # products and convolutions have kernels (op_kernels)
    big = Tensor.from_data(_array(4, 8), device)
    reset_stats()
    rows = big.matmul(Tensor.from_data(_array(8, 2), device))  # [4, 2] from a large operand
    assert not _pending(rows) and stats()["small_ops"] == 1
    np.testing.assert_allclose(rows.to_data().to_numpy(), _array(4, 8) @ _array(8, 2), rtol=1e-6)
    assert _pending(big.matmul(Tensor.from_data(_array(8, 6), device)))  # a result of 24


def test_a_products_settled_choice_is_kept_per_layout_and_generation(monkeypatch):
    pytest.importorskip("numba")
    import dataclasses

    from ember.backends.fusion import autotune
    from ember.backends.fusion.op_kernels import NDARRAY_KERNELS

    kernel = NDARRAY_KERNELS["float_matmul"]
    asked = []
    counted = dataclasses.replace(kernel, supports=lambda args: asked.append(args) or kernel.supports(args))
    monkeypatch.setitem(NDARRAY_KERNELS, "float_matmul", counted)
    device = _fused(small=4096, runtime="numba")
    a, w = _array(64, 256), _array(256, 16, seed=1)  # work over the tuner's least
    ta, tw = Tensor.from_data(a, device), Tensor.from_data(w, device)
    w_t = np.ascontiguousarray(w.T)
    tw_t = Tensor.from_data(w_t, device).transpose()  # w, column-major
    reset_stats()
    with autotune.forcing(autotune.UNFUSED):
        for _ in range(3):  # the inner op: NumPy's product, to the bit
            np.testing.assert_array_equal(ta.matmul(tw).to_data().to_numpy(), a @ w)
        assert len(asked) == 1  # worked out once for these layouts
        np.testing.assert_array_equal(ta.matmul(tw_t).to_data().to_numpy(), a @ w_t.T)
        assert len(asked) == 2  # another layout: worked out again
    assert stats()["unfused_ops"] == 4 and stats()["op_kernels"] == 0
    with autotune.forcing(autotune.Choice("fused", 1)):  # a new generation: asked again
        for _ in range(2):
            out = ta.matmul(tw)
            assert out._prim.slot.recycle is device.backend.executor.recycler  # pooled memory
            np.testing.assert_allclose(out.to_data().to_numpy(), a.astype(np.float64) @ w,
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
    assert len(asked) == 3 and stats()["op_kernels"] == 2 and stats()["small_ops"] == 6


@pytest.mark.parametrize("forced", ["unfused", "fused"])
def test_a_convolution_and_a_pooling_at_once_run_as_settled(forced):
    pytest.importorskip("numba")
    from ember.backends.fusion import autotune

    device, eager = _fused(small=4096, runtime="numba"), ember.device("ndarray")
    x, w, b = _array(2, 4, 12, 12), _array(8, 4, 3, 3, seed=1), _array(8, seed=2)
    choice = autotune.UNFUSED if forced == "unfused" else autotune.Choice("fused", 1)
    results = []
    for d in (device, eager):
        with autotune.forcing(choice):
            outs = []
            for _ in range(2):  # the second call: the kept choice
                conv = module.conv2d(Tensor.from_data(x, d), Tensor.from_data(w, d),
                                     Tensor.from_data(b, d), padding=1)  # fmt: skip
                pooled, indices = module.max_pool2d_with_indices(conv, 2)
                outs.append([t.to_data().to_numpy() for t in (conv, pooled, indices)])
        results.append(outs)
    ran = device.backend.executor._settled
    assert sum(1 for key in ran if key[0] in ("conv2d", "max_pool2d_with_indices")) == 2
    for got in results[0]:
        for mine, want in zip(got, results[1][0], strict=True):
            np.testing.assert_allclose(mine, want, rtol=1e-5, atol=1e-5)


def test_a_small_creation_runs_at_once_a_large_one_is_recorded():
    device = _fused()
    assert not _pending(Tensor.zeros([2, 3], device))
    assert _pending(Tensor.ones([5, 5], device))


def test_random_draws_stay_in_the_stream_and_keep_the_inner_order():
    fused, eager = _fused(), ember.device("ndarray")
    draws = []
    for device in (fused, eager):
        device.seed(11)
        big = Tensor.random([6, 6], ember.Distribution.uniform(0, 1), device) * 2.0  # recorded
        small = Tensor.random([3], ember.Distribution.normal(0, 1), device)
        assert device is eager or _pending(small)  # a draw is recorded however small
        later = Tensor.random([2], ember.Distribution.uniform(0, 1), device) + small.sum()
        draws.append((big.tolist(), small.tolist(), later.tolist()))
    assert draws[0] == draws[1]


def test_optional_and_listed_operands_reach_the_inner_op_in_place():
    device, eager = _fused(small=1 << 12), ember.device("ndarray")
    x, w = _array(1, 2, 5, 5), _array(3, 2, 3, 3, seed=1)
    parts = [_array(2, 3), _array(1, 3, seed=2)]
    reset_stats()
    results = []
    wt = _array(2, 3, 3, 3, seed=3)
    for d in (device, eager):
        # conv2d has a kernel of its own (op_kernels); conv_transpose2d runs the inner op.
        conv = module.conv2d(Tensor.from_data(x, d), Tensor.from_data(w, d), None, padding=1)
        up = module.conv_transpose2d(Tensor.from_data(x, d), Tensor.from_data(wt, d), None)
        joined = Tensor.cat([Tensor.from_data(p, d) for p in parts], 0)
        results.append([t.to_data().to_numpy() for t in (conv, up, joined)])
    assert stats()["small_ops"] == 3 and stats()["records"] == 0
    for got, want in zip(results[0], results[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_activation_runs_as_the_inner_kernel_on_small_values_and_decomposes_on_large():
    reset_stats()
    small = activation.log_softmax(Tensor.from_data(_array(2, 5), _fused()), 1)
    assert not _pending(small) and stats()["small_ops"] == 1
    eager = activation.log_softmax(Tensor.from_data(_array(2, 5), ember.device("ndarray")), 1)
    np.testing.assert_array_equal(small.to_data().to_numpy(), eager.to_data().to_numpy())
    reset_stats()
    large = activation.log_softmax(Tensor.from_data(_array(4, 8), _fused()), 1)
    assert _pending(large)
    large.to_data()
    # Decomposed: every primitive (max, sub, exp, sum, log, ...) is recorded and fused.
    assert stats()["small_ops"] == 0 and stats()["records"] >= 5 and stats()["kernels"] >= 1


def test_an_error_raises_at_the_op_as_on_the_inner_backend():
    errors = []
    for device in (_fused(), ember.device("ndarray")):
        with pytest.raises(ShapeError) as error:
            Tensor.from_data(_array(3), device) + Tensor.from_data(_array(4), device)
        errors.append(str(error.value))
    assert errors[0] == errors[1]


def test_zero_records_every_op():
    device = _fused(small=0)
    reset_stats()
    y = Tensor.from_data(_array(2), device) * 2.0
    assert _pending(y) and stats()["small_ops"] == 0


def test_fusion_off_still_runs_everything_at_once():
    code = (
        "import ember\nfrom ember import Tensor\n"
        "from ember.backends.fusion import stats\n"
        "d = ember.device('ndarray').fusion(runtime='interpreter', small=1 << 20)\n"
        "y = Tensor.from_data([1.0, 2.0], d) * 3.0\n"
        "assert not y._prim.slot.pending and stats()['eager_ops'] >= 2, stats()\n"
        "assert stats()['small_ops'] == 0, stats()\n"
        "print(y.tolist())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "EMBER_FUSION": "0"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[3.0, 6.0]"


# ---------------------------------------------------------------- gradients
def _mlp_grads(device: ember.Device, create_graph: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    w1 = Tensor.from_data(rng.normal(size=(6, 5)).astype(np.float32), device).require_grad()
    w2 = Tensor.from_data(rng.normal(size=(5, 3)).astype(np.float32), device).require_grad()
    x = Tensor.from_data(rng.normal(size=(4, 6)).astype(np.float32), device)
    loss = activation.log_softmax(activation.tanh(x.matmul(w1)).matmul(w2), 1).mean()
    grads = loss.backward(create_graph=create_graph)
    g1, g2 = w1.grad(grads), w2.grad(grads)
    if not create_graph:
        return [g1.to_data().to_numpy(), g2.to_data().to_numpy()]
    second = ((g1 * g1).sum() + (g2 * g2).sum()).backward()  # a Hessian-vector product
    return [w1.grad(second).to_data().to_numpy(), w2.grad(second).to_data().to_numpy()]


@pytest.mark.parametrize("create_graph", [False, True])
def test_gradients_with_small_values_equal_the_inner_backends(create_graph):
    reset_stats()
    fused = _mlp_grads(_fused(small=1 << 10).autodiff(), create_graph)
    assert stats()["small_ops"] > 10
    expected = _mlp_grads(ember.device("ndarray").autodiff(), create_graph)
    for got, want in zip(fused, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- mixed graphs
STEPS = st.lists(
    st.tuples(st.sampled_from(["add", "mul", "exp", "sum", "scale", "max"]),
              st.integers(0, 20), st.integers(0, 20)),
    min_size=1, max_size=10,
)  # fmt: skip


def _mixed(device: ember.Device, steps) -> list[np.ndarray]:
    # Small and large inputs side by side: chains cross between running at once and
    # being recorded, whichever way the steps combine them.
    values = [Tensor.from_data(_array(*s, seed=i), device) for i, s in
              enumerate([(2, 3), (1, 3), (6, 3), (6, 1)])]  # fmt: skip
    for name, i, j in steps:
        values.append(_step(name, values[i % len(values)], values[j % len(values)]))
    return [v.to_data().to_numpy() for v in values[4:]]


def _step(name: str, a: Tensor, b: Tensor) -> Tensor:
    if name in ("add", "mul") and a.shape != b.shape:
        b = a.abs()
    if name == "add":
        return a + b
    if name == "mul":
        return a * b
    if name == "exp":
        return (a * 0.5).exp()
    if name == "sum":
        return a.sum_dim(-1)
    if name == "scale":
        return a * 1.5 - 0.25
    return a.max_pair(a.neg())


@settings(max_examples=60, deadline=None, derandomize=True)
@given(steps=STEPS)
def test_mixed_graphs_equal_the_inner_backend(steps):
    for got, want in zip(_mixed(_fused(), steps), _mixed(ember.device("ndarray"), steps),
                         strict=True):  # fmt: skip
        np.testing.assert_array_equal(got, want)
