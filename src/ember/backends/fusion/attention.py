"""The attention fuser: scaled dot-product attention, from its records to one kernel.

Attention reaches the stream as the records of its parts, whoever wrote it (ember's
``MultiHeadAttention``, an imported ONNX or PyTorch model):

1. the **prologue**: the layout steps that make the heads of the query, key and value
   operands (``slice``, ``reshape``, ``permute``) and scalings (``mul_scalar``,
   ``div_scalar``, ``mul`` or ``div`` by a one-element tensor), in any order, each read
   only by the next step (the value's may come anywhere before its product);
2. the **scores** ``float_matmul(q', k')``, then optionally more scalings, a
   ``mask_fill`` (the scores where a bool mask is True set to a value) and an ``add`` of
   a bias (an additive mask), in that order;
3. the **softmax** over the last dim as the five records every softmax in ember is
   (``max_dim``, ``sub``, ``exp``, ``sum_dim``, ``div``);
4. the **context** ``float_matmul(weights, v)``.

This fuser takes such a run of records whole and nothing less (its block is ready only
at the context product). The executor runs it as :func:`numba_attention.attention`,
where the tuner chose that over the records one by one: the scores are never written,
and the heads are read in place. Each operand's layout steps are composed into one
strided view of its source (``views.compose``), so a reshape NumPy would copy (an
imported model's head split of a permuted buffer) copies nothing; where no single view
exists, or a prologue value is read after the segment (the scaled query autodiff keeps),
the prologue's records run first, as they would unfused, and the kernel reads the
products' own operands. The weights are written too where they are read after the
segment (a training step keeps them for the backward pass). Any other inner value read
later (the scores, the exponentials) makes the executor run the records one by one, as
it does for whatever the kernel refuses; the results are then the unfused ops' exactly.

Only float32 values whose operands are 2- to 4-d qualify (see ``numba_attention``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ember.backends.fusion.fuser import Properties, Status, Taking
from ember.backends.fusion.handle import Slot
from ember.backends.fusion.stream import Record
from ember.tensor.dtype import DType

SCALINGS = ("float_mul_scalar", "float_div_scalar", "float_mul", "float_div")
LAYOUTS = {"float_reshape": "reshape", "float_permute": "permute", "float_slice": "slice"}
SOFTMAX = ("float_max_dim", "float_sub", "float_exp", "float_sum_dim", "float_div")
OPS = frozenset((*SCALINGS, *LAYOUTS, *SOFTMAX, "float_matmul", "float_mask_fill",
                 "float_add"))  # fmt: skip
"""The primitives the fuser takes."""

# The role of each record of a segment, in order.
PROLOGUE, SCORES, SCALE, MASK, BIAS = "prologue", "scores", "scale", "mask", "bias"
MAX, SUB, EXP, SUM, DIV, CONTEXT = "max", "sub", "exp", "sum", "div", "context"
_AFTER = {SCORES: 0, SCALE: 0, MASK: 1, BIAS: 2}  # order of the steps on the scores


@dataclass(frozen=True)
class Operand:
    """A product operand traced back through the prologue: ``source`` (made before the
    segment) through the layout steps of ``chain`` (``("reshape", shape)``,
    ``("permute", axes)`` or ``("slice", ranges)``), times the ``factors`` (numbers, or one-element slots read at
    run time); ``slot`` is the value the product reads."""

    source: Slot
    factors: tuple
    chain: tuple
    slot: Slot


@dataclass(frozen=True)
class Attention:
    """A fused segment (see the module doc).

    ``query`` and ``key`` are the scores product's operands (``key`` as it enters the
    product: ``[..., d, Lk]``), ``value`` the context product's right operand;
    ``factors`` scale the scores after the product; ``mask`` is ``(slot, fill)`` or None,
    ``bias`` a slot or None; ``output`` is the context's slot, ``weights`` the softmax's
    where it is written (read after the segment), else None. ``prologue`` holds the
    prologue's records; ``prologue_kept`` says a prologue value is read after the segment;
    ``inner_read`` says an inner value of the scores or softmax is (the executor then runs
    the records one by one). ``query_scaling`` is ``(record, factor)`` where a prologue value
    is read after the segment and the query's last step scales it by a number: the other
    prologue records run first, and the kernel reads the query before that step and writes
    its scaled value as it packs it (autodiff keeps it for the backward pass).
    """

    query: Operand
    key: Operand
    value: Operand
    factors: tuple
    prologue: tuple[Record, ...]
    mask: tuple | None
    bias: Slot | None
    output: Slot
    weights: Slot | None
    prologue_kept: bool
    inner_read: bool
    query_scaling: tuple | None = None

    def scale(self, composed: bool) -> float:
        """The product of the factors, read now (one-element slots hold values by now): of
        the scores' and, where the operands are ``composed`` from their sources rather
        than read after the prologue ran, of the query's and the key's too (else of the
        query's last scaling, which the kernel applies: ``query_scaling``)."""
        if composed:
            factors = (*self.query.factors, *self.key.factors)
        else:
            factors = () if self.query_scaling is None else (self.query_scaling[1],)
        return product_of((*factors, *self.factors))


def product_of(factors: tuple) -> float:
    """The product of scaling factors: numbers, one-element slots (their values, read now),
    and ``(slot, -1)`` for a division by one."""
    import numpy as np

    total = 1.0
    for factor in factors:
        if type(factor) is float:
            total *= factor
        else:
            slot, power = factor if type(factor) is tuple else (factor, 1)
            total *= float(np.asarray(slot.prim).reshape(-1)[0]) ** power
    return total


@dataclass(frozen=True)
class AttentionTemplate:
    """A segment of an attention fuser (``fuser``: this module's, or the gradient's) without
    slots: which records' outputs are read later. Streams with the same plan key bind it by
    matching their records again (cheap: a dozen or two)."""

    kept: tuple[bool, ...]
    fuser: type

    def bind(self, records: list[Record]):
        fuser = self.fuser(lambda slot: True)
        for record in records:
            fuser.fuse(record)
        if len(fuser) != len(records) or not fuser.properties().ready:
            return None
        return fuser._build(self.kept)


class AttentionFuser(Taking):
    """Takes the records of one scaled dot-product attention (see the module doc).

    Args:
        can_fuse: whether a slot's values reach the kernel (a NumPy-viewable CPU tensor).
    """

    name = "attention"
    ops = OPS

    def __init__(self, can_fuse) -> None:
        self.can_fuse = can_fuse
        self.reset()

    def reset(self) -> None:
        self.records: list[Record] = []
        self.roles: list[str] = []
        self._traced: dict[int, Operand] = {}  # prologue output id -> its operand, so far
        self._operands: tuple[Operand, Operand] | None = None
        self._value_operand: Operand | None = None
        self._factors: list = []
        self._mask: tuple | None = None
        self._bias: Slot | None = None
        self._value: Slot | None = None  # the newest value of the scores chain
        self._step: str | None = None  # the newest role on that chain
        self._max = self._sum = None
        self._template: AttentionTemplate | None = None
        self._status = Status.OPEN

    def properties(self) -> Properties:
        done = bool(self.roles) and self.roles[-1] == CONTEXT
        return Properties(score=len(self.records), ready=done)

    def might_take(self, record: Record) -> bool:
        return not record.multi and record.name in self.ops

    def fuse(self, record: Record) -> None:
        if self._status is Status.CLOSED:
            return
        role = self._role(record) if self._fits(record) else None
        if role is None:
            self._status = Status.CLOSED
            return
        self.records.append(record)
        self.roles.append(role)
        if role != PROLOGUE:
            self._step = role
        if role == CONTEXT:
            self._status = Status.CLOSED  # the block is whole

    # ------------------------------------------------------------------ matching
    def _fits(self, record: Record) -> bool:
        if record.multi or record.name not in self.ops or len(record.outputs) != 1:
            return False
        out = record.outputs[0]
        return out.dtype is DType.F32 and self.can_fuse(out)

    def _role(self, record: Record) -> str | None:
        if self._operands is None:
            if record.name == "float_matmul":
                return self._scores(record)
            return self._prologue(record)
        name, out = record.name, record.outputs[0]
        value = self._value
        if value not in record.inputs and (name in LAYOUTS or name in SCALINGS):
            return self._prologue(record)  # the value operand's steps, wherever they come
        step = self._step
        if step in _AFTER:
            if name == "float_max_dim":
                if not self._last_dim(record, value):
                    return None
                self._max = out
                return MAX
            if out.shape != value.shape:
                return None
            factor = self._scaling(record, value) if step in (SCORES, SCALE) else None
            if factor is not None:
                self._factors.append(factor)
                self._value = out
                return SCALE
            if _AFTER[step] < 1 and name == "float_mask_fill":
                return self._masked(record, value)
            if _AFTER[step] < 2 and name == "float_add":
                return self._biased(record, value)
            return None
        if step == MAX and name == "float_sub" and record.inputs == (value, self._max):
            self._value = out
            return SUB
        if step == SUB and name == "float_exp" and record.inputs == (value,):
            self._value = out
            return EXP
        if step == EXP and name == "float_sum_dim" and self._last_dim(record, value):
            self._sum = out
            return SUM
        if step == SUM and name == "float_div" and record.inputs == (value, self._sum):
            self._value = out
            return DIV
        if step == DIV and name == "float_matmul" and record.inputs[0] is value:
            v = record.inputs[1]
            if len(v.shape) != len(value.shape) or v.shape[-2] != value.shape[-1]:
                return None
            self._value_operand = self._operand(v)
            # Every prologue value is read by a product (the value's steps may come first).
            if self._value_operand is not None and not self._traced:
                return CONTEXT
        return None

    def _prologue(self, record: Record) -> str | None:
        """A layout step or a scaling of a product operand, or None."""
        x = record.inputs[0]
        out = record.outputs[0]
        if x.dtype is not DType.F32 or not self.can_fuse(x):
            return None
        before = self._traced.get(x.id) or Operand(x, (), (), x)
        if x.id not in self._traced and self._made_here(x):
            return None  # a value of this segment other than a prologue output
        if record.name in LAYOUTS:
            step = (LAYOUTS[record.name], tuple(record.args[1]))
            after = Operand(before.source, before.factors, (*before.chain, step), out)
        else:
            factor = self._scaling(record, x)
            if factor is None or out.shape != x.shape:
                return None
            after = Operand(before.source, (*before.factors, factor), before.chain, out)
        self._traced.pop(x.id, None)  # each prologue value feeds exactly one next step
        self._traced[out.id] = after
        return PROLOGUE

    def _operand(self, slot: Slot) -> Operand | None:
        """What a product reads at ``slot``: a prologue value (taken off the traced ones) or
        a value made before the segment; None for another value of the segment."""
        if slot.dtype is not DType.F32 or not self.can_fuse(slot):
            return None
        traced = self._traced.pop(slot.id, None)
        if traced is not None:
            return traced
        return None if self._made_here(slot) else Operand(slot, (), (), slot)

    def _scores(self, record: Record) -> str | None:
        a, b = record.inputs
        rank = len(a.shape)
        if len(b.shape) != rank or not 2 <= rank <= 4 or a.shape[-1] != b.shape[-2]:
            return None
        query, key = self._operand(a), self._operand(b)
        if query is None or key is None:
            return None
        self._operands = (query, key)
        self._value = record.outputs[0]
        return SCORES

    def _scaling(self, record: Record, x: Slot):
        """The factor ``record`` multiplies ``x`` by (a number, a one-element slot, or
        ``(slot, -1)`` dividing by one), or None where it is not such a scaling of ``x``."""
        name = record.name
        if name in ("float_mul_scalar", "float_div_scalar"):
            if record.inputs != (x,) or type(record.args[1]) not in (int, float):
                return None
            number = float(record.args[1])
            if name == "float_mul_scalar":
                return number
            return 1.0 / number if number != 0 and math.isfinite(number) else None
        if name in ("float_mul", "float_div") and len(record.inputs) == 2 and x in record.inputs:
            other = record.inputs[1] if record.inputs[0] is x else record.inputs[0]
            if name == "float_div" and record.inputs[0] is not x:
                return None  # a number divided by x is no scaling of x
            if (other is not x and math.prod(other.shape) == 1 and other.dtype is DType.F32
                    and not self._made_here(other)):  # fmt: skip
                return other if name == "float_mul" else (other, -1)
        return None

    def _masked(self, record: Record, value: Slot) -> str | None:
        tensor, mask = record.inputs
        fill = record.args[2]
        if tensor is not value or mask.dtype is not DType.BOOL or type(fill) not in (int, float):
            return None
        if not _broadcasts(mask.shape, value.shape) or self._made_here(mask):
            return None
        self._mask = (mask, float(fill))
        self._value = record.outputs[0]
        return MASK

    def _biased(self, record: Record, value: Slot) -> str | None:
        if len(record.inputs) != 2 or value not in record.inputs:
            return None
        bias = record.inputs[1] if record.inputs[0] is value else record.inputs[0]
        if bias is value or bias.dtype is not DType.F32 or self._made_here(bias):
            return None
        if not _broadcasts(bias.shape, value.shape):
            return None
        self._bias = bias
        self._value = record.outputs[0]
        return BIAS

    def _last_dim(self, record: Record, value: Slot) -> bool:
        rank = len(value.shape)
        return record.inputs == (value,) and record.args[1] in (rank - 1, -1)

    def _made_here(self, slot: Slot) -> bool:
        for r in self.records:  # noqa: SIM110 - a loop: a generator costs a call a step
            if slot in r.outputs:  # slots compare by identity
                return True
        return False

    # ------------------------------------------------------------------ results
    def finish(self, keep: set[int]) -> Attention:
        kept = tuple(r.outputs[0].id in keep for r in self.records[:-1]) + (True,)
        self._template = AttentionTemplate(kept, AttentionFuser)
        return self._build(kept)

    def _build(self, kept: tuple[bool, ...]) -> Attention:
        query, key = self._operands
        weights = None
        inner_read = False
        for record, role, read in zip(self.records, self.roles, kept[:-1]):
            if role == DIV and read:
                weights = record.outputs[0]
            elif role != PROLOGUE and read:
                inner_read = True
        prologue = tuple(r for r, role in zip(self.records, self.roles) if role == PROLOGUE)
        prologue_kept = any(read for role, read in zip(self.roles, kept) if role == PROLOGUE)
        scaling = None
        if prologue_kept:
            last = next((r for r in prologue if r.outputs[0] is query.slot), None)
            if last is not None and last.name in ("float_mul_scalar", "float_div_scalar"):
                factor = self._scaling(last, last.inputs[0])
                scaling = None if factor is None else (last, factor)
        return Attention(query, key, self._value_operand, tuple(self._factors), prologue,
                         self._mask, self._bias, self.records[-1].outputs[0], weights,
                         prologue_kept, inner_read, scaling)  # fmt: skip

    def template(self, fused: Attention) -> AttentionTemplate:
        """``fused`` (this fuser's :meth:`finish`) without slots."""
        return self._template


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``to`` without growing it."""
    if len(shape) > len(to):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], to[::-1]))


def attention_arrays(fused: Attention, to_numpy, composed: bool) -> tuple | None:
    """``(q, k, v, mask, bias)`` of ``fused`` as the kernel reads them: 4-d NumPy views
    (``k`` keys by rows), None for an absent mask or bias. The operands are the products'
    own values, or with ``composed`` views of their sources through the prologue's layout
    steps. None where a value is not a float32 (or bool mask) NumPy array, or where an
    operand's steps compose to no single view."""
    import numpy as np

    q, kt, v = (operand_array(op, to_numpy, composed) for op in (fused.query, fused.key, fused.value))
    if not composed and fused.query_scaling is not None:  # the query before its last step
        q = to_numpy(fused.query_scaling[0].inputs[0].prim)
        q = q if type(q) is np.ndarray and q.dtype == np.float32 else None
    if q is None or kt is None or v is None:
        return None
    q, k, v = _four(q), _four(kt.swapaxes(-1, -2)), _four(v)  # the key enters as [..., d, Lk]
    mask = bias = None
    if fused.mask is not None:
        mask = to_numpy(fused.mask[0].prim)
        if type(mask) is not np.ndarray or mask.dtype != np.bool_:
            return None
        mask = _four(mask)
    if fused.bias is not None:
        bias = to_numpy(fused.bias.prim)
        if type(bias) is not np.ndarray or bias.dtype != np.float32:
            return None
        bias = _four(bias)
    return q, k, v, mask, bias


def operand_array(op: Operand, to_numpy, composed: bool):
    """The float32 NumPy array a product reads at ``op``: its slot's value, or with
    ``composed`` a view of its source through its layout steps; None where the value is no
    such array or the steps compose to no single view."""
    import numpy as np

    from ember.backends.fusion.views import compose

    array = to_numpy((op.source if composed else op.slot).prim)
    if type(array) is not np.ndarray or array.dtype != np.float32:
        return None
    if composed and op.chain:
        array = compose(array, list(op.chain))
    return array


def run_attention(fused: Attention, arrays: tuple, composed: bool, threads: int, take,
                  order: tuple[int, ...] | None = None) -> list:  # fmt: skip
    """Runs ``fused`` on the numba kernel over ``arrays`` (:func:`attention_arrays`, made
    ``composed`` or not), its outputs from ``take(shape, dtype)`` (the context from
    ``take(shape, dtype, order)``, laid out in that order of dims, where ``order`` is
    given); returns the context and, where they are written, the weights and (read after
    the prologue ran, ``query_scaling``) the scaled query.

    Raises:
        KernelUnsupported: a case the kernel does not take (the caller runs the records).
    """
    import numpy as np

    from ember.backends.fusion import numba_attention

    q, k, v, mask, bias = arrays
    f32 = np.dtype(np.float32)
    out = take(fused.output.shape, f32) if order is None else take(fused.output.shape, f32, order)
    results = [out]
    weights = q_out = None
    if fused.weights is not None:
        results.append(take(fused.weights.shape, f32))
        weights = _four(results[-1])
    scaling = None if composed else fused.query_scaling
    if scaling is not None:
        results.append(take(fused.query.slot.shape, f32))
        q_out = _four(results[-1])
    fill = 0.0 if fused.mask is None else fused.mask[1]
    numba_attention.attention(q, k, v, fused.scale(composed), mask=mask, fill=fill, bias=bias,
                              out=_four(out), weights=weights, threads=threads, q_out=q_out,
                              q_factor=1.0 if scaling is None else scaling[1])  # fmt: skip
    return results


def _four(array):
    """``array`` as 4-d, leading dims of 1 added (a view)."""
    return array.reshape((1,) * (4 - array.ndim) + array.shape)
