"""Composite ops recorded from a template: a decomposition's records without its Python.

On a fusion device an activation or normalization composite (``gelu``, ``layer_norm``)
decomposes into primitives, so that they fuse; each primitive passes through
``Fusion.call`` (its rule, the stream's bookkeeping), about 8 us of Python a record on a
cold cache. The records a decomposition makes depend only on its operands' shapes, dtypes
and device, which operands are the same value, and its attributes (compared by type, and
floats bit for bit: a slope of -0.0 is not one of 0.0, whose products differ in sign). So
the first call of each such signature runs the decomposition and keeps its records as a
:class:`Template`; later calls push records made from the template straight into the
stream. They are the records the decomposition would have pushed (new slots, the same
ops, attributes and shapes), so they fuse, plan and run as before, and errors cannot
differ: the template is made only from a decomposition whose rules all passed on the same
abstract values.

A signature gets no template, and decomposes every time, where its decomposition does
anything but push records of its own stream that read only its operands and each other: a
primitive run at once (made operands small enough, a value-dependent op), a random draw,
a constant made inside it; likewise where attributes cannot be a dict key. While a
replayed function is traced the decomposition runs too (the tracer logs primitives).
``stats()["templated_composites"]`` counts the calls recorded from a template.

A stream that holds exactly one push of a template (a layer norm right after a sync) is
marked as replayed records (``Stream.mark_replayed``) with the template's own table of
plans, one per executor, so its flush finds its plan without building the plan key.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from ember.backends.fusion import counters
from ember.backends.fusion.handle import FusionTensor, Slot
from ember.backends.fusion.replayed import Entry
from ember.backends.fusion.stream import Record, Stream, stream_for

MAX_TEMPLATES = 4096
"""Signatures kept, over all composites (the table is emptied when it is full)."""

_NONE = object()  # a signature whose decomposition cannot be a template
_templates: dict[tuple, Any] = {}


class Template:
    """One signature's records, as a trace's entries (``replayed.Entry``) whose references
    index the call's values: its operands, then each record's outputs in order (-1 for an
    absent operand); ``outputs`` the values the composite returns (a tuple where
    ``multi``)."""

    __slots__ = ("entries", "multi", "outputs", "plans")

    def __init__(self, entries: tuple[Entry, ...], outputs: tuple[int, ...], multi: bool) -> None:
        self.entries, self.outputs, self.multi = entries, outputs, multi
        # Each executor's plans of its streams that held exactly one push of this template
        # (its table for replayed records: such a stream's plan key follows from the
        # template). Templates are shared by the fusion backends over one inner device,
        # whose fusers may plan the same records apart.
        self.plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def push(self, stream: Stream, slots: list, present: tuple) -> Any:
        """Pushes the records for operands ``slots`` (``present``: those not None) into
        ``stream``, and returns the composite's handles."""
        stream.reading(present)
        values = list(slots)
        records = []
        for entry in self.entries:
            ins = [None if r < 0 else values[r] for r in entry.refs]
            record = entry.record(ins, tuple([s for s in ins if s is not None]), stream)
            values.extend(record.outputs)
            records.append(record)
        # Readable before the push, which may run the stream.
        handles = tuple([FusionTensor(values[r]) for r in self.outputs])
        alone = not stream.records
        stream.push_all(records)
        if alone:  # a layer norm before a sync: its flush looks its plan up here, no key
            plans = self.plans.get(stream.execute)
            if plans is None:
                plans = self.plans[stream.execute] = {}
            stream.mark_replayed(records[0], len(records), plans, ())
        counters.add("templated_composites")
        return handles if self.multi else handles[0]


def record(backend: Any, decomposed: Callable, name: str, n: int, slots: list, present: tuple,
           args: tuple) -> Any:  # fmt: skip
    """Composite ``name`` of ``backend`` (a Fusion backend) on operands ``slots`` (the
    first ``n`` of ``args``; ``present`` those not None), recorded from its signature's
    template, or by running ``decomposed`` (which makes the template, where it can be one)."""
    device = present[0].device
    try:
        operands = tuple([None if s is None else (s.shape, s.dtype, slots.index(s)) for s in slots])
        attrs = tuple([a.hex() if type(a) is float else (type(a), a) for a in args[n:]])
        # What runs at once inside a decomposition depends on the backend's small limit.
        key = (name, device, backend.small, operands, attrs)
        template = _templates.get(key)
    except TypeError:  # an attribute that cannot be hashed
        return decomposed(backend, *args)
    stream = stream_for(device, backend.executor)
    if type(template) is Template:
        return template.push(stream, slots, present)
    if template is _NONE:
        return decomposed(backend, *args)
    held = stream.hold()  # the stream runs at none of the records, so they can be read back
    try:
        records, start = stream.records, len(stream.records)
        out = decomposed(backend, *args)
        if stream.records is records:  # it did not run meanwhile
            made = _template(slots, records[start:], out)
            if len(_templates) >= MAX_TEMPLATES:
                _templates.clear()
            _templates[key] = _NONE if made is None else made
    finally:
        if held:
            stream.release()
    return out


def _template(slots: list, records: list[Record], out: Any) -> Template | None:
    """The template of a decomposition on ``slots`` that pushed ``records`` and returned
    ``out``; None where anything else made a value it reads or returns."""
    refs: dict[Slot, int] = {}
    for i, s in enumerate(slots):
        if s is not None and s not in refs:
            refs[s] = i
    count = len(slots)
    entries = []
    for r in records:
        if r.op.name == "random":
            return None
        n = len(r.op.inputs)
        spread = n > 0 and r.op.inputs[0] == "*tensors"
        operands, attrs = (r.args[0], r.args[1:]) if spread else (r.args[:n], r.args[n:])
        ins = []
        for s in operands:
            if s is None:
                ins.append(-1)
            elif s in refs:
                ins.append(refs[s])
            else:
                return None  # made outside the template: at once, or a constant
        out_refs = tuple(range(count, count + len(r.outputs)))
        refs.update(zip(r.outputs, out_refs))
        count += len(r.outputs)
        specs = tuple([(s.shape, s.dtype, s.device) for s in r.outputs])
        entries.append(Entry(r.op, r.name, spread, tuple(ins), tuple(attrs), specs, out_refs,
                             r.multi, False, False, specs[0][2] if specs else None, False))  # fmt: skip
    multi = type(out) is tuple
    outputs = []
    for handle in out if multi else (out,):
        ref = refs.get(handle.slot) if type(handle) is FusionTensor else None
        if ref is None or ref < len(slots):
            return None  # an operand returned as it is, or a value made at once
        outputs.append(ref)
    return Template(tuple(entries), tuple(outputs), multi)


def clear() -> None:
    """Forgets every template (tests)."""
    _templates.clear()
