"""MessagePack decoding for records: validating, bounded, and without copying byte strings.

msgpack-python copies every bin into a new ``bytes``; a record's tensors are bins, so
decoding a 100 MB record that way copies it once more, and its errors (``ExtraData``,
``OverflowError``, ``ValueError``...) say nothing of where. This reader walks the data
itself (https://github.com/msgpack/msgpack/blob/master/spec.md) and returns every bin as a
read-only memoryview of the content buffer. Before it builds anything, it checks what a
hostile file could abuse:

- every declared length against the bytes that can still follow (an array of ``n``
  values needs at least ``n`` bytes, a map ``2n``), and, for gzip data, against the
  content limit (a declared 4 GB bin is refused before anything is inflated towards it);
- nesting depth (:data:`~ember.record.limits.MAX_DEPTH`) and the count of values;
- map keys: strings, each once; strings: valid UTF-8;
- types records never hold: extension types and the unused byte ``0xc1``.

Each problem is a RecordFormatError naming the file, the record path of the value and its
byte offset. The Python walk costs ~0.3 us per value: nothing next to the bytes of a
model's tensors, which it does not touch.
"""

from __future__ import annotations

import struct
from typing import Any

from ember.backend.errors import RecordFormatError
from ember.record.content import Content
from ember.record.limits import MAX_DEPTH, VALUE_COST, raise_hint
from ember.record.tree import format_error

# Type bytes with a fixed-size payload read by one struct: nil, false, true are separate.
_SCALARS = {
    0xCA: struct.Struct(">f"), 0xCB: struct.Struct(">d"),
    0xCC: struct.Struct(">B"), 0xCD: struct.Struct(">H"), 0xCE: struct.Struct(">I"),
    0xCF: struct.Struct(">Q"), 0xD0: struct.Struct(">b"), 0xD1: struct.Struct(">h"),
    0xD2: struct.Struct(">i"), 0xD3: struct.Struct(">q"),
}  # fmt: skip
# Type bytes followed by a big-endian length: (the length's struct, what follows).
_SIZED = {
    0xC4: (struct.Struct(">B"), "bin"), 0xC5: (struct.Struct(">H"), "bin"),
    0xC6: (struct.Struct(">I"), "bin"), 0xD9: (struct.Struct(">B"), "str"),
    0xDA: (struct.Struct(">H"), "str"), 0xDB: (struct.Struct(">I"), "str"),
    0xDC: (struct.Struct(">H"), "array"), 0xDD: (struct.Struct(">I"), "array"),
    0xDE: (struct.Struct(">H"), "map"), 0xDF: (struct.Struct(">I"), "map"),
}  # fmt: skip
_EXTENSIONS = frozenset(range(0xC7, 0xCA)) | frozenset(range(0xD4, 0xD9))
# The record tree's limit counts from the record; here come the top map above it and, below
# its deepest container, a tensor's tag, payload and shape. The tree rules check the limit
# itself; this bound only keeps the walk off Python's recursion limit.
_MAX_DEPTH = MAX_DEPTH + 4


def _kind(code: int) -> str:
    """What a MessagePack type byte announces, for error messages."""
    if code <= 0x7F or code >= 0xE0 or 0xCC <= code <= 0xD3:
        return "an int"
    if code <= 0x8F or code in (0xDE, 0xDF):
        return "a map"
    if code <= 0x9F or code in (0xDC, 0xDD):
        return "an array"
    if code <= 0xBF or code in (0xD9, 0xDA, 0xDB):
        return "a str"
    names = {0xC0: "nil", 0xC2: "a bool", 0xC3: "a bool", 0xC4: "a byte string",
             0xC5: "a byte string", 0xC6: "a byte string", 0xCA: "a float", 0xCB: "a float"}
    if code in names:
        return names[code]
    return "an extension type" if code in _EXTENSIONS else f"the unused byte 0x{code:02x}"


def unpack(content: Content, what: str, max_values: int | None = None) -> Any:
    """The one MessagePack value ``content`` holds, bins as memoryviews of its buffer.

    Args:
        content: the bytes, all of which the value must span.
        what: what the data is, for error messages (``"MessagePack data"``).
        max_values: the most values (map keys count) to decode; ``None`` for no limit
            beyond the bytes present.

    Raises:
        RecordFormatError: the data is truncated, corrupt, nested too deep, holds too many
            values or bytes after its end, or a type no record holds.
    """
    reader = _Reader(content, what, max_values)
    value = reader.value(0)
    content.finish(reader.pos)
    return value


