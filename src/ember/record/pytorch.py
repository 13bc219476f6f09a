"""Reading ``torch.save`` files without torch, and without running code from them.

A PyTorch weight file is a pickle. Unpickling may call any importable
function, so ember never uses the standard unpickler on it: a restricted one
resolves only the few names a state dict needs (tensor rebuilding, storage
types, ``OrderedDict``) to ember's own stand-ins and refuses every other name
with :class:`UnsafePickleError` before anything is called.

Two layouts exist:

* zip (the default since torch 1.6): ``<dir>/data.pkl`` is the pickle; each
  storage it references by persistent id ``("storage", type, key, location,
  numel)`` is the raw little-endian bytes of ``<dir>/data/<key>``.
* legacy (``_use_new_zipfile_serialization=False``): five pickles in a row
  (magic number, protocol version, system info, the object, the list of
  storage keys), then each storage as an 8-byte little-endian element count
  followed by its bytes, in the order of that list.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ember.backend.errors import RecordFileNotFoundError, RecordFormatError, UnsafePickleError
from ember.tensor import TensorData

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}  # fmt: skip


class _StorageType:
    """Stands in for ``torch.FloatStorage`` and friends: only names an element type."""

    def __init__(self, name: str) -> None:
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


class _Tensor:
    """A tensor view described by the pickle, resolved once the storages are read."""

    def __init__(self, storage: Any, offset: int, size: tuple, stride: tuple) -> None:
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)


def _rebuild_tensor(storage: Any, offset: int, size: tuple, stride: tuple, *_: Any) -> _Tensor:
    return _Tensor(storage, offset, size, stride)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    **{("torch", name): _StorageType(name) for name in _STORAGE_DTYPES},
}


class _Storage:
    """A storage referenced by persistent id; its bytes arrive later (legacy) or on demand (zip)."""

    def __init__(self, dtype: np.dtype, key: str) -> None:
        self.dtype, self.key = dtype, key
        self.array: np.ndarray | None = None


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, source: str) -> None:
        super().__init__(file)
        self.source = source
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise UnsafePickleError(
                f"{self.source}: refused to load {module}.{name}: a weight file may only hold "
                "tensors, storages and dicts (nothing from it is executed)",
                file=self.source,
            )
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise UnsafePickleError(f"{self.source}: unknown persistent id {pid!r}", file=self.source)
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise RecordFormatError(f"{self.source}: storage {key} has no known element type", file=self.source)
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(storage_type.dtype, key)
        return storage


def read_pytorch(path: str | Path, *, top_level_key: str | None = None) -> dict[str, TensorData]:
    """The tensors of a ``torch.save`` file by dotted name, in file order.

    Args:
        path: a ``.pt`` / ``.pth`` / ``.bin`` file (zip or legacy layout).
        top_level_key: for checkpoints like ``{"model": state_dict, "epoch": 3}``,
            the key of the part to read. Nested dicts are flattened with dots;
            values that are not tensors are skipped.

    Raises:
        RecordFileNotFoundError: no such file.
        UnsafePickleError: the pickle names anything besides tensors and containers.
        RecordFormatError: not a PyTorch file, truncated or corrupt, or no tensors.
    """
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise RecordFileNotFoundError(f"PyTorch file {source} does not exist", file=source)
    try:
        if zipfile.is_zipfile(path):
            obj = _read_zip(path, source)
        else:
            obj = _read_legacy(path.read_bytes(), source)
    except (UnsafePickleError, RecordFormatError):
        raise
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, ValueError, TypeError,
            KeyError, IndexError, AttributeError, struct.error, OSError) as exc:
        raise RecordFormatError(f"{source}: not a readable PyTorch file: {exc}", file=source) from None
    if top_level_key is not None:
        if not isinstance(obj, Mapping) or top_level_key not in obj:
            keys = list(obj) if isinstance(obj, Mapping) else type(obj).__name__
            raise RecordFormatError(f"{source}: no top-level key {top_level_key!r} (found {keys})", file=source)
        obj = obj[top_level_key]
    tensors: dict[str, TensorData] = {}
    _flatten(obj, "", tensors, source)
    if not tensors:
        raise RecordFormatError(f"{source}: holds no tensors", file=source)
    return tensors


def _read_zip(path: Path, source: str) -> Any:
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
        if not pickles:
            raise RecordFormatError(f"{source}: a zip file without data.pkl is not a PyTorch file", file=source)
        prefix = pickles[0][: -len("data.pkl")]
        big_endian = f"{prefix}byteorder" in names and archive.read(f"{prefix}byteorder").strip() == b"big"
        unpickler = _RestrictedUnpickler(io.BytesIO(archive.read(pickles[0])), source)
        obj = unpickler.load()
        for key, storage in unpickler.storages.items():
            member = f"{prefix}data/{key}"
            if member not in names:
                raise RecordFormatError(f"{source}: storage {key} is missing ({member})", file=source)
            dtype = storage.dtype.newbyteorder(">") if big_endian else storage.dtype
            storage.array = np.frombuffer(archive.read(member), dtype=dtype)
    return obj


def _read_legacy(data: bytes, source: str) -> Any:
    stream = io.BytesIO(data)
    try:
        magic = _RestrictedUnpickler(stream, source).load() if data[:1] == b"\x80" else None
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError):
        magic = None
    if magic != _LEGACY_MAGIC:
        raise RecordFormatError(f"{source}: neither a zip nor a legacy PyTorch file", file=source)
    # protocol version and system info: plain ints, bools and dicts, still read restricted
    _RestrictedUnpickler(stream, source).load()
    sys_info = _RestrictedUnpickler(stream, source).load()
    little = not isinstance(sys_info, dict) or sys_info.get("little_endian", True)
    unpickler = _RestrictedUnpickler(stream, source)
    obj = unpickler.load()
    keys = _RestrictedUnpickler(stream, source).load()
    for key in keys:
        header = stream.read(8)
        if len(header) < 8:
            raise RecordFormatError(f"{source}: truncated before storage {key}", file=source)
        count = struct.unpack("<q", header)[0]
        storage = unpickler.storages.get(str(key))
        if storage is None:
            raise RecordFormatError(f"{source}: storage {key} is listed but never used", file=source)
        nbytes = count * storage.dtype.itemsize
        raw = stream.read(nbytes)
        if len(raw) < nbytes:
            raise RecordFormatError(
                f"{source}: truncated: storage {key} needs {nbytes} bytes, {len(raw)} left", file=source
            )
        dtype = storage.dtype if little else storage.dtype.newbyteorder(">")
        storage.array = np.frombuffer(raw, dtype=dtype)
    return obj


def _flatten(obj: Any, prefix: str, out: dict[str, TensorData], source: str) -> None:
    if isinstance(obj, _Tensor):
        out[prefix] = _materialize(obj, prefix, source)
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), out, source)


def _materialize(tensor: _Tensor, name: str, source: str) -> TensorData:
    storage = tensor.storage
    if storage.array is None:
        raise RecordFormatError(f"{source}: the bytes of {name} (storage {storage.key}) are missing", file=source)
    array = storage.array
    itemsize = array.dtype.itemsize
    if all(tensor.size):  # an empty tensor reads nothing
        last = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride))
        if last >= array.size:
            raise RecordFormatError(
                f"{source}: {name} reaches element {last} of storage {storage.key}, which has {array.size}",
                file=source,
            )
    view = np.lib.stride_tricks.as_strided(
        array[tensor.offset:],
        shape=tensor.size,
        strides=tuple(s * itemsize for s in tensor.stride),
        writeable=False,
    )
    # a copy: the tensor must not keep the whole storage (or the file bytes) alive
    return TensorData._wrap(np.array(view, dtype=array.dtype.newbyteorder("="), order="C"))
