"""Replayed calls (``ember.backends.fusion.replay``): the third call of a signature on
re-records the traced ops without running the function's Python, computes what a plain
call computes, and raises what it raises; a function that reads the values it computes, or
whose arguments the trace cannot key, runs plainly every time."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest
from fusion_devices import FUSION_DEVICES, fusion_device

import ember
from ember import Tensor
from ember.backends.fusion import autotune, replay, reset_stats, stats
from ember.backends.fusion.autotune import Choice
from ember.backends.fusion.replayed import MAX_TRACES
from ember.backends.fusion.stream import MAX_RECORDS


@pytest.fixture(params=FUSION_DEVICES)
def device(request) -> ember.Device:
    return fusion_device(request.param)


@pytest.fixture
def interp() -> ember.Device:
    return ember.device("ndarray").fusion(runtime="interpreter")


def _data(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Counted:
    """A function that counts how often its Python runs."""

    def __init__(self, fn) -> None:
        self.fn, self.runs = fn, 0

    def __call__(self, *args, **kwargs):
        self.runs += 1
        return self.fn(*args, **kwargs)


def _softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_the_third_call_replays_without_the_python_and_matches_numpy(device):
    w = _data((64, 32), 1)
    weight = Tensor.from_data(w, device)

    def f(x, scale):
        y = ember.activation.softmax((x @ weight) * scale, 1)
        return {"y": y, "lse": (y.sum_dim(1) + 1.0).log(), "n": x.shape[0]}

    counted = Counted(f)
    g = replay(counted)
    reset_stats()
    for call in range(5):
        x = _data((300, 64), 10 + call)
        out = g(Tensor.from_data(x, device), 0.5)
        y = _softmax64(x.astype(np.float64) @ w * 0.5, 1)
        np.testing.assert_allclose(out["y"].to_numpy(), y, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(out["lse"].to_numpy(), np.log(y.sum(1, keepdims=True) + 1),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        assert out["n"] == 300
    assert counted.runs == 2  # the warm-up and the trace
    assert stats()["traces"] == 1 and stats()["replays"] == 3


def test_a_new_signature_warms_up_and_traces_again(interp):
    counted = Counted(lambda x, k: (x * k).exp())
    g = replay(counted)
    for shape, k in [((4, 8), 2.0)] * 3 + [((5, 8), 2.0)] * 3 + [((4, 8), 3.0)] * 3:
        x = _data(shape)
        got = g(Tensor.from_data(x, interp), k).to_numpy()
        np.testing.assert_allclose(got, np.exp(x * k), rtol=1e-6)
    assert counted.runs == 6  # two calls per signature, each replayed once after
    # An int scalar and an equal float are different signatures (their ops differ).
    g(Tensor.from_data(_data((4, 8)), interp), 2)
    assert counted.runs == 7


def test_replayed_ops_stay_lazy_and_fuse_with_what_follows(interp):
    g = replay(lambda x: (x * 2.0).exp())
    x = Tensor.from_data(_data((64, 256)), interp)
    for _ in range(2):
        g(x).to_numpy()
    y = g(x)
    assert y._prim.slot.pending  # recorded, not run
    reset_stats()
    z = (y + 1.0).to_numpy()
    np.testing.assert_allclose(z, np.exp(_data((64, 256)) * 2) + 1, rtol=1e-6)
    assert stats()["kernels"] == 1 and stats()["fused_ops"] == 3


def test_inputs_constants_and_plain_values_are_returned_as_they_are(interp):
    c = Tensor.from_data(_data((3,), 2), interp)
    g = replay(lambda x: (x, c, x + c, None, "tag", [1.5, (x * 2.0,)]))
    for seed in range(4):
        x = Tensor.from_data(_data((3,), seed), interp)
        out = g(x)
        assert out[0] is x and out[1] is c and out[3] is None and out[4] == "tag"
        np.testing.assert_allclose(out[2].to_numpy(), _data((3,), seed) + _data((3,), 2))
        assert out[5][0] == 1.5
        np.testing.assert_allclose(out[5][1][0].to_numpy(), _data((3,), seed) * 2)


def test_a_captured_tensor_passed_as_the_argument_stays_a_constant(interp):
    w = Tensor.from_data(np.array([1.0, 2.0], np.float32), interp)
    g = replay(lambda x: x * 10.0 + w)
    g(w)
    g(w)  # traced with the captured tensor as its argument
    other = Tensor.from_data(np.array([5.0, 7.0], np.float32), interp)
    assert g(other).tolist() == [51.0, 72.0]  # not other * 10 + other


def test_the_same_tensor_twice_is_another_signature_than_two_tensors(interp):
    counted = Counted(lambda a, b: a - b)
    g = replay(counted)
    x = Tensor.from_data(np.array([3.0], np.float32), interp)
    y = Tensor.from_data(np.array([1.0], np.float32), interp)
    for _ in range(3):
        assert g(x, x).tolist() == [0.0]
    assert g(x, y).tolist() == [2.0] and g(y, x).tolist() == [-2.0]
    assert g(x, y).tolist() == [2.0] and g(y, x).tolist() == [-2.0]  # traced, replayed
    assert counted.runs == 4


def test_a_function_that_branches_on_its_values_runs_plainly(interp):
    def branchy(x):
        return x * 2.0 if x.sum().item() > 0 else x * 3.0

    counted = Counted(branchy)
    g = replay(counted)
    reset_stats()
    for sign in [1, 1, 1, -1, 1, -1]:
        x = np.array([sign * 1.0, sign * 2.0], np.float32)
        got = g(Tensor.from_data(x, interp)).tolist()
        assert got == (x * (2 if sign > 0 else 3)).tolist()
    assert counted.runs == 6 and stats()["replays"] == 0


@pytest.mark.parametrize("body", [
    lambda x: x.argwhere(),                       # its shape depends on the values
    lambda x: Tensor.from_data(x.to_numpy() + 1, x.device),  # reads them into Python
])  # fmt: skip
def test_value_dependent_functions_run_plainly(interp, body):
    counted = Counted(body)
    g = replay(counted)
    reset_stats()
    for values in ([1.0, 0.0, 2.0], [0.0, 0.0, 5.0], [3.0, 1.0, 0.0], [0.0, 0.0, 0.0]):
        x = Tensor.from_data(np.array(values, np.float32), interp)
        np.testing.assert_array_equal(g(x).to_numpy(), body(x).to_numpy())
    assert counted.runs == 4 and stats()["replays"] == 0


def test_seeding_inside_the_function_runs_it_plainly(interp):
    def noisy(x):
        ember.seed(interp, 7)
        return x + Tensor.random([3], ember.Distribution.uniform(0.0, 1.0), interp)

    counted = Counted(noisy)
    g = replay(counted)
    outs = [g(Tensor.zeros([3], interp)).tolist() for _ in range(4)]
    assert counted.runs == 4 and outs[0] == outs[3]


def test_random_ops_draw_anew_in_the_order_of_a_plain_call(interp):
    def noisy(x):
        return x + Tensor.random([4], ember.Distribution.normal(0.0, 1.0), interp)

    g = replay(noisy)
    x = Tensor.zeros([4], interp)
    g(x), g(x)
    ember.seed(interp, 3)
    replayed = [g(x).tolist() for _ in range(2)]
    ember.seed(interp, 3)
    plain = [noisy(x).tolist() for _ in range(2)]
    assert replayed == plain and replayed[0] != replayed[1]


def test_errors_raise_at_the_op_as_in_a_plain_call(interp):
    def pick(x, idx):
        return x.select(0, idx) * 2.0

    g = replay(pick)
    x = Tensor.from_data(_data((4, 3)), interp)
    good = Tensor.from_data(np.array([0, 3], np.int64), interp)
    for _ in range(3):
        np.testing.assert_allclose(g(x, good).to_numpy(), _data((4, 3))[[0, 3]] * 2)
    bad = Tensor.from_data(np.array([0, 9], np.int64), interp)
    with pytest.raises(Exception) as plain:
        pick(x, bad).to_numpy()
    with pytest.raises(type(plain.value)) as replayed:
        g(x, bad).to_numpy()
    assert str(replayed.value) == str(plain.value) and stats()["replays"] >= 2


@pytest.mark.parametrize("returns_first", [True, False])
def test_a_long_function_keeps_values_read_after_a_full_stream_runs(interp, returns_first):
    def long(x):
        first = x * 2.0
        y = first
        for _ in range(MAX_RECORDS + 40):  # fills the stream, which runs mid-call
            y = y * 0.5 + 1.0
        return (y + first, first) if returns_first else (y + first,)

    g = replay(long)
    reset_stats()
    for seed in range(4):
        data = _data((64, 256), seed)  # large: not run at once, recorded
        out = g(Tensor.from_data(data, interp))
        expect = data.astype(np.float64) * 2
        for _ in range(MAX_RECORDS + 40):
            expect = expect * 0.5 + 1.0
        np.testing.assert_allclose(out[0].to_numpy(), expect + data * 2, rtol=1e-5)
        if returns_first:
            np.testing.assert_allclose(out[1].to_numpy(), data * 2)
    # The replays push every record before their stream runs: one flush, so the last call
    # runs its launches directly.
    assert stats()["replays"] == 2 and stats()["direct_replays"] == 1


def test_a_replay_longer_than_it_may_hold_runs_its_stream_as_it_fills(interp, monkeypatch):
    """A trace of more than ``MAX_REPLAY_RECORDS`` records pushes them as ops pushed one by
    one are: the stream runs each ``MAX_RECORDS`` (no direct launches), and every call
    still computes the function."""
    from ember.backends.fusion import stream

    monkeypatch.setattr(stream, "MAX_REPLAY_RECORDS", 64)
    g = replay(lambda x: _halving(x, MAX_RECORDS))  # 2 * MAX_RECORDS records
    reset_stats()
    for seed in range(5):
        data = _data((64, 256), seed)
        np.testing.assert_allclose(g(Tensor.from_data(data, interp)).to_numpy(),
                                   _halving(data.astype(np.float64), MAX_RECORDS), rtol=1e-5)  # fmt: skip
    assert stats()["replays"] == 3 and stats()["direct_replays"] == 0
    assert stats()["flushes"] >= 5 * 2


def _halving(x, n: int):
    for _ in range(n):
        x = x * 0.5 + 1.0
    return x


@pytest.mark.parametrize("args, reason", [
    (lambda d: (Tensor.from_data([1.0], ember.device("ndarray")),), "not on a fusion device"),
    (lambda d: (Tensor.from_data([1.0], d), np.ones(2)), "not hashable"),
])  # fmt: skip
def test_arguments_a_trace_cannot_key_run_plainly(interp, args, reason, monkeypatch, capsys):
    monkeypatch.setenv("EMBER_FUSION_DEBUG", "1")
    counted = Counted(lambda *a: a[0])
    g = replay(counted)
    for _ in range(3):
        g(*args(interp))
    assert counted.runs == 3
    assert reason in capsys.readouterr().err


def test_outputs_other_than_tensors_and_plain_values_run_plainly(interp):
    class Box:
        def __init__(self, t):
            self.t = t

    counted = Counted(lambda x: Box(x + 1.0))
    g = replay(counted)
    for value in range(4):
        x = Tensor.from_data(np.array([float(value)], np.float32), interp)
        assert g(x).t.tolist() == [value + 1.0]
    assert counted.runs == 4


def test_ops_of_another_fusion_backend_run_plainly(interp):
    other = ember.device("ndarray").fusion(runtime="interpreter")
    counted = Counted(lambda x: Tensor.from_data([2.0], other) * 3.0 + x.sum().to_device(other))
    g = replay(counted)
    for value in range(4):
        x = Tensor.from_data([float(value)], interp)
        assert g(x).tolist() == [6.0 + value]
    assert counted.runs == 4


def test_replay_off_through_the_environment(interp, monkeypatch):
    monkeypatch.setenv("EMBER_FUSION_REPLAY", "0")
    counted = Counted(lambda x: x + 1.0)
    g = replay(counted)
    for _ in range(3):
        g(Tensor.zeros([2], interp))
    assert counted.runs == 3


def test_nested_replays_trace_into_the_outer_one(interp):
    inner = Counted(lambda x: x * 2.0)
    g = replay(inner)
    outer = Counted(lambda x: g(x) + 1.0)
    h = replay(outer)
    for value in range(5):
        assert h(Tensor.from_data([float(value)], interp)).tolist() == [2.0 * value + 1.0]
    assert outer.runs == 2 and inner.runs == 2


def test_signatures_are_bounded(interp):
    g = replay(lambda x: x + 1.0)
    for n in range(1, MAX_TRACES + 6):
        for _ in range(3):
            assert g(Tensor.zeros([n], interp)).tolist() == [1.0] * n
    assert len(g._traces) == MAX_TRACES


def test_threads_replay_one_function_side_by_side(device):
    w = _data((32, 32), 5)
    weight = Tensor.from_data(w, device)
    g = replay(lambda x: ember.activation.gelu(x @ weight).sum_dim(1))
    g(Tensor.from_data(_data((64, 32)), device)), g(Tensor.from_data(_data((64, 32)), device))
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for i in range(20):
                x = _data((64, 32), seed * 100 + i)
                got = g(Tensor.from_data(x, device)).to_numpy()
                plain = ember.activation.gelu(Tensor.from_data(x, device) @ weight).sum_dim(1)
                np.testing.assert_allclose(got, plain.to_numpy(), rtol=1e-4, atol=1e-5)
        except BaseException as error:  # re-raised below, on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    reset_stats()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert stats()["direct_replays"] > 0  # threads launching one program side by side


def test_a_module_forward_replays(device):
    from ember import nn

    model = nn.LinearConfig(16, 8).init(device)
    norm = nn.LayerNormConfig(8).init(device)
    g = replay(lambda x: ember.activation.gelu(norm(model(x))))
    for seed in range(4):
        x = Tensor.from_data(_data((4, 10, 16), seed), device)
        plain = ember.activation.gelu(norm(model(x))).to_numpy()
        np.testing.assert_allclose(g(x).to_numpy(), plain, rtol=1e-5, atol=1e-6)
    assert stats()["replays"] >= 2


@pytest.fixture
def ad_interp() -> ember.Device:
    return ember.device("ndarray").fusion(runtime="interpreter").autodiff()


def _penalty_step(x, w, b):
    """A gradient penalty's weight gradients (a second-order step), and its loss detached."""
    x = x.require_grad()
    score = ember.activation.gelu(x @ w + b).sum()
    slope = x.grad(score.backward(create_graph=True, inputs=[x]))
    loss = score + (slope * slope).sum()
    grads = loss.backward(inputs=[w, b])
    return w.grad(grads), b.grad(grads), loss.detach()


