"""Atomic file writes: a crash or an error never leaves a truncated file in place.

Everything ember saves (configs, records, checkpoints) goes through
:func:`atomic_write`: the bytes go to a temporary file in the target's
directory, are flushed to disk, and only then replace the target by a rename,
which the operating system performs as one step.

**Temporaries of killed writers.** A writer killed outright (``kill -9``, a power
loss) cannot remove its temporary. Each temporary is therefore named after its
target and its writer, ``.{target name}.{pid}-{host}.{random}.tmp``, and the next
:func:`atomic_write` to the same target (and a checkpointer when it starts, through
:func:`remove_stale_temporaries`) removes those whose writer is gone: the process
``pid`` no longer runs on this host (``host`` is a hash of the host name and, on
Linux, the PID namespace, since a pid means nothing elsewhere), or the file has not
been written to for :data:`STALE_AFTER` seconds (a writer on another host, a temporary
of an ember before these names, or a pid since reused). A live writer's temporary is
never removed: it writes to it, so it stays recent, and its pid runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

STALE_AFTER = 3600.0
"""Seconds without a write after which any writer's temporary counts as abandoned."""

_TEMPORARY = re.compile(
    r"\.(?P<target>.+?)\.(?:(?P<pid>\d+)-(?P<host>[0-9a-f]{8})\.)?[0-9a-f]{32}\.tmp\Z")


def _host_id() -> str:
    """Where a pid means this process table: the host, and the PID namespace on Linux."""
    place = socket.gethostname()
    with contextlib.suppress(OSError):
        place += f"/{os.stat('/proc/self/ns/pid').st_ino}"
    return hashlib.sha1(place.encode()).hexdigest()[:8]


_HOST = _host_id()


def atomic_write(path: str | os.PathLike, chunks: bytes | Iterable[bytes]) -> None:
    """Writes ``chunks`` (bytes, or an iterable of byte strings) to ``path`` atomically.

    If writing fails part way, ``path`` keeps its old content (or stays absent). Stale
    temporaries of earlier writes to ``path`` whose writer was killed are removed first.

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
    remove_stale_temporaries(path.parent, path.name)
    temp = path.with_name(f".{path.name}.{os.getpid()}-{_HOST}.{uuid.uuid4().hex}.tmp")
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


def remove_stale_temporaries(directory: str | os.PathLike, target: str | None = None
                             ) -> list[Path]:  # fmt: skip
    """Removes the temporaries :func:`atomic_write` left in ``directory`` whose writer is gone.

    Args:
        directory: where to look; a missing directory holds none.
        target: only the temporaries of this file name; ``None`` for those of every target.

    Returns:
        the temporaries removed. Files not named as ember names its temporaries, and those
        of live writers, are left alone.
    """
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for entry in entries:
        found = _TEMPORARY.match(entry.name)
        if found is None or (target is not None and found["target"] != target):
            continue
        if _in_use(found, entry):
            continue
        with contextlib.suppress(FileNotFoundError):  # another process removed it first
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _in_use(found: re.Match[str], entry: os.DirEntry[str]) -> bool:
    """Whether the temporary's writer may still be writing to it."""
    try:
        if not entry.is_file(follow_symlinks=False):
            return True  # not ours to remove
        modified = entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return True  # gone already
    if time.time() - modified > STALE_AFTER:
        return False
    if found["pid"] is None or found["host"] != _HOST:
        return True  # no pid to ask, or one of another host: only age tells
    return _running(int(found["pid"]))


def _running(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":
        # Another thread of this process; on Windows, os.kill would terminate the process
        # rather than ask about it, so only age tells there.
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # it exists (another user's), or the pid cannot be asked about
    return True
