"""The process group: which process this is, how many there are, and how they talk.

ember has no communication layer of its own (DESIGN.md section 9): a process group is a
``torch.distributed`` one, gloo on the CPU and NCCL on CUDA, one process per device. A job
is started the way PyTorch jobs are, by ``torchrun`` or ``ember launch``, which set the
standard variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``; :func:`init` reads them, or takes the same values as arguments.

Example (two processes on this machine, each running)::

    import ember.distributed as dist
    dist.init()                     # from the variables torchrun / ember launch set
    print(dist.rank(), dist.world_size())
    dist.shutdown()
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import sys
from dataclasses import dataclass

from ember.backend.errors import ArgumentError, BackendUnavailableError, EmberError

#: How long a collective waits for the other ranks before it fails (a dead or stuck rank
#: must not hang the job). ``EMBER_DIST_TIMEOUT`` (seconds) or ``init(timeout=...)``.
DEFAULT_TIMEOUT = 300.0

_ENGINES = ("gloo", "nccl")


class DistributedError(EmberError, RuntimeError):
    """A collective or the process group failed: not initialised, a peer gone, a timeout."""


class NotInitializedError(DistributedError):
    """A collective was called before :func:`init` (or after :func:`shutdown`)."""


@dataclass(frozen=True)
class GroupInfo:
    """This process's place in the job (what :func:`info` returns)."""

    rank: int
    world_size: int
    local_rank: int
    engine: str
    timeout: float


_info: GroupInfo | None = None


