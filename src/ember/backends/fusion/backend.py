"""Fusion: a backend decorator that records ops lazily and runs them in fused blocks.

Every op reaches :meth:`Fusion.call`, the decorator's one generic path. It computes the
output's shape and dtype with the op's rule (``ember.backend.rules``), appends a
:class:`~ember.backends.fusion.stream.Record` to the stream of this thread and device, and
returns :class:`~ember.backends.fusion.handle.FusionTensor` handles without running
anything. A stream runs on ``sync``, at its length limit, or on an explicit
:meth:`Fusion.flush`; reading a value (``into_data``) runs the records it depends on. The
executor hands what runs to the fusers (``explorer.py``) and runs what they leave on the
inner backend.

Some ops run at once, after the streams they read from: ops whose output shape depends on
values (``argwhere``, or any whose rule cannot tell), ``embedding`` (its kernel checks its
indices: an error must raise at the op), data movement (``from_data``, ``into_data``,
``to_device``). The other indexed ops (``gather``, ``select``, ``scatter_add``,
``select_assign``: :data:`INDEXED`) are recorded where their indices are made and all
within the indexed dim (``handle.indices_fit``, a min and a max over them: a classifier's
labels), since their kernels cannot fail then; otherwise they run at once too, and the
inner kernel's error raises at the op. A cross-entropy's ``gather`` and its gradient's
``scatter_add`` then no longer split a training step's stream in two. Random ops stay in
the stream, which runs in order, so the inner generator draws in the same order as
without fusion.

**Small values run at once.** An op whose operands are all made (none is pending in a
stream) and hold at most ``EMBER_FUSION_SMALL`` elements each (default
:data:`SMALL_DEFAULT`) runs on the inner backend when it is called and is never recorded;
an activation or normalization composite on such operands runs as the inner backend's own
kernel instead of decomposing. So does a creation op with small results, and a
convolution, pooling or product with a kernel of the tuner's (``op_kernels``; nothing
fuses with them here) on made operands with small results, such as a large weight by a
small batch. On values that small, a record, its share of a flush and a launch cost more
Python time than a fused kernel saves in memory passes: the gradient-penalty step of
``benchmarks/higher_order.py`` (tensors of 18k-43k floats) ran 1.6x slower on
fusion(ndarray) than on NdArray, and the 784-256-256-10 MLP step of
``benchmarks/autodiff_step.py`` twice as slow. What reads a large or pending value is
still recorded and fused, a reduction to a small result included (softmax and layer norm
fuse with what reads their sums), and random ops always go to the stream (their draws
keep their order). ``EMBER_FUSION_SMALL=0`` records every op.

Activation and normalization composites (gelu, softmax, layer_norm, ...) decompose into
primitives here, so they fuse.
``EMBER_FUSION=0`` runs every op at once (no laziness, no fusion).

While a call of a replayed function is traced (``replayed.py``), each op goes through the
tracer, which runs it as here and logs it; replays push their records from the trace.
Autodiff's backward pass is replayed the same way, by its graph's key (``keyed.py``).
"""

from __future__ import annotations

import math
import operator
import os
import warnings
from collections.abc import Callable, Hashable
from typing import Any

from ember.backend.base import Backend
from ember.backend.decorator import Decorator
from ember.backend.device import Device
from ember.backend.environment import switch, whole_number
from ember.backend.errors import ArgumentError, BackendUnavailableError, EmberError
from ember.backend.ops import OpDef, primitives
from ember.backend.rules import AVal
from ember.backends.fusion import composites, counters
from ember.backends.fusion.executor import Executor, check_output, inner_args, runtime_named
from ember.backends.fusion.handle import FusionTensor, Slot, indices_fit
from ember.backends.fusion.keyed import KeyedReplays
from ember.backends.fusion.replayed import active, tracing
from ember.backends.fusion.stream import Record, flush_device, stream_for
from ember.tensor.dtype import DType

EAGER = frozenset({
    "from_data", "into_data", "to_device", "argwhere", "embedding", "embedding_backward",
})  # fmt: skip
"""Ops run at once (see the module docstring)."""
INDEXED = frozenset({"gather", "select", "scatter_add", "select_assign"})
"""Ops recorded only where their indices fit (``handle.indices_fit``), else run at once."""

