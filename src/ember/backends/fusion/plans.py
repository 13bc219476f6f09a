"""The plan store: explored plans on disk, so a new process starts warm.

Kernels already persist through numba's cache (``numba_runtime``); this keeps the other
half of planning, the explorer's segmentation of a stream and the executor's block
templates, in the same cache folder (``EMBER_FUSION_CACHE``) under
``plans/v<FORMAT>-<version>/<shard>/<digest>.json``.

**One small file per plan key.** ``<digest>`` is a SHA-256 of the key's canonical JSON
(:func:`canonical`); the file holds that canonical key in full beside the plan
(:func:`~ember.backends.fusion.explorer.plan_to_state`) and the templates
(:meth:`~ember.backends.fusion.elementwise.Template.to_state`), all plain JSON, never
pickle. Each file is written whole by :func:`ember.atomic.atomic_write`, so processes
writing at once never see each other's halves: the last rename wins, and both wrote a
valid entry. No file is ever read, changed and written back, so there is nothing to merge
or lock.

**Lazily**, on a plan-cache miss in memory, before exploring: the executor asks
:func:`load` for the key, builds the entry's plan with the live fusers and adopts it only
when the fusers make exactly the entry's templates; then it writes a key's entry once per
process (:func:`save`) after exploring it.

**Hostile files.** Every file is treated as untrusted: a file that is not a regular file,
over :data:`MAX_FILE_BYTES`, not UTF-8 JSON, of another format or version, for another key
(a hash collision), or whose plan or templates do not validate, is ignored (the stream is
explored anew, and its entry rewritten), with a line on stderr under
``EMBER_FUSION_DEBUG=1``. Nothing read is ever executed, and a template read from disk is
never bound: the executor binds the fusers' own, after checking the file's equal them.

**Bounds.** At most :data:`MAX_PER_SHARD` entries per shard (256 shards), the oldest
removed first. Folders of other versions are never read (delete them freely).

``EMBER_FUSION_PLANS=0`` turns the store off (nothing read or written).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ember.atomic import atomic_write
from ember.backend.environment import switch
from ember.backends.fusion.cache_folder import cache_dir
from ember.backends.fusion.elementwise import Template
from ember.backends.fusion.explorer import MAX_PLANS, Segment, plan_from_state, plan_to_state
from ember.backends.fusion.ir import StateError
from ember.tensor.dtype import DType

FORMAT = 1
"""The layout of an entry; bump it when the fields change."""

MAX_FILE_BYTES = 1 << 20
"""Larger files are never read (a 256-record stream's entry is tens of KB)."""

MAX_PER_SHARD = 32
"""Entries kept per shard (256 shards): the oldest go first."""

# The sources whose change may change a plan or a template: their digest is the version.
_SOURCES = (
    ("backend", "ops.py"),
    ("backends", "fusion", "ir.py"),
    ("backends", "fusion", "fuser.py"),
    ("backends", "fusion", "elementwise.py"),
    ("backends", "fusion", "attention.py"),
    ("backends", "fusion", "attention_grad.py"),
    ("backends", "fusion", "explorer.py"),
    ("backends", "fusion", "executor.py"),
    ("backends", "fusion", "stream.py"),
    ("backends", "fusion", "plans.py"),
)

_lock = threading.Lock()
_known: set[str] = set()  # canonical keys whose entry this process wrote or adopted
_counts = {"loaded": 0, "ignored": 0, "written": 0}


@dataclass(frozen=True)
class Stored:
    """A validated entry: the plan, and per segment ``(start, length, template or None)``,
    the form the executor remembers."""

    plan: tuple[Segment, ...]
    templates: tuple[tuple[int, int, Template | None], ...]


def enabled() -> bool:
    """Whether the store is on: ``EMBER_FUSION_PLANS`` is not ``0``, and the sources that
    version entries can be read (an install without them has no store)."""
    return switch("EMBER_FUSION_PLANS", True) and version() is not None


def stats() -> dict[str, int]:
    """Entries ``loaded`` (adopted), ``ignored`` (unusable files) and ``written`` by this
    process."""
    with _lock:
        return dict(_counts)


@functools.cache
def version() -> str | None:
    """A digest of the sources that make plans (another version's entries are never read),
    or None when they cannot be read."""
    root = Path(__file__).resolve().parents[2]  # the ember package
    digest = hashlib.sha256()
    try:
        for parts in _SOURCES:
            digest.update(root.joinpath(*parts).read_bytes())
    except OSError:
        return None
    return f"v{FORMAT}-{digest.hexdigest()[:16]}"


def folder() -> Path:
    """This version's folder in the fusion cache folder."""
    return cache_dir() / "plans" / version()


def canonical(key: tuple) -> str | None:
    """The key as canonical JSON (tuples as lists, dtypes as ``{"dtype": name}``), or None
    when it holds something else (such a key is not stored)."""
    try:
        return json.dumps(key, separators=(",", ":"), default=_dtype, allow_nan=False)
    except (TypeError, ValueError):
        return None


def _dtype(value: object) -> dict:
    if type(value) is DType:
        return {"dtype": value.value}
    raise TypeError(type(value).__name__)


def _path(text: str) -> Path:
    digest = hashlib.sha256(text.encode()).hexdigest()
    return folder() / digest[:2] / f"{digest[:32]}.json"


def load(key: tuple, records: int, fusers: int) -> Stored | None:
    """The validated entry for ``key`` (a stream of ``records`` records, an explorer of
    ``fusers`` fusers), or None when there is none or it is unusable (then ignored)."""
    if not enabled():
        return None
    text = canonical(key)
    if text is None:
        return None
    path = _path(text)
    try:
        data = _read(path)
        if data is None:
            return None
        return _entry(data, text, records, fusers)
    except StateError as error:
        ignore(path, str(error))
        return None


def adopted(key: tuple) -> None:
    """Notes that ``key``'s entry was loaded and verified (so it is not rewritten)."""
    text = canonical(key)
    with _lock:
        _counts["loaded"] += 1
        if text is not None:
            _remember(text)


def ignore(where: Path | tuple, why: str) -> None:
    """Counts an unusable entry (a path, or the key whose entry it was) and says why under
    ``EMBER_FUSION_DEBUG=1``; its key will be written anew."""
    if isinstance(where, tuple):
        text = canonical(where)
        with _lock:
            _known.discard(text)
        where = _path(text) if text is not None else "?"
    with _lock:
        _counts["ignored"] += 1
    if switch("EMBER_FUSION_DEBUG", False):
        print(f"[ember.fusion] plan file {where} ignored: {why}", file=sys.stderr)


def save(key: tuple, plan: tuple[Segment, ...] | None, templates: tuple) -> None:
    """Writes ``key``'s entry unless this process already wrote or adopted it. Failures
    (a read-only or full disk) only cost the next process an exploration."""
    if plan is None or not enabled():
        return
    text = canonical(key)
    if text is None:
        return
    with _lock:
        if text in _known:
            return
    entry = {
        "format": FORMAT,
        "version": version(),
        "key": json.loads(text),
        "plan": plan_to_state(plan),
        "templates": [None if t is None else t.to_state() for _, _, t in templates],
    }
    data = json.dumps(entry, separators=(",", ":")).encode()
    if len(data) > MAX_FILE_BYTES:
        return
    path = _path(text)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _make_room(path.parent)
        atomic_write(path, data)
    except OSError as error:
        ignore(path, f"not written: {error}")
        return
    with _lock:
        _counts["written"] += 1
        _remember(text)


def forget(on_disk: bool = True) -> None:
    """Forgets which entries this process wrote and, with ``on_disk`` (and the store on),
    removes this version's entries from the cache folder."""
    with _lock:
        _known.clear()
    if not on_disk or not enabled():
        return
    root = folder()
    with contextlib.suppress(OSError):
        for shard in root.iterdir():
            for entry in shard.glob("*.json"):
                with contextlib.suppress(OSError):
                    entry.unlink()


def _remember(text: str) -> None:
    if len(_known) >= MAX_PLANS:
        _known.clear()
    _known.add(text)


def _make_room(shard: Path) -> None:
    """Removes the oldest entries of a full shard (another process may remove them too)."""
    entries = []
    for entry in os.scandir(shard):
        if entry.name.endswith(".json"):
            with contextlib.suppress(OSError):
                entries.append((entry.stat(follow_symlinks=False).st_mtime, entry.path))
    entries.sort()
    for _, path in entries[: max(0, len(entries) - MAX_PER_SHARD + 1)]:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _read(path: Path) -> object | None:
    """The JSON of the file at ``path`` (None when there is none), read without following
    a link or waiting on a pipe, and never more than :data:`MAX_FILE_BYTES`."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as error:  # a link (ELOOP), no permission, ...
        raise StateError(f"cannot open it: {error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateError("not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise StateError(f"{info.st_size} bytes, over {MAX_FILE_BYTES}")
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        raw = b"".join(chunks)
    except OSError as error:
        raise StateError(f"cannot read it: {error}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise StateError(f"over {MAX_FILE_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise StateError(f"not JSON: {type(error).__name__}") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is no plan value")


def _entry(data: object, text: str, records: int, fusers: int) -> Stored:
    if type(data) is not dict or set(data) != {"format", "version", "key", "plan", "templates"}:
        raise StateError("an entry is a dict of format, version, key, plan and templates")
    if data["format"] != FORMAT or type(data["format"]) is not int:
        raise StateError(f"format {data['format']!r}, expected {FORMAT}")
    if data["version"] != version():
        raise StateError(f"version {data['version']!r}, expected {version()}")
    try:
        stored_key = json.dumps(data["key"], separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        stored_key = None
    if stored_key != text:
        raise StateError("it holds another key (a hash collision)")
    plan = plan_from_state(data["plan"], records, fusers)
    raw = data["templates"]
    if type(raw) is not list or len(raw) != len(plan):
        raise StateError("templates are a list of one per segment")
    templates = []
    for segment, state in zip(plan, raw):
        if segment.fuser is None:
            if state is not None:
                raise StateError(f"unfused segment at {segment.start} has a template")
            templates.append((segment.start, 1, None))
            continue
        template = Template.from_state(state)
        if len(template.body) != segment.length:
            raise StateError(f"the template at {segment.start} is not {segment.length} records")
        templates.append((segment.start, segment.length, template))
    return Stored(plan, tuple(templates))
