"""The attention gradient fuser: the backward pass of scaled dot-product attention as one kernel.

Autodiff writes the gradient of ``softmax(q' k'ᵀ) v`` (``attention.py``'s segment) as the
backward rules of its parts. Given the output's gradient ``dO`` and the saved weights
``P``, the records are, in autodiff's order:

1. ``dP = dO @ vᵀ`` and ``dV = Pᵀ @ dO`` (either first; ``vᵀ``, ``Pᵀ`` are ``permute`` views);
2. the softmax's gradient ``dS = dP * P - P * sum(dP * P)`` (``mul``, ``sum_dim``, ``mul``,
   ``sub``), then optionally the mask's (``mask_fill(dS, mask, 0)``) and the scalings'
   (``mul_scalar`` and the like) gradients;
3. ``dQ' = dS @ k'`` and ``dK'ᵀ = q'ᵀ @ dS`` (either first),

with the layout steps that make each operand (``permute``, ``reshape``, ``slice``: the
prologue, as in ``attention.py``) anywhere among them, and layout steps and scalings of the
three gradients after them (the epilogue: the head merges, the scaling of ``dQ'``). This
fuser takes such a run whole; the executor runs it as
:func:`numba_attention.attention_backward`, which holds each batch entry's ``dP`` and
``dS`` in cache instead of writing them, where the tuner chose that over the records,
and then runs the epilogue's records as they are. A value of steps 1-2 read after the
segment, or a case the kernel refuses, runs the records one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.backends.fusion.attention import (
    LAYOUTS,
    MASK,
    PROLOGUE,
    SCALE,
    SCALINGS,
    AttentionFuser,
    AttentionTemplate,
    Operand,
    operand_array,
    product_of,
)
from ember.backends.fusion.fuser import Properties, Status
from ember.backends.fusion.handle import Slot
from ember.backends.fusion.stream import Record
from ember.backends.fusion.views import last_two_swapped
from ember.tensor.dtype import DType

OPS = frozenset((*SCALINGS, *LAYOUTS, "float_matmul", "float_mul", "float_sum_dim", "float_sub",
                 "float_mask_fill"))  # fmt: skip
"""The primitives the fuser takes."""

# Roles beside the forward fuser's PROLOGUE, MASK and SCALE.
PRODUCT, T, S, W, DS, EPILOGUE = "product", "t", "s", "w", "ds", "epilogue"
MAX_RECORDS = 48
"""Records of one segment, at most (the pattern has about 20)."""


@dataclass(frozen=True)
class AttentionGrad:
    """A fused segment (see the module doc): the operands ``d_out``, ``value`` (as ``dP``'s
    product reads it: ``vᵀ``), ``weights``, ``query`` (``dK'ᵀ``'s: ``q'ᵀ``) and ``key``
    (``dQ'``'s: ``k'``); the scores gradient's ``factors`` and ``mask`` slot; the three
    gradients' slots ``d_query``, ``d_key`` (``dK'ᵀ``) and ``d_value``; the ``prologue``
    and ``epilogue`` records; ``prologue_kept`` says a prologue value is read after the
    segment, ``inner_read`` that a value of steps 1-2 is."""

    d_out: Operand
    value: Operand
    weights: Slot
    query: Operand
    key: Operand
    factors: tuple
    mask: Slot | None
    d_query: Slot
    d_key: Slot
    d_value: Slot
    prologue: tuple[Record, ...]
    epilogue: tuple[Record, ...]
    prologue_kept: bool
    inner_read: bool
    d_query_factors: tuple = ()
    """The factors of the epilogue's scaling of ``dQ'`` (the query's scaling's gradient),
    taken into the kernel's store: ``d_query`` is then that scaling's output."""

    def scale(self) -> float:
        return product_of(self.factors)


_GRADIENT_ROLES = frozenset(("dp", "dv", "dq", "dk"))
"""The roles of the four products a whole attention gradient has: dP, dV, dQ', dK'ᵀ."""


class AttentionGradFuser(AttentionFuser):
    """Takes the records of one attention's backward pass (see the module doc); shares the
    forward fuser's tracing of operands through their layout steps.

    Args:
        can_fuse: whether a slot's values reach the kernel (a NumPy-viewable CPU tensor).
    """

    name = "attention-grad"
    ops = OPS

    def reset(self) -> None:
        super().reset()
        self._products: list[tuple[Record, Operand, Operand]] = []  # before dS is known
        self._found: dict[str, Record] = {}
        self._weights: Slot | None = None
        self._d_out: Operand | None = None
        self._outputs: set[int] = set()  # ids of the gradients and their epilogue values
        self._read: set[int] = set()  # ids of the slots the products read
        self._query = self._key = None

    def properties(self) -> Properties:
        ready = self._complete() and not self._traced_left()
        return Properties(score=len(self.records), ready=ready)

    def fuse(self, record: Record) -> None:
        if self._status is Status.CLOSED:
            return
        role = None
        if len(self.records) < MAX_RECORDS and self._fits(record):
            role = self._grad_role(record)
        if role is None:
            self._status = Status.CLOSED
            return
        self.records.append(record)
        self.roles.append(role)

    def _complete(self) -> bool:
        return self._found.keys() >= _GRADIENT_ROLES  # asked for each record offered

    def _traced_left(self) -> bool:
        """Whether a prologue value no product reads is left (the pattern is not whole)."""
        return any(op.slot.id not in self._read for op in self._traced.values())

    def _peek(self, slot: Slot) -> Operand | None:
        """What a product reads at ``slot`` (a prologue value or one made before the
        segment), left traced: ``dO`` and ``P`` are read twice."""
        if slot.dtype is not DType.F32 or not self.can_fuse(slot):
            return None
        self._read.add(slot.id)
        traced = self._traced.get(slot.id)
        if traced is not None:
            return traced
        return None if self._made_here(slot) else Operand(slot, (), (), slot)

    # ------------------------------------------------------------------ matching
    def _grad_role(self, record: Record) -> str | None:
        name, out = record.name, record.outputs[0]
        if self._value is not None and self._value in record.inputs and name != "float_matmul":
            return self._on_scores_grad(record)
        if any(s.id in self._outputs for s in record.inputs) or self._complete():
            x = record.inputs[0]
            steps = name in LAYOUTS or (name in SCALINGS and self._scaling(record, x) is not None)
            if steps and x.id in self._outputs:  # a layout step or scaling of a gradient
                self._outputs.add(out.id)
                return EPILOGUE
            return None
        if name == "float_matmul":
            return self._product(record)
        if name == "float_mul" and "t" not in self._found and self._products:
            return self._t(record)
        if "t" in self._found and "ds" not in self._found:
            return self._softmax_grad(record)
        if name in LAYOUTS or (name in SCALINGS and "ds" not in self._found):
            return self._prologue(record)
        return None

    def _product(self, record: Record) -> str | None:
        a, b = record.inputs
        rank = len(a.shape)
        if len(b.shape) != rank or not 2 <= rank <= 4 or a.shape[:-2] != b.shape[:-2]:
            return None
        if self._value is not None:  # dS is known: dQ' = dS @ k', dK'ᵀ = q'ᵀ @ dS, or dV
            if a is self._value and "dq" not in self._found:
                key = self._peek(b)
                if key is None:
                    return None
                self._found["dq"], self._key = record, key
            elif b is self._value and "dk" not in self._found:
                query = self._peek(a)
                if query is None:
                    return None
                self._found["dk"], self._query = record, query
            else:
                return self._value_grad(record, a, b)
            self._outputs.add(out_id(record))
            return PRODUCT
        if len(self._products) == 2:
            return None
        lhs, rhs = self._peek(a), self._peek(b)
        if lhs is None or rhs is None:
            return None
        self._products.append((record, lhs, rhs))
        return PRODUCT

    def _value_grad(self, record: Record, a: Slot, b: Slot) -> str | None:
        """``dV = Pᵀ @ dO`` after ``dS`` (autodiff may write it there)."""
        if "dv" in self._found:
            return None
        lhs, rhs = self._peek(a), self._peek(b)
        if lhs is None or rhs is None or not self._is_value_grad(lhs, rhs):
            return None
        self._found["dv"] = record
        self._products.append((record, lhs, rhs))
        self._outputs.add(out_id(record))
        return PRODUCT

    def _is_value_grad(self, lhs: Operand, rhs: Operand) -> bool:
        d_out = self._d_out
        swapped = lhs.chain and lhs.chain[-1][0] == "permute" and _swaps(lhs.chain[-1][1])
        return (swapped and lhs.source is self._weights and len(lhs.chain) == 1 and not lhs.factors
                and d_out is not None and rhs.slot is d_out.slot)  # fmt: skip

    def _t(self, record: Record) -> str | None:
        """``t = dP * P``: picks ``dP``'s product among those seen and ``dV``'s if seen."""
        x, y = record.inputs
        for dp, weights in ((x, y), (y, x)):
            found = [p for p in self._products if p[0].outputs[0] is dp]
            if not found or self._made_here(weights) or weights.shape != dp.shape:
                continue
            product, d_out, _ = found[0]
            self._found["dp"], self._weights, self._d_out = product, weights, d_out
            self._found["t"] = record
            others = [p for p in self._products if p[0] is not product]
            if others:
                other, lhs, rhs = others[0]
                if not self._is_value_grad(lhs, rhs):
                    return None
                self._found["dv"] = other
                self._outputs.add(out_id(other))
            return T
        return None

    def _softmax_grad(self, record: Record) -> str | None:
        t, weights = self._found["t"].outputs[0], self._weights
        name, ins = record.name, record.inputs
        if "s" not in self._found:
            if name == "float_sum_dim" and ins == (t,) and record.args[1] in (len(t.shape) - 1, -1):
                self._found["s"] = record
                return S
            return None
        s = self._found["s"].outputs[0]
        if "w" not in self._found:
            if name == "float_mul" and set(map(id, ins)) == {id(weights), id(s)}:
                self._found["w"] = record
                return W
            return None
        if name == "float_sub" and ins == (t, self._found["w"].outputs[0]):
            self._found["ds"] = record
            self._value = record.outputs[0]
            return DS
        return None

    def _on_scores_grad(self, record: Record) -> str | None:
        """A step on ``dS`` before its products: the mask's gradient, then scalings."""
        value, out = self._value, record.outputs[0]
        if record.name == "float_mask_fill" and self.roles[-1] == DS:
            mask, fill = record.inputs[1], record.args[2]
            if (record.inputs[0] is not value or mask.dtype is not DType.BOOL or fill != 0
                    or self._made_here(mask)):  # fmt: skip
                return None
            self._mask = mask
            self._value = out
            return MASK
        factor = self._scaling(record, value)
        if factor is None or out.shape != value.shape or "dq" in self._found or "dk" in self._found:
            return None
        self._factors.append(factor)
        self._value = out
        return SCALE

    # ------------------------------------------------------------------ results
    def finish(self, keep: set[int]) -> AttentionGrad:
        kept = tuple(r.outputs[0].id in keep for r in self.records)
        self._template = AttentionTemplate(kept, AttentionGradFuser)
        return self._build(kept)

    def _build(self, kept: tuple[bool, ...]) -> AttentionGrad:
        inner = (T, S, W, DS, MASK, SCALE)
        inner_read = any(read for role, read in zip(self.roles, kept) if role in inner)
        dp = self._found["dp"]
        inner_read = inner_read or any(read for r, read in zip(self.records, kept) if r is dp)
        prologue = tuple(r for r, role in zip(self.records, self.roles) if role == PROLOGUE)
        prologue_kept = any(read for role, read in zip(self.roles, kept) if role == PROLOGUE)
        epilogue = tuple(r for r, role in zip(self.records, self.roles) if role == EPILOGUE)
        value = next(rhs for p, _, rhs in self._products if p is dp)
        d_query, epilogue, q_factors = self._scaled_query_grad(kept, epilogue)
        return AttentionGrad(self._d_out, value, self._weights, self._query, self._key,
                             tuple(self._factors), self._mask, d_query,
                             self._found["dk"].outputs[0], self._found["dv"].outputs[0],
                             prologue, epilogue, prologue_kept, inner_read, q_factors)  # fmt: skip

    def _scaled_query_grad(self, kept: tuple[bool, ...], epilogue: tuple[Record, ...]) -> tuple:
        """``(d_query, epilogue, factors)``: where the epilogue's one reader of ``dQ'`` scales
        it (a query scaled before its product has its gradient scaled after) and nothing
        else reads ``dQ'``, the kernel stores the scaled gradient (``dQ'``'s float32 sums
        times the factor, as the scaling rounds them), and the scaling leaves the epilogue."""
        product = self._found["dq"]
        d_query = product.outputs[0]
        readers = [r for r in epilogue if d_query in r.inputs]
        if len(readers) != 1 or kept[self.records.index(product)]:
            return d_query, epilogue, ()
        scaling = readers[0]
        factor = self._scaling(scaling, d_query) if scaling.name in SCALINGS else None
        if factor is None or scaling.outputs[0].shape != d_query.shape:
            return d_query, epilogue, ()
        rest = tuple(r for r in epilogue if r is not scaling)
        return scaling.outputs[0], rest, (factor,)

    def template(self, fused: AttentionGrad) -> AttentionTemplate:
        return self._template


def out_id(record: Record) -> int:
    return record.outputs[0].id


def _swaps(axes: tuple[int, ...]) -> bool:
    return tuple(axes) == last_two_swapped(len(axes))


def grad_arrays(fused: AttentionGrad, to_numpy, composed: bool) -> tuple | None:
    """``(q, k, v, weights, d_out, mask)`` of ``fused`` as the backward kernel reads them
    (4-d views; ``k`` and ``v`` keys by rows), or None (see ``attention_arrays``)."""
    import numpy as np

    from ember.backends.fusion.attention import _four

    qt, k, vt, d_out = (operand_array(op, to_numpy, composed)
                        for op in (fused.query, fused.key, fused.value, fused.d_out))  # fmt: skip
    weights = to_numpy(fused.weights.prim)
    if any(a is None for a in (qt, k, vt, d_out)) or type(weights) is not np.ndarray:
        return None
    if weights.dtype != np.float32:
        return None
    q, v = qt.swapaxes(-1, -2), vt.swapaxes(-1, -2)
    mask = None
    if fused.mask is not None:
        mask = to_numpy(fused.mask.prim)
        if type(mask) is not np.ndarray or mask.dtype != np.bool_:
            return None
        mask = _four(mask)
    return _four(q), _four(k), _four(v), _four(weights), _four(d_out), mask


def run_attention_grad(fused: AttentionGrad, arrays: tuple, threads: int, take,
                       layouts: list | None = None) -> list:  # fmt: skip
    """Runs ``fused`` on the backward kernel; returns ``[dQ', dK'ᵀ, dV]`` as the segment's
    slots hold them, from ``take(shape, dtype, order)``, each laid out in the order of
    ``layouts`` where it names one (``dK'ᵀ`` otherwise a transposed view of keys-by-rows
    memory).

    Raises:
        KernelUnsupported: a case the kernel does not take (the caller runs the records).
    """
    import numpy as np

    from ember.backends.fusion import numba_attention
    from ember.backends.fusion.attention import _four

    q, k, v, weights, d_out, mask = arrays
    f32 = np.dtype(np.float32)
    swap = last_two_swapped(len(fused.d_key.shape))
    orders = layouts or [None, None, None]
    d_q = take(fused.d_query.shape, f32, orders[0])
    d_kt = take(fused.d_key.shape, f32, orders[1] or swap)
    d_v = take(fused.d_value.shape, f32, orders[2])
    numba_attention.attention_backward(
        q, k, v, weights, d_out, factor=fused.scale(), mask=mask, d_q=_four(d_q),
        d_k=_four(d_kt.swapaxes(-1, -2)), d_v=_four(d_v), threads=threads,
        q_factor=product_of(fused.d_query_factors))  # fmt: skip
    return [d_q, d_kt, d_v]
