"""Launches on numba's threads (``numba_parallel``): the same results as the runtime's own
workers for every kind of kernel, launchers kept on disk, and where they are not used."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")

from test_numba_runtime import gelu_block, softmax_block

from ember.backend.errors import ConfigError
from ember.backend.options import ConvOptions, PoolOptions
from ember.backends.fusion import (
    numba_attention,
    numba_conv,
    numba_gemm,
    numba_parallel,
    numba_pool,
)
from ember.backends.fusion import numba_runtime as nr


@pytest.fixture
def on_numbas_threads(monkeypatch):
    """Turns launches on numba's threads on (the suite keeps them off); skips where this
    numba's threading layer cannot take them. Yields the launches it ran, by kernel."""
    monkeypatch.setenv("EMBER_FUSION_WORKERS", "numba")
    monkeypatch.setitem(numba_parallel._state, "enabled", None)
    if not numba_parallel.enabled():
        pytest.skip("numba's threading layer here is neither OpenMP nor TBB")
    launched: list = []
    run = numba_parallel.run

    def counted(kernel, args, parts, threads, calls=None):
        ran = run(kernel, args, parts, threads, calls)
        launched.append((kernel.py_func.__name__, parts, threads, ran))
        return ran

    monkeypatch.setattr(numba_parallel, "run", counted)
    return launched


def _both(compute):
    """``compute()`` on the runtime's workers, then on numba's threads: the first call
    there asks the compiler process for its launchers (and runs on the workers), the
    next one loads them."""
    numba_parallel._state["enabled"] = False
    workers = compute()
    numba_parallel._state["enabled"] = True
    np.testing.assert_array_equal(compute(), workers)
    numba_parallel.wait()
    return workers, compute()


_RNG = np.random.default_rng(3)


def _data(*shape):
    return _RNG.standard_normal(shape).astype(np.float32)


def test_blocks_run_on_numbas_threads_as_on_the_workers(on_numbas_threads):
    runtime = nr.NumbaRuntime()
    x = _data(600, 1024)  # 2 threads, parts of at least PART_ELEMENTS: two a thread
    for block in (gelu_block(x.shape), softmax_block(x.shape, 1)):
        runtime.run(block, [x], threads=1)  # compiles
        on_numbas_threads.clear()
        workers, threads = _both(lambda block=block: runtime.run(block, [x], threads=2)[0])
        np.testing.assert_array_equal(threads, workers)
        assert [ran for *_, ran in on_numbas_threads][-1], on_numbas_threads
        assert on_numbas_threads[-1][1:3] == (4, 2)  # 4 parts handed out on 2 threads


def test_single_op_kernels_run_on_numbas_threads_as_on_the_workers(on_numbas_threads):
    a, b = _data(96, 200), _data(200, 72)  # few rows: threads share B's panels
    tall = _data(numba_gemm.PANELS_MAX_ROWS + 40, 200)  # more: they claim strips
    x, w = _data(4, 8, 20, 20), _data(16, 8, 3, 3)
    q, k, v = _data(2, 4, 64, 16), _data(2, 4, 64, 16), _data(2, 4, 64, 16)
    options = ConvOptions((2, 2), (1, 1), (1, 1), 1)
    pool = PoolOptions((2, 2), (2, 2), (0, 0), (1, 1))
    cases = {
        "_across_panels": lambda: numba_gemm.matmul(a, b, threads=2),
        "_tiles": lambda: numba_gemm.matmul(tall, b, threads=2),
        "_conv_tiled": lambda: numba_conv.conv2d(x, w, None, options, threads=2),
        "_max_pool": lambda: numba_pool.max_pool2d_with_indices(x, pool, threads=2)[0],
        "_attend": lambda: numba_attention.attention(q, k, v, 0.25, threads=2),
    }
    for name, compute in cases.items():
        on_numbas_threads.clear()
        workers, threads = _both(compute)
        np.testing.assert_array_equal(threads, workers, err_msg=name)
        assert (name, True) in [(n, ran) for n, *_, ran in on_numbas_threads], (
            name, on_numbas_threads)  # fmt: skip
        assert not numba_parallel._broken
    want = a.astype(np.float64) @ b
    np.testing.assert_allclose(numba_gemm.matmul(a, b, threads=2), want, rtol=1e-4, atol=1e-4)


