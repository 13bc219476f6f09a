"""The fuser protocol: what the explorer asks of each kind of fusion.

A fuser is offered a stream's records one at a time (:meth:`Fuser.fuse`); it takes each
record it can compute within its block, and closes at the first one it cannot. Its
:meth:`Fuser.properties` say how good the block so far is (``score``: the records it
would compute in one kernel) and whether it can make one (``ready``); :meth:`Fuser.finish`
builds the block (an ``ir.Block``) for the records taken, and :meth:`Fuser.reset` empties
it for the next segment. As in Burn, fusers never see each other: the explorer compares
their scores.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from ember.backends.fusion.handle import Slot
from ember.backends.fusion.ir import Block
from ember.backends.fusion.stream import Record


class Status(enum.Enum):
    """OPEN: the fuser may take the next record; CLOSED: it took its last one."""

    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class Properties:
    """``score``: how many records one kernel would compute; ``ready``: a block can be made."""

    score: int
    ready: bool


@dataclass(frozen=True)
class Fused:
    """A fuser's result: the block, the slots its inputs read (in register order) and the
    slots its outputs write (in ``block.outputs`` order)."""

    block: Block
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]


class Fuser(Protocol):
    """One kind of fusion (see the module docstring)."""

    name: str

    def might_take(self, record: Record) -> bool:
        """A quick necessary condition of :meth:`fuse` taking ``record``, from its op and
        whether it has several outputs alone (the explorer caches it by those): where it
        is False for every fuser, no block can hold the record."""

    def fuse(self, record: Record) -> None:
        """Takes ``record`` into the block, or closes (status CLOSED) without taking it."""

    def status(self) -> Status: ...

    def properties(self) -> Properties: ...

    def __len__(self) -> int:
        """How many records the fuser has taken."""

    def finish(self, keep: set[int]) -> Fused:
        """The block for the records taken; ``keep`` holds the ids of the slots that must be
        written out (read later in the stream, or held by the user)."""

    def reset(self) -> None: ...


class Taking:
    """What the fusers share: the records taken so far and the status (``reset`` sets both)."""

    records: list[Record]
    _status: Status

    def status(self) -> Status:
        return self._status

    def __len__(self) -> int:
        return len(self.records)