DECOMPOSED = frozenset({"activation", "normalization"})
"""Groups of composites that decompose into their (recorded, fused) primitives here."""


SMALL_DEFAULT = 1 << 16
"""Elements, at most, of each operand of an op on made operands that runs at once rather
than being recorded (of each result, for a creation op or an ``op_kernels`` op; see the
module doc); ``EMBER_FUSION_SMALL`` overrides it, ``0`` turns it off. A larger limit ran
the MLP step faster still, but would take the ONNX encoder's ``[8, 128, 256]``
element-wise chains out of fused kernels."""


def small_limit() -> int:
    """``EMBER_FUSION_SMALL`` as an element count (:data:`SMALL_DEFAULT` when unset).

    Raises:
        ConfigError: the variable is not a whole number of at least 0.
    """
    return whole_number("EMBER_FUSION_SMALL", SMALL_DEFAULT, "elements", "0 records every op")


def enabled() -> bool:
    """Whether ``EMBER_FUSION`` leaves fusion on (anything but ``0``)."""
    return switch("EMBER_FUSION", True)


class Fusion(Decorator):
    """Wraps ``inner`` so that its ops are recorded and run later, fused where possible.

    Args:
        inner: the backend that runs what no fused kernel computes (NdArray, Torch).
        runtime: what runs fused blocks: ``"numba"`` (compiled kernels, the default; needs
            ``ember[jit]``), ``"interpreter"``, or ``"triton"`` (GPU kernels for Torch CUDA
            values; needs ``ember[gpu-jit]``); ``None`` reads ``EMBER_FUSION_RUNTIME``. On a
            Torch ``cuda`` device, Triton runs the blocks unless another runtime is named
            (see :meth:`placed`).
        small: the most elements of each operand of an op on made operands that runs at
            once instead of being recorded (see the module doc); ``None`` reads
            ``EMBER_FUSION_SMALL`` (default :data:`SMALL_DEFAULT`), ``0`` records every op.

    Raises:
        ArgumentError: ``small`` is not a whole number of at least 0.
        ConfigError: ``EMBER_FUSION_SMALL`` is not one.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> device = ember.device("ndarray").fusion()
        >>> y = (Tensor.from_data([1.0, 2.0], device) * 2.0).exp().log()
        >>> y.tolist()
        [2.0, 4.0]
    """

    prefix = "fusion"

    def __init__(self, inner: Backend, runtime: str | None = None,
                 small: int | None = None) -> None:  # fmt: skip
        super().__init__(inner)
        self.lazy = enabled()
        if small is not None and (type(small) is not int or small < 0):
            raise ArgumentError(f"fusion: small={small!r}; expected a whole number of elements "
                                "of at least 0 (0 records every op)")  # fmt: skip
        self.small = small_limit() if small is None else small
        self.requested = runtime or os.environ.get("EMBER_FUSION_RUNTIME") or None
        self._cpu_error: BackendUnavailableError | None = None
        try:
            cpu = runtime_named(runtime)
        except BackendUnavailableError as error:
            if self.requested is not None or inner.name != "torch":
                raise
            # The default runtime of CPU values (numba) is missing: a Torch CUDA device
            # needs only Triton; a CPU device says so when it is placed.
            self._cpu_error = error
            cpu = runtime_named("interpreter")
        self.executor = Executor(inner, cpu)
        self._keyed = KeyedReplays(self)

    def placed(self, place: str, index: int) -> None:
        """Picks the runtime of a Torch CUDA device's blocks (``Device.wrap`` calls it):
        Triton, asked for or by default. Asked for (``runtime="triton"``) where it cannot
        run CUDA kernels, it raises; by default it warns once, saying why, and the CUDA
        device's ops run unfused.

        Raises:
            BackendUnavailableError: ``runtime="triton"`` without triton (``ember[gpu-jit]``),
                without a GPU, or under Triton's interpreter (which runs CPU tensors only);
                or, on the CPU, the default runtime (numba: ``ember[jit]``) is missing.
        """
        if place != "cuda" and self._cpu_error is not None:
            raise self._cpu_error
        if place != "cuda" or self.inner.name != "torch" or self.executor.gpu_runtime is not None:
            return
        if self.requested not in (None, "triton"):
            return  # numba or the interpreter, asked for: CPU values only, as they say
        from ember.backends.fusion import triton_runtime

        reason = triton_runtime.unavailable_reason()
        if reason is None and triton_runtime.interpreting():
            reason = ("fusion: Triton's interpreter is on (TRITON_INTERPRET=1): its kernels run "
                      "on CPU tensors only, not on cuda")  # fmt: skip
        if reason is not None:
            if self.requested == "triton":
                raise BackendUnavailableError(reason)
            _warn_once(f"{reason}; the ops of torch:cuda run unfused")
            return
        self.executor.use_gpu(runtime_named("triton"))

    @classmethod
    def forward_composite(cls, op: OpDef) -> bool:
        return op.group not in DECOMPOSED

    # ------------------------------------------------------------ the generic path
    def call(self, op: OpDef, name: str, args: tuple) -> Any:
        # Every op of a model passes here: written for speed (no generators, the op's
        # argument layout looked up once per primitive).
        layout = _layouts.get(name)
        if layout is None:
            layout = _layout(op, name)
        if tracing.tracer is not None and (tracer := active(self)) is not None:
            return tracer.call(op, name, args, layout)  # which comes back here, untraced
        n, spread, has_device, eager, indexed = layout
        if eager or not self.lazy:
            return self._eager(op, name, args)
        operands = args[0] if spread else args[:n]
        slots = [None if t is None else t.slot for t in operands]
        if indexed and not indices_fit(slots, args[n:]):
            return self._eager(op, name, args)
        present = tuple([s for s in slots if s is not None])
        if present:
            # Made operands: small ones run at once (without asking the rule for the results'
            # size); a convolution's, pooling's or product's may be large, its results small.
            now = self.small and _all_made(present)
            found = self.executor.op_kernels.get(name)
            kernel = found is not None and not found.fuses
            if now and not kernel and not has_device and _elements_at_most(present, self.small):
                return self._now(name, slots, spread, args[n:], present[0].device)
            if _side_arithmetic(present):
                return self._eager(op, name, args)
            now = now and kernel  # a reduction of a large value fuses with what reads its result
        else:  # a creation op (random ones stay in the stream, so draws keep their order)
            now = self.small and op.name != "random"
        attrs = args[n:]
        device = None
        if has_device:
            attrs = list(attrs)
            for i, a in enumerate(attrs):
                if isinstance(a, Device):
                    attrs[i] = device = self.inner_device(a)
        if device is None:
            device = present[0].device
        try:
            avals = [None if s is None else _aval(AVal, (s.shape, s.dtype)) for s in slots]
            aval = op.rule(op.name, *avals, *attrs)
        except Exception:  # the inner backend says what is wrong, at the op
            return self._eager(op, name, args)
        multi = type(aval) is tuple
        out_avals = aval if multi else (aval,)
        for a in out_avals:  # a size or dtype the rule cannot know: the inner op tells
            shape = a.shape
            if (shape and min(shape) < 0) or not isinstance(a.dtype, DType):
                return self._eager(op, name, args)

        call_args = [slots, *attrs] if spread else [*slots, *attrs]
        if now and _elements_at_most(out_avals, self.small):
            if not present:
                return self._now(name, slots, spread, attrs, device)
            # A convolution, pooling or product takes the kernel the tuner chose for it.
            counters.add("small_ops")
            if not spread:
                made = self.executor.run_settled(name, found, [*[s.prim for s in slots], *attrs])
                if made is not None:
                    return self._settled_handles(name, made, out_avals, multi, device)
            outputs = tuple([Slot(a.shape, a.dtype, device) for a in out_avals])
            self.executor.run_single(Record(op, name, call_args, present, outputs, multi))
            handles = tuple([FusionTensor(s) for s in outputs])
            return handles if multi else handles[0]

        stream = stream_for(device, self.executor)
        stream.reading(present)
        # The handles exist before the record is pushed: a push that fills the stream runs
        # it, and a fused block writes only the outputs someone can read.
        if not multi:
            output = Slot(aval.shape, aval.dtype, device, stream)
            handle = FusionTensor(output)
            stream.push(Record(op, name, call_args, present, (output,), False))
            return handle
        outputs = tuple([Slot(a.shape, a.dtype, device, stream) for a in out_avals])
        handles = tuple([FusionTensor(s) for s in outputs])
        stream.push(Record(op, name, call_args, present, outputs, multi))
        return handles

    def _now(self, name: str, slots: list, spread: bool, attrs, device: Device) -> Any:
        """Runs a small op on made values at once on the inner backend (module doc), its
        results on the inner ``device`` (``attrs`` name inner devices)."""
        counters.add("small_ops")
        prims = [None if s is None else s.prim for s in slots]
        run = getattr(self.inner, name)
        out = run(prims, *attrs) if spread else run(*prims, *attrs)
        if type(out) is tuple:
            return tuple([self._ready(o, device) for o in out])
        return self._ready(out, device)

    def _settled_handles(self, name: str, made: tuple, out_avals: tuple, multi: bool,
                         device: Device) -> Any:  # fmt: skip
        """Handles on what ``Executor.run_settled`` made (``made``: its result and whether
        the pool holds it), checked against the rule's ``out_avals``."""
        out, pooled = made
        recycler = self.executor.recycler if pooled else None
        handles = []
        for a, prim in zip(out_avals, out if multi else (out,), strict=True):
            check_output(self.inner, prim, a.shape, a.dtype, name)
            slot = Slot(a.shape, a.dtype, device, prim=prim)
            slot.recycle = recycler  # pooled arrays go back when the slot goes
            handles.append(FusionTensor(slot))
        return tuple(handles) if multi else handles[0]

    def _eager(self, op: OpDef, name: str, args: tuple) -> Any:
        """Runs ``op`` now, after whatever makes its operands."""
        n = len(op.inputs)
        spread = n > 0 and op.inputs[0] == "*tensors"
        operands = list(args[0]) if spread else list(args[:n])
        slots = [None if t is None else t.slot for t in operands]
        return self.run_eager(op, name, slots, spread, args[n:])

    def run_eager(self, op: OpDef, name: str, slots: list, spread: bool, attrs) -> Any:
        """Runs ``op`` on the values of ``slots`` (its operands in order, None for an absent
        one; ``spread`` when they are one list argument) now, after whatever makes them."""
        counters.add("eager_ops")
        for s in slots:
            if s is not None and s.stream is not None:
                s.stream.flush_for([s])
        call_args = [slots] if spread else slots
        attrs = [self.inner_device(a) if isinstance(a, Device) else a for a in attrs]
        record = Record(op, name, [*call_args, *attrs], (), ())
        out = getattr(self.inner, name)(*inner_args(record))
        if op.name == "into_data":
            return out
        if type(out) is tuple:
            return tuple(self._ready(o) for o in out)
        return self._ready(out)

    def _ready(self, prim: Any, device: Device | None = None) -> FusionTensor:
        """A handle on a made inner value (on the inner ``device``, when the caller knows it)."""
        inner = self.inner
        device = inner.device_of(prim) if device is None else device
        return FusionTensor(Slot(inner.shape(prim), inner.dtype(prim), device, prim=prim))

    # ------------------------------------------------------------ reads and flushes
    def flush(self, device: Device | None = None) -> None:
        """Runs every pending op on ``device`` (every thread's), or on all of this
        backend's devices when None."""
        if device is None:
            for place in self.places:
                for index in range(self.inner.device_count(place)):
                    flush_device(Device(self.inner, place, index))
            return
        flush_device(self.inner_device(device))

    def sync(self, device: Device) -> None:
        inner = self.inner_device(device)
        flush_device(inner)
        self.inner.sync(inner)

    def replay_keyed(self, key: Hashable, inputs: list, fn: Callable[[list], list]) -> list:
        """``fn(inputs)``, or the ops it issued for an earlier call of an equal key pushed
        again from a trace (``keyed.py``): Autodiff's backward pass, for one."""
        return self._keyed.run(key, inputs, fn)

    def seed(self, device: Device, seed: int) -> None:
        _no_trace(self, "seeds the generator")
        self.flush(device)  # draws recorded before the seed come from the old state
        self.inner.seed(self.inner_device(device), seed)

    def rng_state(self, device: Device) -> str:
        self.flush(device)
        return self.inner.rng_state(self.inner_device(device))

    def set_rng_state(self, device: Device, state: str) -> None:
        _no_trace(self, "sets the generator's state")
        self.flush(device)
        self.inner.set_rng_state(self.inner_device(device), state)

    # ------------------------------------------------------------ handles
    def wrap(self, inner_prim: Any) -> FusionTensor:
        return self._ready(inner_prim)

    def unwrap(self, prim: FusionTensor) -> Any:
        """The inner primitive of a handle, running its stream first if it is pending."""
        slot = prim.slot
        if tracing.tracer is not None and (tracer := active(self)) is not None:
            tracer.reads(slot)
        if slot.stream is not None:
            slot.stream.flush_for([slot])
        if slot.prim is None:
            raise EmberError(f"fusion: %{slot.id} was never made (an earlier op failed)")
        return slot.prim

    # C-level getters: every op asks for its operands' shapes and dtypes, some several times.
    shape = staticmethod(operator.attrgetter("slot.shape"))
    dtype = staticmethod(operator.attrgetter("slot.dtype"))

    def device_of(self, x: FusionTensor) -> Device:
        d = x.slot.device
        return Device(self, d.place, d.index)


