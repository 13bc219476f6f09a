"""Gradients through many slices of one tensor: the slice rule's partial gradients, assembled
once per tensor by the engine (pieces side by side, gaps, overlaps, several dims, strides,
slices of slices, on top of full gradients), against torch autograd; and the assembly's cost:
one ``cat`` for pieces that tile a tensor, not one full-size tensor per piece."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gradcheck import check_against_torch, ember_grads

import ember
from ember import DType, Tensor, TensorData
from ember.backend import NdArray
from ember.backends.autodiff import Autodiff, Partial
from ember.backends.autodiff.partial import Accumulator, Pending

_rng = np.random.default_rng(11)


def _x(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape)


def _steps_ember(x):
    # A recurrence over every step of dim 0, each step a narrow of the whole sequence.
    h, outs = x.narrow(0, 0, 1) * 0.0, []
    for t in range(x.shape[0]):
        h = (h * 0.5 + x.narrow(0, t, 1)).tanh()
        outs.append(h)
    return Tensor.cat(outs, 0)


def _steps_torch(x):
    h, outs = x.narrow(0, 0, 1) * 0.0, []
    for t in range(x.shape[0]):
        h = (h * 0.5 + x.narrow(0, t, 1)).tanh()
        outs.append(h)
    return torch.cat(outs, 0)


def _gates_ember(x, w):
    # An LSTM-like cell: one sigmoid over fused gates, a tanh of one block, per-block products.
    gates = x.matmul(w)
    act, d = gates.sigmoid(), w.shape[1] // 4
    g = gates.narrow(1, 2 * d, d).tanh()
    c = act.narrow(1, d, d) + act.narrow(1, 0, d) * g
    return act.narrow(1, 3 * d, d) * c.tanh()


def _gates_torch(x, w):
    gates = x.matmul(w)
    act, d = gates.sigmoid(), w.shape[1] // 4
    g = gates.narrow(1, 2 * d, d).tanh()
    c = act.narrow(1, d, d) + act.narrow(1, 0, d) * g
    return act.narrow(1, 3 * d, d) * c.tanh()


def _flat_cat(pieces, cat):
    return cat([p.reshape([-1]) if isinstance(p, Tensor) else p.reshape(-1) for p in pieces], 0)


def _both(fn):
    """One case written once for both libraries (their slicing and ``exp`` / ``sin`` agree)."""
    return fn, fn


CASES = {
    "time_steps": (_steps_ember, _steps_torch, [_x(13, 2, 3)]),
    "split_every_piece": (
        lambda a: Tensor.cat([p * (i + 1.0) for i, p in enumerate(a.split(1, 1))], 0),
        lambda a: torch.cat([p * (i + 1.0) for i, p in enumerate(a.split(1, 1))], 0),
        [_x(2, 7)],
    ),
    "split_with_gaps": (
        lambda a: (lambda p: Tensor.cat([p[0].exp(), p[2].sin()], 1))(a.split([2, 3, 1, 2], 1)),
        lambda a: (lambda p: torch.cat([p[0].exp(), p[2].sin()], 1))(a.split([2, 3, 1, 2], 1)),
        [_x(3, 8)],
    ),
    "chunk_reused": (
        lambda a: (lambda p: p[0] * p[1] + p[1] * p[2] + p[0])(a.chunk(3, 0)),
        lambda a: (lambda p: p[0] * p[1] + p[1] * p[2] + p[0])(a.chunk(3, 0)),
        [_x(6, 2)],
    ),
    "overlapping_windows": (
        lambda a: Tensor.stack([a.narrow(0, t, 3) * (t + 1.0) for t in range(8)], 0),
        lambda a: torch.stack([a.narrow(0, t, 3) * (t + 1.0) for t in range(8)], 0),
        [_x(10, 2)],
    ),
    "whole_slice_and_full_gradient": (
        lambda a: a.narrow(0, 0, 4).exp() + a * a + Tensor.cat([a[1:3], a[0:2]], 0),
        lambda a: a.narrow(0, 0, 4).exp() + a * a + torch.cat([a[1:3], a[0:2]], 0),
        [_x(4, 3)],
    ),
    "full_gradient_and_many_pieces": (
        lambda a: a.sin() * Tensor.cat([a[2:4], a[0:1], a[1:3], a[4:6], a[0:1]], 0),
        lambda a: a.sin() * torch.cat([a[2:4], a[0:1], a[1:3], a[4:6], a[0:1]], 0),
        [_x(8, 2)],
    ),
    "boxes_on_two_dims": _both(
        lambda a: _flat_cat(
            [a[1:3, 2:5].exp(), a[0:4, 0:2], a[2:5, 1:6].sin(), a[:, 3:4], a[4:5]],
            torch.cat if isinstance(a, torch.Tensor) else Tensor.cat,
        )
    ),
    "grid_of_tiles": _both(
        lambda a: _flat_cat(
            [a[i : i + 2, j : j + 3] * (i + j + 1.0) for i in (0, 2) for j in (0, 3)],
            torch.cat if isinstance(a, torch.Tensor) else Tensor.cat,
        )
    ),
    "strided_and_plain": _both(
        lambda a: _flat_cat(
            [a[::2].exp(), a[1::2], a[::3] * 2.0, a[1:4]],
            torch.cat if isinstance(a, torch.Tensor) else Tensor.cat,
        )
    ),
    "slices_of_slices": _both(
        lambda a: (lambda y: _flat_cat(
            [y[0:2], y[2:6].sin(), y[1:5][::2], y[3:4, 1:]],
            torch.cat if isinstance(a, torch.Tensor) else Tensor.cat,
        ))(a[1:7])
    ),
    "empty_and_single_pieces": (
        lambda a: Tensor.cat([a.narrow(0, 2, 0), a.narrow(0, 3, 1), a.narrow(0, 5, 0)], 0)
        + a.narrow(1, 1, 0).sum(),
        lambda a: torch.cat([a.narrow(0, 2, 0), a.narrow(0, 3, 1), a.narrow(0, 5, 0)], 0)
        + a.narrow(1, 1, 0).sum(),
        [_x(5, 3)],
    ),
    "leading_dims_only": (
        lambda a: a[2:4].exp() * a[0:2],
        lambda a: a[2:4].exp() * a[0:2],
        [_x(5, 2, 3)],
    ),
}


@pytest.mark.parametrize("dtype", [DType.F64, DType.F32], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_many_slices_vs_torch(device, name, dtype):
    ember_fn, torch_fn, *inputs = CASES[name]
    inputs = inputs[0] if inputs else [_x(5, 6)]
    check_against_torch(ember_fn, torch_fn, inputs, device, dtype)


def test_fused_gates_vs_torch(device):
    check_against_torch(_gates_ember, _gates_torch, [_x(3, 5), _x(5, 8)], device)


@pytest.mark.parametrize("inner", ["ndarray", "torch"])
def test_checkpointing_keeps_slice_gradients_exact(inner):
    x, w = _x(7, 2, 3), _x(3, 8)
    base = ember.device(inner)
    plain = base.wrap(Autodiff)
    balanced = base.wrap(lambda b: Autodiff(b, checkpointing="balanced"))

    def fn(a, b):
        return _steps_ember(a) + _gates_ember(a.reshape([14, 3]), b).reshape([7, 2, 2]).sum_dim(2)

    expected = ember_grads(fn, [x, w], plain)
    got = ember_grads(fn, [x, w], balanced)
    for e, g in zip(expected, got):
        g.into_data().assert_eq(e.into_data())


# ------------------------------------------------------------------ the cost of assembling
class _Counting(NdArray):
    """NdArray counting the ops that build gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = {"cat": 0, "slice_assign": 0, "full": 0}

    def float_cat(self, tensors, dim):
        self.calls["cat"] += 1
        return super().float_cat(tensors, dim)

    def float_slice_assign(self, x, values, ranges):
        self.calls["slice_assign"] += 1
        return super().float_slice_assign(x, values, ranges)

    def float_full(self, shape, value, device, dtype):
        self.calls["full"] += 1
        return super().float_full(shape, value, device, dtype)


