"""The convolution epilogue fuser: a convolution and the element-wise ops on its output.

A CNN's convolutions are followed by their activation, and in a residual block by the
addition of the skip path and an activation: ``relu(conv(x) + skip)``. Run one by one,
each of those ops reads and writes the whole activation once more. The numba convolution
(``numba_conv``) applies them as it stores each output instead (its
:class:`~ember.backends.fusion.numba_conv.Epilogue`), so this fuser takes, after a
``conv2d`` record, the records of that form on the convolution's value:

* ``float_clamp`` of the value (ReLU is ``clamp(x, 0, None)``; any bounds),
* ``float_add`` of the value and another tensor of the same shape and dtype made before
  the segment (the residual),

in the order clamp, add, clamp (each at most once, each optional; at least one). Its
block (:class:`ConvEpilogue`) runs in the executor: on the numba kernel where the tuner
chose that kernel for the convolution alone, else record by record as before, so a
fused segment computes exactly what its records compute unfused (the epilogue rounds
each step as the op does). A segment whose inner values are read later (a handle, a
later record: a training step's saved activations) also runs record by record: writing
them from the store too was measured slower than the ops alone (conv + ReLU at
8x32x32x32 with the conv's output kept: 0.90 ms against 0.83).

Only convolutions the kernel takes with an epilogue qualify: float32 or float64, 4-d,
at least :data:`~ember.backends.fusion.numba_conv.OB` output channels per group.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.backends.fusion.fuser import Properties, Status, Taking
from ember.backends.fusion.handle import Slot
from ember.backends.fusion.stream import Record
from ember.tensor.dtype import DType

OPS = ("conv2d", "float_clamp", "float_add")
"""The primitives the fuser takes."""

_FLOATS = (DType.F32, DType.F64)

# The step each record computes, in the kernel's order (a record's output is the value
# after its step): the convolution plus bias, the first clamp, the residual add, the
# second clamp.
CONV, FIRST, RESIDUAL, SECOND = range(4)


@dataclass(frozen=True)
class ConvEpilogue:
    """A fused segment: ``conv`` (the ``conv2d`` record) and its epilogue.

    ``first`` and ``second`` are the clamps' bounds (``(None, None)`` where there is no
    clamp), ``residual`` the added slot (None: no addition), ``output`` the last record's
    slot; ``inner_read`` says whether a value before the last is read after the segment
    (then the executor runs the records one by one).
    """

    conv: Record
    first: tuple
    residual: Slot | None
    second: tuple
    output: Slot
    inner_read: bool


@dataclass(frozen=True)
class EpilogueTemplate:
    """A :class:`ConvEpilogue` without slots or values: each record's step, which operand
    of the addition is the convolution's value, and which records' outputs are kept.
    Streams with the same plan key bind it (:meth:`bind`); bounds, options and slots come
    from the bound records, since the key holds only their kinds."""

    steps: tuple[int, ...]
    value_operand: int  # of the residual add: 0 or 1 (-1 without one)
    kept: tuple[bool, ...]

    def bind(self, records: list[Record]) -> ConvEpilogue | None:
        """The segment for ``records`` (None where they do not fit: the plan key holds no
        channel counts, so a convolution of too few output channels per group for the
        kernel's epilogue has the key of one with enough)."""
        if len(records) != len(self.steps) or records[0].name != "conv2d":
            return None
        if not _enough_channels(records[0]):
            return None
        first = second = (None, None)
        residual = None
        value = records[0].outputs[0]
        for record, step in zip(records, self.steps, strict=True):
            if step in (FIRST, SECOND):
                if record.name != "float_clamp":
                    return None
                bounds = tuple(record.args[1:3])
                if step == FIRST:
                    first = bounds
                else:
                    second = bounds
            elif step == RESIDUAL:
                if record.name != "float_add":
                    return None
                residual = record.inputs[1 - self.value_operand]
                if residual.shape != value.shape or residual.dtype is not value.dtype:
                    return None
        inner_read = any(self.kept[:-1])
        return ConvEpilogue(records[0], first, residual, second, records[-1].outputs[0],
                            inner_read)  # fmt: skip


class ConvEpilogueFuser(Taking):
    """Takes a ``conv2d`` record and the epilogue records after it (see the module doc).

    Args:
        can_fuse: whether a slot's values can reach the kernel (a NumPy-viewable CPU tensor).
    """

    name = "conv+epilogue"

    def __init__(self, can_fuse) -> None:
        self.can_fuse = can_fuse
        self.reset()

    def reset(self) -> None:
        self.records: list[Record] = []
        self.steps: list[int] = []
        self.value_operand = -1
        self._template: EpilogueTemplate | None = None
        self._status = Status.OPEN

    def properties(self) -> Properties:
        n = len(self.records)
        return Properties(score=n, ready=n >= 2)

    def might_take(self, record: Record) -> bool:
        return not record.multi and record.name in OPS

    def fuse(self, record: Record) -> None:
        if self._status is Status.CLOSED:
            return
        step = self._step(record) if self.records else self._conv(record)
        if step is None:
            self._status = Status.CLOSED
            return
        self.records.append(record)
        self.steps.append(step)

    def _conv(self, record: Record) -> int | None:
        """CONV for a convolution the kernel takes with an epilogue, else None."""
        from ember.backends.fusion import numba_conv

        if record.name != "conv2d" or record.multi or numba_conv.numba is None:
            return None
        x, weight = record.inputs[0], record.inputs[1]
        slots = (*record.inputs, record.outputs[0])
        if not all(s.dtype is x.dtype and self.can_fuse(s) for s in slots):
            return None
        if x.dtype not in _FLOATS or len(x.shape) != 4 or len(weight.shape) != 4:
            return None
        if not _enough_channels(record):
            return None
        return CONV

    def _step(self, record: Record) -> int | None:
        """The step ``record`` adds to the epilogue, or None where it does not continue it."""
        value = self.records[-1].outputs[0]
        last = self.steps[-1]
        if record.multi or len(record.outputs) != 1:
            return None
        out = record.outputs[0]
        if out.shape != value.shape or out.dtype is not value.dtype or not self.can_fuse(out):
            return None
        if record.name == "float_clamp":
            if record.inputs != (value,) or not all(_bound(b) for b in record.args[1:3]):
                return None
            return FIRST if last == CONV else SECOND if last == RESIDUAL else None
        if record.name == "float_add" and last < RESIDUAL and len(record.inputs) == 2:
            ids = [s.id for s in record.inputs]
            if ids.count(value.id) != 1:
                return None
            operand = ids.index(value.id)
            other = record.inputs[1 - operand]
            made = {o.id for r in self.records for o in r.outputs}
            if (other.shape != value.shape or other.dtype is not value.dtype
                    or other.id in made or not self.can_fuse(other)):  # fmt: skip
                return None
            self.value_operand = operand
            return RESIDUAL
        return None

    def finish(self, keep: set[int]) -> ConvEpilogue:
        # The last record's value is always written (it is the kernel's output).
        kept = tuple(r.outputs[0].id in keep for r in self.records[:-1]) + (True,)
        self._template = EpilogueTemplate(tuple(self.steps), self.value_operand, kept)
        return self._template.bind(self.records)

    def template(self, fused: ConvEpilogue) -> EpilogueTemplate:
        """``fused`` (this fuser's :meth:`finish`) without slots or values."""
        return self._template


def _enough_channels(conv: Record) -> bool:
    """Whether a ``conv2d`` record has the output channels per group an epilogue needs."""
    from ember.backends.fusion import numba_conv

    groups = conv.args[3].groups
    return groups >= 1 and conv.inputs[1].shape[0] // groups >= numba_conv.OB


def _bound(value: object) -> bool:
    """Whether a clamp bound is one the kernel takes: None or a real number."""
    return value is None or (type(value) in (int, float))


def run_conv_epilogue(fused: ConvEpilogue, args: list, threads: int, empty) -> object:
    """Runs ``fused`` on the numba kernel: ``args`` are the convolution's inner arguments
    (NumPy arrays and options), ``empty`` the allocator of its output; returns the output
    array.

    Raises:
        KernelUnsupported: a case the kernel does not take (the caller runs the records).
    """
    from ember.backends.fusion import numba_conv

    residual = None if fused.residual is None else fused.residual.prim
    epilogue = numba_conv.Epilogue(fused.first, residual, fused.second)
    return numba_conv.conv2d(*args, threads=threads, empty=empty, epilogue=epilogue)
