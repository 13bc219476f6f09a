"""Composites recorded from a template (``fusion/composites.py``): after the first call of a
signature, an activation composite pushes the records its decomposition made, without
running the decomposition; the records, their fusion and the values are the same."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ember
from ember import Tensor, activation
from ember.backends.fusion import composites, replay, reset_stats, stats
from ember.backends.fusion.stream import MAX_RECORDS, stream_for
from ember.tensor import module


@pytest.fixture(autouse=True)
def _fresh_templates():
    composites.clear()
    yield
    composites.clear()


def _device(small: int = 0) -> ember.Device:
    return ember.device("ndarray").fusion(runtime="interpreter", small=small)


def _array(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _pending_records(device: ember.Device) -> list:
    backend = device.backend
    return stream_for(backend.inner_device(device), backend.executor).records


CALLS = {
    "softmax": lambda x, a: activation.softmax(x, 1),
    "log_softmax": lambda x, a: activation.log_softmax(x, 0),
    "gelu": lambda x, a: activation.gelu(x),
    "gelu_tanh": lambda x, a: activation.gelu(x, approximate="tanh"),
    "silu": lambda x, a: activation.silu(x),
    "softplus": lambda x, a: activation.softplus(x, 2.0, 1.0),
    "elu": lambda x, a: activation.elu(x, 0.7),
    "glu": lambda x, a: activation.glu(x, 1),
    "prelu": lambda x, a: activation.prelu(x, a),
    "layer_norm": lambda x, a: module.layer_norm(x, a, a * 0.5),
    "layer_norm_no_affine": lambda x, a: module.layer_norm(x, epsilon=0.1),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_templated_composite_pushes_the_decompositions_records(name):
    device, plain = _device(), ember.device("ndarray")
    call = CALLS[name]
    x_host, a_host = _array(6, 8), _array(8, seed=1)
    x, a = Tensor.from_data(x_host, device), Tensor.from_data(a_host, device)
    expected = call(Tensor.from_data(x_host, plain), Tensor.from_data(a_host, plain)).to_numpy()

    reset_stats()
    first = call(x, a)
    decomposed = [(r.name, [s.shape for s in r.inputs], r.args[len(r.op.inputs):])
                  for r in _pending_records(device)]  # fmt: skip
    first_values = first.to_numpy()
    assert stats()["templated_composites"] == 0
    kernels_first = stats()["kernels"]

    reset_stats()
    second = call(x, a)
    templated = [(r.name, [s.shape for s in r.inputs], r.args[len(r.op.inputs):])
                 for r in _pending_records(device)]  # fmt: skip
    assert stats()["templated_composites"] == 1
    assert templated == decomposed and len(templated) > 1
    np.testing.assert_array_equal(second.to_numpy(), first_values)
    assert stats()["kernels"] == kernels_first
    np.testing.assert_allclose(first_values, expected, rtol=1e-5, atol=1e-6)


def test_another_shape_dtype_attribute_or_aliasing_is_another_signature():
    device = _device()
    x = Tensor.from_data(_array(4, 4), device)
    reset_stats()
    activation.softmax(x, 1).to_numpy()
    activation.softmax(x, 0).to_numpy()  # another dim
    activation.softmax(Tensor.from_data(_array(4, 5), device), 1).to_numpy()  # another shape
    activation.softmax(x.cast(ember.DType.F64), 1).to_numpy()  # another dtype
    assert stats()["templated_composites"] == 0
    # The same value as both operands is a signature of its own, whose records read it twice.
    backend, g = device.backend, Tensor.from_data(_array(4, 4, seed=2), device)

    def backward(a: Tensor, b: Tensor) -> np.ndarray:
        return Tensor.from_primitive(backend.leaky_relu_backward(a._prim, b._prim, 0.1), device).to_numpy()

    first = backward(x, g)
    both = backward(x, x)
    assert stats()["templated_composites"] == 0
    host, grad = _array(4, 4), _array(4, 4, seed=2)
    np.testing.assert_allclose(both, np.where(host > 0, host, host * np.float32(0.1)), rtol=1e-6)
    np.testing.assert_allclose(first, np.where(host > 0, grad, grad * np.float32(0.1)), rtol=1e-6)
    np.testing.assert_array_equal(backward(x, g), first)
    np.testing.assert_array_equal(backward(x, x), both)
    assert stats()["templated_composites"] == 2


def test_a_decomposition_that_runs_an_op_at_once_gets_no_template():
    # A per-channel slope is reshaped first: on a small made slope that runs at once, so the
    # product reads a value made outside the records; each call decomposes.
    device = _device(small=64)
    x = Tensor.from_data(_array(2, 3, 128), device)
    alpha = Tensor.from_data(np.array([0.1, 0.2, 0.3], np.float32), device)
    host = _array(2, 3, 128)
    expected = np.where(host < 0, host * np.array([0.1, 0.2, 0.3], np.float32)[:, None], host)
    reset_stats()
    for _ in range(3):
        np.testing.assert_allclose(activation.prelu(x * 1.0, alpha).to_numpy(), expected, rtol=1e-6)
    assert stats()["templated_composites"] == 0


def test_a_template_pushed_alone_finds_its_plan_without_a_key(monkeypatch):
    # A stream holding exactly one push of a template plans by the template's table (the
    # replayed records' path); pushed behind other records, it is planned by its key.
    from ember.backends.fusion.explorer import Explorer

    device, plain = _device(), ember.device("ndarray")
    host, weight, bias = _array(6, 8), _array(8, seed=1), _array(8, seed=2)
    x, a, b = (Tensor.from_data(v, device) for v in (host, weight, bias))

    def call(x, a):
        return module.layer_norm(x, a, b if x.device == device else Tensor.from_data(bias, plain))

    expected = call(Tensor.from_data(host, plain), Tensor.from_data(weight, plain)).to_numpy()
    keys = []
    real_key = Explorer.key
    monkeypatch.setattr(Explorer, "key", lambda self, records: keys.append(1) or real_key(self, records))
    for _ in range(2):  # the decomposition, then the template's first push: both keyed
        np.testing.assert_allclose(call(x, a).to_numpy(), expected, rtol=1e-5, atol=1e-6)
    keys.clear()
    reset_stats()
    for _ in range(3):
        np.testing.assert_allclose(call(x, a).to_numpy(), expected, rtol=1e-5, atol=1e-6)
    assert keys == [] and stats()["cache_hits"] == 3 and stats()["templated_composites"] == 3
    template = next(t for t in composites._templates.values() if type(t) is composites.Template)
    assert [len(plans) for plans in template.plans.values()] == [1]
    behind = x + 1.0
    np.testing.assert_allclose(call(behind, a).to_numpy(),
                               call(Tensor.from_data(host + 1, plain),
                                    Tensor.from_data(weight, plain)).to_numpy(),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert keys == [1]  # behind an add: planned by its key, the add fused in
    assert [len(plans) for plans in template.plans.values()] == [1]
    # Another fusion backend over the same inner device shares the template, not the plans.
    other = ember.device("ndarray").fusion(runtime="interpreter")
    assert other.backend is not device.backend
    xo, ao, bo = (Tensor.from_data(v, other) for v in (host, weight, bias))
    for _ in range(3):
        np.testing.assert_allclose(module.layer_norm(xo, ao, bo).to_numpy(), expected,
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
    assert [len(plans) for plans in template.plans.values()] == [1, 1]


def test_a_template_that_fills_the_stream_runs_it_once_every_record_is_in():
    device = _device()
    host = _array(3, 5)
    x = Tensor.from_data(host, device)
    activation.softmax(x, 1).to_numpy()  # the template
    expected = activation.softmax(Tensor.from_data(host, ember.device("ndarray")), 1).to_numpy()
    y = x
    for _ in range(MAX_RECORDS - 2):
        y = y + 0.0
    reset_stats()
    out = activation.softmax(y, 1)  # its records cross MAX_RECORDS
    assert stats()["templated_composites"] == 1 and stats()["flushes"] == 1
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-6)


def test_errors_still_raise_at_the_op():
    device = _device()
    x = Tensor.from_data(_array(3, 4), device)
    activation.softmax(x, 1).to_numpy()
    activation.softmax(x, 1).to_numpy()
    with pytest.raises(ember.ArgumentError, match="dim 2 is out of range"):
        activation.softmax(x, 2)
    with pytest.raises(ember.ShapeError, match="alpha of shape"):
        activation.prelu(x, Tensor.from_data(_array(5), device))


def test_a_traced_call_logs_the_primitives_and_replays():
    device = _device()
    fn = replay(lambda t: activation.softmax(t * 2.0, 1))
    host = _array(4, 6)
    expected = activation.softmax(Tensor.from_data(host * 2.0, ember.device("ndarray")), 1).to_numpy()
    reset_stats()
    for _ in range(4):
        np.testing.assert_allclose(fn(Tensor.from_data(host, device)).to_numpy(), expected, rtol=1e-6)
    # The first call decomposed (making the template), the second was traced (primitives,
    # not the template), the others replayed the trace.
    assert stats()["traces"] == 1 and stats()["replays"] >= 1
    assert stats()["templated_composites"] == 0


def test_threads_share_a_template_and_keep_their_own_streams():
    device = _device()
    hosts = [_array(16, 32, seed=i) for i in range(4)]
    plain = ember.device("ndarray")
    expected = [activation.gelu(Tensor.from_data(h, plain)).to_numpy() for h in hosts]
    activation.gelu(Tensor.from_data(hosts[0], device)).to_numpy()
    results: dict[int, list] = {}

    def work(i: int) -> None:
        results[i] = [activation.gelu(Tensor.from_data(hosts[i], device)).to_numpy() for _ in range(20)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        for got in results[i]:
            np.testing.assert_allclose(got, expected[i], rtol=1e-5, atol=1e-6)


def test_attributes_are_told_apart_by_type_and_sign():
    # 0.0 == -0.0 (and 1 == 1.0): a template of one must not record the other's products.
    device, plain = _device(), ember.device("ndarray")
    host = np.array([[-2.0, -0.5, 1.0, 3.0]], np.float32)
    x = Tensor.from_data(host, device)
    reset_stats()
    for slope in (0.0, -0.0, 0.0, -0.0):
        got = activation.leaky_relu(x, slope).to_numpy()
        want = activation.leaky_relu(Tensor.from_data(host, plain), slope).to_numpy()
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(got, want)
    assert stats()["templated_composites"] == 2  # each slope's second call
    for alpha in (1, 1.0, 1, 1.0):  # past the Tensor layer, which makes the slope a float
        got = Tensor.from_primitive(device.backend.elu(x._prim, alpha), device)
        assert got.dtype is ember.DType.F32
        np.testing.assert_allclose(got.to_numpy(), np.where(host > 0, host, np.expm1(host)), rtol=1e-6)
    assert stats()["templated_composites"] == 4
    # A NaN slope is a signature like any other (its bits), not a new one each call.
    for _ in range(2):
        nan = activation.leaky_relu(x, float("nan")).to_numpy()
        assert np.isnan(nan[0, :2]).all() and (nan[0, 2:] == host[0, 2:]).all()
    assert stats()["templated_composites"] == 5
