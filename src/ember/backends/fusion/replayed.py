"""Replayed calls: a function traced once per input signature, then re-recorded from its trace.

On a fusion device most of a small model's time is Python: the Tensor API, the op rules
and the stream's bookkeeping of each op, before any kernel runs (replaying the ONNX encoder
of ``benchmarks/onnx_inference.py``, whose forward records 126 ops, saved 3-6 ms of its
40-65 ms). :func:`replay` wraps a function so that, once its Python has run for a signature of
its inputs, later calls with that signature push the same records into the stream straight
from a list, skipping the Python that made them. The records then run as any others do:
fused, planned from the plan cache, lazily.

**How a call runs** (per signature: the arguments' structure, each tensor's shape, dtype,
kind and device, which arguments are the same tensor, and every non-tensor argument's
value):

1. The first call runs the function plainly (a warm-up: lazily made parameters exist
   afterwards, kernels are compiled, plans explored).
2. The second call runs it under a tracer (results computed as in a plain call) that logs
   every op the fusion backend sees. An op is *dynamic* when it reads an input, or a value
   a dynamic op made, or draws random numbers; its entry keeps the op, its attributes, the
   references of its operands and the shapes of its outputs. Other ops (on captured
   tensors such as a model's weights, or on shapes: an imported model's shape arithmetic)
   are *static*: their results are constants of the trace, computed once.
3. Later calls push the dynamic entries' records into the thread's stream and return new
   tensors for the outputs. An op that ran at once when traced (``gather``; an op on small
   made values) runs at once again. Where an op raises, the call runs plainly instead, so
   the error is the plain call's.
4. A replay of up to ``stream.MAX_REPLAY_RECORDS`` records pushes them all before its
   stream runs (one flush). Where that flush held exactly the replay's records and ran
   them as element-wise blocks, convolutions, attention segments and single ops, later
   calls run those launches at once on the input arrays: no record, stream, plan or
   binding (``direct.py``; ``stats()["direct_replays"]``). The outputs are made when the
   call returns, so ops that follow no longer fuse with the call's last block.

**Modules as arguments.** A module among the arguments contributes its parameters as
inputs (``params()`` order) and its configuration and constant tensors (by identity) to
the signature; the traced call gets the module with its parameters' values replaced by the
trace's inputs. So a training loop that makes a new module every step passes it in, and
each replay uses that step's weights (a module the function only captures keeps the
weights it had when traced).

**Autodiff.** Tensors of ``device.fusion().autodiff()`` are taken too: the trace logs the
fusion ops the Autodiff decorator issues, forward and backward, so a replayed training step
(a gradient penalty's second-order one included) skips the graph's Python as well. Leaves
among the arguments stay leaves (the function may differentiate with respect to them);
outputs must be untracked: gradients, or detached values.

**What cannot be replayed** (the signature then runs plainly for good; ``EMBER_FUSION_DEBUG=1``
says why): reading a value a dynamic op made (``to_data``, ``item``, ``bool``: Python
could branch on it), an op whose output shape depends on values (``argwhere``), seeding
the generator, an in-place change of state outside the op table (a batch norm's running
statistics in training, an optimizer's step: ``ember.backend.effects``), ops of another
fusion backend, tensors of a non-fusion device (or of an autodiff graph, not leaves) among
the arguments, a gradient listener
(data-parallel sync, which hears backward passes), tracked outputs, and outputs other than
tensors, plain Python values and tuples, lists and dicts of them.

**As with** ``jax.jit``, the function's Python side effects happen only when it runs
(the first two calls of a signature), and tensors it captures (a closure's, a model's
weights when the function is the model) are constants of the trace: a replayed model uses
the weights it had when traced. Tensors are immutable, so that is what a plain call uses
too, unless the function reads a different tensor on a later call (a global rebound, say):
pass such tensors as arguments. ``EMBER_FUSION_REPLAY=0`` runs every call plainly.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.backends.fusion import replay
    >>> device = ember.device("ndarray").fusion()
    >>> w = Tensor.from_data([[1.0, 2.0], [3.0, 4.0]], device)
    >>> f = replay(lambda x: ember.activation.relu(x @ w) * 2.0)
    >>> [f(Tensor.from_data([[1.0, -1.0]], device)).tolist() for _ in range(3)]
    [[[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 0.0]]]
    >>> f(Tensor.from_data([[1.0, 1.0]], device)).tolist()  # the third call: replayed
    [[8.0, 12.0]]
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ember.backend import effects
from ember.backend.device import Device
from ember.backend.environment import switch
from ember.backend.errors import ArgumentError
from ember.backend.rules import AVal
from ember.backends.autodiff import listener
from ember.backends.fusion import counters, direct
from ember.backends.fusion import stream as streams
from ember.backends.fusion.handle import FusionTensor, Slot, indices_fit
from ember.backends.fusion.stream import Record, stream_for
from ember.module.module import Module, _items, _join
from ember.module.param import Param
from ember.tensor.tensor import Tensor, _wrap

__all__ = ["MAX_TRACES", "Replayed", "replay"]

MAX_TRACES = 16
"""Signatures a replayed function keeps (the least recently used goes first)."""

VALUE_SHAPED = frozenset({"argwhere", "into_data"})
"""Ops that, on a dynamic value, make the trace unreplayable: their result's shape, or the
Python that reads it, depends on the values."""


class _Tracing(threading.local):
    tracer: Tracer | None = None


tracing = _Tracing()


def active(backend: Any) -> Tracer | None:
    """The tracer recording this thread's ops of ``backend`` (the Fusion backend calls this
    on every op; None when no trace runs)."""
    tracer = tracing.tracer
    if tracer is not None and tracer.backend is not backend:
        tracer.fail(f"an op ran on another fusion backend ({backend.name})")
        return None
    return tracer


def replay(fn: Callable[..., Any]) -> Replayed:
    """``fn`` replayed from a trace per input signature (see the module docstring).

    Args:
        fn: a function of tensors on one fusion device (and of plain Python values, and
            tuples, lists and dicts of these); a module's forward, say.

    Returns:
        A callable that computes what ``fn`` computes.

    Raises:
        ArgumentError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise ArgumentError(f"replay: expected a function or module to replay, got "
                            f"{type(fn).__name__}")  # fmt: skip
    return Replayed(fn)


