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
on Linux until the page is written to. One read into fresh memory costs no more than
mapping the file and touching every page; the memory is faulted in by the kernel in one
call (see :func:`aligned_empty`).
A tensor view keeps its whole buffer alive: to keep one small tensor of a big record
without the rest, copy it.

**Inflating.** :class:`InflatingContent` inflates gzip data as a decoder reads it, front to
back (:meth:`Content.read`). A read reaching beyond the content limit
(:mod:`ember.record.limits`) is refused before anything is inflated towards it, so the
sizes the data declares (a Bin header, a MessagePack bin) are checked before they cost
memory, and memory never exceeds what the stream really held up to the point of failure.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ember.backend.errors import RecordFormatError
from ember.backend.kept import seal
from ember.record.limits import raise_hint
from ember.record.tree import format_error

_ALIGN = 64
_IN_CHUNK = 1 << 16  # compressed bytes fed to zlib at a time
_OUT_CHUNK = 1 << 20  # the least inflated at a time beyond what is asked, to amortize calls
_BIG_CHUNK = 1 << 22  # the most inflated at a time into a tensor's own buffer
_CHECK_NBYTES = 16 << 20  # how far a failed decode inflates on, looking for a gzip error


_POPULATED_NBYTES = 1 << 20
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _no_path() -> str | None:
    return None


def aligned_empty(nbytes: int, fault_in: bool = True) -> np.ndarray:
    """A fresh uint8 buffer of ``nbytes`` whose first byte is 64-byte aligned.

    With ``fault_in``, a buffer of :data:`_POPULATED_NBYTES` or more is an anonymous
    memory map whose pages the kernel faults in at once (``MAP_POPULATE``, on Linux): for
    a buffer that is about to be filled whole. Without it, pages are faulted in as they
    are written: for a buffer that grows ahead of its content (inflating gzip data), whose
    unused end must cost no memory. Fresh memory is what a
    first load gets, and touching it page by page costs more than the read itself: on
    100 MB, one populated map took 38 ms against 47 ms for plain pages faulted one by
    one, and NumPy's transparent huge pages (10 ms while the machine had free ones) took
    220 ms once a process grew past them, on the same machine.
    """
    if fault_in and nbytes >= _POPULATED_NBYTES and _POPULATE:
        region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
        return np.frombuffer(region, np.uint8)  # page-aligned
    # bytearray: plain pages (NumPy would ask for huge pages, see above)
    raw = np.frombuffer(bytearray(nbytes + _ALIGN), np.uint8)
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
    return seal(buffer)


def private_copy(data: bytes | bytearray | memoryview) -> np.ndarray:
    """``data`` as a read-only uint8 array no one else can change (a copy unless it is bytes)."""
    if isinstance(data, bytes):
        array = np.frombuffer(data, np.uint8)
    else:
        view = memoryview(data)
        view = (view if view.c_contiguous else memoryview(view.tobytes())).cast("B")
        array = aligned_empty(view.nbytes)
        array[:] = np.frombuffer(view, np.uint8)
        return seal(array)
    array.flags.writeable = False
    return array


class Content:
    """A record's bytes, all present in memory (a file's buffer, or a part of one).

    Decoders :meth:`read` ranges front to back (each range checked against what is
    present), then call :meth:`finish` with the offset where the data ended.
    """

    def __init__(self, buffer: np.ndarray | memoryview, source: str | None) -> None:
        self.view = memoryview(buffer).cast("B")
        self.size = self.view.nbytes
        self.source = source

    @property
    def most(self) -> int:
        """The most bytes this content can hold: a bound for lengths it declares."""
        return self.size

    def read(self, start: int, nbytes: int, what: str = "the data",
             path: Callable[[], str | None] = _no_path) -> memoryview:  # fmt: skip
        """The bytes ``[start, start + nbytes)``: a view of the buffer here.

        Args:
            what: what needs the bytes, for the error message.
            path: gives the record path of the value being read, for the error message.

        Raises:
            RecordFormatError: the content ends before ``start + nbytes``.
        """
        end = start + nbytes
        if end > self.size:
            raise format_error(self.source, f"truncated: {what} at byte {start} needs {end} "
                                            f"bytes, the data holds {self.size}", path())
        return self.view[start:end]

    def read_rest(self, start: int) -> memoryview:
        """All bytes from ``start`` to the end of the content."""
        return self.view[start:]

    def finish(self, end: int) -> None:
        """Checks the content ends at offset ``end``."""
        if end != self.size:
            raise format_error(self.source, f"{self.size - end} unexpected bytes after the end "
                                            f"of the data (at byte {end})")

    def head(self, nbytes: int) -> bytes:
        """Up to ``nbytes`` first bytes (fewer when the content is shorter), never an error."""
        return bytes(self.view[:nbytes])

    def check_stream(self) -> None:
        """Raises the compression layer's error, if there is one: after a decoding error,
        corruption of the gzip stream is the better explanation."""


