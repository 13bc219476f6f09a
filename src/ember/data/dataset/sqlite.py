"""SqliteDataset: items stored as rows of an SQLite database, read from disk on demand.

File format (version 1)
    An SQLite 3 database, written with Python's standard :mod:`sqlite3` module.

    * Table ``ember_dataset`` (``key TEXT PRIMARY KEY, value TEXT``) marks the file:
      ``format`` = ``ember.sqlite-dataset``, ``version`` = ``1``, ``ember_version``.
    * One table per split, named after the split (``train``, ``test``, ...), with the
      columns ``row_id INTEGER PRIMARY KEY`` (the item's index: 0, 1, 2, ... without
      gaps) and ``item BLOB NOT NULL``, the item encoded with MessagePack
      (https://msgpack.org).

    An item is encoded as MessagePack encodes Python values (``None``, ``bool``,
    ``int`` up to 64 bits, ``float`` as float64, ``str``, ``bytes``, ``list`` and
    ``tuple`` as arrays, ``dict`` as maps), plus:

    * a dataclass instance: the map of its fields, in declaration order; a NamedTuple
      item (at the top level) likewise;
    * a NumPy array or scalar: the extension type 1, whose payload is the dtype's
      ``numpy.dtype.str`` (little-endian: ``<f4``, ``|u1``, ``<U3``, ...) as one length
      byte and ASCII text, the number of dimensions as one byte, each dimension as a
      little-endian uint64, then the elements in C (row-major) order. A scalar has no
      dimensions and reads back as a NumPy scalar (except ``numpy.float64``, a subclass
      of ``float`` that MessagePack stores as a plain float).

    Reading gives back plain values: maps as ``dict``, arrays as ``list`` and NumPy
    arrays as writable ``numpy.ndarray``. An ``item_type`` (a dataclass or any
    callable) turns the top-level map back into the item.

Reading a split streams rows from disk, so memory use stays bounded by SQLite's page
cache whatever the size of the file. Writing goes to a temporary file next to the
target, renamed over it only when complete, so a crash never leaves a half-written
database at the target path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import struct
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import numpy as np

from ember.backend.errors import ArgumentError
from ember.data.dataset.base import Dataset, DatasetError, DatasetFileNotFoundError

I = TypeVar("I")  # noqa: E741

FORMAT = "ember.sqlite-dataset"
VERSION = 1
META_TABLE = "ember_dataset"
NDARRAY_EXT = 1

_LITTLE_ENDIAN = sys.byteorder == "little"


# ------------------------------------------------------------------ item encoding
def _encode_default(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return msgpack.ExtType(NDARRAY_EXT, _array_payload(np.asarray(value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    raise TypeError(f"cannot store a value of type {type(value).__name__}")


def _array_payload(array: np.ndarray) -> bytes:
    if array.dtype.hasobject or array.dtype.fields is not None:
        raise TypeError(f"cannot store a NumPy array of dtype {array.dtype} "
                        f"(object and structured dtypes are not supported)")
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # (np.ascontiguousarray would turn a scalar into 1-d)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not _LITTLE_ENDIAN):
        array = array.astype(array.dtype.newbyteorder("<"))
    dtype = array.dtype.str.encode("ascii")
    if array.ndim > 255:
        raise TypeError(f"cannot store an array of {array.ndim} dimensions (at most 255)")
    header = struct.pack(f"<B{len(dtype)}sB{array.ndim}Q", len(dtype), dtype, array.ndim,
                         *array.shape)
    return header + array.tobytes()


def _decode_ext(code: int, payload: bytes) -> Any:
    if code != NDARRAY_EXT:
        raise ValueError(f"unknown MessagePack extension type {code}")
    (size,) = struct.unpack_from("<B", payload, 0)
    dtype = np.dtype(payload[1:1 + size].decode("ascii"))
    (ndim,) = struct.unpack_from("<B", payload, 1 + size)
    shape = struct.unpack_from(f"<{ndim}Q", payload, 2 + size)
    offset = 2 + size + 8 * ndim
    count = int(np.prod(shape, dtype=np.int64))
    if len(payload) - offset != count * dtype.itemsize:
        raise ValueError(f"array payload holds {len(payload) - offset} bytes, shape "
                         f"{list(shape)} of {dtype.str} needs {count * dtype.itemsize}")
    array = np.frombuffer(payload, dtype, count, offset).reshape(shape)
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return array[()] if ndim == 0 else array.copy()


def encode_item(item: Any) -> bytes:
    """``item`` in the format of an ``item`` cell (see the module's documentation).

    Raises ArgumentError for a value the format cannot hold.

    Example:
        >>> from ember.data.dataset.sqlite import decode_item, encode_item
        >>> decode_item(encode_item({"label": 3, "text": "hi"}))
        {'label': 3, 'text': 'hi'}
    """
    if isinstance(item, tuple) and hasattr(item, "_fields"):
        item = item._asdict()  # a NamedTuple item is stored as a map, as a dataclass is
    try:
        return msgpack.packb(item, default=_encode_default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ArgumentError(f"SqliteDatasetWriter: cannot encode the item: {exc}") from None


def decode_item(data: bytes) -> Any:
    """The value stored in an ``item`` cell (the inverse of :func:`encode_item`)."""
    return msgpack.unpackb(data, raw=False, ext_hook=_decode_ext, strict_map_key=False)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _check_split(split: Any) -> str:
    if not isinstance(split, str) or not split:
        raise ArgumentError(f"a split name must be a non-empty string, got {split!r}")
    if split == META_TABLE or split.lower().startswith("sqlite_"):
        raise ArgumentError(f"the split name {split!r} is reserved")
    return split


def _to_item(item_type: Callable[..., Any] | None) -> Callable[[Any], Any]:
    if item_type is None:
        return lambda value: value
    if isinstance(item_type, type) and (dataclasses.is_dataclass(item_type)
                                        or (issubclass(item_type, tuple)
                                            and hasattr(item_type, "_fields"))):
        return lambda value: item_type(**value)
    if callable(item_type):
        return item_type
    raise ArgumentError(f"item_type must be None, a dataclass or a callable, got {item_type!r}")


# ------------------------------------------------------------------ reading
class SqliteDataset(Dataset[I]):
    """A split of an SQLite dataset file, read from disk item by item.

    Items are fetched by index with one indexed query each, and iteration streams the
    rows with one cursor, so memory use does not grow with the size of the dataset.
    The dataset may be used from several threads (each gets its own read-only
    connection) and pickled to worker processes (it reopens the file there).

    Args:
        path: the database file, written by :class:`SqliteDatasetWriter`.
        split: the split (table) to read.
        item_type: ``None`` to get the stored values (a ``dict`` for a dict, dataclass
            or NamedTuple item), a dataclass or NamedTuple class to build from the
            stored map, or any callable that turns the stored value into the item.

    Raises:
        DatasetFileNotFoundError: the file does not exist.
        DatasetError: the file is not an ember dataset or lacks the split.

    Example:
        >>> import pathlib, tempfile
        >>> import numpy as np
        >>> from ember.data.dataset.sqlite import SqliteDataset, SqliteDatasetWriter
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "data.db"
        >>> with SqliteDatasetWriter(path) as writer:
        ...     for label in range(3):
        ...         _ = writer.write("train", {"image": np.full(2, label, np.uint8),
        ...                                    "label": label})
        >>> dataset = SqliteDataset(path, "train")
        >>> len(dataset), dataset[2]["label"], dataset[2]["image"]
        (3, 2, array([2, 2], dtype=uint8))
    """

    def __init__(self, path: str | os.PathLike, split: str,
                 item_type: Callable[..., Any] | None = None):
        self.path = Path(path)
        self.split = _check_split(split)
        self.item_type = item_type
        self._to_item = _to_item(item_type)
        self._table = _quote(split)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        connection = self._connection()
        _check_format(connection, self.path)
        if split not in _tables(connection):
            raise DatasetError(f"{self.path}: no split {split!r}; the file holds "
                               f"{_list(_tables(connection))}", file=str(self.path))
        (last,) = connection.execute(f"SELECT MAX(row_id) FROM {self._table}").fetchone()
        self._len = 0 if last is None else last + 1

    def _connection(self) -> sqlite3.Connection:
        if os.getpid() != self._pid:
            # A forked worker must not use its parent's connections (SQLite forbids it).
            self._pid = os.getpid()
            self._local = threading.local()
            self._lock = threading.Lock()
            self._connections = []
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = _open_read_only(self.path)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def get(self, index: int) -> I | None:
        if not 0 <= index < self._len:
            return None
        index = int(index)  # sqlite3 binds Python ints only, not NumPy's
        row = self._connection().execute(
            f"SELECT item FROM {self._table} WHERE row_id = ?", (index,)).fetchone()
        if row is None:
            raise DatasetError(f"{self.path}: split {self.split!r} has no row {index} "
                               f"although it holds {self._len} rows", file=str(self.path))
        return self._decode(row[0], index)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[I]:
        # A connection of its own, so that get() calls during the iteration do not
        # disturb the cursor; the cursor steps one row at a time, so only the current
        # item is in memory.
        connection = _open_read_only(self.path)
        try:
            cursor = connection.execute(
                f"SELECT row_id, item FROM {self._table} WHERE row_id < ? ORDER BY row_id",
                (self._len,))
            for index, data in cursor:
                yield self._decode(data, index)
        finally:
            connection.close()

    def _decode(self, data: bytes, index: int) -> I:
        try:
            value = decode_item(data)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise DatasetError(f"{self.path}: split {self.split!r}, row {index} is corrupt "
                               f"({exc})", file=str(self.path)) from None
        return self._to_item(value)

    def close(self) -> None:
        """Closes the connections opened so far; later reads open new ones."""
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "split": self.split, "item_type": self.item_type,
                "len": self._len}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.split = state["split"]
        self.item_type = state["item_type"]
        self._to_item = _to_item(self.item_type)
        self._table = _quote(self.split)
        self._len = state["len"]
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections = []
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"SqliteDataset(path={str(self.path)!r}, split={self.split!r}, len={self._len})"


def _open_read_only(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise DatasetFileNotFoundError(f"SQLite dataset file {path} does not exist",
                                       file=str(path))
    uri = path.resolve().as_uri() + "?mode=ro"
    return sqlite3.connect(uri, uri=True, check_same_thread=False)


def _check_format(connection: sqlite3.Connection, path: Path) -> None:
    try:
        meta = dict(connection.execute(f"SELECT key, value FROM {META_TABLE}").fetchall())
    except sqlite3.DatabaseError as exc:
        raise DatasetError(f"{path} is not an ember SQLite dataset ({exc})",
                           file=str(path)) from None
    if meta.get("format") != FORMAT:
        raise DatasetError(f"{path} is not an ember SQLite dataset (format "
                           f"{meta.get('format')!r}, expected {FORMAT!r})", file=str(path))
    version = meta.get("version", "")
    if not version.isdigit() or int(version) > VERSION:
        raise DatasetError(f"{path} was written by a newer ember (format version {version}, "
                           f"this ember reads up to {VERSION}); upgrade ember", file=str(path))


def _tables(connection: sqlite3.Connection) -> list[str]:
    rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                              "ORDER BY name").fetchall()
    return [name for (name,) in rows if name != META_TABLE and not name.startswith("sqlite_")]


def _list(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names) if names else "no split"


# ------------------------------------------------------------------ writing
class SqliteDatasetWriter:
    """Writes items into an SQLite dataset file, one table per split.

    Items go to a temporary file beside ``path``; :meth:`set_completed` (or leaving the
    ``with`` block normally) commits it and renames it to ``path`` in one step. Leaving
    the block with an exception, or never completing, deletes the temporary file, so
    ``path`` never holds a half-written database. Items are encoded as they come, so
    writing a dataset larger than memory is fine.

    Args:
        path: the database file to create.
        overwrite: replace ``path`` if it exists; otherwise an existing file is an error.

    Example:
        >>> import pathlib, tempfile
        >>> from ember.data.dataset.sqlite import SqliteDataset, SqliteDatasetWriter
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "words.db"
        >>> writer = SqliteDatasetWriter(path)
        >>> writer.write("train", {"word": "one"}), writer.write("train", {"word": "two"})
        (0, 1)
        >>> writer.write_all("test", [{"word": "three"}])
        1
        >>> writer.set_completed()
        >>> [item["word"] for item in SqliteDataset(path, "train")]
        ['one', 'two']
    """

    def __init__(self, path: str | os.PathLike, overwrite: bool = False):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise ArgumentError(f"SqliteDatasetWriter: {self.path} already exists; pass "
                                f"overwrite=True to replace it")
        if not self.path.parent.is_dir():
            raise DatasetFileNotFoundError(f"SqliteDatasetWriter: the directory "
                                           f"{self.path.parent} does not exist",
                                           file=str(self.path))
        self._temp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.tmp")
        self._connection: sqlite3.Connection | None = sqlite3.connect(self._temp)
        # No journal: the rename gives atomicity, and a failed write discards the file.
        self._connection.execute("PRAGMA journal_mode = OFF")
        self._connection.execute("PRAGMA synchronous = OFF")
        self._connection.execute(f"CREATE TABLE {META_TABLE} (key TEXT PRIMARY KEY, "
                                 f"value TEXT NOT NULL)")
        from ember import __version__
        self._connection.executemany(
            f"INSERT INTO {META_TABLE} VALUES (?, ?)",
            [("format", FORMAT), ("version", str(VERSION)), ("ember_version", __version__)])
        self._counts: dict[str, int] = {}

    def _open(self) -> sqlite3.Connection:
        if self._connection is None:
            raise ArgumentError(f"SqliteDatasetWriter for {self.path} is already completed "
                                f"or aborted")
        return self._connection

    def _table(self, split: str) -> str:
        connection = self._open()
        if _check_split(split) not in self._counts:
            connection.execute(f"CREATE TABLE {_quote(split)} "
                               f"(row_id INTEGER PRIMARY KEY, item BLOB NOT NULL)")
            self._counts[split] = 0
        return _quote(split)

    def write(self, split: str, item: Any) -> int:
        """Appends ``item`` to ``split`` (created on first use); returns its index."""
        return self.write_all(split, (item,)) - 1

    def write_all(self, split: str, items: Iterable[Any]) -> int:
        """Appends every item of ``items`` to ``split``, encoding them as they come;
        returns the split's new length."""
        table = self._table(split)
        start = self._counts[split]

        def rows() -> Iterator[tuple[int, bytes]]:
            for offset, item in enumerate(items):
                yield start + offset, encode_item(item)
                self._counts[split] = start + offset + 1

        self._open().executemany(f"INSERT INTO {table} VALUES (?, ?)", rows())
        return self._counts[split]

    def __len__(self) -> int:
        return sum(self._counts.values())

    def set_completed(self) -> None:
        """Commits the items and moves the file to ``path`` atomically."""
        connection = self._open()
        try:
            connection.commit()
            connection.close()
            self._connection = None
            with open(self._temp, "rb") as file:
                os.fsync(file.fileno())
            os.replace(self._temp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Discards everything written; ``path`` is left as it was."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)

    def __enter__(self) -> SqliteDatasetWriter:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> None:
        if kind is None and self._connection is not None:
            self.set_completed()
        else:
            self.abort()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.abort()


# ------------------------------------------------------------------ storage
class SqliteDatasetStorage:
    """An SQLite dataset file: where it is, which splits it holds, and how to read or
    write it.

    Args:
        path: the database file.

    Example:
        >>> import pathlib, tempfile
        >>> from ember.data.dataset.sqlite import SqliteDatasetStorage
        >>> storage = SqliteDatasetStorage.from_name("digits", tempfile.mkdtemp())
        >>> storage.path.name, storage.exists()
        ('digits.db', False)
        >>> with storage.writer() as writer:
        ...     _ = writer.write_all("train", [{"x": 1}, {"x": 2}])
        ...     _ = writer.write_all("test", [{"x": 3}])
        >>> storage.splits(), len(storage.reader("train"))
        (['test', 'train'], 2)
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> SqliteDatasetStorage:
        """The storage at ``path``."""
        return cls(path)

    @classmethod
    def from_name(cls, name: str, base_dir: str | os.PathLike | None = None
                  ) -> SqliteDatasetStorage:
        """The storage ``<base_dir>/<name>.db``; ``base_dir`` defaults to
        ``~/.cache/ember-dataset`` (created when missing)."""
        base = Path(base_dir) if base_dir is not None else default_base_dir()
        base.mkdir(parents=True, exist_ok=True)
        return cls(base / f"{name}.db")

    def exists(self) -> bool:
        """Whether the file exists."""
        return self.path.is_file()

    def splits(self) -> list[str]:
        """The names of the splits in the file, sorted."""
        connection = _open_read_only(self.path)
        try:
            _check_format(connection, self.path)
            return _tables(connection)
        finally:
            connection.close()

    def reader(self, split: str, item_type: Callable[..., Any] | None = None
               ) -> SqliteDataset:
        """The split ``split`` as a :class:`SqliteDataset`."""
        return SqliteDataset(self.path, split, item_type)

    def writer(self, overwrite: bool = False) -> SqliteDatasetWriter:
        """A :class:`SqliteDatasetWriter` for the file."""
        return SqliteDatasetWriter(self.path, overwrite)


def default_base_dir() -> Path:
    """Where datasets are stored by default: ``$EMBER_DATASET_DIR`` when set, else
    ``~/.cache/ember-dataset``."""
    directory = os.environ.get("EMBER_DATASET_DIR")
    return Path(directory) if directory else Path.home() / ".cache" / "ember-dataset"
