"""DataLoader: batching, reproducible order, workers, splitting, errors."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError
from ember.data.dataloader.batcher import Batcher
from ember.data.dataloader.builder import DataLoaderBuilder
from ember.data.dataloader.loader import DataLoader
from ember.data.dataset.base import Dataset


class Squares(Dataset[int]):
    def __init__(self, n: int):
        self.n = n

    def get(self, index: int) -> int | None:
        return index * index if 0 <= index < self.n else None

    def __len__(self) -> int:
        return self.n


class AsList(Batcher[int, list]):
    """The items themselves; the device is recorded to check where batches are made."""

    def batch(self, items, device):
        return list(items)


class Jittery(AsList):
    """Sleeps a different time per batch, so worker threads finish out of order."""

    def batch(self, items, device):
        time.sleep(0.002 * (items[0] % 5))
        return list(items)


class Failing(AsList):
    def batch(self, items, device):
        if 13 in items:
            raise ValueError("item 13 is broken")
        return list(items)


def loader(n=10, batch_size=3, seed=None, workers=0, batcher=None) -> DataLoader:
    builder = DataLoaderBuilder(batcher or AsList()).batch_size(batch_size).num_workers(workers)
    if seed is not None:
        builder = builder.shuffle(seed)
    return builder.build(list(range(n)))


def flat(batches) -> list[int]:
    return [item for batch in batches for item in batch]


def test_without_shuffle_keeps_dataset_order_and_last_partial_batch():
    data = loader(n=10, batch_size=4)
    assert list(data) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert (len(data), data.num_items(), data.batch_size) == (3, 10, 4)
    assert list(data) == list(data)  # iterating again gives the same epoch


def test_dataset_protocol_items_reach_the_batcher():
    data = DataLoaderBuilder(AsList()).batch_size(2).build(Squares(5))
    assert list(data) == [[0, 1], [4, 9], [16]]


def test_shuffle_sees_every_item_once_per_epoch():
    data = loader(n=103, batch_size=10, seed=3)
    for epoch in range(3):
        data.set_epoch(epoch)
        batches = list(data)
        assert [len(b) for b in batches] == [10] * 10 + [3]
        assert sorted(flat(batches)) == list(range(103))


def test_shuffle_order_depends_only_on_seed_and_epoch():
    first = loader(n=50, seed=5)
    orders = []
    for epoch in range(3):
        first.set_epoch(epoch)
        orders.append(flat(first))
    # a fresh loader jumping straight to epoch 2 (a resumed run) sees the same order
    resumed = loader(n=50, seed=5)
    resumed.set_epoch(2)
    assert flat(resumed) == orders[2]
    assert orders[0] != orders[1] != orders[2]
    assert orders[0] != list(range(50))
    assert flat(loader(n=50, seed=6)) != orders[0]


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_give_the_same_batches_as_no_worker(workers):
    reference = loader(n=61, batch_size=4, seed=9)
    parallel = loader(n=61, batch_size=4, seed=9, workers=workers, batcher=Jittery())
    for epoch in (0, 1):
        reference.set_epoch(epoch)
        parallel.set_epoch(epoch)
        batches = list(parallel)
        assert batches == list(reference)
        assert sorted(flat(batches)) == list(range(61))  # nothing lost or repeated


def test_workers_make_tensor_batches_on_the_loader_device():
    class Column(Batcher[int, Tensor]):
        def batch(self, items, device):
            return Tensor.from_data(np.array(items, np.float32)[:, None] / 2, device=device)

    device = ember.device("ndarray")
    build = DataLoaderBuilder(Column()).batch_size(8).shuffle(1).set_device(device)
    serial = [b.into_data().to_numpy() for b in build.build(list(range(30)))]
    parallel_loader = build.num_workers(2).build(list(range(30)))
    parallel = list(parallel_loader)
    assert all(b.device == device for b in parallel)
    assert len(parallel) == len(serial) == 4
    for got, want in zip(parallel, serial):
        np.testing.assert_array_equal(got.into_data().to_numpy(), want)


def test_failing_batcher_raises_its_error_without_hanging():
    for workers in (0, 2):
        data = loader(n=40, batch_size=4, workers=workers, batcher=Failing())
        outcome = {}

        def run(data=data, outcome=outcome):
            try:
                list(data)
            except ValueError as error:
                outcome["error"] = error

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=20)
        assert not thread.is_alive(), f"iteration hung with {workers} workers"
        assert "item 13 is broken" in str(outcome["error"])


def test_leaving_a_parallel_epoch_early_then_iterating_again():
    data = loader(n=40, batch_size=2, seed=2, workers=2, batcher=Jittery())
    for batch in data:
        first = batch
        break
    assert sorted(flat(data)) == list(range(40))
    assert next(iter(data)) == first


@pytest.mark.parametrize("seed", [None, 4])
def test_split_parts_are_disjoint_and_cover_the_epoch(seed):
    data = loader(n=23, batch_size=3, seed=seed)
    data.set_epoch(1)
    whole = flat(data)
    parts = data.split(3)
    items = [flat(part) for part in parts]
    assert sorted(i for part in items for i in part) == list(range(23))
    assert [len(p) for p in items] == [7, 8, 8]
    assert [part.num_items() for part in parts] == [7, 8, 8]
    assert [len(part) for part in parts] == [3, 3, 3]
    assert [i for part in items for i in part] == whole  # contiguous pieces of the order
    nested = parts[2].split(2)
    assert flat(nested[0]) + flat(nested[1]) == items[2]
    assert flat(data.split(1)[0]) == whole


def test_split_parts_follow_their_epoch():
    parts = loader(n=20, seed=8).split(2)
    for part in parts:
        part.set_epoch(5)
    assert sorted(flat(parts[0]) + flat(parts[1])) == list(range(20))
    before = flat(parts[0])
    parts[0].set_epoch(6)
    assert flat(parts[0]) != before


def test_to_device_copies_the_loader():
    seen = []

    class Record(Batcher[int, list]):
        def batch(self, items, device):
            seen.append(device)
            return list(items)

    base = ember.device("ndarray")
    train = (
        DataLoaderBuilder(Record())
        .batch_size(5)
        .shuffle(3)
        .set_device(base.autodiff())
        .build(list(range(10)))
    )
    train.set_epoch(4)
    valid = train.to_device(base)
    assert valid.device == base and train.device == base.autodiff()
    assert list(valid) == list(train)
    assert seen == [base, base, base.autodiff(), base.autodiff()]
    valid.set_epoch(0)
    assert train.epoch == 4


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: DataLoaderBuilder(AsList()).batch_size(0),
            "batch_size must be an int >= 1, got 0",
        ),
        (
            lambda: DataLoaderBuilder(AsList()).batch_size(True),
            "batch_size must be an int >= 1, got True",
        ),
        (
            lambda: DataLoaderBuilder(AsList()).batch_size(2.0),
            "batch_size must be an int >= 1, got 2.0",
        ),
        (
            lambda: DataLoaderBuilder(AsList()).num_workers(-1),
            "num_workers must be an int >= 0, got -1",
        ),
        (lambda: DataLoaderBuilder(AsList()).shuffle(-3), "seed must be an int >= 0, got -3"),
        (
            lambda: DataLoader([1], AsList(), batch_size=-2),
            "DataLoader: batch_size must be an int >= 1, got -2",
        ),
        (lambda: DataLoader([1], AsList(), num_workers=-1), "DataLoader: num_workers must be"),
        (lambda: loader().split(0), "DataLoader.split: n must be an int >= 1, got 0"),
        (lambda: loader().set_epoch(-1), "epoch must be an int >= 0, got -1"),
    ],
)
def test_bad_settings_raise_argument_errors_naming_the_value(call, message):
    with pytest.raises(ArgumentError) as error:
        call()
    assert message in str(error.value)
