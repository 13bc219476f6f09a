"""Running a NumPy kernel's blocks on several threads, with NumPy's BLAS held to one.

NumPy runs its copies on the calling thread, and OpenBLAS splits each product over its
own threads only when the product is large, waking them for every call. A convolution
made of many blocks (an unrolling copy, then a product) therefore gains little from a
second core. Running the *blocks* on several threads instead puts both the copies and
the products on every core: each thread unrolls and multiplies the blocks it claims into
its own scratch buffers (``scratch.py`` is per thread). NumPy releases the GIL in both.
While they run, the BLAS is held to one thread, else each thread's products would be
split again over the same cores.

**How many threads.** As many as NumPy's OpenBLAS is set to use (``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS``, ``threadpoolctl``), at most the CPU count: a user who limited NumPy to
one thread gets one thread here too. Work under :data:`MIN_PARALLEL_WORK` multiply-adds
runs on the calling thread (waking a thread costs tens of microseconds, more on a loaded
machine). A kernel called while another thread holds the BLAS to one runs on its caller
alone, so two user threads running kernels side by side do not oversubscribe the cores.

The BLAS limit is process-wide (a library setting, not a thread's): a product that another
thread runs meanwhile runs on one thread. The first section to start saves the setting and
the last to end restores it.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["MIN_PARALLEL_WORK", "Claim", "blas_held_to_one", "blas_threads", "blocks",
           "run_blocks"]

T = TypeVar("T")

MIN_PARALLEL_WORK = 1 << 22
"""Multiply-adds below which a kernel's blocks run on the calling thread alone."""

_lock = threading.Lock()
_held = 0  # sections running with the BLAS held to one thread
_saved: list[tuple[_OpenBLAS, int]] = []  # the setting the first section found
_controllers: list[_OpenBLAS] | None = None  # NumPy's OpenBLAS (and any other loaded), found once
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_CPUS = os.cpu_count() or 1  # read once: tens of microseconds a call on some systems


class _OpenBLAS:
    """The thread count of one loaded OpenBLAS with a process-wide pool (its ``pthreads``
    layer: NumPy's wheels), read and set through its own C API. threadpoolctl finds the
    library; its own setter is not used, since it lets only one "controlling" thread set
    the count and silently ignores the others (a data loader's thread, say)."""

    def __init__(self, path: str) -> None:
        library = ctypes.CDLL(path)
        self.get = self.set = None
        for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_")):
            get = getattr(library, f"{prefix}openblas_get_num_threads{suffix}", None)
            put = getattr(library, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                self.get, self.set = get, put
                break

    @property
    def num_threads(self) -> int:
        return int(self.get())

    def set_num_threads(self, count: int) -> None:
        self.set(count)


def _blas() -> list[_OpenBLAS]:
    global _controllers
    if _controllers is None:
        found = []
        try:
            from threadpoolctl import ThreadpoolController

            libraries = ThreadpoolController().select(internal_api="openblas").lib_controllers
        except Exception:  # a core dependency; a broken install runs serially
            libraries = []
        for library in libraries:
            if getattr(library, "threading_layer", None) == "pthreads":
                blas = _OpenBLAS(library.filepath)
                if blas.get is not None:
                    found.append(blas)
        _controllers = found
    return _controllers


def blas_threads() -> int:
    """The threads NumPy's BLAS uses now: 1 inside another thread's section, and for a BLAS
    other than OpenBLAS with its own thread pool (OpenMP builds limit threads per calling
    thread; MKL and BLIS are not handled: their kernels run on the calling thread)."""
    counts = [c.num_threads for c in _blas()]
    return max(1, min(counts)) if counts else 1


@contextlib.contextmanager
def blas_held_to_one() -> Iterator[None]:
    """NumPy's BLAS runs on one thread inside (process-wide; the last section to end
    restores the count the first one found)."""
    global _held, _saved
    with _lock:
        if _held == 0:
            _saved = [(c, c.num_threads) for c in _blas()]
            for c, _ in _saved:
                c.set_num_threads(1)
        _held += 1
    try:
        yield
    finally:
        with _lock:
            _held -= 1
            if _held == 0:
                for c, count in _saved:
                    c.set_num_threads(count)


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="ember-ndarray")
            _pool_size = workers
        return _pool


def _forget_pool() -> None:
    """After a fork: the parent's worker threads (and a section it was in) do not exist in
    the child, whose BLAS gets back the setting such a section had saved."""
    global _pool, _pool_size, _held, _lock
    if _held:
        for c, count in _saved:
            c.set_num_threads(count)
    _pool, _pool_size, _held, _lock = None, 0, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


Claim = Callable[[], "tuple[int, int] | None"]
"""A thread's source of work: the next unclaimed block as ``(start, count)``, or None."""


def blocks(n: int, chunk: int) -> list[tuple[int, int]]:
    """``(start, count)`` of the blocks of samples ``0 .. n``: as few as blocks of at most
    ``chunk`` allow, of even sizes (16 samples in blocks of up to 5 run as 4 x 4, not
    5 + 5 + 5 + 1)."""
    if n <= 0:
        return []
    size = -(-n // -(-n // max(1, chunk)))
    return [(start, min(size, n - start)) for start in range(0, n, size)]


def run_blocks(n: int, chunk: int, work: int, body: Callable[[Claim], T]) -> list[T]:
    """Runs ``body(claim)`` on each of this kernel's threads (see the module docstring) and
    returns their results; ``claim()`` hands each caller the next block of samples
    ``0 .. n`` (:func:`blocks`) until none is left.

    The calling thread starts at once and the others join as they wake, so a thread woken
    late (tens of microseconds on a virtual machine, more on a loaded host) costs at most
    the block it took. With several threads, blocks are at most half of a thread's share,
    so every thread gets some. ``work`` is the kernel's multiply-adds, which decides
    whether more threads pay. ``body`` must write only the outputs of the samples it
    claimed and use only per-thread scratch; which thread gets a block varies from run to
    run, so a sum over blocks must be made per block and added in block order. An error
    in any thread is raised here after every thread ended.

    Example:
        >>> import numpy as np
        >>> x = np.arange(12.0).reshape(6, 2)
        >>> def total(claim):
        ...     s = 0.0
        ...     while (block := claim()) is not None:
        ...         start, count = block
        ...         s += x[start : start + count].sum()
        ...     return s
        >>> float(sum(run_blocks(6, 2, 1 << 30, total)))
        66.0
    """
    parts = min(n, _CPUS, blas_threads()) if work >= MIN_PARALLEL_WORK else 1
    if parts > 1:
        chunk = min(chunk, -(-n // (2 * parts)))
    todo = blocks(n, chunk)
    taken = itertools.count()  # its next() is one C call: atomic under the GIL

    def claim() -> tuple[int, int] | None:
        index = next(taken)
        return todo[index] if index < len(todo) else None

    if parts <= 1:
        return [body(claim)]
    with blas_held_to_one():
        pool = _executor(parts - 1)
        futures = [pool.submit(body, claim) for _ in range(parts - 1)]
        try:
            first = body(claim)
        finally:
            wait(futures)
    return [first, *(f.result() for f in futures)]
