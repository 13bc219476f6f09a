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


def test_ranges_cover_the_samples_in_order(blas_two_threads):
    seen = []

    def body(start, stop):
        seen.append((start, stop, threading.get_ident(), parallel.blas_threads()))
        return list(range(start, stop))

    parts = parallel.split_samples(7, 1, body)
    assert [i for part in parts for i in part] == list(range(7))
    assert sorted((a, b) for a, b, _, _ in seen) == [(0, 4), (4, 7)]
    assert len({ident for _, _, ident, _ in seen}) == 2  # the second part ran on a worker
    assert {threads for *_, threads in seen} == {1}  # the BLAS held to one thread meanwhile
    assert parallel.blas_threads() == 2  # and given back


def test_small_work_runs_on_the_calling_thread(blas_two_threads):
    parallel.MIN_PARALLEL_WORK = 1000
    calls = []
    parts = parallel.split_samples(8, 999, lambda a, b: calls.append((a, b, threading.get_ident())))
    assert parts == [None] and calls == [(0, 8, threading.get_ident())]


def test_one_sample_is_not_split(blas_two_threads):
    assert parallel.split_samples(1, 1 << 40, lambda a, b: (a, b)) == [(0, 1)]


def test_no_split_when_numpy_has_one_thread(blas_two_threads):
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        idents = parallel.split_samples(8, 1 << 40, lambda a, b: threading.get_ident())
    assert idents == [threading.get_ident()]


def test_an_error_in_a_part_is_raised_after_every_part_ended(blas_two_threads):
    ended = []

    def body(start, stop):
        if start:
            raise ValueError(f"bad sample {start}")
        time.sleep(0.05)
        ended.append(start)

    with pytest.raises(ValueError, match="bad sample 4"):
        parallel.split_samples(8, 1, body)
    assert ended == [0]
    assert parallel.blas_threads() == 2

    def first_fails(start, stop):
        if start == 0:
            raise KeyError("first part")
        time.sleep(0.05)
        ended.append(start)

    with pytest.raises(KeyError, match="first part"):
        parallel.split_samples(8, 1, first_fails)
    assert ended == [0, 4]  # the worker's part finished before the error was raised
    assert parallel.blas_threads() == 2


def test_sections_side_by_side_restore_the_setting(blas_two_threads):
    """Two user threads in sections at once: a section started while another holds the
    BLAS to one thread runs on its caller (it reads one thread), and the BLAS gets back its
    setting only when both ended."""
    a_inside, b_done = threading.Barrier(2), threading.Event()
    results = {}

    def a_body(start, stop):
        if start == 0:
            a_inside.wait(timeout=5)
            b_done.wait(timeout=5)  # "a" stays in its section until "b" ran its own
        return threading.get_ident()

    def a_user():
        results["a"] = parallel.split_samples(4, 1, a_body)

    def b_user():
        a_inside.wait(timeout=5)
        results["b"] = parallel.split_samples(4, 1, lambda a, b: threading.get_ident())
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
    parallel.split_samples(4, 1, lambda a, b: None)  # the parent's pool exists now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            x = np.arange(10.0)
            total = sum(parallel.split_samples(10, 1, lambda a, b: x[a:b].sum()))
            os.write(write, str(total).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    assert answer == "45.0"
