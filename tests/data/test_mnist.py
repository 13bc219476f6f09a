"""MNIST: the real files, small IDX files, the search order, downloads from a local server."""

from __future__ import annotations

import functools
import gzip
import http.server
import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from ember.backend.errors import ArgumentError
from ember.data.dataset.base import DatasetError, DatasetFileNotFoundError
from ember.data.vision import mnist
from ember.data.vision.idx import read_idx, write_idx
from ember.data.vision.mnist import MnistDataset

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "mnist"
needs_shared = pytest.mark.skipif(
    not (SHARED / "t10k-images-idx3-ubyte.gz").is_file(),
    reason=f"the MNIST files are not in {SHARED}",
)


def idx_bytes(type_code: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    """An IDX file written by hand, independently of ember's writer."""
    return (
        struct.pack(">HBB", 0, type_code, len(shape))
        + struct.pack(f">{len(shape)}I", *shape)
        + payload
    )


def write_split(folder: Path, prefix: str, images: np.ndarray, labels: list[int], gz=False):
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        f"{prefix}-images-idx3-ubyte": idx_bytes(8, images.shape, images.tobytes()),
        f"{prefix}-labels-idx1-ubyte": idx_bytes(8, (len(labels),), bytes(labels)),
    }
    for name, raw in files.items():
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            (folder / name).write_bytes(raw)


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No shared folder, no EMBER_DATASETS, a cache inside tmp_path."""
    monkeypatch.setattr(mnist, "shared_dir", lambda: tmp_path / "no-shared")
    monkeypatch.delenv("EMBER_DATASETS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path


# ------------------------------------------------------------------ the real files
@needs_shared
def test_real_train_split():
    train = MnistDataset.train()
    assert len(train) == 60000
    assert [train[i].label for i in range(5)] == [5, 0, 4, 1, 9]
    assert train[0].image.dtype == np.uint8 and train[0].image.shape == (28, 28)
    assert int(train[0].image.max()) == 255 and int(train[0].image[0, 0]) == 0
    counts = np.bincount(train.labels, minlength=10).tolist()
    assert counts == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert train.get(60000) is None and train[-1].label == train.get(59999).label


@needs_shared
def test_real_test_split_is_found_beside_the_checkout(monkeypatch):
    monkeypatch.delenv("EMBER_DATASETS", raising=False)
    test = MnistDataset.test(download=False)
    assert test.files[0].parent == SHARED
    assert len(test) == 10000
    assert [test[i].label for i in range(5)] == [7, 2, 1, 0, 4]
    assert np.bincount(test.labels, minlength=10).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]


# ------------------------------------------------------------------ small files
@pytest.mark.parametrize("gz", [False, True])
def test_small_files_in_root(isolated, gz):
    images = np.arange(3 * 28 * 28, dtype=np.uint32).reshape(3, 28, 28).astype(np.uint8)
    write_split(isolated / "digits", "t10k", images, [4, 0, 9], gz=gz)
    data = MnistDataset.test(isolated / "digits", download=False)
    assert len(data) == 3 and [item.label for item in data] == [4, 0, 9]
    np.testing.assert_array_equal(data[2].image, images[2])
    assert data.files[0].name.endswith(".gz") == gz


def test_search_order_root_then_env_then_shared_then_cache(isolated, monkeypatch):
    image = np.zeros([1, 28, 28], np.uint8)
    for folder, label in [("env/mnist", 1), ("no-shared", 2), ("cache", 3)]:
        write_split(isolated / folder, "t10k", image, [label])
    monkeypatch.setenv("EMBER_DATASETS", str(isolated / "env"))
    found = MnistDataset.test(isolated / "empty-root", cache_dir=isolated / "cache", download=False)
    assert found[0].label == 1
    monkeypatch.delenv("EMBER_DATASETS")
    assert MnistDataset.test(cache_dir=isolated / "cache", download=False)[0].label == 2
    shutil.rmtree(isolated / "no-shared")
    assert MnistDataset.test(cache_dir=isolated / "cache", download=False)[0].label == 3
    write_split(isolated / "root", "t10k", image, [4])
    assert MnistDataset.test(isolated / "root", cache_dir=isolated / "cache")[0].label == 4


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x12\x34\x08\x01\x00\x00\x00\x02\x01\x02", "not an IDX file: magic number 0x12340801"),
        (b"", "not an IDX file: magic number 0xempty"),
        (b"\x00\x00\x08\x03\x00\x00", "truncated IDX header"),
        (
            idx_bytes(8, (5,), b"\x01\x02"),
            "truncated IDX file: a uint8 array of shape [5] takes 13 bytes, the file has 10",
        ),
        (idx_bytes(8, (1,), b"\x01\x02"), "too long IDX file"),
        (b"\x1f\x8b\x08\x00garbage", "not a valid gzip file"),
    ],
)
def test_bad_idx_files_are_typed_errors_naming_the_file(tmp_path, raw, message):
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(raw)
    with pytest.raises(DatasetError) as error:
        read_idx(path)
    assert message in str(error.value) and str(path) in str(error.value)
    assert error.value.file == str(path)


def test_truncated_gzipped_split_names_the_file(isolated):
    folder = isolated / "digits"
    write_split(folder, "t10k", np.zeros([4, 28, 28], np.uint8), [1, 2, 3, 4], gz=True)
    images = folder / "t10k-images-idx3-ubyte.gz"
    raw = gzip.decompress(images.read_bytes())
    images.write_bytes(gzip.compress(raw[:-100]))
    with pytest.raises(DatasetError, match="truncated IDX file") as error:
        MnistDataset.test(folder, download=False)
    assert str(images) in str(error.value)


def test_files_of_the_wrong_layout_are_rejected(isolated):
    folder = isolated / "digits"
    write_split(folder, "t10k", np.zeros([2, 27, 28], np.uint8), [1, 2])
    with pytest.raises(
        DatasetError, match=r"uint8 of shape \[n, 28, 28\], got uint8 of shape \[2, 27, 28\]"
    ):
        MnistDataset.test(folder, download=False)
    write_split(folder, "t10k", np.zeros([2, 28, 28], np.uint8), [1, 2, 3])
    with pytest.raises(DatasetError, match=r"expected 2 uint8 labels .* got uint8 of shape \[3\]"):
        MnistDataset.test(folder, download=False)


def test_unknown_split():
    with pytest.raises(ArgumentError, match="split must be 'train' or 'test', got 'valid'"):
        MnistDataset("valid")


def test_write_idx_round_trips_wider_types(tmp_path):
    values = np.array([[1.5, -2.0], [3.25, 0.0]], np.float32)
    write_idx(tmp_path / "x.gz", values)
    assert gzip.decompress((tmp_path / "x.gz").read_bytes())[:4] == b"\x00\x00\x0d\x02"
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz"), values)
    with pytest.raises(ArgumentError, match="got int64 with 1 dims"):
        write_idx(tmp_path / "y", np.arange(3, dtype=np.int64))


# ------------------------------------------------------------------ downloads
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over tmp_path/www; yields its base URL."""
    root = tmp_path / "www"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root))
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@needs_shared
def test_download_from_the_first_mirror_that_serves_intact_files(isolated, server):
    www = isolated / "www"
    (www / "good").mkdir()
    (www / "corrupt").mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(SHARED / name, www / "good" / name)
        (www / "corrupt" / name).write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x00"))
    cache = isolated / "cache"
    mirrors = [f"{server}/missing/", f"{server}/corrupt", f"{server}/good/"]
    data = MnistDataset.test(cache_dir=cache, mirrors=mirrors)
    assert len(data) == 10000 and [data[i].label for i in range(3)] == [7, 2, 1]
    assert sorted(p.name for p in cache.iterdir()) == [
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ]
    assert data.files[0].parent == cache
    # the next time the cache is found; no mirror is asked
    again = MnistDataset.test(cache_dir=cache, mirrors=[], download=False)
    np.testing.assert_array_equal(again.images[:5], data.images[:5])


