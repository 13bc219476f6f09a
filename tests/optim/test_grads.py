"""GradientsParams, GradientsAccumulator and what an optimizer step does to a module."""

from __future__ import annotations

import numpy as np
import pytest
from optim_helpers import Mlp, batch, ember_loss, ember_mlp, snapshot, torch_mlp

import ember
from ember import Tensor, TensorData
from ember.backend.errors import ArgumentError, DeviceError, ShapeError
from ember.module import Module, Param, ParamId, RunningState
from ember.optim.accumulator import GradientsAccumulator
from ember.optim.adam import AdamConfig
from ember.optim.grads import GradientsParams
from ember.optim.sgd import SgdConfig


def _setup(device):
    model = ember_mlp(torch_mlp(), device)
    x, target = (Tensor.from_data(TensorData(t.numpy()), device) for t in batch())
    return model, x, target


def _grad_arrays(grads: GradientsParams, model: Mlp) -> dict[str, np.ndarray]:
    return {path: grads.get(p.id).to_numpy() for path, p in model.params()}


# ---------------------------------------------------------------------- GradientsParams
def test_from_grads_keys_each_gradient_by_param_id(ad_device):
    model, x, target = _setup(ad_device)
    raw = ember_loss(model, x, target).backward()
    grads = GradientsParams.from_grads(raw, model)
    assert len(grads) == 4 and not grads.is_empty()
    for _, param in model.params():
        assert param.id in grads
        expected = param.val().grad(raw)
        np.testing.assert_array_equal(grads.get(param.id).to_numpy(), expected.to_numpy())
        assert grads.get(param.id).device == ad_device.inner()


def test_from_grads_skips_frozen_params_and_running_state(ad_device):
    class Holder(Module):
        used: Param
        frozen: Param
        unused: Param
        stats: RunningState

        def forward(self, x: Tensor) -> Tensor:
            return x * self.used.val() + self.frozen.val() + self.stats.val()

    ones = Tensor.ones([2], ad_device)
    holder = Holder(Param(ones), Param(ones, require_grad=False), Param(ones), RunningState(ones))
    grads = GradientsParams.from_grads(holder(ones).sum().backward(), holder)
    assert grads.ids() == [holder.used.id]


def test_from_params_keeps_the_listed_ids(ad_device):
    model, x, target = _setup(ad_device)
    raw = ember_loss(model, x, target).backward()
    grads = GradientsParams.from_params(raw, model, [model.fc2.weight.id])
    assert grads.ids() == [model.fc2.weight.id]


def test_register_get_remove():
    device = ember.device("ndarray")
    grads, pid = GradientsParams(), ParamId.new()
    assert grads.get(pid) is None and grads.remove(pid) is None and grads.is_empty()
    grads.register(pid, Tensor.ones([2], device))
    assert len(grads) == 1 and pid in grads and list(grads) == [pid]
    assert grads.remove(pid).tolist() == [1.0, 1.0]
    assert len(grads) == 0
    moved = GradientsParams({pid: Tensor.ones([1], device)}).to_device(ember.device("torch"))
    assert moved.get(pid).device == ember.device("torch")


def test_gradients_params_errors():
    device = ember.device("ndarray")
    with pytest.raises(
        ArgumentError, match=r"GradientsParams\.register: expected a ParamId, got str"
    ):
        GradientsParams().register("0", Tensor.ones([1], device))
    with pytest.raises(ArgumentError, match="must be a Float tensor, got i64"):
        GradientsParams().register(ParamId.new(), Tensor.from_data([1], device))
    model = Mlp.__new__(Mlp)
    with pytest.raises(ArgumentError, match="expected the Gradients that backward\\(\\) returns"):
        GradientsParams.from_grads({}, model)
    ad = device.autodiff()
    raw = Tensor.ones([1], ad).require_grad().sum().backward()
    with pytest.raises(
        ArgumentError, match=r"GradientsParams\.from_grads: expected a Module, got int"
    ):
        GradientsParams.from_grads(raw, 3)
    inference, _, _ = _setup(device)
    with pytest.raises(
        DeviceError,
        match=r"parameter fc1.weight is on .*ndarray.*, which has no "
        r"autodiff",
    ):
        GradientsParams.from_grads(raw, inference)


