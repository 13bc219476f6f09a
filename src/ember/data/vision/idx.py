"""The IDX file format of MNIST: a small header, then one big-endian array.

An IDX file starts with two zero bytes, a type code (``0x08`` for unsigned bytes, ...)
and the number of dims; then each dim as a big-endian 32-bit count; then the values,
row-major. Files may be gzip-compressed; the reader recognizes gzip by its magic bytes,
whatever the file's name.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from ember.atomic import atomic_write
from ember.backend.errors import ArgumentError
from ember.data.dataset.base import DatasetError

_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dtype: code for code, dtype in _TYPES.items()}
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array stored in the IDX file at ``path`` (gzipped or not).

    Raises :class:`~ember.data.dataset.base.DatasetError` naming the file when it is not
    valid gzip, not IDX (a wrong magic number) or shorter than its header says.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny-idx1-ubyte"
        >>> _ = path.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
        >>> read_idx(path)
        array([7, 8, 9], dtype=uint8)
    """
    path = Path(path)
    return parse_idx(path.read_bytes(), str(path))


def parse_idx(raw: bytes, file: str) -> np.ndarray:
    """The array held by the bytes of an IDX file (gzipped or not) read from ``file``."""
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:
            raise DatasetError(f"{file}: not a valid gzip file ({error})", file=file) from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        magic = raw[:4].hex() or "empty"
        raise DatasetError(
            f"{file}: not an IDX file: magic number 0x{magic}, expected 0x0000 followed by a "
            f"type code ({', '.join(f'0x{code:02x}' for code in _TYPES)}) and the number of dims",
            file=file,
        )
    dtype, rank = _TYPES[raw[2]], raw[3]
    header = 4 + 4 * rank
    if len(raw) < header:
        raise DatasetError(
            f"{file}: truncated IDX header: {rank} dims need {header} bytes, "
            f"the file has {len(raw)}",
            file=file,
        )
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=rank, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        kind = "truncated" if len(raw) < expected else "too long"
        raise DatasetError(
            f"{file}: {kind} IDX file: a {dtype.name} array of shape "
            f"[{', '.join(map(str, shape))}] takes {expected} bytes, the file has {len(raw)}",
            file=file,
        )
    values = np.frombuffer(raw, dtype=dtype, offset=header)
    return values.astype(dtype.newbyteorder("="), copy=False).reshape(shape)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Writes ``array`` as an IDX file at ``path``, gzip-compressed when the name ends in ``.gz``.

    The array's dtype must be one IDX stores (uint8, int8, int16, int32, float32,
    float64); the file is written atomically.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny-idx2-ubyte.gz"
        >>> write_idx(path, np.arange(6, dtype=np.uint8).reshape(2, 3))
        >>> read_idx(path).tolist()
        [[0, 1, 2], [3, 4, 5]]
    """
    array = np.asarray(array)
    big_endian = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    code = _CODES.get(np.dtype(big_endian))
    if code is None or array.ndim > 255:
        raise ArgumentError(
            f"write_idx: IDX stores uint8, int8, int16, int32, float32 or float64 arrays of "
            f"at most 255 dims, got {array.dtype} with {array.ndim} dims"
        )
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    raw = header + np.ascontiguousarray(array, dtype=big_endian).tobytes()
    path = Path(path)
    atomic_write(path, gzip.compress(raw, mtime=0) if path.suffix == ".gz" else raw)
