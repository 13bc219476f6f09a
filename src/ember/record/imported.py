"""Imported weights: a flat ``name -> tensor`` map from another tool, ready to load.

An :class:`ImportedRecord` keeps the tensors under their dotted names
(``encoder.layers.0.weight``), an optional :class:`~ember.record.adapter.Adapter`
for the source framework's layout, and the file it came from. Key remapping
rewrites names with regular expressions before the names are nested into the
tree that ``Module.load_record`` walks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ember.backend.errors import ArgumentError, RecordFormatError
from ember.record.adapter import Adapter
from ember.record.limits import describe
from ember.tensor import TensorData

_DOLLAR_GROUP = re.compile(r"\$(\d+|\{\w+\})")
# A name from a file nests one dict per dot; the walks over the tree recurse that deep.
MAX_NAME_PARTS = 256


def _python_replacement(replacement: str) -> str:
    """``$1`` / ``${name}`` (the regex-crate syntax Burn's book uses) as ``\\g<1>``."""
    return _DOLLAR_GROUP.sub(lambda m: r"\g<" + m.group(1).strip("{}") + ">", replacement)


@dataclass(frozen=True)
class KeyRemap:
    """One renaming rule: every name matching ``pattern`` is rewritten with ``replacement``."""

    pattern: str
    replacement: str

    def __post_init__(self) -> None:
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ArgumentError(f"key remap: bad pattern {self.pattern!r}: {exc}") from None
        object.__setattr__(self, "_compiled", compiled)

    def apply(self, name: str) -> str:
        try:
            return self._compiled.sub(_python_replacement(self.replacement), name)  # type: ignore[attr-defined]
        except (re.error, IndexError) as exc:
            raise ArgumentError(
                f"key remap: replacement {self.replacement!r} does not fit {self.pattern!r}: {exc}"
            ) from None


@dataclass(frozen=True)
class ImportedRecord:
    """Tensors by dotted name, as read from a weight file, plus the source's adapter.

    Example:
        >>> from ember import TensorData
        >>> record = ImportedRecord({"conv.conv1.weight": TensorData([1.0])})
        >>> record.with_key_remap(r"conv\\.(.*)", "$1").names()
        ['conv1.weight']
    """

    tensors: Mapping[str, Any]
    adapter: Adapter | None = None
    source: str | None = None
    remaps: tuple[KeyRemap, ...] = field(default=())

    def with_key_remap(self, pattern: str, replacement: str) -> ImportedRecord:
        """A record whose names are rewritten by ``re.sub(pattern, replacement)`` (``$1`` works)."""
        return replace(self, remaps=(*self.remaps, KeyRemap(pattern, replacement)))

    def with_adapter(self, adapter: Adapter | None) -> ImportedRecord:
        return replace(self, adapter=adapter)

    def names(self) -> list[str]:
        """The tensor names after remapping, in file order."""
        return list(self._renamed())

    def _renamed(self) -> dict[str, Any]:
        renamed: dict[str, Any] = {}
        for name, value in self.tensors.items():
            new = name
            for remap in self.remaps:
                new = remap.apply(new)
            if new in renamed:
                raise RecordFormatError(
                    f"key remap: two tensors are renamed to {new!r} (one of them was {name!r})",
                    path=new, file=self.source,
                )
            renamed[new] = value
        return renamed

    def tree(self) -> dict[str, Any]:
        """The remapped names nested at the dots: ``{"conv1": {"weight": TensorData}}``."""
        return nest(self._renamed().items(), self.source)


def nest(items: Iterable[tuple[str, Any]], source: str | None = None) -> dict[str, Any]:
    """Nests dotted names into dicts; a name that is also a prefix of another, or one of more
    than ``MAX_NAME_PARTS`` parts, is an error."""
    root: dict[str, Any] = {}
    for name, value in items:
        parts = name.split(".", MAX_NAME_PARTS)
        if len(parts) > MAX_NAME_PARTS:
            raise RecordFormatError(
                f"tensor name {describe(name)} has more than {MAX_NAME_PARTS} dotted parts",
                path=name[:80], file=source,
            )
        node = root
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecordFormatError(
                    f"tensor names clash: {describe('.'.join(parts[: depth + 1]))} is a tensor and "
                    f"also the prefix of {describe(name)}", path=name, file=source,
                )
            node = child
        if parts[-1] in node:
            raise RecordFormatError(
                f"tensor names clash: {describe(name)} is a tensor and also a prefix of other names",
                path=name, file=source,
            )
        node[parts[-1]] = value
    return root


def flatten(record: Any, path: str = "") -> dict[str, Any]:
    """The tensors of a record tree under dotted names (parameter leaves give their tensor)."""
    if isinstance(record, TensorData):
        return {path: record}
    if isinstance(record, Mapping) and "param" in record and isinstance(record["param"], TensorData):
        return {path: record["param"]}
    items = record.items() if isinstance(record, Mapping) else enumerate(record or ())
    flat: dict[str, Any] = {}
    for key, value in items:
        flat.update(flatten(value, f"{path}.{key}" if path else str(key)))
    return flat
