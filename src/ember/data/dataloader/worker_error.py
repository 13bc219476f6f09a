"""DataLoaderWorkerError: a worker process failed to make a batch."""

from __future__ import annotations

from collections.abc import Sequence

from ember.backend.errors import EmberError


class DataLoaderWorkerError(EmberError, RuntimeError):
    """A loader's worker process raised, died, or stopped answering while making a batch.

    The message names the worker, its process id, the batch and the dataset indices of
    the batch's items, and carries the original error's type, text and worker-side
    traceback (or, for a dead worker, how it ended: exit code or signal).

    Attributes:
        worker: the worker's number (0 .. num_workers - 1).
        pid: the worker's process id.
        batch: the batch's number in the epoch, or None when the worker failed between
            batches.
        indices: the dataset indices of the batch's items (empty when ``batch`` is None).
        item: the dataset index whose ``dataset[i]`` raised, or None (the batcher raised,
            the batch could not be sent back, or the process died).
        cause: the original error as ``"Type: text"``, or how the process ended.
    """

    def __init__(
        self,
        message: str,
        *,
        worker: int,
        pid: int | None,
        batch: int | None,
        indices: Sequence[int] = (),
        item: int | None = None,
        cause: str = "",
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.batch = batch
        self.indices = tuple(int(i) for i in indices)
        self.item = item
        self.cause = cause

    def __reduce__(self):
        # Keyword-only attributes: rebuild through a helper so the error pickles (pytest-xdist,
        # a Learner reporting from a process) with everything it carries.
        return _rebuild, (self.args[0], self.__dict__)


def _rebuild(message: str, attributes: dict) -> DataLoaderWorkerError:
    error = DataLoaderWorkerError.__new__(DataLoaderWorkerError)
    Exception.__init__(error, message)
    error.__dict__.update(attributes)
    return error


def describe_items(indices: Sequence[int], limit: int = 16) -> str:
    """The indices as ``[3, 17, 42]``, shortened with a count past ``limit`` of them."""
    shown = ", ".join(str(int(i)) for i in indices[:limit])
    more = len(indices) - limit
    return f"[{shown}, ... {more} more]" if more > 0 else f"[{shown}]"
