"""Whole-sequence recurrent ops: an LSTM or GRU layer's time loop as a single op.

The cell ops of :mod:`ember.nn.rnn_cell` make each time step one op, but a layer still
runs its time loop in Python: through Autodiff every step is a graph node, a handful of
small kernel launches forward and backward, and on PyTorch nothing reaches the fused
recurrent kernels (oneDNN on the CPU, cuDNN on CUDA). The ops here take the raw input
sequence and the layer's weights and run the recurrence of every step, and both
directions of a bidirectional layer, in one call:

=============  ====================================================================
op             inputs (``dirs`` is 1, or 2 for a bidirectional layer)
=============  ====================================================================
lstm_sequence  ``x [T, B, D]``, ``h0, c0 [dirs, B, H]``, ``w_ih [dirs, D, 4H]``,
               ``w_hh [dirs, H, 4H]``, ``bias [dirs, 4H]`` (``b_ih + b_hh``)
gru_sequence   ``x [T, B, D]``, ``h0 [dirs, B, H]``, ``w_ih [dirs, D, 3H]``,
               ``w_hh [dirs, H, 3H]``, ``b_ih, b_hh [dirs, 3H]``
=============  ====================================================================

The weights are ember's (``[in, gates * H]``, gate blocks in PyTorch's order: LSTM
``[i | f | g | o]``, GRU ``[r | z | n]``); direction 1 reads the sequence from its last
step to its first. Taking the raw input rather than its projection lets the Torch kernels
hand the whole layer to ``torch._VF.lstm`` / ``gru`` (cuDNN on CUDA), which project the
input themselves.

Autodiff tracks the first output of an op only, so each op returns one tensor:

* ``gru_sequence``: ``[T, B, dirs * H]``, the hidden state of every step in time order,
  the directions side by side (PyTorch's output); the final states are rows of it;
* ``lstm_sequence``: ``[T + 1, B, dirs * H]``: the same ``T`` rows, then one row with
  each direction's final cell state.

What the backward pass needs beyond that (gate activations, the cell state of every step)
is not part of the output: every implementation can recompute it from the hidden states
(the gates of all steps in two large matrix products, the cell states in a cheap
element-wise scan). A kernel asked to (``save``) keeps it aside instead, tied to the
output it returned (see :func:`_keep`), and its own backward kernel reads it from there.

Each op has a reference from backend primitives (every backend runs and differentiates
it), kernels for NdArray (one NumPy loop over time, buffers reused, no per-step
allocation) and Torch (``torch._VF`` forward; on the CPU in float32 with a gradient
wanted, aten's oneDNN layer and its backward kernel), and a backward rule that calls
``<op>_backward``: one op giving every input's gradient, packed flat.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ember.backend import AVal, NdArray, custom_op
from ember.backend.errors import DTypeError, ShapeError, fmt_shape
from ember.backends.autodiff import backward
from ember.tensor import Tensor

__all__ = ["gru_sequence", "lstm_sequence"]


# ---------------------------------------------------------------- shape rules
def _check(op: str, gates: int, x: AVal, states: tuple[AVal, ...], w_ih: AVal, w_hh: AVal,
           biases: tuple[AVal, ...]) -> tuple[int, int, int, int, int]:  # fmt: skip
    """Checks the operands of a sequence op; gives ``(T, B, D, dirs, H)``."""
    if len(x.shape) != 3 or x.shape[0] == 0:
        raise ShapeError(
            f"{op}: expected an input of shape [seq, batch, d_input] with seq >= 1, "
            f"got {fmt_shape(x.shape)}"
        )
    steps, batch, d_in = x.shape
    h = states[0]
    if len(h.shape) != 3 or h.shape[0] not in (1, 2) or h.shape[1] != batch:
        raise ShapeError(
            f"{op}: expected an initial hidden state of shape [dirs (1 or 2), {batch} (batch), "
            f"d_hidden], got {fmt_shape(h.shape)} for the input {fmt_shape(x.shape)}"
        )
    dirs, _, d = h.shape
    for other in states[1:]:
        if tuple(other.shape) != tuple(h.shape):
            raise ShapeError(
                f"{op}: the initial cell state {fmt_shape(other.shape)} and hidden state "
                f"{fmt_shape(h.shape)} need the same shape [dirs, batch, d_hidden]"
            )
    expected = {
        "w_ih": (w_ih, (dirs, d_in, gates * d), f"[dirs, d_input, {gates} * d_hidden]"),
        "w_hh": (w_hh, (dirs, d, gates * d), f"[dirs, d_hidden, {gates} * d_hidden]"),
        **{f"bias {k}": (b, (dirs, gates * d), f"[dirs, {gates} * d_hidden]")
           for k, b in enumerate(biases)},
    }  # fmt: skip
    for name, (aval, shape, layout) in expected.items():
        if tuple(aval.shape) != shape:
            raise ShapeError(
                f"{op}: expected {name} of shape {fmt_shape(shape)} {layout} (d_input {d_in}, "
                f"d_hidden {d}, dirs {dirs}), got {fmt_shape(aval.shape)}"
            )
    for other in (*states, w_ih, w_hh, *biases):
        if other.dtype is not x.dtype:
            raise DTypeError(f"{op}: operands have different dtypes {x.dtype} and {other.dtype}")
    return steps, batch, d_in, dirs, d


def _lstm_rule(op: str, x, h0, c0, w_ih, w_hh, bias, save) -> AVal:
    steps, batch, _, dirs, d = _check(op, 4, x, (h0, c0), w_ih, w_hh, (bias,))
    return AVal((steps + 1, batch, dirs * d), x.dtype)


def _gru_rule(op: str, x, h0, w_ih, w_hh, b_ih, b_hh, save) -> AVal:
    steps, batch, _, dirs, d = _check(op, 3, x, (h0,), w_ih, w_hh, (b_ih, b_hh))
    return AVal((steps, batch, dirs * d), x.dtype)


def _flat_size(x: AVal, h0: AVal, weights: tuple[AVal, ...], states: int) -> int:
    sizes = [x.shape, *[h0.shape] * states, *(w.shape for w in weights)]
    return sum(int(np.prod(s)) for s in sizes)


def _lstm_backward_rule(op, grad, x, h0, c0, w_ih, w_hh, bias, out, need_x) -> AVal:
    return AVal((_flat_size(x, h0, (w_ih, w_hh, bias), 2),), x.dtype)


def _gru_backward_rule(op, grad, x, h0, w_ih, w_hh, b_ih, b_hh, out, need_x) -> AVal:
    return AVal((_flat_size(x, h0, (w_ih, w_hh, b_ih, b_hh), 1),), x.dtype)


# ---------------------------------------------------------------- kept state
_KEPT: dict[int, tuple[weakref.ref, Any]] = {}


def _keep(out: Any, value: Any) -> None:
    """Keeps ``value`` for the backward kernel of the op that returned ``out``.

    Ops are pure and return one tensor, so a kernel's extra results (activations, a
    oneDNN workspace) live here, as long as ``out`` does; a backward kernel that finds
    nothing (``out`` came from another implementation) recomputes them.
    """
    key = id(out)
    _KEPT[key] = (weakref.ref(out), value)
    weakref.finalize(out, _KEPT.pop, key, None)


def _kept(out: Any) -> Any:
    entry = _KEPT.get(id(out))
    return entry[1] if entry is not None and entry[0]() is out else None


# ---------------------------------------------------------------- primitive helpers
def _at(B, x: Any, i: int) -> Any:
    """``x[i]``: index ``i`` of dim 0, the dim dropped."""
    shape = B.shape(x)
    return B.float_reshape(B.float_slice(x, ((i, i + 1, 1),)), tuple(shape[1:]))


def _cols(B, x: Any, start: int, stop: int) -> Any:
    shape = B.shape(x)
    return B.float_slice(x, tuple((0, s, 1) for s in shape[:-1]) + ((start, stop, 1),))


def _stack(B, parts: list) -> Any:
    return B.float_cat([B.float_reshape(p, (1, *B.shape(p))) for p in parts], 0)


def _one_minus(B, x: Any) -> Any:
    return B.float_add_scalar(B.float_neg(x), 1.0)


def _t(B, x: Any) -> Any:
    return B.float_permute(x, (1, 0))


def _order(steps: int, direction: int) -> range:
    """The time steps in the order a direction reads them."""
    return range(steps) if direction == 0 else range(steps - 1, -1, -1)


def _project(B, x: Any, w: Any, b: Any) -> Any:
    """``x @ w[k] + b[k]`` for every direction ``k``: ``[dirs, T, B, G]``."""
    steps, batch, d_in = B.shape(x)
    dirs, _, width = B.shape(w)
    y = B.float_matmul(B.float_reshape(x, (1, steps * batch, d_in)), w)
    y = B.float_add(y, B.float_reshape(b, (dirs, 1, width)))
    return B.float_reshape(y, (dirs, steps, batch, width))


def _flat(B, parts: list) -> Any:
    return B.float_cat([B.float_reshape(p, (int(np.prod(B.shape(p))),)) for p in parts], 0)


def _weight_grads(B, x, w_ih, hprev: list, dgates: list, need_x: bool):
    """The products after the time loop of one direction: ``dx``, ``dW_ih``, ``dW_hh``, ``db``."""
    steps, batch, d_in = B.shape(x)
    rows = steps * batch
    dg = B.float_reshape(_stack(B, dgates), (rows, B.shape(dgates[0])[-1]))
    hp = B.float_reshape(_stack(B, hprev), (rows, B.shape(hprev[0])[-1]))
    x2 = B.float_reshape(x, (rows, d_in))
    dx = B.float_reshape(B.float_matmul(dg, _t(B, w_ih)), (steps, batch, d_in)) if need_x else None
    db = B.float_reshape(B.float_sum_dim(dg, 0), (B.shape(dg)[-1],))
    return dx, B.float_matmul(_t(B, x2), dg), B.float_matmul(_t(B, hp), dg), db


def _combine(B, x, per_direction: list, states: list[list], need_x: bool) -> Any:
    """Stacks the directions' gradients into the flat layout of a backward op."""
    dx = None
    for parts in per_direction:
        if parts[0] is not None:
            dx = parts[0] if dx is None else B.float_add(dx, parts[0])
    if dx is None:
        dx = B.float_full(B.shape(x), 0.0, B.device_of(x), B.dtype(x))
    weights = [_stack(B, [parts[i] for parts in per_direction]) for i in range(1, 4)]
    return _flat(B, [dx, *(_stack(B, s) for s in states), *weights])


