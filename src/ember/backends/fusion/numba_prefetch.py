"""Whether element-wise kernels prefetch on this machine: timed once, remembered on disk.

The kernel of an element-wise block of one group walks its arrays in one loop, of one of
two shapes (``numba_source``, "Loop shape"): a plain loop that LLVM vectorizes, or runs
of 16 elements that each first ask for the cache lines their arrays reach 4 KiB ahead.
Neither wins everywhere: on a 2-vCPU AVX-512 Xeon the runs took 0.7-0.9x the plain
loop's time (the hardware's prefetch fell behind), on an AMD EPYC (Zen 4) about 1.9x (an
add's run of 16 stays scalar there, and the hardware's prefetch keeps up). So the
runtime asks :func:`prefetching`, which times both on an add of two arrays of
:data:`PROBE_ELEMENTS` float32 (96 MiB in all, past the caches of those machines) at
one thread, :data:`ROUNDS` runs each, alternating, and takes the runs when their median
is at most :data:`PREFER` times the plain loop's.

The choice is written to ``prefetch-<machine>.json`` in the kernel cache folder (the
machine kind as ``autotune`` names it), which later processes read instead of timing.
Like a tuning, one probe on a busy host can mislead: a later process probes again until
two probes in a row agree or ``autotune.SETTLED_AFTER`` were made, and a probe made while
other processes' threads ran (``autotune.others_running``) is used by its own process
only. The file may be hostile: it is read only as a regular file of at most 1 MiB of JSON
whose fields have exactly the expected types, else ignored (and probed anew).

``EMBER_FUSION_PREFETCH=1`` or ``0`` chooses without timing (runs, or the plain loop);
with ``EMBER_FUSION_AUTOTUNE=0`` the plain loop runs untimed. ``EMBER_FUSION_DEBUG=1``
logs each probe and each ignored file.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ember.atomic import atomic_write
from ember.backend.environment import switch
from ember.backend.errors import ConfigError
from ember.backends.fusion import autotune, ir
from ember.tensor.dtype import DType

__all__ = ["PREFER", "PROBE_ELEMENTS", "ROUNDS", "forget", "prefetching", "requested"]  # fmt: skip

FORMAT = "ember-fusion-prefetch"
VERSION = 1
PROBE_ELEMENTS = 1 << 23
"""Elements of each of the probe's three float32 arrays."""
ROUNDS = 5
"""Timed runs of each loop shape a probe makes (after one untimed run each)."""
PREFER = 0.9
"""The runs are chosen when their median time is at most this fraction of the plain
loop's: a tie keeps the plain loop, the simpler code."""

_decided: dict[Path, bool] = {}
_lock = threading.Lock()


def requested() -> bool | None:
    """``EMBER_FUSION_PREFETCH``: True (``1``), False (``0``), None when unset or blank.

    Raises:
        ConfigError: any other value, naming the variable and the value.
    """
    text = os.environ.get("EMBER_FUSION_PREFETCH", "").strip()
    if not text:
        return None
    if text not in ("0", "1"):
        raise ConfigError(f"EMBER_FUSION_PREFETCH={text!r}: expected 1 (kernels prefetch in "
                          "runs), 0 (a plain loop) or nothing (timed on this machine)")  # fmt: skip
    return text == "1"


def prefetching(folder: Path, load: Callable[[str], Any]) -> bool:
    """Whether one-loop element-wise kernels should run in runs that prefetch here: the
    variable's choice, else this process's earlier answer for ``folder``, else the
    settled choice of ``folder``'s file, else a probe's. ``load(source)`` returns the
    module of generated kernel source (the runtime's loader)."""
    forced = requested()
    if forced is not None:
        return forced
    if not autotune.enabled():
        return False
    with _lock:
        found = _decided.get(folder)
        if found is None:
            found = _decided[folder] = _decide(folder, load)
        return found


def forget() -> None:
    """Drops this process's answers, so the next :func:`prefetching` reads (or probes)
    again (a test hook)."""
    with _lock:
        _decided.clear()


