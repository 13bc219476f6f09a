"""``--shard K/N``: run the K-th of N disjoint parts of the collected tests.

``scripts/test.sh`` runs the suite as N pytest processes side by side, one shard each
(``scripts/run_shards.py``). Tens of thousands of the suite's cases are small
parametrized ones, which cost pytest-xdist more in messages between controller and
workers than they take to run (measured on 2 cores: a file of 11k conformance cases in
41 s under ``-n 2``, 24 s as two shards; the whole suite 821 s and 770 s).

Every shard collects the same tests and computes the same split: the cases of a file of
many cases (the conformance suites) go to the shards in turn; every other file goes
whole to the shard with the least expected time so far, its time taken from
``tests/durations.json`` (seconds per file from a full run; a file missing there counts
10 ms a case). A stale table costs balance, never a test.

``--durations-out PATH`` writes the seconds this process spent on each file (setup, call
and teardown of its tests) as JSON; ``scripts/run_shards.py N --update-durations`` adds
the shards' files up into a new ``tests/durations.json``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
SPREAD_CASES = 400
"""Files with at least this many cases are dealt case by case, round-robin."""
SECONDS_PER_UNKNOWN_CASE = 0.01


def pytest_addoption(parser) -> None:
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the K-th (1-based) of N disjoint parts of the tests")  # fmt: skip
    parser.addoption("--durations-out", default=None, metavar="PATH",
                     help="write the seconds spent on each test file to PATH (JSON)")  # fmt: skip


def record_durations(config) -> None:
    """Registers the recorder of ``--durations-out`` where the option is given."""
    path = config.getoption("--durations-out")
    if path is not None:
        config.pluginmanager.register(FileSeconds(Path(path)), "ember-file-seconds")


class FileSeconds:
    """Adds up each test file's seconds (every phase of every test in it) and writes them
    to ``path`` when the session ends, whole or not at all."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self) -> None:
        from ember.atomic import atomic_write

        table = {path: round(seconds, 2) for path, seconds in sorted(self.seconds.items())}
        atomic_write(self.path, (json.dumps(table, indent=1) + "\n").encode())


def merge_durations(tables: list[dict[str, float]]) -> dict[str, float]:
    """One table of seconds per file from the shards' tables: a file dealt case by case
    ran in several shards, and its seconds are their sum."""
    total: defaultdict[str, float] = defaultdict(float)
    for table in tables:
        for path, seconds in table.items():
            total[path] += seconds
    return {path: round(seconds, 1) for path, seconds in sorted(total.items())}


def _parse(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard must be K/N with integers, got {text!r}") from None
    if not 1 <= index <= count:
        raise pytest.UsageError(f"--shard K/N needs 1 <= K <= N, got {text!r}")
    return index - 1, count


def assign(items: list, count: int, durations: dict[str, float]) -> list[int]:
    """The shard (0-based) of each item: round-robin within large files, whole files to
    the least loaded shard (longest first) otherwise."""
    by_file: dict[str, list[int]] = {}
    for position, item in enumerate(items):
        by_file.setdefault(item.nodeid.split("::")[0], []).append(position)
    shard_of = [0] * len(items)
    load = [0.0] * count
    whole = []
    for path, positions in by_file.items():
        seconds = durations.get(path, SECONDS_PER_UNKNOWN_CASE * len(positions))
        if len(positions) >= SPREAD_CASES:
            for turn, position in enumerate(positions):
                shard_of[position] = turn % count
            for shard in range(count):
                load[shard] += seconds / count
        else:
            whole.append((seconds, path, positions))
    for seconds, _, positions in sorted(whole, key=lambda entry: (-entry[0], entry[1])):
        shard = min(range(count), key=lambda s: (load[s], s))
        load[shard] += seconds
        for position in positions:
            shard_of[position] = shard
    return shard_of


def files_reversed(items: list) -> list:
    """``items`` with their files in the opposite order, each file's own tests in theirs."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    return [item for tests in reversed(files.values()) for item in tests]


def select(config, items: list) -> None:
    """Keeps the items of the shard ``--shard`` names (all of them without the option)."""
    option = config.getoption("--shard")
    if option is None:
        return
    index, count = _parse(option)
    durations = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    shard_of = assign(items, count, durations)
    kept = [item for item, shard in zip(items, shard_of) if shard == index]
    left = [item for item, shard in zip(items, shard_of) if shard != index]
    if index % 2:
        # Every other shard runs its files last to first: ember's numba kernels compile on
        # their first use (a cold clone spends minutes on it), and a kernel one shard
        # compiled early is then loaded from numba's disk cache by the other, late
        kept = files_reversed(kept)
    items[:] = kept
    if left:
        config.hook.pytest_deselected(items=left)
