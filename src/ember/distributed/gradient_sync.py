"""Gradients averaged over the ranks while the backward pass goes on (Burn's gradient sync).

Burn's distributed backend registers the parameters to synchronise before the backward
pass, submits each parameter's gradient as soon as the pass has finished it, all-reduces
them while the pass goes on, and waits for everything at the end. :class:`GradientSync`
does the same on any autodiff device, through the autodiff decorator's listener
(``backends/autodiff/listener.py``):

1. ``with sync.syncing(model):`` registers the model's trainable parameters (their graph
   leaves) and installs the listener for this thread's backward passes;
2. the parameters are laid out in **buckets** of about ``bucket_mb`` MB, last layer first
   (the order the backward pass reaches them); when every gradient of a bucket is
   finished (and every earlier bucket has left), the bucket is copied into one flat buffer
   and all-reduced asynchronously, so communication overlaps the rest of the pass;
3. at the end of the pass the listener waits for the buckets, divides by the world size,
   and puts the averaged gradients back into the :class:`Gradients` that ``backward()``
   returns (views of the reduced buffers, no copy).

Every rank must launch the same buckets in the same order, so the layout comes from the
parameters' order, shapes and dtypes only; a rank whose layout differs from rank 0's
(another model) gets a :class:`DistributedError` when it first registers, instead of a
collective that never matches. A parameter the backward pass did not reach contributes
zeros, so every rank ends with the same gradients for every registered parameter.

Example (in each process of a job)::

    import ember.distributed as dist
    dist.init()
    sync = dist.GradientSync()
    model = sync.broadcast_module(model)       # every rank starts from rank 0's weights
    with sync.syncing(model):
        grads = loss.backward()                # averaged over the ranks
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.backend.device import Device, device
from ember.backend.errors import ArgumentError
from ember.backends.autodiff.listener import listening
from ember.distributed.collectives import all_gather, broadcast
from ember.distributed.group import (
    DistributedError,
    control_device,
    failure_note,
    info,
    torch_distributed,
    world_size,
)
from ember.module import Module, Param, ParamId
from ember.tensor import DType, Kind, Tensor
from ember.tensor.data import numpy_dtype
from ember.tensor.tensor import _wrap


@dataclass(frozen=True)
class _Slot:
    path: str
    shape: tuple[int, ...]
    offset: int
    size: int


@dataclass(frozen=True)
class _Layout:
    """Where each parameter's gradient goes: buckets of slots, one dtype per bucket."""

    buckets: tuple[tuple[_Slot, ...], ...]
    dtypes: tuple[DType, ...]

    @property
    def digest(self) -> int:
        text = repr([(d.value, [(s.path, s.shape) for s in b]) for b, d in zip(self.buckets, self.dtypes)])
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


@dataclass
class SyncStats:
    """What the synchronisation did (cumulative over steps, except ``events``).

    ``events`` lists the last step's events in order: ``("ready", path)`` when the
    backward pass finished a parameter's gradient, ``("launch", bucket)`` when a bucket's
    all-reduce was issued, ``("finish", None)`` when the pass ended.
    """

    steps: int = 0
    buckets: int = 0
    bytes: int = 0
    wait_seconds: float = 0.0
    events: list[tuple[str, Any]] = field(default_factory=list)


