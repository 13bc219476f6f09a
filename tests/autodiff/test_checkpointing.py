"""Gradient checkpointing and memory: same gradients, less retained state."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

import ember
from ember import Tensor, activation
from ember.backends.autodiff import Autodiff


def _devices(inner: str):
    base = ember.device(inner)
    return base.wrap(Autodiff), base.wrap(lambda b: Autodiff(b, checkpointing="balanced"))


def _model(x: Tensor, y: Tensor) -> Tensor:
    h = (x * y + x.exp()).sort(1).sin()
    h = h.max_dim(0) * activation.softmax(x, 1) + x.var(1)
    h = activation.gelu(h * 0.3) + (h.tanh() - y).abs().sqrt()
    return (h / 2.0).sum_dim(1).mean()


@pytest.mark.parametrize("inner", ["ndarray", "torch"])
def test_checkpointing_gives_the_same_gradients(inner):
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(4, 5)), rng.normal(size=(1, 5))
    results = []
    for device in _devices(inner):
        x = Tensor.from_data(xs, device).require_grad()
        y = Tensor.from_data(ys, device).require_grad()
        grads = _model(x, y).backward()
        results.append((x.grad(grads).into_data(), y.grad(grads).into_data()))
    (gx, gy), (cx, cy) = results
    cx.assert_eq(gx)
    cy.assert_eq(gy)


def test_invalid_checkpointing_strategy_is_rejected():
    with pytest.raises(ember.ArgumentError, match="checkpointing must be None or 'balanced'"):
        Autodiff(ember.device("ndarray").backend, checkpointing="everything")


def _retained_bytes(device: ember.Device, track: bool) -> int:
    """Bytes still held after a forward pass of 12 memory-bound ops on a 1M-element tensor."""
    gc.collect()
    tracemalloc.start()
    x = Tensor.ones([1 << 20], device)
    if track:
        x = x.require_grad()
    start = tracemalloc.get_traced_memory()[0]
    y = x
    for _ in range(12):
        y = (y * 1.01).sin()
    loss = y.sum()
    held = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    del loss, y
    return held


def test_balanced_checkpointing_keeps_memory_bound_outputs_out_of_the_graph():
    plain, balanced = _devices("ndarray")
    kept = _retained_bytes(plain, track=True)
    recomputed = _retained_bytes(balanced, track=True)
    one_tensor = 4 << 20
    assert kept > 12 * one_tensor  # every sin and mul keeps its input
    assert recomputed < 2 * one_tensor  # only the leaf (and the last output) stay


def test_untracked_ops_keep_no_state():
    plain, _ = _devices("ndarray")
    assert _retained_bytes(plain, track=False) < 2 * (4 << 20)
