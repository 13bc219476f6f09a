"""The autodiff engine itself: leaves, the Gradients container, freed graphs, errors."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_against_torch, check_finite_differences

import ember
from ember import Tensor
from ember.backends.autodiff import GraphFreedError


def test_shared_subexpression_accumulates(device):
    x = np.array([[0.5, -1.0], [2.0, 0.25]])
    check_against_torch(lambda a: (a * a + a).exp() * a, lambda a: (a * a + a).exp() * a, [x], device)
    check_finite_differences(lambda a: (a * a + a).exp() * a, [x], device)


def test_grad_is_on_the_inner_device_and_params_are_not_mutated(device):
    x = Tensor.from_data([1.0, 2.0], device).require_grad()
    grads = (x * 3.0).sum().backward()
    g = x.grad(grads)
    assert g.device == device.inner()
    assert g.tolist() == [3.0, 3.0]
    assert x.tolist() == [1.0, 2.0]


def test_untracked_inputs_get_no_gradient(device):
    x = Tensor.from_data([1.0, 2.0], device).require_grad()
    c = Tensor.from_data([5.0, 7.0], device)
    grads = (x * c).sum().backward()
    assert x.grad(grads).tolist() == [5.0, 7.0]
    assert c.grad(grads) is None
    assert not c.is_require_grad() and x.is_require_grad()


def test_detach_stops_the_gradient(device):
    x = Tensor.from_data([1.0, 2.0], device).require_grad()
    grads = (x * x.detach()).sum().backward()
    assert x.grad(grads).tolist() == [1.0, 2.0]


def test_grad_remove_and_replace(device):
    x = Tensor.from_data([1.0, 2.0], device).require_grad()
    grads = (x * 2.0).sum().backward()
    assert x.grad_remove(grads).tolist() == [2.0, 2.0]
    assert x.grad(grads) is None
    x.grad_replace(grads, Tensor.from_data([9.0, 9.0], device.inner()))
    assert x.grad(grads).tolist() == [9.0, 9.0]
    with pytest.raises(ember.ShapeError, match=r"grad_replace: gradient shape \[3\]"):
        x.grad_replace(grads, Tensor.from_data([1.0, 1.0, 1.0], device.inner()))


def test_backward_twice_on_a_freed_graph_raises(device):
    x = Tensor.from_data([1.0, 2.0], device).require_grad()
    y = (x.exp() * 2.0).sum()
    y.backward()
    with pytest.raises(GraphFreedError, match="freed by an earlier backward"):
        y.backward()


def test_backward_needs_a_tracked_tensor(device):
    with pytest.raises(ember.UnsupportedError, match="does not depend on any tensor that requires"):
        Tensor.from_data([1.0], device).sum().backward()


def test_backward_off_an_autodiff_backend_names_the_fix():
    x = Tensor.from_data([1.0], ember.device("ndarray"))
    with pytest.raises(ember.UnsupportedError, match=r"device.autodiff\(\)"):
        x.require_grad()


def test_int_tensors_cannot_require_grad(device):
    with pytest.raises(ember.KindError, match="only Float tensors"):
        Tensor.arange(3, device=device).require_grad()


def test_int_results_are_untracked(device):
    x = Tensor.from_data([1.0, 3.0, 2.0], device).require_grad()
    assert not x.argmax(0).is_require_grad()
    assert not (x > 1.0).is_require_grad()


def test_inner_and_from_inner_round_trip(device):
    x = Tensor.from_data([1.0, 2.0], device).require_grad()
    inner = x.inner()
    assert inner.device == device.inner() and not hasattr(inner.backend, "backward")
    back = Tensor.from_inner(inner, device)
    assert back.device == device and not back.is_require_grad()


def test_backward_with_inputs_computes_only_those_gradients(device):
    # As torch.autograd.grad(outputs, inputs): an intermediate value's gradient too.
    a = Tensor.from_data([1.0, 2.0], device).require_grad()
    b = Tensor.from_data([3.0, -1.0], device).require_grad()
    h = a * b
    out = (h * h).sum() + b.sum()
    grads = out.backward(inputs=[h, a])
    assert h.grad(grads).tolist() == [6.0, -4.0]  # 2 h
    assert a.grad(grads).tolist() == [18.0, 4.0]  # 2 h b
    assert b.grad(grads) is None  # not asked for: never computed
    again = (a * b * a * b).sum() + b.sum()  # a new graph: the pass above freed its nodes
    assert b.grad(again.backward()).tolist() == [7.0, -7.0]  # 2 a^2 b + 1


def test_a_gradient_listener_hears_full_passes_only(device):
    # Data-parallel sync listens to the step's parameter gradients: a gradient penalty's
    # inner pass (create_graph) or a restricted pass must not reach it.
    from ember.backends.autodiff.listener import listening

    class Recorder:
        def __init__(self):
            self.heard, self.finished = 0, 0

        def on_gradient(self, node, grad):
            self.heard += 1

        def on_finish(self, grads):
            self.finished += 1

    w = Tensor.from_data([1.0, 2.0], device).require_grad()
    x = Tensor.from_data([3.0, 4.0], device).require_grad()
    recorder = Recorder()
    with listening(recorder):
        slope = x.grad((w * x * x).sum().backward(create_graph=True))  # 2 w x
        (w * x).sum().backward(inputs=[x])
        assert (recorder.heard, recorder.finished) == (0, 0)
        penalty = (slope * slope).sum()
        grads = penalty.backward()
    assert (recorder.heard, recorder.finished) == (2, 1)  # w and x, once
    assert w.grad(grads).tolist() == [72.0, 256.0]  # d/dw sum (2 w x)^2 = 8 w x^2
