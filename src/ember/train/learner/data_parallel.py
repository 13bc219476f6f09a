"""What the learner does differently in a job of several processes (data parallelism).

When the process group of :mod:`ember.distributed` has more than one rank, the learner
trains data-parallel, one process per device, with nothing to change in the model or the
training script:

* every rank starts from rank 0's weights (``GradientSync.broadcast_module``, ids too, so
  rank 0's checkpoints resume on every rank);
* each rank reads its own part of every epoch (``DataLoader.split``: disjoint, in the same
  seeded order as one process), and every rank runs the same number of steps: the smallest
  part's batch count (so at most one batch per rank and epoch is left out when the parts'
  sizes differ; no rank waits for a collective another will never join);
* ``train_step``'s backward pass averages the gradients over the ranks while it runs
  (:class:`~ember.distributed.GradientSync`), so every rank makes the same optimizer step;
* after each iteration one small all-reduce combines the numeric metrics (each rank's
  epoch value weighted by its items: exact for means such as loss and accuracy, an
  average of the ranks' values for the others) and the stop requests, so every rank
  records the same history and stops at the same iteration;
* only rank 0 writes: the dashboard, the metric logs, the experiment trackers,
  ``experiment.log`` and checkpoints.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from ember.module import Module
from ember.tensor import Tensor


class DataParallel:
    """This process's part in a data-parallel run (see the module doc).

    Args:
        bucket_mb: the gradient buckets' size (see :class:`~ember.distributed.GradientSync`).
    """

    def __init__(self, bucket_mb: float = 25.0) -> None:
        import ember.distributed as dist

        self.rank = dist.rank()
        self.world_size = dist.world_size()
        self.sync = dist.GradientSync(bucket_mb)

    @staticmethod
    def current() -> DataParallel | None:
        """A :class:`DataParallel` when this process is one rank of several, else None."""
        import ember.distributed as dist

        return DataParallel() if dist.is_initialized() and dist.world_size() > 1 else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def start(self, model: Module) -> Module:
        """``model`` with rank 0's parameters on every rank."""
        return self.sync.broadcast_module(model)

    def shard(self, loader: Any) -> tuple[Any, int]:
        """This rank's part of ``loader`` and the steps every rank runs per epoch."""
        parts = loader.split(self.world_size)
        return parts[self.rank], min(len(part) for part in parts)

    def syncing(self, model: Module) -> AbstractContextManager[Any]:
        """The backward passes inside average ``model``'s gradients over the ranks."""
        return self.sync.syncing(model)

    def combine(self, values: list[tuple[float, int]], stop: bool) -> tuple[list[float], bool]:
        """Every rank's ``(epoch value, items)`` pairs combined into global values, and
        whether any rank asked to stop; one collective for all of them."""
        import ember.distributed as dist

        flat = [1.0 if stop else 0.0]
        for value, items in values:
            known = items > 0 and not math.isnan(value)
            flat += [value * items if known else 0.0, float(items) if known else 0.0]
        mine = Tensor.from_data(np.array(flat, np.float64), dist.group.control_device())
        total = dist.all_reduce(mine, "sum", check=False).to_numpy()
        combined = [float(total[1 + 2 * i] / total[2 + 2 * i]) if total[2 + 2 * i] else float("nan")
                    for i in range(len(values))]  # fmt: skip
        return combined, bool(total[0] > 0)