def _small_first(op: OpDef, name: str):
    """Activation or normalization composite ``name`` of a Fusion backend: decomposed into
    primitives (which are recorded and fuse; from a template of their records after the
    first call of a signature: ``composites.py``), except that on small made operands the
    inner backend's own kernel runs at once (one call rather than each primitive of the
    decomposition)."""
    decomposed = getattr(Backend, name)
    n = len(op.inputs)

    def composite(self: Fusion, *args: Any) -> Any:
        if self.lazy and tracing.tracer is None:  # traced: primitives
            slots = [None if t is None else t.slot for t in args[:n]]
            present = tuple([s for s in slots if s is not None])
            if self.small and _all_made(present) and _elements_at_most(present, self.small):
                return self._now(name, slots, False, args[n:], present[0].device)
            if present:
                return composites.record(self, decomposed, name, n, slots, present, args)
        return decomposed(self, *args)

    composite.__name__ = name
    composite.__qualname__ = f"Fusion.{name}"
    composite.__doc__ = decomposed.__doc__
    return composite


for _op, _kind, _name in primitives():
    if _op.composite and not Fusion.forward_composite(_op):
        setattr(Fusion, _name, _small_first(_op, _name))

_aval = tuple.__new__  # AVal(shape, dtype) without its Python constructor: an op's operands

