"""Reading ``torch.save`` files without torch, without running their code, in bounded memory.

A PyTorch weight file is a pickle. Unpickling may call any importable
function, so ember reads it with its own :class:`~ember.record.pickle_reader.PickleReader`,
which resolves only the few names a state dict needs (tensor rebuilding,
storage types and dtypes, ``OrderedDict``) to ember's stand-ins and refuses
every other name with :class:`UnsafePickleError` before anything is called.

Two layouts exist:

* zip (the default since torch 1.6): ``<dir>/data.pkl`` is the pickle; each
  storage it references by persistent id ``("storage", type, key, location,
  numel)`` is the raw bytes of the entry ``<dir>/data/<key>``, stored
  uncompressed (``<dir>/byteorder`` says ``little`` or ``big``).
* legacy (``_use_new_zipfile_serialization=False``): five pickles in a row
  (magic number, protocol version, system info, the object, the list of
  storage keys), then each storage as an 8-byte little-endian element count
  followed by its bytes, in the order of that list.

Every number the file declares is checked before memory is allocated for it
(see :mod:`ember.record.weight_limits`): a storage's element count against
the bytes its entry really holds, each tensor's shape, stride and offset
against its storage, each zip entry against the file and against the other
entries (no two may share bytes). Storages are read once, into one buffer
(see :func:`~ember.record.weight_limits.arena`); a tensor that is a row-major
run of its storage is a view of that buffer, any other tensor a copy. Views
that read elements more than once (``expand()`` buffers, stride 0) are
materialized like any other copy, so the copies of a file together may exceed
its storage bytes by at most :attr:`WeightLimits.expanded_bytes`; past that
the file is refused with a :class:`RecordFormatError` before the copy is made
(keeping them as broadcast views instead would break TensorData's promise of
a contiguous buffer). Nothing keeps the file open or mapped: overwriting it
later changes no tensor read from it.
"""

from __future__ import annotations

import collections
import itertools
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from ember.backend.errors import RecordFileNotFoundError, UnsafePickleError
from ember.record.limits import describe
from ember.record.pickle_reader import PickleReader
from ember.record.weight_limits import (
    CopyBudget,
    WeightLimits,
    arena,
    count,
    fail,
    read_at,
    read_into,
    view,
)
from ember.tensor import TensorData

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001

_TORCH_DTYPES = {
    "float64": np.float64, "float32": np.float32, "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16, "int64": np.int64, "int32": np.int32, "int16": np.int16,
    "int8": np.int8, "uint8": np.uint8, "bool": np.bool_, "uint16": np.uint16,
    "uint32": np.uint32, "uint64": np.uint64, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}  # fmt: skip
_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_, "UntypedStorage": np.uint8,
}  # fmt: skip


@dataclass(frozen=True)
class _StorageType:
    """Stands in for ``torch.FloatStorage`` and friends: only names an element type."""

    name: str
    dtype: np.dtype


@dataclass(frozen=True)
class _DType:
    """Stands in for ``torch.uint16`` and the other dtypes ``_rebuild_tensor_v3`` names."""

    name: str
    dtype: np.dtype


class _Tensor:
    """A tensor view described by the pickle, as given: checked once its storage is read."""

    def __init__(self, storage: Any, offset: Any, size: Any, stride: Any, dtype: Any = None
                 ) -> None:  # fmt: skip
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.dtype = dtype  # a _DType (v3), or None for the storage's own element type


# torch's own signatures: a call with other arguments is refused, as torch.load refuses it
def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any) -> _Tensor:
    return _Tensor(storage, offset, size, stride)


def _rebuild_tensor_v2(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any,
                       hooks: Any, metadata: Any = None) -> _Tensor:  # fmt: skip
    return _Tensor(storage, offset, size, stride)


def _rebuild_tensor_v3(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any,
                       hooks: Any, dtype: Any, metadata: Any = None) -> _Tensor:  # fmt: skip
    return _Tensor(storage, offset, size, stride, dtype)


def _rebuild_parameter(data: Any, requires_grad: Any, hooks: Any) -> Any:
    return data


