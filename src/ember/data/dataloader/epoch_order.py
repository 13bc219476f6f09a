"""EpochOrder: which dataset items an epoch visits, in which order, cut into which batches.

A small, picklable value (seed, epoch, split parts, batch size): the loader computes the
batches of an epoch from it, and so does each worker process, which receives the value
instead of the (possibly long) list of indices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EpochOrder:
    """The order of one epoch of a loader: a pure function of these fields and the size.

    Args:
        seed: None keeps the dataset's order; an int draws a permutation from a NumPy
            generator seeded with ``(seed, epoch)``.
        epoch: the epoch number.
        parts: the chain of ``(part, parts)`` cuts that ``DataLoader.split`` applied,
            outermost first.
        batch_size: items per batch; the last batch keeps the remainder.

    Example:
        >>> order = EpochOrder(seed=None, epoch=0, parts=((1, 2),), batch_size=2)
        >>> order.indices(7).tolist(), [c.tolist() for c in order.chunks(7)]
        ([3, 4, 5, 6], [[3, 4], [5, 6]])
    """

    seed: int | None
    epoch: int
    parts: tuple[tuple[int, int], ...]
    batch_size: int

    def bounds(self, size: int) -> tuple[int, int]:
        """The slice ``[start, stop)`` of the epoch's permutation this (part of a) loader owns."""
        start, stop = 0, size
        for part, parts in self.parts:
            length = stop - start
            start, stop = start + part * length // parts, start + (part + 1) * length // parts
        return start, stop

    def indices(self, size: int) -> np.ndarray:
        """The dataset indices of the epoch's items, in order, for a dataset of ``size`` items."""
        if self.seed is None:
            order = np.arange(size, dtype=np.int64)
        else:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(size)
        start, stop = self.bounds(size)
        return order[start:stop]

    def chunks(self, size: int) -> list[np.ndarray]:
        """The epoch's indices cut into batches of ``batch_size`` (the last one shorter)."""
        order = self.indices(size)
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