# ---------------------------------------------------------------- LSTM reference
def _lstm_step(B, gates, c, d):
    i, f, o = (B.sigmoid(_cols(B, gates, k * d, (k + 1) * d)) for k in (0, 1, 3))
    g = B.float_tanh(_cols(B, gates, 2 * d, 3 * d))
    c = B.float_add(B.float_mul(f, c), B.float_mul(i, g))
    return i, f, g, o, c


def _lstm_reference(B, x, h0, c0, w_ih, w_hh, bias, save):
    """The LSTM recurrence from primitives, step by step: the definition kernels match."""
    steps = B.shape(x)[0]
    dirs, _, d = B.shape(h0)
    xp = _project(B, x, w_ih, bias)
    hs = [[None] * steps for _ in range(dirs)]
    last = []
    for k in range(dirs):
        h, c, w, xk = _at(B, h0, k), _at(B, c0, k), _at(B, w_hh, k), _at(B, xp, k)
        for t in _order(steps, k):
            gates = B.float_add(_at(B, xk, t), B.float_matmul(h, w))
            _, _, _, o, c = _lstm_step(B, gates, c, d)
            h = hs[k][t] = B.float_mul(o, B.float_tanh(c))
        last.append(c)
    rows = [B.float_cat([hs[k][t] for k in range(dirs)], 1) for t in range(steps)]
    return _stack(B, [*rows, B.float_cat(last, 1)])


def _lstm_backward_reference(B, grad, x, h0, c0, w_ih, w_hh, bias, out, need_x):
    """Backpropagation through time from primitives, the activations recomputed from the
    hidden states in ``out``: ``[dx | dh0 | dc0 | dW_ih | dW_hh | dbias]``, flat."""
    steps = B.shape(x)[0]
    dirs, _, d = B.shape(h0)
    xp = _project(B, x, w_ih, bias)
    per_direction, dh0, dc0 = [], [], []
    for k in range(dirs):
        w, xk = _at(B, w_hh, k), _at(B, xp, k)
        h_of = [_cols(B, _at(B, out, t), k * d, (k + 1) * d) for t in range(steps)]
        grad_h = [_cols(B, _at(B, grad, t), k * d, (k + 1) * d) for t in range(steps)]
        hprev, saved = [None] * steps, [None] * steps
        h, c = _at(B, h0, k), _at(B, c0, k)
        for t in _order(steps, k):
            hprev[t] = h
            gates = B.float_add(_at(B, xk, t), B.float_matmul(h, w))
            i, f, g, o, c_new = _lstm_step(B, gates, c, d)
            saved[t] = (i, f, g, o, c, c_new)
            h, c = h_of[t], c_new
        dh_next = None
        dc_next = _cols(B, _at(B, grad, steps), k * d, (k + 1) * d)
        dgates = [None] * steps
        for t in reversed(_order(steps, k)):
            i, f, g, o, c_prev, c_new = saved[t]
            dh = grad_h[t] if dh_next is None else B.float_add(grad_h[t], dh_next)
            tc = B.float_tanh(c_new)
            dc = B.float_add(
                dc_next, B.float_mul(B.float_mul(dh, o), _one_minus(B, B.float_mul(tc, tc)))
            )

            def through_sigmoid(grad_act, s):
                return B.float_mul(grad_act, B.float_mul(s, _one_minus(B, s)))

            dgates[t] = B.float_cat([
                through_sigmoid(B.float_mul(dc, g), i),
                through_sigmoid(B.float_mul(dc, c_prev), f),
                B.float_mul(B.float_mul(dc, i), _one_minus(B, B.float_mul(g, g))),
                through_sigmoid(B.float_mul(dh, tc), o),
            ], 1)  # fmt: skip
            dc_next = B.float_mul(dc, f)
            dh_next = B.float_matmul(dgates[t], _t(B, w))
        dh0.append(dh_next)
        dc0.append(dc_next)
        per_direction.append(_weight_grads(B, x, _at(B, w_ih, k), hprev, dgates, need_x))
    return _combine(B, x, per_direction, [dh0, dc0], need_x)


# ---------------------------------------------------------------- GRU reference
def _gru_gates(B, xg, hp, h, d):
    """``r, z, n`` and the new hidden state from the input and hidden projections."""
    r = B.sigmoid(B.float_add(_cols(B, xg, 0, d), _cols(B, hp, 0, d)))
    z = B.sigmoid(B.float_add(_cols(B, xg, d, 2 * d), _cols(B, hp, d, 2 * d)))
    n = B.float_tanh(
        B.float_add(_cols(B, xg, 2 * d, 3 * d), B.float_mul(r, _cols(B, hp, 2 * d, 3 * d)))
    )
    return r, z, n, B.float_add(n, B.float_mul(z, B.float_sub(h, n)))  # (1 - z) n + z h


def _gru_reference(B, x, h0, w_ih, w_hh, b_ih, b_hh, save):
    """The GRU recurrence (reset gate after the hidden product) from primitives."""
    steps = B.shape(x)[0]
    dirs, _, d = B.shape(h0)
    xp = _project(B, x, w_ih, b_ih)
    hs = [[None] * steps for _ in range(dirs)]
    for k in range(dirs):
        h, w, b, xk = _at(B, h0, k), _at(B, w_hh, k), _at(B, b_hh, k), _at(B, xp, k)
        for t in _order(steps, k):
            hp = B.float_add(B.float_matmul(h, w), b)
            h = hs[k][t] = _gru_gates(B, _at(B, xk, t), hp, h, d)[3]
    return _stack(B, [B.float_cat([hs[k][t] for k in range(dirs)], 1) for t in range(steps)])


