"""The lazy dataset transforms: Sampler, Shuffled, Partial, Mapper, Composed, Windows."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest

from ember.backend.errors import ArgumentError, EmberIndexError
from ember.data.dataset.base import Dataset
from ember.data.dataset.in_memory import InMemDataset
from ember.data.dataset.transform.composed import ComposedDataset
from ember.data.dataset.transform.mapper import MapperDataset
from ember.data.dataset.transform.partial import PartialDataset
from ember.data.dataset.transform.sampler import SamplerDataset
from ember.data.dataset.transform.shuffled import ShuffledDataset
from ember.data.dataset.transform.window import WindowsDataset


class Counting(Dataset[int]):
    """Items 100, 101, ...; records every index read, to check laziness."""

    def __init__(self, n: int):
        self.n = n
        self.reads: list[int] = []

    def get(self, index: int) -> int | None:
        if not 0 <= index < self.n:
            return None
        self.reads.append(index)
        return 100 + index

    def __len__(self) -> int:
        return self.n


def numbers(n: int) -> InMemDataset[int]:
    return InMemDataset(range(n))


# ------------------------------------------------------------------ shuffled
def test_shuffled_is_a_seeded_permutation():
    inner = Counting(50)
    shuffled = ShuffledDataset(inner, seed=7)
    assert inner.reads == []  # lazy: nothing read when built
    items = list(shuffled)
    assert len(shuffled) == 50 and sorted(items) == list(range(100, 150))
    assert items != list(range(100, 150))
    assert [shuffled[i] for i in range(50)] == items
    assert shuffled[-1] == items[-1] and shuffled.get(50) is None
    # item i is inner item indices[i]
    assert items == [100 + int(i) for i in shuffled.indices]


def test_shuffled_same_seed_same_order_other_seed_other_order():
    first = list(ShuffledDataset(numbers(30), seed=42))
    assert list(ShuffledDataset(numbers(30), seed=42)) == first
    assert list(ShuffledDataset.with_seed(numbers(30), 42)) == first
    assert list(ShuffledDataset(numbers(30), seed=43)) != first
    # Without a seed a random one is drawn and kept, so the order can be replayed.
    unseeded = ShuffledDataset(numbers(30))
    assert list(ShuffledDataset(numbers(30), unseeded.seed)) == list(unseeded)
    assert list(ShuffledDataset(numbers(30))) != list(unseeded)


def test_shuffled_out_of_range_and_bad_seed():
    shuffled = ShuffledDataset(numbers(3), seed=0)
    with pytest.raises(EmberIndexError, match="ShuffledDataset index 3 is out of range"):
        shuffled[3]
    with pytest.raises(ArgumentError, match="ShuffledDataset: seed must be a non-negative "
                                            "integer, got -1"):
        ShuffledDataset(numbers(3), seed=-1)
    with pytest.raises(ArgumentError, match="ShuffledDataset: expected a Dataset, got list"):
        ShuffledDataset([1, 2, 3], seed=0)  # type: ignore[arg-type]
    assert list(ShuffledDataset(numbers(0), seed=0)) == []


# ------------------------------------------------------------------ sampler
def test_sampler_without_replacement_covers_every_index_once_per_pass():
    sample = SamplerDataset(numbers(10), 25, replacement=False, seed=3)
    items = list(sample)
    assert len(sample) == 25 and len(items) == 25
    assert sorted(items[0:10]) == list(range(10))
    assert sorted(items[10:20]) == list(range(10))
    assert len(set(items[20:25])) == 5  # the last, partial pass repeats nothing
    assert items[0:10] != items[10:20]  # each pass has its own order
    assert [sample[i] for i in reversed(range(25))] == items[::-1]


def test_sampler_smaller_than_the_dataset_without_replacement():
    items = list(SamplerDataset.without_replacement(numbers(100), 40, seed=1))
    assert len(set(items)) == 40 and all(0 <= item < 100 for item in items)


def test_sampler_with_replacement_is_default_and_uniform():
    sample = SamplerDataset(numbers(10), 10_000, seed=5)
    assert sample.replacement
    items = list(sample)
    counts = Counter(items)
    assert set(counts) == set(range(10))
    # 10 000 uniform draws: each count is 1000 +- 30 (sd); 150 is 5 standard deviations.
    assert all(abs(count - 1000) < 150 for count in counts.values()), counts
    # Random access in any order, across the 4096-index blocks, gives the same items.
    for index in (9_999, 0, 4_096, 4_095, 8_192, 17, 9_999):
        assert sample[index] == items[index]


def test_sampler_seeds():
    base = list(SamplerDataset(numbers(20), 50, seed=11))
    assert list(SamplerDataset(numbers(20), 50, seed=11)) == base
    assert list(SamplerDataset.with_replacement(numbers(20), 50, seed=11)) == base
    assert list(SamplerDataset(numbers(20), 50, seed=12)) != base
    assert list(SamplerDataset(numbers(20), 50, replacement=False, seed=11)) != base
    unseeded = SamplerDataset(numbers(20), 50)
    assert list(SamplerDataset(numbers(20), 50, seed=unseeded.seed)) == list(unseeded)


def test_sampler_is_lazy_and_pickles():
    inner = Counting(8)
    sample = SamplerDataset(inner, 1_000_000, seed=2)
    assert inner.reads == []
    item = sample[123_456]
    assert inner.reads == [item - 100]
    assert sample.inner_index(123_456) == item - 100
    copy = pickle.loads(pickle.dumps(sample))
    assert [copy[i] for i in range(0, 1_000_000, 99_999)] == [
        sample[i] for i in range(0, 1_000_000, 99_999)]


def test_sampler_errors():
    sample = SamplerDataset(numbers(3), 4, seed=0)
    with pytest.raises(EmberIndexError, match="SamplerDataset index 4 is out of range for a "
                                              "dataset of 4 items"):
        sample[4]
    assert sample.get(4) is None
    with pytest.raises(ArgumentError, match="SamplerDataset: cannot draw 2 items from an "
                                            "empty dataset"):
        SamplerDataset(numbers(0), 2)
    with pytest.raises(ArgumentError, match="SamplerDataset: size must be an integer >= 0, "
                                            "got -1"):
        SamplerDataset(numbers(3), -1)
    assert len(SamplerDataset(numbers(0), 0)) == 0


# ------------------------------------------------------------------ partial
def test_partial_is_a_view_of_a_range():
    inner = Counting(10)
    part = PartialDataset(inner, 3, 7)
    assert inner.reads == []
    assert len(part) == 4 and list(part) == [103, 104, 105, 106]
    assert part[0] == 103 and part[-1] == 106 and part.get(4) is None
    with pytest.raises(EmberIndexError, match="PartialDataset index 4 is out of range for a "
                                              "dataset of 4 items"):
        part[4]
    assert list(PartialDataset(inner, 5, 5)) == []


def test_partial_bad_range():
    with pytest.raises(ArgumentError, match=r"PartialDataset: the range \[3, 11\) does not fit "
                                            r"a dataset of 10 items"):
        PartialDataset(numbers(10), 3, 11)
    with pytest.raises(ArgumentError, match=r"the range \[5, 4\)"):
        PartialDataset(numbers(10), 5, 4)
    with pytest.raises(ArgumentError, match="PartialDataset: start must be an integer >= 0, "
                                            "got -1"):
        PartialDataset(numbers(10), -1, 4)


def test_partial_split():
    parts = PartialDataset.split(numbers(11), 3)
    assert [list(part) for part in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert [len(part) for part in PartialDataset.split(numbers(2), 3)] == [1, 1, 0]
    with pytest.raises(ArgumentError, match="num must be an integer >= 1, got 0"):
        PartialDataset.split(numbers(3), 0)


def test_shuffled_then_partial_gives_disjoint_splits():
    shuffled = ShuffledDataset(numbers(20), seed=42)
    train, test = PartialDataset(shuffled, 0, 16), PartialDataset(shuffled, 16, 20)
    assert len(train) == 16 and len(test) == 4
    assert sorted([*train, *test]) == list(range(20))
    assert list(test) == list(shuffled)[16:]


# ------------------------------------------------------------------ mapper
def test_mapper_is_lazy():
    inner = Counting(5)
    calls = []

    def square(item: int) -> int:
        calls.append(item)
        return item * item

    mapped = MapperDataset(inner, square)
    assert calls == [] and inner.reads == []
    assert mapped[2] == 102 * 102 and calls == [102] and inner.reads == [2]
    assert mapped[2] == 102 * 102 and calls == [102, 102]  # nothing cached
    assert list(mapped) == [(100 + i) ** 2 for i in range(5)]
    assert mapped.get(5) is None and len(calls) == 7
    with pytest.raises(EmberIndexError, match="MapperDataset index -6 is out of range"):
        mapped[-6]
    with pytest.raises(ArgumentError, match="MapperDataset: mapper must be callable, got int"):
        MapperDataset(inner, 3)  # type: ignore[arg-type]


# ------------------------------------------------------------------ composed
def test_composed_concatenates():
    composed = ComposedDataset([InMemDataset("ab"), InMemDataset([]), InMemDataset("cde"),
                                InMemDataset("f")])
    assert len(composed) == 6
    assert [composed[i] for i in range(6)] == list("abcdef")
    assert list(composed) == list("abcdef")
    assert composed[-1] == "f" and composed.get(6) is None
    with pytest.raises(EmberIndexError, match="ComposedDataset index 6 is out of range"):
        composed[6]
    assert len(ComposedDataset([])) == 0 and list(ComposedDataset([])) == []
    with pytest.raises(ArgumentError, match="ComposedDataset: expected a Dataset, got str"):
        ComposedDataset(["ab"])  # type: ignore[list-item]


# ------------------------------------------------------------------ windows
def test_windows():
    windows = WindowsDataset(numbers(5), 3)
    assert len(windows) == 3
    assert list(windows) == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert windows[-1] == [2, 3, 4] and windows.get(3) is None
    assert list(WindowsDataset(numbers(3), 1)) == [[0], [1], [2]]
    assert list(WindowsDataset(numbers(3), 3)) == [[0, 1, 2]]
    assert len(WindowsDataset(numbers(3), 4)) == 0 and list(WindowsDataset(numbers(3), 4)) == []
    with pytest.raises(EmberIndexError, match="WindowsDataset index 3 is out of range for a "
                                              "dataset of 3 items"):
        windows[3]
    with pytest.raises(ArgumentError, match="WindowsDataset: size must be an integer >= 1, "
                                            "got 0"):
        WindowsDataset(numbers(3), 0)


def test_transforms_compose():
    # Windows over a mapped, composed dataset, then sampled: indices flow through each layer.
    composed = ComposedDataset([numbers(4), InMemDataset(range(10, 13))])
    windows = WindowsDataset(MapperDataset(composed, lambda x: -x), 2)
    assert list(windows) == [[0, -1], [-1, -2], [-2, -3], [-3, -10], [-10, -11], [-11, -12]]
    sample = SamplerDataset(windows, 12, replacement=False, seed=9)
    assert sorted(map(tuple, sample))[::2] == sorted(map(tuple, windows))
