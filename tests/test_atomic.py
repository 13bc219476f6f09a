"""Atomic writes: temporaries of writers killed with SIGKILL are removed by the next write to
the same target and by a checkpointer's start; a live writer's temporary never is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ember import atomic
from ember.atomic import STALE_AFTER, atomic_write, remove_stale_temporaries

pytestmark = pytest.mark.skipif(os.name == "nt", reason="SIGKILL and pids as on POSIX")

SRC = str(Path(atomic.__file__).parents[1])
# A writer that writes its first chunk, says so with a marker file, then waits for a "go"
# file (at most 30 s) before its last chunk.
WRITER = r"""
import sys, time
from pathlib import Path
from ember.atomic import atomic_write

target, ready, go = map(Path, sys.argv[1:4])

def chunks():
    yield b"first chunk " * 1000
    ready.touch()
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    yield b"from the writer"

atomic_write(target, chunks())
"""


def _temporaries(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


def _start_writer(target: Path) -> tuple[subprocess.Popen, Path]:
    """A writer process paused mid-write, its temporary on disk; returns it and its go file."""
    ready, go = target.with_name("ready"), target.with_name("go")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(ready), str(go)],
                               env=env)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the writer did not start (exit code {process.poll()})")
        time.sleep(0.01)
    ready.unlink()
    return process, go


def test_a_write_killed_with_sigkill_leaves_a_temporary_the_next_write_removes(tmp_path):
    target = tmp_path / "model.mpk"
    atomic_write(target, b"old")
    process, _ = _start_writer(target)
    [temporary] = _temporaries(tmp_path)
    assert temporary.startswith(f".model.mpk.{process.pid}-")
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert _temporaries(tmp_path) == [temporary] and target.read_bytes() == b"old"

    atomic_write(target, b"new")
    assert _temporaries(tmp_path) == [] and target.read_bytes() == b"new"


def test_a_live_writers_temporary_is_left_alone(tmp_path):
    target = tmp_path / "model.mpk"
    process, go = _start_writer(target)
    try:
        [temporary] = _temporaries(tmp_path)
        atomic_write(target, b"from the test")  # a concurrent write to the same target
        assert remove_stale_temporaries(tmp_path) == []
        assert _temporaries(tmp_path) == [temporary]
        go.touch()
        assert process.wait(timeout=30) == 0  # its rename found its temporary
    finally:
        process.kill()
    assert target.read_bytes().endswith(b"from the writer") and _temporaries(tmp_path) == []


def test_only_stale_temporaries_of_the_target_are_removed(tmp_path):
    host = atomic._HOST
    dead = _dead_pid()
    names = {
        "dead writer": f".m.mpk.{dead}-{host}.{'a' * 32}.tmp",
        "dead writer of another target": f".other.mpk.{dead}-{host}.{'b' * 32}.tmp",
        "live writer (this process)": f".m.mpk.{os.getpid()}-{host}.{'c' * 32}.tmp",
        "another host, recent": f".m.mpk.{dead}-00000000.{'d' * 32}.tmp",
        "another host, old": f".m.mpk.{dead}-11111111.{'e' * 32}.tmp",
        "an older ember's name, recent": f".m.mpk.{'f' * 32}.tmp",
        "an older ember's name, old": f".m.mpk.{'0' * 32}.tmp",
        "not ember's": ".m.mpk.notes.tmp",
        "the target": "m.mpk",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    hour_ago = time.time() - STALE_AFTER - 60
    for key in ("another host, old", "an older ember's name, old"):
        os.utime(tmp_path / names[key], (hour_ago, hour_ago))

    removed = remove_stale_temporaries(tmp_path, "m.mpk")
    expected = {"dead writer", "another host, old", "an older ember's name, old"}
    assert sorted(p.name for p in removed) == sorted(names[k] for k in expected)
    assert sorted(os.listdir(tmp_path)) == sorted(v for k, v in names.items() if k not in expected)
    # Every target's, for a checkpointer's start.
    assert [p.name for p in remove_stale_temporaries(tmp_path)] == [
        names["dead writer of another target"]]


def test_a_checkpointer_removes_stale_temporaries_when_it_starts(tmp_path):
    from ember.train.learner.checkpoint import FileCheckpointer

    stale = tmp_path / f".model-3.mpk.gz.{_dead_pid()}-{atomic._HOST}.{'a' * 32}.tmp"
    stale.write_bytes(b"half a record")
    FileCheckpointer(tmp_path)
    assert not stale.exists()
    FileCheckpointer(tmp_path / "not yet created")  # nothing to clean, no error


def test_target_names_with_dots_digits_and_dashes(tmp_path):
    target = tmp_path / "w.1-abcdef12.mpk"
    stale = tmp_path / f".w.1-abcdef12.mpk.{_dead_pid()}-{atomic._HOST}.{'a' * 32}.tmp"
    stale.write_bytes(b"x")
    other = tmp_path / f".w.{_dead_pid()}-{atomic._HOST}.{'b' * 32}.tmp"
    other.write_bytes(b"x")
    atomic_write(target, b"new")
    assert not stale.exists() and other.exists()


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    return process.pid