def test_everything_failing_lists_where_it_looked_and_why(isolated, server):
    www = isolated / "www"
    (www / "corrupt").mkdir()
    (www / "corrupt" / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    cache = isolated / "cache"
    mirrors = [f"{server}/corrupt/", f"{server}/nothing-here/"]
    with pytest.raises(DatasetFileNotFoundError) as error:
        MnistDataset.test(isolated / "root", cache_dir=cache, mirrors=mirrors, timeout=5)
    message = str(error.value)
    for folder in (isolated / "root", isolated / "no-shared", cache):
        assert (
            f"- {folder}: no t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]" in message
        )
    assert f"downloading into {cache} failed" in message
    assert f"{server}/corrupt/t10k-images-idx3-ubyte.gz: not a valid gzip file" in message
    assert f"{server}/nothing-here/t10k-images-idx3-ubyte.gz: HTTP Error 404" in message
    assert not cache.exists() or not any(cache.iterdir())  # nothing half-written


def test_corrupt_download_is_not_kept(isolated, server):
    www = isolated / "www"
    (www / "t10k-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes(8, (3,), b"\x01\x02\x03"))
    )
    cache = isolated / "cache"
    write_split(cache, "t10k", np.zeros([1, 28, 28], np.uint8), [1])
    (cache / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(
        DatasetFileNotFoundError, match="corrupt download: expected 10008 bytes with MD5 27ae3e4e"
    ):
        MnistDataset.test(cache_dir=cache, mirrors=[server])
    assert sorted(p.name for p in cache.iterdir()) == ["t10k-images-idx3-ubyte"]


def test_download_off_says_so(isolated):
    with pytest.raises(DatasetFileNotFoundError, match=r"downloading is off \(download=False\)"):
        MnistDataset.train(cache_dir=isolated / "cache", download=False)
