"""The explorer: splits a stream into fused blocks and single records, with a plan cache.

From each position it offers the following records to every fuser (each closes at the
first record it cannot take) and keeps the best-scoring ready one when it would compute
at least :data:`MIN_SCORE` records in one kernel; otherwise that record runs on the inner
backend by itself. The segmentation is cached by the *relativized* stream: each record's
primitive, where its inputs come from (an earlier record of the stream, counted
backwards, or the n-th outside value), the kinds of its attributes, the dtypes, ranks and
unit (broadcast) dims of its tensors, and which outputs the user still holds. Sizes are
not part of the key, so a training step with a new batch size reuses the plan; a cached
plan is checked by fusing its segments again (cheap), and explored anew when that fails.

Plans also persist on disk (``plans.py``): a plan-cache miss looks for the key's entry
there before exploring, so a new process starts warm. **What invalidates a cached plan:**
in memory, nothing but :func:`clear_plans` and the :data:`MAX_PLANS` bound (a plan that
stops fitting its stream is explored anew, which replaces it). On disk, an entry is used
only when its format and version (a digest of the sources that make plans: the op table,
``ir.py``, the fusers, this explorer, the executor, ``stream.py`` and ``plans.py``)
match this process's, its full key equals the stream's key (not just its hash), it passes
validation, and the live fusers, building its plan on the live records, make exactly its
templates; anything else is ignored and the stream explored anew (which rewrites the entry).
``EMBER_FUSION_PLANS=0`` turns the disk store off; deleting the cache folder empties it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ember.backend.errors import EmberError
from ember.backends.fusion import counters
from ember.backends.fusion.fuser import Fuser, Status
from ember.backends.fusion.ir import REDUCTIONS, StateError, attr_tag
from ember.backends.fusion.stream import Record
from ember.tensor.dtype import DType

T = TypeVar("T")

MIN_SCORE = 2
"""A block computing fewer records than this runs unfused instead."""

MAX_PLANS = 4096
"""The plan cache is emptied when it holds this many plans."""


@dataclass(frozen=True)
class Segment:
    """Records ``start .. start + length - 1``: fused by ``fuser`` (its index), or one
    unfused record when ``fuser`` is None."""

    start: int
    length: int
    fuser: int | None


_plans: dict[tuple, tuple[Segment, ...]] = {}
_built: dict[tuple, object] = {}  # plan key -> what a caller built from the plan, size-free
_plans_lock = threading.Lock()
_generation = 0  # bumped whenever _built loses entries: a copy kept elsewhere is stale then


def clear_plans(on_disk: bool = True) -> None:
    """Empties the plan cache in memory and, with ``on_disk``, the disk store's entries of
    this version in the cache folder (see ``plans.py``)."""
    from ember.backends.fusion import plans

    global _generation
    with _plans_lock:
        _plans.clear()
        _built.clear()
        _generation += 1
    plans.forget(on_disk)


def plan_to_state(plan: tuple[Segment, ...]) -> list[list]:
    """A plan as plain data: ``[start, length, fuser index or None]`` per segment."""
    return [[s.start, s.length, s.fuser] for s in plan]


def plan_from_state(state: object, records: int, fusers: int) -> tuple[Segment, ...]:
    """The plan :func:`plan_to_state` made, for a stream of ``records`` records and an
    explorer of ``fusers`` fusers.

    Raises:
        StateError: ``state`` is not such a plan: segments must be lists of three ints (the
            fuser may be None), cover ``0 .. records - 1`` in order without gaps, an
            unfused segment is one record and a fused one at least :data:`MIN_SCORE`.
    """
    if type(state) is not list:
        raise StateError(f"a plan is a list of segments, not {type(state).__name__}")
    plan = []
    start = 0
    for entry in state:
        if type(entry) is not list or len(entry) != 3:
            raise StateError(f"segment {len(plan)} is not [start, length, fuser]")
        at, length, fuser = entry
        if type(at) is not int or at != start:
            raise StateError(f"segment {len(plan)} starts at {at!r}, expected {start}")
        if type(length) is not int or not 1 <= length <= records - start:
            raise StateError(f"segment {len(plan)} has length {length!r} of {records - start}")
        if fuser is None:
            if length != 1:
                raise StateError(f"unfused segment {len(plan)} has {length} records, not 1")
        elif type(fuser) is not int or not 0 <= fuser < fusers:
            raise StateError(f"segment {len(plan)} names fuser {fuser!r} of {fusers}")
        elif length < MIN_SCORE:
            raise StateError(f"fused segment {len(plan)} has {length} records")
        plan.append(Segment(at, length, fuser))
        start += length
    if start != records:
        raise StateError(f"the plan covers {start} records of {records}")
    return tuple(plan)


class Explorer:
    """Finds the segmentation of a stream for ``fusers`` (tried in order; ties go first)."""

    def __init__(self, fusers: list[Fuser]) -> None:
        self.fusers = fusers
        self.names = tuple(f.name for f in fusers)
        self._might_take: dict[tuple[str, bool], bool] = {}

    def key(self, records: list[Record]) -> tuple:
        """The stream's plan key: the fusers' names and the relativized stream."""
        return (self.names, relativize(records))

    @staticmethod
    def built(key: tuple) -> object | None:
        """What :meth:`remember` stored for ``key`` (None when nothing is)."""
        return _built.get(key)

    @staticmethod
    def cached(key: tuple) -> tuple[Segment, ...] | None:
        """The plan in memory for ``key`` (None when there is none)."""
        return _plans.get(key)

    @staticmethod
    def adopt(key: tuple, plan: tuple[Segment, ...], value: object) -> None:
        """Takes a plan from elsewhere (the disk store) with what the caller built from it,
        as if it had been explored and :meth:`remember` called: a cache hit."""
        counters.add("cache_hits")
        with _plans_lock:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
        Explorer.remember(key, value)

    @staticmethod
    def remember(key: tuple, value: object) -> None:
        """Stores, for a plan key, a caller's size-free form of what it built from the plan
        (the executor's block templates), so a later stream with that key skips the fusers.
        It must depend on nothing the key leaves out."""
        global _generation
        with _plans_lock:
            if len(_built) >= MAX_PLANS:
                _built.clear()
                _generation += 1
            _built[key] = value

    @staticmethod
    def generation() -> int:
        """A number that changes whenever built values are forgotten (:func:`clear_plans`,
        the :data:`MAX_PLANS` bound): a copy of one kept with the generation it was read
        in is still what :meth:`built` gives while the generation is the same."""
        return _generation

    def plan(self, records: list[Record]) -> tuple[Segment, ...]:
        key = (self.names, relativize(records))
        plan = _plans.get(key)
        if plan is not None and self._valid(plan, records):
            counters.add("cache_hits")
            return plan
        return self._explore(key, records)

    def build(
        self,
        records: list[Record],
        build: Callable[[tuple[Segment, ...]], T | None],
        key: tuple | None = None,
    ) -> T:
        """``build(plan)`` for the stream's plan, where ``build`` fuses each segment (with
        :meth:`fuser_for`) and returns None when a fuser takes fewer records than its
        segment says: a cached plan is checked by building it, so its records are fused
        once rather than twice, and explored anew when it no longer fits. ``key`` is the
        stream's :meth:`key` when the caller has it already."""
        if key is None:
            key = self.key(records)
        plan = _plans.get(key)
        if plan is not None:
            built = build(plan)
            if built is not None:
                counters.add("cache_hits")
                return built
        built = build(self._explore(key, records))
        if built is None:  # a fresh plan fits by construction
            raise EmberError("fusion: a freshly explored plan did not fit its own stream")
        return built

    def _explore(self, key: tuple, records: list[Record]) -> tuple[Segment, ...]:
        counters.add("explorations")
        plan = self.explore(records)
        with _plans_lock:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
        return plan

    def explore(self, records: list[Record]) -> tuple[Segment, ...]:
        segments = []
        i, n = 0, len(records)
        while i < n:
            for fuser in self.fusers:
                fuser.reset()
            for record in records[i:]:
                open_ = False
                for fuser in self.fusers:
                    if fuser.status() is Status.OPEN:
                        fuser.fuse(record)
                        open_ = open_ or fuser.status() is Status.OPEN
                if not open_:
                    break
            best, score = None, MIN_SCORE - 1
            for index, fuser in enumerate(self.fusers):
                props = fuser.properties()
                if props.ready and props.score > score:
                    best, score = index, props.score
            if best is None:
                segments.append(Segment(i, 1, None))
                i += 1
            else:
                segments.append(Segment(i, score, best))
                i += score
        return tuple(segments)

    def nothing_to_fuse(self, records: list[Record]) -> bool:
        """Whether no fuser could take :data:`MIN_SCORE` neighbouring records (judged by
        their ops alone): then every record runs by itself and the stream needs no plan,
        so no key either (a stream of matmuls and views, such as an LSTM's)."""
        run = 0
        known = self._might_take  # by (primitive, several outputs): what might_take reads
        for record in records:
            key = (record.name, record.multi)
            might = known.get(key)
            if might is None:
                might = known[key] = any(f.might_take(record) for f in self.fusers)
            if might:
                run += 1
                if run >= MIN_SCORE:
                    return False
            else:
                run = 0
        return True

    def fuser_for(self, segment: Segment, records: list[Record]) -> Fuser:
        """The segment's fuser, holding exactly the segment's records."""
        fuser = self.fusers[segment.fuser]
        fuser.reset()
        for record in records[segment.start : segment.start + segment.length]:
            fuser.fuse(record)
        return fuser

    def _valid(self, plan: tuple[Segment, ...], records: list[Record]) -> bool:
        return all(
            segment.fuser is None or len(self.fuser_for(segment, records)) == segment.length
            for segment in plan
        )


