"""The :class:`Dataset` protocol: a fixed-length collection of items with random access.

Every dataset in ember, a source (:class:`~ember.data.dataset.in_memory.InMemDataset`,
:class:`~ember.data.dataset.sqlite.SqliteDataset`) or a lazy transform
(:mod:`ember.data.dataset.transform`), derives from :class:`Dataset`. As in Burn, a
dataset promises only two things: its length, and the item at any index in ``[0, len)``
in about constant time; it says nothing about how it is read, so the data loader may
visit the indices in any order, from several workers at once.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Generic, TypeVar

from ember.backend.errors import ArgumentError, EmberError, EmberIndexError

I = TypeVar("I")  # noqa: E741 - the item type, named as in Burn's Dataset<I>


class DatasetError(EmberError, ValueError):
    """A dataset file that cannot be read: a malformed CSV row or JSON line, a database
    that is not an ember dataset, a split that does not exist.

    The message names the file and, where it applies, the line. ``file`` holds the file
    path (or ``None``) and ``line`` the 1-based line (or ``None``).
    """

    def __init__(self, message: str, file: str | None = None, line: int | None = None):
        super().__init__(message)
        self.file = file
        self.line = line


class DatasetFileNotFoundError(DatasetError, FileNotFoundError):
    """A dataset file to read does not exist."""


class Dataset(ABC, Generic[I]):
    """A fixed-length collection of items of type ``I`` with random access.

    Subclasses implement :meth:`get` and :meth:`__len__`; indexing (``dataset[i]``,
    with Python's negative indices) and iteration come from them. :meth:`get` follows
    Burn: it returns ``None`` for an index outside ``[0, len)``, where ``dataset[i]``
    raises :class:`~ember.backend.errors.EmberIndexError`.

    Example:
        >>> from ember.data.dataset.base import Dataset
        >>> class Squares(Dataset[int]):
        ...     def __init__(self, n: int):
        ...         self.n = n
        ...     def get(self, index: int) -> int | None:
        ...         return index * index if 0 <= index < self.n else None
        ...     def __len__(self) -> int:
        ...         return self.n
        >>> squares = Squares(4)
        >>> len(squares), squares[3], squares[-1], squares.get(4)
        (4, 9, 9, None)
        >>> list(squares)
        [0, 1, 4, 9]
    """

    @abstractmethod
    def get(self, index: int) -> I | None:
        """The item at ``index``, or ``None`` when ``index`` is outside ``[0, len)``."""

    @abstractmethod
    def __len__(self) -> int:
        """The number of items."""

    def __getitem__(self, index: int) -> I:
        position = check_index(self, index)
        return self.get(position)  # type: ignore[return-value]

    def __iter__(self) -> Iterator[I]:
        for index in range(len(self)):
            yield self.get(index)  # type: ignore[misc]

    def is_empty(self) -> bool:
        """Whether the dataset holds no item."""
        return len(self) == 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(len={len(self)})"


def check_index(dataset: Dataset, index: int) -> int:
    """``index`` as a position in ``[0, len(dataset))``, negative indices counting from
    the end; raises EmberIndexError outside the dataset and ArgumentError for a non-integer."""
    try:
        position = operator.index(index)
    except TypeError:
        raise ArgumentError(f"{type(dataset).__name__} indices must be integers, "
                            f"got {type(index).__name__}") from None
    length = len(dataset)
    if position < 0:
        position += length
    if not 0 <= position < length:
        raise EmberIndexError(f"{type(dataset).__name__} index {index} is out of range "
                              f"for a dataset of {length} items")
    return position