def _rebuild_parameter_with_state(data: Any, requires_grad: Any, hooks: Any, state: Any) -> Any:
    return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
    ("torch.storage", "UntypedStorage"): _StorageType("UntypedStorage", np.dtype(np.uint8)),
    **{("torch", n): _StorageType(n, np.dtype(d)) for n, d in _STORAGE_DTYPES.items()},
    **{("torch", n): _DType(n, np.dtype(d)) for n, d in _TORCH_DTYPES.items()},
}


class _Storage:
    """A storage referenced by persistent id: its declared size, then its bytes once read."""

    def __init__(self, key: str, dtype: np.dtype, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel
        self.nbytes = numel * dtype.itemsize
        self.buffer: np.ndarray | None = None  # uint8, filled from the file
        self.swapped: np.dtype | None = None  # the dtype a big-endian buffer was swapped for

    def typed(self, dtype: np.dtype, big_endian: bool, source: str, name: str) -> np.ndarray:
        """The buffer as native ``dtype`` elements; big-endian bytes are swapped once, in place."""
        raw = self.buffer[: self.buffer.size - self.buffer.size % dtype.itemsize]
        if dtype == np.bool_ and raw.size and raw.max() > 1:
            np.minimum(raw, 1, out=raw)  # a bool is one byte of 0 or 1, whatever the file held
        if big_endian and dtype.itemsize > 1:
            if self.swapped is None:
                raw.view(dtype).byteswap(inplace=True)
                self.swapped = dtype
            elif self.swapped.itemsize != dtype.itemsize:
                raise fail(source, name, f"storage {self.key} is read as {self.swapped} and as "
                                         f"{dtype} in a big-endian file, which is not supported")
        return raw.view(dtype)


class _Unpickling:
    """What one pickle's persistent ids and globals resolve to, and the storages it names."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.storages: dict[str, _Storage] = {}

    def find_global(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise UnsafePickleError(
                f"{self.source}: refused to load {describe(f'{module}.{name}')}: a weight file may "
                "only hold tensors, storages and dicts (nothing from it is executed)",
                file=self.source,
            )
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if not (type(pid) is tuple and len(pid) in (5, 6) and pid[0] == "storage"):
            raise UnsafePickleError(f"{self.source}: unknown persistent id {describe(pid)}",
                                    file=self.source)  # fmt: skip
        storage_type, key, numel = pid[1], pid[2], pid[4]
        if type(key) is not str:
            raise fail(self.source, None, f"a storage key is {describe(key)}, not a string")
        if not isinstance(storage_type, _StorageType):
            raise fail(self.source, None, f"storage {describe(key)} has no known element type "
                                          f"({describe(storage_type)})")  # fmt: skip
        if len(pid) == 6 and pid[5] is not None:
            raise fail(self.source, None, f"storage {describe(key)} is a view of another storage "
                                          f"({describe(pid[5])}), which torch stopped writing in 2018")
        numel = count(numel, f"the element count of storage {describe(key)}", self.source, None)
        dtype = storage_type.dtype
        count(numel * dtype.itemsize, f"the byte count of storage {describe(key)}", self.source, None)
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(key, dtype, numel)
        elif storage.dtype != dtype or storage.numel != numel:
            raise fail(self.source, None, f"storage {describe(key)} is declared twice, as {numel} x "
                                          f"{dtype} and as {storage.numel} x {storage.dtype}")
        return storage

    def reader(self, data: bytes | np.ndarray, limits: WeightLimits) -> PickleReader:
        return PickleReader(data, self.source, self.find_global, self.persistent_load,
                            limits.nesting)  # fmt: skip


def read_pytorch(
    path: str | Path, *, top_level_key: str | None = None, limits: WeightLimits | None = None
) -> dict[str, TensorData]:
    """The tensors of a ``torch.save`` file by dotted name, in file order.

    Args:
        path: a ``.pt`` / ``.pth`` / ``.bin`` file (zip or legacy layout).
        top_level_key: for checkpoints like ``{"model": state_dict, "epoch": 3}``,
            the key of the part to read. Nested dicts are flattened with dots;
            values that are not tensors are skipped.
        limits: ceilings on memory beyond the file's own bytes (expanded tensors,
            compressed entries); :class:`WeightLimits` defaults when omitted.

    Raises:
        RecordFileNotFoundError: no such file.
        UnsafePickleError: the pickle names anything besides tensors and containers.
        RecordFormatError: not a PyTorch file, truncated or corrupt, a size, shape,
            stride or offset that does not fit the bytes present, a limit exceeded,
            or no tensors. The message names the file, the tensor and the value.
    """
    path = Path(path)
    source = str(path)
    limits = limits or WeightLimits()
    if not path.is_file():
        raise RecordFileNotFoundError(f"PyTorch file {source} does not exist", file=source)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if file.read(4) == b"PK\x03\x04":
                obj, storages, big_endian = _read_zip(file, size, source, limits)
            else:
                data = read_at(file, 0, size, source, None)
                obj, storages, big_endian = _read_legacy(data, source, limits)
    except OSError as exc:
        raise fail(source, None, f"cannot be read: {exc}") from None
    if top_level_key is not None:
        if not isinstance(obj, Mapping) or top_level_key not in obj:
            keys = list(obj)[:20] if isinstance(obj, Mapping) else type(obj).__name__
            raise fail(source, None, f"no top-level key {top_level_key!r} (found {describe(keys)})")
        obj = obj[top_level_key]
    budget = CopyBudget(sum(s.nbytes for s in storages.values()), limits, source)
    tensors = _Tensors(source, big_endian, budget, limits.nesting)
    tensors.flatten(obj)
    if not tensors.out:
        raise fail(source, None, "holds no tensors")
    return tensors.out


# ---------------------------------------------------------------------------------- zip layout
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError,
               struct.error, EOFError, OverflowError, IndexError, KeyError)  # fmt: skip
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_DEFLATE_RATIO = 1032  # the most bytes deflate can produce from one compressed byte


def _read_zip(file: BinaryIO, file_size: int, source: str, limits: WeightLimits):
    _check_entry_count(file, file_size, source, limits)
    try:
        archive = zipfile.ZipFile(file)
    except _ZIP_ERRORS as exc:
        raise fail(source, None, f"not a readable zip file: {describe(str(exc))}") from None
    entries = _Entries(archive, file, file_size, source, limits)
    pickles = [n for n in entries.infos if n == "data.pkl" or n.endswith("/data.pkl")]
    if len(pickles) != 1:
        what = "without data.pkl" if not pickles else f"with {len(pickles)} data.pkl entries"
        raise fail(source, None, f"a zip file {what} is not a PyTorch file")
    prefix = pickles[0][: -len("data.pkl")]
    big_endian = False
    if f"{prefix}byteorder" in entries.infos:
        order = entries.read(f"{prefix}byteorder", upper=16).tobytes().strip()
        if order not in (b"little", b"big"):
            raise fail(source, None, f"byteorder is {describe(order)}, not little or big")
        big_endian = order == b"big"
    unpickling = _Unpickling(source)
    pickled = entries.read(pickles[0], upper=limits.pickle_bytes, limit_name="pickle_bytes")
    obj = unpickling.reader(pickled, limits).load()
    users = _first_users(obj, source, limits.nesting)
    members = {}
    for key, storage in unpickling.storages.items():
        member = members[key] = f"{prefix}data/{key}"
        if member not in entries.infos:
            raise fail(source, users.get(key), f"storage {describe(key)} is missing ({describe(member)})")
        held = entries.infos[member].file_size
        if held != storage.nbytes:
            raise fail(source, users.get(key), f"storage {describe(key)} declares {storage.numel} x "
                                     f"{storage.dtype} = {storage.nbytes} bytes, its entry "
                                     f"holds {held}")  # fmt: skip
        entries.locate(member)
    entries.check_disjoint()
    buffers = arena([storage.nbytes for storage in unpickling.storages.values()])
    for (key, storage), out in zip(unpickling.storages.items(), buffers):
        storage.buffer = entries.read(members[key], out=out)
    return obj, unpickling.storages, big_endian


class _Entries:
    """The entries of a zip file by name, read with every size checked against the file."""

    def __init__(self, archive: zipfile.ZipFile, file: BinaryIO, file_size: int, source: str,
                 limits: WeightLimits) -> None:  # fmt: skip
        self.archive, self.file, self.file_size = archive, file, file_size
        self.source, self.limits = source, limits
        self.infos: dict[str, zipfile.ZipInfo] = {}
        for info in archive.infolist():
            name = info.filename
            if name in self.infos:
                raise fail(source, None, f"the zip entry {describe(name)} appears twice")
            if name.startswith("/") or "\\" in name or "\x00" in name or ".." in name.split("/"):
                raise fail(source, None, f"the zip entry name {describe(name)} is not a plain "
                                         "relative path")  # fmt: skip
            self.infos[name] = info
        self.spans: dict[str, tuple[int, int]] = {}  # name -> (first byte, end) in the file
        self.inflated = 0

    def locate(self, name: str) -> int:
        """Where ``name``'s data starts, after checking its local header and its extent."""
        info, source = self.infos[name], self.source
        if info.flag_bits & 0x1:
            raise fail(source, None, f"the zip entry {describe(name)} is encrypted")
        if info.external_attr & 0x10:  # MS-DOS's directory bit, which torch's reader obeys
            raise fail(source, None, f"the zip entry {describe(name)} is marked as a directory")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise fail(source, None, f"the zip entry {describe(name)} uses compression method "
                                     f"{info.compress_type}; only stored and deflated entries "
                                     "are read")  # fmt: skip
        start = info.header_offset
        if start < 0 or start + _LOCAL_HEADER.size > self.file_size:
            raise fail(source, None, f"the zip entry {describe(name)} starts at byte {start}, "
                                     f"past the end")  # fmt: skip
        raw = read_at(self.file, start, _LOCAL_HEADER.size, source, None).tobytes()
        header = _LOCAL_HEADER.unpack(raw)
        signature, method, name_length, extra_length = header[0], header[3], header[9], header[10]
        if signature != b"PK\x03\x04" or method != info.compress_type:
            raise fail(source, None, f"the zip entry {describe(name)} has no matching local header")
        data_start = start + _LOCAL_HEADER.size + name_length + extra_length
        end = data_start + info.compress_size
        if end > self.file_size:
            raise fail(source, None, f"the zip entry {describe(name)} claims bytes up to {end}; the "
                                     f"file has {self.file_size}")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise fail(source, None, f"the stored zip entry {describe(name)} claims {info.file_size} "
                                     f"bytes in {info.compress_size}")
        if info.file_size > _DEFLATE_RATIO * info.compress_size + 64:
            raise fail(source, None, f"the zip entry {describe(name)} claims {info.file_size} bytes "
                                     f"from {info.compress_size} compressed, more than deflate "
                                     "can make")  # fmt: skip
        self.spans[name] = (start, end)
        return data_start

    def check_disjoint(self) -> None:
        """No two entries read may share bytes: each byte of the file is one tensor's at most."""
        ordered = sorted((span, name) for name, span in self.spans.items())
        for ((_, end), name), ((start, _), other) in itertools.pairwise(ordered):
            if start < end:
                raise fail(self.source, None, f"the zip entries {describe(name)} and "
                                              f"{describe(other)} overlap")  # fmt: skip

    def read(self, name: str, upper: int | None = None, limit_name: str = "",
             out: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """The bytes of entry ``name`` (at most ``upper``), inflated within the limits if
        compressed, in ``out`` (a uint8 buffer of the entry's size) or a new buffer."""
        info, source = self.infos[name], self.source
        if upper is not None and info.file_size > upper:
            field = f" (WeightLimits.{limit_name})" if limit_name else ""
            raise fail(source, None, f"the zip entry {describe(name)} holds {info.file_size} bytes, "
                                     f"more than {upper}{field}")
        data_start = self.locate(name) if name not in self.spans else self._data_start(info)
        if out is None:
            out = np.empty(info.file_size, np.uint8)
        if info.compress_type == zipfile.ZIP_STORED:
            read_into(self.file, data_start, out, source, None)
            if zlib.crc32(out) != info.CRC:  # as torch checks it (inflating checks its own)
                raise fail(source, None, f"the zip entry {describe(name)} is corrupt: its CRC-32 "
                                         "does not match its bytes")
            return out
        self.inflated += info.file_size
        if self.inflated > self.limits.inflated_bytes:
            raise fail(source, None, f"compressed entries inflate to {self.inflated} bytes, more "
                                     "than WeightLimits.inflated_bytes; raise it if you trust "
                                     "the file")  # fmt: skip
        return self._inflate(info, out)

    def _data_start(self, info: zipfile.ZipInfo) -> int:
        return self.spans[info.filename][1] - info.compress_size

    def _inflate(self, info: zipfile.ZipInfo, buffer: np.ndarray) -> np.ndarray:
        done = 0
        try:
            with self.archive.open(info) as stream:
                while done < info.file_size:
                    chunk = stream.read(min(1 << 20, info.file_size - done))
                    if not chunk:
                        break
                    buffer[done : done + len(chunk)] = np.frombuffer(chunk, np.uint8)
                    done += len(chunk)
                surplus = stream.read(1)
        except (*_ZIP_ERRORS, zlib.error, OSError) as exc:
            raise fail(self.source, None, f"the zip entry {describe(info.filename)} does not inflate: "
                                          f"{describe(str(exc))}") from None
        if done != info.file_size or surplus:
            raise fail(self.source, None, f"the zip entry {describe(info.filename)} inflates to other "
                                          f"than its {info.file_size} bytes")
        return buffer


def _check_entry_count(file: BinaryIO, file_size: int, source: str, limits: WeightLimits) -> None:
    """Refuses more than ``limits.zip_entries`` entries before the directory is parsed."""
    tail_size = min(file_size, 22 + 0xFFFF)  # the end record and the longest comment
    tail = read_at(file, file_size - tail_size, tail_size, source, None).tobytes()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return  # not a zip end record: zipfile says so in its own words
    entries = struct.unpack("<H", tail[at + 10 : at + 12])[0]
    locator = at - 20
    if entries == 0xFFFF and locator >= 0 and tail[locator : locator + 4] == b"PK\x06\x07":
        record = struct.unpack("<Q", tail[locator + 8 : locator + 16])[0]
        if record + 56 <= file_size:
            entries = struct.unpack("<Q", read_at(file, record + 32, 8, source, None).tobytes())[0]
    if entries > limits.zip_entries:
        raise fail(source, None, f"the zip file declares {entries} entries, more than "
                                 f"WeightLimits.zip_entries ({limits.zip_entries})")


# ---------------------------------------------------------------------------------- legacy layout
def _read_legacy(data: np.ndarray, source: str, limits: WeightLimits):
    unpickling = _Unpickling(source)
    reader = unpickling.reader(data, limits)
    magic = None
    if data.size and data[0] == 0x80:
        try:
            magic = reader.load()
        except UnsafePickleError:
            raise
        except Exception:  # any failure here means: not a legacy file
            magic = None
    if type(magic) is not int or magic != _LEGACY_MAGIC:
        raise fail(source, None, "neither a zip nor a legacy PyTorch file")
    protocol = reader.load()
    if protocol != _LEGACY_PROTOCOL:
        raise fail(source, None, f"legacy protocol {describe(protocol)}, not {_LEGACY_PROTOCOL}")
    sys_info = reader.load()
    little = sys_info.get("little_endian", True) if isinstance(sys_info, dict) else True
    if type(little) is not bool:
        raise fail(source, None, f"little_endian is {describe(little)}, not a bool")
    obj = reader.load()
    keys = reader.load()
    if type(keys) is not list or any(type(k) is not str for k in keys):
        raise fail(source, None, f"the storage keys are {describe(keys)}, not a list of strings")
    position, starts = reader.position, {}
    users = _first_users(obj, source, limits.nesting)
    for key in keys:
        storage = unpickling.storages.get(key)
        if storage is None:
            raise fail(source, None, f"storage {describe(key)} is listed but never used")
        if key in starts:
            raise fail(source, None, f"storage {describe(key)} is listed twice")
        user = users.get(key)
        if position + 8 > len(data):
            raise fail(source, user, f"truncated before storage {describe(key)}")
        numel = int(data[position : position + 8].view("<i8")[0])
        if numel != storage.numel:
            raise fail(source, user, f"storage {describe(key)} holds {numel} elements, its reference "
                                     f"declares {storage.numel}")
        position += 8
        if position + storage.nbytes > len(data):
            raise fail(source, user, f"truncated: storage {describe(key)} needs {storage.nbytes} "
                                     f"bytes, {len(data) - position} left")
        starts[key] = position
        position += storage.nbytes
    # copied out of the file's bytes, which keep no alignment, into aligned buffers
    buffers = arena([unpickling.storages[key].nbytes for key in keys])
    for key, out in zip(keys, buffers):
        out[:] = data[starts[key] : starts[key] + out.size]
        unpickling.storages[key].buffer = out
    return obj, unpickling.storages, not little


# ---------------------------------------------------------------------------------- tensors
class _Tensors:
    """Walks the unpickled object, turning each tensor into TensorData under its dotted name."""

    def __init__(self, source: str, big_endian: bool, budget: CopyBudget, nesting: int) -> None:
        self.source, self.big_endian = source, big_endian
        self.budget, self.nesting = budget, nesting
        self.out: dict[str, TensorData] = {}
        self.done: dict[int, TensorData] = {}  # a tensor the pickle names twice is read once

    def flatten(self, obj: Any) -> None:
        for name, tensor in _walk(obj, "", 0, self.source, self.nesting):
            data = self.done.get(id(tensor))
            if data is None:
                data = self.done[id(tensor)] = self.materialize(tensor, name)
            self.out[name] = data

    def materialize(self, tensor: _Tensor, name: str) -> TensorData:
        source = self.source
        storage = tensor.storage
        if not isinstance(storage, _Storage):
            raise fail(source, name, f"the storage is {describe(storage)}, not a storage reference")
        if tensor.dtype is None:
            dtype = storage.dtype
        elif isinstance(tensor.dtype, _DType):
            dtype = tensor.dtype.dtype
        else:
            raise fail(source, name, f"the dtype is {describe(tensor.dtype)}, not a torch dtype")
        if storage.buffer is None:
            raise fail(source, name, f"the bytes of storage {describe(storage.key)} are missing")
        elements = storage.typed(dtype, self.big_endian, source, name)
        itemsize = dtype.itemsize
        checked = view(tensor.size, tensor.stride, tensor.offset, elements.size, itemsize,
                       source, name)  # fmt: skip
        shape, stride, offset = checked.shape, checked.stride, checked.offset
        if checked.numel == 0:
            return TensorData._wrap(np.empty(shape, dtype))
        if checked.is_contiguous():
            return TensorData._wrap(elements[offset : offset + checked.numel].reshape(shape))
        self.budget.charge(checked.numel * itemsize, name,
                           f"copying its view (shape {list(shape)}, stride {list(stride)})")
        strided = np.lib.stride_tricks.as_strided(
            elements[offset:],
            shape=shape,
            # a dimension of one element may have any stride; NumPy's must fit in 64 bits
            strides=tuple(s * itemsize if n > 1 else 0 for n, s in zip(shape, stride)),
            writeable=False,
        )
        return TensorData._wrap(np.array(strided, order="C"))


def _walk(obj: Any, prefix: str, depth: int, source: str, nesting: int
          ) -> Iterator[tuple[str, _Tensor]]:  # fmt: skip
    """Each tensor in ``obj`` and its dicts, in file order, under its dotted name."""
    if isinstance(obj, _Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        if depth >= nesting:
            raise fail(source, prefix, f"dicts nest deeper than {nesting}")
        for key, value in obj.items():
            name = _name(key, source, prefix)
            name = f"{prefix}.{name}" if prefix else name
            yield from _walk(value, name, depth + 1, source, nesting)


def _first_users(obj: Any, source: str, nesting: int) -> dict[str, str]:
    """The name of the first tensor of each storage: what errors about a storage name."""
    users: dict[str, str] = {}
    for name, tensor in _walk(obj, "", 0, source, nesting):
        if isinstance(tensor.storage, _Storage):
            users.setdefault(tensor.storage.key, name)
    return users


def _name(key: Any, source: str, prefix: str) -> str:
    if type(key) is str:
        return key
    try:
        return str(key)
    except ValueError:  # an int too long to print
        raise fail(source, prefix, f"a key is {describe(key)}, which has no name") from None