def relativize(records: list[Record]) -> tuple:
    """The stream's pattern: what a plan depends on, without ids or sizes.

    It runs on every flush, so it is written for speed: each slot's dtype and unit dims
    come from a per-shape table; a reduction's attributes are kept (its axis decides the
    plan), other ops' only as ``ir.attr_tag`` tells (a scalar's type, and whether it scales
    by a power of two or by sqrt 2, which the kernel the plan builds may rely on), dtypes
    by value.
    """
    made: dict[int, tuple[str, int, int]] = {}  # slot id -> ("r", record index, output index)
    outside: dict[int, int] = {}
    units = _units
    pattern = []
    for i, record in enumerate(records):
        sources = []
        for s in record.inputs:
            origin = made.get(s.id)
            if origin is None:
                shape = s.shape
                unit = units.get(shape)
                if unit is None:
                    unit = _unit(shape)
                n = outside.setdefault(s.id, len(outside))
                sources.append(("x", n, s.dtype, unit))
            else:
                sources.append(("r", i - origin[1], origin[2]))
        op = record.op
        extra = record.args[len(op.inputs) :]
        if not extra:
            attrs = ()
        elif op.name in REDUCTIONS:
            attrs = tuple(extra)
        elif op.name in ("mul_scalar", "div_scalar"):  # ir.attr_tag: 2**k, sqrt 2
            attrs = tuple([attr_tag(op.name, a) for a in extra])
        else:
            attrs = tuple([a if isinstance(a, DType) else type(a).__name__ for a in extra])
        outs = []
        for k, o in enumerate(record.outputs):
            shape = o.shape
            unit = units.get(shape)
            if unit is None:
                unit = _unit(shape)
            handle = o.handle  # Slot.readable, inlined
            outs.append((o.dtype, unit, handle is not None and handle() is not None))
            made[o.id] = ("r", i, k)
        pattern.append((record.name, tuple(sources), attrs, tuple(outs)))
    return tuple(pattern)


_units: dict[tuple[int, ...], tuple[bool, ...]] = {}


def _unit(shape: tuple[int, ...]) -> tuple[bool, ...]:
    """Which dims of ``shape`` are 1 (remembered per shape; the table is bounded)."""
    if len(_units) >= MAX_PLANS:
        _units.clear()
    unit = _units[shape] = tuple([d == 1 for d in shape])
    return unit


