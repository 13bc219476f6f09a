"""InMemDataset: items held in a Python list, built from a sequence, a CSV file or a
JSON-lines file."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from ember.data.dataset.base import Dataset, DatasetError, DatasetFileNotFoundError

I = TypeVar("I")  # noqa: E741

ItemType = type | Callable[[dict[str, Any]], Any] | None
"""How a file row becomes an item: ``None`` keeps the ``dict``, a dataclass is built
from the row (CSV text converted to its field types), any other callable is given the
``dict`` and returns the item."""


class InMemDataset(Dataset[I]):
    """A dataset whose items are held in memory, in a list.

    Suited to datasets that fit in memory; for larger ones, see
    :class:`~ember.data.dataset.sqlite.SqliteDataset`.

    Args:
        items: the items, in order. The list is copied, so later changes to ``items``
            do not show in the dataset.

    Example:
        >>> from ember.data.dataset.in_memory import InMemDataset
        >>> dataset = InMemDataset(["a", "b", "c"])
        >>> len(dataset), dataset[1], dataset.get(3)
        (3, 'b', None)
    """

    def __init__(self, items: Iterable[I]):
        self._items: list[I] = list(items)

    def get(self, index: int) -> I | None:
        if 0 <= index < len(self._items):
            return self._items[index]
        return None

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[I]:
        return iter(self._items)

    @classmethod
    def from_dataset(cls, dataset: Dataset[I]) -> InMemDataset[I]:
        """Reads every item of ``dataset`` into memory (for example, a small SQLite split
        that is visited many times).

        Example:
            >>> from ember.data.dataset.in_memory import InMemDataset
            >>> from ember.data.dataset.transform.mapper import MapperDataset
            >>> lazy = MapperDataset(InMemDataset([1, 2, 3]), lambda x: 10 * x)
            >>> list(InMemDataset.from_dataset(lazy))
            [10, 20, 30]
        """
        return cls(iter(dataset))

    @classmethod
    def from_csv(cls, path: str | os.PathLike, item_type: ItemType = None, *,
                 delimiter: str = ",", has_header: bool = True,
                 columns: list[str] | None = None) -> InMemDataset:
        """Reads a CSV file (RFC 4180, as Python's :mod:`csv` reads it), one item per row.

        Without ``item_type`` an item is a ``dict`` from column name to the cell's text.
        With a dataclass, each cell is converted to the type of the field of the same
        name (``int``, ``float``, ``bool``, ``str``, an ``Optional`` of those, where an
        empty cell is ``None``, or any type called with the text); columns and fields
        must match, except fields with defaults, which may be absent. Any other callable
        receives the ``dict`` and returns the item.

        Args:
            path: the CSV file.
            item_type: ``None``, a dataclass or a converter (see above).
            delimiter: the cell separator.
            has_header: whether the first row names the columns.
            columns: the column names when the file has no header row.

        Raises:
            DatasetFileNotFoundError: the file does not exist.
            DatasetError: a row with too few or too many cells, a cell that does not
                convert to its field's type, columns that do not match the dataclass.
                The message names the file and the line.

        Example:
            >>> import dataclasses, pathlib, tempfile
            >>> from ember.data.dataset.in_memory import InMemDataset
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "scores.csv"
            >>> _ = path.write_text("name,score\\nada,3.5\\nbob,2\\n")
            >>> InMemDataset.from_csv(path)[0]
            {'name': 'ada', 'score': '3.5'}
            >>> @dataclasses.dataclass
            ... class Score:
            ...     name: str
            ...     score: float
            >>> list(InMemDataset.from_csv(path, Score))
            [Score(name='ada', score=3.5), Score(name='bob', score=2.0)]
        """
        if has_header == (columns is not None):
            raise DatasetError("InMemDataset.from_csv: give columns exactly when the file "
                               "has no header row (has_header=False)", file=str(path))
        build = _Builder(item_type, str(path), from_text=True)
        items = []
        with _open_text(path) as file:
            reader = csv.reader(file, delimiter=delimiter)
            try:
                header = next(reader) if has_header else list(columns)  # type: ignore[arg-type]
                if has_header:
                    _check_header(header, str(path))
                    build.check_columns(header, reader.line_num)
                else:
                    build.check_columns(header, 1)
                for row in reader:
                    if not row:
                        continue  # a blank line, which csv reads as an empty row
                    line = reader.line_num
                    if len(row) != len(header):
                        raise DatasetError(
                            f"{path}, line {line}: the row has {len(row)} cells, the header "
                            f"names {len(header)} columns ({', '.join(header)})"
                            + (f"; missing {', '.join(header[len(row):])}"
                               if len(row) < len(header) else ""),
                            file=str(path), line=line)
                    items.append(build(dict(zip(header, row)), line))
            except StopIteration:
                raise DatasetError(f"{path}: the CSV file is empty, with no header row",
                                   file=str(path), line=1) from None
            except csv.Error as exc:
                raise DatasetError(f"{path}, line {reader.line_num}: malformed CSV ({exc})",
                                   file=str(path), line=reader.line_num) from None
        return cls(items)

    @classmethod
    def from_json_rows(cls, path: str | os.PathLike,
                       item_type: ItemType = None) -> InMemDataset:
        """Reads a JSON-lines file (https://jsonlines.org): one JSON value per line.

        Blank lines are skipped. Without ``item_type`` an item is the decoded value. With
        a dataclass, each line must be an object whose keys are the dataclass's fields
        (those with defaults may be absent); ints are accepted for ``float`` fields.
        Any other callable receives the decoded value and returns the item.

        Raises:
            DatasetFileNotFoundError: the file does not exist.
            DatasetError: a line that is not valid JSON, or that does not fit the
                dataclass. The message names the file and the line.

        Example:
            >>> import pathlib, tempfile
            >>> from ember.data.dataset.in_memory import InMemDataset
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "rows.jsonl"
            >>> _ = path.write_text('{"text": "hi", "label": 1}\\n{"text": "yo", "label": 0}\\n')
            >>> dataset = InMemDataset.from_json_rows(path)
            >>> len(dataset), dataset[1]
            (2, {'text': 'yo', 'label': 0})
        """
        build = _Builder(item_type, str(path), from_text=False)
        items = []
        with _open_text(path) as file:
            for line, text in enumerate(file, start=1):
                if not text.strip():
                    continue
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}, line {line}: not valid JSON ({exc.msg} at "
                                       f"column {exc.colno})", file=str(path), line=line) from None
                items.append(build(value, line))
        return cls(items)


def _open_text(path: str | os.PathLike) -> typing.TextIO:
    try:
        # newline="" lets the csv module see quoted newlines as they are.
        return open(path, encoding="utf-8", newline="")
    except FileNotFoundError:
        raise DatasetFileNotFoundError(f"dataset file {path} does not exist",
                                       file=str(path)) from None
    except IsADirectoryError:
        raise DatasetError(f"dataset file {path} is a directory", file=str(path)) from None


def _check_header(header: list[str], path: str) -> None:
    seen = set()
    for name in header:
        if name in seen:
            raise DatasetError(f"{path}, line 1: the header names column {name!r} twice",
                               file=path, line=1)
        seen.add(name)


class _Builder:
    """Turns a decoded row into an item, with errors that name the file and line."""

    def __init__(self, item_type: ItemType, path: str, from_text: bool):
        self.item_type = item_type
        self.path = path
        self.from_text = from_text
        self.fields: dict[str, Any] = {}
        self.required: set[str] = set()
        self.is_dataclass = isinstance(item_type, type) and dataclasses.is_dataclass(item_type)
        if self.is_dataclass:
            hints = typing.get_type_hints(item_type)
            for field in dataclasses.fields(item_type):
                if not field.init:
                    continue
                self.fields[field.name] = hints.get(field.name, Any)
                if (field.default is dataclasses.MISSING
                        and field.default_factory is dataclasses.MISSING):
                    self.required.add(field.name)
        elif item_type is not None and not callable(item_type):
            raise DatasetError(f"item_type must be None, a dataclass or a callable, got "
                               f"{item_type!r}", file=path)

    def check_columns(self, columns: Iterable[str], line: int) -> None:
        if not self.is_dataclass:
            return
        columns = set(columns)
        missing = sorted(self.required - columns)
        unknown = sorted(columns - set(self.fields))
        if missing or unknown:
            name = self.item_type.__name__  # type: ignore[union-attr]
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unknown {', '.join(unknown)}"] if unknown else [])
            raise DatasetError(f"{self.path}, line {line}: the columns do not match the "
                               f"fields of {name} ({'; '.join(parts)})",
                               file=self.path, line=line)

    def __call__(self, value: Any, line: int) -> Any:
        if self.item_type is None:
            return value
        if not self.is_dataclass:
            try:
                return self.item_type(value)  # type: ignore[operator]
            except Exception as exc:
                raise DatasetError(f"{self.path}, line {line}: the item converter raised "
                                   f"{type(exc).__name__}: {exc}",
                                   file=self.path, line=line) from exc
        if not isinstance(value, Mapping):
            raise DatasetError(f"{self.path}, line {line}: expected an object with the fields "
                               f"of {self.item_type.__name__}, got {type(value).__name__}",
                               file=self.path, line=line)
        if not self.from_text:
            self.check_columns(value.keys(), line)
        kwargs = {key: self._convert(key, cell, line) for key, cell in value.items()}
        return self.item_type(**kwargs)  # type: ignore[operator]

    def _convert(self, name: str, cell: Any, line: int) -> Any:
        hint = self.fields[name]
        try:
            return _convert(hint, cell, self.from_text)
        except (TypeError, ValueError):
            raise DatasetError(f"{self.path}, line {line}: field {name!r} expects "
                               f"{_type_name(hint)}, got {cell!r}",
                               file=self.path, line=line) from None


_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


def _convert(hint: Any, value: Any, from_text: bool) -> Any:
    """``value`` as type ``hint``; raises TypeError or ValueError when it does not fit."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(options) < len(typing.get_args(hint)) and (value is None or value == ""):
            return None
        for option in options:
            try:
                return _convert(option, value, from_text)
            except (TypeError, ValueError):
                continue
        raise ValueError(value)
    if hint is Any or origin is not None or not isinstance(hint, type):
        return value  # container and other annotated types are kept as decoded
    if from_text:
        if hint is bool:
            text = value.strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError(value)
        return value if hint is str else hint(value)
    if hint is float and type(value) is int:
        return float(value)
    if hint is bool and type(value) is not bool:
        raise TypeError(value)
    if hint in (int, float) and type(value) is bool:
        raise TypeError(value)
    if hint in (int, float, str, bool, list, dict) and not isinstance(value, hint):
        raise TypeError(value)
    return value


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
