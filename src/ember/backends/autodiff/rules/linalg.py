"""Backward rules of the matrix products (float, and float by a quantized weight)."""

from __future__ import annotations

import math

from ember.backends.autodiff.rule import backward, unbroadcast


def _transpose(B, x):
    """``x`` with its last two dims swapped."""
    rank = len(B.shape(x))
    return B.float_permute(x, tuple(range(rank - 2)) + (rank - 1, rank - 2))


@backward("matmul", keep="inputs")
def _matmul(B, g, s):
    # out = a @ b over the last two dims, batch dims broadcast: d a = g @ b^T and
    # d b = a^T @ g, each summed back over the batch dims its operand was broadcast along.
    # Each product only where its operand needs it: a network's first input, a constant
    # direction of a Hessian-vector product, take none.
    a, b = s.inputs
    a_shape, b_shape = s.shapes
    ga = unbroadcast(B, B.float_matmul(g, _transpose(B, b)), a_shape) if s.needs[0] else None
    if not s.needs[1]:
        gb = None
    elif len(b_shape) == 2 and len(a_shape) > 2:
        # A 2-d rhs (a linear layer): one product over the flattened batch rows, rather
        # than one per batch element summed afterwards.
        (k, n), rows = b_shape, math.prod(a_shape[:-1])
        rows_a = B.float_reshape(a, (rows, k))
        rows_g = B.float_reshape(g, (rows, n))
        gb = B.float_matmul(_transpose(B, rows_a), rows_g)
    else:
        gb = unbroadcast(B, B.float_matmul(_transpose(B, a), g), b_shape)
    return ga, gb


@backward("quantized_linear", keep="inputs")
def _quantized_linear(B, g, s):
    # out = x @ w + bias with w = dequantize(values, scales, zero points): d x = g @ w^T and
    # d bias = g summed over its rows. The quantized weight is a constant (Burn's q_inner):
    # its Int values have no gradient and its scales get none.
    x, values, scales, zero_points, bias = s.inputs
    gx = gb = None
    if s.needs[0]:
        weight = B.float_cast(B.dequantize(values, scales, zero_points, s.attrs[0]), B.dtype(x))
        gx = unbroadcast(B, B.float_matmul(g, _transpose(B, weight)), s.shapes[0])
    if bias is not None and s.needs[4]:
        gb = unbroadcast(B, g, s.shapes[4])
    return gx, None, None, None, gb


@backward("integer_linear")
def _integer_linear(B, g, s):
    # Both operands are quantized (Int values: constants); only the bias has a gradient.
    gb = unbroadcast(B, g, s.shapes[6]) if s.needs[6] else None
    return (None,) * 6 + (gb,)
