"""The machine's choice of loop shape for one-loop element-wise kernels (numba_prefetch):
the variable, the probe and its settling, the file as an attacker would write it, and the
runtime compiling the shape chosen."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from ember.backend.errors import ConfigError
from ember.backends.fusion import autotune, ir
from ember.backends.fusion import numba_runtime as nr
from ember.tensor.dtype import DType

if not nr.available():
    pytest.skip("numba is not installed (pip install 'ember[jit]')", allow_module_level=True)

from ember.backends.fusion import numba_prefetch
from ember.backends.fusion.numba_prefetch import prefetching

F32, F64, I32 = DType.F32, DType.F64, DType.I32


@pytest.fixture(autouse=True)
def probing(monkeypatch):
    """Each test starts with no answer in the process and the variable unset (the suite
    sets it to 0), with a probe small enough to be quick."""
    monkeypatch.delenv("EMBER_FUSION_PREFETCH", raising=False)
    monkeypatch.delenv("EMBER_FUSION_AUTOTUNE", raising=False)
    monkeypatch.setattr(numba_prefetch, "PROBE_ELEMENTS", 1 << 14)
    numba_prefetch.forget()
    yield
    numba_prefetch.forget()


def choice_file(folder):
    return folder / f"prefetch-{autotune.machine()}.json"


def scripted(monkeypatch, timings):
    """Makes probes return ``timings`` (plain, runs) in turn; returns the list of probes made."""
    made = []

    def probe(load):
        made.append(load)
        return timings[len(made) - 1]

    monkeypatch.setattr(numba_prefetch, "_probe", probe)
    return made


def no_loader(source):
    raise AssertionError("nothing may be compiled here")


@pytest.mark.parametrize(("value", "want"), [("1", True), ("0", False), (" 1 ", True)])
def test_the_variable_chooses_without_timing(monkeypatch, tmp_path, value, want):
    monkeypatch.setenv("EMBER_FUSION_PREFETCH", value)
    made = scripted(monkeypatch, [])
    assert prefetching(tmp_path, no_loader) is want
    assert made == [] and not choice_file(tmp_path).exists()


@pytest.mark.parametrize("value", ["yes", "2", "true", "-1"])
def test_another_value_of_the_variable_is_a_config_error_naming_it(monkeypatch, tmp_path, value):
    monkeypatch.setenv("EMBER_FUSION_PREFETCH", value)
    with pytest.raises(ConfigError, match=rf"EMBER_FUSION_PREFETCH='{value}'"):
        prefetching(tmp_path, no_loader)


def test_without_tuning_the_plain_loop_runs_untimed(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_FUSION_AUTOTUNE", "0")
    made = scripted(monkeypatch, [])
    assert prefetching(tmp_path, no_loader) is False
    assert made == [] and not choice_file(tmp_path).exists()


def test_a_probe_times_both_shapes_and_writes_what_it_chose(runtime, tmp_path):
    """The real probe: both kernels compiled by the runtime's loader, an add timed; the
    file holds the choice, made once in the process."""
    chosen = prefetching(tmp_path, runtime._module)
    stored = json.loads(choice_file(tmp_path).read_text())
    assert stored == {"format": "ember-fusion-prefetch", "version": 1,
                      "machine": autotune.machine(), "prefetch": chosen, "probes": 1,
                      "streak": 1}  # fmt: skip
    assert prefetching(tmp_path, no_loader) is chosen  # the process's answer: no probe


def test_the_probe_returns_the_plain_loop_first_then_the_runs(runtime):
    """The order of ``_probe``'s pair is what ``_decide`` reads."""
    sources = []

    def load(source):
        sources.append(source)
        return runtime._module(source)

    plain, runs = numba_prefetch._probe(load)
    assert "prefetch_read(in0" not in sources[0] and "prefetch_read(in0" in sources[1]
    assert plain > 0 and runs > 0


@pytest.mark.parametrize(("plain", "runs", "want"), [
    (1.0, 0.5, True), (1.0, 0.9, True), (1.0, 0.91, False), (1.0, 1.0, False),
    (1.0, 2.0, False)])  # fmt: skip
def test_the_runs_must_win_clearly(monkeypatch, tmp_path, plain, runs, want):
    scripted(monkeypatch, [(plain, runs)])
    assert prefetching(tmp_path, no_loader) is want
    assert json.loads(choice_file(tmp_path).read_text())["prefetch"] is want


def test_later_processes_probe_until_two_agree(monkeypatch, tmp_path):
    """Each ``forget`` stands for a new process reading the file."""
    made = scripted(monkeypatch, [(1.0, 0.5), (1.0, 1.5), (1.0, 1.2)])
    seen = []
    for _ in range(4):
        numba_prefetch.forget()
        chosen = prefetching(tmp_path, no_loader)
        stored = json.loads(choice_file(tmp_path).read_text())
        seen.append((chosen, stored["prefetch"], stored["probes"], stored["streak"]))
    assert seen == [(True, True, 1, 1), (False, False, 2, 1), (False, False, 3, 2),
                    (False, False, 3, 2)]  # fmt: skip
    assert len(made) == 3  # the fourth read a settled choice


def test_a_choice_stands_after_three_probes_even_without_agreement(monkeypatch, tmp_path):
    made = scripted(monkeypatch, [(1.0, 0.5), (1.0, 1.5), (1.0, 0.5)])
    for _ in range(4):
        numba_prefetch.forget()
        last = prefetching(tmp_path, no_loader)
    stored = json.loads(choice_file(tmp_path).read_text())
    assert (last, stored["probes"], stored["streak"], len(made)) == (True, 3, 1, 3)


