"""ComposedDataset: several datasets one after the other."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import TypeVar

from ember.data.dataset.base import Dataset
from ember.data.dataset.transform._rng import check_dataset

I = TypeVar("I")  # noqa: E741


class ComposedDataset(Dataset[I]):
    """The concatenation of ``datasets``: the items of the first, then of the second, ...

    No item is copied; the lengths of the datasets are read once, when it is built.

    Args:
        datasets: the datasets to join, in order.

    Example:
        >>> from ember.data.dataset.in_memory import InMemDataset
        >>> from ember.data.dataset.transform.composed import ComposedDataset
        >>> dataset = ComposedDataset([InMemDataset("ab"), InMemDataset("cde")])
        >>> len(dataset), dataset[2], "".join(dataset)
        (5, 'c', 'abcde')
    """

    def __init__(self, datasets: Sequence[Dataset[I]]):
        self.datasets = list(datasets)
        for dataset in self.datasets:
            check_dataset(dataset, "ComposedDataset")
        self.ends = list(itertools.accumulate(len(dataset) for dataset in self.datasets))

    def get(self, index: int) -> I | None:
        if not 0 <= index < len(self):
            return None
        part = bisect.bisect_right(self.ends, index)
        start = self.ends[part - 1] if part else 0
        return self.datasets[part].get(index - start)

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __iter__(self) -> Iterator[I]:
        for dataset in self.datasets:
            yield from dataset