class Replayed:
    """A function with its traces (see :func:`replay`)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn, updated=())
        self.fn = fn
        self._traces = Traces(MAX_TRACES, "traces")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if tracing.tracer is not None or not switch("EMBER_FUSION_REPLAY", True):
            return self.fn(*args, **kwargs)  # inside an outer trace: its ops are the outer's
        flat = _Flattened(args, kwargs)
        if flat.reason is not None:
            _debug(f"{_name(self.fn)}: runs plainly: {flat.reason}")
            return self.fn(*args, **kwargs)
        key = flat.signature
        state = self._traces.state(key)
        if state is NEW or type(state) is str:
            return self.fn(*args, **kwargs)
        if state is None:
            return self._trace(key, flat, args, kwargs)
        try:
            return state.run(flat.tensors)
        except Exception:
            # An op raised (an index out of range, say): the plain call raises it as the
            # Tensor API words it, with its checks, which the replay skipped.
            return self.fn(*args, **kwargs)

    def _trace(self, key: tuple, flat: _Flattened, args: tuple, kwargs: dict) -> Any:
        tracer = Tracer(flat.backend, flat.outer)
        aliases = tracer.inputs(flat.tensors)
        args, kwargs = flat.rebuild(args, kwargs, aliases)
        tracing.tracer = tracer
        try:
            with effects.listening(lambda what: tracer.fail(f"it {what}")):
                out = self.fn(*args, **kwargs)
        finally:
            tracing.tracer = None
        trace = tracer.finish(out)
        out = _swap(out, {id(a): t for a, t in zip(aliases, flat.tensors)})
        self._traces.store(key, trace, _name(self.fn))
        return out


NEW = object()
""":meth:`Traces.state` of a signature not seen before (the call runs plainly)."""


class Traces:
    """Each signature's state, the least recently used first (at most ``limit``): None once
    seen (the next call traces), then its trace, or why it cannot be replayed; ``counter``
    counts the traces made (``counters``)."""

    def __init__(self, limit: int, counter: str) -> None:
        self.limit, self.counter = limit, counter
        self._states: OrderedDict[tuple, Trace | str | None] = OrderedDict()
        self._lock = threading.Lock()

    def state(self, key: tuple) -> Any:
        """``key``'s state (:data:`NEW` the first time, which marks it seen)."""
        with self._lock:
            state = self._states.get(key, NEW)
            if state is NEW:
                self._states[key] = None
                while len(self._states) > self.limit:
                    self._states.popitem(last=False)
            else:
                self._states.move_to_end(key)
            return state

    def __len__(self) -> int:
        return len(self._states)

    def store(self, key: tuple, trace: Trace | str, what: str) -> None:
        """Keeps ``key``'s trace (or reason), unless the key was dropped meanwhile; counts
        it, and logs it as ``what``'s under ``EMBER_FUSION_DEBUG``."""
        counters.add(self.counter)
        if type(trace) is str:
            _debug(f"{what}: not replayable: {trace}")
        else:
            _debug(f"{what}: traced {len(trace.entries)} dynamic ops "
                   f"({len(trace.consts)} constants)")  # fmt: skip
        with self._lock:
            if key in self._states:
                self._states[key] = trace


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _debug(message: str) -> None:
    if switch("EMBER_FUSION_DEBUG", False):
        print(f"[ember.fusion] replay: {message}", file=sys.stderr)


