"""Fused recurrent cells: one LSTM or GRU time step as a single op.

A recurrent layer runs the same dozen small element-wise ops at every time step.
Through the Autodiff decorator each of them is a graph node with its own Python
overhead, forward and backward, which dominates the step of a small layer. The
ops here do one whole step in one call, with fast NumPy and PyTorch kernels, and
a backward rule that gives every input's gradient at once.

Autodiff tracks the first output of an op only, so each cell op returns one
packed tensor whose last dim holds the new state and the gate activations side
by side; the backward rule reads the activations from there instead of
recomputing the step. :func:`lstm_cell` and :func:`gru_cell` slice the new state
out of it, so only those columns ever receive a gradient.

=========  ===================================================================
op         columns of the packed output, in blocks of ``d_hidden``
=========  ===================================================================
lstm_cell  ``h' | c' | σ(i) | σ(f) | tanh(g) | σ(o)``
gru_cell   ``h' | r | z | n | W_hn h + b_hn`` (reset after the hidden product)
=========  ===================================================================

Each op has a reference from the backend primitives (every backend runs and
differentiates it) and kernels for NdArray and Torch. Its backward rule calls a
second op, ``<cell>_backward``, for the element-wise part of the gradient (again
with a reference and kernels) and does the two matrix products itself.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.backend import AVal, NdArray, custom_op, rules
from ember.backend.errors import DTypeError, ShapeError, fmt_shape
from ember.backends.autodiff import backward, unbroadcast
from ember.tensor import Tensor


# ---------------------------------------------------------------- shape rules
def _cell_shape(op: str, x: AVal, h: AVal, w: AVal, gates: int, others: tuple[AVal, ...]) -> tuple:
    """Checks the operands of a cell and gives the broadcast ``[..., batch]`` dims."""
    if len(h.shape) < 2 or len(x.shape) < 2:
        raise ShapeError(
            f"{op}: the input projection and the hidden state need rank >= 2 ([..., batch, "
            f"features]), got {fmt_shape(x.shape)} and {fmt_shape(h.shape)}"
        )
    d = h.shape[-1]
    if x.shape[-1] != gates * d:
        raise ShapeError(
            f"{op}: expected an input projection of {gates} * d_hidden = {gates * d} features "
            f"(d_hidden {d} from the hidden state {fmt_shape(h.shape)}), got {fmt_shape(x.shape)}"
        )
    if len(w.shape) < 2 or tuple(w.shape[-2:]) != (d, gates * d):
        raise ShapeError(
            f"{op}: expected a hidden weight of shape [..., {d}, {gates * d}] "
            f"([..., d_hidden, {gates} * d_hidden]), got {fmt_shape(w.shape)}"
        )
    for other in (h, w, *others):
        if other.dtype is not x.dtype:
            raise DTypeError(f"{op}: operands have different dtypes {x.dtype} and {other.dtype}")
    batch = rules.broadcast_shapes(op, x.shape[:-1], rules.matmul(op, h, w).shape[:-1])
    for other in others:
        batch = rules.broadcast_shapes(op, batch, other.shape[:-1])
    return batch, d


def _lstm_rule(op: str, x: AVal, h: AVal, c: AVal, w: AVal) -> AVal:
    if tuple(c.shape[-1:]) != tuple(h.shape[-1:]):
        raise ShapeError(
            f"{op}: the cell state {fmt_shape(c.shape)} and the hidden state "
            f"{fmt_shape(h.shape)} need the same last dim (d_hidden)"
        )
    batch, d = _cell_shape(op, x, h, w, 4, (c,))
    return AVal((*batch, 6 * d), x.dtype)


def _gru_rule(op: str, x: AVal, h: AVal, w: AVal, b: AVal) -> AVal:
    batch, d = _cell_shape(op, x, h, w, 3, (b,))
    if tuple(b.shape[-1:]) != (3 * d,):
        raise ShapeError(
            f"{op}: expected a hidden bias of {3 * d} (3 * d_hidden) features, "
            f"got {fmt_shape(b.shape)}"
        )
    return AVal((*batch, 5 * d), x.dtype)


def _lstm_backward_rule(op: str, grad: AVal, c: AVal, out: AVal) -> AVal:
    return AVal((*out.shape[:-1], 5 * c.shape[-1]), out.dtype)


def _gru_backward_rule(op: str, grad: AVal, h: AVal, out: AVal) -> AVal:
    return AVal((*out.shape[:-1], 7 * h.shape[-1]), out.dtype)


# ---------------------------------------------------------------- primitive helpers
def _cols(B, x: Any, start: int, stop: int) -> Any:
    """Columns ``start:stop`` of the last dim."""
    shape = B.shape(x)
    ranges = tuple((0, s, 1) for s in shape[:-1]) + ((start, stop, 1),)
    return B.float_slice(x, ranges)


def _cat_last(B, parts: list) -> Any:
    """Concatenates along the last dim, broadcasting the leading dims first."""
    shapes = [B.shape(p) for p in parts]
    lead: tuple = ()
    for shape in shapes:
        lead = rules.broadcast_shapes("cat", lead, tuple(shape[:-1]))
    parts = [
        p if tuple(s[:-1]) == lead else B.float_expand(p, (*lead, s[-1]))
        for p, s in zip(parts, shapes, strict=True)
    ]
    return B.float_cat(parts, len(lead))


def _one_minus(B, x: Any) -> Any:
    return B.float_add_scalar(B.float_neg(x), 1.0)


def _swap_last(B, x: Any) -> Any:
    rank = len(B.shape(x))
    return B.float_permute(x, (*range(rank - 2), rank - 1, rank - 2))


def _weight_grad(B, h: Any, dgates: Any, w_shape: tuple[int, ...]) -> Any:
    """``h^T @ dgates`` summed over the dims the weight was broadcast along."""
    h_shape, g_shape = B.shape(h), B.shape(dgates)
    if tuple(h_shape[:-1]) != tuple(g_shape[:-1]):  # h was broadcast against the gates
        h = B.float_expand(h, (*g_shape[:-1], h_shape[-1]))
    elif len(w_shape) == 2:  # one product over every batch row: nothing to sum afterwards
        rows = math.prod(g_shape[:-1])
        h = B.float_reshape(h, (rows, h_shape[-1]))
        dgates = B.float_reshape(dgates, (rows, g_shape[-1]))
    return unbroadcast(B, B.float_matmul(_swap_last(B, h), dgates), w_shape)


# ---------------------------------------------------------------- LSTM
def _lstm_reference(B, x, h, c, w):
    """One LSTM step from primitives: the definition the kernels must match."""
    d = B.shape(h)[-1]
    gates = B.float_add(x, B.float_matmul(h, w))
    act = B.sigmoid(gates)  # the candidate's block is replaced by its tanh below
    i, f, o = _cols(B, act, 0, d), _cols(B, act, d, 2 * d), _cols(B, act, 3 * d, 4 * d)
    g = B.float_tanh(_cols(B, gates, 2 * d, 3 * d))
    c_new = B.float_add(B.float_mul(f, c), B.float_mul(i, g))
    h_new = B.float_mul(o, B.float_tanh(c_new))
    return _cat_last(B, [h_new, c_new, i, f, g, o])


def _lstm_backward_reference(B, grad, c, out):
    """The element-wise part of the LSTM step's gradient: ``[d gates | d c]``."""
    d = B.shape(c)[-1]
    dh, dc_new = _cols(B, grad, 0, d), _cols(B, grad, d, 2 * d)
    c_new = _cols(B, out, d, 2 * d)
    i, f, g, o = (_cols(B, out, k * d, (k + 1) * d) for k in range(2, 6))
    tc = B.float_tanh(c_new)
    dc = B.float_add(dc_new, B.float_mul(B.float_mul(dh, o), _one_minus(B, B.float_mul(tc, tc))))

    def through_sigmoid(grad_act, s):
        return B.float_mul(grad_act, B.float_mul(s, _one_minus(B, s)))

    di = through_sigmoid(B.float_mul(dc, g), i)
    df = through_sigmoid(B.float_mul(dc, c), f)
    dg = B.float_mul(B.float_mul(dc, i), _one_minus(B, B.float_mul(g, g)))
    do = through_sigmoid(B.float_mul(dh, tc), o)
    return _cat_last(B, [di, df, dg, do, B.float_mul(dc, f)])


