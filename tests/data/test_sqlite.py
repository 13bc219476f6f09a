"""SqliteDataset and its writer: round trips, errors, atomic writes, streaming from disk."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import sqlite3
import threading
import tracemalloc
from typing import NamedTuple

import numpy as np
import pytest

from ember.backend.errors import ArgumentError, EmberIndexError
from ember.data.dataset.base import DatasetError, DatasetFileNotFoundError
from ember.data.dataset.sqlite import (
    SqliteDataset,
    SqliteDatasetStorage,
    SqliteDatasetWriter,
    decode_item,
    encode_item,
)
from ember.data.dataset.transform.shuffled import ShuffledDataset


@dataclasses.dataclass
class Sample:
    label: int
    weight: float
    text: str
    raw: bytes
    image: np.ndarray
    extra: dict


class Pair(NamedTuple):
    left: int
    right: str


def make_sample(i: int) -> Sample:
    return Sample(label=i - 2, weight=i / 3, text=f"é-{i}" * i, raw=bytes(range(i, i + 5)),
                  image=np.arange(6, dtype=np.float32).reshape(2, 3) * i,
                  extra={"tags": ["a", i], "none": None, "flag": i % 2 == 0})


def assert_same_sample(got: Sample, want: Sample) -> None:
    assert type(got) is Sample
    assert (got.label, got.weight, got.text, got.raw, got.extra) == (
        want.label, want.weight, want.text, want.raw, want.extra)
    assert type(got.label) is int and type(got.weight) is float and type(got.raw) is bytes
    assert got.image.dtype == want.image.dtype and got.image.shape == want.image.shape
    np.testing.assert_array_equal(got.image, want.image)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "data.db"
    with SqliteDatasetWriter(path) as writer:
        assert writer.write_all("train", (make_sample(i) for i in range(5))) == 5
        assert writer.write("test", make_sample(9)) == 0
        assert writer.write("test", make_sample(10)) == 1
        assert len(writer) == 7
    return path


def test_dataclass_round_trip(db):
    train = SqliteDataset(db, "train", Sample)
    assert len(train) == 5
    for i in range(5):
        assert_same_sample(train[i], make_sample(i))
    assert_same_sample(train[-1], make_sample(4))
    items = list(train)
    assert len(items) == 5
    for i, item in enumerate(items):
        assert_same_sample(item, make_sample(i))
    test = SqliteDataset(db, "test", Sample)
    assert [item.label for item in test] == [7, 8]


def test_items_without_item_type_are_dicts(db):
    item = SqliteDataset(db, "train")[3]
    assert isinstance(item, dict)
    assert list(item) == ["label", "weight", "text", "raw", "image", "extra"]
    assert item["label"] == 1 and item["raw"] == bytes([3, 4, 5, 6, 7])
    # arrays come back writable
    item["image"][0, 0] = 5.0
    assert item["image"][0, 0] == 5.0


def test_converter_item_type(db):
    labels = SqliteDataset(db, "train", lambda item: item["label"] * 10)
    assert list(labels) == [-20, -10, 0, 10, 20]


def test_out_of_range(db):
    train = SqliteDataset(db, "train")
    assert train.get(5) is None and train.get(-1) is None
    assert train.get(np.int64(4))["label"] == 2 and train[np.int32(-1)]["label"] == 2
    with pytest.raises(EmberIndexError, match="SqliteDataset index 5 is out of range for a "
                                              "dataset of 5 items"):
        train[5]
    with pytest.raises(EmberIndexError, match="SqliteDataset index -6 is out of range"):
        train[-6]


@pytest.mark.parametrize("value", [
    np.array([[1, 2], [3, 4]], dtype=np.int64),
    np.array([True, False]),
    np.zeros((0, 3), dtype=np.float16),
    np.arange(12, dtype=np.uint8).reshape(2, 2, 3)[:, ::-1],  # not contiguous
    np.array([1.5, -2.25], dtype=">f8"),  # big-endian
    np.array(["ab", "xyz"]),
    np.array([1 + 2j], dtype=np.complex64),
])
def test_numpy_array_round_trip(value):
    got = decode_item(encode_item({"a": value}))["a"]
    assert isinstance(got, np.ndarray) and got.flags.writeable
    assert got.shape == value.shape and got.dtype == value.dtype.newbyteorder("=")
    np.testing.assert_array_equal(got, value)


def test_plain_values_and_numpy_scalars_round_trip():
    item = {"int": -(2**63), "big": 2**64 - 1, "float": 0.1, "nan": float("nan"), "s": "",
            "b": b"\x00\xff", "list": [1, [2.5, "x"]], "tuple": (1, 2), "none": None,
            "i32": np.int32(-7), "f64": np.float64(2.5), "bool": np.bool_(True), 3: "int key"}
    got = decode_item(encode_item(item))
    assert got["int"] == -(2**63) and got["big"] == 2**64 - 1 and got["float"] == 0.1
    assert np.isnan(got["nan"]) and got["s"] == "" and got["b"] == b"\x00\xff"
    assert got["list"] == [1, [2.5, "x"]] and got["tuple"] == [1, 2] and got["none"] is None
    assert type(got["i32"]) is np.int32 and got["i32"] == -7
    assert type(got["f64"]) is float and got["f64"] == 2.5  # np.float64 is a float subclass
    assert type(got["bool"]) is np.bool_ and got["bool"]
    assert got[3] == "int key"
    assert decode_item(encode_item("just a string")) == "just a string"


def test_named_tuple_items(tmp_path):
    path = tmp_path / "pairs.db"
    with SqliteDatasetWriter(path) as writer:
        writer.write_all("train", [Pair(1, "a"), Pair(2, "b")])
    assert SqliteDataset(path, "train")[1] == {"left": 2, "right": "b"}
    assert list(SqliteDataset(path, "train", Pair)) == [Pair(1, "a"), Pair(2, "b")]


def test_unsupported_values_are_rejected(tmp_path):
    with pytest.raises(ArgumentError, match="cannot encode the item: cannot store a value of "
                                            "type object"):
        encode_item({"x": object()})
    with pytest.raises(ArgumentError, match="object and structured dtypes are not supported"):
        encode_item(np.array([object()]))
    with pytest.raises(ArgumentError, match="cannot encode the item"):
        encode_item({"x": 2**64})
    # A failed write keeps what was written before it.
    writer = SqliteDatasetWriter(tmp_path / "x.db")
    writer.write_all("train", [{"a": 1}])
    with pytest.raises(ArgumentError):
        writer.write_all("train", [{"a": 2}, {"a": object()}])
    writer.set_completed()
    assert list(SqliteDataset(tmp_path / "x.db", "train")) == [{"a": 1}, {"a": 2}]


def test_file_layout_is_plain_sqlite(db):
    # The documented format: a marker table and one (row_id, item) table per split.
    with sqlite3.connect(db) as connection:
        meta = dict(connection.execute("SELECT key, value FROM ember_dataset"))
        assert meta["format"] == "ember.sqlite-dataset" and meta["version"] == "1"
        rows = connection.execute("SELECT row_id, item FROM test ORDER BY row_id").fetchall()
    connection.close()
    assert [row_id for row_id, _ in rows] == [0, 1]
    assert decode_item(rows[1][1])["label"] == 8


def test_storage(tmp_path):
    storage = SqliteDatasetStorage.from_name("toy", tmp_path / "cache")
    assert storage.path == tmp_path / "cache" / "toy.db" and not storage.exists()
    with storage.writer() as writer:
        writer.write_all("valid", [{"x": 1}])
        writer.write_all("a split", [{"x": 2}, {"x": 3}])
    assert storage.exists() and storage.splits() == ["a split", "valid"]
    assert list(storage.reader("a split", lambda item: item["x"])) == [2, 3]
    assert SqliteDatasetStorage.from_file(storage.path).splits() == ["a split", "valid"]


def test_read_errors(db, tmp_path):
    with pytest.raises(DatasetError, match=rf"{re.escape(str(db))}: no split 'valid'; the file holds 'test', "
                                           rf"'train'"):
        SqliteDataset(db, "valid")
    missing = tmp_path / "missing.db"
    with pytest.raises(DatasetFileNotFoundError, match=f"SQLite dataset file {re.escape(str(missing))} does "
                                                       f"not exist"):
        SqliteDataset(missing, "train")
    not_sqlite = tmp_path / "text.db"
    not_sqlite.write_text("hello " * 200)
    with pytest.raises(DatasetError, match=rf"{re.escape(str(not_sqlite))} is not an ember SQLite dataset"):
        SqliteDataset(not_sqlite, "train")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE train (x)")
    connection.close()
    with pytest.raises(DatasetError, match=rf"{re.escape(str(other))} is not an ember SQLite dataset "
                                           rf"\(no such table: ember_dataset\)"):
        SqliteDataset(other, "train")
    with pytest.raises(ArgumentError, match="the split name 'ember_dataset' is reserved"):
        SqliteDataset(db, "ember_dataset")


def test_newer_format_version_is_refused(db):
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE ember_dataset SET value = '2' WHERE key = 'version'")
    connection.close()
    with pytest.raises(DatasetError, match=r"written by a newer ember \(format version 2, this "
                                           r"ember reads up to 1\); upgrade ember"):
        SqliteDataset(db, "train")


def test_corrupt_row_names_the_row(db):
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE train SET item = x'c1' WHERE row_id = 2")
    connection.close()
    train = SqliteDataset(db, "train")
    assert train[1]["label"] == -1
    with pytest.raises(DatasetError, match=rf"{re.escape(str(db))}: split 'train', row 2 is corrupt"):
        train[2]


# ------------------------------------------------------------------ atomic writes
def leftovers(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


def test_writer_failure_leaves_no_file(tmp_path):
    path = tmp_path / "data.db"
    with pytest.raises(RuntimeError, match="crash"), SqliteDatasetWriter(path) as writer:
        writer.write_all("train", [{"a": i} for i in range(100)])
        raise RuntimeError("crash")
    assert not path.exists() and leftovers(tmp_path) == []


def test_writer_failure_keeps_the_old_file(db):
    before = db.read_bytes()
    writer = SqliteDatasetWriter(db, overwrite=True)
    writer.write_all("train", [{"new": True}])
    # Until completed, the old database is what readers see.
    assert len(SqliteDataset(db, "train")) == 5
    assert len(leftovers(db.parent)) == 1
    writer.abort()
    assert db.read_bytes() == before and leftovers(db.parent) == []


def test_writer_overwrite_and_reuse_errors(db):
    with pytest.raises(ArgumentError, match=rf"SqliteDatasetWriter: {re.escape(str(db))} already exists; pass "
                                            rf"overwrite=True to replace it"):
        SqliteDatasetWriter(db)
    with SqliteDatasetWriter(db, overwrite=True) as writer:
        writer.write("train", {"v": 1})
    assert list(SqliteDataset(db, "train")) == [{"v": 1}]
    assert SqliteDatasetStorage(db).splits() == ["train"]
    with pytest.raises(ArgumentError, match="is already completed or aborted"):
        writer.write("train", {"v": 2})
    with pytest.raises(DatasetFileNotFoundError, match=r"the directory .*nowhere does not exist"):
        SqliteDatasetWriter(db.parent / "nowhere" / "x.db")
    with pytest.raises(ArgumentError, match="a split name must be a non-empty string, got ''"):
        SqliteDatasetWriter(db.parent / "y.db").write("", {})


def test_empty_split(tmp_path):
    with SqliteDatasetWriter(tmp_path / "e.db") as writer:
        writer.write_all("train", [])
    empty = SqliteDataset(tmp_path / "e.db", "train")
    assert len(empty) == 0 and list(empty) == [] and empty.get(0) is None


# ------------------------------------------------------------------ concurrency
def test_threads_and_pickle(db):
    train = SqliteDataset(db, "train", Sample)
    shuffled = ShuffledDataset(train, seed=1)
    results: dict[int, list[int]] = {}

    def read(worker: int) -> None:
        results[worker] = [shuffled[i].label for i in range(len(shuffled))]

    threads = [threading.Thread(target=read, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [int(i) - 2 for i in shuffled.indices]
    assert results == {w: expected for w in range(4)}
    copy = pickle.loads(pickle.dumps(train))
    assert len(copy) == 5 and copy[4].label == 2
    # get() during an iteration does not disturb it
    labels = [(item.label, train[0].label) for item in train]
    assert labels == [(i - 2, -2) for i in range(5)]
    train.close()
    assert train[1].label == -1  # reopens after close


# ------------------------------------------------------------------ streaming
def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        return None


def test_dataset_larger_than_memory_streams_with_bounded_memory(tmp_path):
    """200 MB of items written and read back while Python holds at most a few of them."""
    count, nbytes = 400, 512 * 1024  # 400 items of 0.5 MiB: 200 MiB
    total = count * nbytes
    path = tmp_path / "big.db"

    def items():
        for i in range(count):
            yield {"index": i, "data": np.full(nbytes, i % 251, dtype=np.uint8)}

    tracemalloc.start()
    try:
        with SqliteDatasetWriter(path) as writer:
            writer.write_all("train", items())
        _, write_peak = tracemalloc.get_traced_memory()
        assert path.stat().st_size > total
        tracemalloc.reset_peak()
        rss_start, rss_peak = rss_bytes(), 0
        dataset = SqliteDataset(path, "train")
        seen = 0
        for i, item in enumerate(dataset):
            assert item["index"] == i
            data = item["data"]
            assert data.shape == (nbytes,) and data[0] == i % 251 and data[-1] == i % 251
            seen += data.nbytes
            if rss_start is not None and i % 20 == 0:
                rss_peak = max(rss_peak, rss_bytes() - rss_start)
        _, read_peak = tracemalloc.get_traced_memory()
        # Random access also reads one row at a time.
        assert dataset[count - 1]["data"][7] == (count - 1) % 251
    finally:
        tracemalloc.stop()
    assert seen == total
    # A handful of items (blob, decoded array) at a time: far below the 200 MiB of data.
    assert write_peak < 16 * nbytes, write_peak
    assert read_peak < 16 * nbytes, read_peak
    if rss_start is not None:
        assert rss_peak < total // 4, rss_peak