# ------------------------------------------------------------------ arguments


def fusion_of(backend: Any) -> Any:
    """The lazy fusion backend of ``backend`` (itself, or under one Autodiff), else None."""
    if hasattr(backend, "backward") and hasattr(backend, "from_inner"):  # Autodiff
        backend = backend.inner
    if getattr(backend, "lazy", False) is True and hasattr(backend, "executor"):
        return backend
    return None


def _fusion_prim(t: Tensor, outer: Any) -> FusionTensor:
    """The FusionTensor of a tensor of backend ``outer`` (unwrapping an Autodiff's)."""
    return t._prim if type(t._prim) is FusionTensor else outer.inner_primitive(t._prim)


class _Flattened:
    """A call's arguments as a signature and its tensors in order; ``reason`` says why the
    call cannot be replayed (then the rest is unset)."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        self.tensors: list[Tensor] = []
        self.backend: Any = None  # the fusion backend
        self.outer: Any = None  # the tensors' backend: the fusion one, or an Autodiff over it
        self.reason: str | None = None
        self._first: dict[int, int] = {}  # id(slot) -> first tensor index holding it
        self._module_leaves: dict[int, list] = {}  # id(module) -> [(path, tensor index)]
        parts: list = []
        self._walk((args, kwargs), parts)
        if self.reason is None:
            try:
                self.signature = tuple(parts)
                hash(self.signature)
            except TypeError as error:
                self.reason = f"an argument is not hashable ({error})"

    def _walk(self, value: Any, parts: list) -> None:
        if self.reason is not None:
            return
        kind = type(value)
        if isinstance(value, Tensor):
            outer = value._device.backend
            if self.outer is None:
                self.outer, self.backend = outer, fusion_of(outer)
                if self.backend is None:
                    off = hasattr(outer, "executor") or hasattr(getattr(outer, "inner", None),
                                                                "executor")  # fmt: skip
                    self.reason = ("fusion is off (EMBER_FUSION=0)" if off else
                                   f"a tensor is on {value._device}, not on a fusion device")
                    return
                if outer is not self.backend and listener.current() is not None:
                    self.reason = "a gradient listener (data-parallel sync) hears backward passes"
                    return
            elif outer is not self.outer:
                self.reason = f"tensors on two backends ({outer.name}, {self.outer.name})"
                return
            tracked = False
            prim = value._prim
            if outer is not self.backend:  # Autodiff: a TrackedTensor
                tracked = prim.node is not None
                if tracked and not prim.node.is_leaf:
                    self.reason = "a tensor of an autodiff graph (not a leaf) among the arguments"
                    return
                prim = prim.primitive
            slot = prim.slot
            first = self._first.setdefault(id(slot), len(self.tensors))
            self.tensors.append(value)
            device = slot.device
            parts.append((Tensor, slot.shape, slot.dtype, value._kind, device.place,
                          device.index, first, tracked))  # fmt: skip
        elif kind is tuple or kind is list:
            parts.append((kind, len(value)))
            for item in value:
                self._walk(item, parts)
        elif kind is dict:
            parts.append((dict, tuple(value)))
            for item in value.values():
                self._walk(item, parts)
        elif isinstance(value, Module):
            self._walk_module(value, parts)
        else:
            parts.append((kind, value))

    def _walk_module(self, module: Module, parts: list) -> None:
        """A module's parameters as inputs (in ``params()`` order), its configuration and
        constant tensors as part of the signature (the constants by identity: a
        constant of the trace, which holds them), in one pass over its fields."""
        parts.append((Module, type(module)))
        self._walk_fields(module, "", self._module_leaves.setdefault(id(module), []), parts)

    def _walk_fields(self, value: Any, path: str, leaves: list, parts: list) -> None:
        # Every call of a replayed model walks its fields (its parameters are the call's
        # inputs): a module's public fields straight from vars() (Module.fields' own
        # rule) and the commonest kinds tested first.
        if isinstance(value, Module):
            items = [(name, item) for name, item in vars(value).items() if name[:1] != "_"]
        else:
            items = _items(value)
        for name, item in items:
            kind = type(item)
            if kind is tuple and _of_ints(item):  # a stride, a padding: as it is
                parts.append((name, tuple, item))
            elif kind is int or kind is float or kind is bool or kind is str or item is None:
                parts.append((name, kind, item))
            elif isinstance(item, Param):
                where = _join(path, name)
                parts.append((where, kind, item.require_grad))
                leaves.append((where, len(self.tensors)))
                self._walk(item.val(), parts)
            elif isinstance(item, Tensor):
                parts.append((name, _fusion_prim(item, self.outer).slot
                              if item._device.backend is self.outer else id(item)))  # fmt: skip
            elif isinstance(item, Module | list | tuple | dict):
                parts.append((name, kind))
                self._walk_fields(item, _join(path, name), leaves, parts)
            else:
                parts.append((name, kind, item))

    def rebuild(self, args: tuple, kwargs: dict, tensors: list[Tensor]) -> tuple[tuple, dict]:
        """``args`` and ``kwargs`` with their tensors replaced by ``tensors`` (in the order
        of the walk), modules by modules with their parameters' values replaced."""
        position = iter(range(len(tensors)))

        def new(value: Any) -> Any:
            if isinstance(value, Module):
                leaves = dict(self._module_leaves.get(id(value), ()))
                for _ in leaves:
                    next(position)
                return value.map(lambda path, param: tensors[leaves[path]])
            return tensors[next(position)]

        return _swap((args, kwargs), None, new)


