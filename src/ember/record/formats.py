"""The byte layouts of ember's record files: Named MessagePack, Bin and JSON, optionally gzipped.

All three store the same *top map*, whose first entry names the format::

    {"format": "ember.named-mpk" | "ember.bin" | "ember.json",
     "version": 1,                      # the format version; readers refuse newer ones
     "ember_version": "0.1.0",          # the ember that wrote the file
     "precision": {"name": "full", "float": "f32", "int": "i32"},
     "record": <the record tree>}

The record tree follows the rules of :mod:`ember.record.tree` (maps, arrays,
scalars, ``$``-escaped keys, typed leaves); the formats differ in their
encoding and in the payload of a ``{"$tensor": payload}`` leaf. Tensor elements
are always little-endian and row-major (C order); ``bf16`` is bfloat16 (the
upper half of an IEEE f32), ``bool`` one byte per element (0 or 1).

Named MessagePack (``.mpk``)
    The top map, MessagePack-encoded (https://msgpack.org), entries in the order
    above. A tensor payload is ``{"dtype": "f32", "shape": [2, 3], "data": <bin>}``
    with ``prod(shape) * itemsize`` raw bytes (at most 4 GiB per tensor, the limit
    of a MessagePack bin). Floats are float64, bytes are bin.

Bin (``.bin``)
    A 24-byte header: the magic ``b"EMBERBIN"``, then ``index_nbytes`` and
    ``data_nbytes`` as little-endian uint64. Then the *index*: the top map,
    MessagePack-encoded, in which a tensor payload is ``{"dtype", "shape",
    "offset", "nbytes"}``. Then zero padding up to the next multiple of 64, where
    the data section of ``data_nbytes`` bytes begins: each tensor's bytes lie at
    its ``offset`` from the section's start, every offset a multiple of 64 (so
    each tensor can be mapped as an aligned array), zero padding between them.
    The file ends with the data section.

JSON (``.json``)
    The top map as UTF-8 JSON (RFC 8259). A tensor payload is ``{"dtype",
    "shape", "values"}``, ``values`` a flat row-major list: numbers for float
    and int tensors, ``true`` / ``false`` for bool ones. A float prints as the
    shortest decimal that reads back as the same float64 (f32, f16 and bf16
    values are exactly f64 values, so every float round-trips exactly); JSON has
    no NaN or infinity, so those are the strings ``"nan"``, ``"inf"`` and
    ``"-inf"`` inside ``values`` and ``{"$float": "nan"}`` as scalars (NaN sign
    and payload bits are not kept). Bytes are ``{"$bytes": "<base64>"}``. The
    ``.json.gz`` files are compact; the ``.json`` ones indented by two spaces, with
    lists of numbers (a shape, a tensor's values) on one line.

Gzip (``.mpk.gz``, ``.bin.gz``, ``.json.gz``)
    The file above as one gzip member (RFC 1952), compression level 1. Tensor
    weights are high-entropy floats that deflate shrinks by some 7 % at any
    level; higher levels only cost time (on f32 weights, level 6 took 13 % longer
    for 0.2 % less size). The member's CRC-32 catches corruption at any level.

Reading
    Every file may be hostile. Readers check each declared size, shape, dtype,
    offset and type before allocating anything for it, and inflate gzip data only
    as far as the content limit of :mod:`ember.record.limits` allows; MessagePack
    is read by :mod:`ember.record.msgpack_reader`, which checks lengths and nesting
    and gives tensors as views of the file's buffer (:mod:`ember.record.content`).
    A Bin tensor's ``offset`` must be a multiple of 64, its ``nbytes`` equal
    ``prod(shape) * itemsize`` and its bytes lie inside the data section without
    overlapping another tensor's. Anything else is a ``RecordFormatError`` naming
    the file, the record path and the offending value.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import struct
import sys
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import ml_dtypes
import msgpack
import numpy as np

from ember.backend.errors import RecordError
from ember.record.content import Content
from ember.record.limits import describe, raise_hint
from ember.record.msgpack_reader import unpack
from ember.record.precision import PrecisionSettings
from ember.record.tree import (
    BYTES,
    FLOAT,
    Leaves,
    decode_tree,
    encode_tree,
    format_error,
    non_finite_name,
    tag,
)
from ember.tensor import DType, TensorData
from ember.tensor.data import numpy_dtype

VERSION = 1
"""The format version this ember writes, and the newest it reads, for all three formats."""

GZIP_LEVEL = 1
GZIP_MAGIC = b"\x1f\x8b"

Buffer = bytes | memoryview
_LITTLE_ENDIAN = sys.byteorder == "little"
# Tensors smaller than this are packed inline with the rest of the tree; bigger ones are
# written straight from their array's memory, as chunks of their own.
_INLINE_NBYTES = 1 << 16
_BIN_LIMIT = 1 << 32  # a MessagePack bin holds less than 4 GiB


class Encoding:
    """One format: records to byte chunks and back.

    ``encode`` walks the record before returning, so that a record that cannot be saved
    fails before any file is touched; the chunks it returns are produced lazily and
    reference tensor memory without copying it where the format allows.
    """

    name: str
    """The ``format`` entry of the top map."""
    extension: str
    """The file extension, without compression."""

    def encode(self, record: Any, precision: PrecisionSettings) -> Iterator[Buffer]:
        raise NotImplementedError

    def decode(self, content: Content, max_values: int | None = None
               ) -> tuple[Any, dict[str, Any]]:  # fmt: skip
        """The record ``content`` holds, and its metadata (the top map without ``record``).

        Args:
            content: the bytes, read or inflated (its ``source`` is named in errors).
            max_values: the most values outside tensors to decode (``None``: as many as
                the bytes can hold).

        Raises:
            RecordFormatError: anything malformed, named by file, record path and value.
        """
        raise NotImplementedError

    def recognizes(self, head: bytes) -> bool:
        """Whether ``head`` (a file's content, or its first 128 bytes) begins this format."""
        raise NotImplementedError

    def top(self, precision: PrecisionSettings, tree: Any) -> dict[str, Any]:
        import ember  # lazily: ember's own __init__ may be what is importing this module

        return {"format": self.name, "version": VERSION, "ember_version": ember.__version__,
                "precision": precision.metadata(), "record": tree}

    def split_top(self, top: Any, source: str | None) -> tuple[Any, dict[str, Any]]:
        """The record tree and the checked metadata of a decoded top map."""
        if not isinstance(top, dict) or top.get("format") != self.name:
            found = top.get("format") if isinstance(top, dict) else type(top).__name__
            raise format_error(source, f"expected a top map with format {self.name!r}, "
                                       f"found {found!r}")
        version = top.get("version")
        if type(version) is not int or version < 1:
            raise format_error(source, f"bad format version {version!r}")
        if version > VERSION:
            raise format_error(source, f"written by a newer ember (format version {version}, "
                                       f"this ember reads up to {VERSION}); upgrade ember")
        precision = top.get("precision")
        if (not isinstance(top.get("ember_version"), str) or "record" not in top
                or not isinstance(precision, dict) or set(precision) != {"name", "float", "int"}
                or not all(isinstance(v, str) for v in precision.values())):
            raise format_error(source, "the top map lacks ember_version, precision or record")
        metadata = {key: top[key] for key in ("format", "version", "ember_version")}
        return top["record"], {**metadata, "precision": dict(precision)}


def _byte_view(data: TensorData) -> memoryview:
    """The tensor's elements as little-endian bytes, without a copy where possible."""
    array = np.ascontiguousarray(data.buffer())
    if not _LITTLE_ENDIAN:
        array = array.byteswap()
    return memoryview(array.reshape(-1).view(np.uint8))


def _array(buffer: Buffer | np.ndarray, dtype: DType, shape: tuple[int, ...], nbytes: int,
           offset: int = 0) -> TensorData:
    """A read-only tensor over ``buffer`` from ``offset``; the caller checked that the buffer
    holds its ``nbytes``. A view, except where the bytes are not aligned for the dtype
    (Named MessagePack places them anywhere): NumPy and torch compute slowly, or not at
    all, on misaligned arrays, so those are copied once here."""
    np_dtype = numpy_dtype(dtype)
    if nbytes == 0:
        array = np.zeros(shape, np_dtype)
    else:
        array = np.frombuffer(buffer, np_dtype, nbytes // np_dtype.itemsize, offset).reshape(shape)
        if not array.flags.aligned:
            array = array.copy()
        if not _LITTLE_ENDIAN:
            array = array.byteswap()
    array.flags.writeable = False
    return TensorData._wrap(array)


# ------------------------------------------------------------------ Named MessagePack
class _MpkLeaves(Leaves):
    def encode_tensor(self, data: TensorData, path: str) -> Any:
        view = _byte_view(data)
        if view.nbytes >= _BIN_LIMIT:
            raise RecordError(f"record path {path}: a tensor of {view.nbytes} bytes exceeds "
                              f"MessagePack's 4 GiB limit; save it with BinFileRecorder",
                              path=path)
        return {"dtype": data.dtype.value, "shape": list(data.shape), "data": view}

    def decode_tensor(self, payload: Any, path: str) -> TensorData:
        dtype, shape, expected, (raw,) = self.tensor_fields(payload, ("data",), path)
        if not isinstance(raw, memoryview) or raw.nbytes != expected:
            got = f"{raw.nbytes} bytes" if isinstance(raw, memoryview) else describe(raw)
            raise self.error(f"tensor data holds {got}, shape {list(shape)} of {dtype.value} "
                             f"needs {expected} bytes", path)
        return _array(raw, dtype, shape, expected)


def _bin_header(nbytes: int) -> bytes:
    """The MessagePack header of a bin of ``nbytes`` (bin 8, 16 or 32 by size)."""
    if nbytes < 1 << 8:
        return struct.pack(">BB", 0xC4, nbytes)
    if nbytes < 1 << 16:
        return struct.pack(">BH", 0xC5, nbytes)
    return struct.pack(">BI", 0xC6, nbytes)  # below _BIN_LIMIT, checked when encoding


def _pack_chunks(tree: Any) -> Iterator[Buffer]:
    """``tree`` MessagePack-encoded, big byte strings yielded as they are (no copy)."""
    packer = msgpack.Packer(autoreset=False)

    def walk(value: Any) -> Iterator[Buffer]:
        if isinstance(value, dict):
            packer.pack_map_header(len(value))
            for key, item in value.items():
                packer.pack(key)
                yield from walk(item)
        elif isinstance(value, list):
            packer.pack_array_header(len(value))
            for item in value:
                yield from walk(item)
        elif isinstance(value, memoryview) and value.nbytes >= _INLINE_NBYTES:
            yield packer.bytes() + _bin_header(value.nbytes)
            packer.reset()
            yield value
        else:
            packer.pack(value)

    yield from walk(tree)
    yield packer.bytes()


class NamedMpkEncoding(Encoding):
    name = "ember.named-mpk"
    extension = "mpk"

    def __init__(self) -> None:
        self._signature = msgpack.packb("format") + msgpack.packb(self.name)

    def encode(self, record: Any, precision: PrecisionSettings) -> Iterator[Buffer]:
        top = self.top(precision, encode_tree(record, precision, _MpkLeaves()))
        return _pack_chunks(top)

    def decode(self, content: Content, max_values: int | None = None
               ) -> tuple[Any, dict[str, Any]]:  # fmt: skip
        top = unpack(content, "MessagePack data", max_values)
        tree, metadata = self.split_top(top, content.source)
        return decode_tree(tree, _MpkLeaves(content.source)), metadata

    def recognizes(self, head: bytes) -> bool:
        # A fixmap (0x80 - 0x8f) whose first entry is "format": "ember.named-mpk".
        return head[:1] != b"" and head[0] & 0xF0 == 0x80 and head[1:].startswith(self._signature)


# ------------------------------------------------------------------------------ Bin
BIN_MAGIC = b"EMBERBIN"
_BIN_HEADER = struct.Struct("<8sQQ")
_ALIGN = 64


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


class _BinLeaves(Leaves):
    def __init__(self, source: str | None = None, data: memoryview | None = None,
                 start: int = 0) -> None:
        super().__init__(source)
        self.buffers: list[memoryview] = []  # encoding: the tensor bytes, in offset order
        self.end = 0  # encoding: the data section's length so far
        # Decoding: the file, its data section's start, and each tensor's (offset, nbytes,
        # path), to check that no two overlap.
        self.data, self.start = data, start
        self.spans: list[tuple[int, int, str]] = []

    def encode_tensor(self, data: TensorData, path: str) -> Any:
        view = _byte_view(data)
        offset = _aligned(self.end)
        self.buffers.append(view)
        self.end = offset + view.nbytes
        return {"dtype": data.dtype.value, "shape": list(data.shape), "offset": offset,
                "nbytes": view.nbytes}

    def decode_tensor(self, payload: Any, path: str) -> TensorData:
        fields = ("offset", "nbytes")
        dtype, shape, expected, (offset, nbytes) = self.tensor_fields(payload, fields, path)
        if type(nbytes) is not int or nbytes != expected:
            raise self.error(f"tensor nbytes is {describe(nbytes)}, shape {list(shape)} of "
                             f"{dtype.value} needs {expected} bytes", path)
        if type(offset) is not int or offset % _ALIGN:
            raise self.error(f"tensor offset {describe(offset)} is not a multiple of {_ALIGN}",
                             path)
        available = len(self.data) - self.start
        if not 0 <= offset <= available - nbytes:
            raise self.error(f"tensor bytes [{offset}, +{nbytes}) lie outside the data section "
                             f"({available} bytes)", path)
        self.spans.append((offset, nbytes, path))
        return _array(self.data, dtype, shape, nbytes, self.start + offset)

    def check_overlaps(self) -> None:
        """Refuses two tensors sharing bytes: a writer never makes them, a forger might."""
        spans = sorted(span for span in self.spans if span[1])
        for (offset, nbytes, path), (next_offset, _, next_path) in itertools.pairwise(spans):
            if next_offset < offset + nbytes:
                raise self.error(f"tensor bytes [{next_offset}, ...) overlap those of {path} "
                                 f"[{offset}, {offset + nbytes})", next_path)


class BinEncoding(Encoding):
    name = "ember.bin"
    extension = "bin"

    def encode(self, record: Any, precision: PrecisionSettings) -> Iterator[Buffer]:
        leaves = _BinLeaves()
        index = msgpack.packb(self.top(precision, encode_tree(record, precision, leaves)))
        header = _BIN_HEADER.pack(BIN_MAGIC, len(index), leaves.end)
        return self._chunks(header + index, leaves.buffers)

    @staticmethod
    def _chunks(head: bytes, buffers: list[memoryview]) -> Iterator[Buffer]:
        yield head + bytes(_aligned(len(head)) - len(head))
        written = 0
        for view in buffers:
            padding = _aligned(written) - written
            if padding:
                yield bytes(padding)
            yield view
            written += padding + view.nbytes

    def decode(self, content: Content, max_values: int | None = None
               ) -> tuple[Any, dict[str, Any]]:  # fmt: skip
        source = content.source
        head = content.read(0, _BIN_HEADER.size, "the Bin header")
        _, index_nbytes, data_nbytes = _BIN_HEADER.unpack_from(head)
        start = _aligned(_BIN_HEADER.size + index_nbytes)
        # The header declares the file's size: for gzip, checked against the limit before
        # anything is inflated, then inflated into one buffer of that size.
        rest = content.read(_BIN_HEADER.size, start + data_nbytes - _BIN_HEADER.size,
                            f"the Bin index of {index_nbytes} bytes and data section of "
                            f"{data_nbytes} bytes")
        content.finish(start + data_nbytes)
        top = unpack(Content(rest[:index_nbytes], source), "the Bin index", max_values)
        tree, metadata = self.split_top(top, source)
        leaves = _BinLeaves(source, rest, start - _BIN_HEADER.size)
        record = decode_tree(tree, leaves)
        leaves.check_overlaps()
        return record, metadata

    def recognizes(self, head: bytes) -> bool:
        return head.startswith(BIN_MAGIC)


# ----------------------------------------------------------------------------- JSON
class _JsonLeaves(Leaves):
    def encode_tensor(self, data: TensorData, path: str) -> Any:
        array = data.buffer().reshape(-1)
        if data.dtype.is_float:
            array = array.astype(np.float64)
            finite = np.isfinite(array)
            if not finite.all():
                # Vectorized, so that a tensor with one NaN does not take a Python loop.
                values = array.astype(object)
                values[np.isnan(array)] = "nan"
                values[np.isposinf(array)] = "inf"
                values[np.isneginf(array)] = "-inf"
                array = values
        elif data.dtype.is_low_precision:
            array = array.astype(np.int64)  # JSON numbers from ml_dtypes' 4 / 2-bit ints
        return {"dtype": data.dtype.value, "shape": list(data.shape), "values": array.tolist()}

    def encode_bytes(self, value: bytes) -> Any:
        return tag(BYTES, base64.b64encode(value).decode("ascii"))

    def encode_float(self, value: float) -> Any:
        name = non_finite_name(value)
        return value if name is None else tag(FLOAT, name)

    def decode_tensor(self, payload: Any, path: str) -> TensorData:
        dtype, shape, nbytes, (values,) = self.tensor_fields(payload, ("values",), path)
        count = nbytes // dtype.itemsize
        if not isinstance(values, list) or len(values) != count:
            got = f"{len(values)} values" if isinstance(values, list) else describe(values)
            raise self.error(f"tensor holds {got}, shape {list(shape)} needs {count}", path)
        np_dtype = numpy_dtype(dtype)
        if count == 0:
            return TensorData._wrap(np.zeros(shape, np_dtype))
        try:
            # Floats parse as float64 first: it reads "nan" / "inf" / "-inf" and holds every
            # f32 / f16 / bf16 value exactly.
            if dtype.is_float:
                parsed = np.array(values, dtype=np.float64)
            elif dtype is DType.U64 and all(type(v) is int for v in values):
                parsed = np.array(values, dtype=np.uint64)  # beyond int64, NumPy would pick object
            else:
                parsed = np.array(values)
        except (ValueError, TypeError, OverflowError) as exc:
            raise self.error(f"bad {dtype.value} tensor values ({exc})", path) from None
        if dtype.is_int:
            ok = parsed.dtype.kind in "iu" and _fits(parsed, np_dtype)
        else:
            ok = dtype.is_float or parsed.dtype == np.bool_
        if parsed.ndim != 1 or not ok:
            raise self.error(f"tensor values are not a flat list of {dtype.value} values", path)
        with np.errstate(over="ignore"):  # a float beyond the dtype's range is inf, as in a cast
            array = parsed.astype(np_dtype).reshape(shape)
        array.flags.writeable = False
        return TensorData._wrap(array)


_JSON_OPTIONS: dict[str, Any] = {"allow_nan": False, "ensure_ascii": False}


def _pretty(value: Any, indent: int, depth: int) -> str:
    """``value`` as indented JSON, except that lists of scalars (a tensor's shape and values)
    stay on one line: readable, and written by the C encoder rather than line by line."""
    if isinstance(value, dict) and value:
        items = [f"{json.dumps(key, **_JSON_OPTIONS)}: {_pretty(item, indent, depth + 1)}"
                 for key, item in value.items()]
        return _block("{", items, "}", indent, depth)
    # Only the first item is looked at: lists of values can hold millions of numbers.
    if isinstance(value, list) and value and isinstance(value[0], dict | list):
        return _block("[", [_pretty(item, indent, depth + 1) for item in value], "]", indent,
                      depth)
    return json.dumps(value, **_JSON_OPTIONS, separators=(", ", ": "))


def _block(opening: str, items: list[str], closing: str, indent: int, depth: int) -> str:
    inner = "\n" + " " * (indent * (depth + 1))
    return opening + inner + ("," + inner).join(items) + "\n" + " " * (indent * depth) + closing


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; ember writes non-finite floats as strings")


def _fits(values: np.ndarray, np_dtype: np.dtype) -> bool:
    info = ml_dtypes.iinfo(np_dtype)  # NumPy's iinfo lacks int4 / int2
    return bool(values.min() >= info.min and values.max() <= info.max)


class JsonEncoding(Encoding):
    """JSON, compact (``indent=None``) or indented for reading (lists of numbers on one line)."""

    name = "ember.json"
    extension = "json"
    _HEAD = re.compile(rb'\A\s*\{\s*"format"\s*:\s*"ember\.json"')

    def __init__(self, indent: int | None = None) -> None:
        self.indent = indent

    def encode(self, record: Any, precision: PrecisionSettings) -> Iterator[Buffer]:
        top = self.top(precision, encode_tree(record, precision, _JsonLeaves()))
        if self.indent is None:
            text = json.dumps(top, **_JSON_OPTIONS, separators=(",", ":"))
        else:
            text = _pretty(top, self.indent, 0)
        return iter((text.encode("utf-8"),))

    def decode(self, content: Content, max_values: int | None = None
               ) -> tuple[Any, dict[str, Any]]:  # fmt: skip
        source = content.source
        raw = content.read_rest(0)
        content.finish(raw.nbytes)
        try:
            text = str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise format_error(source, f"the JSON is not UTF-8 ({exc.reason} at byte "
                                       f"{exc.start})") from None
        if max_values is not None:
            # Each value costs a Python object; a separator precedes all but one of them.
            values = text.count(",") + text.count(":") + 1
            if values > max_values:
                raise format_error(source, f"the JSON holds about {values} values, more than "
                                           f"the content limit allows ({max_values}); "
                                           f"{raise_hint()}")
        try:
            top = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise format_error(source, f"JSON is truncated or corrupt ({exc})") from None
        tree, metadata = self.split_top(top, source)
        return decode_tree(tree, _JsonLeaves(source)), metadata

    def recognizes(self, head: bytes) -> bool:
        return self._HEAD.match(head) is not None


# ----------------------------------------------------------------------------- gzip
def gzip_chunks(chunks: Iterable[Buffer]) -> Iterator[bytes]:
    """``chunks`` as one gzip member, compressed as they come."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # 31: gzip header and trailer
    for chunk in chunks:
        out = compressor.compress(chunk)
        if out:
            yield out
    yield compressor.flush()


# ---------------------------------------------------------------------- identification
NAMED_MPK = NamedMpkEncoding()
BIN = BinEncoding()
JSON = JsonEncoding()
_HEAD_NBYTES = 128


def identify(data: Buffer | np.ndarray) -> tuple[str | None, str]:
    """What ``data`` is, for error messages.

    Returns:
        the extension of the ember format it is in (``"mpk"``, ``"bin.gz"``, ...) or
        ``None``, and a description of it.
    """
    view = memoryview(data).cast("B")
    if not view.nbytes:
        return None, "empty"
    head = bytes(view[:_HEAD_NBYTES])
    if head.startswith(GZIP_MAGIC):
        try:
            # A few KiB of compressed data always hold the first 128 bytes, and only they
            # are read: no bomb goes off here.
            head = zlib.decompressobj(31).decompress(view[:1 << 16], _HEAD_NBYTES)
        except zlib.error:
            return None, "corrupt gzip data"
        inner, description = _identify_plain(head)
        if inner is None:
            return None, f"gzip data holding {description}"
        return f"{inner}.gz", f"gzip data holding {description}"
    return _identify_plain(head)


def _identify_plain(head: bytes) -> tuple[str | None, str]:
    for encoding in (NAMED_MPK, BIN, JSON):
        if encoding.recognizes(head):
            return encoding.extension, f"an ember {encoding.name} record"
    if head.startswith(b"PK\x03\x04"):
        return None, "a zip archive (a PyTorch file? read those with PyTorchFileRecorder)"
    if len(head) > 9 and head[8:10] == b'{"':
        return None, "a safetensors file? (read those with SafetensorsFileRecorder)"
    return None, f"unrecognized data starting with {head[:16]!r}"