def test_an_autodiff_step_replays_and_matches_torch(ad_interp):
    torch = pytest.importorskip("torch")
    g = replay(_penalty_step)
    wd, bd = _data((6, 4), 1), _data((4,), 2)
    w = Tensor.from_data(wd, ad_interp).require_grad()
    b = Tensor.from_data(bd, ad_interp).require_grad()
    reset_stats()
    for seed in range(4):
        xd = _data((5, 6), 10 + seed)
        gw, gb, loss = g(Tensor.from_data(xd, ad_interp), w, b)
        tx = torch.tensor(xd, dtype=torch.float64, requires_grad=True)
        tw = torch.tensor(wd, dtype=torch.float64, requires_grad=True)
        tb = torch.tensor(bd, dtype=torch.float64, requires_grad=True)
        score = torch.nn.functional.gelu(tx @ tw + tb).sum()
        (slope,) = torch.autograd.grad(score, tx, create_graph=True)
        tloss = score + (slope * slope).sum()
        twg, tbg = torch.autograd.grad(tloss, (tw, tb))
        np.testing.assert_allclose(gw.to_numpy(), twg.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gb.to_numpy(), tbg.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(loss.to_numpy(), tloss.detach().numpy(), rtol=1e-5)
        assert not loss.is_require_grad()
    assert stats()["traces"] == 1 and stats()["replays"] == 2


def test_a_tracked_output_or_a_graph_tensor_argument_runs_plainly(ad_interp):
    w = Tensor.from_data(_data((3,)), ad_interp).require_grad()
    tracked = Counted(lambda x: x * w)  # its output belongs to a graph a replay cannot rebuild
    g = replay(tracked)
    for _ in range(4):
        out = g(Tensor.from_data(_data((3,), 1), ad_interp))
        assert out.is_require_grad()
        np.testing.assert_allclose(w.grad(out.sum().backward()).to_numpy(), _data((3,), 1))
    assert tracked.runs == 4
    middle = Counted(lambda x: x + 1.0)
    h = replay(middle)
    for _ in range(3):
        h(w * 2.0)  # not a leaf: part of the caller's graph
    assert middle.runs == 3


def test_a_gradient_listener_runs_autodiff_steps_plainly(ad_interp):
    from ember.backends.autodiff import listener

    class Hears:
        def __init__(self) -> None:
            self.heard = 0

        def __call__(self, *args, **kwargs):
            self.heard += 1

        def __getattr__(self, name):
            return self

    counted = Counted(lambda x, w: w.grad((x * w).sum().backward()))
    g = replay(counted)
    w = Tensor.from_data(_data((3,)), ad_interp).require_grad()
    hears = Hears()
    with listener.listening(hears):
        for _ in range(3):
            g(Tensor.from_data(_data((3,), 1), ad_interp), w)
    assert counted.runs == 3 and hears.heard >= 3  # every step's backward was heard


def test_pending_inputs_keyword_arguments_and_outputs_read_one_by_one(device):
    def f(x, *, scale):
        y = (x * scale).exp()
        return y.sum_dim(1), y * 0.5

    g = replay(f)
    reset_stats()
    for seed in range(4):
        data = _data((64, 256), seed)
        x = Tensor.from_data(data, device) + 1.0  # pending when the call starts
        assert x._prim.slot.pending
        total, half = g(x, scale=0.25)
        expect = np.exp((data.astype(np.float64) + 1.0) * 0.25)
        np.testing.assert_allclose(half.to_numpy(), expect * 0.5, rtol=1e-5)  # read first
        np.testing.assert_allclose(total.to_numpy(), expect.sum(1, keepdims=True), rtol=1e-5)
    assert stats()["replays"] == 2
    assert g(x, scale=0.5) is not None and stats()["replays"] == 2  # a new signature


def test_replaying_something_that_is_not_callable_is_an_argument_error():
    from ember.backend.errors import ArgumentError

    with pytest.raises(ArgumentError, match="got int"):
        replay(3)


def test_in_place_state_changes_run_the_call_plainly(ad_interp, monkeypatch, capsys):
    """A batch norm in training refreshes its running statistics, an optimizer its state:
    Python a replay would skip, so such a call never replays."""
    from ember import nn
    from ember.optim import SgdConfig

    monkeypatch.setenv("EMBER_FUSION_DEBUG", "1")
    norm = nn.BatchNormConfig(3).init(ad_interp)
    counted = Counted(lambda x: norm(x).detach())
    g = replay(counted)
    for seed in range(4):
        g(Tensor.from_data(_data((4, 3, 5), seed) * 3.0 + 2.0, ad_interp))
    assert counted.runs == 4
    mean = norm.running_mean.val().to_numpy()
    expect = np.zeros(3)
    for seed in range(4):
        batch = (_data((4, 3, 5), seed) * 3.0 + 2.0).astype(np.float64)
        expect = expect * 0.9 + batch.mean(axis=(0, 2)) * 0.1
    np.testing.assert_allclose(mean, expect, rtol=1e-5)  # every call refreshed them
    assert "running state" in capsys.readouterr().err

    w = Tensor.from_data(_data((3,)), ad_interp).require_grad()

    class Scale(ember.Module):
        w: ember.Param

    model = Scale(ember.Param(w))
    optim = SgdConfig().init()
    stepped = Counted(lambda x: optim.step(0.1, model, (model.w.val() * x).sum().backward()))
    h = replay(stepped)
    for _ in range(3):
        h(Tensor.from_data(_data((3,), 1), ad_interp))
    assert stepped.runs == 3 and "optimizer" in capsys.readouterr().err


def test_a_training_loop_with_the_model_as_an_argument_replays_each_new_model(ad_interp):
    """The weights change every step (a new module each time): passed as an argument, the
    module's parameters are inputs of the trace, so replays use this step's weights."""
    from ember import nn

    def grads_of(model, x, y):
        loss = ((model(x) - y) * (model(x) - y)).mean()
        grads = loss.backward()
        return {path: p.val().grad(grads) for path, p in model.params()}, loss.detach()

    def train(step, model):
        x = Tensor.from_data(_data((8, 4), 1), ad_interp)
        y = Tensor.from_data(_data((8, 2), 2), ad_interp)
        losses = []
        for _ in range(6):
            grads, loss = step(model, x, y)
            losses.append(loss.to_numpy().item())
            model = model.map(lambda path, p, grads=grads: Tensor.from_inner(
                p.val().inner() - grads[path] * 0.2, ad_interp))
        return losses, model

    ember.seed(ad_interp, 0)
    start = nn.LinearConfig(4, 2).init(ad_interp)
    g = replay(grads_of)
    reset_stats()
    replayed, end = train(g, start)
    plain, end_plain = train(grads_of, start)
    assert stats()["replays"] == 4
    np.testing.assert_allclose(replayed, plain, rtol=1e-5)
    assert replayed[-1] < replayed[0]
    np.testing.assert_allclose(end.weight.val().to_numpy(), end_plain.weight.val().to_numpy(),
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_a_module_argument_keys_the_trace_by_its_configuration(interp):
    from ember import nn

    counted = Counted(lambda model, x: model(x))
    g = replay(counted)
    x = Tensor.from_data(_data((2, 4)), interp)
    relu = nn.LinearConfig(4, 3).init(interp)
    no_bias = nn.LinearConfig(4, 3, bias=False).init(interp)
    for model in [relu, relu, relu, no_bias, no_bias, no_bias]:
        np.testing.assert_allclose(g(model, x).to_numpy(), model(x).to_numpy(), rtol=1e-6)
    assert counted.runs == 4  # two calls a configuration, the third replayed


def test_a_module_argument_keys_the_trace_by_its_tuples_of_ints(interp):
    """A stride or a padding (a tuple of ints, taken as it is) is part of the signature:
    convolutions alike but for one run their own traces."""
    from ember import nn

    counted = Counted(lambda model, x: model(x))
    g = replay(counted)
    x = Tensor.from_data(_data((2, 3, 8, 8)), interp)
    one = nn.Conv2dConfig((3, 4), (3, 3)).init(interp)
    two = nn.Conv2dConfig((3, 4), (3, 3), stride=(2, 2)).init(interp)  # weights of one shape
    for model in [one, one, one, two, two, two, one]:
        np.testing.assert_allclose(g(model, x).to_numpy(), model(x).to_numpy(), rtol=1e-6)
    assert counted.runs == 4  # two calls a stride, the third (and the last) replayed


def test_a_replayed_gather_checks_each_calls_indices(device):
    """A cross-entropy's gather by labels is recorded in the trace (its labels fitted when
    traced); a later call whose labels do not fit raises what a plain call raises (the
    replayed op runs at once and fails, and the plain call words the error), and the calls
    after it replay as before."""
    from ember.backend.errors import EmberIndexError

    def loss(logits, labels):
        picked = ember.activation.log_softmax(logits * 1.0, 1).gather(1, labels.reshape([-1, 1]))
        return -picked.mean()

    replayed = Counted(loss)
    run = replay(replayed)
    logits = Tensor.from_data(_data((6, 5)), device)
    rng = np.random.default_rng(4)

    def want(labels):
        x = _data((6, 5)).astype(np.float64)
        log = x - x.max(1, keepdims=True)
        log -= np.log(np.exp(log).sum(1, keepdims=True))
        return -log[np.arange(6), labels].mean()

    for _ in range(4):
        labels = rng.integers(0, 5, 6)
        got = run(logits, Tensor.from_data(labels, device)).to_numpy()
        np.testing.assert_allclose(got, want(labels), rtol=1e-5)
    assert replayed.runs == 2  # the warm-up and the traced call; the others replayed
    bad = np.array([0, 1, 2, 3, 4, 5])
    with pytest.raises(EmberIndexError) as replayed_error:
        run(logits, Tensor.from_data(bad, device))
    with pytest.raises(EmberIndexError) as plain_error:
        loss(logits, Tensor.from_data(bad, device))
    assert str(replayed_error.value) == str(plain_error.value)
    assert replayed.runs == 3  # the replay raised, so the plain call ran to word the error
    labels = rng.integers(0, 5, 6)
    np.testing.assert_allclose(run(logits, Tensor.from_data(labels, device)).to_numpy(),
                               want(labels), rtol=1e-5)  # fmt: skip
    assert replayed.runs == 3



class KeyCount:
    """Counts the plan keys the executor computes (``explorer.relativize`` calls)."""

    def __init__(self, monkeypatch) -> None:
        from ember.backends.fusion import explorer

        self.calls, original = 0, explorer.relativize

        def counted(records):
            self.calls += 1
            return original(records)

        monkeypatch.setattr(explorer, "relativize", counted)


def _chain(x):
    shifted = x - x.max_dim(1)
    return shifted.exp() / shifted.exp().sum_dim(1), (shifted * 0.5).tanh()


def _chain64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    shifted = x - x.max(1, keepdims=True)
    return np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True), np.tanh(shifted * 0.5)


def test_a_replays_flush_keeps_its_plan_without_computing_the_key(device, monkeypatch):
    g = replay(_chain)
    keys = KeyCount(monkeypatch)
    reset_stats()
    for call in range(6):
        x = _data((96, 200), call)
        y, z = g(Tensor.from_data(x, device))
        want_y, want_z = _chain64(x)
        np.testing.assert_allclose(y.to_numpy(), want_y, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(z.to_numpy(), want_z, rtol=1e-5, atol=1e-6)
        if call == 2:
            first_replay = keys.calls
    # The warm-up and the trace flush plainly, as does the first replay (its plan found by
    # key); the three replays after it bind their trace's plan without a key.
    assert keys.calls == first_replay
    assert stats()["replays"] == 4 and stats()["explorations"] <= 2


def test_a_dropped_output_is_another_plan_of_the_same_trace(interp, monkeypatch):
    g = replay(_chain)
    for call in range(3):
        g(Tensor.from_data(_data((96, 200), call), interp))[0].to_numpy()
    keys = KeyCount(monkeypatch)
    for call in range(6):
        x = _data((96, 200), 10 + call)
        want_y, want_z = _chain64(x)
        if call % 2:  # the tanh output dropped before the flush: not written out
            y = g(Tensor.from_data(x, interp))[0]
            np.testing.assert_allclose(y.to_numpy(), want_y, rtol=1e-5, atol=1e-7)
        else:
            y, z = g(Tensor.from_data(x, interp))
            np.testing.assert_allclose(z.to_numpy(), want_z, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(y.to_numpy(), want_y, rtol=1e-5, atol=1e-7)
    assert keys.calls == 1  # the first call of the variant with both outputs held


def test_records_pushed_after_a_replay_are_planned_with_it(interp, monkeypatch):
    g = replay(_chain)
    for call in range(4):
        g(Tensor.from_data(_data((96, 200), call), interp))[0].to_numpy()
    keys = KeyCount(monkeypatch)
    reset_stats()
    for call in range(3):
        x = _data((96, 200), 20 + call)
        y = g(Tensor.from_data(x, interp))[0] * 2.0
        np.testing.assert_allclose(y.to_numpy(), _chain64(x)[0] * 2, rtol=1e-5, atol=1e-7)
    assert keys.calls == 3  # a stream longer than the replay's records: keyed each time
    assert stats()["kernels"] <= 6  # the doubling fused into the softmax's block


def test_cleared_plans_are_explored_again_by_a_replay(interp, monkeypatch):
    from ember.backends.fusion.explorer import clear_plans

    monkeypatch.setenv("EMBER_FUSION_PLANS", "0")
    g = replay(_chain)
    for call in range(4):
        g(Tensor.from_data(_data((96, 200), call), interp))[0].to_numpy()
    clear_plans(on_disk=False)
    reset_stats()
    x = _data((96, 200), 30)
    np.testing.assert_allclose(g(Tensor.from_data(x, interp))[0].to_numpy(), _chain64(x)[0],
                               rtol=1e-5, atol=1e-7)  # fmt: skip
    assert stats()["explorations"] >= 1


def _norm(x):
    centered = x - x.mean_dim(1)
    var = (centered * centered).mean_dim(1)
    return centered * (var + 1e-5).rsqrt(), var


def _norm64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    centered = x - x.mean(1, keepdims=True)
    var = (centered * centered).mean(1, keepdims=True)
    return centered / np.sqrt(var + 1e-5), var


def test_an_element_wise_replay_runs_its_blocks_without_records(device, monkeypatch):
    g = replay(_norm)
    keys = KeyCount(monkeypatch)
    for call in range(7):
        reset_stats()
        x = _data((64, 300), 40 + call)
        y, var = g(Tensor.from_data(x, device))
        want_y, want_var = _norm64(x)
        np.testing.assert_allclose(y.to_numpy(), want_y, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(var.to_numpy(), want_var, rtol=1e-5, atol=1e-7)
        counts = stats()
        # The warm-up, the trace and the first replay run records; that replay's flush
        # shows the plan, and later calls launch its blocks alone.
        assert counts["direct_replays"] == (call >= 3), (call, counts)
        if call >= 3:
            assert counts["records"] == 0 and counts["flushes"] == 0 and counts["kernels"] >= 1
    assert keys.calls <= 3  # none for a call without records


def test_a_direct_replay_gives_back_its_intermediates_and_returns_made_tensors(monkeypatch):
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion.executor import runtime_named

    device = ember.device("ndarray").fusion(runtime="numba")

    def two_blocks(x):
        # A reduction along each axis: two blocks, the first one's output read by the second
        # (a sum over dim 0 would be the first block's total).
        rows = (x - x.max_dim(1)).exp()
        return rows / rows.max_dim(0)

    g = replay(two_blocks)
    pool = runtime_named("numba").pool
    for call in range(12):
        x = _data((128, 256), 60 + call)
        reset_stats()
        y = g(Tensor.from_data(x, device))
        assert y._prim.slot.pending == (call < 3)  # a direct replay's are made at the call
        rows = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
        np.testing.assert_allclose(y.to_numpy(), rows / rows.max(0, keepdims=True), rtol=1e-5)
        if call == 5:
            misses = pool.misses
        del y
    assert stats()["direct_replays"] == 1 and stats()["kernels"] == 2
    assert pool.misses == misses  # every buffer of the later calls came back to the pool


def test_a_pending_input_or_an_unfused_choice_runs_the_records(monkeypatch):
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion import autotune

    device = ember.device("ndarray").fusion(runtime="numba")
    g = replay(_norm)
    shape = (256, 300)  # large enough for the tuner to decide how its blocks run
    for call in range(4):
        y, _held = g(Tensor.from_data(_data(shape, call), device))  # both held, as when traced
        y.to_numpy()
    x = _data(shape, 70)
    pending = Tensor.from_data(x, device) * 1.0  # lazy: made by the stream's records
    assert pending._prim.slot.pending
    reset_stats()
    y, _held = g(pending)
    np.testing.assert_allclose(y.to_numpy(), _norm64(x)[0], rtol=1e-4, atol=1e-5)
    assert stats()["direct_replays"] == 0 and stats()["replays"] == 1
    with autotune.forcing(autotune.UNFUSED):  # the tuner's choice: NdArray's ops, one by one
        reset_stats()
        y, _held = g(Tensor.from_data(x, device))
        got = y.to_numpy()
        assert stats()["direct_replays"] == 0 and stats()["unfused_ops"] > 0
    np.testing.assert_allclose(got, _norm64(x)[0], rtol=1e-4, atol=1e-5)
    reset_stats()
    y, _held = g(Tensor.from_data(x, device))
    assert stats()["direct_replays"] == 1
    np.testing.assert_allclose(y.to_numpy(), _norm64(x)[0], rtol=1e-4, atol=1e-5)


def test_a_direct_replay_looks_its_blocks_up_once_while_the_tuners_choices_hold(monkeypatch):
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion import autotune

    device = ember.device("ndarray").fusion(runtime="numba")
    tuner = device.backend.executor.tuner
    assert tuner is not None
    g = replay(_norm)
    shape = (256, 300)  # large enough for the tuner to decide how its blocks run
    for call in range(5):
        y, _held = g(Tensor.from_data(_data(shape, call), device))  # both held, as when traced
        y.to_numpy()
    lookups = []
    lookup = autotune.Tuner.lookup
    monkeypatch.setattr(autotune.Tuner, "lookup", lambda self, block: (lookups.append(block),
                                                                       lookup(self, block))[1])  # fmt: skip

    def call() -> None:
        x = _data(shape, 80 + len(lookups))
        reset_stats()
        y, _held = g(Tensor.from_data(x, device))
        np.testing.assert_allclose(y.to_numpy(), _norm64(x)[0], rtol=1e-4, atol=1e-5)
        assert stats()["direct_replays"] == 1 and stats()["replays"] == 1

    for _ in range(2):
        call()
    assert lookups == []
    with autotune.forcing(autotune.Choice("fused", 1)):  # another choice: looked up again
        call()
        blocks = len(lookups)
        assert blocks >= 1
        call()
        assert len(lookups) == blocks  # once
    call()
    assert len(lookups) == 2 * blocks
    tuner.forget()  # a new generation: looked up again (pending: the records run, tuning)
    for _ in range(3):
        y, _held = g(Tensor.from_data(_data(shape, 90), device))
        y.to_numpy()
    assert len(lookups) > 2 * blocks
    seen = len(lookups)
    call()
    assert len(lookups) == seen


def test_a_replay_with_a_product_runs_it_as_a_single_op(interp):
    w = Tensor.from_data(_data((32, 16), 3), interp)
    g = replay(lambda x: ((x @ w) * 2.0).exp())
    for call in range(6):
        x = _data((8, 32), 80 + call)
        reset_stats()
        got = g(Tensor.from_data(x, interp)).to_numpy()
        np.testing.assert_allclose(got, np.exp(x.astype(np.float64) @ _data((32, 16), 3) * 2),
                                   rtol=1e-5)  # fmt: skip
        assert stats()["direct_replays"] == (call >= 3)


def test_a_direct_replay_runs_its_products_on_the_arrays_for_any_operand_layout(monkeypatch):
    """A direct replay launches a product (and a product with its bias) on the GEMM at the
    tuner's choice, without a record or the executor's single-op path; an operand laid out
    otherwise in a later call (a transposed view of the same shape) takes the kernel's key
    for that layout, and computes the same."""
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion import autotune
    from ember.backends.fusion.executor import Executor

    device = ember.device("ndarray").fusion(runtime="numba")
    w1, w2, b = _data((64, 48), 1), _data((48, 40), 2), _data((40,), 3)
    t1, t2, tb = (Tensor.from_data(a, device) for a in (w1, w2, b))
    g = replay(lambda x: ((x @ t1).tanh() @ t2 + tb).exp())
    singles = []
    run_single = Executor.run_single
    monkeypatch.setattr(Executor, "run_single",
                        lambda self, record, *a: (singles.append(record.name),
                                                  run_single(self, record, *a)))  # fmt: skip
    with autotune.forcing(autotune.Choice("fused", 2)):
        for call in range(8):
            x = _data((96, 64), 90 + call)
            if call >= 6:
                x = np.ascontiguousarray(x.T).T  # the same values, column-major
            singles.clear()
            reset_stats()
            got = g(Tensor.from_data(x, device)).to_numpy()
            want = np.exp(np.tanh(x.astype(np.float64) @ w1) @ w2 + b)
            np.testing.assert_allclose(got, want, rtol=1e-4)
            counts = stats()
            assert counts["direct_replays"] == (call >= 3), counts
            if call >= 3:
                assert "float_matmul" not in singles and counts["op_kernels"] == 2, (singles, counts)


def test_a_direct_replay_whose_product_choice_is_pending_again_runs_the_records(monkeypatch):
    """A tuner choice timed again later (a provisional one expired) is pending in the middle
    of a direct replay: the records run that call (and time it), computing the same; the
    program was not left with a value no step made."""
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion import autotune, direct

    device = ember.device("ndarray").fusion(runtime="numba")
    w1, w2 = _data((64, 48), 1), _data((48, 40), 2)
    t1, t2 = (Tensor.from_data(a, device) for a in (w1, w2))
    g = replay(lambda x: (x @ t1).tanh() @ t2)
    settled = direct._settled
    with autotune.forcing(autotune.Choice("fused", 2)):
        for call in range(6):
            if call == 4:
                monkeypatch.setattr(direct, "_settled",
                                    lambda *a: autotune.Pending(("again",), "again", 1))
            if call == 5:
                monkeypatch.setattr(direct, "_settled", settled)
            x = _data((96, 64), 40 + call)
            reset_stats()
            got = g(Tensor.from_data(x, device)).to_numpy()
            np.testing.assert_allclose(got, np.tanh(x.astype(np.float64) @ w1) @ w2, rtol=1e-4,
                                       atol=1e-4)
            counts = stats()
            assert counts["direct_replays"] == (call in (3, 5)), (call, counts)
            assert counts["replays"] == (call >= 2), (call, counts)  # not a plain call


def test_a_direct_replay_runs_every_op_with_a_compiled_kernel_on_the_arrays(monkeypatch):
    """Pooling (with its indices: two outputs) and a convolution's gradients take the same
    path as products in a direct replay of a training step: their kernels at the tuner's
    choice, no record; the gradients equal NdArray's."""
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion import autotune
    from ember.backends.fusion.executor import Executor
    from ember.tensor import module as F

    rng = np.random.default_rng(21)
    # Large enough for the tuner to time each op (a smaller one runs on NdArray).
    w_host = (rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float32)
    fc_host = (rng.standard_normal((16 * 16 * 16, 10)) * 0.05).astype(np.float32)
    x_host = rng.standard_normal((8, 3, 32, 32)).astype(np.float32)

    singles: list[str] = []  # the single records the last call ran

    def step(device, replayed: bool) -> list:
        w = Tensor.from_data(w_host, device).require_grad()
        fc = Tensor.from_data(fc_host, device).require_grad()

        def body(x):
            h = ember.activation.relu(F.conv2d(x, w, None, padding=1))
            h = F.max_pool2d(h, [2, 2], [2, 2]) + F.avg_pool2d(h, [2, 2], [2, 2])
            grads = (h.reshape([x.shape[0], 16 * 16 * 16]) @ fc).sum().backward()
            return [w.grad(grads), fc.grad(grads), x.grad(grads)]

        run = replay(body) if replayed else body
        for _ in range(5):
            reset_stats()
            singles.clear()
            got = [t.to_numpy() for t in run(Tensor.from_data(x_host, device).require_grad())]
        return got

    want = step(ember.device("ndarray").autodiff(), False)
    run_single = Executor.run_single
    monkeypatch.setattr(Executor, "run_single",
                        lambda self, record, *a: (singles.append(record.name),
                                                  run_single(self, record, *a)))  # fmt: skip
    with autotune.forcing(autotune.Choice("fused", 2)):
        got = step(ember.device("ndarray").fusion(runtime="numba").autodiff(), True)
    assert stats()["direct_replays"] == 1
    kernel_ops = {"max_pool2d_with_indices", "avg_pool2d", "conv_x_backward",
                  "conv_weight_backward", "float_matmul"}  # fmt: skip
    assert not kernel_ops & set(singles), singles
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("rows", [6, 256], ids=["too small to time", "the inner op chosen"])
def test_a_direct_replay_runs_ops_without_a_kernel_on_the_arrays(rows, monkeypatch):
    """Ops without a compiled kernel (a sum over an axis, a mean), and a product the tuner
    leaves to the inner backend with its bias added apart, run in a direct replay as the
    inner ops on the arrays: no record and no single-op path; the results are NumPy's."""
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion import autotune
    from ember.backends.fusion.executor import Executor

    device = ember.device("ndarray").fusion(runtime="numba")
    w, b = _data((64, 40), 1), _data((40,), 2)
    tw, tb = Tensor.from_data(w, device), Tensor.from_data(b, device)
    g = replay(lambda x: [(x @ tw + tb).sum_dim(0), x.mean_dim(1)])
    singles = []
    run_single = Executor.run_single
    monkeypatch.setattr(Executor, "run_single",
                        lambda self, record, *a: (singles.append(record.name),
                                                  run_single(self, record, *a)))  # fmt: skip
    with autotune.forcing(autotune.UNFUSED):
        for call in range(5):
            x = _data((rows, 64), 40 + call)
            singles.clear()
            reset_stats()
            got = [t.to_numpy() for t in g(Tensor.from_data(x, device))]
            x64 = x.astype(np.float64)
            np.testing.assert_allclose(got[0], (x64 @ w + b).sum(0, keepdims=True), rtol=1e-4)
            np.testing.assert_allclose(got[1], x64.mean(1, keepdims=True), rtol=1e-5, atol=1e-6)
            assert stats()["direct_replays"] == (call >= 3)
            if call >= 3:
                assert singles == [], singles


def test_a_product_read_transposed_is_computed_transposed_in_a_direct_replay(interp):
    # The executor computes such a product transposed for its one reader, a swap; the
    # direct replay does the same.
    w = Tensor.from_data(_data((32, 16), 3), interp)
    g = replay(lambda x: ((x @ w).permute([1, 0]) + 1.0).exp())
    for call in range(5):
        x = _data((8, 32), 85 + call)
        reset_stats()
        got = g(Tensor.from_data(x, interp)).to_numpy()
        want = np.exp((x.astype(np.float64) @ _data((32, 16), 3)).T + 1)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        assert stats()["direct_replays"] == (call >= 3)
        assert stats()["transposed_products"] == 1


def test_ops_run_at_once_run_first_in_a_direct_replay():
    """Small ops on made values run at once when traced (a one-element factor from an
    input); a direct replay runs them before its launches, on each call's input."""
    device = ember.device("ndarray").fusion(runtime="interpreter", small=16)
    g = replay(lambda x, s: (x * (s * 2.0 + 1.0).exp()).tanh())
    for call in range(5):
        x, s = _data((64, 256), call), np.array([0.1 * call - 0.2], np.float32)
        reset_stats()
        got = g(Tensor.from_data(x, device), Tensor.from_data(s, device)).to_numpy()
        np.testing.assert_allclose(got, np.tanh(x * np.exp(s.astype(np.float64) * 2 + 1)),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        assert stats()["direct_replays"] == (call >= 3)
        assert stats()["small_ops"] == (3 if call < 3 else 0)


@pytest.mark.parametrize("reshaped", [False, True])
def test_a_classifier_step_with_dropout_and_labels_replays_directly(reshaped):
    """A classifier's training step: a linear layer, dropout (random draws) and a
    cross-entropy by labels (a gather of the call's labels, and its gradient's scatter;
    ``reshaped``: labels reshaped in the step, a small op run at once, as the guide's).
    From the fourth call its launches run directly; each call's gradients equal a plain
    call's after the same seed, and labels out of range raise what a plain call raises."""
    from ember.nn.dropout import DropoutConfig
    from ember.tensor.activation import log_softmax

    device = ember.device("ndarray").fusion(runtime="interpreter",
                                            small=512 if reshaped else 0).autodiff()  # fmt: skip
    w = Tensor.from_data(_data((64, 10), 1) * 0.1, device).require_grad()
    dropout = DropoutConfig(0.3).init(device)

    def step(x, labels):
        logp = log_softmax(dropout(x).matmul(w), 1)
        picked = logp.gather(1, labels.reshape([128, 1]) if reshaped else labels)
        g = (picked.mean() * -1.0).backward()
        return w.grad(g), x.grad(g)

    def labels_of(values: np.ndarray) -> Tensor:
        return Tensor.from_data(values if reshaped else values[:, None], device)

    g = replay(step)
    for call in range(6):
        x = Tensor.from_data(_data((128, 64), call), device).require_grad()
        labels = labels_of(np.arange(128, dtype=np.int64) * (call + 3) % 10)
        ember.seed(device, call)
        reset_stats()
        got = [t.to_numpy() for t in g(x, labels)]
        assert stats()["direct_replays"] == (call >= 3), call
        ember.seed(device, call)
        want = [t.to_numpy() for t in step(x, labels)]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    bad = labels_of(np.full(128, 10, np.int64))
    with pytest.raises(Exception) as plain:
        step(x, bad)[0].to_numpy()
    with pytest.raises(type(plain.value)) as replayed:
        g(x, bad)[0].to_numpy()
    assert str(replayed.value) == str(plain.value)


def test_a_direct_replay_drops_each_value_after_its_last_step(monkeypatch):
    """A chain of 24 products, each with a bias and a ReLU (a block): a direct replay hands
    each value back to the pool after the step that reads it last, so at most two pooled
    buffers are out at once (all 48 are, where nothing is dropped before the call
    returns)."""
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion import autotune
    from ember.backends.fusion.executor import runtime_named
    from ember.tensor import activation

    device = ember.device("ndarray").fusion(runtime="numba")
    w = Tensor.from_data(_data((256, 256), 1) / 16, device)

    def chain(x):
        for _ in range(24):
            x = activation.relu(x.matmul(w) + 0.5)
        return x

    g = replay(chain)
    pool = runtime_named("numba").pool
    take, lent, most = pool.take, [], [0]

    def counting(*args):  # how many of the arrays this call took are alive at once
        array = take(*args)
        lent.append(weakref.ref(array))
        most[0] = max(most[0], sum(ref() is not None for ref in lent))
        return array

    for call in range(5):
        x = _data((1024, 256), call)
        want = x.astype(np.float64)
        for _ in range(24):
            want = np.maximum(want @ _data((256, 256), 1).astype(np.float64) / 16 + 0.5, 0)
        reset_stats()
        if call == 4:
            monkeypatch.setattr(pool, "take", counting)
        # The kernels' choice, for every product and block: each takes its output from the
        # pool (NumPy's products would not, and the tuner may choose them).
        with autotune.forcing(autotune.Choice("fused", 1)):
            got = g(Tensor.from_data(x, device)).to_numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert stats()["direct_replays"] == 1
    # A block's output and the next product's are out; none of the earlier ones.
    assert len(lent) == 48 and most[0] == 2


def test_a_convolutional_forward_replays_its_launches_directly():
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    torch = pytest.importorskip("torch", reason="the reference is torch")
    from ember.tensor import module as F

    device = ember.device("ndarray").fusion(runtime="numba")
    rng = np.random.default_rng(5)
    w1, w2, skip = (rng.standard_normal(s).astype(np.float32) * 0.2
                    for s in [(16, 3, 3, 3), (16, 16, 3, 3), (16, 3, 1, 1)])  # fmt: skip
    b1 = rng.standard_normal(16).astype(np.float32)
    fc = rng.standard_normal((16, 10)).astype(np.float32)
    weights = [Tensor.from_data(a, device) for a in (w1, w2, skip, b1, fc)]

    def forward(x):
        tw1, tw2, tskip, tb1, tfc = weights
        h = ember.activation.relu(F.conv2d(x, tw1, tb1, padding=1))
        h = ember.activation.relu(F.conv2d(h, tw2, padding=1) + F.conv2d(x, tskip))
        return h.mean_dim(3).mean_dim(2).reshape([x.shape[0], 16]) @ tfc

    def reference(x):
        t = torch.from_numpy(x)
        h = torch.relu(torch.nn.functional.conv2d(t, torch.from_numpy(w1), torch.from_numpy(b1),
                                                  padding=1))  # fmt: skip
        h = torch.relu(torch.nn.functional.conv2d(h, torch.from_numpy(w2), padding=1)
                       + torch.nn.functional.conv2d(t, torch.from_numpy(skip)))  # fmt: skip
        return (h.mean((2, 3)) @ torch.from_numpy(fc)).numpy()

    g = replay(forward)
    for call in range(6):
        x = _data((8, 3, 32, 32), 100 + call)
        reset_stats()
        # The compiled kernels chosen wherever they apply: the three convolutions and the
        # first mean (over the last dim; the second is over a dim of size 1 after it).
        with autotune.forcing(Choice("fused", 2)):
            got = g(Tensor.from_data(x, device)).to_numpy()
        np.testing.assert_allclose(got, reference(x), rtol=1e-4, atol=1e-5)
        counts = stats()
        assert counts["direct_replays"] == (call >= 3), (call, counts)
        if call >= 3:
            assert counts["records"] == 0 and counts["op_kernels"] == 4


def test_a_direct_convolution_keeps_its_launch_while_its_weights_do():
    """A conv step keeps its launch for the weight arrays it was made for: new weights (as
    arguments) or a tuner that forgot its choices make it anew, and every call computes
    with its own weights."""
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    torch = pytest.importorskip("torch", reason="the reference is torch")
    import gc

    from ember.backends.fusion import direct
    from ember.tensor import module as F

    device = ember.device("ndarray").fusion(runtime="numba", small=0)  # every op recorded
    rng = np.random.default_rng(8)
    g = replay(lambda x, w, b: ember.activation.relu(F.conv2d(x, w, b, padding=1)))
    x = _data((4, 8, 16, 16), 3)
    for call in range(9):
        if call in (0, 5):  # read-only arrays, as a loaded model's: nothing can change them
            w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
            b = rng.standard_normal(16).astype(np.float32)
            w.flags.writeable = b.flags.writeable = False
            weights = [Tensor.from_primitive(device.backend.wrap(a), device) for a in (w, b)]
        if call == 7:
            device.backend.executor.tuner.forget()
        reset_stats()
        got = g(Tensor.from_data(x, device), *weights).to_numpy()
        want = torch.relu(torch.nn.functional.conv2d(
            torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), padding=1))  # fmt: skip
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4, err_msg=str(call))
        if 3 <= call < 7:  # (a forgotten choice is timed again, on the records)
            assert stats()["direct_replays"] == 1, (call, stats())
        if call in (4, 6):  # a launch kept for these weights, and only for them
            kept = [e for p in gc.get_objects() if type(p) is direct.Program
                    for e in p.launches.values()]  # fmt: skip
            assert kept and all(e[0]() is w and e[1]() is b for e in kept)


def test_forgotten_plans_make_the_direct_replay_again(interp):
    from ember.backends.fusion.explorer import clear_plans

    g = replay(_norm)
    for call in range(5):
        y, _held = g(Tensor.from_data(_data((64, 300), call), interp))
        y.to_numpy()
    clear_plans(on_disk=False)
    for call in range(3):  # the records run (explored anew), then the blocks alone again
        x = _data((64, 300), 90 + call)
        reset_stats()
        y, _held = g(Tensor.from_data(x, interp))
        np.testing.assert_allclose(y.to_numpy(), _norm64(x)[0], rtol=1e-4, atol=1e-5)
        assert stats()["direct_replays"] == (call >= 1)
        assert stats()["explorations"] == (call == 0)


def test_a_direct_convolution_follows_its_weight_argument_and_in_place_changes():
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    torch = pytest.importorskip("torch", reason="the reference is torch")
    from ember.tensor import module as F

    device = ember.device("ndarray").fusion(runtime="numba")

    def forward(x, w):
        return ember.activation.relu(F.conv2d(x, w, padding=1))

    def weight(seed, writable):
        array = np.random.default_rng(seed).standard_normal((16, 3, 3, 3)).astype(np.float32)
        array.flags.writeable = writable
        return array, Tensor.from_primitive(device.backend.wrap(array), device)

    g = replay(forward)
    x = _data((4, 3, 16, 16), 7)
    fixed, fixed_tensor = weight(0, writable=True)
    for call in range(8):
        # Read-only weights (packed once) that are new arrays each call, then one writable
        # weight changed in place between calls: each call convolves with the weight it has.
        if call < 4:
            w, w_tensor = weight(call, writable=False)
        else:
            fixed *= -1.0
            w, w_tensor = fixed, fixed_tensor
        reset_stats()
        got = g(Tensor.from_data(x, device), w_tensor).to_numpy()
        want = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                                     padding=1)).numpy()  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert stats()["direct_replays"] == (call >= 3), (call, stats())


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled-copy", "small-copy"])
def test_layout_steps_of_a_direct_replay_are_views_or_the_records_copies(device, monkeypatch,
                                                                         pooled):  # fmt: skip
    # A permute, an expand and a reshape of a C-contiguous value run at once as views; the
    # reshape of the permuted (non-contiguous) value copies: through its record where the
    # copy is large enough for the pool, else on the inner backend at once.
    from ember.backends.fusion import executor
    from ember.backends.fusion.executor import Executor

    if pooled:
        monkeypatch.setattr(executor, "POOLED_COPY_MIN", 256)  # the copy has 384 elements
    ran = []
    run_single = Executor.run_single
    monkeypatch.setattr(Executor, "run_single",
                        lambda self, record, *a: ran.append(record.name) or run_single(self, record, *a))  # fmt: skip
    bias = _data((1, 24), 5)
    b = Tensor.from_data(bias, device)

    def body(x):
        flat = (x * 2.0).permute([1, 0]).reshape([16 * 24])  # not C-contiguous: a copy
        grid = (x + 1.0).reshape([4, 4, 24]).permute([2, 0, 1]).sum_dim(0)  # views
        return flat * 3.0, grid, b.expand([16, 24]) * x

    g = replay(body)
    for call in range(5):
        x = _data((16, 24), 90 + call)
        reset_stats()
        flat, grid, scaled = g(Tensor.from_data(x, device))
        x64 = x.astype(np.float64)
        np.testing.assert_allclose(flat.to_numpy(), (x64 * 2).T.reshape(-1) * 3, rtol=1e-6)
        want = (x64 + 1).reshape(4, 4, 24).transpose(2, 0, 1).sum(0, keepdims=True)
        np.testing.assert_allclose(grid.to_numpy(), want, rtol=1e-5)
        np.testing.assert_allclose(scaled.to_numpy(), bias * x64, rtol=1e-6)
        assert stats()["direct_replays"] == (call >= 3)
        if call >= 3 and device.backend.name == "fusion<ndarray>":
            assert "float_permute" not in ran and "float_expand" not in ran, ran
            assert ran.count("float_reshape") == pooled, ran  # the copy
        ran.clear()