def test_a_kernel_made_at_run_time_runs_on_the_workers(on_numbas_threads):
    import numba

    @numba.njit(nogil=True)
    def double(x, out, part, parts):  # not an attribute of its module: no launcher
        n = x.shape[0]
        for i in range(n * part // parts, n * (part + 1) // parts):
            out[i] = 2.0 * x[i]

    x = _data(1000)
    out = np.zeros_like(x)
    nr._run_parts(double, [x, out], 4, 2)
    np.testing.assert_array_equal(out, 2.0 * x)
    assert on_numbas_threads == [("double", 4, 2, False)]
    assert numba_parallel.launcher(double, 2) is None


def test_a_kernels_code_is_found_by_its_arguments_and_called_at_its_address():
    import numba

    @numba.njit("void(float32[:], float32[:], int64, int64)", nogil=True)
    def doubled(x, out, part, parts):  # compiled for A-layout arrays only
        n = x.shape[0]
        for i in range(n * part // parts, n * (part + 1) // parts):
            out[i] = 2.0 * x[i]

    @numba.njit(nogil=True)
    def tripled(x, out, part, parts):  # compiled on its first call, for what it gets
        for i in range(x.shape[0]):
            out[i] = 3.0 * x[i]

    x = _data(1000)
    out = np.zeros_like(x)
    address, types = numba_parallel._address(doubled, [x, out])  # C arrays: the A overload
    assert address is not None and types == doubled.nopython_signatures[0].args

    @numba.njit(nogil=True)
    def launch(address, x, out, calls, parts):
        for part in range(calls):
            numba_parallel.call_at(address, (x, out, part, parts))

    launch(address, x, out, 3, 3)
    np.testing.assert_array_equal(out, 2.0 * x)
    int64 = numba.types.int64
    assert numba_parallel._address(tripled, [x, out]) == (None, (numba.typeof(x),) * 2 + (int64, int64))
    tripled(x, out, 0, 1)
    address, _ = numba_parallel._address(tripled, [x, out])
    launch(address, x, out, 1, 1)
    np.testing.assert_array_equal(out, 3.0 * x)


def _doubled(x, out, part, parts):
    n = x.shape[0]
    for i in range(n * part // parts, n * (part + 1) // parts):
        out[i] = 2.0 * x[i]


def test_a_kept_address_that_does_not_fit_the_arguments_is_worked_out_anew(on_numbas_threads):
    # An address is kept by the arguments' fingerprints, a faster key than numba's types:
    # should one ever map to code of other types, the launch is refused and worked out
    # from the types (here the workers run it, compiling the kernel for them).
    import numba

    kernel = globals()["_doubled_kernel"] = numba.njit(nogil=True)(_doubled)
    kernel.py_func.__name__ = "_doubled_kernel"  # the module's attribute: it gets a launcher
    x = _data(1000)
    out = np.zeros_like(x)
    for _ in range(3):  # compiles the kernel, asks for its launcher, then loads it
        nr._run_parts(kernel, [x, out], 4, 2)
        numba_parallel.wait()
    np.testing.assert_array_equal(out, 2.0 * x)
    assert on_numbas_threads[-1][-1]  # on numba's threads
    wide = [x.astype(np.float64), np.zeros(x.shape, np.float64)]
    fingerprints = tuple(numba_parallel._fingerprint(a) for a in wide)
    numba_parallel._addresses[(kernel, *fingerprints)] = numba_parallel._address(kernel, [x, out])
    on_numbas_threads.clear()
    nr._run_parts(kernel, wide, 4, 2)
    np.testing.assert_array_equal(wide[1], 2.0 * x.astype(np.float64))
    assert on_numbas_threads == [("_doubled_kernel", 4, 2, False)]  # on the workers


def test_the_workers_setting_is_checked(monkeypatch):
    monkeypatch.setitem(numba_parallel._state, "enabled", None)
    monkeypatch.setenv("EMBER_FUSION_WORKERS", "openmp")
    with pytest.raises(ConfigError, match="EMBER_FUSION_WORKERS='openmp'"):
        numba_parallel.enabled()
    monkeypatch.setenv("EMBER_FUSION_WORKERS", "ember")
    assert not numba_parallel.enabled()
    monkeypatch.delenv("EMBER_FUSION_WORKERS")  # the default: numba's threads (the suites
    assert numba_parallel._setting() == "numba"  # set ember: tests/conftest.py)


def test_a_launcher_compiled_by_the_compiler_process_is_loaded_from_disk_later(tmp_path):
    # The first process asks the compiler process, runs on the workers meanwhile, then
    # loads the launcher it wrote; a second process loads it from disk at once, with no
    # compiler process.
    script = textwrap.dedent("""
        import numpy as np
        from ember.backends.fusion import numba_gemm, numba_parallel
        a = np.ones((64, 256), np.float32)
        b = np.ones((256, 64), np.float32)
        for _ in range(2):
            np.testing.assert_array_equal(numba_gemm.matmul(a, b, threads=2), a @ b)
            numba_parallel.wait()
        launch = numba_parallel.launcher(numba_gemm._across_panels, 6)
        print(numba_parallel.enabled(), len(launch.overloads),
              sum(launch.stats.cache_hits.values()), numba_parallel._compiler["process"] is None)
    """)
    env = {**os.environ, "EMBER_FUSION_CACHE": str(tmp_path), "EMBER_FUSION_WORKERS": "numba"}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]  # fmt: skip
    for run in runs:
        assert run.returncode == 0, run.stderr
    if runs[0].stdout.split()[0] == "False":
        pytest.skip("numba's threading layer here is neither OpenMP nor TBB")
    assert runs[0].stdout.split() == ["True", "1", "1", "False"]  # loaded what it asked for
    assert runs[1].stdout.split() == ["True", "1", "1", "True"]  # from disk, no compiler
    assert len(list((tmp_path / "parallel").glob("p_*.py"))) == 2  # the packing and the product


def test_a_launcher_the_compiler_process_cannot_compile_stays_on_the_workers(
        on_numbas_threads, monkeypatch):  # fmt: skip
    # A compiler process that is gone (or answers "failed"): the kernel runs on the
    # workers from then on, and computes the same.
    monkeypatch.setattr(numba_parallel, "_start_compiler", lambda: None)
    monkeypatch.setattr(numba_parallel, "_broken", set())
    monkeypatch.setattr(numba_parallel, "_compiler", {"process": None, "numbers": 0})
    monkeypatch.setattr(numba_parallel, "_load", lambda *a, **k: False)  # nothing on disk
    # float64: a signature no other test of this process had its launcher loaded for
    a, b = _data(40, 300).astype(np.float64), _data(300, 48).astype(np.float64)
    want = numba_gemm.matmul(a, b, threads=1)
    for _ in range(2):
        np.testing.assert_array_equal(numba_gemm.matmul(a, b, threads=2), want)
    assert {name for name, *_, ran in on_numbas_threads if not ran} >= {"_across_panels"}
    assert not any(ran for *_, ran in on_numbas_threads)
    assert numba_parallel._broken


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_launches_on_the_workers(on_numbas_threads):
    runtime = nr.NumbaRuntime()
    x = _data(300, 1024)
    (want,) = runtime.run(gelu_block(x.shape), [x], threads=2)  # numba's threads started
    numba_parallel.wait()
    np.testing.assert_array_equal(runtime.run(gelu_block(x.shape), [x], threads=2)[0], want)
    assert on_numbas_threads[-1][-1]  # on numba's threads now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: GNU OpenMP's threads are gone
        try:
            (got,) = runtime.run(gelu_block(x.shape), [x], threads=2)
            ok = np.array_equal(got, want) and not numba_parallel.enabled()
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_thread_setting_reads_numbas_own_setting_per_thread():
    """The launch's shortcut past numba's locks reads what ``numba.get_num_threads`` reads:
    the calling thread's own setting, before and after the layer starts."""
    import threading

    import numba

    assert numba_parallel._thread_setting() == numba.get_num_threads()
    seen = {}

    def other() -> None:
        numba.set_num_threads(1)
        seen["other"] = (numba_parallel._thread_setting(), numba.get_num_threads())

    previous = numba.get_num_threads()
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen["other"] == (1, 1)
    assert numba_parallel._thread_setting() == numba.get_num_threads() == previous
