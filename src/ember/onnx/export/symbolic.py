"""Sizes that change with the dynamic axes, written as formulas of the dynamic input dims.

An export with dynamic axes traces the forward twice, with two sizes of each dynamic dim.
An attribute that differs between the traces (a reshape's target, a creation op's shape)
is a size derived from those dims; :func:`match` finds the formula: ``scale * dim +
offset`` for one dynamic dim, or ``scale * dim1 * dim2`` for two (batch * sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations


@dataclass(frozen=True)
class DynamicDim:
    """One dynamic dim of a graph input: its sizes in the traced and the alternate run."""

    input: str
    axis: int
    name: str
    traced: int
    alternate: int


@dataclass(frozen=True)
class Formula:
    """``scale * prod(dims) + offset``."""

    dims: tuple[DynamicDim, ...]
    scale: int
    offset: int = 0


def match(dynamic: Sequence[DynamicDim], traced: int, alternate: int) -> Formula | None:
    """The simplest formula giving ``traced`` on the traced sizes and ``alternate`` on the
    alternate sizes: a dim, a multiple of one, a product of two, a dim plus an offset."""
    candidates = [(d,) for d in dynamic] + list(combinations(dynamic, 2))
    for dims in candidates:  # products: exact multiples
        a = _product(d.traced for d in dims)
        b = _product(d.alternate for d in dims)
        if a and traced % a == 0 and (traced // a) * b == alternate:
            return Formula(tuple(dims), traced // a)
    for d in dynamic:  # offsets: one dim, shifted
        if traced - d.traced == alternate - d.alternate:
            return Formula((d,), 1, traced - d.traced)
    return None


def _product(values) -> int:
    result = 1
    for v in values:
        result *= v
    return result
