"""Atomic file writes: a crash or an error never leaves a truncated file in place.

Everything ember saves (configs, records, checkpoints) goes through
:func:`atomic_write`: the bytes go to a temporary file in the target's
directory, are flushed to disk, and only then replace the target by a rename,
which the operating system performs as one step.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable
from pathlib import Path


def atomic_write(path: str | os.PathLike, chunks: bytes | Iterable[bytes]) -> None:
    """Writes ``chunks`` (bytes, or an iterable of byte strings) to ``path`` atomically.

    If writing fails part way, ``path`` keeps its old content (or stays absent).

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "x.bin"
        >>> atomic_write(path, [b"ab", b"cd"])
        >>> path.read_bytes()
        b'abcd'
    """
    path = Path(path)
    if isinstance(chunks, bytes | bytearray | memoryview):
        chunks = (chunks,)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    # 0o666 filtered by the umask: the same permissions a plain open() would give.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            for chunk in chunks:
                file.write(chunk)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
