"""Shared fixtures of the fusion tests: one numba runtime per test session, its kernels
cached in a folder of this run only (so each run compiles what it tests, once)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ember.backends.fusion.interpreter import InterpreterRuntime

sys.path.insert(0, str(Path(__file__).parent))  # the tests' helper modules (conv_cases)


class CountingRuntime:
    """The interpreter, counting the blocks it runs."""

    def __init__(self) -> None:
        self.inner = InterpreterRuntime()
        self.blocks = 0

    def run(self, block, inputs, outputs=None):
        self.blocks += 1
        return self.inner.run(block, inputs, outputs)


@pytest.fixture
def counting_runtimes():
    """Two counting interpreter runtimes, for devices that must keep their blocks apart."""
    return CountingRuntime(), CountingRuntime()


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fusion-kernels")


@pytest.fixture(scope="session")
def runtime(kernel_cache):
    numba_runtime = pytest.importorskip("ember.backends.fusion.numba_runtime")
    if not numba_runtime.available():
        pytest.skip("numba is not installed (pip install 'ember[jit]')")
    return numba_runtime.NumbaRuntime(cache=kernel_cache)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """Tunings count as timed on a quiet machine (the suite's own shards run side by side:
    ``autotune.others_running`` would see them); the test of a busy one says so itself."""
    from ember.backends.fusion import autotune

    monkeypatch.setattr(autotune, "others_running", lambda: 0)