_LSTM_CELL = custom_op("lstm_cell", ("x", "hidden", "cell", "w_hh"), _lstm_rule, _lstm_reference)
_LSTM_CELL_BACKWARD = custom_op(
    "lstm_cell_backward", ("grad", "cell", "out"), _lstm_backward_rule, _lstm_backward_reference
)


@_LSTM_CELL.kernel(NdArray)
def _lstm_ndarray(B, x, h, c, w):
    if x.dtype.itemsize < 4:  # float16 / bfloat16: NumPy computes those slowly, step by step
        return _lstm_reference(B, x, h, c, w)
    d = h.shape[-1]
    gates = np.matmul(h, w)
    if gates.shape == np.broadcast_shapes(gates.shape, x.shape):
        gates += x
    else:
        gates = gates + x
    out = np.empty((*np.broadcast_shapes(gates.shape[:-1], c.shape[:-1]), 6 * d), x.dtype)
    act = out[..., 2 * d :]
    # σ(x) = (1 + tanh(x / 2)) / 2: no overflow for large |x|, unlike 1 / (1 + exp(-x)).
    np.multiply(gates, 0.5, out=act)
    np.tanh(act, out=act)
    act *= 0.5
    act += 0.5
    i, f, g, o = (out[..., k * d : (k + 1) * d] for k in range(2, 6))
    np.tanh(gates[..., 2 * d : 3 * d], out=g)
    h_new, c_new = out[..., :d], out[..., d : 2 * d]
    np.multiply(f, c, out=c_new)
    np.multiply(i, g, out=h_new)  # h' is scratch until its turn
    c_new += h_new
    np.tanh(c_new, out=h_new)
    h_new *= o
    return out


