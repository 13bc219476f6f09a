"""Keyed replays: the ops a decorator above issues for a key, pushed again from a trace.

Autodiff's backward pass is ember's own Python: for one graph (its nodes' rules, what they
saved, which inputs need gradients) it issues the same fusion ops every step, and
recording them cost ``nn_step`` 3-4 ms a step. :meth:`Fusion.replay_keyed
<ember.backends.fusion.backend.Fusion.replay_keyed>` takes such a pass as a function of
primitives, ``fn(inputs) -> outputs``, with a key from the caller that says everything
else the ops depend on. It runs ``fn`` plainly for a key's first call, traces the second
(``replayed.Tracer``: the inputs are the handles given, as they are), and pushes the
trace's records for later calls, as :func:`~ember.backends.fusion.replayed.replay` does;
the signature adds each input's shape, dtype and device and which inputs are the same
value. Before pushing, the stream's pending records run (a training step's forward pass),
so the flush holds only the trace's records: its plan is kept, and from the next call on
its launches run directly (``direct.py``).

Traces live in memory only, :data:`MAX_KEYS` per backend, the least recently used
dropped first; a trace's direct program is made again where a replay's would be (after
``clear_plans()``, or a tuner choice timed again).

A key whose trace fails (``fn`` reads a value it computes, draws a value-dependent shape,
changes state outside the op table) runs plainly from then on; a replay that raises runs
``fn`` plainly instead, so the error is the plain call's. ``EMBER_FUSION_REPLAY=0`` runs
every call plainly, and so does a call inside a traced call (its ops are the outer
trace's).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from ember.backend import effects
from ember.backend.environment import switch
from ember.backends.fusion.handle import FusionTensor, Slot
from ember.backends.fusion.replayed import NEW, Trace, Tracer, Traces, tracing
from ember.backends.fusion.stream import stream_for

MAX_KEYS = 16
"""Keys a backend keeps traces for (the least recently used goes first)."""


class KeyedReplays:
    """One fusion backend's keyed traces (see the module doc)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._traces = Traces(MAX_KEYS, "keyed_traces")

    def run(self, key: Hashable, inputs: list, fn: Callable[[list], list]) -> list:
        if (not self.backend.lazy or tracing.tracer is not None
                or not switch("EMBER_FUSION_REPLAY", True)):  # fmt: skip
            return fn(inputs)
        signature = _signature(key, inputs)
        if signature is None:
            return fn(inputs)
        state = self._traces.state(signature)
        if state is NEW or type(state) is str:
            return fn(inputs)
        if state is None:
            return self._trace(signature, inputs, fn)
        try:
            return state.run(inputs)
        except Exception:
            return fn(inputs)  # raises as the plain pass words it

    def _trace(self, signature: tuple, inputs: list, fn: Callable[[list], list]) -> list:
        tracer = Tracer(self.backend, self.backend)
        tracer.input_handles(inputs)
        tracing.tracer = tracer
        try:
            with effects.listening(lambda what: tracer.fail(f"it {what}")):
                out = fn(inputs)
        finally:
            tracing.tracer = None
        if type(out) is not list or any(h is not None and type(h) is not FusionTensor
                                        for h in out):  # fmt: skip
            tracer.fail("it returns other values than a list of fusion handles")
            template = None
        else:
            template = [None if h is None else tracer.out(h) for h in out]
        trace = tracer.trace(template, KeyedTrace)
        self._traces.store(signature, trace, "keyed pass")
        return out


def _signature(key: Hashable, inputs: list) -> tuple | None:
    """``key`` with each input's shape, dtype, device and first position (which inputs are
    one value); None where an input is not a fusion handle or the key is not hashable."""
    first: dict[Slot, int] = {}
    parts: list = [key]
    for i, handle in enumerate(inputs):
        if type(handle) is not FusionTensor:
            return None
        slot = handle.slot
        device = slot.device
        parts.append((slot.shape, slot.dtype, device.place, device.index,
                      first.setdefault(slot, i)))  # fmt: skip
    signature = tuple(parts)
    try:
        hash(signature)
    except TypeError:
        return None
    return signature


class KeyedTrace(Trace):
    """A trace whose inputs are handles (each distinct slot once, in order) and whose
    outputs are a list of handles (None where the traced call returned None)."""

    counted = ("keyed_replays", "keyed_direct_replays")

    def run(self, handles: list) -> list:
        if self._direct_ok:
            # What the stream holds (the forward pass, say) runs apart: the replay's flush
            # then holds its records only, and may run as a direct program.
            device = self.entries[0].device
            stream_for(device, self.backend.executor).flush()
        return super().run(handles)

    def input_slots(self, handles: list) -> list[Slot]:
        return list(dict.fromkeys([h.slot for h in handles]))

    def _outputs(self, template: Any, values: list, held: dict, handles: list) -> list:
        out: list = []
        for t in template:
            if t is None:
                out.append(None)
            elif t.const is not None:
                out.append(t.const)
            elif t.ref < self.n_inputs:
                slot = values[t.ref]
                out.append(next(h for h in handles if h.slot is slot))
            else:
                handle = held.get(t.ref)
                if handle is None:
                    handle = held[t.ref] = FusionTensor(values[t.ref])
                out.append(handle)
        return out
