"""MapperDataset: a function applied lazily to each item of a dataset."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ember.backend.errors import ArgumentError
from ember.data.dataset.base import Dataset
from ember.data.dataset.transform._rng import check_dataset

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


class MapperDataset(Dataset[O], Generic[I, O]):
    """The items of ``dataset`` passed through ``mapper``, computed when they are read.

    Nothing is cached: reading an item twice calls ``mapper`` twice. To use the
    dataset from worker processes, ``mapper`` must pickle (a module-level function or
    an object with a ``__call__`` method, not a lambda).

    Args:
        dataset: the inner dataset.
        mapper: a function from an inner item to an item of this dataset.

    Example:
        >>> from ember.data.dataset.in_memory import InMemDataset
        >>> from ember.data.dataset.transform.mapper import MapperDataset
        >>> dataset = MapperDataset(InMemDataset([1.0, 2.0, 4.0]), lambda x: x / 2)
        >>> list(dataset), dataset[-1]
        ([0.5, 1.0, 2.0], 2.0)
    """

    def __init__(self, dataset: Dataset[I], mapper: Callable[[I], O]):
        check_dataset(dataset, "MapperDataset")
        if not callable(mapper):
            raise ArgumentError(f"MapperDataset: mapper must be callable, got "
                                f"{type(mapper).__name__}")
        self.dataset = dataset
        self.mapper = mapper

    def get(self, index: int) -> O | None:
        if not 0 <= index < len(self.dataset):
            return None
        return self.mapper(self.dataset.get(index))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[O]:
        # The inner dataset's own iteration may be faster than indexing (SQLite streams).
        return map(self.mapper, self.dataset)