@_LSTM_CELL_BACKWARD.kernel(NdArray)
def _lstm_backward_ndarray(B, grad, c, out):
    if out.dtype.itemsize < 4:
        return _lstm_backward_reference(B, grad, c, out)
    d = c.shape[-1]
    dh, dc_new = grad[..., :d], grad[..., d : 2 * d]
    c_new = out[..., d : 2 * d]
    i, f, g, o = (out[..., k * d : (k + 1) * d] for k in range(2, 6))
    res = np.empty((*out.shape[:-1], 5 * d), out.dtype)
    di, df, dg, do, dc_prev = (res[..., k * d : (k + 1) * d] for k in range(5))
    tc = np.tanh(c_new)
    np.multiply(dh, tc, out=do)
    # dc = dc' + dh ⊙ o ⊙ (1 - tanh²(c'))
    dc = np.multiply(tc, tc, out=tc)
    np.subtract(1.0, dc, out=dc)
    dc *= o
    dc *= dh
    dc += dc_new
    np.multiply(dc, f, out=dc_prev)
    np.multiply(dc, i, out=dg)
    np.multiply(dc, g, out=di)
    np.multiply(dc, c, out=df)
    scratch = np.empty_like(i)
    for grad_act, s in ((di, i), (df, f), (do, o)):  # through the sigmoids: s (1 - s)
        np.subtract(1.0, s, out=scratch)
        scratch *= s
        grad_act *= scratch
    np.multiply(g, g, out=scratch)
    np.subtract(1.0, scratch, out=scratch)
    dg *= scratch
    return res


@backward("lstm_cell", keep=("inputs", "output"))
def _lstm_cell_backward(B, grad, s):
    _x, h, c, w = s.inputs
    d = B.shape(h)[-1]
    packed = B.lstm_cell_backward(grad, c, s.output)
    dgates = _cols(B, packed, 0, 4 * d)
    needs_x, needs_h, needs_c, needs_w = s.needs
    return (
        unbroadcast(B, dgates, s.shapes[0]) if needs_x else None,
        unbroadcast(B, B.float_matmul(dgates, _swap_last(B, w)), s.shapes[1]) if needs_h else None,
        unbroadcast(B, _cols(B, packed, 4 * d, 5 * d), s.shapes[2]) if needs_c else None,
        _weight_grad(B, h, dgates, s.shapes[3]) if needs_w else None,
    )


