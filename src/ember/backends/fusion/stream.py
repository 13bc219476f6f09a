"""Streams: the ops a thread has recorded on a device and not yet run.

Each (thread, inner device) pair has its own :class:`Stream`, as in Burn: a thread's ops
never interleave with another's, so many threads training at once compute what they
would one after another. A stream runs (hands its records to its executor, in order) on
``sync``, at :data:`MAX_RECORDS`, or on :meth:`Stream.flush`. Reading a value runs the
stream too, except where the value is small arithmetic beside larger pending work
(:meth:`Stream.flush_for`): the shape arithmetic of an imported model runs alone and does
not cut the rest of the stream short of fusion. Reading a value another thread's stream
will make runs in that stream (under its lock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ember.backend.device import Device
from ember.backend.ops import OpDef
from ember.backends.fusion import counters
from ember.backends.fusion.handle import FusionTensor, Slot

MAX_RECORDS = 256
"""A stream runs when it holds this many records (bounds memory held by pending inputs and
the size of what the explorer searches)."""

MAX_REPLAY_RECORDS = 4 * MAX_RECORDS
"""A replay of at most this many records pushes them all before its stream runs (one flush:
its plan is kept, and its launches may run directly); a longer one runs every
:data:`MAX_RECORDS`, as ops pushed one by one do."""

SMALL = 1 << 12
"""Elements: values no larger are arithmetic on the side (shapes, scalars); reading one runs
only what it needs (:meth:`Stream.flush_for`)."""


@dataclass(slots=True, eq=False)
class Record:
    """One recorded op call.

    Args:
        op: the op-table entry.
        name: the backend primitive (``float_add``).
        args: the call's arguments, a :class:`Slot` at each tensor operand (``cat``'s list
            holds slots), devices already mapped to the inner backend.
        inputs: the tensor operands as a flat tuple (absent optional operands left out).
        outputs: the slots the call makes; ``multi`` when the primitive returns a tuple.
    """

    op: OpDef
    name: str
    args: list
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    multi: bool = False

    def __repr__(self) -> str:
        ins = ", ".join(f"%{s.id}" for s in self.inputs)
        outs = ", ".join(f"%{s.id}" for s in self.outputs)
        return f"{outs} = {self.name}({ins})"


class Stream:
    """A thread's pending records on one device, run in order by ``execute``."""

    def __init__(self, device: Device, execute: Callable[[list[Record]], Any]) -> None:
        self.device = device
        self.execute = execute
        self.records: list[Record] = []
        self.lock = threading.RLock()
        self.holding = False  # a replay is pushing its records (hold): run them when it is done

    def push(self, record: Record) -> None:
        with self.lock:
            records = self.records
            records.append(record)
            if len(records) == 1:
                _pending.add(self)
            elif len(records) >= MAX_RECORDS and not self.holding:
                self._run()

    def push_all(self, pushed: list[Record]) -> None:
        """Pushes ``pushed`` in order, running the stream only after the last where they
        fill it."""
        with self.lock:
            records = self.records
            if not records:
                _pending.add(self)
            records.extend(pushed)
            if len(records) >= MAX_RECORDS and not self.holding:
                self._run()

    def hold(self) -> bool:
        """Holds the records a replay pushes until :meth:`release` (not run at
        :data:`MAX_RECORDS`); False where the stream is held already."""
        with self.lock:
            if self.holding:
                return False
            self.holding = True
            return True

    def release(self) -> None:
        """Ends a :meth:`hold`: the records run now where they fill the stream, as pushed one
        by one they would have."""
        with self.lock:
            self.holding = False
            if len(self.records) >= MAX_RECORDS:
                self._run()

    def flush(self) -> None:
        """Runs every pending record."""
        with self.lock:
            if self.records:
                self._run()

    def flush_for(self, slots: list[Slot]) -> None:
        """Runs what ``slots`` need. Where that is small arithmetic (every value it makes
        has at most :data:`SMALL` elements: shape arithmetic, a scalar) beside larger
        pending work, only the records that make ``slots`` and those they read run, in
        order, and the larger work stays pending to fuse with what comes next; otherwise
        every record runs (reading one of several results computes them all at once, and
        a random op keeps the generator's recording order)."""
        with self.lock:
            records = self.records
            if not records:
                return
            needed = set(slots)
            taken = [False] * len(records)
            for i in range(len(records) - 1, -1, -1):
                record = records[i]
                for out in record.outputs:
                    if out in needed:
                        if _elements(record) > SMALL or record.op.name == "random":
                            self._run()
                            return
                        taken[i] = True
                        needed.update(record.inputs)
                        break
            if not any(taken):
                return
            rest = [r for r, t in zip(records, taken) if not t]
            if all(_elements(r) <= SMALL for r in rest):
                self._run()
                return
            # What the rest reads must be written out and never written over: a handle for
            # the run makes each such value readable (the executor keeps readable values).
            guards = [FusionTensor(s) for r in rest for s in r.inputs if not s.readable()]
            self.records = rest
            self._run_records([r for r, t in zip(records, taken) if t])
            del guards

    def _run(self) -> None:
        records, self.records = self.records, []
        _pending.discard(self)
        self._run_records(records)

    def _run_records(self, records: list[Record]) -> None:
        counters.add("flushes")
        counters.add("records", len(records))  # here rather than per push: one lock a run
        try:
            self.execute(records)
        finally:
            for record in records:
                for slot in record.outputs:
                    slot.stream = None  # made, or lost to the error being raised

    def __len__(self) -> int:
        return len(self.records)

    def mark_replayed(self, first: Record, count: int, plans: dict, pushed: tuple,
                      learn: Callable | None = None) -> None:  # fmt: skip
        """Marks the pending records as exactly one replay's pushes (``count`` of them from
        ``first`` on, nothing else), so that the executor may look their plan up in the
        trace's ``plans`` under ``pushed`` and show it to ``learn`` (:class:`ReplayedRecords`);
        nothing where the stream holds other records too or ran meanwhile."""
        with self.lock:
            records = self.records
            if len(records) == count and records[0] is first:
                self.records = ReplayedRecords(records, plans, pushed, learn)

    def reading(self, slots: tuple[Slot, ...]) -> None:
        """Before a record of this stream reads ``slots``: a slot of another stream is
        marked shared (never written over by the executor), and where that stream has yet
        to make it (another thread's), it runs now."""
        for s in slots:
            if s.origin is not self:
                s.shared = True
                other = s.stream
                if other is not None:
                    other.flush()


