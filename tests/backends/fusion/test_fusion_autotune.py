"""Autotune: whichever way a block runs (fused at any thread count, or unfused), the values
are the unfused ops' values (within the kernels' stated f32 tolerance); choices persist in
the cache folder and a new process reuses them without timing; a hostile choices file is
ignored, never trusted; ``EMBER_FUSION_AUTOTUNE=0`` tunes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import Tensor, activation
from ember.backends.fusion import autotune, executor, ir, reset_stats, stats
from ember.backends.fusion.autotune import UNFUSED, Choice, Pending, Stored, Tuner
from ember.backends.fusion.executor import runtime_named
from ember.tensor.dtype import DType

numba_runtime = pytest.importorskip("ember.backends.fusion.numba_runtime")
if not numba_runtime.available():
    pytest.skip("numba is not installed (pip install 'ember[jit]')", allow_module_level=True)

RTOL, ATOL = 2e-6, 2e-6  # a few ulp of f32: the kernels' erf/exp approximations
ROWS, COLS = 320, 256  # 81920 elements: above PARALLEL_MIN, so tuned
CANDIDATES = [Choice("fused", 1), Choice("fused", 2), UNFUSED]
_REAL_OTHERS_RUNNING = autotune.others_running  # before the conftest's fixture replaces it
F32 = DType.F32


def _chain(t: Tensor) -> Tensor:
    """GELU then softmax over rows: one element-wise + reduction block."""
    return activation.softmax(activation.gelu(t) * 3.0, 1)


def _data(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(ROWS, COLS)).astype(np.float32) * 3


def _block(shape: tuple[int, ...]) -> ir.Block:
    """exp(2x), built by hand: what the tuner sees of a fused block."""
    return ir.Block(shape, (ir.Input(shape, F32),),
                    (ir.Instr("mul_scalar", (0,), (2.0,), shape, F32),
                     ir.Instr("exp", (1,), (), shape, F32)), (2,))  # fmt: skip


def _unfused(x: np.ndarray):
    return lambda: np.exp(x * np.float32(2.0))


@pytest.mark.parametrize("choice", CANDIDATES, ids=str)
def test_every_candidate_computes_the_unfused_values(choice):
    x = _data()
    eager = _chain(Tensor.from_data(x, ember.device("ndarray"))).to_data().to_numpy()
    reset_stats()
    with autotune.forcing(choice):
        fused = ember.device("ndarray").fusion(runtime="numba")
        got = _chain(Tensor.from_data(x, fused)).to_data().to_numpy()
    counts = stats()
    if choice == UNFUSED:
        np.testing.assert_array_equal(got, eager)  # the same ops: the same bits
        assert counts["kernels"] == 0 and counts["unfused_ops"] > 0
    else:
        np.testing.assert_allclose(got, eager, rtol=RTOL, atol=ATOL)
        assert counts["kernels"] >= 1 and counts["fused_ops"] > counts["kernels"]
    assert counts["tunings"] == 0  # a forced choice times nothing


@pytest.mark.parametrize("choice", CANDIDATES, ids=str)
def test_every_candidate_raises_what_the_unfused_ops_raise(choice):
    base = np.full((ROWS, COLS), 2, np.int64)
    power = np.ones((ROWS, COLS), np.int64)
    power[5, 7] = -1  # NumPy refuses an int raised to a negative power

    def step(device):
        return (Tensor.from_data(base, device) * 3).pow(Tensor.from_data(power, device))

    with pytest.raises(Exception) as expected:
        step(ember.device("ndarray")).to_data()
    with autotune.forcing(choice), pytest.raises(type(expected.value)) as got:
        step(ember.device("ndarray").fusion(runtime="numba")).to_data()
    assert str(got.value) == str(expected.value)


def test_the_run_that_tunes_keeps_its_own_outputs(runtime, monkeypatch, tmp_path):
    # The session's runtime under the devices made here, with a tuner over an empty folder.
    monkeypatch.setitem(executor._shared, "numba", runtime)
    monkeypatch.setitem(autotune._tuners, runtime, Tuner(runtime, tmp_path))
    fused = ember.device("ndarray").fusion(runtime="numba")
    xs = [_data(seed) for seed in (5, 6, 7)]
    eager = [_chain(Tensor.from_data(x, ember.device("ndarray"))).to_data().to_numpy() for x in xs]
    reset_stats()
    first = _chain(Tensor.from_data(xs[0], fused))
    first.to_data()  # this run tunes: the candidates' runs come after it
    assert stats()["tunings"] == 1
    later = [_chain(Tensor.from_data(x, fused)).to_data().to_numpy() for x in xs[1:]]
    assert stats()["tunings"] == 1  # the bucket's choice is reused
    # The tuned run's value was not a buffer a candidate (or a later step) wrote over.
    np.testing.assert_allclose(first.to_data().to_numpy(), eager[0], rtol=RTOL, atol=ATOL)
    for got, want in zip(later, eager[1:], strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_a_tuning_picks_a_candidate_and_persists_it(runtime, tmp_path):
    shape = (ROWS, COLS)
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    block = _block(shape)
    reset_stats()
    tuner = Tuner(runtime, tmp_path)
    pending = tuner.lookup(block)
    assert type(pending) is Pending
    runtime.release(runtime.run(block, [x])[0])  # the caller's own run compiles the kernel
    choice = tuner.tune(pending, block, [x], _unfused(x))
    assert stats()["tunings"] == 1
    limit = tuner.thread_limit()
    assert choice == UNFUSED or (choice.run == "fused" and 1 <= choice.threads <= limit)
    assert tuner.lookup(block) == choice  # remembered in this process
    # A new tuner over the folder (as a new process would make) reads the choice, made by
    # one tuning, and checks it with one more.
    again = Tuner(runtime, tmp_path)
    second = again.lookup(block)
    assert type(second) is Pending and second.earlier == Stored(choice)
    confirmed = again.tune(second, block, [x], _unfused(x))
    assert again.lookup(block) == confirmed
    third = Tuner(runtime, tmp_path).lookup(block)
    if confirmed == choice:
        assert third == choice  # two tunings in a row agreed: settled
    else:
        assert type(third) is Pending and third.earlier == Stored(confirmed, 2, 1)
    # Another size bucket, or a block of another kind, is not covered by it.
    assert type(again.lookup(_block((ROWS * 4, COLS)))) is Pending
    other = ir.Block(shape, block.inputs, block.body[:1], (1,))
    assert type(again.lookup(other)) is Pending
    # Nor is another thread limit.
    one = numba_runtime.NumbaRuntime(cache=runtime.cache, threads=1)
    assert type(Tuner(one, tmp_path).lookup(block)) is Pending
    assert stats()["tunings"] == 2


def test_a_tuning_timed_beside_other_processes_is_not_written(runtime, monkeypatch, tmp_path):
    shape = (ROWS, COLS)
    x = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    block = _block(shape)
    monkeypatch.setattr(autotune, "others_running", lambda: autotune.BUSY_OTHERS)
    tuner = Tuner(runtime, tmp_path)
    pending = tuner.lookup(block)
    runtime.release(runtime.run(block, [x])[0])
    choice = tuner.tune(pending, block, [x], _unfused(x))
    assert tuner.lookup(block) == choice  # this process uses it
    later = Tuner(runtime, tmp_path).lookup(block)  # a new process tunes afresh
    assert type(later) is Pending and later.earlier is None
    monkeypatch.setattr(autotune, "others_running", lambda: autotune.BUSY_OTHERS - 1)
    Tuner(runtime, tmp_path).tune(later, block, [x], _unfused(x))
    assert Tuner(runtime, tmp_path).lookup(block).earlier is not None  # quiet: written


def test_a_run_that_loads_a_parallel_launcher_is_timed_again(monkeypatch, tmp_path):
    """The first two-thread launch of a kernel on numba's threads loads its launcher (tens
    of ms, once): timed with it, a large product chose one thread for good."""
    from ember.backends.fusion import numba_parallel

    clock, loaded = [0.0], [0]
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(numba_parallel, "loads", lambda: loaded[0])
    seconds = {1: 0.004, 2: 0.002}  # a product: twice as fast on two threads

    def run_fused(threads: int) -> None:
        if threads == 2 and not loaded[0]:
            loaded[0] += 1
            clock[0] += 0.1  # the launcher's load
        clock[0] += seconds[threads]

    def run_unfused() -> None:
        clock[0] += 0.006

    tuner = Tuner(numba_runtime.NumbaRuntime(cache=tmp_path, threads=2), tmp_path)
    pending = tuner.lookup_op(("a product",), 1 << 24)
    assert type(pending) is Pending and pending.limit == 2
    assert tuner.tune_with(pending, run_fused, run_unfused) == Choice("fused", 2)
    assert loaded[0] == 1


@pytest.mark.parametrize(("work", "timed"), [(autotune.MAX_TUNED_WORK - 1, [1, 2]),
                                             (autotune.MAX_TUNED_WORK, [2])])  # fmt: skip
def test_a_large_single_op_is_not_timed_on_fewer_threads(work, timed, monkeypatch, tmp_path):
    """A product of half a millisecond or more runs on every thread: timed at one thread too,
    a run of two threads that waited for a vCPU the host had taken away chose one thread
    for good. It is still timed against the inner op, which may win."""
    clock = [0.0]
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock[0])
    seconds = {1: 0.004, 2: 0.009}  # this time, two threads waited for a core
    calls: set[int] = set()

    def run_fused(threads: int) -> None:
        calls.add(threads)
        clock[0] += seconds[threads]

    def run_unfused() -> None:
        clock[0] += 0.006

    tuner = Tuner(numba_runtime.NumbaRuntime(cache=tmp_path, threads=2), tmp_path)
    pending = tuner.lookup_op(("a product",), work)
    assert type(pending) is Pending
    chosen = tuner.tune_with(pending, run_fused, run_unfused)
    assert sorted(calls) == timed
    assert chosen == (Choice("fused", 1) if timed == [1, 2] else UNFUSED)


@pytest.mark.parametrize(("work", "timed"), [(1 << 26, [2, 4, 8, 16]), (1 << 28, [8, 16]),
                                             (1 << 30, [16]), (1 << 20, [1, 2, 4, 8, 16])])  # fmt: skip
def test_a_single_op_is_timed_where_more_threads_might_not_pay(work, timed, tmp_path):
    """On 16 threads a count ``c`` is timed only where ``2c`` threads would have under
    ``MAX_TUNED_WORK / 2`` each (a thread's wake-up could then matter)."""
    class Sixteen:  # a runtime of 16 threads, whatever this machine has
        def thread_count(self) -> int:
            return 16

    pending = Tuner(Sixteen(), tmp_path).lookup_op(("a product",), work)
    assert type(pending) is Pending and list(pending.counts) == timed


def test_a_tuning_timed_beside_other_processes_is_timed_again_later(runtime, monkeypatch,
                                                                      tmp_path):  # fmt: skip
    """A process uses such a choice for PROVISIONAL_SECONDS (longer each time it was busy
    again), then times the bucket again; a quiet tuning is written, and after the last
    busy one the choice stays for the process."""
    shape = (ROWS, COLS)
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    block = _block(shape)
    now = [1000.0]
    monkeypatch.setattr(autotune.time, "monotonic", lambda: now[0])
    busy = [autotune.BUSY_OTHERS]
    monkeypatch.setattr(autotune, "others_running", lambda: busy[0])
    tuner = Tuner(runtime, tmp_path)
    runtime.release(runtime.run(block, [x])[0])

    def tuned_now() -> bool:
        found = tuner.lookup(block)
        if type(found) is Pending:
            tuner.tune(found, block, [x], _unfused(x))
            return True
        assert type(found) is Choice
        return False

    for wait in autotune.PROVISIONAL_SECONDS:
        assert tuned_now()
        generation = tuner.generation()
        now[0] += wait - 0.5
        assert not tuned_now() and tuner.generation() == generation  # kept meanwhile
        now[0] += 0.5
        assert tuner.generation() != generation  # expired: choices kept elsewhere are stale
    assert tuned_now()  # a fourth busy tuning: kept for the process
    now[0] += 10 * max(autotune.PROVISIONAL_SECONDS)
    assert not tuned_now()
    assert Tuner(runtime, tmp_path).lookup(block).earlier is None  # none written
    # A quiet tuning after a busy one is written.
    again = Tuner(runtime, tmp_path)
    busy[0] = autotune.BUSY_OTHERS
    found = again.lookup(block)
    again.tune(found, block, [x], _unfused(x))
    busy[0] = 0
    now[0] += autotune.PROVISIONAL_SECONDS[0]
    found = again.lookup(block)
    assert type(found) is Pending
    again.tune(found, block, [x], _unfused(x))
    assert Tuner(runtime, tmp_path).lookup(block).earlier is not None
    now[0] += 10 * max(autotune.PROVISIONAL_SECONDS)
    assert type(again.lookup(block)) is Choice  # quiet: kept


@pytest.mark.skipif(not Path("/proc/loadavg").exists(), reason="no /proc/loadavg (not Linux)")
def test_others_running_counts_another_process_that_runs():
    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # started and running
        assert max(_REAL_OTHERS_RUNNING() for _ in range(20)) >= 1
    finally:
        spinning.kill()
        spinning.wait()


def test_a_choice_settles_when_two_tunings_agree_or_after_three():
    one, two = Choice("fused", 1), Choice("fused", 2)
    first = Stored(one)
    assert not first.settled
    assert first.after(one) == Stored(one, 2, 2) and first.after(one).settled
    flipped = first.after(two)
    assert flipped == Stored(two, 2, 1) and not flipped.settled
    assert flipped.after(one) == Stored(one, 3, 1) and flipped.after(one).settled  # the last
    assert flipped.after(two).settled
    capped = Stored(one, autotune.MAX_TUNINGS, autotune.MAX_TUNINGS).after(one)
    assert capped == Stored(one, autotune.MAX_TUNINGS, autotune.MAX_TUNINGS)


def test_an_unsettled_choice_is_tuned_once_per_process(runtime, tmp_path):
    """A bucket whose tunings disagree is timed again by each new process, once, until the
    count settles it; its choice runs meanwhile for nothing more than that timing."""
    block = _block((ROWS, COLS))
    x = np.random.default_rng(4).normal(size=block.shape).astype(np.float32)
    runtime.release(runtime.run(block, [x])[0])
    reset_stats()
    for tunings in range(1, autotune.SETTLED_AFTER + 1):
        tuner = Tuner(runtime, tmp_path)
        pending = tuner.lookup(block)
        assert type(pending) is Pending
        # Each tuning is told another candidate won: they never agree.
        forced = UNFUSED if tunings % 2 else Choice("fused", 1)
        tuner._time = lambda fused, run_fused, run_unfused, c=forced: (c, {c: 1e-3})
        assert tuner.tune(pending, block, [x], _unfused(x)) == forced
        assert tuner.lookup(block) == forced  # no second tuning in this process
    assert stats()["tunings"] == autotune.SETTLED_AFTER
    assert Tuner(runtime, tmp_path).lookup(block) == forced  # settled by the count: the last


def test_small_and_huge_blocks_are_not_tuned(runtime, tmp_path):
    tuner = Tuner(runtime, tmp_path)
    assert tuner.lookup(_block((100, 100))) is None  # under PARALLEL_MIN: one thread, no timing
    assert tuner.lookup(_block((ROWS, COLS))) is not None
    assert tuner.lookup(_block((autotune.MAX_ELEMENTS,))) is not None
    assert tuner.lookup(_block((autotune.MAX_ELEMENTS + 1,))) is None  # too costly to time


@pytest.mark.parametrize(("elements", "timed"), [(autotune.MAX_TUNED_ELEMENTS - 1024, [1, 2]),
                                                 (autotune.MAX_TUNED_ELEMENTS, [2])])  # fmt: skip
def test_a_large_block_is_not_timed_on_fewer_threads(elements, timed, tmp_path):
    runtime = numba_runtime.NumbaRuntime(cache=tmp_path, threads=2)
    pending = Tuner(runtime, tmp_path).lookup(_block((elements // 1024, 1024)))
    assert type(pending) is Pending and list(pending.counts) == timed


def test_writers_merge_their_choices(runtime, tmp_path):
    first, second = Tuner(runtime, tmp_path), Tuner(runtime, tmp_path)
    a, b = _block((ROWS, COLS)), _block((ROWS * 4, COLS))
    pa, pb = first.lookup(a), second.lookup(b)  # both read the (empty) file first
    first._save(pa.entry, Stored(Choice("fused", 1), 2, 2))
    second._save(pb.entry, Stored(UNFUSED, 3, 1))
    reader = Tuner(runtime, tmp_path)
    assert reader.lookup(a) == Choice("fused", 1) and reader.lookup(b) == UNFUSED


def _entry(tuner: Tuner, block: ir.Block) -> str:
    pending = tuner.lookup(block)
    assert type(pending) is Pending
    tuner.forget()
    return pending.entry


def _document(tuner: Tuner, choices: object, **changes) -> str:
    fields = {"format": autotune.FORMAT, "version": autotune.VERSION, "machine": tuner.machine}
    return json.dumps({**fields, "choices": choices, **changes})


SETTLED = {"tunings": 2, "streak": 2}
HOSTILE_ENTRIES = {
    "unknown candidate": {"run": "os.system('echo owned')", "threads": 1, **SETTLED},
    "absurd threads": {"run": "fused", "threads": 10**9, **SETTLED},
    "more threads than the limit": {"run": "fused", "threads": 10**3, **SETTLED},
    "zero threads": {"run": "fused", "threads": 0, **SETTLED},
    "threads as text": {"run": "fused", "threads": "2", **SETTLED},
    "threads as bool": {"run": "fused", "threads": True, **SETTLED},
    "unfused with threads": {"run": "unfused", "threads": 2, **SETTLED},
    "extra field": {"run": "fused", "threads": 1, "code": "import os", **SETTLED},
    "no tuning counts (an older format)": {"run": "fused", "threads": 1},
    "tunings as bool": {"run": "fused", "threads": 1, "tunings": True, "streak": 1},
    "zero tunings": {"run": "fused", "threads": 1, "tunings": 0, "streak": 0},
    "streak above tunings": {"run": "fused", "threads": 1, "tunings": 1, "streak": 2},
    "absurd tunings": {"run": "fused", "threads": 1, "tunings": 10**9, "streak": 10**9},
    "counts as text": {"run": "fused", "threads": 1, "tunings": "2", "streak": "2"},
    "a list": ["fused", 1],
    "null": None,
}


@pytest.mark.parametrize("name", sorted(HOSTILE_ENTRIES))
def test_a_hostile_entry_is_ignored_and_the_valid_ones_are_kept(runtime, tmp_path, name):
    tuner = Tuner(runtime, tmp_path)
    bad, good = _block((ROWS, COLS)), _block((ROWS * 4, COLS))
    choices = {_entry(tuner, bad): HOSTILE_ENTRIES[name],
               _entry(tuner, good): {"run": "fused", "threads": 1, **SETTLED},
               "../../etc/passwd": {"run": "unfused", "threads": None}}  # fmt: skip
    tuner.path.write_text(_document(tuner, choices))
    reader = Tuner(runtime, tmp_path)
    assert type(reader.lookup(bad)) is Pending
    assert reader.lookup(good) == Choice("fused", 1)


def _hostile_files(tuner: Tuner, entry: str) -> dict[str, object]:
    valid = {entry: {"run": "unfused", "threads": None, **SETTLED}}
    return {
        "garbage bytes": b"\x00\xff\xfe garbage {",
        "not utf-8 json": b'{"format": "\xff"}',
        "a list": b"[1, 2, 3]",
        "deep nesting": b"[" * 100_000 + b"]" * 100_000,
        "huge": _document(tuner, valid).encode() + b" " * autotune.MAX_FILE_BYTES,
        "another version": _document(tuner, valid, version=autotune.VERSION + 1).encode(),
        "another machine": _document(tuner, valid, machine="x86_64-512cpu").encode(),
        "choices not an object": _document(tuner, [entry, "unfused"]).encode(),
        "huge integer": _document(tuner, {entry: {"run": "fused", "threads": 7, **SETTLED}})
        .replace('"threads": 7', '"threads": 1' + "0" * 5000)
        .encode(),
    }


HOSTILE_FILES = ["garbage bytes", "not utf-8 json", "a list", "deep nesting", "huge",
                 "another version", "another machine", "choices not an object", "huge integer",
                 "a directory", "a fifo"]  # fmt: skip


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_a_hostile_file_is_ignored_and_tuning_still_works(runtime, tmp_path, kind):
    tuner = Tuner(runtime, tmp_path)
    block = _block((ROWS, COLS))
    entry = _entry(tuner, block)
    if kind == "a directory":
        tuner.path.mkdir()
    elif kind == "a fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(tuner.path)
    else:
        tuner.path.write_bytes(_hostile_files(tuner, entry)[kind])
    reader = Tuner(runtime, tmp_path)
    pending = reader.lookup(block)
    assert type(pending) is Pending  # nothing in it was trusted
    x = np.random.default_rng(2).normal(size=block.shape).astype(np.float32)
    runtime.release(runtime.run(block, [x])[0])
    choice = reader.tune(pending, block, [x], _unfused(x))  # and a tuning never fails on it
    assert reader.lookup(block) == choice
    if kind not in ("a directory", "a fifo"):  # a regular file is replaced by a valid one
        again = Tuner(runtime, tmp_path).lookup(block)
        assert type(again) is Pending and again.earlier == Stored(choice)


def test_hostile_entries_for_real_blocks_leave_results_correct(runtime, monkeypatch):
    # The session's runtime (its own cache folder) under the fusion devices made here.
    monkeypatch.setitem(executor._shared, "numba", runtime)
    tuner = autotune.tuner_for(runtime)
    x = _data(3)
    eager = _chain(Tensor.from_data(x, ember.device("ndarray"))).to_data().to_numpy()

    def fused_chain() -> np.ndarray:
        fused = ember.device("ndarray").fusion(runtime="numba")
        return _chain(Tensor.from_data(x, fused)).to_data().to_numpy()

    fused_chain()  # tunes this run's blocks (unless an earlier test did), writing the file
    entries = json.loads(tuner.path.read_text())["choices"]
    # Every entry now says "fused on 1000 threads", beyond the limit its key names.
    limit = tuner.thread_limit()
    hostile = {e: {"run": "fused", "threads": 1000} for e in entries}
    tuner.path.write_text(_document(tuner, hostile))
    tuner.forget()
    reset_stats()
    np.testing.assert_allclose(fused_chain(), eager, rtol=RTOL, atol=ATOL)
    assert stats()["tunings"] >= 1  # the bad entries were ignored and timed again
    rewritten = json.loads(tuner.path.read_text())["choices"]
    assert all(rewritten[e]["threads"] in (None, *range(1, limit + 1)) for e in entries)


def test_autotune_off_tunes_nothing(monkeypatch):
    monkeypatch.setenv("EMBER_FUSION_AUTOTUNE", "0")
    runtime = runtime_named("numba")
    assert autotune.tuner_for(runtime) is None
    fused = ember.device("ndarray").fusion(runtime="numba")
    assert fused.backend.executor.tuner is None
    reset_stats()
    x = _data(4)
    got = _chain(Tensor.from_data(x, fused)).to_data().to_numpy()
    eager = _chain(Tensor.from_data(x, ember.device("ndarray"))).to_data().to_numpy()
    np.testing.assert_allclose(got, eager, rtol=RTOL, atol=ATOL)
    assert stats()["tunings"] == 0 and stats()["kernels"] >= 1


def test_the_interpreter_runtime_is_not_tuned():
    assert autotune.tuner_for(runtime_named("interpreter")) is None


_CHILD = textwrap.dedent("""
    import json, numpy as np, ember
    from ember import Tensor, activation
    from ember.backends.fusion import autotune, stats
    autotune.others_running = lambda: 0  # a quiet machine, whatever runs beside the suite
    x = np.random.default_rng(0).normal(size=(320, 256)).astype(np.float32)
    device = ember.device("ndarray").fusion(runtime="numba")
    y = activation.softmax(activation.gelu(Tensor.from_data(x, device)) * 3.0, 1)
    y = y.to_data().to_numpy().tolist()  # runs the stream
    print(json.dumps({"tunings": stats()["tunings"], "y": y}))
""")


def test_choices_persist_across_processes(tmp_path):
    env = {**os.environ, "EMBER_FUSION_CACHE": str(tmp_path), "EMBER_FUSION_AUTOTUNE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(ember.__file__).parents[1]),
                                          os.environ.get("PYTHONPATH", "")])}  # fmt: skip

    def child() -> dict:
        done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    first, second, third = child(), child(), child()
    assert first["tunings"] == 1  # the block of GELU and softmax
    assert second["tunings"] == 1  # its choice read from the file, and checked once more
    assert third["tunings"] <= 1  # settled if the two agreed; else checked a last time
    np.testing.assert_array_equal(np.array(second["y"]), np.array(first["y"]))
    assert list(tmp_path.glob("autotune-*.json"))


# ---------------------------------------------------------------------- single ops
def _conv_pool(t: Tensor, w: Tensor) -> Tensor:
    """A convolution, a max pool and an average pool: ops no fuser takes."""
    from ember.tensor import module

    h = module.conv2d(t, w, None, padding=(1, 1))
    return module.avg_pool2d(module.max_pool2d(h, (2, 2)), (3, 3), (1, 1), (1, 1))


def _images(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(8, 6, 24, 24)).astype(np.float32),
            rng.normal(size=(12, 6, 3, 3)).astype(np.float32))  # fmt: skip


@pytest.mark.parametrize("choice", CANDIDATES, ids=str)
def test_every_candidate_of_a_single_op_computes_the_inner_ops_values(choice):
    x, w = _images()
    eager = ember.device("ndarray")
    want = _conv_pool(Tensor.from_data(x, eager), Tensor.from_data(w, eager)).to_numpy()
    fused = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()
    with autotune.forcing(choice):
        got = _conv_pool(Tensor.from_data(x, fused), Tensor.from_data(w, fused)).to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert stats()["op_kernels"] == (0 if choice == UNFUSED else 3)


def test_a_single_op_is_tuned_once_per_bucket(runtime, monkeypatch, tmp_path):
    monkeypatch.setitem(executor._shared, "numba", runtime)
    monkeypatch.setitem(autotune._tuners, runtime, Tuner(runtime, tmp_path))
    fused = ember.device("ndarray").fusion(runtime="numba")
    eager = ember.device("ndarray")
    reset_stats()
    for seed in (1, 2):
        x, w = _images(seed)
        got = _conv_pool(Tensor.from_data(x, fused), Tensor.from_data(w, fused)).to_numpy()
        want = _conv_pool(Tensor.from_data(x, eager), Tensor.from_data(w, eager)).to_numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert stats()["tunings"] == 3  # conv, max pool, avg pool: on the first step only
    stored = json.loads(next(tmp_path.glob("autotune-*.json")).read_text())
    assert sum("/w" in entry for entry in stored["choices"]) == 3


def test_a_changed_kernel_source_voids_the_single_op_choices(runtime, monkeypatch, tmp_path):
    """A settled choice between a kernel and the inner op holds for the kernel source it
    was made with: an edited kernel (a faster one, say) is timed again."""
    key, work = ("conv2d", "float32", (8, 3, 3), True, ((1, 1), (0, 0), (1, 1), 1)), 1 << 24

    def slow_kernel(threads):
        time.sleep(0.002)

    for _ in range(2):  # two processes' tunings that agree settle the choice
        tuner = Tuner(runtime, tmp_path)
        pending = tuner.lookup_op(key, work)
        assert type(pending) is Pending
        assert tuner.tune_with(pending, slow_kernel, lambda: None) == UNFUSED
    assert Tuner(runtime, tmp_path).lookup_op(key, work) == UNFUSED  # settled: no timing
    monkeypatch.setattr(autotune, "_op_kernels_version", lambda: "an edited kernel")
    assert type(Tuner(runtime, tmp_path).lookup_op(key, work)) is Pending


def test_a_convolution_and_its_epilogue_are_tuned_as_a_pair(runtime, monkeypatch, tmp_path):
    from ember.tensor import module

    monkeypatch.setitem(executor._shared, "numba", runtime)
    monkeypatch.setitem(autotune._tuners, runtime, Tuner(runtime, tmp_path))
    timed = []
    original = Tuner.tune_with

    def tune_with(self, pending, run_fused, run_unfused, what=""):
        timed.append(what)
        return original(self, pending, run_fused, run_unfused, what)

    monkeypatch.setattr(Tuner, "tune_with", tune_with)
    fused = ember.device("ndarray").fusion(runtime="numba")
    eager = ember.device("ndarray")

    def block(x, w, device):
        h = module.conv2d(Tensor.from_data(x, device), Tensor.from_data(w, device), None,
                          padding=(1, 1))  # fmt: skip
        return activation.relu(h + Tensor.from_data(x[:, :1].repeat(12, 1), device))

    for seed in (1, 2):
        x, w = _images(seed)
        got = block(x, w, fused).to_numpy()
        np.testing.assert_allclose(got, block(x, w, eager).to_numpy(), rtol=1e-5, atol=1e-5)
    # Timed once, as the convolution with its residual add and relu, not the convolution
    # alone: NdArray's convolution would leave the add and the relu unfused.
    assert timed == ["conv2d with its epilogue"]
    stored = json.loads(next(tmp_path.glob("autotune-*.json")).read_text())
    assert len(stored["choices"]) == 1


def test_a_single_op_kernel_writes_into_the_pool():
    from ember.tensor import module

    x, w = _images(3)
    fused = ember.device("ndarray").fusion(runtime="numba")
    pool = runtime_named("numba").pool
    xt, wt = Tensor.from_data(x, fused), Tensor.from_data(w, fused)
    want = module.conv2d(Tensor.from_data(x, ember.device("ndarray")),
                         Tensor.from_data(w, ember.device("ndarray")), None, padding=(1, 1))  # fmt: skip
    with autotune.forcing(Choice("fused", 1)):
        y = module.conv2d(xt, wt, None, padding=(1, 1))
        np.testing.assert_allclose(y.to_numpy(), want.to_numpy(), rtol=1e-5, atol=1e-5)
        del y
        misses, hits = pool.misses, pool.hits
        for _ in range(3):  # each result dropped: the next one takes its buffer back
            y = module.conv2d(xt, wt, None, padding=(1, 1))
            np.testing.assert_allclose(y.to_numpy(), want.to_numpy(), rtol=1e-5, atol=1e-5)
            del y
    assert pool.misses == misses and pool.hits >= hits + 3