class _Step:
    """One backward pass's listener: fills buckets, launches them in order, waits."""

    def __init__(self, sync: GradientSync, layout: _Layout, nodes: dict[int, tuple[int, int]],
                 leaves: list[Any], inner: Device) -> None:  # fmt: skip
        self.sync, self.layout, self.nodes, self.leaves, self.inner = sync, layout, nodes, leaves, inner
        self.on_torch = inner.backend.name == "torch"
        self.buffers: list[Any] = [None] * len(layout.buckets)
        self.missing = [len(b) for b in layout.buckets]
        self.filled = [[False] * len(b) for b in layout.buckets]
        self.works: list[Any] = []
        self.next_launch = 0
        self.torch_device = inner.backend.torch_device(inner) if self.on_torch else None

    def _buffer(self, bucket: int) -> Any:
        """The bucket's flat buffer, made when its first gradient arrives (fresh each step:
        the gradients handed back are views of it, and tensors never change)."""
        if self.buffers[bucket] is None:
            import torch

            count = sum(s.size for s in self.layout.buckets[bucket])
            dtype = _torch_dtype(self.layout.dtypes[bucket])
            device = self.torch_device if self.on_torch else "cpu"
            self.buffers[bucket] = torch.empty(count, dtype=dtype, device=device)
        return self.buffers[bucket]

    def _write(self, bucket: int, index: int, grad: Any) -> None:
        slot = self.layout.buckets[bucket][index]
        region = self._buffer(bucket)[slot.offset: slot.offset + slot.size]
        if grad is None:
            region.zero_()
        elif self.on_torch:
            region.copy_(grad.reshape(-1))
        else:
            region.copy_(_as_torch(_wrap(grad, self.inner, Kind.FLOAT)).reshape(-1))
        self.filled[bucket][index] = True
        self.missing[bucket] -= 1

    def on_gradient(self, node: Any, grad: Any) -> None:
        where = self.nodes.get(node.id)
        if where is None:
            return
        bucket, index = where
        if self.filled[bucket][index]:
            return
        self.sync.stats.events.append(("ready", self.layout.buckets[bucket][index].path))
        self._write(bucket, index, grad)
        self._launch_ready()

    def _launch_ready(self) -> None:
        dist = torch_distributed()
        while self.next_launch < len(self.buffers) and self.missing[self.next_launch] == 0:
            bucket = self.next_launch
            buffer = self.buffers[bucket]
            self.works.append(_issue(lambda b=buffer: dist.all_reduce(b, async_op=True)))
            self.sync.stats.events.append(("launch", bucket))
            self.sync.stats.bytes += buffer.numel() * buffer.element_size()
            self.next_launch += 1

    def on_finish(self, grads: Any) -> None:
        self.sync.stats.events.append(("finish", None))
        # Parameters the pass did not reach contribute zeros (see the module doc).
        for bucket, slots in enumerate(self.layout.buckets):
            for index in range(len(slots)):
                if not self.filled[bucket][index]:
                    self._write(bucket, index, None)
        self._launch_ready()
        started = time.perf_counter()
        for work in self.works:
            _issue(work.wait)
        self.sync.stats.wait_seconds += time.perf_counter() - started
        self.sync.stats.steps += 1
        self.sync.stats.buckets += len(self.buffers)
        size = world_size()
        for bucket, slots in enumerate(self.layout.buckets):
            buffer = self.buffers[bucket]
            buffer.div_(size)
            for slot, leaf in zip(slots, self.leaves[bucket], strict=True):
                grads.replace(leaf, self._result(buffer[slot.offset: slot.offset + slot.size], slot))

    def _result(self, region: Any, slot: _Slot) -> Any:
        """The averaged gradient as an inner primitive: a view of the buffer, not a copy."""
        if self.on_torch:
            return region.view(slot.shape)
        flat = Tensor.from_data(_wrap(region, device("torch"), Kind.FLOAT).into_data(), self.inner)
        return flat.reshape(list(slot.shape))._prim


@functools.cache
def _torch_dtype(dtype: DType) -> Any:
    return Tensor.zeros([0], device("torch"), dtype)._prim.dtype


def _as_torch(tensor: Tensor) -> Any:
    """``tensor``'s elements as a CPU torch tensor (sharing NdArray's buffer)."""
    return Tensor.from_data(tensor.into_data(), device("torch"))._prim


def _issue(call) -> Any:
    try:
        return call()
    except RuntimeError as e:
        raise DistributedError(
            f"ember.distributed.GradientSync: rank {info().rank}: a gradient all-reduce failed "
            f"({failure_note()}): {e}"
        ) from e