def _gru_backward_reference(B, grad, x, h0, w_ih, w_hh, b_ih, b_hh, out, need_x):
    """Backpropagation through time from primitives, the gates recomputed from the hidden
    states in ``out``: ``[dx | dh0 | dW_ih | dW_hh | db_ih | db_hh]``, flat."""
    steps = B.shape(x)[0]
    dirs, _, d = B.shape(h0)
    xp = _project(B, x, w_ih, b_ih)
    per_direction, dh0, db_hh = [], [], []
    for k in range(dirs):
        w, b, xk = _at(B, w_hh, k), _at(B, b_hh, k), _at(B, xp, k)
        h_of = [_cols(B, _at(B, out, t), k * d, (k + 1) * d) for t in range(steps)]
        hprev = [None] * steps
        h = _at(B, h0, k)
        for t in _order(steps, k):
            hprev[t], h = h, h_of[t]
        dh_next = None
        dxg, dhp = [None] * steps, [None] * steps
        for t in reversed(_order(steps, k)):
            hp = B.float_add(B.float_matmul(hprev[t], w), b)
            r, z, n, _ = _gru_gates(B, _at(B, xk, t), hp, hprev[t], d)
            g = _cols(B, _at(B, grad, t), k * d, (k + 1) * d)
            dh = g if dh_next is None else B.float_add(g, dh_next)
            dz = B.float_mul(
                B.float_mul(dh, B.float_sub(hprev[t], n)), B.float_mul(z, _one_minus(B, z))
            )
            dn = B.float_mul(B.float_mul(dh, _one_minus(B, z)), _one_minus(B, B.float_mul(n, n)))
            dr = B.float_mul(
                B.float_mul(dn, _cols(B, hp, 2 * d, 3 * d)), B.float_mul(r, _one_minus(B, r))
            )
            dxg[t] = B.float_cat([dr, dz, dn], 1)
            dhp[t] = B.float_cat([dr, dz, B.float_mul(dn, r)], 1)
            dh_next = B.float_add(B.float_mul(dh, z), B.float_matmul(dhp[t], _t(B, w)))
        dh0.append(dh_next)
        dx, dw_ih, _, db_ih = _weight_grads(B, x, _at(B, w_ih, k), hprev, dxg, need_x)
        _, _, dw_hh, db_h = _weight_grads(B, x, _at(B, w_ih, k), hprev, dhp, False)
        per_direction.append((dx, dw_ih, dw_hh, db_ih))
        db_hh.append(db_h)
    flat = _combine(B, x, per_direction, [dh0], need_x)
    return B.float_cat([flat, B.float_reshape(_stack(B, db_hh), (dirs * 3 * d,))], 0)


_LSTM_SEQUENCE = custom_op(
    "lstm_sequence", ("x", "h0", "c0", "w_ih", "w_hh", "bias"), _lstm_rule, _lstm_reference,
    attrs=("save",),
)  # fmt: skip
_LSTM_SEQUENCE_BACKWARD = custom_op(
    "lstm_sequence_backward", ("grad", "x", "h0", "c0", "w_ih", "w_hh", "bias", "out"),
    _lstm_backward_rule, _lstm_backward_reference, attrs=("need_x",),
)  # fmt: skip
_GRU_SEQUENCE = custom_op(
    "gru_sequence", ("x", "h0", "w_ih", "w_hh", "b_ih", "b_hh"), _gru_rule, _gru_reference,
    attrs=("save",),
)  # fmt: skip
_GRU_SEQUENCE_BACKWARD = custom_op(
    "gru_sequence_backward", ("grad", "x", "h0", "w_ih", "w_hh", "b_ih", "b_hh", "out"),
    _gru_backward_rule, _gru_backward_reference, attrs=("need_x",),
)  # fmt: skip


# ---------------------------------------------------------------- backward rules
def _split_flat(B, flat, shapes: list[tuple[int, ...]]) -> list:
    parts, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        parts.append(B.float_reshape(B.float_slice(flat, ((start, start + size, 1),)), shape))
        start += size
    return parts


@backward("lstm_sequence", keep=("inputs", "output"))
def _lstm_sequence_backward(B, grad, s):
    x, h0, c0, w_ih, w_hh, bias = s.inputs
    flat = B.lstm_sequence_backward(grad, x, h0, c0, w_ih, w_hh, bias, s.output, s.needs[0])
    parts = _split_flat(B, flat, list(s.shapes))
    return tuple(p if need else None for p, need in zip(parts, s.needs, strict=True))


@backward("gru_sequence", keep=("inputs", "output"))
def _gru_sequence_backward(B, grad, s):
    x, h0, w_ih, w_hh, b_ih, b_hh = s.inputs
    flat = B.gru_sequence_backward(grad, x, h0, w_ih, w_hh, b_ih, b_hh, s.output, s.needs[0])
    parts = _split_flat(B, flat, list(s.shapes))
    return tuple(p if need else None for p, need in zip(parts, s.needs, strict=True))


# ---------------------------------------------------------------- NdArray kernels
# Inside the kernels the gate columns are reordered so that the sigmoid gates come first,
# side by side (LSTM [o | i | f | g], GRU [r | z | n] already is), and those columns of the
# weights and biases are halved: σ(a) = (1 + tanh(a / 2)) / 2, so one tanh over all the
# gates of a step and two in-place ops give every activation. Halving is exact in binary
# floating point. The arrays of a time loop are laid out [T, dirs, B, ...] in the order
# each direction reads the steps (direction 1's reversed), so one step is one index.
def _lstm_columns(w: np.ndarray, d: int) -> np.ndarray:
    """A copy of ``w`` with ember's LSTM columns ``[i | f | g | o]`` in the kernels' order ``[o
    | i | f | g]``: one gate block rotated (``np.roll`` copies two slices; indexing the
    columns gathered them 17x slower)."""
    return np.roll(w, d, axis=-1)


def _halved(w: np.ndarray, lstm_d: int | None, sigmoid_cols: int) -> np.ndarray:
    """A copy of ``w`` (in the LSTM kernels' column order where ``lstm_d``, its gate width,
    is given) with its first ``sigmoid_cols`` columns halved."""
    w = _lstm_columns(w, lstm_d) if lstm_d is not None else w.copy()
    w[..., :sigmoid_cols] *= 0.5
    return w


def _reading_order(a: np.ndarray) -> np.ndarray:
    """``[dirs, T, ...]`` in time order as ``[T, dirs, ...]`` in each direction's reading order."""
    if a.shape[0] == 1:
        return a.reshape(a.shape[1], 1, *a.shape[2:])
    out = np.empty((a.shape[1], 2, *a.shape[2:]), a.dtype)
    out[:, 0] = a[0]
    out[:, 1] = a[1, ::-1]
    return out


