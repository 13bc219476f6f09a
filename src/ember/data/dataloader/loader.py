"""DataLoader: a dataset cut into batches in a reproducible order, made by threads or processes.

The order of an epoch is a pure function of the loader's seed and epoch: without a
seed it is the dataset's order; with one it is a permutation drawn from a NumPy
generator seeded with ``(seed, epoch)``. Nothing else (the number of workers, how
many epochs ran before, which process iterates) changes it, so a run resumed at
epoch 7 sees exactly the batches an uninterrupted run saw at epoch 7.

Every item appears exactly once per epoch: the order is cut into batches of
``batch_size`` and the last, shorter batch is kept. :meth:`DataLoader.split` cuts the
epoch's order into contiguous, near-equal parts, one loader per device, so the parts
of one epoch are disjoint and cover the whole dataset.

Workers make the batches ahead (at most ``2 * num_workers`` batches in flight) and the
loader hands them out in the order of the epoch, so a loader yields the same batches for
any number and kind of workers. They are threads by default (``num_workers(n)``), or
processes (``num_workers(n, "process")``, as PyTorch's ``num_workers``; see
:mod:`~ember.data.dataloader.process_workers`): each process makes whole batches, items
and batcher, on a CPU NdArray device, and hands them back through shared memory (the
arrays are never pickled); the loader moves them to its device, without a copy on NdArray.
Process workers start with each epoch, or once with ``persistent=True``.

Threads were measured against process pools (16 CPU cores, MNIST train, batches of 64),
before process workers existed:

* the guide's batcher (normalize uint8 images into a float Tensor) makes an epoch in
  about 0.3 s with no worker at all; threads (k = 1..8) and forked processes (k = 2..8,
  about 0.45 s) only add overhead, and spawned processes take 7 s (pickling the dataset);
* on a CUDA device a forked process cannot make the batch at all (process workers now
  make it on the CPU and the loader moves it; not measured on CUDA since), and one
  thread (k = 1) is the fastest setting (0.35 s against 0.57 s for k = 0);
* decoding PNG files (Pillow releases the GIL) runs 2x faster with 2 threads;
* only a batcher that does much per-item Python work (GIL-bound) scales better in
  forked processes (5x at k = 8) than in threads (which slow it down).

Process workers, measured with ``benchmarks/dataloader.py --mnist`` on a machine of 2
cores shared with other jobs (load 2 to 12 over six runs; the numbers below are from the
quietest run, 1.8 to 2.4, and the CPU columns held in every run):

* 384 PNG images of 64x64, decoded by a Python loop that holds the GIL, then augmented
  (1.28 s per epoch without workers): 1, 2 or 4 threads take 1.25 to 1.29 s (the GIL
  serializes the decoding); 2 process workers take 0.64 s and 4 take 0.66 s (2.0x and
  1.9x; PyTorch's DataLoader: 0.67 s with 2 or 4). The loader's process spends 0.006 to
  0.009 s of CPU per epoch with process workers (PyTorch: 0.011 to 0.021 s), and all
  processes together 0 to 6 % more than no worker did (PyTorch: 2 to 9 %);
* MNIST through the guide's batcher (about 0.1 ms of work per batch of 64): 0.11 s per
  epoch without workers, 0.15 s with 2 threads, 0.22 s with 2 process workers (PyTorch's
  DataLoader: 0.10 s without workers, 0.97 s with 2 processes); the loader's process
  spends 0.09 s of CPU receiving the batches (PyTorch: 0.47 s), as much as making them.

So threads remain the default: they suit work that releases the GIL (NumPy on large
arrays, Pillow, zlib) or is light, and they keep every dataset and batcher usable as it
is: nothing has to be picklable, and SQLite connections or device handles are never
shared across a fork. A thread-safe dataset and a batcher without shared mutable state
are all they ask. Process workers suit per-item Python work that holds the GIL, given
free cores; starting one costs up to 30 ms with fork here (spawn: about 0.7 s), so use
``persistent=True`` when epochs are short.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from ember.backend.device import Device, default_device
from ember.backend.errors import ArgumentError
from ember.data.dataloader.batcher import Batcher
from ember.data.dataloader.epoch_order import EpochOrder
from ember.data.dataloader.process_workers import (
    START_METHODS,
    ProcessWorkers,
    default_start_method,
)

BatchT = TypeVar("BatchT")

WORKER_KINDS = ("thread", "process")


class IndexedDataset(Protocol):
    """What a loader needs of a dataset: a length and items by index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


