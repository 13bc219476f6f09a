"""MNIST: 70 000 handwritten digits, read from local IDX files or downloaded once.

Where the files are looked for, in this order (the first folder that holds both files
of the split wins; each file may be gzipped, ``name.gz``, or not):

1. the ``root`` folder passed to :class:`MnistDataset`, when one is;
2. ``$EMBER_DATASETS/mnist``, when the ``EMBER_DATASETS`` environment variable is set;
3. ``shared/datasets/mnist`` beside the ember checkout (the folder ``../shared/datasets/mnist``
   seen from the repository root, found from ``ember.__file__`` as
   ``Path(ember.__file__).parents[2].parent``), so a source checkout with its shared
   data runs offline;
4. the cache folder, ``$XDG_CACHE_HOME/ember/mnist`` (``~/.cache/ember/mnist`` by default).

When none has them, the gzipped files are downloaded from the usual mirrors into the
cache folder; each download is checked (the decompressed size and MD5 of the original
distribution) before it is renamed into place, so an interrupted or corrupt download
never leaves a file behind. When that fails too, :class:`DatasetFileNotFoundError`
lists every folder looked in and every download that failed, with why.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import ember
from ember.atomic import atomic_write
from ember.backend.errors import ArgumentError
from ember.data.dataset.base import Dataset, DatasetError, DatasetFileNotFoundError
from ember.data.vision.idx import read_idx

MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
"""The download mirrors, tried in order; each serves ``<file>.gz`` under its URL."""


@dataclass(frozen=True)
class _IdxFile:
    name: str  # without ".gz"
    size: int  # decompressed bytes
    md5: str  # of the decompressed bytes, as distributed by the original site


_SPLITS: dict[str, tuple[_IdxFile, _IdxFile]] = {
    "train": (
        _IdxFile("train-images-idx3-ubyte", 47_040_016, "6bbc9ace898e44ae57da46a324031adb"),
        _IdxFile("train-labels-idx1-ubyte", 60_008, "a25bea736e30d166cdddb491f175f624"),
    ),
    "test": (
        _IdxFile("t10k-images-idx3-ubyte", 7_840_016, "2646ac647ad5339dbf082846283269ea"),
        _IdxFile("t10k-labels-idx1-ubyte", 10_008, "27ae3e4e09519cfbb04c329615203637"),
    ),
}


@dataclass(frozen=True, eq=False)
class MnistItem:
    """One digit: a ``[28, 28]`` uint8 image (0 is the background) and its label, 0 to 9."""

    image: np.ndarray
    label: int


def default_cache_dir() -> Path:
    """Where downloads go: ``$XDG_CACHE_HOME/ember/mnist``, else ``~/.cache/ember/mnist``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ember" / "mnist"


def shared_dir() -> Path:
    """``shared/datasets/mnist`` beside the checkout ember runs from (it may not exist)."""
    # ember/__init__.py -> ember -> src -> the repository root; its parent holds shared/.
    return Path(ember.__file__).resolve().parents[2].parent / "shared" / "datasets" / "mnist"