def test_pieces_that_tile_a_tensor_cost_one_cat():
    inner = _Counting()
    device = ember.Device(Autodiff(inner), "cpu", 0)
    x = Tensor.from_data(TensorData(_x(40, 3)), device).require_grad()
    pieces = [p * float(i) for i, p in enumerate(x.split(1, 0))]
    loss = sum(pieces, start=Tensor.zeros([1, 3], device))
    seed_calls = dict(inner.calls)
    grads = loss.sum().backward()
    calls = {k: inner.calls[k] - seed_calls[k] for k in inner.calls}
    # Only the seed (ones) is a new full tensor; the 40 pieces become x's gradient in one cat.
    assert calls == {"cat": 1, "slice_assign": 0, "full": 1}
    expected = np.repeat(np.arange(40.0)[:, None], 3, axis=1)
    np.testing.assert_allclose(x.grad(grads).into_data().to_numpy(), expected)


def test_accumulator_adds_overlapping_pieces_and_full_gradients():
    inner = NdArray()
    acc = Accumulator(inner)
    shape = (6, 4)
    full = np.ones(shape)
    a, b, c = np.full((3, 4), 2.0), np.full((4, 4), 3.0), np.full((2, 2), 5.0)
    pending = acc.merge(Partial(a, ((0, 3, 1),), shape), Partial(b, ((2, 6, 1),), shape))
    pending = acc.merge(pending, full)
    pending = acc.merge(pending, Partial(c, ((1, 5, 2), (1, 3, 1)), shape))  # strided rows
    assert isinstance(pending, Pending)
    expected = full.copy()
    expected[0:3] += a
    expected[2:6] += b
    expected[1:5:2, 1:3] += c
    np.testing.assert_array_equal(acc.resolve(pending), expected)


def test_accumulator_passes_full_gradients_through():
    acc = Accumulator(NdArray())
    g = np.arange(4.0)
    assert acc.resolve(g) is g
    np.testing.assert_array_equal(acc.merge(g, g), 2 * g)
