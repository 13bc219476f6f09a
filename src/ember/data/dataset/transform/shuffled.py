"""ShuffledDataset: the items of a dataset in a seeded random order."""

from __future__ import annotations

from typing import TypeVar

from ember.data.dataset.base import Dataset
from ember.data.dataset.transform._rng import check_dataset, generator, resolve_seed

I = TypeVar("I")  # noqa: E741


class ShuffledDataset(Dataset[I]):
    """The items of ``dataset`` in a random order, fixed by ``seed``.

    Item ``i`` is item ``permutation[i]`` of the inner dataset; the permutation is drawn
    once, when the dataset is built, and the same seed always gives the same one. Use it
    before :class:`~ember.data.dataset.transform.partial.PartialDataset` to split a
    dataset at random.

    Args:
        dataset: the dataset to shuffle.
        seed: the seed of the order; ``None`` draws a random one (see :attr:`seed`).

    Example:
        >>> from ember.data.dataset.in_memory import InMemDataset
        >>> from ember.data.dataset.transform.shuffled import ShuffledDataset
        >>> dataset = ShuffledDataset(InMemDataset(range(5)), seed=42)
        >>> sorted(dataset), list(dataset) == list(ShuffledDataset(InMemDataset(range(5)), 42))
        ([0, 1, 2, 3, 4], True)
    """

    def __init__(self, dataset: Dataset[I], seed: int | None = None):
        check_dataset(dataset, "ShuffledDataset")
        self.dataset = dataset
        self.seed = resolve_seed(seed, "ShuffledDataset")
        self.indices = generator(self.seed).permutation(len(dataset))

    @classmethod
    def with_seed(cls, dataset: Dataset[I], seed: int) -> ShuffledDataset[I]:
        """The same as ``ShuffledDataset(dataset, seed)`` (Burn's constructor name)."""
        return cls(dataset, seed)

    def get(self, index: int) -> I | None:
        if not 0 <= index < len(self.indices):
            return None
        return self.dataset.get(int(self.indices[index]))

    def __len__(self) -> int:
        return len(self.indices)
