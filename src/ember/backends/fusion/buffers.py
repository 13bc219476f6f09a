"""A pool of output buffers by size class.

Fresh memory is costly on CPU: the first write to each page faults (about 20 ms per 64 MB
here, as long as a fused GELU over the same bytes). Kernels therefore write into pooled
buffers that keep their pages mapped.

Buffers go back to the pool only by an explicit :meth:`BufferPool.release`, by the one
who knows nobody reads them any more (the fusion stream, from its liveness tracking).
Finalizers (a slot collected, possibly by the garbage collector in the middle of the pool's
own work on the same thread) use :meth:`BufferPool.release_later`, which takes no lock:
the next call into the pool takes those buffers back.
Weak-reference callbacks cannot decide that: a NumPy view of a pooled array
(``out[1:]``, ``out.reshape(...)``) keeps the memory in use after the array itself is
gone, and its ``base`` names the pool's buffer, not the array that was handed out. What
they can tell is that an array handed out is gone: if the pool then holds the only
reference to its buffer (no view of it is left anywhere), the buffer goes back to the pool
too. That is the fate of a result the caller took as a NumPy array and dropped (a model's
output, read with ``to_numpy``, call after call): freeing it cost an ``munmap`` (about
0.5 ms for 1 MiB on this VM, where unmapping memory several threads touched interrupts
every CPU) and the next call's fresh pages.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import mmap
import sys
import threading
import weakref
from collections import OrderedDict, deque

import numpy as np

from ember.backend.environment import switch, whole_number

_MIN_CLASS = 1 << 12  # below 4 KiB a fresh np.empty is as cheap as a lookup
_STEPS = 4  # four classes per doubling: at most 25% of a buffer is unused
_PAGE = 1 << 12
_PAGED_MIN = 1 << 16
"""Buffers of at least this many bytes start on a page: a kernel that walks 4 KiB rows (a
softmax or layer norm over 1024 float32) reads each row from one page, which the
hardware prefetcher follows to its end; rows that straddle two pages measured 5-14%
slower (`[4096, 1024]` at one thread: 3.9-4.2 ms against 4.4-4.8)."""


_HUGE = 1 << 21
_HUGE_MIN = 1 << 22
"""Buffers of at least this many bytes are mapped on their own, start on a 2 MiB boundary
and ask the kernel for transparent huge pages (``madvise``; Linux, where
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``). Set
``EMBER_FUSION_HUGE_PAGES=0`` to turn it off."""


def _huge_pages() -> bool:
    return switch("EMBER_FUSION_HUGE_PAGES", True) and hasattr(mmap, "MADV_HUGEPAGE")


def _huge_buffer(nbytes: int) -> np.ndarray:
    """``nbytes`` of fresh anonymous memory from a 2 MiB boundary, advised as huge pages (a
    NumPy array over its own mapping, which is unmapped with the last view of it)."""
    region = mmap.mmap(-1, nbytes + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = -np.frombuffer(region, np.uint8, 1).ctypes.data % _HUGE
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages: plain pages
        region.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(region, np.uint8, nbytes, start)


def size_class(nbytes: int) -> int:
    """The pooled size for a request of ``nbytes``: the next of 4 classes per power of 2."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    top = 1 << (nbytes - 1).bit_length()  # the next power of two
    step = top // (2 * _STEPS)
    return math.ceil(nbytes / step) * step


def _class_of(nbytes: int) -> int:
    """The bytes a pool allocates for a request of ``nbytes``: its size class, and a page
    more from :data:`_PAGED_MIN` on (room to start on a page); remembered per request size
    (a launch takes one or two outputs, and the arithmetic costs microseconds cold)."""
    wanted = size_class(nbytes)
    if wanted >= _PAGED_MIN:
        wanted += _PAGE
    if len(_classes) >= 4096:
        _classes.clear()
    _classes[nbytes] = wanted
    return wanted


_classes: dict[int, int] = {}


