"""The bytes a record is decoded from: a file read once into a private buffer, or gzip data
inflated as far as the decoder asks and never beyond the content limit.

**Reading.** :func:`read_file` reads a record file with one ``readinto`` into a fresh,
64-byte aligned NumPy buffer, and the loaded tensors are views of that buffer (the Bin
format aligns each tensor; a Named MessagePack tensor whose bytes sit at an address its
dtype cannot be read at is copied). That buffer belongs to the loaded record alone and is
read-only: nothing writes to it after loading, and it is *not* a memory map of the file.
Overwriting, truncating or deleting the file later therefore changes no loaded tensor,
whereas with a map a truncated file kills the process with SIGBUS on the next access to
a weight, and even a copy-on-write (``ACCESS_COPY``) map shows another writer's changes
on Linux until the page is written to. One read into fresh memory costs about as much as
mapping the file and touching every page (100 MB in ~10 ms, with NumPy's huge pages).
A tensor view keeps its whole buffer alive: to keep one small tensor of a big record
without the rest, copy it.

**Inflating.** :class:`InflatingContent` inflates gzip data in chunks on demand. A decoder
asks for the bytes up to an offset (:meth:`Content.need`) as it reads the sizes the data
declares, so an offset beyond the content limit (:mod:`ember.record.limits`) is refused
before anything is inflated towards it, and memory never exceeds what the stream really
held up to the point of failure.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from ember.backend.errors import RecordFormatError
from ember.record.limits import raise_hint
from ember.record.tree import format_error

_ALIGN = 64
_IN_CHUNK = 1 << 16  # compressed bytes fed to zlib at a time
_OUT_CHUNK = 1 << 20  # the least inflated at a time beyond what is asked, to amortize calls
_CHECK_NBYTES = 16 << 20  # how far a failed decode inflates on, looking for a gzip error


def aligned_empty(nbytes: int) -> np.ndarray:
    """A fresh uint8 buffer of ``nbytes`` whose first byte is 64-byte aligned."""
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start:start + nbytes]


def read_file(path: Path, source: str, max_bytes: int | None = None) -> np.ndarray:
    """The bytes of the file at ``path`` in a fresh, read-only, aligned buffer.

    Raises:
        RecordFormatError: the file is bigger than ``max_bytes``, or changes size while
            it is read.
    """
    with open(path, "rb", buffering=0) as file:
        nbytes = os.fstat(file.fileno()).st_size
        if max_bytes is not None and nbytes > max_bytes:
            raise format_error(source, f"the file holds {nbytes} bytes, more than the content "
                                       f"limit of {max_bytes}; {raise_hint()}")
        buffer = aligned_empty(nbytes)
        view = memoryview(buffer)
        done = 0
        while done < nbytes:  # one call reads at most ~2 GiB on Linux
            count = file.readinto(view[done:])
            if not count:
                raise format_error(source, f"truncated: the file shrank to {done} bytes while "
                                           f"it was read ({nbytes} when opened)")
            done += count
    buffer.flags.writeable = False
    return buffer


def private_copy(data: bytes | bytearray | memoryview) -> np.ndarray:
    """``data`` as a read-only uint8 array no one else can change (a copy unless it is bytes)."""
    if isinstance(data, bytes):
        array = np.frombuffer(data, np.uint8)
    else:
        view = memoryview(data).cast("B")
        array = aligned_empty(view.nbytes)
        array[:] = np.frombuffer(view, np.uint8)
    array.flags.writeable = False
    return array


class Content:
    """A record's bytes, all present in memory.

    Decoders call :meth:`need` before reading a range, read :attr:`view` (a memoryview, fast
    for single bytes and ``struct``) or :attr:`array` (the NumPy buffer, for tensor views),
    and :meth:`finish` at the end.
    """

    def __init__(self, array: np.ndarray, source: str | None) -> None:
        self.array = array
        self.view = memoryview(array)
        self.size = len(array)
        self.source = source

    @property
    def most(self) -> int:
        """The most bytes this content can hold (its size, once all of it is known)."""
        return self.size

    def need(self, end: int, what: str = "the data", path: str | None = None) -> None:
        """Makes the bytes up to offset ``end`` available.

        Raises:
            RecordFormatError: there are fewer; the message names ``what`` needs them and its
                record ``path``.
        """
        if end > self.size:
            raise format_error(self.source, f"truncated: {what} needs {end} bytes, the data "
                                            f"holds {self.size}", path)

    def finish(self, end: int) -> None:
        """Checks the content ends at offset ``end``."""
        if end != self.size:
            raise format_error(self.source, f"{self.size - end} unexpected bytes after the end "
                                            f"of the data (at byte {end})")

    def read_all(self) -> int:
        """Makes all of the content available; returns its size."""
        return self.size

    def reserve(self, nbytes: int) -> None:
        """Prepares room for ``nbytes`` of content (all content is already in memory here)."""

    def head(self, nbytes: int) -> bytes:
        """Up to ``nbytes`` first bytes (fewer when the content is shorter), never an error."""
        return bytes(self.view[:nbytes])

    def check_stream(self) -> None:
        """Raises the compression layer's error, if there is one: after a decoding error,
        corruption of the gzip stream is the better explanation."""


class InflatingContent(Content):
    """The content of one gzip member (RFC 1952), inflated on demand up to ``limit`` bytes.

    Args:
        compressed: the gzip data.
        source: the file, named in errors.
        limit: the content limit; the member may inflate to at most this many bytes.
    """

    def __init__(self, compressed: np.ndarray, source: str | None, limit: int) -> None:
        super().__init__(np.empty(0, np.uint8), source)
        self.limit = limit
        self._compressed = memoryview(compressed)
        self._consumed = 0  # compressed bytes given to zlib so far
        self._inflater = zlib.decompressobj(31)  # 31: a gzip header and trailer (with CRC)

    @property
    def most(self) -> int:
        return self.size if self._inflater.eof else self.limit

    def need(self, end: int, what: str = "the data", path: str | None = None) -> None:
        if end <= self.size:
            return
        if end > self.limit:
            raise format_error(self.source, f"{what} needs {end} bytes, beyond the content "
                                            f"limit of {self.limit} bytes for this gzip file; "
                                            f"{raise_hint()}", path)
        while self.size < end:
            # Beyond what is asked, fill the room there is, up to a chunk: a Bin file
            # reserves its exact size, so its buffer is never grown (and copied).
            room = min(_OUT_CHUNK, len(self.array) - self.size)
            if not self._inflate(max(end - self.size, room)):
                raise format_error(self.source, f"truncated: {what} needs {end} bytes, the "
                                                f"gzip data inflates to {self.size}", path)

    def reserve(self, nbytes: int) -> None:
        """Makes room for ``nbytes`` of content (at most the limit) without inflating any.

        The room is virtual memory until data is inflated into it, so reserving a size a
        file declares (and that was checked against the limit) costs nothing if the data
        turns out to be shorter.
        """
        nbytes = min(nbytes, self.limit)
        if nbytes <= len(self.array):
            return
        grown = aligned_empty(max(nbytes, min(max(2 * len(self.array), _IN_CHUNK), self.limit)))
        grown[:self.size] = self.array[:self.size]
        # Views of the old buffer (tensors already decoded) keep it alive; nothing writes
        # to it any more.
        self.array, self.view = grown, memoryview(grown)

    def read_all(self) -> int:
        while self._inflate(_OUT_CHUNK):
            pass
        return self.size

    def finish(self, end: int) -> None:
        if self.size == end:
            self._inflate(1)
        if self.size != end:
            raise format_error(self.source, f"unexpected data after the end of the content (at "
                                            f"byte {end} of the inflated gzip data)")
        if not self._inflater.eof:
            raise format_error(self.source, "truncated gzip data (the stream ends early)")
        extra = len(self._inflater.unused_data) + len(self._compressed) - self._consumed
        if extra:
            raise format_error(self.source, f"{extra} unexpected bytes after the gzip data")

    def head(self, nbytes: int) -> bytes:
        try:
            while self.size < nbytes and self._inflate(nbytes - self.size):
                pass
        except RecordFormatError:
            pass
        return bytes(self.view[:min(nbytes, self.size)])

    def check_stream(self) -> None:
        # Inflate on into a throwaway buffer, a bounded amount: enough to reach the CRC of
        # most corrupted files, without spending seconds on a bomb's zeros.
        inflater = self._inflater.copy()
        tail = self._inflater.unconsumed_tail
        position, produced = self._consumed, 0
        try:
            while not inflater.eof and produced < _CHECK_NBYTES:
                if not tail and position < len(self._compressed):
                    tail = self._compressed[position:position + _IN_CHUNK]
                    position += len(tail)
                out = inflater.decompress(tail, _OUT_CHUNK)
                if not out and not tail:
                    return  # the data ends early: the decoder's error says so
                produced += len(out)
                tail = inflater.unconsumed_tail
        except zlib.error as exc:
            raise self._corrupt(exc) from None

    def _inflate(self, want: int) -> int:
        """Inflates up to ``want`` more bytes (never past the limit); returns how many.

        0 means the stream has ended, or the compressed data ran out. Raises a
        RecordFormatError for corrupt data and for content beyond the limit.
        """
        inflater = self._inflater
        while not inflater.eof:
            room = self.limit - self.size
            if room == 0:
                # Whether the stream holds more than the limit: one byte more tells.
                if self._next_output(1):
                    raise format_error(self.source, f"the gzip data inflates to more than the "
                                                    f"content limit of {self.limit} bytes; "
                                                    f"{raise_hint()}")
                return 0
            out = self._next_output(min(want, room))
            if out:
                self.reserve(self.size + len(out))
                self.view[self.size:self.size + len(out)] = out
                self.size += len(out)
                return len(out)
            if self._consumed >= len(self._compressed) and not inflater.unconsumed_tail:
                return 0
        return 0

    def _next_output(self, want: int) -> bytes:
        """What zlib gives for the next input, at most ``want`` bytes (may be empty)."""
        inflater = self._inflater
        tail = inflater.unconsumed_tail
        if not tail and self._consumed < len(self._compressed):
            tail = self._compressed[self._consumed:self._consumed + _IN_CHUNK]
            self._consumed += len(tail)
        try:
            # With no input left, this still gives what zlib holds back (a match cut short
            # by ``want``).
            return inflater.decompress(tail, want)
        except zlib.error as exc:
            raise self._corrupt(exc) from None

    def _corrupt(self, exc: zlib.error) -> RecordFormatError:
        return format_error(self.source, f"corrupt gzip data ({exc})")
