"""The numbers a weight file declares, checked before anything is allocated from them.

A PyTorch or safetensors file names element counts, shapes, strides, offsets
and byte ranges; a hostile one names whatever costs most. Everything the
importers take from a file passes through here first: each count must be a
plain non-negative integer that fits in 64 bits, each tensor view must lie
inside its storage, and each read must lie inside the file. Reading then
costs memory proportional to the file's own bytes; the few things that could
cost more (tensors expanded by stride 0, compressed zip entries, very large
headers) have ceilings in :class:`WeightLimits` that a user who trusts a file
may raise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ember.backend.errors import RecordFormatError
from ember.record.content import aligned_empty
from ember.record.limits import MAX_RANK, SizeError, describe, tensor_nbytes

INT64_MAX = (1 << 63) - 1
_MIB = 1 << 20


@dataclass(frozen=True)
class WeightLimits:
    """Ceilings on what a weight file may make ember allocate beyond the file's own bytes.

    Reading a weight file costs about its size: each tensor is copied once out
    of it. Only these can cost more, and a file that asks for more than its
    ceiling gets a :class:`~ember.backend.errors.RecordFormatError` that names
    the field to raise:

    Args:
        expanded_bytes: bytes that tensor copies may take beyond the file's
            storages: views that read an element more than once (``expand()``
            buffers, with stride 0) are materialized, and the copies of a whole
            file may exceed its storage bytes by at most this much.
        inflated_bytes: bytes that the compressed entries of a zip file may
            inflate to, together (``torch.save`` stores entries uncompressed;
            compressed ones come from re-zipping a file).
        pickle_bytes: size of the pickle that describes the tensors (``data.pkl``).
        zip_entries: number of entries in a zip file.
        header_bytes: size of a safetensors JSON header (the safetensors
            library's own ceiling).
        nesting: depth of nested containers in a pickle.

    Example:
        >>> from ember.record import PyTorchFileRecorder
        >>> recorder = PyTorchFileRecorder(limits=WeightLimits(expanded_bytes=1 << 30))
    """

    expanded_bytes: int = 64 * _MIB
    inflated_bytes: int = 1024 * _MIB
    pickle_bytes: int = 256 * _MIB
    zip_entries: int = 200_000
    header_bytes: int = 100_000_000
    nesting: int = 64


@dataclass(frozen=True)
class Origin:
    """The file a value came from, and what the file failed to be (the start of each message)."""

    file: str
    what: str = ""

    def __str__(self) -> str:
        return f"{self.file}: {self.what}" if self.what else self.file


Source = str | Origin


def fail(source: Source, key: str | None, message: str) -> RecordFormatError:
    """The error for a bad value at ``key`` (a tensor's name, or ``None``) of file ``source``."""
    where = f"{source}: {key}: " if key else f"{source}: "
    return RecordFormatError(where + message, path=key, file=str(getattr(source, "file", source)))


def count(value: Any, what: str, source: Source, key: str | None, upper: int = INT64_MAX) -> int:
    """``value`` when it is an integer in ``[0, upper]`` (bools are not counts), else an error."""
    if type(value) is not int:  # bool is an int subclass, and no count
        raise fail(source, key, f"{what} is {describe(value)}, not an integer")
    if not 0 <= value <= upper:
        raise fail(source, key, f"{what} is {value}, outside [0, {upper}]")
    return int(value)


def dims(value: Any, what: str, source: Source, key: str | None) -> tuple[int, ...]:
    """A tuple of counts (a shape or strides): a list or tuple of at most ``MAX_RANK`` of them."""
    if not isinstance(value, tuple | list):
        raise fail(source, key, f"{what} is {describe(value)}, not a list of integers")
    if len(value) > MAX_RANK:
        raise fail(source, key, f"{what} has {len(value)} dimensions, more than {MAX_RANK}")
    if all(type(v) is int and 0 <= v <= INT64_MAX for v in value):
        return tuple(value)
    for v in value:  # the failing one, named in the message
        count(v, f"{what} {describe(value)}", source, key)
    raise AssertionError("unreachable")


def num_bytes(shape: tuple[int, ...], itemsize: int, source: Source, key: str | None) -> int:
    """The bytes of a tensor of ``shape``; an error when NumPy could not even describe it."""
    try:
        return tensor_nbytes(shape, itemsize)
    except SizeError as exc:
        raise fail(source, key, str(exc)) from None


@dataclass(frozen=True)
class View:
    """A validated tensor view of a storage: elements ``offset + sum(i_k * stride_k)``."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        """Whether the view is a row-major run of ``numel`` elements (a zero-copy slice)."""
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


def view(shape: Any, stride: Any, offset: Any, storage_numel: int, itemsize: int,
         source: Source, key: str) -> View:
    """Checks that a view (shape, stride, offset) lies inside a storage of ``storage_numel``.

    Every element it reaches, ``offset + sum((shape_k - 1) * stride_k)`` at most,
    must be below ``storage_numel``; shapes, strides and the offset are plain
    non-negative 64-bit integers, with as many strides as dimensions.
    """
    shape = dims(shape, "shape", source, key)
    stride = dims(stride, "stride", source, key)
    offset = count(offset, "storage offset", source, key)
    if len(stride) != len(shape):
        raise fail(source, key, f"stride {list(stride)} does not fit shape {list(shape)}")
    num_bytes(shape, itemsize, source, key)
    if 0 not in shape:
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride))
        if last >= storage_numel:
            raise fail(source, key, f"shape {list(shape)}, stride {list(stride)} and offset "
                                    f"{offset} reach element {last} of a storage of "
                                    f"{storage_numel}")  # fmt: skip
    return View(shape, stride, offset)


class CopyBudget:
    """Counts the bytes of tensor copies of one file against its storage bytes plus a ceiling."""

    def __init__(self, storage_bytes: int, limits: WeightLimits, source: Source) -> None:
        self.left = storage_bytes + limits.expanded_bytes
        self.source = source

    def charge(self, nbytes: int, key: str, why: str) -> None:
        """Takes ``nbytes`` for a copy of ``key``, or raises before it is allocated."""
        if nbytes > self.left:
            raise fail(self.source, key, f"{why} would take {nbytes} bytes, more than the file "
                                         "holds plus WeightLimits.expanded_bytes allows "
                                         f"({self.left} left); raise it if you trust the file")
        self.left -= nbytes


def read_at(file: BinaryIO, offset: int, nbytes: int, source: Source, key: str | None
            ) -> np.ndarray:  # fmt: skip
    """Exactly ``nbytes`` of ``file`` from ``offset``, in a new buffer (see :func:`read_into`)."""
    return read_into(file, offset, np.empty(nbytes, np.uint8), source, key)


def read_into(file: BinaryIO, offset: int, out: np.ndarray, source: Source, key: str | None
              ) -> np.ndarray:  # fmt: skip
    """Fills the uint8 buffer ``out`` with the bytes of ``file`` from ``offset``; returns ``out``.

    The caller has checked the range against the file's size; a shorter read
    means the file shrank meanwhile. One copy, and nothing keeps the file open
    or mapped: overwriting the file later changes nothing that was read.
    """
    view, nbytes = memoryview(out), out.size
    file.seek(offset)
    done = 0
    while done < nbytes:
        got = file.readinto(view[done:])
        if not got:
            raise fail(source, key, f"truncated: {nbytes} bytes at offset {offset} expected, "
                                    f"{done} found")
        done += got
    return out


def arena(sizes: list[int]) -> list[np.ndarray]:
    """uint8 buffers of ``sizes`` bytes, each 64-byte aligned, carved from one allocation.

    One large allocation costs a fraction of many smaller ones (the kernel backs
    its pages in one call: reading 100 MB of weights into one buffer is about five
    times faster than into fifty). The price: a tensor keeps the whole buffer
    alive, as a tensor from ``torch.load`` keeps its storage.
    """
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // 64) * 64
    buffer = aligned_empty(total)
    return [buffer[at : at + size] for at, size in zip(offsets, sizes)]
