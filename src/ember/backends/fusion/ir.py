"""The fused IR: what a fuser hands a runtime, and the contract between the two.

A :class:`Block` is a straight-line program over *registers* that one kernel computes in
a single pass over memory. Registers ``0 .. len(inputs) - 1`` are the block's inputs;
register ``len(inputs) + i`` is the result of ``body[i]``. Every instruction names an op
of the op table (``ember.backend.ops``) by its table name (``"add"``, ``"exp"``,
``"mul_scalar"``, ``"cast"``, ``"greater_elem"``, ``"mask_where"``, ``"sum_dim"``) and
takes its attributes in the table's order, without devices.

Shapes: every register has the block's rank. An input's shape equals the block's shape
or has 1 where it is broadcast. An element-wise instruction broadcasts its operands. A
reduction instruction (``sum_dim``, ``mean_dim``, ``max_dim``, ``min_dim``, ``prod_dim``)
reduces ``Block.axis`` to size 1 (keepdim, as ember's ``*_dim`` ops do); all reductions of
one block reduce the same axis, so a kernel runs one loop nest: for each position outside
the axis, the passes its reductions need along the axis, then the outputs. This covers
element-wise chains and softmax, log-softmax, layer norm, mean/var and cross-entropy.

One exception, a *total* (:func:`is_total`): a float ``sum_dim`` over another dim than the
axis (the last dim) of a register of the block's full shape, which only the block's
outputs read. The kernel adds each value into its total as it computes it (a layer norm's
gradient summed over the batch for its weight's gradient), so the summed value is never
written and read back. The totals of a block sum the same dim, not a unit one.

A runtime compiles a block once per :meth:`Block.key` (ops, registers, dtypes, ranks and
which dims are broadcast, never the sizes) and runs it on arrays of any sizes that fit.
Numeric attributes (the scalar of ``mul_scalar``, the bounds of ``clamp``, the value of
``mask_fill``) are not part of the key: a kernel takes them as arguments, in the order
of :meth:`Block.scalars`, so a learning rate that changes every step compiles nothing.
The key keeps two facts about a value (:func:`attr_tag`): whether a ``mul_scalar``
scales by a power of two, which a kernel may then apply to either factor of a product,
and whether a float32 ``div_scalar`` divides by sqrt 2 (or a ``mul_scalar`` multiplies by
its inverse), whose erf a kernel may compute from the dividend (a GELU's).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

from ember.backend.errors import EmberError
from ember.tensor.dtype import DType

REDUCTIONS = frozenset({"sum_dim", "mean_dim", "max_dim", "min_dim", "prod_dim"})


class StateError(EmberError, ValueError):
    """A stored plan or block template (``to_state`` data read back) that does not hold:
    a wrong type, an index out of range, an unknown op or dtype. Whoever reads such state
    from disk ignores it and plans anew."""


@dataclass(frozen=True)
class Input:
    """An input of a block: its shape (the block's, or 1 in broadcast dims) and dtype."""

    shape: tuple[int, ...]
    dtype: DType


@dataclass(frozen=True)
class Instr:
    """One instruction: ``op`` (an op-table name) on registers ``args`` with ``attrs``.

    ``shape`` is the result's shape (the broadcast of its operands; the reduced axis is 1
    after a reduction), ``dtype`` its element type.
    """

    op: str
    args: tuple[int, ...]
    attrs: tuple[Any, ...]
    shape: tuple[int, ...]
    dtype: DType


@dataclass(frozen=True)
class Block:
    """A fused program: inputs, instructions, and the registers written out.

    Args:
        shape: the full (broadcast) shape the block iterates over.
        inputs: the input registers' shapes and dtypes.
        body: the instructions, in order; each reads only earlier registers.
        outputs: the registers the kernel writes, each an array of that register's shape.
        axis: the axis every reduction of the body reduces, or None when there is none.
    """

    shape: tuple[int, ...]
    inputs: tuple[Input, ...]
    body: tuple[Instr, ...]
    outputs: tuple[int, ...]
    axis: int | None = None

    def register_shape(self, register: int) -> tuple[int, ...]:
        if register < len(self.inputs):
            return self.inputs[register].shape
        return self.body[register - len(self.inputs)].shape

    def register_dtype(self, register: int) -> DType:
        if register < len(self.inputs):
            return self.inputs[register].dtype
        return self.body[register - len(self.inputs)].dtype

    def scalars(self) -> tuple[int | float | bool, ...]:
        """The numeric attributes of the body, in order: a kernel's scalar arguments."""
        return tuple(a for i in self.body for a in i.attrs if is_scalar(i, a))

    def key(self) -> tuple:
        """What a compiled kernel depends on: everything but the sizes of the dims and the
        values of numeric attributes (only their types). Computed once per block."""
        found = self.__dict__.get("_key")
        if found is None:
            found = self._pattern_key()
            object.__setattr__(self, "_key", found)  # a cache beside the frozen fields
        return found

    def share_key(self, key: tuple) -> None:
        """Gives this block the key of another with the same pattern (a template's earlier
        block), so it is not computed again; the caller vouches they are equal."""
        object.__setattr__(self, "_key", key)

    def _pattern_key(self) -> tuple:
        def pattern(shape: tuple[int, ...]) -> tuple[bool, ...]:
            return tuple(d == 1 for d in shape)

        def attrs(instr: Instr) -> tuple:
            return tuple(attr_tag(instr.op, a) if is_scalar(instr, a) else a
                         for a in instr.attrs)  # fmt: skip

        return (
            len(self.shape),
            self.axis,
            tuple((pattern(i.shape), i.dtype.value) for i in self.inputs),
            tuple((i.op, i.args, attrs(i), pattern(i.shape), i.dtype.value) for i in self.body),
            self.outputs,
        )


POWER_OF_TWO = "2**k"
"""The key's tag of a ``mul_scalar`` by a power of two (:func:`attr_tag`)."""
BY_SQRT2 = "sqrt 2"
"""The key's tag of a ``div_scalar`` by sqrt 2 and of a ``mul_scalar`` by 1 / sqrt 2, each
as float32 rounds it (:func:`attr_tag`)."""
_SQRT2 = {"div_scalar": math.sqrt(2.0), "mul_scalar": 1.0 / math.sqrt(2.0)}


def _as_float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def attr_tag(op: str, value: Any) -> str:
    """What the keys keep of a numeric attribute: its type's name;
    :data:`POWER_OF_TWO` for a ``mul_scalar`` by ``+-2**k`` with ``|k| <= 60`` (exact in
    float32 and float64 alike): scaling by a power of two commutes with rounding, so a
    kernel may scale whichever factor of a product is ready first (``numba_source``);
    :data:`BY_SQRT2` for a ``div_scalar`` by sqrt 2 or a ``mul_scalar`` by its inverse,
    rounded to float32 (a float32 kernel computes the erf of the result from the operand)."""
    kind = type(value)
    near = _SQRT2.get(op)
    if near is not None and kind is float and abs(value - near) < 1e-6:  # packs as float32
        return BY_SQRT2 if _as_float32(value) == _as_float32(near) else "float"
    if op == "mul_scalar" and kind is int:
        magnitude = abs(value)  # an int of any size: no float conversion to overflow
        if magnitude and magnitude & (magnitude - 1) == 0 and magnitude.bit_length() <= 61:
            return POWER_OF_TWO
    elif op == "mul_scalar" and kind is float:
        mantissa, exponent = math.frexp(value)  # (0.0, 0), (inf, 0), (nan, 0) fail below
        if abs(mantissa) == 0.5 and -59 <= exponent <= 61:
            return POWER_OF_TWO
    return kind.__name__


def is_total(instr: Instr, axis: int | None) -> bool:
    """Whether ``instr`` of a block reducing ``axis`` is a total (see the module doc)."""
    return instr.op == "sum_dim" and axis is not None and instr.attrs[0] != axis


def is_scalar(instr: Instr, value: Any) -> bool:
    """Whether an attribute of ``instr`` is a number passed to kernels as an argument (the
    axis of a reduction, a dtype or a tuple is part of the kernel instead)."""
    return instr.op not in REDUCTIONS and isinstance(value, int | float | bool)