class GradientSync:
    """Averages a model's gradients over the ranks while ``backward()`` runs.

    Args:
        bucket_mb: the size of a bucket in MB (10^6 bytes); smaller buckets start
            communicating earlier, larger ones send fewer messages. Default: 25, as
            PyTorch's DistributedDataParallel.

    In a job of one process (no :func:`~ember.distributed.init`, or a world of one),
    :meth:`syncing` changes nothing, so the same code runs on one process and on many.
    """

    def __init__(self, bucket_mb: float = 25.0) -> None:
        if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, int | float) or not bucket_mb > 0:
            raise ArgumentError(f"GradientSync: bucket_mb must be a number > 0, got {bucket_mb!r}")
        self.bucket_bytes = int(bucket_mb * 1e6)
        self.stats = SyncStats()
        self._layout: _Layout | None = None

    @contextmanager
    def syncing(self, module: Module) -> Iterator[SyncStats]:
        """Backward passes of this thread inside the block average ``module``'s gradients
        over the ranks (see the module doc); yields :attr:`stats`."""
        if not isinstance(module, Module):
            raise ArgumentError(f"GradientSync.syncing: expected a Module, got {type(module).__name__}")
        if world_size() == 1:
            yield self.stats
            return
        step = self._register(module)
        if step is None:
            yield self.stats
            return
        with listening(step):
            yield self.stats

    def _register(self, module: Module) -> _Step | None:
        """Burn's ``register_sync_parameters``: the graph leaves of the trainable parameters."""
        params = [(path, p) for path, p in module.params()
                  if p.require_grad and p.kind is Kind.FLOAT and p.val().is_require_grad()]  # fmt: skip
        if not params:
            return None
        params.reverse()  # the backward pass reaches the last layers first
        layout = self._layout_of(params)
        if layout != self._layout:
            self._agree(layout)
            self._layout = layout
        self.stats.events = []
        nodes: dict[int, tuple[int, int]] = {}
        leaves: list[list[Any]] = []
        by_path = dict(params)
        for b, slots in enumerate(layout.buckets):
            leaves.append([])
            for i, slot in enumerate(slots):
                node = by_path[slot.path].val()._prim.node
                nodes[node.id] = (b, i)
                leaves[b].append(node)
        inner = params[0][1].val().device.inner()
        return _Step(self, layout, nodes, leaves, inner)

    def _layout_of(self, params: list[tuple[str, Param]]) -> _Layout:
        buckets: list[tuple[_Slot, ...]] = []
        dtypes: list[DType] = []
        open_: dict[DType, tuple[list[_Slot], int]] = {}
        for path, param in params:
            dtype = param.dtype
            slots, offset = open_.get(dtype, ([], 0))
            size = param.num_elements()
            slots.append(_Slot(path, tuple(param.shape), offset, size))
            offset += size
            if offset * np.dtype(numpy_dtype(dtype)).itemsize >= self.bucket_bytes:
                buckets.append(tuple(slots))
                dtypes.append(dtype)
                open_.pop(dtype, None)
            else:
                open_[dtype] = (slots, offset)
        for dtype, (slots, _) in open_.items():
            buckets.append(tuple(slots))
            dtypes.append(dtype)
        return _Layout(tuple(buckets), tuple(dtypes))

    def _agree(self, layout: _Layout) -> None:
        mine = Tensor.from_data(np.array([layout.digest], dtype=np.int64), control_device())
        digests = [int(t.to_numpy()[0]) for t in all_gather(mine)]
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        if differ:
            raise DistributedError(
                f"ember.distributed.GradientSync: the parameters of rank(s) {differ} differ from "
                "rank 0's (paths, shapes or dtypes): every rank must train the same model"
            )

    def broadcast_module(self, module: Module, src: int = 0) -> Module:
        """``module`` with rank ``src``'s parameter values and ids, on every rank.

        Every rank starts equal; equal ids also let rank 0's checkpoints (optimizer state
        keyed by parameter id) resume on every rank.
        """
        if not isinstance(module, Module):
            raise ArgumentError(f"GradientSync.broadcast_module: expected a Module, got {type(module).__name__}")
        if world_size() == 1:
            return module
        params = list(module.params())
        ids = np.array([p.id.value for _, p in params], dtype=np.uint64).view(np.int64)
        theirs = broadcast(Tensor.from_data(ids, control_device()), src).to_numpy()
        new_ids = {path: ParamId(int(v)) for (path, _), v in zip(params, theirs.view(np.uint64))}

        def on_param(path: str, param: Param) -> Param:
            value = broadcast(param.val(), src)
            if param.val().is_require_grad() and not value.is_require_grad():
                value = value.require_grad()
            return type(param)(value, new_ids[path], param.require_grad)

        return module.map(on_param)
