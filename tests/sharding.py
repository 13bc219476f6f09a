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
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
SPREAD_CASES = 400
"""Files with at least this many cases are dealt case by case, round-robin."""
SECONDS_PER_UNKNOWN_CASE = 0.01


def pytest_addoption(parser) -> None:
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the K-th (1-based) of N disjoint parts of the tests")  # fmt: skip


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
    items[:] = kept
    if left:
        config.hook.pytest_deselected(items=left)
