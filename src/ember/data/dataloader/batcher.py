"""The Batcher protocol: how a list of dataset items becomes one batch on a device."""

from __future__ import annotations

import abc
from typing import Generic, TypeVar

from ember.backend.device import Device

ItemT = TypeVar("ItemT")
BatchT = TypeVar("BatchT")


class Batcher(abc.ABC, Generic[ItemT, BatchT]):
    """Turns the items of one batch into the batch the model takes, on a given device.

    A :class:`~ember.data.dataloader.loader.DataLoader` calls ``batch`` once per batch,
    with the items in the loader's order and the loader's device; with ``num_workers``
    above zero it calls it from several worker threads at once, so a batcher must not
    change shared state while batching (keep it a plain value). Process workers call it
    in each worker process with a CPU NdArray device (the loader's own device when that
    is one) and the loader moves the batch to its device: a batch is any nesting of
    tuples, lists, dicts, dataclasses and other picklable values around Tensors.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> class Numbers(Batcher[float, Tensor]):
        ...     def batch(self, items, device):
        ...         return Tensor.from_data([[x] for x in items], device=device)
        >>> Numbers().batch([1.0, 2.0, 3.0], ember.device("ndarray")).shape
        (3, 1)
    """

    @abc.abstractmethod
    def batch(self, items: list[ItemT], device: Device) -> BatchT:
        """The batch of ``items`` (in this order), with its tensors on ``device``."""
