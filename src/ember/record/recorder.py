"""Recorders: save records to files or bytes, in one format at one precision, and load them.

========================== ========= =========== =========================================
Recorder                   Extension Compression Use
========================== ========= =========== =========================================
``NamedMpkFileRecorder``   mpk       none        the default: one self-describing
                                                 MessagePack document, fast
``NamedMpkGzFileRecorder`` mpk.gz    gzip        storage; the gzip CRC catches corruption
``BinFileRecorder``        bin       none        the fastest to load: an index, then
                                                 64-byte aligned tensors read as views
``BinGzFileRecorder``      bin.gz    gzip        as Bin, compressed
``JsonGzFileRecorder``     json.gz   gzip        text, readable by any JSON tool
``PrettyJsonFileRecorder`` json      none        indented JSON, to look at weights
``BinBytesRecorder``       (memory)  none        the Bin format as a byte string
========================== ========= =========== =========================================

The formats are described byte by byte in :mod:`ember.record.formats`. Three
aliases carry Burn's names, as subclasses that only change the default
precision: ``DefaultRecorder`` (NamedMpk at full precision), ``CompactRecorder``
(NamedMpkGz at half precision) and ``SensitiveCompactRecorder`` (NamedMpkGz at
full precision). A file written by an alias loads with its base recorder and back.

Every recorder saves tensors at its :class:`~ember.record.precision.PrecisionSettings`
and loads them in the dtype they were stored with, so a file of any precision
loads with a recorder of any precision (formats, unlike precisions, must match).

Loading treats every file as possibly hostile: each size in it is checked before
anything is allocated, and a gzip file inflates at most to its content limit
(``max_bytes``, else ``EMBER_RECORD_MAX_BYTES``, else 256 times its size with a
256 MiB floor; see :mod:`ember.record.limits`), so a malformed or malicious file
costs a ``RecordFormatError``, never a crash or a memory blow-up. A file is read
once into a private buffer that the loaded tensors are views of (no memory map:
see :mod:`ember.record.content`), so changing the file afterwards changes nothing
loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ember.atomic import atomic_write
from ember.backend.errors import (
    ArgumentError,
    RecordError,
    RecordFileNotFoundError,
    RecordFormatError,
)
from ember.record.content import Content, InflatingContent, private_copy, read_file
from ember.record.formats import (
    BIN,
    GZIP_MAGIC,
    JSON,
    NAMED_MPK,
    Buffer,
    Encoding,
    JsonEncoding,
    gzip_chunks,
    identify,
)
from ember.record.limits import VALUE_COST, check_max_bytes, content_limit, raise_hint
from ember.record.precision import FullPrecision, HalfPrecision, PrecisionSettings

PathLike = str | Path


class Recorder:
    """Turns records into bytes in one format at one precision, and back.

    Args:
        precision: the dtypes tensors are saved with; ``FullPrecision`` (f32, i32) unless
            the class says otherwise.
        max_bytes: the content limit when loading: the most bytes a file's content may
            hold (inflated, for gzip). Default: ``EMBER_RECORD_MAX_BYTES`` if set, else no
            limit for uncompressed files and ``max(256 MiB, 256 x the file size)`` for
            gzip ones (see :mod:`ember.record.limits`).

    Raises:
        ArgumentError: ``precision`` is not a :class:`PrecisionSettings`, or ``max_bytes``
            not a positive int.
    """

    encoding: ClassVar[Encoding]
    compressed: ClassVar[bool] = False
    default_precision: ClassVar[PrecisionSettings] = FullPrecision

    def __init__(self, precision: PrecisionSettings | None = None, *,
                 max_bytes: int | None = None) -> None:  # fmt: skip
        if precision is None:
            precision = self.default_precision
        if not isinstance(precision, PrecisionSettings):
            raise ArgumentError(f"{type(self).__name__}: precision must be a PrecisionSettings "
                                f"such as FullPrecision, got {precision!r}")
        self.precision = precision
        self.max_bytes = check_max_bytes(max_bytes, type(self).__name__)

    @property
    def kind(self) -> str:
        """The format as a file extension names it: ``"mpk"``, ``"bin.gz"``, ..."""
        return self.encoding.extension + (".gz" if self.compressed else "")

    def chunks(self, record: Any) -> Iterator[Buffer]:
        """The encoded ``record`` as byte chunks, produced as they are consumed.

        The record is checked (and its tensors converted to the precision) before this
        returns; the chunks share tensor memory where the format allows.

        Raises:
            RecordError: a value that cannot be saved, named by its record path.
        """
        chunks = self.encoding.encode(record, self.precision)
        return gzip_chunks(chunks) if self.compressed else chunks

    def to_bytes(self, record: Any) -> bytes:
        """``record`` encoded as one byte string (what :meth:`FileRecorder.save` writes)."""
        return b"".join(self.chunks(record))

    def from_bytes(self, data: bytes | bytearray | memoryview, *, source: str | None = None) -> Any:
        """The record ``data`` holds; see :meth:`from_bytes_with_metadata`."""
        return self.from_bytes_with_metadata(data, source=source)[0]

    def from_bytes_with_metadata(
        self, data: bytes | bytearray | memoryview, *, source: str | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """The record ``data`` holds, and the metadata stored with it.

        Args:
            data: what :meth:`to_bytes` returned (or a file's content).
            source: the file the bytes came from, named in errors.

        Returns:
            the record, with tensors in the dtype they were stored with, and a dict with
            ``format``, ``version``, ``ember_version``, ``precision`` (``name``, ``float``,
            ``int``) and ``compression`` (``"gzip"`` or ``None``).

        Raises:
            RecordFormatError: ``data`` is in another format (the message says which), is
                truncated or corrupt, was written by a newer ember, or holds more than the
                content limit (``max_bytes``).
        """
        with _memory_error_typed(source):
            # A private copy unless data is immutable bytes: loaded tensors are views of it.
            return self._decode(private_copy(data), source)

    def _decode(self, data: np.ndarray, source: str | None) -> tuple[Any, dict[str, Any]]:
        """The record in ``data`` (a read-only uint8 buffer that loaded tensors may view)."""
        if (bytes(data[:2]) == GZIP_MAGIC) != self.compressed:
            raise self._foreign(data, source)
        limit = content_limit(len(data) if self.compressed else None, self.max_bytes)
        content: Content
        if self.compressed:
            content = InflatingContent(data, source, limit)
        elif limit is not None and len(data) > limit:
            raise RecordFormatError(f"{source or 'record bytes'}: {len(data)} bytes, more than "
                                    f"the content limit of {limit}; {raise_hint()}", file=source)
        else:
            content = Content(data, source)
        if not self.encoding.recognizes(content.head(_HEAD_NBYTES)):
            raise self._foreign(data, source)
        max_values = None if limit is None else limit // VALUE_COST
        try:
            record, metadata = self.encoding.decode(content, max_values)
        except RecordFormatError:
            content.check_stream()  # corrupt gzip data explains any error best
            raise
        metadata["compression"] = "gzip" if self.compressed else None
        return record, metadata

    def _foreign(self, data: np.ndarray, source: str | None) -> RecordFormatError:
        found, description = identify(data)
        what = source or "the byte string"
        name = type(self).__name__
        if found is not None and found != self.kind:
            writer = _WRITERS[found]
            message = (f"{what} was written by {writer} ({found}), not loaded with {name} "
                       f"({self.kind}): load it with {writer}")
        else:
            message = f"{what} is not in {name}'s format ({self.kind}): it is {description}"
        return RecordFormatError(message, file=source)

    def __repr__(self) -> str:
        limit = "" if self.max_bytes is None else f", max_bytes={self.max_bytes}"
        return f"{type(self).__name__}({self.precision!r}{limit})"


_HEAD_NBYTES = 128  # enough for every format to recognize its own files


@contextlib.contextmanager
def _memory_error_typed(source: str | None) -> Iterator[None]:
    """A MemoryError (a record bigger than the memory free, within its limits) as a
    RecordError naming the file."""
    try:
        yield
    except MemoryError:
        raise RecordError(f"{source or 'record bytes'}: not enough memory to load the record",
                          file=source) from None


class FileRecorder(Recorder):
    """A recorder that saves to and loads from files named with its :attr:`extension`."""

    extension: ClassVar[str]
    """The file extension, without its leading dot: ``"mpk"``, ``"bin.gz"``, ..."""

    def path_for(self, path: PathLike) -> Path:
        """``path`` with ``.{extension}`` appended, unless it already ends with it."""
        path = Path(path)
        suffix = "." + self.extension
        return path if path.name.endswith(suffix) else path.with_name(path.name + suffix)

    def save(self, record: Any, path: PathLike) -> Path:
        """Writes ``record`` to ``path`` + ``.{extension}``, atomically.

        An existing file is replaced only once the new one is complete: if anything fails,
        it keeps its old content and no temporary file remains.

        Returns:
            the path written.

        Raises:
            RecordFileNotFoundError: the directory does not exist.
            RecordError: a value that cannot be saved, named by its record path.
        """
        target = self.path_for(path)
        missing = RecordFileNotFoundError(
            f"cannot save the record to {target}: directory {target.parent} does not exist",
            file=str(target),
        )
        if not target.parent.is_dir():
            raise missing
        chunks = self.chunks(record)  # checks the record before any file is created
        try:
            atomic_write(target, chunks)
        except FileNotFoundError:  # the directory vanished meanwhile
            raise missing from None
        return target

    def load(self, path: PathLike) -> Any:
        """The record saved at ``path`` (tried as given, then with ``.{extension}``).

        Raises:
            RecordFileNotFoundError: neither file exists.
            RecordFormatError: see :meth:`Recorder.from_bytes_with_metadata`.
        """
        return self.load_with_metadata(path)[0]

    def load_with_metadata(self, path: PathLike) -> tuple[Any, dict[str, Any]]:
        """The record saved at ``path`` and its metadata, as :meth:`from_bytes_with_metadata`.

        The file is read once, into a buffer the loaded tensors are views of.
        """
        tried = list(dict.fromkeys([Path(path), self.path_for(path)]))
        for candidate in tried:
            if candidate.is_file():
                source = str(candidate)
                limit = content_limit(None, self.max_bytes)  # explicit limits bound files too
                with _memory_error_typed(source):
                    return self._decode(read_file(candidate, source, limit), source)
        raise RecordFileNotFoundError(
            f"no record file at {' or '.join(str(p) for p in tried)}", file=str(tried[-1])
        )


class NamedMpkFileRecorder(FileRecorder):
    """MessagePack with field names kept: fast, self-describing, the default format.

    Example:
        >>> import tempfile, pathlib
        >>> from ember import TensorData
        >>> from ember.record.precision import HalfPrecision
        >>> recorder = NamedMpkFileRecorder(HalfPrecision)
        >>> record = {"linear": {"weight": TensorData([[0.5, 2.0]], "f32"), "bias": None}}
        >>> path = recorder.save(record, pathlib.Path(tempfile.mkdtemp()) / "model")
        >>> path.name
        'model.mpk'
        >>> loaded = recorder.load(path.with_name("model"))
        >>> loaded["linear"]["weight"].dtype, loaded["linear"]["weight"].tolist()
        (DType.F16, [[0.5, 2.0]])
    """

    extension = "mpk"
    encoding = NAMED_MPK


class NamedMpkGzFileRecorder(NamedMpkFileRecorder):
    """Named MessagePack, gzip-compressed."""

    extension = "mpk.gz"
    compressed = True


class BinFileRecorder(FileRecorder):
    """The Bin format: a MessagePack index, then every tensor's raw bytes, 64-byte aligned."""

    extension = "bin"
    encoding = BIN


class BinGzFileRecorder(BinFileRecorder):
    """The Bin format, gzip-compressed."""

    extension = "bin.gz"
    compressed = True


class JsonGzFileRecorder(FileRecorder):
    """Compact JSON, gzip-compressed."""

    extension = "json.gz"
    encoding = JSON
    compressed = True


class PrettyJsonFileRecorder(FileRecorder):
    """Indented JSON, uncompressed: to read weights with any text tool."""

    extension = "json"
    encoding = JsonEncoding(indent=2)


class BinBytesRecorder(Recorder):
    """The Bin format as a byte string (``to_bytes`` / ``from_bytes``), for embedding a model.

    It reads what :class:`BinFileRecorder` writes, and the reverse.
    """

    encoding = BIN


class DefaultRecorder(NamedMpkFileRecorder):
    """Burn's default: :class:`NamedMpkFileRecorder`, full precision unless told otherwise."""


class CompactRecorder(NamedMpkGzFileRecorder):
    """Small files: :class:`NamedMpkGzFileRecorder` at half precision by default."""

    default_precision = HalfPrecision


class SensitiveCompactRecorder(NamedMpkGzFileRecorder):
    """Compressed without rounding: :class:`NamedMpkGzFileRecorder` at full precision."""


_WRITERS = {
    recorder.extension: recorder.__name__
    for recorder in (NamedMpkFileRecorder, NamedMpkGzFileRecorder, BinFileRecorder,
                     BinGzFileRecorder, JsonGzFileRecorder, PrettyJsonFileRecorder)
}