_layouts: dict[str, tuple[int, bool, bool, bool, bool]] = {}


def _no_trace(backend: Fusion, what: str) -> None:
    """Marks a trace running on ``backend`` unreplayable: the call ``what``."""
    if tracing.tracer is not None and (tracer := active(backend)) is not None:
        tracer.fail(f"it {what}")


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _layout(op: OpDef, name: str) -> tuple[int, bool, bool, bool, bool]:
    """Primitive ``name``'s argument layout, remembered: its count of tensor operands,
    whether they come as one list (``cat``), whether an attribute may be a device, whether
    the op runs at once, and whether it does unless its indices fit (:data:`INDEXED`)."""
    n = len(op.inputs)
    layout = _layouts[name] = (
        n,
        n > 0 and op.inputs[0] == "*tensors",
        "device" in op.attrs,
        op.name in EAGER or op.rule is None,
        op.name in INDEXED,
    )
    return layout


def _all_made(slots: tuple[Slot, ...]) -> bool:
    for s in slots:  # noqa: SIM110 - a loop: all() over a generator costs more per op
        if s.prim is None:
            return False
    return True


def _elements_at_most(values, limit: int) -> bool:
    """Whether each of ``values`` (slots or abstract values) holds at most ``limit``
    elements."""
    for a in values:  # noqa: SIM110 - a loop: all() over a generator costs more per op
        if math.prod(a.shape) > limit:
            return False
    return True


def _side_arithmetic(slots: tuple[Slot, ...]) -> bool:
    """Whether every operand is a made, small integer value (an imported model's shape
    arithmetic): such an op runs at once, cheaper than a record, and leaves nothing pending
    for the reshape that reads its result."""
    for s in slots:
        if s.prim is None or not s.dtype.is_int or len(s.shape) > 1 or (s.shape and s.shape[0] > 64):
            return False
    return True
