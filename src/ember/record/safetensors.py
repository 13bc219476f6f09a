"""safetensors files through the ``safetensors`` library.

The format is an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and byte range (plus an optional string-to-string
``__metadata__``), then the raw little-endian bytes. The library's own
``serialize`` / ``deserialize`` do the encoding and the validation; ember maps
dtypes (bfloat16 included, which the library's NumPy helpers lack) and writes
the file atomically.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import safetensors

from ember.atomic import atomic_write
from ember.backend.errors import RecordFileNotFoundError, RecordFormatError
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


def read_safetensors(path: str | Path) -> tuple[dict[str, TensorData], dict[str, str]]:
    """The tensors of a safetensors file in file order, and its metadata (``{}`` if none).

    Raises:
        RecordFileNotFoundError: no such file.
        RecordFormatError: a truncated or corrupt file, or a dtype ember does not know.
    """
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise RecordFileNotFoundError(f"safetensors file {source} does not exist", file=source)
    content = path.read_bytes()
    try:
        entries = safetensors.deserialize(content)
        (size,) = struct.unpack("<Q", content[:8])
        header = json.loads(content[8 : 8 + size])
    except (safetensors.SafetensorError, struct.error, ValueError) as exc:
        raise RecordFormatError(f"{source}: not a valid safetensors file: {exc}", file=source) from None
    tensors: dict[str, TensorData] = {}
    for name, entry in sorted(entries, key=lambda e: header[e[0]]["data_offsets"][0]):
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise RecordFormatError(f"{source}: tensor {name!r} has dtype {entry['dtype']}, which ember lacks",
                                    path=name, file=source)
        array = np.frombuffer(entry["data"], dtype=numpy_dtype(dtype).newbyteorder("<"))
        tensors[name] = TensorData._wrap(array.astype(numpy_dtype(dtype), copy=False).reshape(entry["shape"]))
    return tensors, dict(header.get("__metadata__") or {})