def torch_distributed():
    """``torch.distributed``, or :class:`BackendUnavailableError` naming the extra."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise BackendUnavailableError(
            "ember.distributed runs on torch.distributed: install the extra with "
            "`pip install ember[torch]`"
        ) from e
    if not dist.is_available():
        raise BackendUnavailableError(
            f"ember.distributed: this torch build ({torch.__version__}) has no torch.distributed"
        )
    return dist


def _env_int(name: str, given: int | None) -> int | None:
    if given is not None:
        return given
    text = os.environ.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ArgumentError(f"ember.distributed.init: {name}={text!r} is not an integer") from None


def init(
    engine: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    local_rank: int | None = None,
    timeout: float | None = None,
) -> GroupInfo:
    """Joins this process to the job's process group; call once per process.

    Arguments left out are read from the standard variables (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); a job of one process needs none.

    Args:
        engine: ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors). Default: gloo.
        rank: this process's index, ``0 <= rank < world_size``.
        world_size: how many processes take part.
        master_addr: the host of rank 0's rendezvous store. Default: ``127.0.0.1``.
        master_port: its port. Default: 29500.
        local_rank: the process's index on its machine (picks its GPU). Default: rank.
        timeout: seconds a collective waits for the others before failing. Default:
            ``EMBER_DIST_TIMEOUT`` or 300.

    Raises:
        ArgumentError: a value out of range, or a variable that is not an integer.
        DistributedError: already initialised, or the rendezvous failed.
        BackendUnavailableError: torch is not installed.
    """
    global _info
    if _info is not None:
        raise DistributedError(
            f"ember.distributed.init: already initialised as rank {_info.rank} of "
            f"{_info.world_size}; call shutdown() first"
        )
    engine = engine or "gloo"
    if engine not in _ENGINES:
        raise ArgumentError(f"ember.distributed.init: engine must be one of {_ENGINES}, got {engine!r}")
    world_size = _env_int("WORLD_SIZE", world_size)
    rank = _env_int("RANK", rank)
    world_size = 1 if world_size is None else world_size
    rank = 0 if rank is None else rank
    if world_size < 1:
        raise ArgumentError(f"ember.distributed.init: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ArgumentError(
            f"ember.distributed.init: rank must be in [0, {world_size}), got {rank}"
        )
    local_rank = _env_int("LOCAL_RANK", local_rank)
    local_rank = rank if local_rank is None else local_rank
    port = _env_int("MASTER_PORT", master_port)
    port = 29500 if port is None else port
    if not 0 < port < 65536:
        raise ArgumentError(f"ember.distributed.init: master_port must be in 1..65535, got {port}")
    addr = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    if timeout is None:
        text = os.environ.get("EMBER_DIST_TIMEOUT")
        try:
            timeout = DEFAULT_TIMEOUT if text is None else float(text)
        except ValueError:
            raise ArgumentError(
                f"ember.distributed.init: EMBER_DIST_TIMEOUT={text!r} is not a number"
            ) from None
    if not timeout > 0:
        raise ArgumentError(f"ember.distributed.init: timeout must be > 0 seconds, got {timeout}")

    dist = torch_distributed()
    if dist.is_initialized():
        raise DistributedError(
            "ember.distributed.init: torch.distributed already has a process group; "
            "ember joins a job once, through init()"
        )
    try:
        dist.init_process_group(
            engine, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )  # fmt: skip
    except Exception as e:  # torch raises RuntimeError, DistStoreError, ValueError ...
        raise DistributedError(
            f"ember.distributed.init: rank {rank} of {world_size} could not join the group at "
            f"{addr}:{port} ({engine}): {e}"
        ) from e
    _info = GroupInfo(rank, world_size, local_rank, engine, timeout)
    _report_failures_to_peers(rank)
    # A group left alive at exit aborts the process in gloo's threads; leave it cleanly.
    atexit.register(shutdown)
    return _info


_FAILED = "ember/failed/"


def _store():
    """The job's key-value store (the rendezvous's), or None where torch hides it."""
    getter = getattr(torch_distributed().distributed_c10d, "_get_default_store", None)
    try:
        return getter() if getter is not None else None
    except Exception:  # no default group any more
        return None


def _report_failures_to_peers(rank: int) -> None:
    """An uncaught error of this process is left in the store, so that the ranks left
    waiting in a collective can say which rank failed and why (:func:`failure_note`)."""
    previous = sys.excepthook

    def hook(kind, error, trace):
        store = _store() if _info is not None else None
        if store is not None:
            # The store may be gone with rank 0; the error still prints.
            with contextlib.suppress(Exception):
                store.set(f"{_FAILED}{rank}", f"{kind.__name__}: {error}"[:2000])
        previous(kind, error, trace)

    sys.excepthook = hook


def failure_note() -> str:
    """What the store says about failed ranks, for an error of a collective that failed."""
    store = _store() if _info is not None else None
    notes = []
    if store is not None:
        for peer in range(_info.world_size):
            key = f"{_FAILED}{peer}"
            try:
                if store.check([key]):
                    notes.append(f"rank {peer} failed: {store.get(key).decode(errors='replace')}")
            except Exception:  # the store is rank 0's: gone when rank 0 is
                break
    if notes:
        return "; ".join(notes)
    return "another rank closed its connection or stopped answering (it may have died)"


def shutdown() -> None:
    """Leaves the process group (nothing happens when there is none)."""
    global _info
    if _info is None:
        return
    _info = None
    atexit.unregister(shutdown)
    dist = torch_distributed()
    if dist.is_initialized():
        dist.destroy_process_group()


def is_initialized() -> bool:
    """Whether :func:`init` ran in this process (and :func:`shutdown` did not)."""
    return _info is not None


def info(owner: str = "ember.distributed") -> GroupInfo:
    """This process's :class:`GroupInfo`; :class:`NotInitializedError` before :func:`init`."""
    if _info is None:
        raise NotInitializedError(
            f"{owner}: the process group is not initialised; call ember.distributed.init() "
            "first (in each process, e.g. started by `ember launch` or torchrun)"
        )
    return _info


def control_device():
    """The ember device of the small tensors ember exchanges itself (layouts, metrics, ids):
    NdArray on gloo, this process's GPU (``LOCAL_RANK``) on NCCL, which carries only CUDA."""
    from ember.backend.device import device

    group = info()
    return device("torch", f"cuda:{group.local_rank}") if group.engine == "nccl" else device("ndarray")


def rank() -> int:
    """This process's rank; 0 when no process group was initialised (a job of one)."""
    return 0 if _info is None else _info.rank


def world_size() -> int:
    """How many processes take part; 1 when no process group was initialised."""
    return 1 if _info is None else _info.world_size


def is_main_process() -> bool:
    """Whether this process is rank 0, the one that writes files (DESIGN.md section 9)."""
    return rank() == 0
