"""HuggingfaceDatasetLoader: imports a dataset with Hugging Face's ``datasets`` library
and stores its splits in an ember SQLite dataset file.

``datasets`` is an optional dependency: ``pip install 'ember[hf]'``. It is imported
only when a dataset is actually loaded, so ``import ember.data`` works without it.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ember.backend.errors import EmberError
from ember.data.dataset.base import DatasetError
from ember.data.dataset.sqlite import (
    SqliteDataset,
    SqliteDatasetStorage,
    SqliteDatasetWriter,
    default_base_dir,
)

_BATCH = 1000  # rows read from Arrow at a time while importing


class MissingDependencyError(EmberError, ImportError):
    """An optional library that the feature needs is not installed; the message says
    which ``pip install`` provides it."""


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependencyError(
            "HuggingfaceDatasetLoader needs Hugging Face's `datasets` library, which is "
            "not installed; install it with: pip install 'ember[hf]'") from exc
    return datasets


@dataclasses.dataclass(frozen=True)
class HuggingfaceDatasetLoader:
    """Loads a Hugging Face dataset once, stores it as a
    :class:`~ember.data.dataset.sqlite.SqliteDataset` file and reads it from there.

    The first :meth:`dataset` call runs ``datasets.load_dataset`` and writes every split
    to ``<base_dir>/<name>[-<subset>].db`` (``/`` in the name becomes ``_``); later calls,
    in this process or another, read the file without starting ``datasets`` at all.
    Values are stored as ``datasets`` yields them in Python (numbers, strings, lists,
    dicts); image and audio columns are stored undecoded, as ``{"bytes", "path"}`` maps;
    dates and times as ISO 8601 strings. Each ``with_*`` method returns a new loader.

    Args:
        name: the dataset's name on the Hub (``"mnist"``, ``"user/set"``) or a packaged
            builder (``"csv"``, ``"json"``, ``"parquet"``, ...) with :meth:`with_data_files`.
        subset: the configuration (subset) name, if the dataset has several.

    Raises:
        MissingDependencyError: ``datasets`` is not installed (when loading).
        DatasetError: ``datasets`` could not load the dataset (no network, unknown name).

    Example:
        >>> import pathlib, tempfile
        >>> from ember.data.dataset.huggingface import HuggingfaceDatasetLoader
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (folder / "train.csv").write_text("text,label\\nhi,1\\nbye,0\\n")
        >>> loader = (HuggingfaceDatasetLoader("csv")
        ...           .with_data_files({"train": str(folder / "train.csv")})
        ...           .with_base_dir(folder / "db").with_cache_dir(folder / "cache"))
        >>> loader.dataset_storage().path.name
        'csv.db'
        >>> train = loader.dataset("train")  # doctest: +SKIP
        >>> train[0]  # doctest: +SKIP
        {'text': 'hi', 'label': 1}
    """

    name: str
    subset: str | None = None
    base_dir: Path | None = None
    db_file: Path | None = None
    cache_dir: Path | None = None
    token: str | None = None
    data_files: Any = None
    trust_remote_code: bool | None = None

    def with_subset(self, subset: str) -> HuggingfaceDatasetLoader:
        """The dataset's configuration (subset) ``subset``."""
        return dataclasses.replace(self, subset=subset)

    def with_base_dir(self, base_dir: str | os.PathLike) -> HuggingfaceDatasetLoader:
        """Stores the database in ``base_dir`` (default ``~/.cache/ember-dataset``, or
        ``$EMBER_DATASET_DIR``)."""
        return dataclasses.replace(self, base_dir=Path(base_dir))

    def with_db_file(self, db_file: str | os.PathLike) -> HuggingfaceDatasetLoader:
        """Stores the database exactly at ``db_file`` (overrides the base directory)."""
        return dataclasses.replace(self, db_file=Path(db_file))

    def with_cache_dir(self, cache_dir: str | os.PathLike) -> HuggingfaceDatasetLoader:
        """``datasets``' own cache directory (its ``cache_dir``)."""
        return dataclasses.replace(self, cache_dir=Path(cache_dir))

    def with_huggingface_token(self, token: str) -> HuggingfaceDatasetLoader:
        """The Hub access token for private or gated datasets."""
        return dataclasses.replace(self, token=token)

    def with_data_files(self, data_files: Any) -> HuggingfaceDatasetLoader:
        """Local files for a packaged builder: a path, a list, or ``{split: path(s)}``."""
        return dataclasses.replace(self, data_files=data_files)

    def with_trust_remote_code(self, trust: bool) -> HuggingfaceDatasetLoader:
        """Passed to ``load_dataset`` for datasets defined by a script (older
        ``datasets`` releases only)."""
        return dataclasses.replace(self, trust_remote_code=trust)

    def dataset_storage(self) -> SqliteDatasetStorage:
        """The storage the dataset is kept in (not loaded yet)."""
        if self.db_file is not None:
            return SqliteDatasetStorage.from_file(self.db_file)
        name = self.name if self.subset is None else f"{self.name}-{self.subset}"
        name = re.sub(r"[^A-Za-z0-9._-]", "_", name)
        base = self.base_dir if self.base_dir is not None else default_base_dir()
        return SqliteDatasetStorage(base / f"{name}.db")

    def load(self, overwrite: bool = False) -> SqliteDatasetStorage:
        """Imports the dataset into its storage unless it is there already (or when
        ``overwrite``), and returns the storage."""
        storage = self.dataset_storage()
        if storage.exists() and not overwrite:
            return storage
        datasets = _datasets()
        options: dict[str, Any] = {"data_files": self.data_files, "token": self.token,
                                   "trust_remote_code": self.trust_remote_code,
                                   "cache_dir": None if self.cache_dir is None
                                   else str(self.cache_dir)}
        options = {key: value for key, value in options.items() if value is not None}
        try:
            loaded = datasets.load_dataset(self.name, self.subset, **options)
        except Exception as exc:
            raise DatasetError(f"HuggingfaceDatasetLoader: datasets could not load "
                               f"{self.name!r}" + (f" ({self.subset!r})" if self.subset else "")
                               + f": {type(exc).__name__}: {exc}") from exc
        storage.path.parent.mkdir(parents=True, exist_ok=True)
        store_huggingface(loaded, storage.path, overwrite=True)
        return storage

    def dataset(self, split: str, item_type: Callable[..., Any] | None = None
                ) -> SqliteDataset:
        """The split ``split``, imported first if needed (see :meth:`load`)."""
        return self.load().reader(split, item_type)


