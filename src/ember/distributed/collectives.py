"""Collectives on ember tensors: all_reduce, broadcast, all_gather, reduce_scatter, barrier.

Every rank calls the same collective with a tensor of the same shape and dtype. Each
returns new tensors on the input's device and leaves the input as it was (see
``bridge.py`` for the one copy this costs). Tensors of every backend go through the
engine (gloo or NCCL): those of the Torch backend as they are, the others through a CPU
buffer that NumPy and torch share.

A rank that passes another shape or dtype than the others would make gloo abort the
whole process from one of its threads. So each collective first exchanges a small header
(dtype and shape) with the others and raises :class:`~ember.backend.errors.ShapeError` or
:class:`~ember.backend.errors.DTypeError` on every rank, naming the ranks that differ. The
header is one extra message of a few bytes, sent before the collective copies its input
and awaited after, so the copy hides part of its round trip; what is left is noticeable
for messages under a few MB (see ``benchmarks/distributed.py``); ``check=False`` (or ``EMBER_DIST_CHECK=0``) skips it where the caller
knows the shapes agree, as the gradient synchronisation does (it checks its layout once).

Example (in each of the job's processes)::

    import ember, ember.distributed as dist
    dist.init()
    x = ember.Tensor.from_data([1.0, 2.0]) * (dist.rank() + 1)
    total = dist.all_reduce(x, "sum")   # [3.0, 6.0] on both ranks of a job of two
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from ember.backend.environment import switch
from ember.backend.errors import ArgumentError, DTypeError, ShapeError, fmt_shape
from ember.distributed import bridge
from ember.distributed.group import DistributedError, failure_note, info, torch_distributed
from ember.tensor import DType, Tensor
from ember.tensor.tensor import _wrap

_MAX_RANK = 8  # header slots for a shape's dims; more dims are folded into a hash


class ReduceOp(enum.Enum):
    """How :func:`all_reduce` and :func:`reduce_scatter` combine the ranks' elements."""

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    PRODUCT = "product"

    @staticmethod
    def parse(op: ReduceOp | str, owner: str) -> ReduceOp:
        if isinstance(op, ReduceOp):
            return op
        try:
            return ReduceOp(op)
        except ValueError:
            names = ", ".join(repr(o.value) for o in ReduceOp)
            raise ArgumentError(f"{owner}: op must be one of {names}, got {op!r}") from None


def _engine_op(op: ReduceOp, dtype: DType, owner: str) -> Any:
    dist = torch_distributed()
    if dtype is DType.BOOL and op in (ReduceOp.SUM, ReduceOp.MEAN):
        raise DTypeError(f"{owner}: {op.value} of bool tensors is not defined; use max (any) "
                         "or min (all), or cast to an int dtype")  # fmt: skip
    if op is ReduceOp.MEAN and not dtype.is_float:
        raise DTypeError(f"{owner}: mean of {dtype.value} tensors is not defined; cast to a "
                         "float dtype first")  # fmt: skip
    return {
        ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.MEAN: dist.ReduceOp.AVG,
        ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.MIN: dist.ReduceOp.MIN,
        ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
    }[op]  # fmt: skip


def _checking(check: bool | None) -> bool:
    if check is not None:
        return check
    return switch("EMBER_DIST_CHECK", True)


def _prepare(owner: str, tensor: Any) -> None:
    """The checks every collective makes on its input before anything is sent."""
    if not isinstance(tensor, Tensor):
        raise ArgumentError(f"{owner}: expected an ember Tensor, got {type(tensor).__name__}")
    group = info(owner)
    bridge.check_dtype(owner, tensor, group.engine)
    if group.engine == "nccl" and bridge.engine_device(tensor).type != "cuda":
        raise ArgumentError(f"{owner}: the nccl engine carries CUDA tensors; this one is on "
                            f"{tensor.device}")  # fmt: skip


def _agreement(owner: str, tensor: Tensor, check: bool | None) -> _Agreement | _Agreed:
    """The shape/dtype agreement message, sent now; the caller confirms it once its copy
    of the input is made (see :class:`_Agreement`)."""
    if _checking(check) and info(owner).world_size > 1:
        return _Agreement(owner, tensor)
    return _AGREED