def check_count(owner: str, name: str, value: Any, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum``, else an :class:`ArgumentError` naming it."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ArgumentError(f"{owner}: {name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_workers(owner: str, kind: Any, persistent: Any, start_method: Any,
                  timeout: Any) -> None:  # fmt: skip
    """An :class:`ArgumentError` naming the first worker setting that is invalid."""
    if kind not in WORKER_KINDS:
        raise ArgumentError(f"{owner}: kind must be 'thread' or 'process', got {kind!r}")
    if not isinstance(persistent, bool):
        raise ArgumentError(f"{owner}: persistent must be a bool, got {persistent!r}")
    if start_method is not None and start_method not in START_METHODS:
        raise ArgumentError(
            f"{owner}: start_method must be one of {', '.join(START_METHODS)} or None, "
            f"got {start_method!r}"
        )
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise ArgumentError(f"{owner}: timeout must be a number > 0 or None, got {timeout!r}")
    if kind == "thread" and (persistent or start_method is not None or timeout is not None):
        raise ArgumentError(
            f"{owner}: persistent, start_method and timeout apply to process workers "
            "(kind='process'); thread workers take none of them"
        )


class DataLoader(Generic[BatchT]):
    """Iterates over a dataset in batches made by a :class:`Batcher` on one device.

    Build one with :class:`~ember.data.dataloader.builder.DataLoaderBuilder`. Iterating
    yields the batches of the current epoch (see :meth:`set_epoch`); iterating again
    yields the same batches again.

    Args:
        dataset: anything with ``len()`` and ``dataset[i]`` (an ember ``Dataset``, a list).
        batcher: makes each batch from its items.
        batch_size: items per batch; the last batch of an epoch may be shorter.
        seed: shuffles the items with a new permutation each epoch when not None;
            None keeps the dataset's order.
        num_workers: workers that make batches ahead of the consumer; 0 makes each
            batch in the iterating thread when it is asked for.
        device: where the batcher puts the batches. Default: ``ember.default_device()``.
        worker_kind: ``"thread"`` (the default) or ``"process"``: worker processes make
            whole batches on a CPU NdArray device and hand them back in shared memory
            (:mod:`~ember.data.dataloader.process_workers`); the loader moves them to
            ``device``. A failing process worker raises
            :class:`~ember.data.dataloader.worker_error.DataLoaderWorkerError`.
        persistent_workers: process workers live across epochs (until :meth:`close`, the
            end of a ``with`` block, or garbage collection) instead of starting each epoch.
            Iterate such a loader one epoch at a time: a new iteration takes the workers
            over, and the older one raises if it is resumed.
        start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"`` for process workers;
            None: fork on Linux, spawn elsewhere.
        timeout: the most seconds to wait for one batch from a live process worker
            (None: no bound; a dead worker is reported at once either way).

    Example:
        >>> import ember
        >>> from ember.data.dataloader.batcher import Batcher
        >>> from ember.data.dataloader.builder import DataLoaderBuilder
        >>> class AsList(Batcher[int, list]):
        ...     def batch(self, items, device):
        ...         return items
        >>> loader = DataLoaderBuilder(AsList()).batch_size(4).build(list(range(10)))
        >>> list(loader), len(loader), loader.num_items()
        ([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], 3, 10)
        >>> shuffled = DataLoaderBuilder(AsList()).batch_size(4).shuffle(7).build(list(range(10)))
        >>> sorted(i for batch in shuffled for i in batch) == list(range(10))
        True
    """

    def __init__(
        self,
        dataset: IndexedDataset,
        batcher: Batcher[Any, BatchT],
        batch_size: int = 1,
        seed: int | None = None,
        num_workers: int = 0,
        device: Device | None = None,
        worker_kind: str = "thread",
        persistent_workers: bool = False,
        start_method: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.dataset = dataset
        self.batcher = batcher
        self.batch_size = check_count("DataLoader", "batch_size", batch_size, 1)
        self.seed = None if seed is None else check_count("DataLoader", "seed", seed, 0)
        self.num_workers = check_count("DataLoader", "num_workers", num_workers, 0)
        self.device = device if device is not None else default_device()
        check_workers("DataLoader", worker_kind, persistent_workers, start_method, timeout)
        self.worker_kind = worker_kind
        self.persistent_workers = persistent_workers
        self.start_method = start_method
        self.timeout = timeout
        self.epoch = 0
        # The chain of (part, parts) cuts that split() applied, outermost first.
        self._parts: tuple[tuple[int, int], ...] = ()
        self._pool: ProcessWorkers | None = None  # the persistent worker processes, once started

    # ------------------------------------------------------------------ the order
    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order the next iterations follow.

        With a seed the order depends only on ``(seed, epoch)``; without one every
        epoch has the dataset's order. Call it with the same epoch on every part of
        a :meth:`split` loader so the parts stay disjoint.
        """
        self.epoch = check_count("DataLoader.set_epoch", "epoch", epoch, 0)

    def order(self) -> EpochOrder:
        """The current epoch's order as a value (what process workers receive)."""
        return EpochOrder(self.seed, self.epoch, self._parts, self.batch_size)

    def indices(self) -> np.ndarray:
        """The dataset indices of this loader's items in the current epoch, in order."""
        return self.order().indices(len(self.dataset))

    def num_items(self) -> int:
        """Items per epoch (of this part, for a split loader)."""
        start, stop = self.order().bounds(len(self.dataset))
        return stop - start

    def __len__(self) -> int:
        """Batches per epoch, the last one possibly shorter."""
        return -(-self.num_items() // self.batch_size)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[BatchT]:
        order = self.order()
        chunks = order.chunks(len(self.dataset))
        if self.num_workers == 0:
            return (self._make(chunk) for chunk in chunks)
        if self.worker_kind == "process":
            return self._process_epoch(order, len(chunks))
        return _ahead(self._make, chunks, self.num_workers)

    def _process_epoch(self, order: EpochOrder, batches: int) -> Iterator[BatchT]:
        """The epoch's batches from worker processes (started now unless persistent ones run)."""
        if batches == 0:
            return
        pool = self._pool
        if pool is None or pool.closed:
            pool = ProcessWorkers(
                self.dataset,
                self.batcher,
                self.device,
                count=min(self.num_workers, batches),  # a worker without a batch would idle
                start_method=self.start_method or default_start_method(),
                timeout=self.timeout,
            )
            if self.persistent_workers:
                self._pool = pool
        try:
            yield from pool.run(order)
        finally:
            if not self.persistent_workers:
                pool.close()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stops the persistent worker processes, if any (a later epoch starts new ones)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> DataLoader[BatchT]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # Worker processes belong to the process that started them: a pickled loader
        # (sent to a process of its own) starts its own.
        state = self.__dict__.copy()
        state["_pool"] = None
        return state

    def _make(self, chunk: np.ndarray) -> BatchT:
        items = [self.dataset[int(i)] for i in chunk]
        return self.batcher.batch(items, self.device)

    # ------------------------------------------------------------------ copies
    def _copy(self) -> DataLoader[BatchT]:
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other._pool = None  # a copy may run beside this loader: it starts workers of its own
        return other

    def to_device(self, device: Device) -> DataLoader[BatchT]:
        """A copy of this loader (same items, order and epoch) making its batches on ``device``."""
        other = self._copy()
        other.device = device
        return other

    def split(self, n: int) -> list[DataLoader[BatchT]]:
        """``n`` loaders over disjoint, contiguous parts of each epoch's order, one per device.

        Together the parts hold every item of the epoch exactly once; their sizes
        differ by at most one item. Each part keeps this loader's device: move part
        ``i`` to its device with :meth:`to_device`.

        Example:
            >>> from ember.data.dataloader.batcher import Batcher
            >>> from ember.data.dataloader.builder import DataLoaderBuilder
            >>> class AsList(Batcher[int, list]):
            ...     def batch(self, items, device):
            ...         return items
            >>> loader = DataLoaderBuilder(AsList()).batch_size(2).build(list(range(7)))
            >>> [list(part) for part in loader.split(2)]
            [[[0, 1], [2]], [[3, 4], [5, 6]]]
        """
        n = check_count("DataLoader.split", "n", n, 1)
        parts = []
        for part in range(n):
            other = self._copy()
            other._parts = (*self._parts, (part, n))
            parts.append(other)
        return parts

    def __repr__(self) -> str:
        return (
            f"DataLoader(items={self.num_items()}, batch_size={self.batch_size}, "
            f"seed={self.seed}, epoch={self.epoch}, num_workers={self.num_workers}, "
            f"worker_kind={self.worker_kind!r}, device={self.device})"
        )


def _ahead(make, chunks: Sequence[np.ndarray], workers: int) -> Iterator[Any]:
    """Yields ``make(chunk)`` for each chunk in order, made ahead by ``workers`` threads.

    A batch that fails re-raises its exception here, in the consumer; leaving the loop
    early (break, an error) cancels the batches not started yet.
    """
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ember-data")
    pending: deque[Future] = deque()
    todo = iter(chunks)
    try:
        for chunk in todo:
            pending.append(pool.submit(make, chunk))
            if len(pending) == 2 * workers:
                break
        while pending:
            batch = pending.popleft().result()
            chunk = next(todo, None)
            if chunk is not None:
                pending.append(pool.submit(make, chunk))
            yield batch
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
