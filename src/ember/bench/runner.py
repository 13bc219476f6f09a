"""Runs the suite's scripts, each in its own process, and collects what they recorded.

Each script runs as ``python benchmarks/<script> <args>`` with the thread variables set
(its ``pin_threads`` keeps them) and ``EMBER_BENCH_RECORD`` naming a fresh file that its
``print_table`` appends the tables to. A script whose modules are missing is skipped with
the reason; one that fails (exit status, time limit, unreadable tables) is recorded as
failed with the tail of its error output, and the run goes on.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import ValidationError

from ember.bench.registry import BenchmarkScript
from ember.bench.results import BenchRun, ScriptRun, Table
from ember.bench.tables import read_results

RECORD_VARIABLE = "EMBER_BENCH_RECORD"  # benchmarks/timing.py reads the same name
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "EMBER_FUSION_THREADS")  # fmt: skip
MAX_RECORD_BYTES = 32 << 20


def run_suite(
    benchmarks: Iterable[BenchmarkScript],
    directory: Path,
    threads: int = 1,
    timeout: float = 1800.0,
    on_start: Callable[[BenchmarkScript], None] | None = None,
    on_done: Callable[[ScriptRun], None] | None = None,
) -> BenchRun:
    """Runs ``benchmarks`` from ``directory`` and returns the whole run, results read."""
    scripts, results = [], []
    for benchmark in benchmarks:
        if on_start is not None:
            on_start(benchmark)
        outcome = run_script(benchmark, directory, threads, timeout)
        scripts.append(outcome)
        results += read_results(benchmark, outcome.tables)
        if on_done is not None:
            on_done(outcome)
    return BenchRun(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        machine=machine_facts(directory), threads=threads, scripts=scripts, results=results,
    )  # fmt: skip


def run_script(benchmark: BenchmarkScript, directory: Path, threads: int,
               timeout: float) -> ScriptRun:  # fmt: skip
    """Runs one script; its outcome with the tables it recorded."""
    outcome = {"name": benchmark.name, "args": list(benchmark.args)}
    missing = [m for m in benchmark.requires if importlib.util.find_spec(m) is None]
    if missing:
        return ScriptRun(**outcome, status="skipped", reason=f"not installed: {', '.join(missing)}")
    path = directory / benchmark.script
    if not path.is_file():
        return ScriptRun(**outcome, status="skipped", reason=f"{path} does not exist")
    with tempfile.TemporaryDirectory(prefix="ember-bench-") as scratch:
        record = Path(scratch) / "tables.jsonl"
        env = {**os.environ, RECORD_VARIABLE: str(record)}
        env.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, str(path), *benchmark.args], cwd=directory,
                                  env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            return ScriptRun(**outcome, status="failed", reason=f"ran past {timeout:g} s",
                             wall_seconds=time.perf_counter() - start)  # fmt: skip
        wall = time.perf_counter() - start
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            return ScriptRun(**outcome, status="failed", wall_seconds=wall,
                             reason=f"exit status {done.returncode}: {tail}"[:2000])  # fmt: skip
        try:
            tables = read_tables(record)
        except ValueError as error:
            return ScriptRun(**outcome, status="failed", wall_seconds=wall,
                             reason=f"its recorded tables: {error}"[:2000])  # fmt: skip
    return ScriptRun(**outcome, status="ok", wall_seconds=wall, tables=tables)


def read_tables(record: Path) -> list[Table]:
    """The tables in a record file (one JSON object per line; none if the file is absent).

    Raises:
        ValueError: the file is too large, or a line is not a table.
    """
    if not record.exists():
        return []
    if record.stat().st_size > MAX_RECORD_BYTES:
        raise ValueError(f"{record} is larger than {MAX_RECORD_BYTES} bytes")
    tables = []
    for number, line in enumerate(record.read_text(encoding="utf-8").splitlines(), 1):
        try:
            tables.append(Table.model_validate(json.loads(line)))
        except (ValueError, ValidationError) as error:
            raise ValueError(f"line {number} is not a table: {error}") from error
    return tables


def machine_facts(directory: Path) -> dict[str, str]:
    """What a timing depends on: CPU, cores, OS, versions and the git commit."""
    facts = {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    for package in ("ember", "numpy", "torch", "numba", "onnxruntime"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            facts[package] = importlib.metadata.version(package)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True,
                                text=True, timeout=10)  # fmt: skip
        if commit.returncode == 0:
            facts["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return facts


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