# ---------------------------------------------------------------------- accumulation
def test_accumulated_gradients_equal_the_gradient_of_the_summed_loss(ad_device):
    model, x, target = _setup(ad_device)
    accumulator = GradientsAccumulator()
    for part in (slice(0, 3), slice(3, 8)):
        diff = model(x[part]) - target[part]
        loss = (diff * diff).sum()
        accumulator.accumulate(model, GradientsParams.from_grads(loss.backward(), model))
    accumulated = accumulator.grads()

    diff = model(x) - target
    whole = GradientsParams.from_grads((diff * diff).sum().backward(), model)
    ours, expected = _grad_arrays(accumulated, model), _grad_arrays(whole, model)
    for path in expected:
        np.testing.assert_allclose(ours[path], expected[path], rtol=1e-5, atol=1e-5, err_msg=path)
    assert len(accumulator.grads()) == 0  # grads() resets the sum

    stepped = SgdConfig().init().step(0.1, model, accumulated)
    reference = SgdConfig().init().step(0.1, model, whole)
    for a, b in zip(snapshot(stepped), snapshot(reference)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_accumulate_ignores_ids_of_other_modules_and_checks_shapes():
    device = ember.device("ndarray").autodiff()
    model, _, _ = _setup(device)
    stranger = GradientsParams({ParamId.new(): Tensor.ones([2], device.inner())})
    accumulator = GradientsAccumulator()
    accumulator.accumulate(model, stranger)
    assert len(accumulator.grads()) == 0
    wrong = GradientsParams({model.fc1.bias.id: Tensor.ones([2], device.inner())})
    with pytest.raises(
        ShapeError,
        match=r"GradientsAccumulator.accumulate: the gradient of "
        r"parameter fc1.bias has shape \[2\], the parameter \[5\]",
    ):
        accumulator.accumulate(model, wrong)
    with pytest.raises(ArgumentError, match="expected a GradientsParams"):
        accumulator.accumulate(model, {})
    with pytest.raises(ArgumentError, match="expected a Module, got dict"):
        accumulator.accumulate({}, stranger)


# ---------------------------------------------------------------------- the step
def test_step_returns_fresh_leaves_with_the_same_ids(ad_device):
    model, x, target = _setup(ad_device)
    raw = ember_loss(model, x, target).backward()
    updated = AdamConfig().init().step(0.01, model, raw)
    for (path, old), (_, new) in zip(model.params(), updated.params()):
        assert new.id == old.id, path
        assert new.device == ad_device
        assert new.val().is_require_grad()
        assert new.val()._prim.node.is_leaf, f"{path}: the update grew the graph"
        assert not np.array_equal(new.val().to_numpy(), old.val().to_numpy()), path
    # The updated model trains again; the old model is unchanged (modules are values).
    assert len(GradientsParams.from_grads(ember_loss(updated, x, target).backward(), updated)) == 4
    np.testing.assert_array_equal(
        snapshot(model)[0], snapshot(ember_mlp(torch_mlp(), ad_device))[0]
    )


def test_step_with_raw_gradients_equals_step_with_gradients_params(ad_device):
    model, x, target = _setup(ad_device)
    raw = ember_loss(model, x, target).backward()
    from_raw = AdamConfig().init().step(0.01, model, raw)
    from_params = AdamConfig().init().step(0.01, model, GradientsParams.from_grads(raw, model))
    for a, b in zip(snapshot(from_raw), snapshot(from_params)):
        np.testing.assert_array_equal(a, b)


def test_frozen_and_gradientless_params_are_untouched(ad_device):
    model, x, target = _setup(ad_device)
    model = model.map(lambda path, p: p.set_require_grad(False) if path == "fc1.bias" else p)
    grads = GradientsParams.from_grads(ember_loss(model, x, target).backward(), model)
    assert len(grads) == 3
    grads.remove(model.fc2.bias.id)
    optimizer = AdamConfig().init()
    updated = optimizer.step(0.1, model, grads)
    before, after = snapshot(model), snapshot(updated)
    np.testing.assert_array_equal(after[1], before[1])  # fc1.bias: frozen
    np.testing.assert_array_equal(after[3], before[3])  # fc2.bias: no gradient
    assert not np.array_equal(after[0], before[0]) and not np.array_equal(after[2], before[2])
    assert not updated.fc1.bias.require_grad
    assert set(optimizer.to_record()) == {str(model.fc1.weight.id), str(model.fc2.weight.id)}


def test_step_errors():
    device = ember.device("ndarray").autodiff()
    model, x, target = _setup(device)
    raw = ember_loss(model, x, target).backward()
    optimizer = AdamConfig().init()
    for lr in (-0.1, float("nan"), "0.1", True):
        with pytest.raises(ArgumentError, match=r"Adam.step: lr must be a finite number >= 0, got"):
            optimizer.step(lr, model, raw)
    with pytest.raises(
        ArgumentError,
        match=r"Adam\.step: expected GradientsParams or the Gradients "
        r"of backward\(\), got dict",
    ):
        optimizer.step(0.1, model, {})
    with pytest.raises(ArgumentError, match=r"Sgd\.step: expected a Module, got list"):
        SgdConfig().init().step(0.1, [], raw)
    wrong = GradientsParams({model.fc2.weight.id: Tensor.ones([3, 5], device.inner())})
    with pytest.raises(
        ShapeError,
        match=r"Adam.step: the gradient of parameter fc2.weight has "
        r"shape \[3, 5\], the parameter \[5, 3\]",
    ):
        optimizer.step(0.1, model, wrong)
    assert optimizer.to_record() == {}
