"""Settings shared by every test: Hypothesis profiles sized for CI, where compiled fusion
kernels go, the garbage collector's settings, the CUDA cases left out where there is no
GPU, ``--shard`` (``sharding.py``) and ``log_records``, which stands in for ``caplog``."""

import gc
import logging
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))
import sharding
from sharding import pytest_addoption  # noqa: F401 - the --shard option

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=15, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config) -> None:
    sharding.record_durations(config)
    # Fused kernels compiled by the tests go to one folder of this run, shared by the xdist
    # workers (they inherit the variable), never to the user's cache.
    if "EMBER_FUSION_CACHE" not in os.environ:
        import tempfile

        os.environ["EMBER_FUSION_CACHE"] = tempfile.mkdtemp(prefix="ember-fusion-kernels-")
    # Triton's binaries (GPU kernels, and those compiled for a GPU target to check them on
    # a machine without one) likewise.
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.environ["EMBER_FUSION_CACHE"], "triton"))
    # Writing each explored plan to disk costs an fsync; tests/backends/fusion/
    # test_fusion_plans.py turns the store on where it is under test.
    os.environ.setdefault("EMBER_FUSION_PLANS", "0")
    # The suites' tensors are small: by default a fusion device would run nearly all of their
    # ops at once, unrecorded. Recording every op keeps the suites on the lazy path (stream,
    # fusers, kernels); tests/backends/fusion/test_fusion_small.py tests the default.
    os.environ.setdefault("EMBER_FUSION_SMALL", "0")
    # Launches on numba's threads (the default) have their launchers compiled by a process
    # of their own: one per test worker would compete with the tests for the cores.
    # tests/backends/fusion/test_numba_parallel.py turns them on where they are under test.
    os.environ.setdefault("EMBER_FUSION_WORKERS", "ember")
    # Element-wise kernels take the plain loop without timing the machine (a probe would
    # compile kernels in processes that tests expect to compile nothing, and time them on
    # cores the suite's shards share): tests/backends/fusion/test_numba_prefetch.py tests the
    # probe, and the runtime's tests run both loop shapes.
    os.environ.setdefault("EMBER_FUSION_PREFETCH", "0")


def pytest_collection_finish(session) -> None:
    # The collected items (over a million objects) live the whole run: frozen, they are no
    # longer walked by every later collection, automatic or a test's own gc.collect() (a
    # second each in a process that collected the whole suite). Tests make many short-lived
    # objects: collecting the young generation every 20,000 allocations instead of 700
    # cut the conformance suite's time in the collector from 9 s to 3 s (and its wall time
    # by a fifth); tests that need garbage gone call gc.collect() themselves.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def _cuda_kind(value: object) -> bool:
    """Whether a test parameter names a device kind on CUDA (``torch-cuda``,
    ``autodiff-fusion-torch-cuda``, ...)."""
    return isinstance(value, str) and value.endswith("-cuda")


def _has_cuda() -> bool:
    try:
        import ember

        return ember.device_count("torch", "cuda") > 0
    except Exception:  # torch missing or broken: no GPU as far as the tests go
        return False


_LEFT_OUT: list[int] = []


def pytest_collection_modifyitems(config, items) -> None:
    _leave_out_cuda_cases(config, items)
    sharding.select(config, items)


def _leave_out_cuda_cases(config, items) -> None:
    # Each suite runs its cases once per device kind; without a GPU the CUDA kinds' cases
    # (some 15,000) would each be collected, run and reported as a skip. They are left out
    # here instead, and the summary says so once.
    def on_cuda(item) -> bool:
        params = getattr(getattr(item, "callspec", None), "params", {})
        return any(_cuda_kind(value) for value in params.values())

    left = [item for item in items if on_cuda(item)]
    if not left or _has_cuda():
        return
    items[:] = [item for item in items if not on_cuda(item)]
    config.hook.pytest_deselected(items=left)
    _LEFT_OUT.append(len(left))
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker (-n): tell the controller
        config.workeroutput["cuda_left_out"] = len(left)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    left = getattr(node, "workeroutput", {}).get("cuda_left_out")
    if left and not _LEFT_OUT:
        _LEFT_OUT.append(left)


def pytest_terminal_summary(terminalreporter) -> None:
    if _LEFT_OUT:
        terminalreporter.write_line(
            f"{_LEFT_OUT[0]} CUDA cases (torch-cuda and the decorators over it) were not run: "
            "no CUDA device (torch sees no GPU)"
        )


class LogRecords(logging.Handler):
    """The records logged while a test runs (see :func:`log_records`)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def text(self) -> str:
        return "\n".join(record.getMessage() for record in self.records)


@pytest.fixture
def log_records():
    """What ``caplog`` gives, for the few tests that read log records.

    pytest's logging plugin is off (``-p no:logging`` in pyproject.toml): in every phase
    of every test it attached its handlers to each non-propagating logger, and torch
    alone makes 43 of them, about half a millisecond a test over some 48,000 tests.
    """
    handler = LogRecords()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