# ---------------------------------------------------------------- GRU
def _gru_reference(B, x, h, w, b):
    """One GRU step (reset after the hidden product) from primitives."""
    d = B.shape(h)[-1]
    hp = B.float_add(B.float_matmul(h, w), b)
    act = B.sigmoid(B.float_add(x, hp))  # the candidate's block goes unused
    r, z = _cols(B, act, 0, d), _cols(B, act, d, 2 * d)
    hp_n = _cols(B, hp, 2 * d, 3 * d)
    n = B.float_tanh(B.float_add(_cols(B, x, 2 * d, 3 * d), B.float_mul(r, hp_n)))
    h_new = B.float_add(n, B.float_mul(z, B.float_sub(h, n)))  # (1 - z) n + z h
    return _cat_last(B, [h_new, r, z, n, hp_n])


def _gru_backward_reference(B, grad, h, out):
    """The element-wise part of the GRU step's gradient: ``[d x | d hp | d h (direct)]``."""
    d = B.shape(h)[-1]
    dh = _cols(B, grad, 0, d)
    r, z, n, hp_n = (_cols(B, out, k * d, (k + 1) * d) for k in range(1, 5))
    dz = B.float_mul(dh, B.float_sub(h, n))
    dn = B.float_mul(B.float_mul(dh, _one_minus(B, z)), _one_minus(B, B.float_mul(n, n)))
    dr = B.float_mul(B.float_mul(dn, hp_n), B.float_mul(r, _one_minus(B, r)))
    dz = B.float_mul(dz, B.float_mul(z, _one_minus(B, z)))
    return _cat_last(B, [dr, dz, dn, dr, dz, B.float_mul(dn, r), B.float_mul(dh, z)])


_GRU_CELL = custom_op("gru_cell", ("x", "hidden", "w_hh", "b_hh"), _gru_rule, _gru_reference)
_GRU_CELL_BACKWARD = custom_op(
    "gru_cell_backward", ("grad", "hidden", "out"), _gru_backward_rule, _gru_backward_reference
)


@_GRU_CELL.kernel(NdArray)
def _gru_ndarray(B, x, h, w, b):
    if x.dtype.itemsize < 4:
        return _gru_reference(B, x, h, w, b)
    d = h.shape[-1]
    hp = np.matmul(h, w)
    if hp.shape == np.broadcast_shapes(hp.shape, b.shape):
        hp += b
    else:
        hp = hp + b
    lead = np.broadcast_shapes(hp.shape[:-1], x.shape[:-1], h.shape[:-1])
    out = np.empty((*lead, 5 * d), x.dtype)
    h_new, r, z, n, hp_n = (out[..., k * d : (k + 1) * d] for k in range(5))
    rz = out[..., d : 3 * d]
    np.add(x[..., : 2 * d], hp[..., : 2 * d], out=rz)
    np.multiply(rz, 0.5, out=rz)  # σ(x) = (1 + tanh(x / 2)) / 2, as in the LSTM kernel
    np.tanh(rz, out=rz)
    rz *= 0.5
    rz += 0.5
    hp_n[...] = hp[..., 2 * d :]
    np.multiply(r, hp_n, out=n)
    n += x[..., 2 * d :]
    np.tanh(n, out=n)
    np.subtract(h, n, out=h_new)
    h_new *= z
    h_new += n
    return out


@_GRU_CELL_BACKWARD.kernel(NdArray)
def _gru_backward_ndarray(B, grad, h, out):
    if out.dtype.itemsize < 4:
        return _gru_backward_reference(B, grad, h, out)
    d = h.shape[-1]
    dh = grad[..., :d]
    r, z, n, hp_n = (out[..., k * d : (k + 1) * d] for k in range(1, 5))
    res = np.empty((*out.shape[:-1], 7 * d), out.dtype)
    dr, dz, dn, _, _, dhp_n, dh_direct = (res[..., k * d : (k + 1) * d] for k in range(7))
    scratch = np.empty_like(r)
    np.multiply(dh, z, out=dh_direct)
    np.subtract(h, n, out=dz)
    dz *= dh
    np.subtract(dh, dh_direct, out=dn)  # dh (1 - z)
    np.multiply(n, n, out=scratch)
    np.subtract(1.0, scratch, out=scratch)
    dn *= scratch
    np.multiply(dn, r, out=dhp_n)
    np.multiply(dn, hp_n, out=dr)
    for grad_act, s in ((dr, r), (dz, z)):  # through the sigmoids: s (1 - s)
        np.subtract(1.0, s, out=scratch)
        scratch *= s
        grad_act *= scratch
    res[..., 3 * d : 5 * d] = res[..., : 2 * d]
    return res