def _header(tensor: Tensor) -> np.ndarray:
    shape = tensor.shape
    dims = list(shape[:_MAX_RANK]) + [0] * (_MAX_RANK - min(len(shape), _MAX_RANK))
    extra = hash(shape[_MAX_RANK:]) & 0x7FFFFFFF if len(shape) > _MAX_RANK else 0
    code = list(DType).index(tensor.dtype)
    return np.array([len(shape), code, extra, *dims], dtype=np.int64)


class _Agreement:
    """Whether the ranks passed tensors of one dtype and shape (see the module doc).

    The message leaves at once and :meth:`confirm` waits for it: the collective's copy of
    its input is made meanwhile, so the round trip costs what the copy does not hide.
    :meth:`confirm` raises on every rank when the ranks differ."""

    def __init__(self, owner: str, tensor: Tensor) -> None:
        import torch

        self.owner, self.header = owner, _header(tensor)
        self.device = bridge.engine_device(tensor)
        # One all-reduce of (h, -h) by max gives every rank the largest and the smallest
        # value of each field: equal everywhere means the ranks agree (one message).
        self.extremes = torch.from_numpy(np.concatenate([self.header, -self.header]))
        if self.device.type == "cuda":
            self.extremes = self.extremes.to(self.device)
        dist = torch_distributed()
        self.work = _run(owner, lambda: dist.all_reduce(self.extremes, op=dist.ReduceOp.MAX,
                                                        async_op=True))  # fmt: skip

    def confirm(self) -> None:
        _run(self.owner, self.work.wait)
        extremes = self.extremes.cpu().numpy()
        if (extremes[: self.header.size] == -extremes[self.header.size:]).all():
            return
        self._describe_and_raise()

    def _describe_and_raise(self) -> None:
        import torch

        # They differ: every rank learned it, and every rank gathers the headers to say how.
        dist = torch_distributed()
        mine = torch.from_numpy(self.header)
        if self.device.type == "cuda":
            mine = mine.to(self.device)
        everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        _run(self.owner, lambda: dist.all_gather(everyone, mine))
        headers = [h.cpu().numpy() for h in everyone]
        dtypes = list(DType)

        def describe(h: np.ndarray) -> str:
            rank, code = int(h[0]), int(h[1])
            dims = tuple(int(d) for d in h[3:3 + min(rank, _MAX_RANK)])
            more = "+..." if rank > _MAX_RANK else ""
            return f"{dtypes[code].value} {fmt_shape(dims)}{more}"

        seen = ", ".join(f"rank {r}: {describe(h)}" for r, h in enumerate(headers))
        kind = DTypeError if len({int(h[1]) for h in headers}) > 1 else ShapeError
        raise kind(f"{self.owner}: the ranks passed different tensors ({seen}); every rank "
                   "must pass the same shape and dtype")  # fmt: skip


class _Agreed:
    """No agreement message (``check=False``, or a job of one process)."""

    def confirm(self) -> None:
        pass


_AGREED = _Agreed()


def _run(owner: str, call) -> Any:
    try:
        return call()
    except DistributedError:
        raise
    except RuntimeError as e:  # gloo/NCCL: a peer closed the connection, a timeout
        raise DistributedError(f"{owner}: rank {info(owner).rank}: the collective failed "
                               f"({failure_note()}): {e}") from e  # fmt: skip


