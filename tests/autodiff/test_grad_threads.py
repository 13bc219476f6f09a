"""Autodiff from several threads at once: independent graphs give the same gradients as sequentially.

Each task builds its own graph (element-wise ops, fused activations, reductions,
matmul, layout ops) from its own inputs and a parameter shared by every task,
then differentiates it. The tasks start together behind a barrier so their
forward and backward passes interleave.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import ember
from ember import DType, Tensor, TensorData
from ember import activation as A

WORKERS = 8
TASKS = 24


def _task(device: ember.Device, shared: Tensor, seed: int, barrier: threading.Barrier | None):
    rng = np.random.default_rng(seed)
    x = Tensor.from_data(TensorData(rng.normal(size=(4, 6))), device).cast(DType.F64).require_grad()
    w = Tensor.from_data(TensorData(rng.normal(size=(6, 5))), device).cast(DType.F64).require_grad()
    if barrier is not None:
        barrier.wait()
    h = A.gelu(x.matmul(w) + shared)  # the shared leaf: a bias used by every graph
    h = A.softmax(h, 1) * A.silu(h) + A.leaky_relu(h, 0.1)
    h = h.permute(1, 0)[:, ::2].max_pair(h.transpose()[:, 1::2])
    loss = (h.cumsum(0).exp().sum_dim(1).log() + h.var_bias(1) * seed).sum()
    grads = loss.backward()
    return [t.grad(grads).into_data().to_numpy() for t in (x, w, shared)]


@pytest.mark.parametrize("backend", ["ndarray", "torch"])
def test_concurrent_graphs_match_sequential(backend):
    device = ember.device(backend).autodiff()
    shared = Tensor.from_data(TensorData(np.linspace(-1, 1, 5)), device).cast(DType.F64).require_grad()
    sequential = [_task(device, shared, seed, None) for seed in range(TASKS)]

    barrier = threading.Barrier(WORKERS, timeout=60)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        # the first WORKERS tasks start together; the rest follow as workers free up
        futures = [pool.submit(_task, device, shared, seed, barrier if seed < WORKERS else None)
                   for seed in range(TASKS)]  # fmt: skip
        concurrent = [f.result(timeout=120) for f in futures]

    for seed, (expected, got) in enumerate(zip(sequential, concurrent)):
        for name, e, g in zip(("x", "w", "shared"), expected, got):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12, err_msg=f"task {seed}, grad of {name}")


def test_one_graph_differentiated_in_threads_gives_each_its_gradients():
    # Several threads each run backward() on their own loss over the same leaves.
    device = ember.device("ndarray").autodiff()
    x = Tensor.from_data(TensorData(np.linspace(-2, 2, 12).reshape(3, 4)), device).cast(DType.F64).require_grad()

    def loss_grad(k: int):
        grads = (A.sigmoid(x * float(k)) * x).sum().backward()
        return x.grad(grads).into_data().to_numpy()

    expected = [loss_grad(k) for k in range(16)]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        got = list(pool.map(loss_grad, range(16)))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