def _project_np(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The input projections of every step and direction, ``[T, dirs, B, G]`` in reading order."""
    steps, batch, d_in = x.shape
    rows = x.reshape(steps * batch, d_in)
    y = np.empty((w.shape[0], rows.shape[0], w.shape[-1]), np.result_type(rows, w))
    for k in range(w.shape[0]):  # plain 2-D products (NumPy's stacked one is slower)
        _product_into(rows, w[k], y[k])
    y += b[:, None, :]
    return _reading_order(y.reshape(w.shape[0], steps, batch, w.shape[-1]))


def _hidden_reading_order(seq: np.ndarray, dirs: int, d: int) -> np.ndarray:
    """``[T, B, dirs * H]`` (time order, directions side by side) as ``[T, dirs, B, H]``."""
    steps, batch = seq.shape[:2]
    return _reading_order(seq.reshape(steps, batch, dirs, d).transpose(2, 0, 1, 3))


def _to_output(dst: np.ndarray, hs: np.ndarray) -> None:
    """Writes ``hs [T, dirs, B, H]`` (reading order) into ``dst [T, B, dirs * H]``."""
    d = hs.shape[-1]
    dst[..., :d] = hs[:, 0]
    if hs.shape[1] == 2:
        dst[..., d:] = hs[::-1, 1]


def _previous(seq: np.ndarray, first: np.ndarray) -> np.ndarray:
    """``[first, seq[0], ..., seq[T - 2]]``: the state each step starts from."""
    prev = np.empty_like(seq)
    prev[0] = first
    prev[1:] = seq[:-1]
    return prev


def _time_order_rows(dg: np.ndarray, k: int) -> np.ndarray:
    """Direction ``k``'s ``[T, B, G]`` slice of ``dg [T, dirs, B, G]``, in time order."""
    return dg[:, k] if k == 0 else dg[::-1, k]


@functools.cache
def _numba_gemm() -> Any:
    """ember's numba GEMM (``ember.backends.fusion.numba_gemm``), or None without numba (an
    optional extra)."""
    try:
        from ember.backends.fusion import numba_gemm
    except ImportError:
        return None
    return numba_gemm if numba_gemm.numba is not None else None


def _product_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, add: bool = False) -> None:
    """``out = a @ b`` (2-D; ``out += a @ b`` where ``add``): by numba's packed GEMM where it
    takes them (on the weight gradients of an LSTM of 256 units over 2048 rows it ran at
    about 1.3x the speed of NumPy's BLAS), else NumPy's. With numba, every product of these
    kernels goes through it where it can: BLAS threads still spinning after a NumPy product
    take the cores its threads need (``rnn_step``'s bidirectional LSTM took 1.8x as long)."""
    gemm = _numba_gemm()
    if (gemm is not None and gemm.supports(a, b) and out.dtype == a.dtype
            and out.flags.c_contiguous):  # fmt: skip
        try:
            if add:
                gemm.matmul(a, b, into=out)
            else:
                gemm.matmul(a, b, empty=lambda shape, dtype: out)
            return
        except gemm.KernelUnsupported:  # an output it cannot add into
            pass
    if add:
        out += a @ b
    else:
        np.matmul(a, b, out=out)


def _ndarray_weight_grads(x, dgates, hprev, w_ih, outputs) -> None:
    """The products after the backward loop, per direction, into ``outputs``: ``dx``,
    ``dW_ih``, ``dW_hh``, ``db`` (each None to skip), ``dgates`` in the columns of ``w_ih``."""
    dx, dw_ih, dw_hh, db = outputs
    steps, batch, d_in = x.shape
    rows = steps * batch
    for k in range(dgates.shape[1]):
        dg = _time_order_rows(dgates, k).reshape(rows, -1)
        if dw_ih is not None:
            _product_into(x.reshape(rows, d_in).T, dg, dw_ih[k])
        if dw_hh is not None:
            _product_into(_time_order_rows(hprev, k).reshape(rows, -1).T, dg, dw_hh[k])
        if db is not None:
            np.sum(dg, axis=0, out=db[k])
        if dx is not None:
            _product_into(dg, w_ih[k].T, dx.reshape(rows, d_in), add=k > 0)


