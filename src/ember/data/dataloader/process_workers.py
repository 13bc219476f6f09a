"""ProcessWorkers: a loader's batches made by worker processes, handed back in shared memory.

Each worker process holds the dataset and the batcher and makes whole batches: the items
(``dataset[i]``) and ``batcher.batch(items, device)`` on a CPU NdArray device. The batch
comes back through shared memory (:mod:`~ember.data.dataloader.shared_batch`: the arrays
in a shared segment, only a small skeleton through the pipe), and the loader's process
moves its Tensors to the loader's device (no copy when that device is NdArray itself).

Order. Batch ``k`` of an epoch goes to worker ``k % n`` and the loader yields batches in
order, with at most ``2 * n`` batches in flight; each worker computes the epoch's order
from the same :class:`~ember.data.dataloader.epoch_order.EpochOrder` value, so the
batches are those of thread workers and of no worker at all.

Start method. ``fork`` where the platform has it (Linux; what PyTorch uses there): a
worker starts in milliseconds and nothing has to be picklable. A fork copies only the
thread that calls it, so the thread pools the parent started (torch's, the Fusion
runtime's, numba's) are not there in a worker. Workers make batches on NdArray (NumPy)
and need none of them; a dataset or batcher that runs torch ops still works (torch makes
a new pool after a fork; workers set it to one thread), but one that runs a Fusion
device or numba parallel kernels needs ``spawn`` or ``forkserver`` (numba's GNU OpenMP
layer ends a forked child that uses it: the loader reports that worker killed by
SIGTERM). The same holds for a lock another thread held at the fork, and for a CUDA
context. A dataset that holds OS resources reopens them in the worker (ember's SQLite
dataset does so by process id). ``spawn`` and ``forkserver`` work whenever the dataset
and the batcher pickle (they are sent to each worker, and the main module must be
import-safe, behind ``if __name__ == "__main__":``); they cost a fresh interpreter per
worker (about 0.7 s with ember imported), so use them with persistent workers.

Randomness. Each worker seeds Python's ``random``, NumPy's global generator and its
device's generator from a seed drawn for the pool plus its number, so forked workers do
not repeat one another's draws. Random augmentation that uses them therefore changes
with the run and the worker count; draw it from a generator seeded by the item's index
(as ``benchmarks/dataloader.py`` does) for batches that are the same everywhere.

Failures. A worker whose dataset or batcher raises sends the error back (type, text and
traceback); a worker that dies (``os._exit``, a signal, a segfault) is seen at once
through its process sentinel; either way the loader raises
:class:`~ember.data.dataloader.worker_error.DataLoaderWorkerError` naming the worker, the
batch and its item indices, and shuts the pool down (the next epoch starts a new one).
A worker alive but stuck is bounded by the optional ``timeout``.

Shutdown. :meth:`ProcessWorkers.close` (also run when the pool is garbage collected and
at interpreter exit, through :func:`weakref.finalize`) asks each worker to stop, kills
the ones that do not within a second, and removes the segment folder. A worker whose
loader process disappeared (killed) notices within half a second, removes the folder
and exits, so no process and no segment outlives a killed loader.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import random
import signal
import sys
import time
import traceback
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

import ember
from ember.backend.device import Device
from ember.backends.ndarray import NdArray
from ember.data.dataloader.batcher import Batcher
from ember.data.dataloader.epoch_order import EpochOrder
from ember.data.dataloader.shared_batch import SegmentFolder, SharedBatch, discard, pack, unpack
from ember.data.dataloader.worker_error import DataLoaderWorkerError, describe_items

START_METHODS = ("fork", "spawn", "forkserver")
PREFETCH_PER_WORKER = 2  # batches in flight per worker, as with thread workers
PARENT_CHECK_SECONDS = 0.5  # how often an idle worker looks for its loader process
STOP_GRACE_SECONDS = 1.0  # how long close() waits for a worker before killing it


def default_start_method() -> str:
    """``fork`` where the platform offers it (Linux), else ``spawn``."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() and sys.platform == "linux" \
        else "spawn"  # fmt: skip


