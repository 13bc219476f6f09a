"""HuggingfaceDatasetLoader on local files (no Hub access): the SQLite copy matches
``datasets`` item by item. Skipped when ``datasets`` is not installed."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from ember.backend.errors import EmberError
from ember.data.dataset.base import DatasetError
from ember.data.dataset.huggingface import (
    HuggingfaceDatasetLoader,
    MissingDependencyError,
    store_huggingface,
)
from ember.data.dataset.sqlite import SqliteDataset


@pytest.fixture
def hf(monkeypatch, tmp_path):
    datasets = pytest.importorskip(
        "datasets", reason="Hugging Face `datasets` is not installed (pip install 'ember[hf]')")
    # Never reach the Hub: everything here is built from local files.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    datasets.disable_progress_bars()
    return datasets


def write_csvs(folder):
    train = folder / "train.csv"
    train.write_text('text,label,score\nhello,1,0.5\n"a, b",0,1.25\nünï,2,-3.0\n',
                     encoding="utf-8")
    test = folder / "test.csv"
    test.write_text("text,label,score\nbye,0,2.0\n", encoding="utf-8")
    return {"train": str(train), "test": str(test)}


def test_loader_copies_csv_splits_item_by_item(hf, tmp_path):
    files = write_csvs(tmp_path)
    loader = (HuggingfaceDatasetLoader("csv").with_data_files(files)
              .with_base_dir(tmp_path / "db").with_cache_dir(tmp_path / "cache"))
    storage = loader.dataset_storage()
    assert storage.path == tmp_path / "db" / "csv.db" and not storage.exists()
    train = loader.dataset("train")
    assert isinstance(train, SqliteDataset) and storage.exists()
    assert storage.splits() == ["test", "train"]
    reference = hf.load_dataset("csv", data_files=files, cache_dir=str(tmp_path / "cache"))
    for split in ("train", "test"):
        copy = loader.dataset(split)
        assert len(copy) == len(reference[split])
        for index, row in enumerate(reference[split]):
            assert copy[index] == row
        assert list(copy) == list(reference[split])
    assert train[1] == {"text": "a, b", "label": 0, "score": 1.25}
    assert type(train[2]["label"]) is int and type(train[2]["score"]) is float


def test_loader_reuses_the_stored_file(hf, tmp_path, monkeypatch):
    loader = (HuggingfaceDatasetLoader("csv").with_data_files(write_csvs(tmp_path))
              .with_db_file(tmp_path / "copy.db").with_cache_dir(tmp_path / "cache"))
    assert len(loader.dataset("train")) == 3

    def no_network(*args, **kwargs):
        raise AssertionError("load_dataset called again")

    monkeypatch.setattr(hf, "load_dataset", no_network)
    assert loader.dataset("test")[0] == {"text": "bye", "label": 0, "score": 2.0}
    with pytest.raises(DatasetError, match="datasets could not load 'csv'"):
        loader.load(overwrite=True)
    assert len(loader.dataset("train")) == 3  # the failed re-import left the file intact


def test_store_in_memory_dataset_with_arrays_bytes_and_images(hf, tmp_path):
    Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")

    png = io.BytesIO()
    Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4)).save(png, format="PNG")
    features = hf.Features({
        "image": hf.Image(),
        "pixels": hf.Array2D((2, 2), "float32"),
        "tokens": hf.Sequence(hf.Value("int64")),
        "blob": hf.Value("binary"),
        "label": hf.ClassLabel(names=["cat", "dog"]),
    })
    data = {
        "image": [{"bytes": png.getvalue(), "path": None}] * 2,
        "pixels": [[[1.0, 2.0], [3.0, 4.5]], [[0.0, -1.0], [0.5, 0.25]]],
        "tokens": [[1, 2, 3], []],
        "blob": [b"\x00\x01", b""],
        "label": [1, 0],
    }
    dataset = hf.Dataset.from_dict(data, features=features)
    storage = store_huggingface(dataset, tmp_path / "mem.db")
    copy = storage.reader("train")
    assert storage.splits() == ["train"] and len(copy) == 2
    first = copy[0]
    assert first["image"] == {"bytes": png.getvalue(), "path": None}
    decoded = np.asarray(Image.open(io.BytesIO(first["image"]["bytes"])))
    np.testing.assert_array_equal(decoded, np.arange(12).reshape(3, 4))
    assert first["pixels"] == [[1.0, 2.0], [3.0, 4.5]]
    assert first["tokens"] == [1, 2, 3] and copy[1]["tokens"] == []
    assert first["blob"] == b"\x00\x01" and copy[1]["blob"] == b""
    assert [item["label"] for item in copy] == [1, 0]
    # A DatasetDict stores every split.
    both = store_huggingface(hf.DatasetDict({"a": dataset, "b": dataset.select([1])}),
                             tmp_path / "dict.db")
    assert both.splits() == ["a", "b"] and len(both.reader("b")) == 1
    with pytest.raises(DatasetError, match=r"expected a datasets\.Dataset or DatasetDict, got list"):
        store_huggingface([1, 2], tmp_path / "bad.db")


def test_load_failure_is_a_clear_error(hf, tmp_path):
    loader = (HuggingfaceDatasetLoader("csv").with_data_files(str(tmp_path / "missing.csv"))
              .with_base_dir(tmp_path / "db").with_cache_dir(tmp_path / "cache"))
    with pytest.raises(DatasetError, match="HuggingfaceDatasetLoader: datasets could not load "
                                           "'csv'"):
        loader.dataset("train")
    assert not (tmp_path / "db").exists()  # nothing half-written
    name = HuggingfaceDatasetLoader("user/set").with_subset("v2").with_base_dir(tmp_path)
    assert name.dataset_storage().path == tmp_path / "user_set-v2.db"


def test_missing_datasets_library_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    loader = HuggingfaceDatasetLoader("mnist").with_base_dir(tmp_path)
    with pytest.raises(MissingDependencyError, match=r"pip install 'ember\[hf\]'") as info:
        loader.dataset("train")
    assert isinstance(info.value, ImportError) and isinstance(info.value, EmberError)
    assert "needs Hugging Face's `datasets` library" in str(info.value)
