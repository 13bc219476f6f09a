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


@backward("prod", "prod_dim", keep=("inputs", "output"))
def _prod(B, g, s):
    # d prod / d x_i = prod / x_i (inputs with zeros need the division-free formula; not yet).
    x, shape = s.inputs[0], s.shapes[0]
    return (B.float_div(B.float_mul(_spread(B, g, shape), _spread(B, s.output, shape)), x),)


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
