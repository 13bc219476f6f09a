"""SamplerDataset: a fixed number of items drawn from a dataset, with or without
replacement."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TypeVar

import numpy as np

from ember.backend.errors import ArgumentError
from ember.data.dataset.base import Dataset
from ember.data.dataset.transform._rng import (
    check_dataset,
    check_size,
    generator,
    resolve_seed,
)

I = TypeVar("I")  # noqa: E741

_BLOCK = 4096  # indices drawn at once with replacement
_CACHED = 4  # blocks (or passes) kept in memory


class SamplerDataset(Dataset[I]):
    """``size`` items drawn at random from ``dataset``: with replacement (the default,
    as Burn's) or without.

    ``size`` may be smaller or larger than the inner dataset: it sets how many items an
    epoch has. Without replacement the items come in *passes*: each run of
    ``len(dataset)`` consecutive indices is a permutation of the inner dataset (the last
    pass may be cut short), so every inner item is drawn once per pass. With
    replacement each index draws an inner index uniformly.

    The draw is a pure function of ``(seed, index)``: reading an index twice gives the
    same item, the same seed gives the same sequence, and indices are computed block by
    block, so any ``size`` takes little memory. (Burn's sampler draws anew on every
    read; ember fixes the draw so that runs are reproducible. Draw a new sample per
    epoch by building the sampler with a new seed.)

    Args:
        dataset: the dataset to draw from (not empty when ``size > 0``).
        size: the number of items.
        replacement: draw with replacement (``True``) or in passes without it.
        seed: the seed of the draw; ``None`` draws a random one (see :attr:`seed`).

    Example:
        >>> from ember.data.dataset.in_memory import InMemDataset
        >>> from ember.data.dataset.transform.sampler import SamplerDataset
        >>> inner = InMemDataset("abc")
        >>> sample = SamplerDataset(inner, 7, replacement=False, seed=1)
        >>> len(sample), sorted(list(sample)[:3]), sorted(list(sample)[3:6])
        (7, ['a', 'b', 'c'], ['a', 'b', 'c'])
        >>> list(SamplerDataset(inner, 5, seed=3)) == list(SamplerDataset(inner, 5, seed=3))
        True
    """

    def __init__(self, dataset: Dataset[I], size: int, replacement: bool = True,
                 seed: int | None = None):
        check_dataset(dataset, "SamplerDataset")
        self.dataset = dataset
        self.size = check_size(size, "SamplerDataset", "size")
        self.replacement = bool(replacement)
        self.seed = resolve_seed(seed, "SamplerDataset")
        self._inner_len = len(dataset)
        if self.size > 0 and self._inner_len == 0:
            raise ArgumentError(f"SamplerDataset: cannot draw {self.size} items from an "
                                f"empty dataset")
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def with_replacement(cls, dataset: Dataset[I], size: int,
                         seed: int | None = None) -> SamplerDataset[I]:
        """``size`` items drawn with replacement."""
        return cls(dataset, size, True, seed)

    @classmethod
    def without_replacement(cls, dataset: Dataset[I], size: int,
                            seed: int | None = None) -> SamplerDataset[I]:
        """``size`` items drawn in passes without replacement."""
        return cls(dataset, size, False, seed)

    def inner_index(self, index: int) -> int:
        """The index in the inner dataset that item ``index`` is drawn from."""
        if not 0 <= index < self.size:
            raise ArgumentError(f"SamplerDataset: index {index} is outside [0, {self.size})")
        span = _BLOCK if self.replacement else self._inner_len
        block, offset = divmod(index, span)
        return int(self._block(block)[offset])

    def _block(self, block: int) -> np.ndarray:
        with self._lock:
            indices = self._cache.get(block)
            if indices is not None:
                self._cache.move_to_end(block)
                return indices
        # Separate streams for the two modes, so switching mode changes the draw.
        if self.replacement:
            indices = generator(self.seed, 0, block).integers(0, self._inner_len, _BLOCK)
        else:
            indices = generator(self.seed, 1, block).permutation(self._inner_len)
        with self._lock:
            self._cache[block] = indices
            while len(self._cache) > _CACHED:
                self._cache.popitem(last=False)
        return indices

    def get(self, index: int) -> I | None:
        if not 0 <= index < self.size:
            return None
        return self.dataset.get(self.inner_index(index))

    def __len__(self) -> int:
        return self.size

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
