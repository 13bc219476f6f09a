"""safetensors files through the ``safetensors`` library.

The format is an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and byte range (plus an optional string-to-string
``__metadata__``), then the raw little-endian bytes. The library's own
``serialize`` encodes (ember maps dtypes, bfloat16 and float8 included, which
the library's NumPy helpers lack, and writes the file atomically). Reading is
ember's own: the header is small JSON, and checking it here gives errors that
name the tensor and the value, within bounded memory, with one copy per tensor.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import safetensors

from ember.atomic import atomic_write
from ember.backend.errors import RecordFileNotFoundError, RecordFormatError
from ember.record.limits import describe
from ember.record.weight_limits import (
    Origin,
    Source,
    WeightLimits,
    arena,
    count,
    dims,
    fail,
    num_bytes,
    read_at,
    read_into,
)
from ember.tensor import DType, TensorData
from ember.tensor.data import numpy_dtype

_CODES = {
    DType.F64: "F64", DType.F32: "F32", DType.F16: "F16", DType.BF16: "BF16",
    DType.I64: "I64", DType.I32: "I32", DType.I16: "I16", DType.I8: "I8",
    DType.U64: "U64", DType.U32: "U32", DType.U16: "U16", DType.U8: "U8", DType.BOOL: "BOOL",
    DType.F8E4M3FN: "F8_E4M3", DType.F8E4M3FNUZ: "F8_E4M3FNUZ", DType.F8E5M2: "F8_E5M2",
    DType.F8E5M2FNUZ: "F8_E5M2FNUZ", DType.F8E8M0FNU: "F8_E8M0",
}  # fmt: skip
_DTYPES = {code: dtype for dtype, code in _CODES.items()}
_SPEC_NAMES = {
    DType.F64: "float64", DType.F32: "float32", DType.F16: "float16", DType.BF16: "bfloat16",
    DType.I64: "int64", DType.I32: "int32", DType.I16: "int16", DType.I8: "int8",
    DType.U64: "uint64", DType.U32: "uint32", DType.U16: "uint16", DType.U8: "uint8",
    DType.BOOL: "bool", DType.F8E4M3FN: "float8_e4m3fn", DType.F8E4M3FNUZ: "float8_e4m3fnuz",
    DType.F8E5M2: "float8_e5m2", DType.F8E5M2FNUZ: "float8_e5m2fnuz",
    DType.F8E8M0FNU: "float8_e8m0fnu",
}  # fmt: skip


def write_safetensors(
    path: str | Path, tensors: Mapping[str, TensorData], metadata: Mapping[str, str] | None = None
) -> None:
    """Writes ``tensors`` (and string ``metadata``) to ``path`` atomically."""
    path = Path(path)
    if not path.parent.is_dir():
        raise RecordFileNotFoundError(f"cannot save {path}: directory {path.parent} does not exist", file=str(path))
    for name, data in tensors.items():
        if data.dtype not in _SPEC_NAMES:
            # safetensors packs 4-bit values two to a byte (F4) and has no 4 / 2-bit ints.
            raise RecordFormatError(f"cannot save {path}: tensor {name!r} has dtype {data.dtype}, "
                                    "which safetensors cannot store; cast it first",
                                    path=name, file=str(path))
    arrays = {name: data.to_numpy() for name, data in tensors.items()}  # C-contiguous already
    specs = {
        name: safetensors.TensorSpec(
            dtype=_SPEC_NAMES[tensors[name].dtype], shape=list(array.shape),
            data_ptr=array.ctypes.data, data_len=array.nbytes,
        )
        for name, array in arrays.items()
    }
    # `arrays` keeps every buffer alive while the library reads it through its pointer
    content = safetensors.serialize(specs, metadata=dict(metadata) if metadata else None)
    atomic_write(path, content)


def read_safetensors(
    path: str | Path, *, limits: WeightLimits | None = None
) -> tuple[dict[str, TensorData], dict[str, str]]:
    """The tensors of a safetensors file in file order, and its metadata (``{}`` if none).

    The header is checked as the safetensors library checks it, before
    anything is allocated: its length fits the file (and
    ``limits.header_bytes``), it is a JSON object with no key twice, each
    tensor has a known dtype, a shape of non-negative integers and
    ``data_offsets`` whose span is exactly ``prod(shape) * itemsize`` bytes, the
    spans tile the data section from its first byte to its last with no gap or
    overlap, and ``__metadata__`` maps strings to strings. Each tensor is then
    copied once out of the file into one buffer that all tensors share (no mapping
    of the file, so overwriting or truncating the file later changes nothing; the
    library's default ``mmap`` loader differs on both).

    Raises:
        RecordFileNotFoundError: no such file.
        RecordFormatError: a truncated or corrupt file, or a dtype ember does not
            know; the message names the file, the tensor and the offending value.
    """
    path = Path(path)
    source = str(path)
    limits = limits or WeightLimits()
    if not path.is_file():
        raise RecordFileNotFoundError(f"safetensors file {source} does not exist", file=source)
    source = Origin(source, "not a valid safetensors file")
    try:
        with open(path, "rb") as file:
            file_size = os.fstat(file.fileno()).st_size
            if file_size < 8:
                raise fail(source, None, f"{file_size} bytes, too short for the header length")
            (header_size,) = struct.unpack("<Q", read_at(file, 0, 8, source, None).tobytes())
            if header_size > file_size - 8:
                raise fail(source, None, f"the header length {header_size} exceeds the "
                                         f"{file_size - 8} bytes after it")
            if header_size > limits.header_bytes:
                raise fail(source, None, f"the header length {header_size} exceeds "
                                         f"WeightLimits.header_bytes ({limits.header_bytes})")
            header = _header(read_at(file, 8, header_size, source, None).tobytes(), source)
            metadata = _metadata(header.pop("__metadata__", None), source)
            entries = _entries(header, file_size - 8 - header_size, source)
            start = 8 + header_size
            buffers = arena([nbytes for *_, nbytes in entries])
            tensors = {}
            for (name, dtype, shape, begin, _), out in zip(entries, buffers):
                raw = read_into(file, start + begin, out, source, name)
                tensors[name] = _tensor(raw, dtype, shape)
    except OSError as exc:
        raise fail(source, None, f"cannot be read: {exc}") from None
    return tensors, metadata


def _header(raw: bytes, source: Source) -> dict:
    if not raw.startswith(b"{"):
        raise fail(source, None, f"the header {describe(raw[:20])} is not a JSON object")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise fail(source, None, f"the header names {describe(exc.args[0])} twice") from None
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8 are ValueErrors
        raise fail(source, None, f"the header is not JSON: {describe(str(exc))}") from None
    if not isinstance(header, dict):
        raise fail(source, None, f"the header is {describe(header)}, not a JSON object")
    return header


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return found


def _metadata(value: object, source: Source) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(type(v) is str for v in value.values()):
        raise fail(source, "__metadata__", f"is {describe(value)}, not a map of strings to strings")
    return value


_FIELDS = {"dtype", "shape", "data_offsets"}


def _entries(header: dict, data_size: int, source: Source
             ) -> list[tuple[str, np.dtype, tuple, int, int]]:  # fmt: skip
    """``(name, dtype, shape, first byte, byte count)`` per tensor in file order, all checked."""
    entries = []
    for name, info in header.items():
        # other fields are ignored, as the library ignores them
        if not isinstance(info, dict) or not info.keys() >= _FIELDS:
            raise fail(source, name, f"is {describe(info)}, not {{dtype, shape, data_offsets}}")
        dtype = _DTYPES.get(info["dtype"]) if type(info["dtype"]) is str else None
        if dtype is None:
            raise fail(source, name, f"dtype {describe(info['dtype'])} is not one ember reads "
                                     f"({', '.join(_CODES.values())})")
        np_dtype = numpy_dtype(dtype)
        shape = dims(info["shape"], "shape", source, name)
        offsets = info["data_offsets"]
        if not isinstance(offsets, list) or len(offsets) != 2:
            raise fail(source, name, f"data_offsets is {describe(offsets)}, not [begin, end]")
        begin = count(offsets[0], "data_offsets[0]", source, name, data_size)
        end = count(offsets[1], "data_offsets[1]", source, name, data_size)
        nbytes = num_bytes(shape, np_dtype.itemsize, source, name)
        if end - begin != nbytes:
            raise fail(source, name, f"data_offsets {offsets} span {end - begin} bytes; shape "
                                     f"{list(shape)} of {info['dtype']} needs {nbytes}")
        entries.append((name, np_dtype, shape, begin, nbytes))
    entries.sort(key=lambda e: (e[3], e[3] + e[4]))
    position = 0
    for name, _, _, begin, nbytes in entries:
        if begin != position:
            what = ("overlaps the tensor before it" if begin < position
                    else f"leaves bytes {position} to {begin} unused")  # fmt: skip
            raise fail(source, name, f"data_offsets begin at {begin}: the tensor {what}")
        position = begin + nbytes
    if position != data_size:
        raise fail(source, None, f"the tensors cover {position} of the {data_size} data bytes")
    return entries


def _tensor(raw: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> TensorData:
    if dtype == np.bool_ and raw.size and raw.max() > 1:
        np.minimum(raw, 1, out=raw)  # a bool is one byte of 0 or 1, whatever the file held
    array = raw.view(dtype)
    if sys.byteorder == "big" and dtype.itemsize > 1:
        array.byteswap(inplace=True)  # the file is little-endian
    return TensorData._wrap(array.reshape(shape))
