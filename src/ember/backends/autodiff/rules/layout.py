"""Backward rules of the layout and indexing ops, and of pad.

Index operands (Int) get no gradient. Every rule is written with the inner
backend's primitives only, so it runs on any backend.
"""

from __future__ import annotations

from ember.backend.options import PadOptions
from ember.backends.autodiff.partial import Partial
from ember.backends.autodiff.rule import backward, unbroadcast, zeros


def _along(shape, dim: int, start: int, stop: int) -> tuple[tuple[int, int, int], ...]:
    """Slice ranges that take ``start:stop`` of ``dim`` and all of every other dim."""
    return tuple((start, stop, 1) if d == dim else (0, size, 1) for d, size in enumerate(shape))


# ------------------------------------------------------------------ layout
@backward("reshape")
def _reshape(B, g, s):
    return (B.float_reshape(g, s.shapes[0]),)


@backward("permute")
def _permute(B, g, s):
    axes = s.attrs[0]
    inverse = [0] * len(axes)
    for i, a in enumerate(axes):
        inverse[a] = i
    return (B.float_permute(g, tuple(inverse)),)


@backward("expand")
def _expand(B, g, s):
    return (unbroadcast(B, g, s.shapes[0]),)


@backward("flip")
def _flip(B, g, s):
    return (B.float_flip(g, s.attrs[0]),)


@backward("slice")
def _slice(B, g, s):
    # Only the region taken gets a gradient: the engine assembles the input's gradient from
    # all its pieces at once, so taking many slices of one tensor stays linear.
    return (Partial(g, s.attrs[0], s.shapes[0]),)


@backward("slice_assign")
def _slice_assign(B, g, s):
    ranges = s.attrs[0]
    to_x = B.float_slice_assign(g, zeros(B, g, s.shapes[1]), ranges)
    return to_x, B.float_slice(g, ranges)


@backward("cat")
def _cat(B, g, s):
    dim = s.attrs[0]
    g_shape = B.shape(g)
    pieces, start = [], 0
    for shape in s.shapes:
        stop = start + shape[dim]
        pieces.append(B.float_slice(g, _along(g_shape, dim, start, stop)))
        start = stop
    return tuple(pieces)


@backward("repeat_dim")
def _repeat_dim(B, g, s):
    shape, (dim, times) = s.shapes[0], s.attrs
    # The output is ``times`` tiles of the input along ``dim``: sum the tiles.
    tiles = B.float_reshape(g, shape[:dim] + (times,) + shape[dim:])
    return (B.float_reshape(B.float_sum_dim(tiles, dim), shape),)


# ------------------------------------------------------------------ indexing
@backward("gather", keep="inputs")
def _gather(B, g, s):
    indices, dim = s.inputs[1], s.attrs[0]
    return B.float_scatter_add(zeros(B, g, s.shapes[0]), indices, g, dim), None


@backward("scatter_add", keep="inputs")
def _scatter_add(B, g, s):
    indices, dim = s.inputs[1], s.attrs[0]
    return g, None, B.float_gather(g, indices, dim)


@backward("select", keep="inputs")
def _select(B, g, s):
    indices, dim = s.inputs[1], s.attrs[0]
    # select_assign adds, so repeated indices accumulate their gradients.
    return B.float_select_assign(zeros(B, g, s.shapes[0]), indices, g, dim), None


@backward("select_assign", keep="inputs")
def _select_assign(B, g, s):
    indices, dim = s.inputs[1], s.attrs[0]
    return g, None, B.float_select(g, indices, dim)


# ------------------------------------------------------------------ pad
def _add_into(B, x, ranges, values):
    """``x`` with ``values`` added to its region ``ranges``."""
    return B.float_slice_assign(x, B.float_add(B.float_slice(x, ranges), values), ranges)


def _fold(B, g, dim: int, size: int, before: int, after: int, mode: str):
    """The gradient of padding ``dim`` (of input size ``size``) by non-negative
    ``before``/``after``: the centre of ``g``, plus, for reflect and edge, the
    border gradients folded back onto the input positions they copied."""
    shape = B.shape(g)
    center = B.float_slice(g, _along(shape, dim, before, before + size))
    if mode == "constant":
        return center
    head = B.float_slice(g, _along(shape, dim, 0, before)) if before else None
    tail = (
        B.float_slice(g, _along(shape, dim, before + size, before + size + after))
        if after
        else None
    )
    c_shape = B.shape(center)
    if mode == "reflect":
        # Output position before - j copies input j (j = 1..before); before + size - 1 + j
        # copies size - 1 - j (j = 1..after).
        if head is not None:
            center = _add_into(
                B, center, _along(c_shape, dim, 1, before + 1), B.float_flip(head, (dim,))
            )
        if tail is not None:
            center = _add_into(
                B,
                center,
                _along(c_shape, dim, size - 1 - after, size - 1),
                B.float_flip(tail, (dim,)),
            )
        return center
    # edge: every border position copies the first or the last input position.
    if head is not None:
        center = _add_into(B, center, _along(c_shape, dim, 0, 1), B.float_sum_dim(head, dim))
    if tail is not None:
        center = _add_into(
            B, center, _along(c_shape, dim, size - 1, size), B.float_sum_dim(tail, dim)
        )
    return center


@backward("pad")
def _pad(B, g, s):
    options, shape = s.attrs[0], s.shapes[0]
    lead = len(shape) - len(options.pads)
    # A negative pad crops: pad(x, (b, a)) is pad(x, (max(b, 0), max(a, 0))) with the first
    # max(-b, 0) and the last max(-a, 0) positions cut off. So the cut-off positions come back
    # as zeros first, then each dim's non-negative padding is folded back.
    crops = tuple((max(0, -b), max(0, -a)) for b, a in options.pads)
    if any(b or a for b, a in crops):
        g = B.float_pad(g, PadOptions(crops, "constant", 0.0))
    for i, (b, a) in enumerate(options.pads):
        b, a = max(0, b), max(0, a)
        if b or a:
            dim = lead + i
            g = _fold(B, g, dim, shape[dim], b, a, options.mode)
    return (g,)
