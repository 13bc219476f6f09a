"""WindowsDataset: every run of ``size`` consecutive items of a dataset."""

from __future__ import annotations

from typing import TypeVar

from ember.data.dataset.base import Dataset
from ember.data.dataset.transform._rng import check_dataset, check_size

I = TypeVar("I")  # noqa: E741


class WindowsDataset(Dataset[list[I]]):
    """Sliding windows over ``dataset``: item ``i`` is the list of items ``i`` to
    ``i + size - 1``.

    A dataset of ``n`` items has ``max(n - size + 1, 0)`` windows (stride 1), each read
    from the inner dataset when it is requested.

    Args:
        dataset: the inner dataset.
        size: the number of items in a window (at least 1).

    Example:
        >>> from ember.data.dataset.in_memory import InMemDataset
        >>> from ember.data.dataset.transform.window import WindowsDataset
        >>> windows = WindowsDataset(InMemDataset([1, 2, 3, 4]), size=3)
        >>> len(windows), list(windows)
        (2, [[1, 2, 3], [2, 3, 4]])
    """

    def __init__(self, dataset: Dataset[I], size: int):
        check_dataset(dataset, "WindowsDataset")
        self.dataset = dataset
        self.size = check_size(size, "WindowsDataset", "size", minimum=1)

    def get(self, index: int) -> list[I] | None:
        if not 0 <= index < len(self):
            return None
        return [self.dataset.get(index + offset) for offset in range(self.size)]  # type: ignore[misc]

    def __len__(self) -> int:
        return max(len(self.dataset) - self.size + 1, 0)