class BufferPool:
    """Output buffers reused by size class, up to ``max_idle_bytes`` kept while unused.

    Args:
        max_idle_bytes: the most bytes of released buffers kept for reuse (the oldest go
            first); default ``EMBER_FUSION_POOL_BYTES`` or 1 GiB.
    """

    def __init__(self, max_idle_bytes: int | None = None) -> None:
        if max_idle_bytes is None:
            max_idle_bytes = whole_number("EMBER_FUSION_POOL_BYTES", 1 << 30, "bytes",
                                          "0 keeps no released buffer")
        self.max_idle_bytes = max_idle_bytes
        self.huge_pages = _huge_pages()
        self._idle: OrderedDict[int, tuple[int, np.ndarray]] = OrderedDict()  # id -> (class, raw)
        self._by_class: dict[int, dict[int, None]] = {}  # class -> ids of its idle buffers
        # id(array handed out) -> (its raw buffer, the loan's number, the weak reference that
        # reports the array's death): ids are reused once an array is gone, so a late notice
        # names the loan it was about.
        self._loans: dict[int, tuple[np.ndarray, int, weakref.ref]] = {}
        self._numbers = itertools.count()
        self._idle_bytes = 0
        self._lock = threading.Lock()
        # From finalizers, which may run while this thread holds the lock: no lock there.
        self._returned: deque[np.ndarray] = deque()
        self._forgotten: deque[tuple[int, int]] = deque()
        self.hits = 0
        self.misses = 0

    def take(self, shape: tuple[int, ...], dtype: np.dtype,
             order: tuple[int, ...] | None = None) -> np.ndarray:  # fmt: skip
        """An uninitialized array of ``shape`` and ``dtype``, pooled memory when a released
        buffer of its size class is idle: C-contiguous, or with ``order`` a permutation of
        the dims, laid out so that ``array.transpose(order)`` is (an element-wise result
        in the memory order of its permuted inputs)."""
        if type(dtype) is not np.dtype:
            dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes <= _MIN_CLASS:
            return empty_in_order(shape, dtype, order)
        stored = shape if order is None else tuple([shape[d] for d in order])
        wanted = _classes.get(nbytes)
        if wanted is None:
            wanted = _class_of(nbytes)
        paged = wanted >= _PAGED_MIN
        # One spell of the lock for the buffer and the loan: a launch takes one or two
        # outputs, and each step of taking costs microseconds of Python on a cold cache.
        with self._lock:
            if self._forgotten or self._returned:
                self._drain()
            same = self._by_class.get(wanted)
            if same:
                key = next(iter(same))
                del same[key]
                cls, raw, start = self._idle.pop(key)
                self._idle_bytes -= cls
                self.hits += 1
            else:
                if wanted >= _HUGE_MIN and self.huge_pages:
                    raw, start = _huge_buffer(wanted), 0
                else:
                    raw = np.empty(wanted, np.uint8)
                    start = -raw.__array_interface__["data"][0] % _PAGE if paged else 0
                self.misses += 1
            # An array over ``raw`` (its base, which release checks) from its first page
            # boundary.
            array = np.ndarray(stored, dtype, raw, start)
            if order is not None:
                array = array.transpose(inverse_order(tuple(order)))
            key = id(array)
            number = next(self._numbers)
            # An array dropped without release frees its memory as any array does; its
            # death notice drops the loan (a weak reference's callback: a finalizer costs
            # several times more, a few microseconds a launch).
            notice = weakref.ref(array, functools.partial(self._forget, key, number))
            self._loans[key] = (raw, number, notice, start)
        return array

    def _forget(self, key: int, number: int, _notice: weakref.ref) -> None:
        self._forgotten.append((key, number))  # a finalizer: see release_later

    def release(self, array: np.ndarray) -> bool:
        """Returns ``array`` (exactly as :meth:`take` handed it out) to the pool; the caller
        promises that neither it nor any view of it is read again. Arrays the pool did not
        hand out are ignored. Returns whether the buffer was taken back."""
        with self._lock:
            self._drain()
            return self._release(array)

    def release_later(self, array: np.ndarray) -> None:
        """:meth:`release` from a finalizer: takes no lock (the thread running the finalizer
        may hold it already); the next call into the pool takes the buffer back."""
        self._returned.append(array)

    def _drain(self) -> None:
        """Takes back what finalizers handed over (with the lock held)."""
        while self._forgotten:
            key, number = self._forgotten.popleft()
            loan = self._loans.get(key)
            if loan is not None and loan[1] == number:  # not a later loan of a reused id
                del self._loans[key]
                raw, start = loan[0], loan[3]
                del loan
                if sys.getrefcount(raw) == 2:  # ``raw`` and the call's argument: no view left
                    self._keep(raw, start)
        while self._returned:
            self._release(self._returned.popleft())

    def _release(self, array: np.ndarray) -> bool:
        loan = self._loans.pop(id(array), None)
        # The array handed out is a view whose base is its raw buffer (NumPy points a view
        # of a view at the owner), which tells it from a later array that reuses the id.
        if loan is None or array.base is not loan[0]:
            return False
        self._keep(loan[0], loan[3])
        return True

    def _keep(self, raw: np.ndarray, start: int) -> None:
        """Keeps the buffer ``raw`` idle for reuse (its arrays start at byte ``start``), the
        oldest idle ones freed past the budget."""
        self._idle[id(raw)] = (raw.size, raw, start)
        self._by_class.setdefault(raw.size, {})[id(raw)] = None
        self._idle_bytes += raw.size
        while self._idle_bytes > self.max_idle_bytes and self._idle:
            key, (cls, _, _) = self._idle.popitem(last=False)
            del self._by_class[cls][key]
            self._idle_bytes -= cls

    def idle_bytes(self) -> int:
        """Bytes of released buffers kept for reuse."""
        with self._lock:
            self._drain()
            return self._idle_bytes

    def clear(self) -> None:
        """Frees every idle buffer."""
        with self._lock:
            self._drain()
            self._idle.clear()
            self._by_class.clear()
            self._idle_bytes = 0


def empty_in_order(shape: tuple[int, ...], dtype: np.dtype,
                   order: tuple[int, ...] | None = None) -> np.ndarray:  # fmt: skip
    """A new uninitialized array of ``shape``, laid out as :meth:`BufferPool.take` lays
    out its ``order`` (``array.transpose(order)`` C-contiguous), outside any pool."""
    if order is None:
        return np.empty(shape, dtype)
    return np.empty(tuple(shape[d] for d in order), dtype).transpose(inverse_order(tuple(order)))


@functools.lru_cache(maxsize=256)
def inverse_order(order: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes ``order`` (``np.argsort`` cost 50 us a call cold)."""
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return tuple(inverse)


class PooledOutputs:
    """A runtime whose outputs come from its ``pool`` (a :class:`BufferPool`): how the
    executor hands them back."""

    pool: BufferPool

    def release(self, array: np.ndarray) -> bool:
        """Hands an output of ``run`` back to the pool (nobody may read it or its views
        afterwards); see :meth:`BufferPool.release`."""
        return self.pool.release(array)

    def release_later(self, array: np.ndarray) -> None:
        """:meth:`release` from a finalizer (no lock taken; see :meth:`BufferPool.release_later`)."""
        self.pool.release_later(array)
