"""DataLoaderBuilder: the step-by-step way to configure a DataLoader."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ember.backend.device import Device, default_device
from ember.data.dataloader.batcher import Batcher
from ember.data.dataloader.loader import DataLoader, IndexedDataset, check_count, check_workers

BatchT = TypeVar("BatchT")


class DataLoaderBuilder(Generic[BatchT]):
    """Collects a loader's settings, then builds it on a dataset.

    Each setter checks its value at once (an :class:`~ember.backend.errors.ArgumentError`
    naming the setting and the value) and returns the builder, so calls chain.

    Args:
        batcher: makes each batch from its items.

    Defaults: ``batch_size`` 1, no shuffling (the dataset's order), ``num_workers`` 0
    (batches made in the iterating thread), the device ``ember.default_device()``.
    ``num_workers(n)`` starts worker threads; ``num_workers(n, kind="process")`` worker
    processes, as PyTorch's ``num_workers`` does.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.data.dataloader.batcher import Batcher
        >>> class Column(Batcher[float, Tensor]):
        ...     def batch(self, items, device):
        ...         return Tensor.from_data([[x] for x in items], device=device)
        >>> loader = (
        ...     DataLoaderBuilder(Column())
        ...     .batch_size(4)
        ...     .shuffle(42)
        ...     .num_workers(2)
        ...     .set_device(ember.device("ndarray"))
        ...     .build([0.5 * i for i in range(10)])
        ... )
        >>> [batch.shape for batch in loader]
        [(4, 1), (4, 1), (2, 1)]
    """

    def __init__(self, batcher: Batcher[Any, BatchT]) -> None:
        self._batcher = batcher
        self._batch_size = 1
        self._seed: int | None = None
        self._num_workers = 0
        self._workers: dict[str, Any] = {}
        self._device: Device | None = None

    def batch_size(self, batch_size: int) -> DataLoaderBuilder[BatchT]:
        """Items per batch (>= 1); the last batch of an epoch keeps the remainder."""
        self._batch_size = check_count("DataLoaderBuilder.batch_size", "batch_size", batch_size, 1)
        return self

    def shuffle(self, seed: int) -> DataLoaderBuilder[BatchT]:
        """Shuffles the items, with an order that depends only on ``(seed, epoch)``."""
        self._seed = check_count("DataLoaderBuilder.shuffle", "seed", seed, 0)
        return self

    def num_workers(
        self,
        num_workers: int,
        kind: str = "thread",
        *,
        persistent: bool = False,
        start_method: str | None = None,
        timeout: float | None = None,
    ) -> DataLoaderBuilder[BatchT]:
        """Workers that prepare batches ahead (>= 0; 0 prepares them on demand).

        Args:
            num_workers: how many.
            kind: ``"thread"`` (the default: nothing has to pickle, best when the work
                releases the GIL) or ``"process"`` (each process makes whole batches on a
                CPU NdArray device and hands them back in shared memory; best when the
                per-item work holds the GIL, as pure-Python decoding and augmentation do).
            persistent: process workers live across epochs (PyTorch's
                ``persistent_workers``) until the loader's ``close()``.
            start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; None: fork on
                Linux, spawn elsewhere (spawn and forkserver pickle the dataset and batcher).
            timeout: the most seconds to wait for one batch from a live process worker.

        Example:
            >>> from ember.data.dataloader.batcher import Batcher
            >>> class AsList(Batcher[int, list]):
            ...     def batch(self, items, device):
            ...         return items
            >>> build = DataLoaderBuilder(AsList()).batch_size(3).num_workers(2, "process")
            >>> with build.build(list(range(7))) as loader:
            ...     list(loader)
            [[0, 1, 2], [3, 4, 5], [6]]
        """
        owner = "DataLoaderBuilder.num_workers"
        self._num_workers = check_count(owner, "num_workers", num_workers, 0)
        check_workers(owner, kind, persistent, start_method, timeout)
        self._workers = {
            "worker_kind": kind,
            "persistent_workers": persistent,
            "start_method": start_method,
            "timeout": timeout,
        }
        return self

    def set_device(self, device: Device) -> DataLoaderBuilder[BatchT]:
        """The device the batcher puts the batches on."""
        self._device = device
        return self

    def build(self, dataset: IndexedDataset) -> DataLoader[BatchT]:
        """A loader over ``dataset`` with the settings collected so far."""
        return DataLoader(
            dataset,
            self._batcher,
            batch_size=self._batch_size,
            seed=self._seed,
            num_workers=self._num_workers,
            device=self._device if self._device is not None else default_device(),
            **self._workers,
        )