def all_reduce(tensor: Tensor, op: ReduceOp | str = "sum", check: bool | None = None,
               donate: bool = False) -> Tensor:  # fmt: skip
    """The elements of every rank's ``tensor`` combined by ``op``, on every rank.

    Args:
        tensor: this rank's tensor; every rank passes the same shape and dtype.
        op: ``"sum"``, ``"mean"`` (float dtypes), ``"max"``, ``"min"`` or ``"product"``.
        check: exchange shapes first (see the module doc). Default: ``EMBER_DIST_CHECK``, on.
        donate: the caller gives ``tensor`` up, as Burn's ``all_reduce`` takes it by value:
            where nothing else refers to its buffer (a plain NdArray or Torch tensor just
            computed, say), the result is written into that buffer instead of a copy, and
            ``tensor`` must not be read again. Default: False.

    Raises:
        NotInitializedError: before ``ember.distributed.init()``.
        DTypeError: a dtype the engine cannot carry, or an op not defined for it.
        ShapeError: the ranks passed different shapes.
        DistributedError: a peer failed or the collective timed out.
    """
    owner = "ember.distributed.all_reduce"
    op = ReduceOp.parse(op, owner)
    _prepare(owner, tensor)
    engine_op = _engine_op(op, tensor.dtype, owner)
    agreement = _agreement(owner, tensor, check)
    dist = torch_distributed()
    given = bridge.donated(tensor) if donate else None
    buffer = bridge.to_engine(tensor) if given is None else given
    agreement.confirm()
    _run(owner, lambda: dist.all_reduce(buffer, op=engine_op))
    if given is not None:  # the result is the donated tensor's buffer, as it was
        return _wrap(tensor._prim, tensor.device, tensor.kind)
    return bridge.from_engine(buffer, tensor)


def broadcast(tensor: Tensor, src: int = 0, check: bool | None = None) -> Tensor:
    """Rank ``src``'s ``tensor`` on every rank (each rank passes a tensor of its shape)."""
    owner = "ember.distributed.broadcast"
    _check_rank(owner, "src", src)
    _prepare(owner, tensor)
    agreement = _agreement(owner, tensor, check)
    dist = torch_distributed()
    buffer = bridge.to_engine(tensor)
    agreement.confirm()
    _run(owner, lambda: dist.broadcast(buffer, src))
    return bridge.from_engine(buffer, tensor)


def all_gather(tensor: Tensor, check: bool | None = None) -> list[Tensor]:
    """Every rank's ``tensor``, in rank order, on every rank."""
    owner = "ember.distributed.all_gather"
    _prepare(owner, tensor)
    agreement = _agreement(owner, tensor, check)
    dist = torch_distributed()
    buffer = bridge.to_engine(tensor).reshape(-1)
    gathered = buffer.new_empty((dist.get_world_size(), buffer.numel()))
    agreement.confirm()
    _run(owner, lambda: _gather_op(dist)(gathered.reshape(-1), buffer))
    return [bridge.from_engine(part.reshape(tensor.shape), tensor) for part in gathered]


def reduce_scatter(tensor: Tensor, op: ReduceOp | str = "sum", check: bool | None = None) -> Tensor:
    """Rank r's part of the ranks' ``tensor`` combined by ``op``: rows ``r*n/W`` to
    ``(r+1)*n/W`` of dim 0, where ``n`` (the length of dim 0) is a multiple of the world size
    ``W``.

    Raises:
        ShapeError: a 0-d tensor, or dim 0 not a multiple of the world size.
    """
    owner = "ember.distributed.reduce_scatter"
    op = ReduceOp.parse(op, owner)
    size = info(owner).world_size
    if isinstance(tensor, Tensor) and (not tensor.shape or tensor.shape[0] % size):
        raise ShapeError(f"{owner}: dim 0 must be a multiple of the world size {size}, got "
                         f"shape {fmt_shape(tensor.shape)}")  # fmt: skip
    _prepare(owner, tensor)
    engine_op = _engine_op(op, tensor.dtype, owner)
    agreement = _agreement(owner, tensor, check)
    dist = torch_distributed()
    buffer = bridge.to_engine(tensor)
    part = buffer.new_empty((buffer.shape[0] // size, *buffer.shape[1:]))
    agreement.confirm()
    _run(owner, lambda: _scatter_op(dist)(part, buffer, op=engine_op))
    return bridge.from_engine(part, tensor)


def barrier() -> None:
    """Waits until every rank has called it."""
    owner = "ember.distributed.barrier"
    info(owner)
    dist = torch_distributed()
    _run(owner, dist.barrier)


def _gather_op(dist):
    # torch 2.13 renamed these (the old names warn); older releases only have the old ones.
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _scatter_op(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _check_rank(owner: str, name: str, value: Any) -> None:
    size = info(owner).world_size
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ArgumentError(f"{owner}: {name} must be a rank in [0, {size}), got {value!r}")