def _of_ints(value: tuple) -> bool:
    """Whether ``value`` holds only ints and tuples of them (equal such tuples are equal
    configurations: no 1 against 1.0 or True to tell apart)."""
    for v in value:  # noqa: SIM110 - a loop: all() over a generator costs twice as much a call
        if type(v) is not int and not (type(v) is tuple and _of_ints(v)):
            return False
    return True


def _swap(value: Any, by_id: dict[int, Tensor] | None, new: Callable | None = None) -> Any:
    """``value`` with each tensor replaced: by ``new(tensor)``, or where ``by_id`` holds the
    tensor's id by that entry; tuples, lists and dicts rebuilt, anything else kept."""
    if isinstance(value, Tensor) or (new is not None and isinstance(value, Module)):
        return new(value) if new is not None else by_id.get(id(value), value)
    if type(value) is tuple or type(value) is list:
        return type(value)(_swap(v, by_id, new) for v in value)
    if type(value) is dict:
        return {k: _swap(v, by_id, new) for k, v in value.items()}
    return value


# ------------------------------------------------------------------ tracing


class Entry:
    """One dynamic op of a trace."""

    __slots__ = ("attrs", "device", "direct", "eager", "hold", "indexed", "multi", "name", "now",
                 "op", "out_refs", "outputs", "refs", "release", "spread")  # fmt: skip

    def __init__(self, op, name, spread, refs, attrs, outputs, out_refs, multi, eager, now,
                 device, indexed):  # fmt: skip
        self.op, self.name, self.spread, self.refs, self.attrs = op, name, spread, refs, attrs
        self.outputs, self.out_refs, self.multi, self.eager = outputs, out_refs, multi, eager
        self.now = now  # ran at once when traced (small made operands): so it does replayed
        self.device = device
        # Runs at once on a call whose indices do not fit (handle.indices_fit), as unreplayed.
        self.indexed = indexed
        self.hold: tuple[int, ...] = ()  # outputs read by a later entry, or returned
        self.release: tuple[int, ...] = ()  # refs this entry reads last
        # A small op at once that the inner primitive runs (Fusion._now), where no kernel of
        # the executor's would.
        self.direct = False

    def call_args(self, operands: list) -> list:
        """The op's arguments with ``operands`` (slots or values, in order): a spread op's
        as one list."""
        return [operands, *self.attrs] if self.spread else [*operands, *self.attrs]

    def record(self, slots: list, present: tuple, stream: Any = None) -> Record:
        """This op as a record on its operands' ``slots`` (None where absent; ``present``
        the others), making new slots (of ``stream``, where it is to be pushed there)."""
        call_args = self.call_args(slots)
        outputs = tuple([Slot(shape, dtype, device, stream) for shape, dtype, device in self.outputs])
        return Record(self.op, self.name, call_args, present, outputs, self.multi)