def store_huggingface(dataset: Any, path: str | os.PathLike,
                      overwrite: bool = False) -> SqliteDatasetStorage:
    """Writes a ``datasets.DatasetDict`` (every split) or ``datasets.Dataset`` (as the
    split ``"train"``) into an ember SQLite dataset file at ``path``.

    Rows are read from Arrow in batches and written as they come, so a dataset larger
    than memory is fine. The file appears at ``path`` only once complete.

    Example:
        >>> import pathlib, tempfile
        >>> import datasets  # doctest: +SKIP
        >>> from ember.data.dataset.huggingface import store_huggingface
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "toy.db"
        >>> toy = datasets.Dataset.from_dict({"x": [1, 2]})  # doctest: +SKIP
        >>> store_huggingface(toy, path).reader("train")[1]  # doctest: +SKIP
        {'x': 2}
    """
    datasets = _datasets()
    if isinstance(dataset, datasets.Dataset):
        splits = {"train": dataset}
    elif isinstance(dataset, Mapping):
        splits = dict(dataset)
    else:
        raise DatasetError(f"store_huggingface: expected a datasets.Dataset or DatasetDict, "
                           f"got {type(dataset).__name__} (streaming datasets are not "
                           f"supported)")
    with SqliteDatasetWriter(path, overwrite=overwrite) as writer:
        for split, part in splits.items():
            part = _undecoded(part)
            writer.write_all(str(split), _rows(part))
    return SqliteDatasetStorage.from_file(path)


def _undecoded(part: Any) -> Any:
    """``part`` with media columns (image, audio, ...) read as their encoded bytes."""
    for column, feature in part.features.items():
        if getattr(feature, "decode", False) and dataclasses.is_dataclass(feature):
            part = part.cast_column(column, dataclasses.replace(feature, decode=False))
    return part


def _rows(part: Any):
    for batch in part.iter(batch_size=_BATCH):
        columns = list(batch)
        for values in zip(*(batch[column] for column in columns)):
            yield {column: _plain(value) for column, value in zip(columns, values)}


def _plain(value: Any) -> Any:
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value
