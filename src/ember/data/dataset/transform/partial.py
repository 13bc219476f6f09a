"""PartialDataset: a contiguous range of a dataset's items."""

from __future__ import annotations

from typing import TypeVar

from ember.backend.errors import ArgumentError
from ember.data.dataset.base import Dataset
from ember.data.dataset.transform._rng import check_dataset, check_size

I = TypeVar("I")  # noqa: E741


class PartialDataset(Dataset[I]):
    """The items ``start`` to ``end - 1`` of ``dataset``, as a dataset of their own.

    Args:
        dataset: the inner dataset.
        start: the first index of the range.
        end: one past the last index; ``0 <= start <= end <= len(dataset)``.

    Example:
        >>> from ember.data.dataset.in_memory import InMemDataset
        >>> from ember.data.dataset.transform.partial import PartialDataset
        >>> dataset = InMemDataset(range(10))
        >>> train, test = PartialDataset(dataset, 0, 8), PartialDataset(dataset, 8, 10)
        >>> len(train), list(test), test[0]
        (8, [8, 9], 8)
    """

    def __init__(self, dataset: Dataset[I], start: int, end: int):
        check_dataset(dataset, "PartialDataset")
        start = check_size(start, "PartialDataset", "start")
        end = check_size(end, "PartialDataset", "end")
        if not start <= end <= len(dataset):
            raise ArgumentError(f"PartialDataset: the range [{start}, {end}) does not fit a "
                                f"dataset of {len(dataset)} items "
                                f"(need 0 <= start <= end <= {len(dataset)})")
        self.dataset = dataset
        self.start = start
        self.end = end

    @classmethod
    def split(cls, dataset: Dataset[I], num: int) -> list[PartialDataset[I]]:
        """``dataset`` cut into ``num`` contiguous parts whose lengths differ by at most
        one (the first ones are the longer).

        Example:
            >>> from ember.data.dataset.in_memory import InMemDataset
            >>> from ember.data.dataset.transform.partial import PartialDataset
            >>> [list(part) for part in PartialDataset.split(InMemDataset(range(5)), 2)]
            [[0, 1, 2], [3, 4]]
        """
        num = check_size(num, "PartialDataset.split", "num", minimum=1)
        base, extra = divmod(len(dataset), num)
        parts, start = [], 0
        for rank in range(num):
            end = start + base + (rank < extra)
            parts.append(cls(dataset, start, end))
            start = end
        return parts

    def get(self, index: int) -> I | None:
        if not 0 <= index < self.end - self.start:
            return None
        return self.dataset.get(self.start + index)

    def __len__(self) -> int:
        return self.end - self.start