class Tracer:
    """Logs the ops of one traced call (``Fusion.call`` hands each op here)."""

    def __init__(self, backend: Any, outer: Any) -> None:
        self.backend = backend
        self.outer = outer  # the tensors' backend: ``backend``, or an Autodiff over it
        self.refs: dict[Slot, int] = {}
        self.dynamic: list[bool] = []
        self.entries: list[Entry] = []
        self.consts: list[tuple[int, Slot]] = []
        self.n_inputs = 0
        self._held: list[FusionTensor] = []  # pending constants, readable until made
        self.failure: str | None = None

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason

    def inputs(self, tensors: list[Tensor]) -> list[Tensor]:
        """Made aliases of the call's input tensors, which the traced call reads instead:
        a tensor the function also captures (a closure's) stays a constant of the trace."""
        aliases: dict[int, Tensor] = {}
        out = []
        fusion, outer = self.backend, self.outer
        for t in tensors:
            handle = _fusion_prim(t, outer)
            slot = handle.slot
            alias = aliases.get(id(slot))
            if alias is None:
                prim = fusion.unwrap(handle)  # runs its stream where it is pending
                made = fusion._ready(prim, slot.device)
                self.refs[made.slot] = len(self.dynamic)
                self.dynamic.append(True)
                if outer is not fusion:  # a leaf stays a leaf (a new one: the trace's own)
                    tracked = t._prim.node is not None
                    made = outer.from_inner(made)
                    made = outer.set_require_grad(made, True) if tracked else made
                alias = aliases[id(slot)] = _wrap(made, t._device, t._kind)
            out.append(alias)
        self.n_inputs = len(self.dynamic)
        return out

    def input_handles(self, handles: list[FusionTensor]) -> None:
        """Takes ``handles``' slots as the call's inputs, as they are (the caller's own
        primitives, which the call reads and captures nothing else of: ``keyed.py``)."""
        refs, dynamic = self.refs, self.dynamic
        for handle in handles:
            if handle.slot not in refs:
                refs[handle.slot] = len(dynamic)
                dynamic.append(True)
        self.n_inputs = len(dynamic)

    def out(self, handle: FusionTensor) -> _Out:
        """The template of ``handle`` returned by the traced call (``const``: the handle
        itself, where it is a constant of the trace)."""
        r = self.ref(handle.slot)
        return _Out(r, None, None, None if self.dynamic[r] else handle)

    def reads(self, slot: Slot) -> None:
        """The traced call reads ``slot``'s inner value (``Fusion.unwrap``)."""
        r = self.refs.get(slot)
        if r is not None and self.dynamic[r]:
            self.fail(f"it reads the value of %{slot.id}, which it computes")

    def ref(self, slot: Slot) -> int:
        """``slot``'s reference, a new constant where the trace has not seen it."""
        r = self.refs.get(slot)
        if r is None:
            r = self.refs[slot] = len(self.dynamic)
            self.dynamic.append(False)
            self.consts.append((r, slot))
            if slot.prim is None:
                handle = slot.handle() if slot.handle is not None else None
                self._held.append(handle if handle is not None else FusionTensor(slot))
        return r

    def call(self, op, name: str, args: tuple, layout: tuple) -> Any:
        backend = self.backend
        n, spread, _, eager, indexed = layout
        operands = args[0] if spread else args[:n]
        slots = [None if t is None else t.slot for t in operands]
        dynamic = op.name == "random"
        for s in slots:
            r = None if s is None else self.refs.get(s)
            if r is not None and self.dynamic[r]:
                dynamic = True
        tracing.tracer = None  # the op itself runs as in a plain call
        try:
            out = backend.call(op, name, args)
        finally:
            tracing.tracer = self
        if not dynamic or self.failure is not None:
            return out  # static: a constant, should a dynamic op read it
        if op.name in VALUE_SHAPED or (eager and op.rule is None):
            self.fail(f"{name} reads a value the function computes (its result, or the Python "
                      "that uses it, depends on the values)")  # fmt: skip
            return out
        attrs = tuple(backend.inner_device(a) if isinstance(a, Device) else a for a in args[n:])
        outs = out if type(out) is tuple else (out,)
        out_slots = [h.slot for h in outs]
        if not eager and not self._rule_agrees(op, slots, attrs, out_slots):
            self.fail(f"{name}: its output shape depends on the values")
            return out
        out_refs = []
        for s in out_slots:
            out_refs.append(len(self.dynamic))
            self.refs[s] = len(self.dynamic)
            self.dynamic.append(True)
        self.entries.append(Entry(
            op, name, spread, tuple(-1 if s is None else self.ref(s) for s in slots), attrs,
            tuple((s.shape, s.dtype, s.device) for s in out_slots), tuple(out_refs),
            type(out) is tuple, eager, not eager and all(s.prim is not None for s in out_slots),
            out_slots[0].device if out_slots else None, indexed))  # fmt: skip
        return out

    @staticmethod
    def _rule_agrees(op, slots: list, attrs: tuple, out_slots: list) -> bool:
        """Whether the op's rule gives the shapes and dtypes the op made (an op the backend
        ran at once because its rule could not tell is value-dependent)."""
        try:
            aval = op.rule(op.name, *[None if s is None else AVal(s.shape, s.dtype) for s in slots],
                           *attrs)  # fmt: skip
        except Exception:
            return False
        avals = aval if type(aval) is tuple else (aval,)
        if len(avals) != len(out_slots):
            return False
        return all(tuple(a.shape) == s.shape and a.dtype == s.dtype
                   for a, s in zip(avals, out_slots))  # fmt: skip

    def finish(self, out: Any) -> Trace | str:
        """The trace of the call that returned ``out``, or why it cannot be replayed."""
        try:
            template = self._template(out)
        except _Unreplayable as error:
            self.fail(str(error))
            template = None
        return self.trace(template, Trace)

    def trace(self, template: Any, kind: type[Trace]) -> Trace | str:
        """A ``kind`` of trace of the call whose outputs ``template`` describes (``_Out``
        each, in the structure ``kind`` reads), or why it cannot be replayed."""
        if self.failure is not None:
            return self.failure
        for _, slot in self.consts:
            if slot.prim is None and slot.stream is not None:
                slot.stream.flush_for([slot])
            if slot.prim is None:
                return f"a value it captures (%{slot.id}) was never made"
        self._held.clear()
        return kind(self, template)

    def _template(self, value: Any) -> Any:
        """The output's structure, each tensor as ``(ref, device, kind, tensor)``."""
        if isinstance(value, Tensor):
            backend = value._device.backend
            if backend is not self.outer and backend is not self.backend:
                raise _Unreplayable(f"it returns a tensor on {value._device}")
            r = self.ref(_fusion_prim(value, backend).slot)
            tracked = backend is not self.backend and value._prim.node is not None
            if tracked and self.dynamic[r] and r >= self.n_inputs:
                raise _Unreplayable("it returns a tensor autodiff tracks (its graph is not "
                                    "replayed: return it detached, or its gradients)")  # fmt: skip
            return _Out(r, value._device, value._kind, None if self.dynamic[r] else value)
        if type(value) is tuple or type(value) is list:
            return type(value)(self._template(v) for v in value)
        if type(value) is dict:
            return {k: self._template(v) for k, v in value.items()}
        if value is None or type(value) in (bool, int, float, str):
            return value
        raise _Unreplayable(f"it returns a {type(value).__name__}")


