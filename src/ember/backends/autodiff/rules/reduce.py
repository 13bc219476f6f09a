"""Backward rules of reductions, scans and sorting."""

from __future__ import annotations

import math

from ember.backends.autodiff.rule import backward, zeros


def _spread(B, g, shape):
    """``g`` of a reduction (0-d, or with the reduced dim kept) broadcast back to ``shape``."""
    return B.float_expand(B.float_reshape(g, (1,) * len(shape)) if not B.shape(g) else g, shape)


@backward("sum")
def _sum(B, g, s):
    return (_spread(B, g, s.shapes[0]),)


@backward("mean")
def _mean(B, g, s):
    shape = s.shapes[0]
    return (_spread(B, B.float_div_scalar(g, max(math.prod(shape), 1)), shape),)


@backward("sum_dim")
def _sum_dim(B, g, s):
    return (_spread(B, g, s.shapes[0]),)


@backward("mean_dim")
def _mean_dim(B, g, s):
    shape, dim = s.shapes[0], s.attrs[0]
    return (_spread(B, B.float_div_scalar(g, shape[dim]), shape),)


def _exclusive_cumprod(B, x, dim: int):
    """Products of the elements before each position along ``dim`` (1 for the first)."""
    shape = B.shape(x)
    ones = B.float_ones(shape[:dim] + (1,) + shape[dim + 1 :], B.device_of(x), B.dtype(x))
    head = tuple((0, n - 1, 1) if d == dim else (0, n, 1) for d, n in enumerate(shape))
    return B.float_cat([ones, B.float_cumprod(B.float_slice(x, head), dim)], dim)


def _product_of_others(B, x, dim: int):
    """prod_{j != i} x_j along ``dim``, without dividing: exact when some x_j are zero."""
    before = _exclusive_cumprod(B, x, dim)
    after = B.float_flip(_exclusive_cumprod(B, B.float_flip(x, (dim,)), dim), (dim,))
    return B.float_mul(before, after)


@backward("prod", keep="inputs")
def _prod(B, g, s):
    shape = s.shapes[0]
    if 0 in shape:
        return (s.inputs[0],)  # an empty gradient
    flat = B.float_reshape(s.inputs[0], (max(math.prod(shape), 0),))
    others = B.float_reshape(_product_of_others(B, flat, 0), shape)
    return (B.float_mul(_spread(B, g, shape), others),)


@backward("prod_dim", keep="inputs")
def _prod_dim(B, g, s):
    shape, dim = s.shapes[0], s.attrs[0]
    if 0 in shape:
        return (s.inputs[0],)  # an empty gradient
    return (B.float_mul(_spread(B, g, shape), _product_of_others(B, s.inputs[0], dim)),)


def _extreme(B, g, s):
    # As PyTorch's amax / amin: ties share the gradient evenly.
    x, shape = s.inputs[0], s.shapes[0]
    hit = B.bool_cast(B.float_equal(x, _spread(B, s.output, shape)), B.dtype(x))
    if s.attrs:
        count = B.float_sum_dim(hit, s.attrs[0])
    else:
        count = B.float_sum(hit)
    return (B.float_mul(hit, _spread(B, B.float_div(g, count), shape)),)


backward("max", "min", "max_dim", "min_dim", keep=("inputs", "output"))(_extreme)


@backward("cumsum")
def _cumsum(B, g, s):
    dim = s.attrs[0]
    return (B.float_flip(B.float_cumsum(B.float_flip(g, (dim,)), dim), (dim,)),)


@backward("cumprod", keep=("inputs", "output"))
def _cumprod(B, g, s):
    # d out_k / d x_i = out_k / x_i for k >= i (inputs with zeros: not yet handled).
    dim = s.attrs[0]
    tail = B.float_flip(B.float_cumsum(B.float_flip(B.float_mul(g, s.output), (dim,)), dim), (dim,))
    return (B.float_div(tail, s.inputs[0]),)


@backward("sort_with_indices", keep="output")
def _sort(B, g, s):
    indices, dim = s.output[1], s.attrs[0]
    return (B.float_scatter_add(zeros(B, g), indices, g, dim),)