def test_a_probe_beside_other_processes_is_kept_but_not_written(monkeypatch, tmp_path):
    monkeypatch.setattr(autotune, "others_running", lambda: autotune.BUSY_OTHERS)
    made = scripted(monkeypatch, [(1.0, 0.5), (1.0, 0.5)])
    assert prefetching(tmp_path, no_loader) is True
    assert prefetching(tmp_path, no_loader) is True  # kept for the process
    assert not choice_file(tmp_path).exists() and len(made) == 1
    numba_prefetch.forget()
    monkeypatch.setattr(autotune, "others_running", lambda: 0)
    assert prefetching(tmp_path, no_loader) is True
    assert json.loads(choice_file(tmp_path).read_text())["probes"] == 1


def test_a_failing_probe_keeps_the_plain_loop_and_writes_nothing(tmp_path):
    def broken(source):
        raise RuntimeError("no compiler here")

    assert prefetching(tmp_path, broken) is False
    assert not choice_file(tmp_path).exists()


def test_a_cache_folder_that_cannot_be_written_keeps_the_choice_for_the_process(
        monkeypatch, tmp_path):  # fmt: skip
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way of a folder")
    scripted(monkeypatch, [(1.0, 0.5)])
    assert prefetching(blocker / "cache", no_loader) is True


def settled(**changes):
    document = {"format": "ember-fusion-prefetch", "version": 1, "machine": autotune.machine(),
                "prefetch": True, "probes": 2, "streak": 2}  # fmt: skip
    document.update(changes)
    return json.dumps(document).encode()


HOSTILE = {
    "not json": b"\x00\xff{",
    "a list": b"[]",
    "nested deep": b"[" * 100_000 + b"]" * 100_000,
    "another format": settled(format="ember-fusion-autotune"),
    "another version": settled(version=2),
    "a float version": settled(version=1.0),
    "another machine": settled(machine="x86_64-64cpu-other"),
    "a string choice": settled(prefetch="true"),
    "an int choice": settled(prefetch=1),
    "bool probes": settled(probes=True, streak=True),
    "no streak": settled(streak=0),
    "streak over probes": settled(probes=2, streak=3),
    "absurd probes": settled(probes=10**12, streak=10**12),
    "a float streak": settled(streak=2.0),
    "an extra field": settled(command="rm -rf /"),
    "a missing field": json.dumps({"format": "ember-fusion-prefetch", "version": 1}).encode(),
    "too large": b" " * (autotune.MAX_FILE_BYTES + 1) + settled(),
}


@pytest.mark.parametrize("payload", list(HOSTILE), ids=list(HOSTILE))
def test_a_hostile_or_stale_file_is_ignored_and_probed_anew(monkeypatch, tmp_path, payload):
    """Its fields would have said runs (settled); the probe says the plain loop, which is
    what runs and what the rewritten file holds."""
    choice_file(tmp_path).write_bytes(HOSTILE[payload])
    made = scripted(monkeypatch, [(1.0, 2.0)])
    assert prefetching(tmp_path, no_loader) is False and len(made) == 1
    assert json.loads(choice_file(tmp_path).read_text())["probes"] == 1


def test_the_file_is_trusted_as_it_should_be(monkeypatch, tmp_path):
    """The same valid file is read without a probe (the control for the hostile cases)."""
    choice_file(tmp_path).write_bytes(settled())
    made = scripted(monkeypatch, [])
    assert prefetching(tmp_path, no_loader) is True and made == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_file_that_is_not_a_regular_file_never_blocks(monkeypatch, tmp_path, kind):
    path = choice_file(tmp_path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    scripted(monkeypatch, [(1.0, 0.5)])
    assert prefetching(tmp_path, no_loader) is True


def gelu(shape, dtype):
    def op(name, args, attrs):
        return ir.Instr(name, args, attrs, shape, dtype)

    return ir.Block(shape, (ir.Input(shape, dtype),), (
        op("div_scalar", (0,), (math.sqrt(2.0),)), op("erf", (1,), ()),
        op("add_scalar", (2,), (1.0,)), op("mul", (0, 3), ()), op("mul_scalar", (4,), (0.5,))),
        (5,))  # fmt: skip


@pytest.mark.parametrize("dtype", [F32, F64, I32])
def test_the_runtime_compiles_the_shape_chosen_and_both_compute_alike(monkeypatch, tmp_path,
                                                                      dtype):  # fmt: skip
    shape = (200_003,)  # parts on three threads, each runs of 16 and a tail
    if dtype is I32:
        block = ir.Block(shape, (ir.Input(shape, dtype), ir.Input(shape, dtype)),
                         (ir.Instr("mul", (0, 1), (), shape, dtype),
                          ir.Instr("add_scalar", (2,), (7,), shape, dtype)), (3,))  # fmt: skip
        rng = np.random.default_rng(0)
        inputs = [rng.integers(-1000, 1000, shape).astype(np.int32) for _ in range(2)]
    else:
        block = gelu(shape, dtype)
        x = np.random.default_rng(1).standard_normal(shape)
        inputs = [x.astype(np.float32 if dtype is F32 else np.float64)]
    results = {}
    for value in ("0", "1"):
        monkeypatch.setenv("EMBER_FUSION_PREFETCH", value)
        runtime = nr.NumbaRuntime(cache=tmp_path, threads=3)
        assert runtime.prefetches() is (value == "1")
        source = runtime.kernel(block).source_path.read_text()
        assert ("prefetch_read(in0" in source) is (value == "1")
        results[value] = runtime.run(block, inputs)[0]
    np.testing.assert_array_equal(results["0"], results["1"])
