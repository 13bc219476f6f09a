"""The suite's shards (``tests/sharding.py``): how tests are dealt, and the table of seconds
per file that balances them, recorded by ``--durations-out`` and merged by
``scripts/run_shards.py --update-durations``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import sharding

ROOT = Path(__file__).resolve().parents[1]


def _items(counts: dict[str, int]) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=f"{path}::test_{i}") for path, n in counts.items()
            for i in range(n)]  # fmt: skip


def test_whole_files_go_to_the_least_loaded_shard_longest_first():
    items = _items({"a.py": 2, "b.py": 1, "c.py": 1, "d.py": 3})
    seconds = {"a.py": 10.0, "b.py": 6.0, "c.py": 5.0, "d.py": 1.0}
    shard_of = sharding.assign(items, 2, seconds)
    by_file = {item.nodeid.split("::")[0]: shard for item, shard in zip(items, shard_of)}
    # a (10) -> 0; b (6) -> 1; c (5) -> 1 (6 < 10); d (1) -> 0 (10 < 11)
    assert by_file == {"a.py": 0, "b.py": 1, "c.py": 1, "d.py": 0}
    assert shard_of[:2] == [0, 0] and shard_of[4:] == [0, 0, 0]  # a file's cases stay together


def test_files_reversed_keeps_each_files_tests_in_order():
    items = _items({"a.py": 2, "b.py": 1, "c.py": 3})
    ids = [item.nodeid for item in sharding.files_reversed(items)]
    assert ids == ["c.py::test_0", "c.py::test_1", "c.py::test_2", "b.py::test_0",
                   "a.py::test_0", "a.py::test_1"]  # fmt: skip


def test_files_of_many_cases_are_dealt_in_turn():
    items = _items({"many.py": sharding.SPREAD_CASES, "one.py": 1})
    shard_of = sharding.assign(items, 3, {})
    assert shard_of[: sharding.SPREAD_CASES] == [i % 3 for i in range(sharding.SPREAD_CASES)]


def test_merged_tables_add_up_a_file_split_between_shards():
    merged = sharding.merge_durations([{"a.py": 1.26, "b.py": 2.0}, {"a.py": 0.5, "c.py": 3.0}])
    assert merged == {"a.py": 1.8, "b.py": 2.0, "c.py": 3.0}
    assert list(merged) == sorted(merged)


def test_recorder_adds_every_phase_of_a_files_tests(tmp_path):
    out = tmp_path / "seconds.json"
    recorder = sharding.FileSeconds(out)
    for nodeid, duration in [("x/test_a.py::t1", 0.25), ("x/test_a.py::t1", 0.5),
                             ("x/test_b.py::C::t2[1]", 1.0), ("x/test_a.py::t3", 0.125)]:  # fmt: skip
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=duration))
    recorder.pytest_sessionfinish()
    assert json.loads(out.read_text()) == {"x/test_a.py": 0.88, "x/test_b.py": 1.0}


def test_durations_out_writes_the_seconds_of_the_files_that_ran(tmp_path):
    out = tmp_path / "seconds.json"
    target = "tests/test_sharding.py::test_merged_tables_add_up_a_file_split_between_shards"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           target, "--durations-out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    table = json.loads(out.read_text())
    assert list(table) == ["tests/test_sharding.py"] and table["tests/test_sharding.py"] >= 0


def test_update_replaces_the_table_with_the_shards_sum(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("run_shards", ROOT / "scripts" / "run_shards.py")
    run_shards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_shards)
    table = tmp_path / "durations.json"
    table.write_text('{"stale.py": 9.0}\n')
    monkeypatch.setattr(sharding, "DURATIONS", table)
    shards = [tmp_path / "shard1.json", tmp_path / "shard2.json", tmp_path / "shard3.json"]
    shards[0].write_text('{"a.py": 1.0, "b.py": 2.5}')
    shards[1].write_text('{"a.py": 1.5}')  # shard 3 wrote nothing: it had no test
    run_shards._write_durations(shards)
    assert json.loads(table.read_text()) == {"a.py": 2.5, "b.py": 2.5}
