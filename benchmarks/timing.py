"""Timing helpers shared by the benchmarks: medians of repeated runs, printed side by side.

Every table a benchmark prints with :func:`print_table` is also appended, as one JSON line
``{"title": ..., "header": [...], "rows": [[...], ...]}``, to the file named by the
environment variable ``EMBER_BENCH_RECORD`` when it is set: ``ember bench`` reads the
tables from there instead of parsing the printed text.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable


def pin_threads(threads: int, alternating: bool = False) -> None:
    """Fixes the thread count of NumPy's BLAS, torch and fused kernels before they start;
    call first. ``alternating`` (sides timed call by call, :func:`interleaved_seconds`)
    also stops OpenBLAS's threads spinning about 0.1 s after each product (NdArray's), on
    a core the next side's threads need."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "EMBER_FUSION_THREADS"):  # fmt: skip
        os.environ.setdefault(var, str(threads))
    if alternating:
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")


def warm_up(fns: list[Callable[[], object]]) -> None:
    """Calls each of ``fns`` once (caches, lazy initialisation, page faults of fresh
    buffers, compiles); then, while fusion's compiler process still compiles parallel
    launchers those calls asked for (numba's threads, its default), waits for them and
    calls each again: the kernels ran on ember's workers until then, and the launches timed
    should be those that stay."""
    for fn in fns:
        fn()
    for _ in range(3):  # a call after a wait may meet kernels it had not launched before
        parallel = sys.modules.get("ember.backends.fusion.numba_parallel")
        if parallel is None or not parallel.wait():
            return
        for fn in fns:
            fn()


def median_seconds(fn: Callable[[], object], repeat: int = 7, min_time: float = 0.05) -> float:
    """Median seconds per call of ``fn``; each sample loops until it lasts ``min_time``."""
    warm_up([fn])
    loops = 1
    while True:
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        if time.perf_counter() - start >= min_time or loops >= 1 << 20:
            break
        loops *= 2
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - start) / loops)
    return statistics.median(samples)


def median_of_runs(fn: Callable[[], object], repeat: int, warm_up: bool = False) -> float:
    """Median seconds of ``repeat`` single calls of ``fn`` (for calls long enough to time
    one at a time, such as saving or loading a file); ``warm_up`` makes one untimed call
    first."""
    if warm_up:
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


LEAD_IN_SECONDS = 0.01
"""The least time of a side's own untimed calls before each of its timed calls (see
:func:`interleaved_seconds`)."""


def interleaved_seconds(fns: dict[str, Callable[[], object]], rounds: int = 15,
                        lead_in: int = 1,
                        lead_in_seconds: float = LEAD_IN_SECONDS) -> dict[str, tuple[float, float]]:  # fmt: skip
    """``{name: (median wall seconds, median CPU seconds of the calling thread)}`` per call.

    Each function is warmed up (:func:`warm_up`), then the calls alternate, one of each per round in
    an order shuffled every round (seeded: the same orders in every run), so a slow minute
    on a shared host lands on every side alike instead of on whichever ran then, and no
    side always comes after the same one (an order that only rotates keeps each side
    behind one other). The thread's CPU time leaves out the time the host gave to others;
    it counts only the calling thread, so it measures one-thread work (at more threads,
    read the wall time). Pin threads with ``alternating`` first.

    ``lead_in`` untimed calls of a side come before each of its timed calls (default 1),
    and more until they have lasted ``lead_in_seconds``, so that each side is timed as it
    runs alone, after itself: at two threads, PyTorch's OpenMP threads spin for some
    milliseconds after its call (about 9 ms of CPU time after a convolution, 4-8 ms after
    a softmax of [4096, 1024], measured) on the core the next side's second thread needs,
    which one lead-in call of a millisecond did not outlast (fusion's softmax at two
    threads: 2.24 ms timed after PyTorch's call and one lead-in, 1.51 ms with a millisecond
    more between them); at any count, a side that leaves the caches cold and memory to
    give back (NdArray's temporaries) slows whichever side runs next (PyTorch eager's
    one-thread softmax of [4096, 1024]: 5.8 ms after itself, about 15 ms when half its
    calls came right after NdArray's).
    """
    names = list(fns)
    warm_up(list(fns.values()))
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    order = random.Random(0)
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
            began = time.perf_counter()
            calls = 0
            while calls < lead_in or time.perf_counter() - began < lead_in_seconds:
                fns[name]()
                calls += 1
            start, start_cpu = time.perf_counter(), time.thread_time()
            fns[name]()
            cpu[name].append(time.thread_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in names}


RECORD_VARIABLE = "EMBER_BENCH_RECORD"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """Prints a table with aligned columns (and records it, see the module docstring)."""
    record = os.environ.get(RECORD_VARIABLE)
    if record:
        table = {"title": str(title), "header": [str(h) for h in header],
                 "rows": [[str(c) for c in row] for row in rows]}  # fmt: skip
        with open(record, "a", encoding="utf-8") as file:  # one line per table: appends stay whole
            file.write(json.dumps(table) + "\n")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n## {title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