class _Reader:
    def __init__(self, content: Content, what: str, max_values: int | None) -> None:
        self.content = content
        self.what = what
        self.pos = 0
        self.values_left = content.most if max_values is None else max_values
        self.path: list[str | int] = []  # the record path of the value being read

    # ----------------------------------------------------------------- values
    def value(self, depth: int) -> Any:
        self.values_left -= 1
        if self.values_left < 0:
            raise self.too_many()
        code = self.take(1)[0]
        if code <= 0x7F:
            return code
        if code >= 0xE0:
            return code - 0x100
        if 0xA0 <= code <= 0xBF:
            return self.text(code & 0x1F)
        if code <= 0x8F:
            return self.map(code & 0x0F, depth)
        if code <= 0x9F:
            return self.array(code & 0x0F, depth)
        if code == 0xC0:
            return None
        if code == 0xC2 or code == 0xC3:
            return code == 0xC3
        scalar = _SCALARS.get(code)
        if scalar is not None:
            return scalar.unpack(self.take(scalar.size))[0]
        sized = _SIZED.get(code)
        if sized is not None:
            length, kind = sized
            count = length.unpack(self.take(length.size))[0]
            if kind == "bin":
                return self.take(count, "a byte string")
            if kind == "str":
                return self.text(count)
            if kind == "array":
                return self.array(count, depth)
            return self.map(count, depth)
        if code in _EXTENSIONS:
            raise self.error(f"MessagePack extension type (byte 0x{code:02x}) at byte "
                             f"{self.pos - 1}: records hold none")
        raise self.error(f"byte 0x{code:02x} at byte {self.pos - 1} is no MessagePack type")

    def text(self, nbytes: int) -> str:
        start = self.pos
        raw = self.take(nbytes, "a string")
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"the string at byte {start} is not UTF-8 ({exc.reason} at its "
                             f"byte {exc.start})") from None

    def array(self, count: int, depth: int) -> list[Any]:
        self.check_container(count, count, depth, "an array")
        items = []
        path = self.path
        for index in range(count):
            path.append(index)
            items.append(self.value(depth + 1))
            path.pop()
        return items

    def map(self, count: int, depth: int) -> dict[str, Any]:
        self.check_container(count, 2 * count, depth, "a map")
        items: dict[str, Any] = {}
        path = self.path
        for _ in range(count):
            start = self.pos
            key = self.key()
            if key in items:
                raise self.error(f"the key {key!r:.60} appears twice in one map (at byte {start})")
            path.append(key)
            items[key] = self.value(depth + 1)
            path.pop()
        return items

    def key(self) -> str:
        """A map key: a str, refused by its type byte before anything else is decoded."""
        self.values_left -= 1
        if self.values_left < 0:
            raise self.too_many()
        start = self.pos
        code = self.take(1)[0]
        if 0xA0 <= code <= 0xBF:
            return self.text(code & 0x1F)
        sized = _SIZED.get(code)
        if sized is None or sized[1] != "str":
            raise self.error(f"a map key must be a str, found {_kind(code)} at byte {start}")
        length = sized[0]
        return self.text(length.unpack(self.take(length.size))[0])

    def check_container(self, count: int, min_nbytes: int, depth: int, kind: str) -> None:
        if depth > _MAX_DEPTH:
            raise self.error(f"maps and arrays nested deeper than {MAX_DEPTH} levels")
        if self.pos + min_nbytes > self.content.most:
            raise self.error(f"truncated or corrupt: {kind} of {count} entries at byte "
                             f"{self.pos} needs at least {min_nbytes} more bytes, at most "
                             f"{self.content.most - self.pos} follow")
        if count > self.values_left:
            raise self.too_many(f"{kind} of {count} entries at byte {self.pos}")

    # ------------------------------------------------------------------ bytes
    def take(self, nbytes: int, what: str = "a value") -> memoryview:
        """The next ``nbytes`` bytes (a view of the content's buffer where it has one)."""
        start = self.pos
        self.pos = start + nbytes
        return self.content.read(start, nbytes, what, self.where)

    # ------------------------------------------------------------------ errors
    def error(self, what: str) -> RecordFormatError:
        return format_error(self.content.source, f"{self.what}: {what}", self.where())

    def where(self) -> str | None:
        """The record path of the value being read (inside the top map's ``record``, the
        path from there, as every other record error names it)."""
        path = self.path[1:] if self.path[:1] == ["record"] else self.path
        return ".".join(map(str, path)) or None

    def too_many(self, what: str = "") -> RecordFormatError:
        found = f" ({what})" if what else ""
        return self.error(f"more values than the content limit allows{found}: each value outside "
                          f"a tensor counts {VALUE_COST} bytes; {raise_hint()}")