def _decide(folder: Path, load: Callable[[str], Any]) -> bool:
    path = folder / f"prefetch-{autotune.machine()}.json"
    earlier = _read(path)
    settled = earlier is not None and (earlier["streak"] >= 2
                                       or earlier["probes"] >= autotune.SETTLED_AFTER)  # fmt: skip
    if settled:
        return earlier["prefetch"]
    busy = autotune.others_running()
    try:
        plain, runs = _probe(load)
    except Exception as error:  # a probe must never fail the kernel that asked
        _log(f"probe failed ({type(error).__name__}: {error}): the plain loop, not written")
        return False
    busy = max(busy, autotune.others_running())
    chosen = runs <= PREFER * plain
    if earlier is None:
        probes, streak = 1, 1
    else:
        probes = earlier["probes"] + 1
        streak = earlier["streak"] + 1 if earlier["prefetch"] == chosen else 1
    unfit = busy >= autotune.BUSY_OTHERS
    _log(f"plain loop {plain * 1e3:.2f} ms, runs that prefetch {runs * 1e3:.2f} ms: "
         f"{'runs' if chosen else 'plain'} (probe {probes}, {streak} agreeing"
         f"{f'; {busy} other threads running: not written' if unfit else ''})")  # fmt: skip
    if not unfit:
        document = {"format": FORMAT, "version": VERSION, "machine": autotune.machine(),
                    "prefetch": chosen, "probes": probes, "streak": streak}  # fmt: skip
        try:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(document).encode())
        except OSError as error:  # a read-only cache: the choice holds for this process
            _log(f"could not write {path}: {error}")
    return chosen


def _probe(load: Callable[[str], Any]) -> tuple[float, float]:
    """Median seconds of an add of two :data:`PROBE_ELEMENTS` arrays at one thread: the
    plain loop's, then the runs'."""
    from ember.backends.fusion.numba_source import generate

    shape = (PROBE_ELEMENTS,)
    block = ir.Block(shape, (ir.Input(shape, DType.F32), ir.Input(shape, DType.F32)),
                     (ir.Instr("add", (0, 1), (), shape, DType.F32),), (2,))  # fmt: skip
    # Each module's loop itself (``span``): its claiming wrapper would be one more compile.
    loops = [load(generate(block, prefetch=flag)).span for flag in (False, True)]
    x = np.full(shape, 1.5, np.float32)  # filled: every page mapped before the timing
    y = np.full(shape, 0.25, np.float32)
    out = np.zeros(shape, np.float32)
    size = np.int64(PROBE_ELEMENTS)
    err = np.zeros(2, np.int64)

    def once(loop) -> float:
        began = time.perf_counter()
        loop(x, y, out, size, size, err, np.int64(0), np.int64(1))  # the one part of one
        return time.perf_counter() - began

    samples: list[list[float]] = [[], []]
    for loop in loops:
        once(loop)
    for _ in range(ROUNDS):
        for side, loop in enumerate(loops):
            samples[side].append(once(loop))
    if not (out[0] == out[-1] == np.float32(1.75)):
        raise RuntimeError("the probe's add computed a wrong sum")
    return statistics.median(samples[0]), statistics.median(samples[1])


def _read(path: Path) -> dict | None:
    """The file's fields when it is a valid choice of this machine kind, else None."""
    try:
        data = autotune.read_bounded(path)
    except OSError as error:
        if not isinstance(error, FileNotFoundError):
            _log(f"ignoring {path}: {error}")
        return None
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:
        _log(f"ignoring {path}: not JSON ({type(error).__name__})")
        return None
    wanted = {"format": FORMAT, "version": VERSION, "machine": autotune.machine()}
    fields = {"format", "version", "machine", "prefetch", "probes", "streak"}
    valid = (type(document) is dict and set(document) == fields
             and all(document[k] == v and type(document[k]) is type(v) for k, v in wanted.items())
             and type(document["prefetch"]) is bool
             and type(document["probes"]) is int and type(document["streak"]) is int
             and 1 <= document["streak"] <= document["probes"] <= autotune.MAX_TUNINGS)  # fmt: skip
    if not valid:
        _log(f"ignoring {path}: not a version {VERSION} prefetch choice of this machine")
        return None
    return document


def _log(message: str) -> None:
    if switch("EMBER_FUSION_DEBUG", False):
        print(f"[ember.fusion] prefetch: {message}", file=sys.stderr)