def is_host_device(device: Device) -> bool:
    """Whether ``device`` is a bare NdArray CPU device (batches on it need no move)."""
    return isinstance(device.backend, NdArray) and getattr(device.backend, "inner", None) is None


# ---------------------------------------------------------------------------- the worker
@dataclass(frozen=True)
class _WorkerSetup:
    """What a worker process starts from (pickled to it under spawn and forkserver)."""

    worker: int
    dataset: Any
    batcher: Batcher
    device: Device
    folder: SegmentFolder
    loader: int  # the loader process's id
    start_method: str
    seed: int


def _worker_main(setup: _WorkerSetup, tasks: Connection, results: Connection) -> None:
    """A worker's life: take ``(token, batch, order)`` tasks until ``None``, send each result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader process's to handle
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    # Forked workers would otherwise share one random stream: seed each one its own.
    random.seed(setup.seed)
    np.random.seed(setup.seed % 2**32)
    setup.device.seed(setup.seed)
    # The parent is the loader process, or the fork server under forkserver (which ends
    # with the loader process); either way a new parent means the loader is gone.
    parent = os.getppid()
    if setup.start_method != "forkserver" and parent != setup.loader:
        parent = -1  # the loader ended before this worker started
    try:
        _serve(setup, tasks, results, parent)
    finally:
        if os.getppid() != parent:  # the loader process is gone: leave nothing behind
            setup.folder.remove()


def _serve(setup: _WorkerSetup, tasks: Connection, results: Connection, parent: int) -> None:
    """Makes the batches asked for until told to stop or the loader process is gone."""
    size = len(setup.dataset)
    chunks: tuple[EpochOrder | None, list[np.ndarray]] = (None, [])
    sent = 0
    while True:
        if not tasks.poll(PARENT_CHECK_SECONDS):
            if os.getppid() != parent:
                return
            continue
        try:
            task = tasks.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        token, batch, order = task
        if chunks[0] != order:
            chunks = (order, order.chunks(size))
        sent += 1
        message = _make(setup, token, batch, chunks[1][batch], f"{setup.worker}-{sent}")
        try:
            results.send_bytes(pickle.dumps(message))
        except OSError:  # the loader closed its end: nobody takes batches any more
            if message[0] == "ok":
                discard(message[3], setup.folder)
            return


def _make(setup: _WorkerSetup, token: int, batch: int, indices: np.ndarray, name: str) -> tuple:
    """The message for one batch: ``("ok", ...)`` with its SharedBatch, or ``("error", ...)``."""
    item = None
    stage = "the batcher raised"
    try:
        items = []
        for index in indices:
            item = int(index)
            items.append(setup.dataset[item])
        item = None
        made = setup.batcher.batch(items, setup.device)
        stage = "the batch could not be sent back (every value in it must pickle)"
        return ("ok", token, batch, pack(made, setup.folder, name))
    except Exception as error:  # every error goes back to the loader, typed there
        if item is not None:
            stage = f"dataset[{item}] raised"
        elif stage.startswith("the batch could not") and isinstance(error, OSError):
            stage = f"the batch could not be written to shared memory in {setup.folder.path}"
        text = f"{type(error).__name__}: {error}"
        return ("error", token, batch, item, stage, text, traceback.format_exc())


# ---------------------------------------------------------------------------- the pool
@dataclass
class _Worker:
    number: int
    process: multiprocessing.process.BaseProcess
    tasks: Connection
    results: Connection
    # (token, batch, indices) of the tasks sent and not answered yet, oldest first
    pending: deque = field(default_factory=deque)


class ProcessWorkers:
    """``count`` worker processes making a loader's batches; iterate epochs with :meth:`run`.

    Args:
        dataset: the loader's dataset (inherited by a fork, pickled otherwise).
        batcher: the loader's batcher.
        device: the loader's device; workers batch on it when it is a bare NdArray device,
            else on ``ember.device("ndarray")``, and the loader moves the batches to it.
        count: worker processes (>= 1).
        start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``.
        timeout: the most seconds to wait for one batch from a live worker (None: no bound).

    A new :meth:`run` supersedes the previous one: its leftover batches are dropped.
    """

    def __init__(self, dataset: Any, batcher: Batcher, device: Device, count: int,
                 start_method: str, timeout: float | None) -> None:  # fmt: skip
        self.device = device
        self.host = device if is_host_device(device) else ember.device("ndarray")
        self.timeout = timeout
        self.folder = SegmentFolder.create()
        self.size = len(dataset)
        self._token = 0
        self._closed = False
        context = multiprocessing.get_context(start_method)
        seed = random.SystemRandom().randrange(2**63)
        self.workers: list[_Worker] = []
        for number in range(count):
            task_out, task_in = context.Pipe(duplex=False)
            result_out, result_in = context.Pipe(duplex=False)
            setup = _WorkerSetup(number, dataset, batcher, self.host, self.folder,
                                 os.getpid(), start_method, seed + number)  # fmt: skip
            process = context.Process(target=_worker_main, args=(setup, task_out, result_in),
                                      name=f"ember-data-{number}", daemon=True)  # fmt: skip
            try:
                process.start()
            except Exception as error:  # spawn / forkserver: the dataset or batcher did not pickle
                task_in.close()
                result_out.close()
                _shut_down(self.workers, self.folder, os.getpid())
                raise DataLoaderWorkerError(
                    f"DataLoader worker {number} could not start with start method "
                    f"{start_method!r} (the dataset and the batcher are pickled to it): "
                    f"{type(error).__name__}: {error}",
                    worker=number, pid=None, batch=None, cause=str(error)) from error  # fmt: skip
            finally:
                task_out.close()  # the worker's ends: only the worker holds them now
                result_in.close()
            self.workers.append(_Worker(number, process, task_in, result_out))
        self._finalizer = weakref.finalize(
            self, _shut_down, list(self.workers), self.folder, os.getpid()
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stops the workers (killing those that do not stop within a second) and frees the
        shared memory of batches not taken. Idempotent."""
        self._closed = True
        self._finalizer()

    # ------------------------------------------------------------------ one epoch
    def run(self, order: EpochOrder) -> Iterator[Any]:
        """Yields the batches of the epoch ``order`` describes, in order."""
        self._token += 1
        token = self._token
        chunks = order.chunks(self.size)
        self._check_alive()
        count = len(self.workers)
        arrived: dict[int, SharedBatch] = {}
        sent = 0
        superseded = None
        try:
            for batch in range(len(chunks)):
                if self._token != token or self._closed:  # taken over, or closed meanwhile
                    superseded = batch
                    break
                while sent < len(chunks) and sent < batch + PREFETCH_PER_WORKER * count:
                    task = (token, sent, order)
                    self._send(self.workers[sent % count], task, chunks[sent], arrived)
                    sent += 1
                deadline = None if self.timeout is None else time.monotonic() + self.timeout
                while batch not in arrived:
                    self._receive(arrived, self.workers[batch % count], batch, chunks[batch],
                                  deadline)  # fmt: skip
                yield unpack(arrived.pop(batch), self.folder, self.host, self.device)
        except GeneratorExit:
            raise  # left early: the batches still to come are dropped as they arrive
        except BaseException:
            self.close()  # a failure, or an interrupt in the middle of a message: not reused
            raise
        finally:
            for shared in arrived.values():
                discard(shared, self.folder)
        if superseded is not None:
            why = (
                "its workers were closed"
                if self._closed
                else "it was superseded by a newer one over the same persistent workers"
            )
            raise DataLoaderWorkerError(
                f"this iteration of the DataLoader stopped at batch {superseded}: {why} "
                "(iterate one epoch at a time)",
                worker=superseded % count,
                pid=None,
                batch=superseded,
                indices=chunks[superseded],
            )

    def _send(self, worker: _Worker, task: tuple, indices: np.ndarray,
              arrived: dict[int, SharedBatch]) -> None:  # fmt: skip
        worker.pending.append((task[0], task[1], indices))
        try:
            worker.tasks.send(task)
        except OSError:  # a broken pipe: the worker has ended
            raise self._ended(worker, arrived) from None

    def _check_alive(self) -> None:
        for worker in self.workers:
            if not worker.process.is_alive():
                error = self._death(worker)
                self.close()
                raise error

    def _receive(self, arrived: dict[int, SharedBatch], waited: _Worker,
                 batch: int, indices: np.ndarray, deadline: float | None) -> None:  # fmt: skip
        """Takes whatever the workers sent (or notices a dead one) while waiting for ``batch``."""
        by_handle = {}
        for worker in self.workers:
            by_handle[worker.results] = worker
            by_handle[worker.process.sentinel] = worker
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait(list(by_handle), left)
        if not ready:
            raise DataLoaderWorkerError(
                f"DataLoader worker {waited.number} (pid {waited.process.pid}) did not deliver "
                f"batch {batch} (items {describe_items(indices)}) within {self.timeout} s",
                worker=waited.number, pid=waited.process.pid, batch=batch, indices=indices,
                cause="timeout")  # fmt: skip
        for handle in ready:
            worker = by_handle[handle]
            if handle is worker.results:
                self._take(worker, arrived)
        for handle in ready:
            worker = by_handle[handle]
            if handle is worker.process.sentinel:
                raise self._ended(worker, arrived)

    def _ended(self, worker: _Worker, arrived: dict[int, SharedBatch]) -> DataLoaderWorkerError:
        """The error for a worker found dead, once what it sent before it ended is taken."""
        while worker.results.poll():
            self._take(worker, arrived)
        return self._death(worker)

    def _take(self, worker: _Worker, arrived: dict[int, SharedBatch]) -> None:
        """Reads one message of ``worker``: a batch of this epoch is kept, an older one freed."""
        try:
            message = pickle.loads(worker.results.recv_bytes())
        except (EOFError, OSError):
            raise self._death(worker) from None  # it ended in the middle of a message
        _, _, indices = worker.pending.popleft()  # a worker answers its tasks in order
        status, message_token, batch = message[:3]
        if message_token != self._token:  # a batch of an abandoned epoch
            if status == "ok":
                discard(message[3], self.folder)
            return
        if status == "ok":
            arrived[batch] = message[3]
            return
        item, stage, text, trace = message[3:]
        raise DataLoaderWorkerError(
            f"DataLoader worker {worker.number} (pid {worker.process.pid}) failed on batch "
            f"{batch} (items {describe_items(indices)}): {stage}: {text}\n"
            f"worker traceback:\n{trace}",
            worker=worker.number, pid=worker.process.pid, batch=batch, indices=indices,
            item=item, cause=text)  # fmt: skip

    def _death(self, worker: _Worker) -> DataLoaderWorkerError:
        """The error for a worker that ended: how, and the batch it was making (if any)."""
        worker.process.join(STOP_GRACE_SECONDS)
        code = worker.process.exitcode
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:  # a real-time or otherwise unnamed signal
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        if worker.pending:
            _, batch, indices = worker.pending[0]
            where = f"while making batch {batch} (items {describe_items(indices)})"
        else:
            batch, indices, where = None, (), "between batches"
        return DataLoaderWorkerError(
            f"DataLoader worker {worker.number} (pid {worker.process.pid}) {how} {where}",
            worker=worker.number,
            pid=worker.process.pid,
            batch=batch,
            indices=indices,
            cause=how,
        )


def _shut_down(workers: list[_Worker], folder: SegmentFolder, owner: int) -> None:
    """Stops ``workers`` (asked first, killed after a grace period) and removes ``folder``.

    Only in the process ``owner`` that started them: a forked worker inherits the pools of
    its parent, and must not stop them should its garbage collector finalize one.
    """
    if os.getpid() != owner:
        return
    for worker in workers:
        with contextlib.suppress(OSError, ValueError):
            worker.tasks.send(None)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(STOP_GRACE_SECONDS)
        for connection in (worker.tasks, worker.results):
            with contextlib.suppress(OSError, ValueError):
                connection.close()
        with contextlib.suppress(ValueError):
            worker.process.close()
    folder.remove()