def search_dirs(
    root: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
) -> list[Path]:
    """The folders MNIST is looked for in, in order (see the module's notes)."""
    dirs = [] if root is None else [Path(root)]
    datasets = os.environ.get("EMBER_DATASETS")
    if datasets:
        dirs.append(Path(datasets) / "mnist")
    dirs.append(shared_dir())
    dirs.append(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    return dirs


class MnistDataset(Dataset[MnistItem]):
    """The MNIST digits of one split, ``"train"`` (60 000 items) or ``"test"`` (10 000).

    The whole split is read into memory at construction (55 MB for ``train``); items
    are views of it. ``MnistDataset.train()`` / ``MnistDataset.test()`` find the files
    as the module's notes say, downloading them when nothing local has them.

    Args:
        split: ``"train"`` or ``"test"``.
        root: a folder to look in first. Default: none.
        cache_dir: where downloads go, and the last folder looked in.
            Default: :func:`default_cache_dir`.
        download: whether to download when no folder has the files. Default: True.
        mirrors: base URLs to download from, tried in order. Default: :data:`MIRRORS`.
        timeout: seconds to wait on each download connection. Default: 30.

    Raises:
        DatasetFileNotFoundError: no folder has the files and no download succeeded.
        DatasetError: a file found is not a valid IDX file of MNIST's layout.

    Example:
        >>> import pathlib, tempfile
        >>> import numpy as np
        >>> from ember.data.vision.idx import write_idx
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> write_idx(folder / "t10k-images-idx3-ubyte", np.zeros([2, 28, 28], np.uint8))
        >>> write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.array([7, 2], np.uint8))
        >>> digits = MnistDataset.test(folder)
        >>> len(digits), digits[1].label, digits[1].image.shape, digits.get(2)
        (2, 2, (28, 28), None)
    """

    def __init__(
        self,
        split: str = "train",
        root: str | os.PathLike | None = None,
        *,
        cache_dir: str | os.PathLike | None = None,
        download: bool = True,
        mirrors: Sequence[str] = MIRRORS,
        timeout: float = 30.0,
    ) -> None:
        if split not in _SPLITS:
            raise ArgumentError(f"MnistDataset: split must be 'train' or 'test', got {split!r}")
        self.split = split
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        images_file, labels_file = _locate(
            split, search_dirs(root, cache), cache, download, tuple(mirrors), timeout
        )
        self.files = (images_file, labels_file)
        self.images = read_idx(images_file)
        self.labels = read_idx(labels_file)
        if self.images.dtype != np.uint8 or self.images.shape[1:] != (28, 28):
            raise DatasetError(
                f"{images_file}: expected MNIST images, uint8 of shape [n, 28, 28], got "
                f"{self.images.dtype} of shape {list(self.images.shape)}",
                file=str(images_file),
            )
        if self.labels.dtype != np.uint8 or self.labels.shape != self.images.shape[:1]:
            raise DatasetError(
                f"{labels_file}: expected {len(self.images)} uint8 labels (one per image of "
                f"{images_file}), got {self.labels.dtype} of shape {list(self.labels.shape)}",
                file=str(labels_file),
            )

    @classmethod
    def train(cls, root: str | os.PathLike | None = None, **options) -> MnistDataset:
        """The 60 000 training digits (options as for the constructor)."""
        return cls("train", root, **options)

    @classmethod
    def test(cls, root: str | os.PathLike | None = None, **options) -> MnistDataset:
        """The 10 000 test digits (options as for the constructor)."""
        return cls("test", root, **options)

    def get(self, index: int) -> MnistItem | None:
        if not 0 <= index < len(self.labels):
            return None
        return MnistItem(self.images[index], int(self.labels[index]))

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return f"MnistDataset(split={self.split!r}, len={len(self)})"


def _find(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _locate(
    split: str,
    dirs: list[Path],
    cache: Path,
    download: bool,
    mirrors: tuple[str, ...],
    timeout: float,
) -> tuple[Path, Path]:
    files = _SPLITS[split]
    looked = []
    for folder in dirs:
        found = [_find(folder, f.name) for f in files]
        if all(found):
            return found[0], found[1]  # type: ignore[return-value]
        missing = " and ".join(f"{f.name}[.gz]" for f, path in zip(files, found) if path is None)
        looked.append(f"  - {folder}: no {missing}")

    failures: list[str] = []
    if download:
        downloaded = [_download(f, cache, mirrors, timeout, failures) for f in files]
        if all(downloaded):
            return downloaded[0], downloaded[1]  # type: ignore[return-value]
        tried = "\n".join(failures) if failures else "  - no mirror was given"
        fetch = f"downloading into {cache} failed:\n{tried}"
    else:
        fetch = "downloading is off (download=False)"
    raise DatasetFileNotFoundError(
        f"MnistDataset: the {split!r} split was not found and could not be downloaded.\n"
        f"Looked in:\n" + "\n".join(looked) + f"\nThen {fetch}\n"
        f"Put the MNIST IDX files into one of these folders, set EMBER_DATASETS to a folder "
        f"holding mnist/, or pass root=<folder>."
    )


def _download(
    file: _IdxFile, cache: Path, mirrors: tuple[str, ...], timeout: float, failures: list[str]
) -> Path | None:
    """The cached copy of ``file`` after fetching it from the first mirror that serves it intact."""
    cached = _find(cache, file.name)
    if cached is not None:
        return cached
    target = cache / f"{file.name}.gz"
    for mirror in mirrors:
        url = f"{mirror.rstrip('/')}/{file.name}.gz"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                raw = response.read()
            _verify(raw, file)
            cache.mkdir(parents=True, exist_ok=True)
            atomic_write(target, raw)
            return target
        except (OSError, DatasetError) as error:  # URLError, HTTPError and timeouts are OSErrors
            failures.append(f"  - {url}: {error}")
    return None


def _verify(raw: bytes, file: _IdxFile) -> None:
    try:
        payload = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as error:
        raise DatasetError(f"not a valid gzip file ({error})") from None
    md5 = hashlib.md5(payload, usedforsecurity=False).hexdigest()
    if len(payload) != file.size or md5 != file.md5:
        raise DatasetError(
            f"corrupt download: expected {file.size} bytes with MD5 {file.md5} once "
            f"decompressed, got {len(payload)} bytes with MD5 {md5}"
        )
