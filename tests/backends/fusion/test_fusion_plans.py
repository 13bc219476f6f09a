"""The plan store: plans and templates round-trip as plain data, a new process with the
same cache folder explores and compiles nothing, and a hostile plan file is ignored (the
run explores anew and stays exact) without an exception or a wrong result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import Tensor, activation
from ember.backends.fusion import explorer as explorer_module
from ember.backends.fusion import plans, reset_stats, stats
from ember.backends.fusion.elementwise import Template
from ember.backends.fusion.explorer import clear_plans, plan_from_state, plan_to_state
from ember.backends.fusion.ir import StateError


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    """A private cache folder with the store on; memory caches empty before and after."""
    monkeypatch.setenv("EMBER_FUSION_CACHE", str(tmp_path))
    monkeypatch.delenv("EMBER_FUSION_PLANS", raising=False)
    clear_plans(on_disk=False)
    yield tmp_path
    clear_plans(on_disk=False)


def _step(device, n: int = 3) -> np.ndarray:
    """One flush: a fused chain ending in a reduction, an unfused matmul, a fused softmax."""
    rng = np.random.default_rng(n)
    x = Tensor.from_data(rng.normal(size=(n, 6)).astype(np.float32), device)
    w = Tensor.from_data(rng.normal(size=(6, 4)).astype(np.float32), device)
    h = (x * 2.0 + 1.0).tanh()
    return activation.softmax(h.matmul(w) * h.sum_dim(1), 1).to_data().to_numpy()


@pytest.fixture
def device() -> ember.Device:
    return ember.device("ndarray").fusion(runtime="interpreter")


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("plans/*/*/*.json"))


def test_plans_and_templates_round_trip_as_plain_data(store, device):
    _step(device)
    assert explorer_module._plans and explorer_module._built
    for key, plan in explorer_module._plans.items():
        state = json.loads(json.dumps(plan_to_state(plan)))
        assert plan_from_state(state, len(key[1]), 2) == plan
    templates = [t for built in explorer_module._built.values() for _, _, t in built if t]
    assert len(templates) == 2 and any(t.axis is not None for t in templates)
    for template in templates:
        state = json.loads(json.dumps(template.to_state()))
        again = Template.from_state(state)
        assert again == template and again.out_positions == template.out_positions
    assert len(_entries(store)) == 1
    key = next(iter(explorer_module._built))
    stored = plans.load(key, len(key[1]), 2)
    assert stored.plan == explorer_module._plans[key]
    assert stored.templates == explorer_module._built[key]


_SCRIPT = """
import json, sys
import numpy as np
import ember
from ember import Tensor, activation
from ember.backends.fusion import plans, stats
from ember.backends.fusion.executor import runtime_named

device = ember.device("ndarray").fusion()  # EMBER_FUSION_RUNTIME, else numba
def step(n):
    rng = np.random.default_rng(n)
    x = Tensor.from_data(rng.normal(size=(n, 6)).astype(np.float32), device)
    w = Tensor.from_data(rng.normal(size=(6, 4)).astype(np.float32), device)
    h = (x * 2.0 + 1.0).tanh()
    loss = activation.softmax(h.matmul(w) * h.sum_dim(1), 1)
    return [loss.to_data().to_numpy().tolist(), h.mean().to_data().to_numpy().tolist()]
results = [step(3), step(5)]
runtime = getattr(runtime_named(), "stats", None)
print(json.dumps({"stats": stats(), "plans": plans.stats(), "results": results,
                  "compiled": getattr(runtime, "compiled", None),
                  "disk_hits": getattr(runtime, "disk_hits", None)}))