@backward("gru_cell", keep=("inputs", "output"))
def _gru_cell_backward(B, grad, s):
    _x, h, w, _b = s.inputs
    d = B.shape(h)[-1]
    packed = B.gru_cell_backward(grad, h, s.output)
    dhp = _cols(B, packed, 3 * d, 6 * d)
    needs_x, needs_h, needs_w, needs_b = s.needs
    dh = None
    if needs_h:
        dh = B.float_add(_cols(B, packed, 6 * d, 7 * d), B.float_matmul(dhp, _swap_last(B, w)))
        dh = unbroadcast(B, dh, s.shapes[1])
    return (
        unbroadcast(B, _cols(B, packed, 0, 3 * d), s.shapes[0]) if needs_x else None,
        dh,
        _weight_grad(B, h, dhp, s.shapes[2]) if needs_w else None,
        unbroadcast(B, dhp, s.shapes[3]) if needs_b else None,
    )


# ---------------------------------------------------------------- Torch kernels
def _install_torch_kernels() -> None:
    try:
        import torch

        from ember.backend import Torch
    except ImportError:  # torch is optional
        return

    def cat_last(parts: list) -> torch.Tensor:
        lead = parts[0].shape[:-1]
        if any(p.shape[:-1] != lead for p in parts):  # rare: the operands were broadcast
            lead = torch.broadcast_shapes(*(p.shape[:-1] for p in parts))
            parts = [p.expand(*lead, p.shape[-1]) for p in parts]
        return torch.cat(parts, -1)

    def add_into(fresh: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """``fresh + other``, in ``fresh``'s buffer when the sum has its shape."""
        if other.dim() <= fresh.dim() and all(
            o in (1, f) for o, f in zip(other.shape[::-1], fresh.shape[::-1], strict=False)
        ):
            return fresh.add_(other)
        return fresh + other

    @_LSTM_CELL.kernel(Torch)
    def _lstm_torch(B, x, h, c, w):
        d = h.shape[-1]
        gates = add_into(torch.matmul(h, w), x)
        act = torch.sigmoid(gates)
        g = act[..., 2 * d : 3 * d].copy_(torch.tanh(gates[..., 2 * d : 3 * d]))
        c_new = torch.addcmul(act[..., d : 2 * d] * c, act[..., :d], g)
        h_new = act[..., 3 * d :] * torch.tanh(c_new)
        return cat_last([h_new, c_new, act])

    @_LSTM_CELL_BACKWARD.kernel(Torch)
    def _lstm_backward_torch(B, grad, c, out):
        d = c.shape[-1]
        dh, dc_new = grad[..., :d], grad[..., d : 2 * d]
        i, f, g, o = (out[..., k * d : (k + 1) * d] for k in range(2, 6))
        tc = torch.tanh(out[..., d : 2 * d])
        dc = torch.addcmul(dc_new, dh * o, 1 - tc * tc)
        sig = out[..., 2 * d :] * (1 - out[..., 2 * d :])  # s (1 - s), for i, f and o
        di = dc * g * sig[..., :d]
        df = dc * c * sig[..., d : 2 * d]
        dg = dc * i * (1 - g * g)
        do = dh * tc * sig[..., 3 * d :]
        return cat_last([di, df, dg, do, dc * f])

    @_GRU_CELL.kernel(Torch)
    def _gru_torch(B, x, h, w, b):
        d = h.shape[-1]
        hp = add_into(torch.matmul(h, w), b)
        rz = torch.sigmoid(x[..., : 2 * d] + hp[..., : 2 * d])
        hp_n = hp[..., 2 * d :]
        n = torch.tanh(torch.addcmul(x[..., 2 * d :], rz[..., :d], hp_n))
        h_new = torch.lerp(n, h, rz[..., d:]) if n.shape == h.shape else n + rz[..., d:] * (h - n)
        return cat_last([h_new, rz, n, hp_n])

    @_GRU_CELL_BACKWARD.kernel(Torch)
    def _gru_backward_torch(B, grad, h, out):
        d = h.shape[-1]
        dh = grad[..., :d]
        r, z, n, hp_n = (out[..., k * d : (k + 1) * d] for k in range(1, 5))
        rz = out[..., d : 3 * d]
        dn = dh * (1 - z) * (1 - n * n)
        drz = cat_last([dn * hp_n, dh * (h - n)]).mul_(rz * (1 - rz))
        return cat_last([drz, dn, drz, dn * r, dh * z])


_install_torch_kernels()


# ---------------------------------------------------------------- public functions
def lstm_cell(x: Tensor, hidden: Tensor, cell: Tensor, w_hh: Tensor) -> tuple[Tensor, Tensor]:
    """One LSTM time step as a single op (forward and backward).

    With ``σ`` the sigmoid, ``⊙`` the element-wise product and the gate blocks in
    PyTorch's order ``[i | f | g | o]``::

        i, f, g, o = split(x + hidden @ w_hh)
        cell' = σ(f) ⊙ cell + σ(i) ⊙ tanh(g)
        hidden' = σ(o) ⊙ tanh(cell')

    Args:
        x: the step's input projection with both biases, ``x_t @ W_ih + b_ih + b_hh``.
        hidden: the previous hidden state.
        cell: the previous cell state.
        w_hh: the hidden weight, all four gates side by side.

    Shape:
        - x: ``[..., batch, 4 * d_hidden]``; hidden, cell: ``[..., batch, d_hidden]``;
          w_hh: ``[..., d_hidden, 4 * d_hidden]`` (the leading dims broadcast).
        - Output: the new hidden and cell states, ``[..., batch, d_hidden]`` each.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.rnn_cell import lstm_cell
        >>> h, c = lstm_cell(Tensor.zeros([2, 8]), Tensor.zeros([2, 2]),
        ...                  Tensor.ones([2, 2]), Tensor.zeros([2, 8]))
        >>> [round(v, 4) for v in c[0].tolist()], [round(v, 4) for v in h[0].tolist()]
        ([0.5, 0.5], [0.2311, 0.2311])
    """
    out = _LSTM_CELL(x, hidden, cell, w_hh)
    d = hidden.shape[-1]
    return out.narrow(-1, 0, d), out.narrow(-1, d, d)


def gru_cell(x: Tensor, hidden: Tensor, w_hh: Tensor, b_hh: Tensor | None = None) -> Tensor:
    """One GRU time step, the reset gate applied after the hidden product, as a single op.

    With ``σ`` the sigmoid, ``⊙`` the element-wise product and the gate blocks in
    PyTorch's order ``[r | z | n]``, ``hp = hidden @ w_hh + b_hh``::

        r = σ(x_r + hp_r),  z = σ(x_z + hp_z)
        n = tanh(x_n + r ⊙ hp_n)
        hidden' = (1 - z) ⊙ n + z ⊙ hidden

    Args:
        x: the step's input projection with the input bias, ``x_t @ W_ih + b_ih``.
        hidden: the previous hidden state.
        w_hh: the hidden weight, all three gates side by side.
        b_hh: the hidden bias (kept apart: the reset gate scales its candidate block);
            None for none.

    Shape:
        - x: ``[..., batch, 3 * d_hidden]``; hidden: ``[..., batch, d_hidden]``;
          w_hh: ``[..., d_hidden, 3 * d_hidden]``; b_hh: ``[3 * d_hidden]``.
        - Output: the new hidden state, ``[..., batch, d_hidden]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.rnn_cell import gru_cell
        >>> h = gru_cell(Tensor.zeros([1, 3]), Tensor.ones([1, 1]), Tensor.zeros([1, 3]))
        >>> round(h.item(), 4)
        0.5
    """
    if b_hh is None:
        b_hh = Tensor.zeros([w_hh.shape[-1]], x.device, dtype=x.dtype)
    return _GRU_CELL(x, hidden, w_hh, b_hh).narrow(-1, 0, hidden.shape[-1])