class ReplayedRecords(list):
    """A stream's records that one replay pushed (:meth:`Stream.mark_replayed`): ``plans``
    is the trace's table of the plans its flushes had, and ``pushed`` which of its entries
    this replay pushed; ``learn(records, segments)``, when given, is shown the plan the
    executor runs them by. Records pushed after the mark make the list longer than
    ``count``, and the executor then plans as for any stream."""

    def __init__(self, records: list[Record], plans: dict, pushed: tuple,
                 learn: Callable | None = None) -> None:  # fmt: skip
        super().__init__(records)
        self.count = len(records)
        self.plans = plans
        self.pushed = pushed
        self.learn = learn


def _elements(record: Record) -> int:
    """The most elements of any value ``record`` makes."""
    most = 0
    for out in record.outputs:
        n = 1
        for d in out.shape:
            n *= d
        most = max(most, n)
    return most


_local = threading.local()
# Streams holding records (of any thread): what flush_device runs. Set operations are
# atomic under the GIL; a stream gets in with its first record and out when it runs.
_pending: set[Stream] = set()


def stream_for(device: Device, execute: Callable[[list[Record]], Any]) -> Stream:
    """This thread's stream on the inner ``device`` for ``execute`` (made on first use).

    Each executor (each Fusion backend, with its own runtime) has its own streams: two
    fusion devices over the same inner device never run each other's records.
    """
    last = getattr(_local, "last", None)  # most ops go to the stream the previous one did
    if last is not None and last[0] is device and last[1] is execute:
        return last[2]
    streams = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = {}
    key = (device, execute)
    stream = streams.get(key)
    if stream is None:
        stream = streams[key] = Stream(device, execute)
        counters.add("streams")
    _local.last = (device, execute, stream)
    return stream


def flush_device(device: Device) -> None:
    """Runs every thread's pending records on the inner ``device``."""
    if not _pending:
        return  # nothing recorded anywhere: a sync after a read, say
    for stream in [s for s in list(_pending) if s.device == device]:
        stream.flush()