"""


def _run(cache: Path, **env: str) -> dict:
    environ = {**os.environ, "EMBER_FUSION_CACHE": str(cache), "PYTHONPATH": ":".join(sys.path),
               "OMP_NUM_THREADS": "1"}  # fmt: skip
    environ.pop("EMBER_FUSION_PLANS", None)
    environ.pop("EMBER_FUSION_RUNTIME", None)
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=environ, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_process_with_the_same_cache_explores_and_compiles_nothing(tmp_path):
    pytest.importorskip("numba")
    first = _run(tmp_path)
    assert first["stats"]["explorations"] > 0 and first["compiled"] > 0
    assert first["plans"]["written"] == first["stats"]["explorations"]
    second = _run(tmp_path)
    assert second["stats"]["explorations"] == 0 and second["compiled"] == 0
    assert second["plans"]["loaded"] == first["plans"]["written"] and second["disk_hits"] > 0
    assert second["stats"]["kernels"] == first["stats"]["kernels"]
    assert second["results"] == first["results"]
    # The switch (on the interpreter runtime: nothing to load, and plans do not depend on it)
    off = _run(tmp_path, EMBER_FUSION_PLANS="0", EMBER_FUSION_RUNTIME="interpreter")
    assert off["stats"]["explorations"] == first["stats"]["explorations"]
    assert off["plans"] == {"loaded": 0, "ignored": 0, "written": 0}


def test_processes_writing_the_same_plans_at_once_leave_valid_entries(tmp_path):
    environ = {**os.environ, "EMBER_FUSION_CACHE": str(tmp_path), "PYTHONPATH": ":".join(sys.path),
               "EMBER_FUSION_RUNTIME": "interpreter", "OMP_NUM_THREADS": "1"}  # fmt: skip
    environ.pop("EMBER_FUSION_PLANS", None)
    writers = [subprocess.Popen([sys.executable, "-c", _SCRIPT], env=environ, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for _ in range(3)]  # fmt: skip
    outs = [json.loads(w.communicate(timeout=300)[0].strip().splitlines()[-1]) for w in writers]
    # Each plan was explored, or loaded from a writer that was quicker; none was unreadable.
    planned = {o["stats"]["explorations"] + o["plans"]["loaded"] for o in outs}
    assert len(planned) == 1 and planned.pop() > 0
    assert all(o["plans"]["ignored"] == 0 and o["results"] == outs[0]["results"] for o in outs)
    assert not list(tmp_path.rglob("*.tmp"))  # no temporaries left behind
    reader = _run(tmp_path, EMBER_FUSION_RUNTIME="interpreter")
    assert reader["stats"]["explorations"] == 0 and reader["plans"]["ignored"] == 0
    assert reader["results"] == outs[0]["results"]


def _tamper(entry: Path, change) -> None:
    data = json.loads(entry.read_text())
    change(data)
    entry.write_text(json.dumps(data))


def _body(data: dict, index: int = 0) -> list:
    return data["templates"][0]["body"][index]


def _longer_segment(data: dict) -> None:
    data["plan"] = [[0, 5, 1], [5, 6, 1]]
    first = data["templates"][0]
    first["body"].append(["exp", [4], None])
    data["templates"] = [first, data["templates"][2]]


ATTACKS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "garbage bytes": lambda p: p.write_bytes(bytes(range(256)) * 8),
    "empty": lambda p: p.write_bytes(b""),
    "nan and deep nesting": lambda p: p.write_text("[" * 100000 + "NaN" + "]" * 100000),
    "wrong top type": lambda p: p.write_text("[1, 2, 3]"),
    "plan of strings": lambda p: _tamper(p, lambda d: d.update(plan=[["0", "4", "1"]])),
    "bool as int": lambda p: _tamper(p, lambda d: d["plan"][0].__setitem__(0, False)),
    "plan gap": lambda p: _tamper(p, lambda d: d["plan"][1].__setitem__(0, 7)),
    "fuser out of range": lambda p: _tamper(p, lambda d: d["plan"][0].__setitem__(2, 9)),
    "register out of range": lambda p: _tamper(p, lambda d: _body(d, 1).__setitem__(1, [99])),
    "negative register": lambda p: _tamper(p, lambda d: _body(d, 1).__setitem__(1, [-1])),
    "input slot out of range": lambda p: _tamper(
        p, lambda d: d["templates"][0].__setitem__("inputs", [[0, 5]])
    ),
    "output out of range": lambda p: _tamper(
        p, lambda d: d["templates"][0].__setitem__("outputs", [3, 400])
    ),
    "unknown op": lambda p: _tamper(p, lambda d: _body(d).__setitem__(0, "__import__")),
    "op the fuser never takes": lambda p: _tamper(p, lambda d: _body(d).__setitem__(0, "matmul")),
    # Valid in every field, but not what the fusers make of the records: exp, not tanh.
    "another op": lambda p: _tamper(p, lambda d: _body(d, 2).__setitem__(0, "exp")),
    # A fused segment over the matmul, with a template that validates: the fuser stops short.
    "a segment too long": lambda p: _tamper(p, _longer_segment),
    "rank too high": lambda p: _tamper(p, lambda d: d["templates"][0].__setitem__("rank", 10**9)),
    "old version": lambda p: _tamper(p, lambda d: d.update(version="v0-old")),
    "another key (collision)": lambda p: _tamper(
        p, lambda d: d["key"][1][0].__setitem__(0, "float_mul")
    ),
    "huge file": lambda p: p.write_bytes(p.read_bytes() + b" " * plans.MAX_FILE_BYTES),
    "a directory": lambda p: (p.unlink(), p.mkdir()),
    "a pipe": lambda p: (p.unlink(), os.mkfifo(p)),
    "a link": lambda p: (p.rename(p.with_suffix(".real")), p.symlink_to(p.with_suffix(".real"))),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_hostile_plan_file_is_ignored_and_the_run_stays_exact(attack, store, device, monkeypatch,
                                                                capfd):  # fmt: skip
    if attack == "a pipe" and not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    expected = _step(ember.device("ndarray"))
    assert np.array_equal(_step(device), expected)
    (entry,) = _entries(store)
    ATTACKS[attack](entry)
    clear_plans(on_disk=False)  # a new process, as far as the plan caches can tell
    monkeypatch.setenv("EMBER_FUSION_DEBUG", "1")
    reset_stats()
    ignored = plans.stats()["ignored"]
    got = _step(device)
    assert np.array_equal(got, expected)
    assert stats()["explorations"] == 1 and stats()["kernels"] == 2
    assert plans.stats()["ignored"] > ignored  # read and refused (a directory: not rewritten)
    assert "ignored" in capfd.readouterr().err


def test_an_ignored_entry_is_rewritten_and_then_adopted(store, device):
    expected = _step(ember.device("ndarray"))
    _step(device)
    (entry,) = _entries(store)
    ATTACKS["another op"](entry)
    clear_plans(on_disk=False)
    _step(device)  # ignores the entry, explores, writes it again
    clear_plans(on_disk=False)
    reset_stats()
    loaded = plans.stats()["loaded"]
    assert np.array_equal(_step(device), expected)
    assert stats()["explorations"] == 0 and plans.stats()["loaded"] == loaded + 1


def test_state_errors_name_what_is_wrong():
    with pytest.raises(StateError, match="covers 4 records of 5"):
        plan_from_state([[0, 4, 0]], 5, 2)
    with pytest.raises(StateError, match="reads register 3"):
        Template.from_state({"rank": 1, "axis": None, "inputs": [[0, 0]],
                             "body": [["exp", [3], None]], "outputs": [1]})  # fmt: skip
    with pytest.raises(StateError, match="no op the fuser takes"):
        Template.from_state({"rank": 1, "axis": None, "inputs": [[0, 0]],
                             "body": [["conv2d", [0], None]], "outputs": [1]})  # fmt: skip


def test_the_store_off_reads_and_writes_nothing(store, device, monkeypatch):
    _step(device)
    (entry,) = _entries(store)
    entry.unlink()
    monkeypatch.setenv("EMBER_FUSION_PLANS", "0")
    clear_plans(on_disk=False)
    _step(device)
    assert _entries(store) == []
    monkeypatch.delenv("EMBER_FUSION_PLANS")
    clear_plans(on_disk=False)
    _step(device)  # written again, now that the store is on
    monkeypatch.setenv("EMBER_FUSION_PLANS", "0")
    clear_plans(on_disk=False)
    reset_stats()
    loaded = plans.stats()["loaded"]
    _step(device)
    assert stats()["explorations"] == 1 and plans.stats()["loaded"] == loaded


def test_plans_live_in_the_kernels_cache_folder(monkeypatch):
    monkeypatch.setenv("EMBER_FUSION_CACHE", "/x/y")  # cache_dir's other sources: test_cache_folder
    assert plans.folder().parent == Path("/x/y/plans")