def _flat_views(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    views, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        views.append(flat[start : start + size].reshape(shape))
        start += size
    return views


def _step_product(w: np.ndarray) -> Callable[[np.ndarray, np.ndarray], Any]:
    """``product(h, out)``: ``out = h @ w`` per direction (``h [dirs, B, K]``, ``w [dirs, K,
    N]``, ``out [dirs, B, N]``), for a time loop that multiplies by the same ``w`` at every
    step. With numba, ``w``'s column panels are packed once and each thread keeps its share
    of them (both directions' together) in cache from one step to the next
    (``numba_gemm.matmul_packed``): NumPy's BLAS packs all of ``w`` again for every step's
    few rows, which took 1.5-2.7x as long for an LSTM step's ``[16, 256] @ [256, 1024]``;
    without numba, NumPy's."""
    gemm = _numba_gemm()
    try:
        packed = None if gemm is None else gemm.pack_b(w)
    except gemm.KernelUnsupported:
        packed = None
    if packed is None:
        return lambda h, out: np.matmul(h, w, out=out)

    def product(h: np.ndarray, out: np.ndarray) -> None:
        try:
            gemm.matmul_packed(h, packed, out)
        except gemm.KernelUnsupported:  # an initial state of another dtype, say
            np.matmul(h, w, out=out)

    return product


# numba's disk cache keys the step kernels by this file only, not by the numba_math
# functions they inline: tests/backends/fusion/test_numba_runtime.py checks that this names
# those functions' digest, so that an edit of them renews this file and the cache with it.
MATH_SOURCE_SHA256 = "bbda963f0caec55c"


@functools.cache
def _numba_steps() -> tuple[Any, Any] | None:
    """numba kernels of one LSTM step's element-wise work, forward (float32) and backward
    (any float), or None without numba (an optional extra).

    NumPy's tanh runs one element at a time here (no vector math on this build), and a
    step's dozen separate passes over small arrays cost more than its matrix product; one
    loop per step with the fusion runtime's vectorizable float32 approximations (within
    2.5 ulp, see ``ember.backends.fusion.numba_math``) does all of it at once.
    """
    try:
        import numba

        from ember.backends.fusion.numba_math import fast_sigmoid_f32, fast_tanh_f32
    except ImportError:
        return None

    # Rows of one step ([dirs * B, ...]) and a 1-D inner loop over each gate block's
    # columns: that shape vectorizes; indexing the 3-D arrays directly did not.
    @numba.njit(nogil=True, cache=True, fastmath={"contract"}, error_model="numpy")
    def forward_step(a, hp, c_prev, c_new, h_new, tc_new):  # pragma: no cover - compiled
        """Gates ``a + hp [rows, 4H]`` ([o | i | f | g]: the input and hidden parts) ->
        activations into ``a``, and the new cell, hidden and tanh(cell) ``[rows, H]``."""
        rows, d = c_new.shape
        for r in range(rows):
            row, cp, cn, hn, tn = a[r], c_prev[r], c_new[r], h_new[r], tc_new[r]
            ao, ai, af, ag = row[:d], row[d : 2 * d], row[2 * d : 3 * d], row[3 * d :]
            ho, hi, hf, hg = hp[r, :d], hp[r, d : 2 * d], hp[r, 2 * d : 3 * d], hp[r, 3 * d :]
            for j in range(d):
                o = fast_sigmoid_f32(ao[j] + ho[j])
                i = fast_sigmoid_f32(ai[j] + hi[j])
                f = fast_sigmoid_f32(af[j] + hf[j])
                g = fast_tanh_f32(ag[j] + hg[j])
                ao[j], ai[j], af[j], ag[j] = o, i, f, g
                c = f * cp[j] + i * g
                t = fast_tanh_f32(c)
                cn[j], tn[j], hn[j] = c, t, o * t

    @numba.njit(nogil=True, cache=True, fastmath={"contract"}, error_model="numpy")
    def backward_step(a, c_prev, tc, grad_h, dh, dc_next, dg, one):  # pragma: no cover
        """One step back: ``dh`` (from the later step) plus ``grad_h`` -> the step's gate
        gradients ``dg [rows, 4H]``; ``dc_next`` becomes the previous cell's gradient.
        ``one`` is 1 in the arrays' dtype (a float64 literal would widen float32 math)."""
        rows, d = dh.shape
        for r in range(rows):
            row, out = a[r], dg[r]
            ao, ai, af, ag = row[:d], row[d : 2 * d], row[2 * d : 3 * d], row[3 * d :]
            do, di, df, dgg = out[:d], out[d : 2 * d], out[2 * d : 3 * d], out[3 * d :]
            cp, t_r, gh, dh_r, dc_r = c_prev[r], tc[r], grad_h[r], dh[r], dc_next[r]
            for j in range(d):
                o, i, f, g, t = ao[j], ai[j], af[j], ag[j], t_r[j]
                dhv = dh_r[j] + gh[j]
                dc = dc_r[j] + dhv * o * (one - t * t)
                do[j] = dhv * t * o * (one - o)
                di[j] = dc * g * i * (one - i)
                df[j] = dc * cp[j] * f * (one - f)
                dgg[j] = dc * i * (one - g * g)
                dc_r[j] = dc * f

    return forward_step, backward_step


def _lstm_forward_np(x, h0, c0, wi, wh, b, step):
    """The LSTM loop on NumPy arrays, weights in the kernel's column order, the sigmoid
    gates' halved unless a numba ``step`` does the element-wise work.

    Returns the activations ``[T, dirs, B, 4H]`` (``[o | i | f | g]``), the hidden and
    the cell states ``[T, dirs, B, H]`` and, with ``step``, tanh of the cell states, all
    in reading order.
    """
    acts = _project_np(x, wi, b)
    steps, dirs, batch, width = acts.shape
    d = width // 4
    hs = np.empty((steps, dirs, batch, d), x.dtype)
    cs = np.empty_like(hs)
    hidden_part = np.empty((dirs, batch, width), x.dtype)
    h, c = h0, np.ascontiguousarray(c0)
    recur = _step_product(wh)
    if step is not None:
        tcs = np.empty_like(hs)
        # The kernel works on rows [dirs * B, ...]: views made once, not per step.
        rows = dirs * batch
        acts2, cs2, hs2, tcs2 = (a.reshape(steps, rows, -1) for a in (acts, cs, hs, tcs))
        part2, c2 = hidden_part.reshape(rows, -1), c.reshape(rows, -1)
        for s in range(steps):
            recur(h, hidden_part)
            step(acts2[s], part2, c2, cs2[s], hs2[s], tcs2[s])
            h, c2 = hs[s], cs2[s]
        return acts, hs, cs, tcs
    scratch = np.empty((dirs, batch, d), x.dtype)
    for s in range(steps):
        a = acts[s]
        recur(h, hidden_part)
        a += hidden_part
        np.tanh(a, out=a)
        sig = a[..., : 3 * d]
        sig *= 0.5
        sig += 0.5
        o, i, f, g = (a[..., k * d : (k + 1) * d] for k in range(4))
        c_new, h_new = cs[s], hs[s]
        np.multiply(f, c, out=c_new)
        np.multiply(i, g, out=scratch)
        c_new += scratch
        np.tanh(c_new, out=h_new)
        h_new *= o
        h, c = h_new, c_new
    return acts, hs, cs, None


@_LSTM_SEQUENCE.kernel(NdArray)
def _lstm_sequence_ndarray(B, x, h0, c0, w_ih, w_hh, bias, save):
    if x.dtype.itemsize < 4:  # float16 / bfloat16: NumPy computes those slowly, step by step
        return _lstm_reference(B, x, h0, c0, w_ih, w_hh, bias, save)
    steps, batch, _ = x.shape
    dirs, _, d = h0.shape
    kernels = _numba_steps() if x.dtype == np.float32 else None
    step = None if kernels is None else kernels[0]
    sigmoid_cols = 3 * d if step is None else 0  # the numba step takes σ itself
    weights = (_halved(w, d, sigmoid_cols) for w in (w_ih, w_hh, bias))
    acts, hs, cs, tcs = _lstm_forward_np(x, h0, c0, *weights, step)
    out = np.empty((steps + 1, batch, dirs * d), x.dtype)
    _to_output(out[:steps], hs)
    out[steps] = cs[-1].transpose(1, 0, 2).reshape(batch, dirs * d)
    if save:
        _keep(out, (acts, hs, cs, tcs))
    return out


@_LSTM_SEQUENCE_BACKWARD.kernel(NdArray)
def _lstm_sequence_backward_ndarray(B, grad, x, h0, c0, w_ih, w_hh, bias, out, need_x):
    if x.dtype.itemsize < 4:
        return _lstm_backward_reference(B, grad, x, h0, c0, w_ih, w_hh, bias, out, need_x)
    steps, batch, d_in = x.shape
    dirs, _, d = h0.shape
    kept = _kept(out)
    if kept is not None:
        acts, hs, cs, tcs = kept
    else:  # the forward pass ran elsewhere: its activations again, from the hidden states
        hs = _hidden_reading_order(out[:steps], dirs, d)
        acts = _project_np(x, _halved(w_ih, d, 3 * d), _halved(bias, d, 3 * d))
        acts += np.matmul(_previous(hs, h0), _halved(w_hh, d, 3 * d)[None])
        np.tanh(acts, out=acts)
        acts[..., : 3 * d] *= 0.5
        acts[..., : 3 * d] += 0.5
        cs = np.empty_like(hs)
        c = c0
        for s in range(steps):
            _, i, f, g = (acts[s, ..., k * d : (k + 1) * d] for k in range(4))
            np.multiply(f, c, out=cs[s])
            cs[s] += i * g
            c = cs[s]
        tcs = None
    grad_h = _hidden_reading_order(grad[:steps], dirs, d)
    w_t = np.ascontiguousarray(_lstm_columns(w_hh, d).transpose(0, 2, 1))  # [dirs, 4H, H]
    dgates = np.empty((steps, dirs, batch, 4 * d), x.dtype)
    dh = np.zeros((dirs, batch, d), x.dtype)
    dc_next = grad[steps].reshape(batch, dirs, d).transpose(1, 0, 2).copy()  # written below
    kernels = _numba_steps()
    if kernels is not None:
        tcs = np.tanh(cs) if tcs is None else tcs
        rows, one = dirs * batch, x.dtype.type(1.0)
        per_step = (acts, _previous(cs, c0), tcs, np.ascontiguousarray(grad_h), dgates)
        acts2, cprev2, tcs2, grad2, dgates2 = (a.reshape(steps, rows, -1) for a in per_step)
        dh2, dc2 = dh.reshape(rows, -1), dc_next.reshape(rows, -1)
        recur = _step_product(w_t)
        for s in range(steps - 1, -1, -1):
            kernels[1](acts2[s], cprev2[s], tcs2[s], grad2[s], dh2, dc2, dgates2[s], one)
            recur(dgates[s], dh)
    else:
        _lstm_backward_loop(acts, cs, c0, grad_h, w_t, dh, dc_next, dgates)
    flat = np.empty(
        steps * batch * d_in + 2 * dirs * batch * d + dirs * (d_in + d + 1) * 4 * d, x.dtype
    )
    shapes = [x.shape, h0.shape, h0.shape, w_ih.shape, w_hh.shape, bias.shape]
    dx, dh0, dc0, dw_ih, dw_hh, db = _flat_views(flat, shapes)
    dh0[...] = dh
    dc0[...] = dc_next
    if not need_x:
        dx[...] = 0.0
    kernel_order = (np.empty_like(dw_ih), np.empty_like(dw_hh), np.empty_like(db))
    _ndarray_weight_grads(x, dgates, _previous(hs, h0), _lstm_columns(w_ih, d),
                          (dx if need_x else None, *kernel_order))  # fmt: skip
    for dst, src in zip((dw_ih, dw_hh, db), kernel_order, strict=True):
        dst[...] = _lstm_columns(src, -d)
    return flat


def _lstm_backward_loop(acts, cs, c0, grad_h, w_t, dh, dc_next, dgates) -> None:
    """The LSTM's backward time loop in NumPy (without numba): ``dgates`` of every step."""
    steps, dirs, batch, width = acts.shape
    d = width // 4
    o, i, f, g = (acts[..., k * d : (k + 1) * d] for k in range(4))
    # Everything that does not depend on the gradient, for all steps at once: per step the
    # loop is then a few multiplications and one product with W_hh.
    tc = np.tanh(cs)
    coef = np.empty((steps, dirs, batch, 4, d), acts.dtype)  # d gates = [dh | dc dc dc] * coef
    np.multiply(tc, o * (1 - o), out=coef[..., 0, :])
    np.multiply(g, i * (1 - i), out=coef[..., 1, :])
    np.multiply(_previous(cs, c0), f * (1 - f), out=coef[..., 2, :])
    np.multiply(i, 1 - g * g, out=coef[..., 3, :])
    through_tanh = np.multiply(tc, tc, out=tc)  # dc += dh * o * (1 - tanh²(c))
    np.subtract(1.0, through_tanh, out=through_tanh)
    through_tanh *= o
    dc = np.empty_like(dh)
    recur = _step_product(w_t)
    for s in range(steps - 1, -1, -1):
        dh += grad_h[s]
        np.multiply(dh, through_tanh[s], out=dc)
        dc += dc_next
        dg = dgates[s].reshape(dirs, batch, 4, d)
        np.multiply(dh, coef[s, ..., 0, :], out=dg[..., 0, :])
        np.multiply(dc[..., None, :], coef[s, ..., 1:, :], out=dg[..., 1:, :])
        np.multiply(dc, f[s], out=dc_next)
        recur(dgates[s], dh)


def _gru_forward_np(x, h0, wi, wh, bi, bh):
    """The GRU loop on NumPy arrays, the ``r, z`` columns halved.

    Returns ``[r | z | n | W_hn h + b_hn]`` per step ``[T, dirs, B, 4H]`` and the hidden
    states ``[T, dirs, B, H]``, in reading order.
    """
    xp = _project_np(x, wi, bi)
    steps, dirs, batch, width = xp.shape
    d = width // 3
    saved = np.empty((steps, dirs, batch, 4 * d), x.dtype)
    hs = np.empty((steps, dirs, batch, d), x.dtype)
    hp = np.empty((dirs, batch, 3 * d), x.dtype)
    h = h0
    recur = _step_product(wh)
    for s in range(steps):
        a = saved[s]
        recur(h, hp)
        hp += bh[:, None, :]
        rz, n, hp_n = a[..., : 2 * d], a[..., 2 * d : 3 * d], a[..., 3 * d :]
        np.add(xp[s, ..., : 2 * d], hp[..., : 2 * d], out=rz)
        np.tanh(rz, out=rz)
        rz *= 0.5
        rz += 0.5
        hp_n[...] = hp[..., 2 * d :]
        np.multiply(a[..., :d], hp_n, out=n)
        n += xp[s, ..., 2 * d :]
        np.tanh(n, out=n)
        h_new = hs[s]
        np.subtract(h, n, out=h_new)
        h_new *= a[..., d : 2 * d]
        h_new += n
        h = h_new
    return saved, hs


@_GRU_SEQUENCE.kernel(NdArray)
def _gru_sequence_ndarray(B, x, h0, w_ih, w_hh, b_ih, b_hh, save):
    if x.dtype.itemsize < 4:
        return _gru_reference(B, x, h0, w_ih, w_hh, b_ih, b_hh, save)
    steps, batch, _ = x.shape
    dirs, _, d = h0.shape
    saved, hs = _gru_forward_np(x, h0, *(_halved(w, None, 2 * d) for w in (w_ih, w_hh, b_ih, b_hh)))
    out = np.empty((steps, batch, dirs * d), x.dtype)
    _to_output(out, hs)
    if save:
        _keep(out, (saved, hs))
    return out


@_GRU_SEQUENCE_BACKWARD.kernel(NdArray)
def _gru_sequence_backward_ndarray(B, grad, x, h0, w_ih, w_hh, b_ih, b_hh, out, need_x):
    if x.dtype.itemsize < 4:
        return _gru_backward_reference(B, grad, x, h0, w_ih, w_hh, b_ih, b_hh, out, need_x)
    steps, batch, _ = x.shape
    dirs, _, d = h0.shape
    kept = _kept(out)
    if kept is not None:
        saved, hs = kept
        hprev = _previous(hs, h0)
    else:  # the gates again, from the hidden states: no sequential dependency left
        hs = _hidden_reading_order(out, dirs, d)
        hprev = _previous(hs, h0)
        xp = _project_np(x, _halved(w_ih, None, 2 * d), _halved(b_ih, None, 2 * d))
        hp = np.matmul(hprev, w_hh[None])
        hp += b_hh[:, None, :]
        saved = np.empty((steps, dirs, batch, 4 * d), x.dtype)
        rz = saved[..., : 2 * d]
        np.add(xp[..., : 2 * d], 0.5 * hp[..., : 2 * d], out=rz)
        np.tanh(rz, out=rz)
        rz *= 0.5
        rz += 0.5
        saved[..., 3 * d :] = hp[..., 2 * d :]
        saved[..., 2 * d : 3 * d] = np.tanh(saved[..., :d] * hp[..., 2 * d :] + xp[..., 2 * d :])
    r, z, n, hp_n = (saved[..., k * d : (k + 1) * d] for k in range(4))
    # Per step: d x-gates = dh * coef_x, d h-gates = dh * coef_h (they differ in the n block).
    coef_x = np.empty((steps, dirs, batch, 3, d), x.dtype)
    np.multiply(1 - z, 1 - n * n, out=coef_x[..., 2, :])  # dn = dh (1 - z)(1 - n²)
    np.multiply(coef_x[..., 2, :], hp_n * r * (1 - r), out=coef_x[..., 0, :])
    np.multiply(hprev - n, z * (1 - z), out=coef_x[..., 1, :])
    coef_h = coef_x.copy()
    coef_h[..., 2, :] *= r
    grad_h = _hidden_reading_order(grad, dirs, d)
    w_t = np.ascontiguousarray(w_hh.transpose(0, 2, 1))
    dxg = np.empty((steps, dirs, batch, 3 * d), x.dtype)
    dhg = np.empty_like(dxg)
    dh = np.zeros((dirs, batch, d), x.dtype)
    direct = np.empty_like(dh)
    recur = _step_product(w_t)
    for s in range(steps - 1, -1, -1):
        dh += grad_h[s]
        np.multiply(dh[..., None, :], coef_x[s], out=dxg[s].reshape(dirs, batch, 3, d))
        np.multiply(dh[..., None, :], coef_h[s], out=dhg[s].reshape(dirs, batch, 3, d))
        np.multiply(dh, z[s], out=direct)
        recur(dhg[s], dh)
        dh += direct
    sizes = [x.shape, h0.shape, w_ih.shape, w_hh.shape, b_ih.shape, b_hh.shape]
    flat = np.empty(sum(int(np.prod(s)) for s in sizes), x.dtype)
    dx, dh0, dw_ih, dw_hh, db_ih, db_hh = _flat_views(flat, sizes)
    dh0[...] = dh
    if not need_x:
        dx[...] = 0.0
    _ndarray_weight_grads(x, dxg, hprev, w_ih, (dx if need_x else None, dw_ih, None, db_ih))
    _ndarray_weight_grads(x, dhg, hprev, w_ih, (None, None, dw_hh, db_hh))
    return flat


# ---------------------------------------------------------------- Torch kernels
def _install_torch_kernels() -> None:
    try:
        import torch

        from ember.backend import Torch
    except ImportError:  # torch is optional
        return

    def flat_weights(w_ih, w_hh, *biases) -> list:
        """torch's per-direction ``[w_ih, w_hh, b_ih, b_hh]``, weights ``[G * H, in]``."""
        params = []
        for k in range(w_ih.shape[0]):
            params += [w_ih[k].t().contiguous(), w_hh[k].t().contiguous()]
            params += [b[k] for b in biases]
        return params

    def reading_order(a):  # [dirs, T, ...] -> [T, dirs, ...], direction 1 reversed
        return torch.stack([a[0], a[1].flip(0)], 1) if a.shape[0] == 2 else a.transpose(0, 1)

    def hidden_reading_order(seq, dirs, d):
        steps, batch = seq.shape[:2]
        return reading_order(seq.reshape(steps, batch, dirs, d).permute(2, 0, 1, 3))

    def per_direction_mm(a, w):
        """``a [T, dirs, B, K] @ w [dirs, K, N]`` as 2-D products (a broadcast 4-D matmul
        runs one small product per step)."""
        steps, dirs, batch, k = a.shape
        parts = [(a[:, d].reshape(-1, k) @ w[d]).reshape(steps, 1, batch, -1) for d in range(dirs)]
        return parts[0] if dirs == 1 else torch.cat(parts, 1)

    def step_mm(c, a, w):
        """``c + a @ w`` for ``[dirs, rows, K] @ [dirs, K, N]`` (c may be None): one 2-D
        product for one direction, which runs faster than a batched one of batch 1."""
        if a.shape[0] == 1:
            out = a[0] @ w[0] if c is None else torch.addmm(c[0], a[0], w[0])
            return out[None]
        return torch.bmm(a, w) if c is None else torch.baddbmm(c, a, w)

    def previous(seq, first):
        return torch.cat([first[None], seq[:-1]], 0)

    def project(x, w, b):  # [T, dirs, B, G] in reading order
        steps, batch, d_in = x.shape
        y = torch.baddbmm(
            b[:, None, :], x.reshape(1, steps * batch, d_in).expand(w.shape[0], -1, -1), w
        )
        return reading_order(y.reshape(w.shape[0], steps, batch, w.shape[-1]))

    def weight_grads(x, dgates, hprev, w_ih, need_x, need_ih=True, need_hh=True):
        """``dx, dW_ih, dW_hh, db`` from ``dgates [T, dirs, B, G]`` (reading order); the
        ``need_*`` flags skip products nobody reads (None in their place)."""
        steps, batch, d_in = x.shape
        rows = steps * batch
        dx, dw_ih, dw_hh, db = None, [], [], []
        for k in range(dgates.shape[1]):
            # Sums over the steps: any order will do, so each direction's reading order.
            dg = dgates[:, k].reshape(rows, -1)
            if need_ih:
                dw_ih.append((x if k == 0 else x.flip(0)).reshape(rows, d_in).t() @ dg)
            if need_hh:
                dw_hh.append(hprev[:, k].reshape(rows, -1).t() @ dg)
            db.append(dg.sum(0))
            if need_x:
                dxk = (dg @ w_ih[k].t()).reshape(steps, batch, d_in)
                dxk = dxk if k == 0 else dxk.flip(0)
                dx = dxk if dx is None else dx + dxk
        stacked = [torch.stack(parts) if parts else None for parts in (dw_ih, dw_hh, db)]
        return dx, *stacked

    def flat(x, parts) -> torch.Tensor:
        parts = [torch.zeros_like(x) if parts[0] is None else parts[0], *parts[1:]]
        return torch.cat([p.reshape(-1) for p in parts])

    def use_onednn(x, save) -> bool:
        # aten's oneDNN layer (what nn.LSTM runs on the CPU) and its backward kernel: float32
        # only, and only worth its workspace when a gradient is wanted.
        return (save and x.device.type == "cpu" and x.dtype == torch.float32
                and torch.backends.mkldnn.is_available()
                and hasattr(torch.ops.aten, "mkldnn_rnn_layer"))  # fmt: skip

    @_LSTM_SEQUENCE.kernel(Torch)
    def _lstm_sequence_torch(B, x, h0, c0, w_ih, w_hh, bias, save):
        batch = x.shape[1]
        dirs, _, d = h0.shape
        params = flat_weights(w_ih, w_hh, bias, torch.zeros_like(bias))
        # oneDNN reads its operands' memory as dense: a batch-first input arrives transposed.
        x, h0, c0 = x.contiguous(), h0.contiguous(), c0.contiguous()
        if use_onednn(x, save):
            # Grad mode on (nothing here requires a gradient, so torch records nothing): the
            # layer returns no workspace for its backward kernel without it.
            with torch.enable_grad():
                layers = [torch.ops.aten.mkldnn_rnn_layer(
                    x, *params[4 * k : 4 * k + 4], h0[k], c0[k], k == 1, [], 2, d, 1, True,
                    dirs == 2, False, True) for k in range(dirs)]  # fmt: skip
            seq = torch.cat([layer[0] for layer in layers], -1)
            c_last = torch.cat([layer[2] for layer in layers], -1)
            out = torch.cat([seq, c_last[None]], 0)
            _keep(out, (params, layers))
            return out
        with torch.no_grad():
            # cuDNN on CUDA; elsewhere aten's own loop (oneDNN for float32 CPU inference)
            seq, _, c_n = torch._VF.lstm(x, (h0, c0), params, True, 1, 0.0, False, dirs == 2, False)
            return torch.cat([seq, c_n.transpose(0, 1).reshape(1, batch, dirs * d)], 0)

    @_LSTM_SEQUENCE_BACKWARD.kernel(Torch)
    def _lstm_sequence_backward_torch(B, grad, x, h0, c0, w_ih, w_hh, bias, out, need_x):
        steps, batch, _ = x.shape
        dirs, _, d = h0.shape
        kept = _kept(out)
        x, h0, c0 = x.contiguous(), h0.contiguous(), c0.contiguous()
        with torch.no_grad():
            if kept is not None:
                params, layers = kept
                parts = [[], [], [], [], [], []]
                for k, (y, hy, cy, workspace) in enumerate(layers):
                    grads = torch.ops.aten.mkldnn_rnn_layer_backward(
                        x, *params[4 * k : 4 * k + 4], h0[k], c0[k], y, hy, cy,
                        grad[:steps, :, k * d : (k + 1) * d].contiguous(), torch.zeros_like(hy),
                        grad[steps, :, k * d : (k + 1) * d].contiguous(), k == 1, 2, d, 1, True,
                        True, dirs == 2, [], False, workspace)  # fmt: skip
                    dx, dwi, dwh, db, _, dh0, dc0 = grads
                    for part, value in zip(
                        parts, (dx, dh0, dc0, dwi.t(), dwh.t(), db), strict=True
                    ):
                        part.append(value)
                dx = (parts[0][0] if dirs == 1 else parts[0][0] + parts[0][1]) if need_x else None
                return flat(x, [dx, *(torch.stack(p) for p in parts[1:])])
            # The activations again from the hidden states, then the same loop as NdArray's.
            hs = hidden_reading_order(out[:steps], dirs, d)
            hprev = previous(hs, h0)
            gates = project(x, w_ih, bias) + per_direction_mm(hprev, w_hh)
            i, f, o = (torch.sigmoid(gates[..., k * d : (k + 1) * d]) for k in (0, 1, 3))
            g = torch.tanh(gates[..., 2 * d : 3 * d])
            cs = torch.empty_like(hs)
            c = c0
            for s in range(steps):
                c = cs[s] = torch.addcmul(f[s] * c, i[s], g[s])
            tc = torch.tanh(cs)
            through_tanh = o * (1 - tc * tc)
            coef = torch.stack([g * i * (1 - i), previous(cs, c0) * f * (1 - f),
                                i * (1 - g * g)], -2)  # fmt: skip
            coef_o = tc * o * (1 - o)
            grad_h = hidden_reading_order(grad[:steps], dirs, d)
            w_t = w_hh.transpose(1, 2).contiguous()  # a transposed view: a slow bmm per step
            dgates = torch.empty(steps, dirs, batch, 4, d, dtype=x.dtype, device=x.device)
            dh = torch.zeros_like(h0)
            dc_next = grad[steps].reshape(batch, dirs, d).transpose(0, 1)
            for s in range(steps - 1, -1, -1):
                dh = dh + grad_h[s]
                dc = torch.addcmul(dc_next, dh, through_tanh[s])
                dg = dgates[s]
                dg[..., :3, :] = dc[..., None, :] * coef[s]
                dg[..., 3, :] = dh * coef_o[s]
                dc_next = dc * f[s]
                dh = step_mm(None, dg.reshape(dirs, batch, 4 * d), w_t)
            dgates = dgates.reshape(steps, dirs, batch, 4 * d)
            dx, dw_ih, dw_hh, db = weight_grads(x, dgates, hprev, w_ih, need_x)
            return flat(x, [dx, dh, dc_next, dw_ih, dw_hh, db])

    @_GRU_SEQUENCE.kernel(Torch)
    def _gru_sequence_torch(B, x, h0, w_ih, w_hh, b_ih, b_hh, save):
        params = flat_weights(w_ih, w_hh, b_ih, b_hh)
        x, h0 = x.contiguous(), h0.contiguous()
        with torch.no_grad():  # cuDNN on CUDA, aten's loop on the CPU
            return torch._VF.gru(x, h0, params, True, 1, 0.0, False, h0.shape[0] == 2, False)[0]

    @_GRU_SEQUENCE_BACKWARD.kernel(Torch)
    def _gru_sequence_backward_torch(B, grad, x, h0, w_ih, w_hh, b_ih, b_hh, out, need_x):
        steps = x.shape[0]
        dirs, _, d = h0.shape
        with torch.no_grad():
            # The gates of every step at once, from the hidden states: two large products.
            hs = hidden_reading_order(out, dirs, d)
            hprev = previous(hs, h0)
            xp = project(x, w_ih, b_ih)
            hp = per_direction_mm(hprev, w_hh) + b_hh[:, None, :]
            rz = torch.sigmoid(xp[..., : 2 * d] + hp[..., : 2 * d])
            r, z = rz[..., :d], rz[..., d:]
            hp_n = hp[..., 2 * d :]
            n = torch.tanh(torch.addcmul(xp[..., 2 * d :], r, hp_n))
            dn_coef = (1 - z) * (1 - n * n)
            coef_x = torch.stack(
                [dn_coef * hp_n * r * (1 - r), (hprev - n) * z * (1 - z), dn_coef], -2
            )
            coef_h = coef_x.clone()
            coef_h[..., 2, :] *= r
            grad_h = hidden_reading_order(grad, dirs, d)
            w_t = w_hh.transpose(1, 2).contiguous()  # a transposed view: a slow bmm per step
            dxg = torch.empty_like(coef_x)
            dhg = torch.empty_like(coef_x)
            dh = torch.zeros_like(h0)
            for s in range(steps - 1, -1, -1):
                dh = dh + grad_h[s]
                torch.mul(dh[..., None, :], coef_x[s], out=dxg[s])
                torch.mul(dh[..., None, :], coef_h[s], out=dhg[s])
                dh = step_mm(dh * z[s], dhg[s].reshape(dirs, -1, 3 * d), w_t)
            shape = (steps, dirs, -1, 3 * d)
            dx, dw_ih, _, db_ih = weight_grads(x, dxg.reshape(shape), hprev, w_ih, need_x,
                                               need_hh=False)  # fmt: skip
            _, _, dw_hh, db_hh = weight_grads(x, dhg.reshape(shape), hprev, w_ih, False,
                                              need_ih=False)  # fmt: skip
            return flat(x, [dx, dh, dw_ih, dw_hh, db_ih, db_hh])


_install_torch_kernels()


# ---------------------------------------------------------------- public functions
def _wants_grad(*tensors: Tensor) -> bool:
    return any(t.is_require_grad() for t in tensors)


def lstm_sequence(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor,
                  bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """A whole LSTM layer, every step and direction, as a single op (forward and backward).

    At each step ``t`` of each direction, with ``σ`` the sigmoid, ``⊙`` the element-wise
    product and the gate blocks in PyTorch's order ``[i | f | g | o]``::

        i, f, g, o = split(x_t @ w_ih + bias + h_{t-1} @ w_hh)
        c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g)
        h_t = σ(o) ⊙ tanh(c_t)

    Direction 1 (when ``dirs`` is 2) reads the sequence from its last step to its first.

    Args:
        x: the input sequence, time first.
        h0, c0: the initial hidden and cell state of each direction.
        w_ih, w_hh: the input and hidden weights of each direction, gates side by side.
        bias: both biases of each direction, summed (``b_ih + b_hh``).

    Shape:
        - x: ``[seq, batch, d_input]`` with ``seq >= 1``; h0, c0: ``[dirs, batch, d_hidden]``;
          w_ih: ``[dirs, d_input, 4 * d_hidden]``; w_hh: ``[dirs, d_hidden, 4 * d_hidden]``;
          bias: ``[dirs, 4 * d_hidden]``; ``dirs`` is 1 or 2.
        - Output: the hidden states ``[seq, batch, dirs * d_hidden]`` (time order, the
          directions side by side, as PyTorch's ``nn.LSTM``), and the final hidden and
          cell states ``[dirs, batch, d_hidden]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.rnn_sequence import lstm_sequence
        >>> zeros = Tensor.zeros([1, 2, 3])
        >>> hs, h_n, c_n = lstm_sequence(Tensor.ones([5, 2, 4]), zeros, zeros,
        ...                              Tensor.zeros([1, 4, 12]), Tensor.zeros([1, 3, 12]),
        ...                              Tensor.ones([1, 12]))
        >>> hs.shape, h_n.shape, round(c_n[0, 0, 0].item(), 4)
        ((5, 2, 3), (1, 2, 3), 1.6379)
    """
    save = _wants_grad(x, h0, c0, w_ih, w_hh, bias)
    packed = _LSTM_SEQUENCE(x, h0, c0, w_ih, w_hh, bias, save)
    steps = x.shape[0]
    return packed.narrow(0, 0, steps), _final(packed, steps, h0), _final_cell(packed, steps, h0)


def _final(seq: Tensor, steps: int, h0: Tensor) -> Tensor:
    """Each direction's last hidden state ``[dirs, batch, H]`` from the rows of the output:
    direction 0 ends at the last step, direction 1 at the first."""
    dirs, _, d = h0.shape
    last = seq.narrow(0, steps - 1, 1).narrow(2, 0, d)
    if dirs == 1:
        return last
    return Tensor.cat([last, seq.narrow(0, 0, 1).narrow(2, d, d)], 0)


def _final_cell(packed: Tensor, steps: int, h0: Tensor) -> Tensor:
    dirs, batch, d = h0.shape
    return packed.narrow(0, steps, 1).reshape([batch, dirs, d]).swap_dims(0, 1)


def gru_sequence(x: Tensor, h0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
                 b_hh: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
    """A whole GRU layer (reset gate after the hidden product, as PyTorch's ``nn.GRU``),
    every step and direction, as a single op (forward and backward).

    At each step ``t``, with ``σ`` the sigmoid, ``⊙`` the element-wise product, the gate
    blocks in PyTorch's order ``[r | z | n]``, ``xg = x_t @ w_ih + b_ih`` and
    ``hg = h_{t-1} @ w_hh + b_hh``::

        r = σ(xg_r + hg_r),  z = σ(xg_z + hg_z),  n = tanh(xg_n + r ⊙ hg_n)
        h_t = (1 - z) ⊙ n + z ⊙ h_{t-1}

    Direction 1 (when ``dirs`` is 2) reads the sequence from its last step to its first.

    Args:
        x: the input sequence, time first.
        h0: the initial hidden state of each direction.
        w_ih, w_hh: the input and hidden weights of each direction, gates side by side.
        b_ih, b_hh: the input and hidden biases of each direction.

    Shape:
        - x: ``[seq, batch, d_input]`` with ``seq >= 1``; h0: ``[dirs, batch, d_hidden]``;
          w_ih: ``[dirs, d_input, 3 * d_hidden]``; w_hh: ``[dirs, d_hidden, 3 * d_hidden]``;
          b_ih, b_hh: ``[dirs, 3 * d_hidden]``; ``dirs`` is 1 or 2.
        - Output: the hidden states ``[seq, batch, dirs * d_hidden]`` and the final hidden
          state ``[dirs, batch, d_hidden]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.rnn_sequence import gru_sequence
        >>> hs, h_n = gru_sequence(Tensor.ones([5, 2, 4]), Tensor.ones([1, 2, 3]),
        ...                        Tensor.zeros([1, 4, 9]), Tensor.zeros([1, 3, 9]),
        ...                        Tensor.zeros([1, 9]), Tensor.zeros([1, 9]))
        >>> hs.shape, h_n.shape, round(h_n[0, 0, 0].item(), 4)
        ((5, 2, 3), (1, 2, 3), 0.0312)
    """
    save = _wants_grad(x, h0, w_ih, w_hh, b_ih, b_hh)
    seq = _GRU_SEQUENCE(x, h0, w_ih, w_hh, b_ih, b_hh, save)
    return seq, _final(seq, x.shape[0], h0)