class _Unreplayable(Exception):
    pass


class _Out:
    """An output tensor of a trace: its reference, device and kind; ``const`` is the traced
    call's tensor where the output is a constant of the trace."""

    __slots__ = ("const", "device", "kind", "ref")

    def __init__(self, ref: int, device: Device, kind: Any, const: Tensor | None) -> None:
        self.ref, self.device, self.kind, self.const = ref, device, kind, const


# ------------------------------------------------------------------ replaying


class Trace:
    """A traced call's dynamic entries, constants and output structure, ready to replay."""

    counted = ("replays", "direct_replays")  # the counters of a replay, and of a direct one

    def __init__(self, tracer: Tracer, template: Any) -> None:
        self.backend = tracer.backend
        self.outer = tracer.outer
        self.entries = tracer.entries
        self.n_refs = len(tracer.dynamic)
        self.n_inputs = tracer.n_inputs
        self.consts = tracer.consts
        self.template = template
        returned: set[int] = set()
        _collect(template, returned)
        last: dict[int, int] = {}
        for i, entry in enumerate(self.entries):
            for r in entry.refs:
                if r >= self.n_inputs and tracer.dynamic[r]:
                    last[r] = i
        released: dict[int, list[int]] = {}
        for r, i in last.items():
            if r not in returned:
                released.setdefault(i, []).append(r)
        for i, entry in enumerate(self.entries):
            entry.hold = tuple(k for k, r in enumerate(entry.out_refs)
                               if last.get(r, -1) > i or r in returned)  # fmt: skip
            entry.release = tuple(released.get(i, ()))
        for _, slot in self.consts:
            slot.shared = True  # read by streams of any thread that replays the trace
        # Flush plans of this trace's replays, by pushed entries and readable outputs
        # (``executor.Executor._blocks``).
        self.plans: dict[tuple, tuple] = {}
        # The replay without records (direct.Program): None until a flush shows it, False
        # where it cannot be one.
        self.program: direct.Program | bool | None = None
        self.returned = frozenset(r for r in returned if r >= self.n_inputs and tracer.dynamic[r])
        devices = {entry.device for entry in self.entries}
        self._direct_ok = bool(self.entries) and len(devices) == 1 and not any(
            entry.eager for entry in self.entries
        )
        # Each value's (shape, dtype, device): the inputs' (fixed by the signature) and
        # the entries' outputs.
        self.specs = {r: (slot.shape, slot.dtype, slot.device)
                      for slot, r in tracer.refs.items() if r < self.n_inputs}  # fmt: skip
        self.specs.update((r, spec) for entry in self.entries
                          for r, spec in zip(entry.out_refs, entry.outputs))  # fmt: skip
        executor = self.backend.executor
        for entry in self.entries:
            entry.direct = (entry.now and entry.name not in executor.op_kernels
                            and entry.name != "float_reshape")  # fmt: skip

    def run(self, tensors: list[Tensor]) -> Any:
        """Pushes the entries' records for the inputs ``tensors`` (the call's, in the order
        of its signature); returns the outputs."""
        if self.program:
            out = direct.run(self, self.program, tensors)
            if out is not None:
                return out  # counted there, with its launches
        counters.add(self.counted[0])
        backend = self.backend
        executor = backend.executor
        values: list[Any] = [None] * self.n_refs
        inputs = self.input_slots(tensors)
        values[: len(inputs)] = inputs
        for r, slot in self.consts:
            values[r] = slot
        held: dict[int, FusionTensor] = {}
        stream = None
        first = None  # the first record pushed, and the entries that pushed one
        pushed: list[int] = []
        holding: list = []  # streams told to run only once every record is pushed
        hold = len(self.entries) <= streams.MAX_REPLAY_RECORDS
        try:
            for index, entry in enumerate(self.entries):
                refs = entry.refs
                slots = [None if r < 0 else values[r] for r in refs]
                if entry.eager or (entry.indexed and not indices_fit(slots, entry.attrs)):
                    out = backend.run_eager(entry.op, entry.name, slots, entry.spread, entry.attrs)
                    outs = out if entry.multi else (out,)
                    for k, r in enumerate(entry.out_refs):
                        values[r] = outs[k].slot
                        if k in entry.hold:
                            held[r] = outs[k]
                elif entry.now and _all_made(slots):
                    if entry.direct:  # as Fusion.call ran it: the inner primitive, at once
                        out = backend._now(entry.name, slots, entry.spread, entry.attrs, entry.device)
                        outs = out if entry.multi else (out,)
                        for k, r in enumerate(entry.out_refs):
                            values[r] = outs[k].slot
                    else:
                        record = entry.record(slots, tuple([s for s in slots if s is not None]))
                        for k, r in enumerate(entry.out_refs):
                            values[r] = record.outputs[k]
                        executor.run_single(record)
                        counters.add("small_ops")
                else:
                    device = entry.device
                    if stream is None or stream.device is not device:
                        stream = stream_for(device, executor)
                        if hold and stream.hold():
                            holding.append(stream)
                    present = tuple([s for s in slots if s is not None])
                    stream.reading(present)
                    record = entry.record(slots, present, stream)
                    outputs = record.outputs
                    for k, r in enumerate(entry.out_refs):
                        values[r] = outputs[k]
                    for k in entry.hold:  # readable before the push, which may run the stream
                        held[entry.out_refs[k]] = FusionTensor(outputs[k])
                    if first is None:
                        first = record
                    pushed.append(index)
                    stream.push(record)
                for r in entry.release:
                    held.pop(r, None)
        except BaseException:
            for held_stream in holding:
                held_stream.holding = False  # what was pushed runs as pushes one by one run
            raise
        if first is not None and len(pushed) == len(stream):
            # One stream holds exactly this replay's records: the executor may find their
            # plan in self.plans (every replay of a trace pushes the same records, except
            # where an entry ran at once this time and not the last, hence the key).
            learn = None
            if self.program is None and self._direct_ok:
                learn = functools.partial(self._learn, values)
            stream.mark_replayed(first, len(pushed), self.plans, tuple(pushed), learn)
        for held_stream in holding:
            held_stream.release()
        return self._outputs(self.template, values, held, tensors)

    def input_slots(self, tensors: list[Tensor]) -> list[Slot]:
        """The slots of the trace's inputs for the call's ``tensors`` (the signature's
        order; a tensor passed twice is one input)."""
        found: list[Slot] = []
        outer = self.outer
        for t in tensors:
            slot = _fusion_prim(t, outer).slot
            if len(found) < self.n_inputs and slot not in found:
                found.append(slot)
        return found

    def _learn(self, values: list, records: list[Record], segments: list) -> None:
        if self.program is None:
            self.program = direct.learn(self, values, records, segments)

    def output_values(self, values: list, tensors: list[Tensor]) -> Any:
        """The call's outputs, from the slots of its references (``values``)."""
        return self._outputs(self.template, values, {}, tensors)

    def _outputs(self, template: Any, values: list, held: dict, tensors: list[Tensor]) -> Any:
        if type(template) is _Out:
            if template.const is not None:
                return template.const
            r = template.ref
            outer = self.outer
            if r < self.n_inputs:
                found = next(t for t in tensors if _fusion_prim(t, outer).slot is values[r])
                if template.device.backend is found._device.backend:
                    return found
                return _wrap(_fusion_prim(found, outer), template.device, template.kind)
            handle = held.get(r)
            if handle is None:
                handle = held[r] = FusionTensor(values[r])
            backend = template.device.backend
            prim = handle if backend is self.backend else backend.from_inner(handle)
            return _wrap(prim, template.device, template.kind)
        if type(template) is tuple or type(template) is list:
            return type(template)(self._outputs(v, values, held, tensors) for v in template)
        if type(template) is dict:
            return {k: self._outputs(v, values, held, tensors) for k, v in template.items()}
        return template


def _all_made(slots: list) -> bool:
    for s in slots:  # noqa: SIM110 - a loop: all() over a generator costs more per op
        if s is not None and s.prim is None:
            return False
    return True


def _collect(template: Any, refs: set[int]) -> None:
    if type(template) is _Out:
        if template.const is None:
            refs.add(template.ref)
    elif type(template) is tuple or type(template) is list:
        for v in template:
            _collect(v, refs)
    elif type(template) is dict:
        for v in template.values():
            _collect(v, refs)
