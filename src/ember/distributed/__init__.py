"""Data-parallel training across processes, on ``torch.distributed`` (DESIGN.md section 9).

* :mod:`~ember.distributed.group`: joining the job (:func:`init`, :func:`rank`, ...);
* :mod:`~ember.distributed.collectives`: all_reduce, broadcast, all_gather, reduce_scatter,
  barrier on ember tensors of any backend;
* :mod:`~ember.distributed.gradient_sync`: gradients all-reduced in buckets while the
  backward pass goes on.
"""

from ember.distributed.collectives import (
    ReduceOp,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    reduce_scatter,
)
from ember.distributed.gradient_sync import GradientSync, SyncStats
from ember.distributed.group import (
    DistributedError,
    GroupInfo,
    NotInitializedError,
    info,
    init,
    is_initialized,
    is_main_process,
    rank,
    shutdown,
    world_size,
)

__all__ = [
    "DistributedError", "GradientSync", "GroupInfo", "NotInitializedError", "ReduceOp",
    "SyncStats", "all_gather", "all_reduce", "barrier", "broadcast", "info", "init",
    "is_initialized", "is_main_process", "rank", "reduce_scatter", "shutdown", "world_size",
]  # fmt: skip
