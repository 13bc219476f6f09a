"""Batches through shared memory: arrays in one shared segment, a small skeleton by pickle.

A worker process turns a batch (any nesting of tuples, lists, dicts, dataclasses and other
picklable objects around ember Tensors and NumPy arrays) into a message:

* every Tensor's and NumPy array's elements are written into one *segment*, a file in a
  private folder of shared memory (``/dev/shm`` on Linux, which is what POSIX shared
  memory is there; the temporary folder elsewhere), at 64-byte aligned offsets;
* the rest of the batch is pickled with each array replaced by a reference to its place
  in the segment, so the pickled *skeleton* holds only the plain Python values.

The loader process maps the segment, unlinks its file at once (the memory stays while
it is mapped, so nothing is left behind once the batch is dropped, whatever happens
next) and unpickles the skeleton, putting a read-only NumPy view of the mapping where
each array was. Each batch has a segment of its own, so a view is never written again:
the Tensors wrap them without a copy on an NdArray device, and the mapping lives exactly
as long as the last view of it (NumPy holds the mapping through the views' base).

The messages are pickles exchanged between the loader and the workers it started, never
read from a file, so pickle is safe here (the items themselves come from the dataset).
"""

from __future__ import annotations

import contextlib
import io
import math
import mmap
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.backend.device import Device
from ember.tensor import Tensor

ALIGN = 64  # bytes: each array starts on a cache line (and any SIMD width NumPy uses)


@dataclass(frozen=True)
class ArraySlot:
    """Where one array lies in a segment."""

    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class SharedBatch:
    """The message for one batch: the segment's file name (None when no array has an
    element), its size, where each array lies, and the pickled skeleton."""

    segment: str | None
    size: int
    slots: tuple[ArraySlot, ...]
    skeleton: bytes


class SegmentFolder:
    """A private folder for the segments of one pool of workers; removing it removes them all.

    Example:
        >>> folder = SegmentFolder.create()
        >>> os.path.isdir(folder.path)
        True
        >>> folder.remove(); os.path.exists(folder.path)
        False
    """

    def __init__(self, path: str) -> None:
        self.path = path

    @staticmethod
    def create() -> SegmentFolder:
        """A new, empty folder in shared memory (in the temporary folder without ``/dev/shm``)."""
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else tempfile.gettempdir()
        return SegmentFolder(tempfile.mkdtemp(prefix=f"ember-loader-{os.getpid()}-", dir=base))

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def remove(self) -> None:
        """Deletes the folder and every segment still in it (mapped ones stay readable)."""
        shutil.rmtree(self.path, ignore_errors=True)


# ---------------------------------------------------------------------------- worker side
class _SkeletonPickler(pickle.Pickler):
    """Pickles a batch, taking its Tensors and arrays out into ``arrays``."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays: list[np.ndarray] = []

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            # into_data runs a lazy backend and gives the elements in C order on the host.
            self.arrays.append(obj.into_data().buffer())
            return ("tensor", len(self.arrays) - 1)
        if type(obj) is np.ndarray and not obj.dtype.hasobject:
            self.arrays.append(obj)
            return ("array", len(self.arrays) - 1)
        return None


def pack(batch: Any, folder: SegmentFolder, name: str) -> SharedBatch:
    """Writes ``batch``'s arrays into the segment ``name`` of ``folder``; the message to send.

    Raises whatever pickling the rest of the batch raises (an unpicklable value); no
    segment is left behind then.
    """
    skeleton = io.BytesIO()
    pickler = _SkeletonPickler(skeleton)
    pickler.dump(batch)
    slots, size = [], 0
    for array in pickler.arrays:
        size = -(-size // ALIGN) * ALIGN
        slots.append(ArraySlot(size, array.dtype, array.shape))
        size += array.nbytes
    if size == 0:
        return SharedBatch(None, 0, tuple(slots), skeleton.getvalue())
    path = folder.file(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        for slot, array in zip(slots, pickler.arrays):
            _write(fd, np.ascontiguousarray(array), slot.offset)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return SharedBatch(name, size, tuple(slots), skeleton.getvalue())


def _write(fd: int, array: np.ndarray, offset: int) -> None:
    # pwrite copies straight into the shared pages (no mapping to set up and tear down in
    # the worker); it may write less than asked for large arrays, hence the loop.
    data = memoryview(array.reshape(-1).view(np.uint8))
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


# ---------------------------------------------------------------------------- loader side
class _SkeletonUnpickler(pickle.Unpickler):
    """Unpickles a skeleton, putting views of the mapped segment where the arrays were."""

    def __init__(self, shared: SharedBatch, mapping: mmap.mmap | None, host: Device,
                 device: Device) -> None:  # fmt: skip
        super().__init__(io.BytesIO(shared.skeleton))
        self.shared = shared
        self.mapping = mapping
        self.host = host
        self.device = device

    def persistent_load(self, pid: Any) -> Any:
        what, index = pid
        slot = self.shared.slots[index]
        if self.mapping is None or math.prod(slot.shape) == 0:
            array = np.empty(slot.shape, slot.dtype)
        else:
            array = np.ndarray(slot.shape, slot.dtype, buffer=self.mapping, offset=slot.offset)
        if what == "array":
            return array
        array.flags.writeable = False  # tensors never change their elements
        tensor = Tensor.from_primitive(array, self.host)
        return tensor if self.host == self.device else tensor.to_device(self.device)


def unpack(shared: SharedBatch, folder: SegmentFolder, host: Device, device: Device) -> Any:
    """The batch of ``shared``: its Tensors on ``device`` (made on the NdArray device ``host``,
    without a copy where ``device`` is ``host``), its arrays as views of the segment."""
    mapping = None
    if shared.segment is not None:
        path = folder.file(shared.segment)
        fd = os.open(path, os.O_RDWR)
        try:
            mapping = mmap.mmap(fd, shared.size)
        finally:
            os.close(fd)
            os.unlink(path)  # the mapping keeps the memory; the name is no longer needed
    return _SkeletonUnpickler(shared, mapping, host, device).load()


def discard(shared: SharedBatch, folder: SegmentFolder) -> None:
    """Frees the segment of a batch nobody will take (an abandoned epoch)."""
    if shared.segment is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder.file(shared.segment))
