"""``ember bench``: a tiny suite run end to end, the run file's schema, compare, hostile files.

The end-to-end test runs real scripts in their own processes, through the real
``benchmarks/timing.py`` (copied next to them), so the recorded tables are what a real
benchmark records; the timings themselves are fixed numbers printed by the scripts.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from ember.backend.errors import ArgumentError
from ember.bench import registry, results
from ember.bench.compare import compare_runs
from ember.bench.registry import BenchmarkScript, Reading
from ember.bench.results import BenchFileError, BenchRun, Result, Table, load_run, save_run
from ember.bench.tables import backend_of, read_results
from ember.cli import main

ROOT = Path(__file__).resolve().parents[1]

TINY = """
from timing import print_table
print_table("tiny op, ms", ["impl", "ms", "vs torch"], [
    ["torch eager", "2.000", "1.00x"],
    ["ember/ndarray", "3.000", "1.50x"],
    ["ember autodiff(fusion(ndarray))", "1.000", "0.50x"],
    ["ember/torch", "nan", ""],
])
print_table("memory, MiB", ["impl", "MiB"], [["ember/ndarray", "12.0"]])
"""

FAILING = "import sys\nprint('something broke', file=sys.stderr)\nsys.exit(3)\n"

TINY_SUITE = {
    "tiny": BenchmarkScript("tiny", "tiny.py", (), (Reading("impl", "ms", 1e-3, r"^torch eager$"),)),
    "broken": BenchmarkScript("broken", "broken.py"),
    "needs_more": BenchmarkScript("needs_more", "tiny.py", requires=("no_such_module_for_ember",)),
}


@pytest.fixture
def bench_dir(tmp_path, monkeypatch):
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    shutil.copy(ROOT / "benchmarks" / "timing.py", folder / "timing.py")
    (folder / "tiny.py").write_text(TINY)
    (folder / "broken.py").write_text(FAILING)
    monkeypatch.setattr(registry, "SUITE", dict(TINY_SUITE))
    monkeypatch.setattr("ember.bench.cli.SUITE", registry.SUITE)
    return folder


def run_file(*timings: tuple[str, float, float | None]) -> BenchRun:
    """A run with one result per (impl, seconds, reference seconds)."""
    return BenchRun(created="2026-11-25T20:00:00+00:00", machine={"cpu": "test"}, threads=1,
                    scripts=[], results=[
                        Result(benchmark="b", case="c", impl=impl, backend="ndarray",
                               seconds=seconds, reference="torch" if ref else None,
                               reference_seconds=ref)
                        for impl, seconds, ref in timings])  # fmt: skip


# ---------------------------------------------------------------------- end to end
def test_a_tiny_suite_runs_prints_ratios_and_saves(bench_dir, tmp_path, capsys):
    saved = tmp_path / "run.json"
    assert main(["bench", "--dir", str(bench_dir), "--save", str(saved), "--all"]) == 0
    out = capsys.readouterr().out
    assert "ember/ndarray                    ndarray  3.000  1.50x torch eager" in out
    assert "ember autodiff(fusion(ndarray))  fusion   1.000  0.50x torch eager" in out
    assert "torch eager                      -        2.000  (reference)" in out
    assert "failed: exit status 3: something broke" in out
    assert "skipped: not installed: no_such_module_for_ember" in out

    run = load_run(saved)
    by_name = {s.name: s for s in run.scripts}
    assert [by_name[n].status for n in ("tiny", "broken", "needs_more")] == \
        ["ok", "failed", "skipped"]  # fmt: skip
    assert [t.title for t in by_name["tiny"].tables] == ["tiny op, ms", "memory, MiB"]
    assert [(r.impl, r.backend, r.seconds, r.reference_seconds) for r in run.results] == [
        ("torch eager", None, 2.0e-3, 2.0e-3),
        ("ember/ndarray", "ndarray", 3.0e-3, 2.0e-3),
        ("ember autodiff(fusion(ndarray))", "fusion", 1.0e-3, 2.0e-3),
    ]  # the nan row and the memory table give no result
    assert run.results[1].ratio == pytest.approx(1.5, rel=1e-12)
    assert run.machine["cores"] and run.threads == 1


def test_backends_filter_the_table(bench_dir, tmp_path, capsys):
    assert main(["bench", "--dir", str(bench_dir), "--save", str(tmp_path / "r.json"),
                 "--filter", "tiny", "--backends", "fusion"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "ember autodiff(fusion(ndarray))" in out and "(reference)" in out
    assert "ember/ndarray" not in out


def test_list_and_bad_options(bench_dir, capsys):
    assert main(["bench", "--list"]) == 0
    assert "* tiny" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--filter", "nothing-matches", "--dir", str(bench_dir)])
    assert exit_.value.code == 1
    assert "no benchmark matches 'nothing-matches'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--backends", "cuda"])
    assert exit_.value.code == 2


def test_the_real_suite_reads_the_real_scripts_headers():
    # every registered script exists and every reading names columns its script prints
    for benchmark in registry.SUITE.values():
        source = (ROOT / "benchmarks" / benchmark.script).read_text()
        assert "print_table" in source, benchmark.name
        for reading in benchmark.readings:
            assert f'"{reading.impl}"' in source and f'"{reading.time}"' in source, benchmark.name


# ---------------------------------------------------------------------- reading tables
def test_two_readings_of_one_table_and_a_case_without_reference():
    benchmark = BenchmarkScript("records", "records.py", (), (
        Reading("format", "save s", 1.0, r"^torch\.save", label="save"),
        Reading("format", "load s", 1.0, r"^torch\.save", ("size",), label="load"),
    ))  # fmt: skip
    table = Table(title="t", header=["format", "save s", "load s", "size"], rows=[
        ["torch.save", "0.5", "0.25", "1"], ["ember X", "1.0", "0.5", "1"], ["ember Y", "2", "1", "2"],
        ["short row"],
    ])  # fmt: skip
    got = [(r.case, r.impl, r.seconds, r.ratio) for r in read_results(benchmark, [table])]
    assert got == [
        ("t · save", "torch.save", 0.5, 1.0), ("t · save", "ember X", 1.0, 2.0),
        ("t · save", "ember Y", 2.0, 4.0),
        ("t · 1 · load", "torch.save", 0.25, 1.0), ("t · 1 · load", "ember X", 0.5, 2.0),
        ("t · 2 · load", "ember Y", 1.0, None),  # no reference in that case
    ]  # fmt: skip


@pytest.mark.parametrize(("impl", "backend"), [
    ("ember autodiff(fusion(ndarray))", "fusion"), ("fusion(ndarray)", "fusion"),
    ("ember/torch", "torch"), ("ember autodiff(torch cpu)", "torch"), ("ndarray", "ndarray"),
    ("ember int8 (NdArray)", "ndarray"), ("torch autograd", None), ("onnxruntime", None),
    ("raw numpy", None), ("ember read_pytorch (zip)", None), ("ember PyTorchFileRecorder", None),
])  # fmt: skip
def test_backend_of(impl, backend):
    assert backend_of(impl) == backend


def test_bad_reading_is_a_typed_error():
    with pytest.raises(ArgumentError, match="reference pattern"):
        Reading("impl", "ms", 1e-3, "(")
    with pytest.raises(ArgumentError, match="unit"):
        Reading("impl", "ms", 0, "torch")


# ---------------------------------------------------------------------- the run file
def test_run_file_round_trip_and_schema(tmp_path):
    run = run_file(("ember/ndarray", 0.003, 0.002))
    path = save_run(run, tmp_path / "run.json")
    data = json.loads(path.read_text())
    assert sorted(data) == ["created", "machine", "results", "schema", "scripts", "threads"]
    assert data["schema"] == "ember-bench/1"
    assert data["results"][0] == {
        "benchmark": "b", "case": "c", "impl": "ember/ndarray", "backend": "ndarray",
        "seconds": 0.003, "reference": "torch", "reference_seconds": 0.002,
    }  # fmt: skip
    assert load_run(path) == run


def hostile_cases():
    good = json.loads(run_file(("e", 1.0, None)).model_dump_json(by_alias=True))

    def edit(fn):
        data = json.loads(json.dumps(good))
        fn(data)
        return json.dumps(data)

    return {
        "not json": ("{", "not a JSON run file"),
        "a list": ("[]", "a JSON object, got list"),
        "no schema": (edit(lambda d: d.pop("schema")), "schema None is not"),
        "other schema": (edit(lambda d: d.update(schema="ember-bench/9")), "'ember-bench/9'"),
        "seconds as text": (edit(lambda d: d["results"][0].update(seconds="fast")),
                            "field results.0.seconds"),
        "negative seconds": (edit(lambda d: d["results"][0].update(seconds=-1.0)),
                             "field results.0.seconds"),
        "NaN": (edit(lambda d: None).replace('"seconds": 1.0', '"seconds": NaN'),
                "NaN is not a valid JSON number"),
        "extra field": (edit(lambda d: d["results"][0].update(shell="rm -rf /")),
                        "field results.0.shell"),
        "threads as string": (edit(lambda d: d.update(threads="1")), "field threads"),
        "huge text": (edit(lambda d: d["results"][0].update(case="x" * 5000)),
                      "field results.0.case"),
        "deep nesting": ("[" * 100_000 + "]" * 100_000, "not a JSON run file"),
        "not utf-8": ('{"schema": "\xff"}'.encode("latin-1"), "not a JSON run file"),
    }  # fmt: skip


@pytest.mark.parametrize("case", list(hostile_cases()))
def test_hostile_run_files_are_typed_errors(tmp_path, case):
    content, message = hostile_cases()[case]
    path = tmp_path / "hostile.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(BenchFileError) as error:
        load_run(path)
    assert str(path) in str(error.value) and message in str(error.value)


def test_oversized_and_missing_files(tmp_path, monkeypatch):
    path = save_run(run_file(("e", 1.0, None)), tmp_path / "run.json")
    monkeypatch.setattr(results, "MAX_FILE_BYTES", 100)
    with pytest.raises(BenchFileError, match="larger than a benchmark run file may be"):
        load_run(path)
    with pytest.raises(BenchFileError, match="cannot read the run file"):
        load_run(tmp_path / "missing.json")


# ---------------------------------------------------------------------- compare
def test_compare_flags_a_regression_and_not_noise():
    old = run_file(("slower", 1.0, None), ("noisy", 1.0, None), ("faster", 1.0, None),
                   ("gone", 1.0, None))  # fmt: skip
    new = run_file(("slower", 1.2, None), ("noisy", 1.05, None), ("faster", 0.8, None),
                   ("added", 1.0, None))  # fmt: skip
    result = compare_runs(old, new, threshold=1.10)
    assert [(c.key[2], round(c.factor, 6)) for c in result.regressions] == [("slower", 1.2)]
    assert [c.key[2] for c in result.improvements] == ["faster"]
    assert [k[2] for k in result.only_old] == ["gone"] and [k[2] for k in result.only_new] == ["added"]


def test_compare_by_ratio_cancels_a_slower_machine():
    old = run_file(("torch", 1.0, 1.0), ("ember", 1.5, 1.0))
    new = run_file(("torch", 2.0, 2.0), ("ember", 3.0, 2.0))  # everything twice as slow
    assert [c.key[2] for c in compare_runs(old, new).regressions] == ["torch", "ember"]
    assert compare_runs(old, new, metric="ratio").regressions == []


@pytest.mark.parametrize("threshold", [1.0, 0.5, float("inf"), True, "1.1"])
def test_compare_threshold_must_be_above_one(threshold):
    with pytest.raises(ArgumentError, match="threshold"):
        compare_runs(run_file(), run_file(), threshold=threshold)


def test_compare_command_exit_status(tmp_path, capsys):
    old = save_run(run_file(("ember", 1.0, None)), tmp_path / "old.json")
    worse = save_run(run_file(("ember", 1.2, None)), tmp_path / "worse.json")
    noise = save_run(run_file(("ember", 1.05, None)), tmp_path / "noise.json")
    assert main(["bench", "compare", str(old), str(worse)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"1\.20x +REGRESSION", out) and "1 regression(s) above 1.1x" in out
    assert main(["bench", "compare", str(old), str(noise), "--threshold", "1.1"]) == 0
    assert "REGRESSION" not in capsys.readouterr().out
    assert main(["bench", "compare", str(old), str(worse), "--threshold", "1.25"]) == 0
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "compare", str(old), str(tmp_path / "bad.json")])
    assert exit_.value.code == 1
    assert "bad.json: a run file is a JSON object" in capsys.readouterr().err


def test_interleaved_calls_follow_each_other_side_alike(monkeypatch):
    # benchmarks/timing.interleaved_seconds: each round's order is shuffled (seeded), so
    # no side always runs right after the same one (a side that leaves caches cold would
    # slow it every time); every side runs once per round, after one warm-up call.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import timing

    calls: list[str] = []
    sides = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    timing.interleaved_seconds(sides, rounds=4, lead_in_seconds=0)  # each after one of its own
    assert all(calls[i] == calls[i + 1] for i in range(3, len(calls), 2)), calls
    calls.clear()
    times = timing.interleaved_seconds(sides, rounds=300, lead_in=0, lead_in_seconds=0)
    assert set(times) == set("abc") and all(len(t) == 2 for t in times.values())
    timed = calls[3:]
    assert sorted(calls[:3]) == list("abc")
    assert all(sorted(timed[i : i + 3]) == list("abc") for i in range(0, len(timed), 3))
    after = {(x, y): 0 for x in "abc" for y in "abc" if x != y}
    for x, y in itertools.pairwise(timed):
        if x != y:
            after[(x, y)] += 1
    assert min(after.values()) > 0.6 * max(after.values()), after
    calls.clear()
    timing.interleaved_seconds(sides, rounds=300, lead_in=0, lead_in_seconds=0)
    assert calls[3:] == timed  # the same orders in every run


def test_each_timed_call_comes_after_its_sides_lead_in_time(monkeypatch):
    # A side's own untimed calls last at least lead_in_seconds before each timed call:
    # PyTorch's OpenMP threads spin for milliseconds after its call, past one short call.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import timing

    starts: list[tuple[str, float]] = []

    def side(name: str):
        starts.append((name, time.perf_counter()))
        time.sleep(0.001)

    sides = {name: (lambda name=name: side(name)) for name in "ab"}
    timing.interleaved_seconds(sides, rounds=3, lead_in_seconds=0.006)
    runs: list[list[float]] = []  # each run of one side's consecutive calls: their starts
    for i, (name, at) in enumerate(starts[2:], 2):
        if name == starts[i - 1][0] and i > 2:
            runs[-1].append(at)
        else:
            runs.append([at])
    # (A side whose timed call ends a round and who leads the next makes one longer run.)
    assert len(runs) >= 2
    for run in runs:
        assert run[-1] - run[0] >= 0.006  # lead-in calls, then the timed call
