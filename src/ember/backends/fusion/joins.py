"""Attention gradients written where the cat that joins them puts them.

Self-attention's packed projection (``nn.attention``) joins the gradients dQ, dK and dV,
each through layout ops that merge its heads back, with one cat along the features: a
``[B, S, 3 D]`` value, 6 MB a layer in ``nn_step``, whose copy took 1-2.3 ms. Where the
attention gradient kernel writes its three results straight into views of one pooled
array laid out as that cat's result, the cat copies nothing: its pieces already lie side
by side there. A recorded flush (``Executor``) and a direct replay (``direct``) both do so:

* :func:`gathered` finds the cat and each result's chain of layout ops to it;
* :func:`piece_views` lays the results out in the cat's array (None where a reshape of the
  chain would copy: the kernel then writes arrays of its own and the cat copies them),
  which :func:`taker` hands the kernel as its allocator;
* :func:`joined_view` checks, when the cat runs, that its pieces do lie side by side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.backend.errors import UnsupportedError
from ember.backends.fusion import executor  # a module: the executor imports this one
from ember.backends.fusion.buffers import inverse_order
from ember.backends.fusion.views import strided

__all__ = ["gathered", "joined_view", "piece_views", "taker"]


def gathered(fused: Any, records: Any, readers: dict) -> tuple | None:
    """Where one cat joins an attention gradient's (``AttentionGrad``) three results, each
    through layout ops that only it reads: ``(the cat's record index, ((piece, chain) per
    result))``, a chain the ``(op, its input's shape, its attribute)`` steps from the
    result to the cat's piece; else None."""
    ends = []
    for result in (fused.d_query, fused.d_key, fused.d_value):
        chain, end = [], None
        for value, index, reader in executor.single_readers(result, records, readers):
            if reader.name == "float_cat":
                end = (index, value)
                break
            if reader.name not in ("float_permute", "float_reshape"):
                return None
            chain.append((reader.name, value.shape, reader.args[1]))
        if end is None:
            return None
        ends.append((*end, tuple(chain)))
    index = ends[0][0]
    pieces = records[index].args[0]
    if any(i != index for i, _, _ in ends) or len(pieces) != len(ends):
        return None
    positions = [next((p for p, s in enumerate(pieces) if s is end), None) for _, end, _ in ends]
    if None in positions or len(set(positions)) != len(ends):
        return None
    return index, tuple(zip(positions, [chain for _, _, chain in ends], strict=True))


def piece_views(joined: np.ndarray, dim: int, sizes: list[int], results: tuple) -> list | None:
    """Views of ``joined`` (the cat's result, its pieces ``sizes`` long along ``dim``) in
    which the attention gradient writes its results: for each ``(piece, chain)`` of
    :func:`gathered`, the piece's part of ``joined`` taken back through the chain's layout
    ops. None where a reshape of a chain would copy."""
    starts = [sum(sizes[:p]) for p in range(len(sizes))]
    views = []
    for piece, chain in results:
        view = joined[(slice(None),) * dim + (slice(starts[piece], starts[piece] + sizes[piece]),)]
        for name, shape_before, attr in reversed(chain):
            if name == "float_permute":
                view = view.transpose(inverse_order(tuple(attr)))
            else:
                view = executor.reshape_view(view, shape_before)
                if view is None:
                    return None
        views.append(view)
    return views


def taker(views: list):
    """An allocator (``BufferPool.take``'s signature) handing out ``views`` in turn: the
    kernel's three results, in the order it makes them."""
    handed = iter(views)

    def take(shape: tuple, dtype: Any, order: Any = None) -> np.ndarray:
        view = next(handed, None)
        if view is None or view.shape != tuple(shape) or view.dtype != dtype:
            have = "none left" if view is None else f"{view.shape} {view.dtype}"
            raise UnsupportedError(f"a gathered result of shape {tuple(shape)} and dtype "
                                   f"{dtype} where its view is {have}")  # fmt: skip
        return view

    return take


def joined_view(pieces: list, dim: int, shape: tuple) -> np.ndarray | None:
    """The cat of ``pieces`` along ``dim`` (of ``shape``) as a view, where they lie side by
    side in one array, each where the one before it ends and with its strides (written in
    place by the kernel through :func:`piece_views`); else None."""
    first = pieces[0]
    if type(first) is not np.ndarray or first.base is None:
        return None
    at = first.__array_interface__["data"][0]
    for piece in pieces:
        if (type(piece) is not np.ndarray or piece.base is not first.base
                or piece.strides != first.strides or piece.dtype != first.dtype
                or piece.__array_interface__["data"][0] != at):  # fmt: skip
            return None
        at += piece.shape[dim] * piece.strides[dim]
    return strided(first, shape, first.strides)
