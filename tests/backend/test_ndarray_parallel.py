"""``ember.backends.ndarray.parallel``: blocks of samples on several threads, BLAS held to one."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from ember.backends.ndarray import parallel

threadpoolctl = pytest.importorskip("threadpoolctl")


@pytest.fixture
def blas_two_threads():
    """NumPy's BLAS set to two threads for the test (it may have one on this machine), and
    splits allowed for any work."""
    if not parallel._blas():
        pytest.skip("no BLAS that threadpoolctl can control")
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        saved = parallel.MIN_PARALLEL_WORK, parallel._CPUS
        parallel.MIN_PARALLEL_WORK, parallel._CPUS = 0, 2
        try:
            yield
        finally:
            parallel.MIN_PARALLEL_WORK, parallel._CPUS = saved


def _drain(claim, seen=None, pause=0.0):
    """Claims blocks until none is left; records (start, count, thread, BLAS threads)."""
    got = []
    while (block := claim()) is not None:
        got.append((*block, threading.get_ident(), parallel.blas_threads()))
        time.sleep(pause)
    if seen is not None:
        seen.extend(got)
    return got


def test_blocks_are_even_and_cover_the_samples():
    assert parallel.blocks(16, 5) == [(0, 4), (4, 4), (8, 4), (12, 4)]
    assert parallel.blocks(7, 7) == [(0, 7)]
    assert parallel.blocks(7, 100) == [(0, 7)]
    assert parallel.blocks(5, 1) == [(i, 1) for i in range(5)]
    assert parallel.blocks(0, 4) == []
    for n in range(1, 40):
        for chunk in range(1, 12):
            got = parallel.blocks(n, chunk)
            assert [s for s, _ in got] == list(range(0, n, got[0][1]))
            assert sum(c for _, c in got) == n and max(c for _, c in got) <= chunk


def test_every_block_is_claimed_once_across_threads(blas_two_threads):
    seen = []
    parallel.run_blocks(40, 40, 1, lambda claim: _drain(claim, seen, pause=0.002))
    assert sorted((s, c) for s, c, _, _ in seen) == parallel.blocks(40, 10)  # half a share
    assert len({ident for _, _, ident, _ in seen}) == 2  # the worker took some
    assert {threads for *_, threads in seen} == {1}  # the BLAS held to one thread meanwhile
    assert parallel.blas_threads() == 2  # and given back


def test_small_work_runs_on_the_calling_thread(blas_two_threads):
    parallel.MIN_PARALLEL_WORK = 1000
    results = parallel.run_blocks(8, 3, 999, _drain)
    assert len(results) == 1
    assert [(s, c) for s, c, _, _ in results[0]] == parallel.blocks(8, 3)
    assert {ident for _, _, ident, _ in results[0]} == {threading.get_ident()}


def test_one_sample_is_not_split(blas_two_threads):
    results = parallel.run_blocks(1, 4, 1 << 40, _drain)
    assert [[(s, c) for s, c, _, _ in r] for r in results] == [[(0, 1)]]


def test_no_split_when_numpy_has_one_thread(blas_two_threads):
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        results = parallel.run_blocks(8, 2, 1 << 40, _drain)
    assert len(results) == 1 and {i for _, _, i, _ in results[0]} == {threading.get_ident()}


def test_an_error_in_a_thread_is_raised_after_every_thread_ended(blas_two_threads):
    ended = []
    caller = threading.get_ident()

    def worker_fails(claim):
        if threading.get_ident() != caller:
            raise ValueError("bad block")
        time.sleep(0.05)
        ended.append("caller")

    with pytest.raises(ValueError, match="bad block"):
        parallel.run_blocks(8, 8, 1, worker_fails)
    assert ended == ["caller"]
    assert parallel.blas_threads() == 2

    def caller_fails(claim):
        if threading.get_ident() == caller:
            raise KeyError("caller's block")
        time.sleep(0.05)
        ended.append("worker")

    with pytest.raises(KeyError, match="caller's block"):
        parallel.run_blocks(8, 8, 1, caller_fails)
    assert ended == ["caller", "worker"]  # the worker finished before the error was raised
    assert parallel.blas_threads() == 2


def test_sections_side_by_side_restore_the_setting(blas_two_threads):
    """Two user threads in sections at once: a section started while another holds the
    BLAS to one thread runs on its caller (it reads one thread), and the BLAS gets back its
    setting only when both ended."""
    a_inside, b_done = threading.Barrier(2), threading.Event()
    results = {}

    caller = []

    def a_body(claim):
        _drain(claim)
        if threading.get_ident() == caller[0]:
            a_inside.wait(timeout=5)
            b_done.wait(timeout=5)  # "a" stays in its section until "b" ran its own
        return threading.get_ident()

    def a_user():
        caller.append(threading.get_ident())
        results["a"] = parallel.run_blocks(4, 4, 1, a_body)

    def b_user():
        a_inside.wait(timeout=5)
        results["b"] = parallel.run_blocks(4, 4, 1, lambda claim: _drain(claim))
        results["b threads after"] = parallel.blas_threads()
        b_done.set()

    users = [threading.Thread(target=a_user), threading.Thread(target=b_user)]
    for user in users:
        user.start()
    for user in users:
        user.join(10)
    assert len(results["a"]) == 2
    assert len(results["b"]) == 1
    assert results["b threads after"] == 1  # "a" still holds it
    assert parallel.blas_threads() == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_splits_too(blas_two_threads):
    parallel.run_blocks(4, 4, 1, _drain)  # the parent's pool exists now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            x = np.arange(10.0)
            parts = parallel.run_blocks(10, 10, 1, _drain)
            total = sum(x[s : s + c].sum() for part in parts for s, c, _, _ in part)
            os.write(write, f"{total} {len(parts)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    assert answer == "45.0 2"