class InflatingContent(Content):
    """The content of one gzip member (RFC 1952), inflated as it is read, up to ``limit``.

    Reads must go front to back. Small ones are served from the last chunk zlib gave;
    a big one (a tensor) gets a buffer of its own that zlib's output is copied into as it
    comes, so memory holds the tensors read so far and one chunk, never the whole stream.

    Args:
        compressed: the gzip data.
        source: the file, named in errors.
        limit: the content limit: the member may inflate to at most this many bytes.
    """

    def __init__(self, compressed: np.ndarray, source: str | None, limit: int) -> None:
        super().__init__(np.empty(0, np.uint8), source)
        self.limit = limit
        self._compressed = memoryview(compressed).cast("B")
        self._consumed = 0  # compressed bytes given to zlib so far
        self._inflater = zlib.decompressobj(31)  # 31: a gzip header and trailer (with CRC)
        self._base = 0  # the content offset of self.view[0]; self.size is that of its end

    @property
    def most(self) -> int:
        return self.size if self._inflater.eof else self.limit

    def read(self, start: int, nbytes: int, what: str = "the data",
             path: Callable[[], str | None] = _no_path) -> memoryview:  # fmt: skip
        end = start + nbytes
        if end <= self.size:
            return self.view[start - self._base:end - self._base]
        if end > self.limit:
            raise format_error(self.source, f"{what} at byte {start} needs {end} bytes, beyond "
                                            f"the content limit of {self.limit} bytes for this "
                                            f"gzip file; {raise_hint()}", path())
        if nbytes < _OUT_CHUNK:
            self._refill(start, end, what, path)
            return self.view[start - self._base:end - self._base]
        # A buffer of its own, placed so that every offset keeps its alignment mod 64.
        shift = start % _ALIGN
        buffer = aligned_empty(nbytes + shift, fault_in=False)[shift:]
        out = memoryview(buffer)
        have = max(0, self.size - start)
        out[:have] = self.view[start - self._base:]
        while have < nbytes:
            # In pieces: zlib grows its output by reallocation, slow for one huge piece.
            chunk = self._produce(min(nbytes - have, _BIG_CHUNK))
            if not chunk:
                raise self._truncated(what, start, end, start + have, path)
            out[have:have + len(chunk)] = chunk
            have += len(chunk)
        self.view, self._base, self.size = memoryview(b""), end, end
        return memoryview(seal(buffer))

    def read_rest(self, start: int) -> memoryview:
        # One buffer, doubled as the data comes (the old one freed at once), up to the limit.
        have = self.size - start
        buffer = aligned_empty(min(max(2 * have, _OUT_CHUNK), self.limit - start),
                               fault_in=False)
        buffer[:have] = self.view[start - self._base:]
        while True:
            room = self.limit - start - have
            if room == 0:
                if self._produce_any():
                    raise format_error(self.source, f"the gzip data inflates to more than the "
                                                    f"content limit of {self.limit} bytes; "
                                                    f"{raise_hint()}")
                break
            chunk = self._produce(min(room, _OUT_CHUNK))
            if not chunk:
                break
            if have + len(chunk) > len(buffer):
                size = min(max(2 * len(buffer), have + len(chunk)), room + have)
                grown = aligned_empty(size, fault_in=False)
                grown[:have] = buffer[:have]
                buffer = grown
            buffer[have:have + len(chunk)] = np.frombuffer(chunk, np.uint8)
            have += len(chunk)
        self.view, self._base, self.size = memoryview(b""), start + have, start + have
        return memoryview(seal(buffer))[:have]

    def finish(self, end: int) -> None:
        if self.size > end or (self.size == end and self._produce_any()):
            raise format_error(self.source, f"unexpected data after the end of the content (at "
                                            f"byte {end} of the inflated gzip data)")
        if not self._inflater.eof:
            raise format_error(self.source, "truncated gzip data (the stream ends early)")
        extra = len(self._inflater.unused_data) + len(self._compressed) - self._consumed
        if extra:
            raise format_error(self.source, f"{extra} unexpected bytes after the gzip data")

    def head(self, nbytes: int) -> bytes:
        with contextlib.suppress(RecordFormatError):
            while self.size < nbytes:
                chunk = self._produce(nbytes - self.size)
                if not chunk:
                    break
                self.view = memoryview(bytes(self.view) + chunk)
                self.size += len(chunk)
        return bytes(self.view[:nbytes])

    def check_stream(self) -> None:
        # Inflate on into nothing, a bounded amount: enough to reach the CRC of most
        # corrupted files, without spending seconds on a bomb's zeros.
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

    # ------------------------------------------------------------------ inflating
    def _refill(self, start: int, end: int, what: str, path: Callable[[], str | None]) -> None:
        """Makes self.view hold ``[start, end)`` at least, plus up to a chunk more."""
        parts = [bytes(self.view[start - self._base:])]
        have = self.size - start
        while have < end - start:
            chunk = self._produce(min(max(_OUT_CHUNK, end - start - have),
                                      self.limit - start - have))
            if not chunk:
                raise self._truncated(what, start, end, start + have, path)
            parts.append(chunk)
            have += len(chunk)
        self.view, self._base, self.size = memoryview(b"".join(parts)), start, start + have

    def _produce(self, want: int) -> bytes:
        """The next output of zlib, 1 to ``want`` bytes; empty once the stream is over.

        Raises:
            RecordFormatError: corrupt gzip data.
        """
        inflater = self._inflater
        while not inflater.eof:
            tail = inflater.unconsumed_tail
            if not tail and self._consumed < len(self._compressed):
                tail = self._compressed[self._consumed:self._consumed + _IN_CHUNK]
                self._consumed += len(tail)
            try:
                # With no input left, this still gives what zlib holds back (a match cut
                # short by ``want``).
                out = inflater.decompress(tail, want)
            except zlib.error as exc:
                raise self._corrupt(exc) from None
            if out:
                return out
            if not tail:
                break  # no input left and nothing held back: the data ends early
        return b""

    def _produce_any(self) -> bool:
        """Whether the stream holds one more byte (which is then lost: the caller fails)."""
        return bool(self._produce(1))

    def _truncated(self, what: str, start: int, end: int, have: int,
                   path: Callable[[], str | None]) -> RecordFormatError:  # fmt: skip
        return format_error(self.source, f"truncated: {what} at byte {start} needs {end} "
                                         f"bytes, the gzip data inflates to {have}", path())

    def _corrupt(self, exc: zlib.error) -> RecordFormatError:
        return format_error(self.source, f"corrupt gzip data ({exc})")
