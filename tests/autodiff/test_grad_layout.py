"""Gradients of the layout, indexing and pad ops, through the public Tensor API.

Each case is one function written twice (ember and torch) over small inputs;
every case is checked against torch autograd in float64 and float32 and
against finite differences in float64. Index tensors are constants of the
case, so only Float inputs are differentiated.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gradcheck import check_against_torch, check_finite_differences, ember_grads

from ember import DType, Tensor, TensorData

_rng = np.random.default_rng(7)


def _x(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape)


def _idx(values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _ei(like: Tensor, idx: np.ndarray) -> Tensor:
    """An Int index tensor on ``like``'s device."""
    return Tensor.from_data(TensorData(idx), like.device)


def _ti(idx: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(idx)


def _py(n: int, key: slice) -> list[int]:
    """The positions a Python slice takes of ``range(n)`` (torch has no negative steps)."""
    return list(range(n))[key]


def _torch_assign(x, key, values):
    y = x.clone()
    y[key] = values
    return y


G1 = _idx([[2, 0, 2], [1, 1, 0]])  # gather/scatter along dim 1 of a [2, 4] tensor, repeats
G0 = _idx([[1, 0], [1, 1], [0, 1]])  # along dim 0 of a [2, 3]: smaller than the tensor in dim 1
S = _idx([2, 0, 2, 1])  # select along a dim of size 3, with a repeat

CASES = [
    # --- reshape / permute / expand / flip
    (
        "reshape_minus_one",
        lambda a: a.reshape([3, -1]).exp(),
        lambda a: a.reshape(3, -1).exp(),
        [_x(2, 3, 2)],
    ),
    (
        "flatten_squeeze_unsqueeze",
        lambda a: a.flatten(1).unsqueeze_dim(1).squeeze(1) * 2.0,
        lambda a: a.flatten(1).unsqueeze(1).squeeze(1) * 2.0,
        [_x(2, 1, 3)],
    ),
    (
        "reshape_of_permuted",
        lambda a: a.permute(1, 0).reshape([-1]),
        lambda a: a.permute(1, 0).reshape(-1),
        [_x(3, 4)],
    ),
    (
        "permute_3d",
        lambda a: a.permute(2, 0, 1).sin(),
        lambda a: a.permute(2, 0, 1).sin(),
        [_x(2, 3, 4)],
    ),
    (
        "swap_dims",
        lambda a: a.swap_dims(0, 2) * a.swap_dims(0, 2),
        lambda a: a.transpose(0, 2) * a.transpose(0, 2),
        [_x(2, 3, 4)],
    ),
    (
        "transpose_movedim",
        lambda a: a.transpose().movedim(0, 2),
        lambda a: a.transpose(-2, -1).movedim(0, 2),
        [_x(2, 3, 4)],
    ),
    (
        "expand_new_and_unit_dims",
        lambda a: a.expand([2, 3, -1, 4]),
        lambda a: a.expand(2, 3, -1, 4),
        [_x(3, 1, 4)],
    ),
    (
        "broadcast_to_scalar_like",
        lambda a: a.broadcast_to([2, 3]),
        lambda a: a.broadcast_to((2, 3)),
        [_x(1)],
    ),
    ("flip", lambda a: a.flip([0, 2]) * a, lambda a: torch.flip(a, [0, 2]) * a, [_x(2, 3, 2)]),
    # --- slicing and indexing with []
    ("getitem_steps", lambda a: a[1:, ::2], lambda a: a[1:, ::2], [_x(3, 5)]),
    (
        "getitem_negative_steps",
        lambda a: a[::-1, 4:0:-2],
        lambda a: a[_py(3, slice(None, None, -1))][:, _py(5, slice(4, 0, -2))],
        [_x(3, 5)],
    ),
    (
        "getitem_none_int_ellipsis",
        lambda a: a[None, 1, ..., -1],
        lambda a: a[None, 1, ..., -1],
        [_x(3, 4, 2)],
    ),
    (
        "getitem_index_list_repeats",
        lambda a: a[:, [0, 2, 0, 0]],
        lambda a: a[:, [0, 2, 0, 0]],
        [_x(2, 3)],
    ),
    (
        "getitem_twice_accumulates",
        lambda a: a[0] * a[1] + a[:, 1:].sum_dim(1),
        lambda a: a[0] * a[1] + a[:, 1:].sum(1, keepdim=True),
        [_x(2, 3)],
    ),
    (
        "getitem_of_permuted",
        lambda a: a.swap_dims(0, 1)[1:3, ::2],
        lambda a: a.transpose(0, 1)[1:3, ::2],
        [_x(3, 4)],
    ),
    (
        "slice_method",
        lambda a: a.slice([(1, 3), None, (0, 4, 3)]),
        lambda a: a[1:3, :, 0:4:3],
        [_x(3, 2, 4)],
    ),
    ("narrow", lambda a: a.narrow(1, 1, 2) * 3.0, lambda a: a.narrow(1, 1, 2) * 3.0, [_x(2, 4)]),
    (
        "split_sizes",
        lambda a: (lambda p: p[0] * p[2] + p[1])(a.split([2, 1, 2], 1)),
        lambda a: (lambda p: p[0] * p[2] + p[1])(a.split([2, 1, 2], 1)),
        [_x(2, 5)],
    ),
    (
        "chunk",
        lambda a: (lambda p: p[0] * p[1])(a.chunk(2, 0)),
        lambda a: (lambda p: p[0] * p[1])(a.chunk(2, 0)),
        [_x(4, 3)],
    ),
    # --- slice_assign / slice_fill
    (
        "slice_assign",
        lambda a, b: a.slice_assign([(1, 3), (0, 2)], b.exp()),
        lambda a, b: _torch_assign(a, (slice(1, 3), slice(0, 2)), b.exp()),
        [_x(3, 4), _x(2, 2)],
    ),
    (
        "slice_assign_negative_bounds",
        lambda a, b: a.slice_assign([slice(-2, None)], b) * a,
        lambda a, b: _torch_assign(a, slice(-2, None), b) * a,
        [_x(3, 2), _x(2, 2)],
    ),
    (
        "slice_fill",
        lambda a: a.slice_fill([None, (1, 3)], 5.0) * 2.0,
        lambda a: _torch_assign(a, (slice(None), slice(1, 3)), 5.0) * 2.0,
        [_x(2, 4)],
    ),
    # --- cat / stack / repeat / roll
    (
        "cat",
        lambda a, b: Tensor.cat([a, b, a * 2.0], 1),
        lambda a, b: torch.cat([a, b, a * 2.0], 1),
        [_x(2, 2), _x(2, 3)],
    ),
    (
        "cat_of_permuted",
        lambda a, b: Tensor.cat([a.transpose(), b], 0),
        lambda a, b: torch.cat([a.transpose(-2, -1), b], 0),
        [_x(3, 2), _x(1, 3)],
    ),
    (
        "stack",
        lambda a, b: Tensor.stack([a, b, a], 1),
        lambda a, b: torch.stack([a, b, a], 1),
        [_x(2, 3), _x(2, 3)],
    ),
    ("repeat", lambda a: a.repeat([2, 1, 3]), lambda a: a.repeat(2, 1, 3), [_x(2, 2)]),
    ("repeat_dim", lambda a: a.repeat_dim(1, 3), lambda a: a.repeat(1, 3, 1), [_x(2, 2, 2)]),
    (
        "repeat_dim_zero_times",
        lambda a: Tensor.cat([a.repeat_dim(0, 0), a], 0),
        lambda a: torch.cat([a.repeat(0, 1), a], 0),
        [_x(2, 3)],
    ),
    (
        "roll",
        lambda a: a.roll([1, -2], [0, 1]),
        lambda a: torch.roll(a, (1, -2), (0, 1)),
        [_x(3, 4)],
    ),
    # --- gather / scatter / select / select_assign
    (
        "gather_repeats",
        lambda a: a.gather(1, _ei(a, G1)),
        lambda a: torch.gather(a, 1, _ti(G1)),
        [_x(2, 4)],
    ),
    (
        "gather_smaller_index",
        lambda a: a.gather(0, _ei(a, G0)),
        lambda a: torch.gather(a, 0, _ti(G0)),
        [_x(2, 3)],
    ),
    (
        "scatter",
        lambda a, v: a.scatter(1, _ei(a, G1), v),
        lambda a, v: a.scatter_add(1, _ti(G1), v),
        [_x(2, 4), _x(2, 3)],
    ),
    (
        "scatter_smaller_index",
        lambda a, v: a.scatter(0, _ei(a, G0), v) * a,
        lambda a, v: a.scatter_add(0, _ti(G0), v) * a,
        [_x(2, 3), _x(3, 2)],
    ),
    (
        "select_repeats",
        lambda a: a.select(1, _ei(a, S)),
        lambda a: torch.index_select(a, 1, _ti(S)),
        [_x(2, 3, 2)],
    ),
    ("select_list", lambda a: a.select(0, [2, 2, 0]), lambda a: a[[2, 2, 0]], [_x(3, 2)]),
    (
        "select_assign_repeats",
        lambda a, v: a.select_assign(0, _ei(a, S), v) * a,
        lambda a, v: a.index_add(0, _ti(S), v) * a,
        [_x(3, 2), _x(4, 2)],
    ),
    # --- triangles (mask_fill)
    ("tril", lambda a: a.tril(), lambda a: torch.tril(a), [_x(2, 3, 4)]),
    ("triu_offset", lambda a: a.triu(1), lambda a: torch.triu(a, 1), [_x(4, 3)]),
    # --- pad
    (
        "pad_constant",
        lambda a: a.pad([1, 2, 0, 1], value=3.0),
        lambda a: F.pad(a, [1, 2, 0, 1], value=3.0),
        [_x(2, 3, 2)],
    ),
    (
        "pad_constant_negative",
        lambda a: a.pad([-1, 2, 1, -2]),
        lambda a: F.pad(a, [-1, 2, 1, -2]),
        [_x(2, 4, 3)],
    ),
    (
        "pad_constant_all_dims",
        lambda a: a.pad([1, 0, 0, 1, 2, -1]),
        lambda a: F.pad(a, [1, 0, 0, 1, 2, -1]),
        [_x(2, 2, 2)],
    ),
    (
        "pad_reflect_1d",
        lambda a: a.pad([2, 1], mode="reflect"),
        lambda a: F.pad(a, [2, 1], mode="reflect"),
        [_x(2, 2, 4)],
    ),
    (
        "pad_reflect_2d",
        lambda a: a.pad([1, 2, 2, 1], mode="reflect"),
        lambda a: F.pad(a, [1, 2, 2, 1], mode="reflect"),
        [_x(1, 2, 3, 4)],
    ),
    (
        "pad_reflect_widest",
        lambda a: a.pad([3, 3], mode="reflect"),
        lambda a: F.pad(a, [3, 3], mode="reflect"),
        [_x(1, 2, 4)],
    ),
    (
        "pad_reflect_negative",
        lambda a: a.pad([-1, 3, 2, -1], mode="reflect"),
        lambda a: F.pad(a, [-1, 3, 2, -1], mode="reflect"),
        [_x(1, 1, 4, 5)],
    ),
    (
        "pad_reflect_of_permuted",
        lambda a: a.swap_dims(1, 2).pad([1, 1], mode="reflect"),
        lambda a: F.pad(a.transpose(1, 2), [1, 1], mode="reflect"),
        [_x(2, 3, 2)],
    ),
    (
        "pad_edge_1d",
        lambda a: a.pad([2, 3], mode="edge"),
        lambda a: F.pad(a, [2, 3], mode="replicate"),
        [_x(2, 1, 3)],
    ),
    (
        "pad_edge_2d",
        lambda a: a.pad([0, 2, 3, 1], mode="edge"),
        lambda a: F.pad(a, [0, 2, 3, 1], mode="replicate"),
        [_x(1, 2, 2, 3)],
    ),
    (
        "pad_edge_negative",
        lambda a: a.pad([2, -2, -1, 1], mode="edge"),
        lambda a: F.pad(a, [2, -2, -1, 1], mode="replicate"),
        [_x(1, 1, 3, 4)],
    ),
    (
        "pad_edge_size_one",
        lambda a: a.pad([2, 2], mode="edge"),
        lambda a: F.pad(a, [2, 2], mode="replicate"),
        [_x(1, 2, 1)],
    ),
]

IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("dtype", [DType.F64, DType.F32], ids=["f64", "f32"])
@pytest.mark.parametrize(("name", "ember_fn", "torch_fn", "inputs"), CASES, ids=IDS)
def test_against_torch(device, dtype, name, ember_fn, torch_fn, inputs):
    check_against_torch(ember_fn, torch_fn, inputs, device, dtype)


@pytest.mark.parametrize(("name", "ember_fn", "torch_fn", "inputs"), CASES, ids=IDS)
def test_finite_differences(device, name, ember_fn, torch_fn, inputs):
    check_finite_differences(ember_fn, inputs, device)


def test_untracked_cat_input_gets_no_gradient(device):
    a = Tensor.from_data(TensorData(_x(2, 2)), device).require_grad()
    b = Tensor.from_data(TensorData(_x(2, 3)), device)
    grads = (Tensor.cat([b, a], 1) * 2.0).sum().backward()
    assert a.grad(grads).tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert b.grad(grads) is None


def test_index_tensors_get_no_gradient(device):
    x = Tensor.from_data(TensorData(_x(2, 4)), device).require_grad()
    idx = _ei(x, G1)
    grads = x.gather(1, idx).sum().backward()
    assert idx.grad(grads) is None
    assert x.grad(grads).tolist() == [[1.0, 0.0, 2.0, 0.0], [1.0, 2.0, 0.0, 0.0]]


def test_gradients_keep_the_input_dtype_through_layout_ops(device):
    (g,) = ember_grads(lambda a: a.pad([1, 1], mode="reflect").permute(1, 0)[::-1].reshape([-1]),
                       [_x(2, 3)], device, DType.F32)  # fmt: skip
    assert g.dtype is DType.F32 and g.shape == (2, 3)
