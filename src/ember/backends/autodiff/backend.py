"""Autodiff: a backend decorator that gives any backend gradients.

Every op reaches :meth:`Autodiff.call`, the one generic path of the decorator:
it runs the op on the inner backend and, when a differentiable input is
tracked, records a graph node with the op's backward rule (from
``rules/``) and what that rule asked to keep. Composite ops with a rule of
their own (softmax, gelu, ...) run as one inner op; the others decompose into
primitives here, so only primitives need rules.

Ops on untracked tensors record nothing and keep nothing. Int and Bool results
are never tracked.
"""

from __future__ import annotations

import operator
from typing import Any

from ember.backend import rules as _abstract
from ember.backend.base import Backend
from ember.backend.decorator import Decorator
from ember.backend.errors import ArgumentError, UnsupportedError
from ember.backend.ops import OpDef
from ember.backends.autodiff import listener
from ember.backends.autodiff import rules as _rules  # noqa: F401  (registers every rule)
from ember.backends.autodiff.graph import (
    Gradients,
    Node,
    Recompute,
    TrackedTensor,
    backward,
    keyed_backward,
)
from ember.backends.autodiff.partial import Accumulator
from ember.backends.autodiff.rule import RULES, Saved


class Autodiff(Decorator):
    """Wraps ``inner`` so that ``backward()`` works on its tensors.

    Args:
        inner: any backend (NdArray, Torch, ...).

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> device = ember.device("ndarray").autodiff()
        >>> x = Tensor.from_data([1.0, 2.0], device).require_grad()
        >>> grads = (x * x).sum().backward()
        >>> x.grad(grads).tolist()
        [2.0, 4.0]
    """

    prefix = "autodiff"

    def __init__(self, inner: Backend, checkpointing: str | None = None) -> None:
        super().__init__(inner)
        if checkpointing not in (None, "balanced"):
            raise ArgumentError(f"checkpointing must be None or 'balanced', got {checkpointing!r}")
        self.checkpointing = checkpointing
        self._accumulator = Accumulator(inner)
        self._inner_shape, self._inner_dtype = inner.shape, inner.dtype
        self._plans: dict[str, _Plan] = {}  # per primitive name, made on its first call
        self._graph_accumulator: Accumulator | None = None  # create_graph's (adds on self)
        self._recording_gradients = 0  # > 0 inside a create_graph pass (see _record)
        # Plain passes go through inner.replay_keyed where the inner backend may replay them
        # (keyed_backward; the key costs a few microseconds a node).
        self._keyed = type(inner).replay_keyed is not Backend.replay_keyed
        self._ran: dict[tuple, tuple[int, ...]] = {}  # graph key -> the nodes its pass ran

    def _config(self) -> tuple:
        return (*super()._config(), self.checkpointing)

    @classmethod
    def forward_composite(cls, op: OpDef) -> bool:
        return op.name in RULES

    # ------------------------------------------------------------ the generic path
    def call(self, op: OpDef, name: str, args: tuple) -> Any:
        plan = self._plans.get(name)
        if plan is None:
            plan = self._plans[name] = _Plan(op, name, getattr(self.inner, name))
        if not plan.simple:
            return self._call_list_or_device(op, plan, args)
        # Fixed tensor operands, then attributes: the common case, unwrapped in one loop.
        n = plan.n
        prims, parents, tracked = [], [], False
        for t in args[:n]:
            if t is None:
                prims.append(None)
                parents.append(None)
            else:
                prims.append(t.primitive)
                node = t.node
                parents.append(node)
                if node is not None:
                    tracked = True
        attrs = args[n:]
        out = plan.run(*prims, *attrs)
        if not tracked:
            if type(out) is tuple:
                return tuple([TrackedTensor(o) for o in out])
            return TrackedTensor(out)
        if type(out) is not tuple and plan.float_out and self.checkpointing is None:
            # The hot case of every recorded op (a forward op on tracked inputs, each op of a
            # create_graph pass): one Float output, no checkpointing; _record inlined.
            rule = plan.rule
            if rule is not None:
                return TrackedTensor(out, self._node(op, rule, parents, prims, out, attrs))
        return self._wrap_tracked(op, plan, parents, [*prims, *attrs], prims, out, args)

    def _call_list_or_device(self, op: OpDef, plan: _Plan, args: tuple) -> Any:
        """``call`` for ops that take a list of tensors (cat), a device, or return data."""
        inner_args = self.unwrap_args(op, args)
        out = plan.run(*inner_args)
        if op.name == "into_data":
            return out
        parents = [None if t is None else t.node for t in self.operands(op, args)]
        if parents.count(None) == len(parents):
            if type(out) is tuple:
                return tuple([TrackedTensor(o) for o in out])
            return TrackedTensor(out)
        inputs = self.operands(op, inner_args)
        return self._wrap_tracked(op, plan, parents, inner_args, inputs, out, args)

    def _wrap_tracked(self, op: OpDef, plan: _Plan, parents: list, inner_args: list, inputs: list,
                      out: Any, args: tuple) -> Any:  # fmt: skip
        """The outputs of an op with a tracked input; a Float (first) output gets a node."""
        if type(out) is tuple:
            first = out[0]
            node = None
            if self._inner_dtype(first).is_float:
                node = self._record(op, plan, parents, inner_args, inputs, out, args)
            return (TrackedTensor(first, node), *(TrackedTensor(o) for o in out[1:]))
        node = None
        if self._inner_dtype(out).is_float:
            node = self._record(op, plan, parents, inner_args, inputs, out, args)
        return TrackedTensor(out, node)

    def _node(self, op: OpDef, rule: Any, parents: list, inputs: list | tuple, out: Any,
              attrs: tuple) -> Node:  # fmt: skip
        """The node of an op's output, keeping what ``rule`` asks for (no checkpointing)."""
        shape, dtype = self._inner_shape, self._inner_dtype
        saved = Saved(
            tuple(inputs) if rule.keep_inputs else None,
            out if rule.keep_output else None,
            attrs,
            tuple([None if x is None else shape(x) for x in inputs]),
            tuple([None if x is None else dtype(x) for x in inputs]),
            tuple([p is not None for p in parents]),
        )
        return Node(op.name, tuple(parents), rule.fn, saved)

    def _record(self, op: OpDef, plan: _Plan, parents: list, inner_args: list, inputs: list,
                out: Any, args: tuple) -> Node:  # fmt: skip
        rule = plan.rule or RULES.get(op.name)  # a rule registered after the op's first call
        if rule is None:
            if not self._recording_gradients:
                raise UnsupportedError(f"autodiff: op {op.name!r} has no backward rule yet")
            # A backward rule's own op without a rule: first order only. Its node raises
            # if (only if) a later pass differentiates through it.
            return Node(op.name, tuple(parents), _first_order_only(op.name), None)
        attrs = tuple(inner_args[plan.n :])
        if self.checkpointing is None:
            return self._node(op, rule, parents, inputs, out, attrs)
        shape, dtype = self._inner_shape, self._inner_dtype
        shapes = tuple([None if x is None else shape(x) for x in inputs])
        dtypes = tuple([None if x is None else dtype(x) for x in inputs])
        needs = tuple([p is not None for p in parents])

        # Balanced checkpointing: every node keeps a recipe instead of tensors; compute-bound
        # ops (matmul, convolutions, pooling) also keep their output, so recomputation in the
        # backward pass never repeats them and stops at them.
        def make_saved(kept_inputs, output):
            flat = None if kept_inputs is None else tuple(self.operands(op, kept_inputs))
            return Saved(flat, output, attrs, shapes, dtypes, needs)

        recipe = Recompute(
            plan.run, _refs(op, args, inner_args), plan.n,
            make_saved, rule.keep_inputs, rule.keep_output,
        )  # fmt: skip
        keep = out if op.group in _COMPUTE_BOUND else None
        return Node(op.name, tuple(parents), rule.fn, recipe, keep)

    # ------------------------------------------------------------ tracked tensors
    def wrap(self, inner_prim: Any) -> TrackedTensor:
        return TrackedTensor(inner_prim)

    # A C-level getter: unwrapping runs for every operand of every op.
    unwrap = staticmethod(operator.attrgetter("primitive"))

    def set_require_grad(self, x: TrackedTensor, flag: bool) -> TrackedTensor:
        if not flag:
            return TrackedTensor(x.primitive)
        if not self.inner.dtype(x.primitive).is_float:
            from ember.backend.errors import KindError

            raise KindError("require_grad: only Float tensors can have gradients")
        return TrackedTensor(x.primitive, Node("leaf", (), None, None, x.primitive))

    def is_require_grad(self, x: TrackedTensor) -> bool:
        return x.node is not None

    def detach(self, x: TrackedTensor) -> TrackedTensor:
        return TrackedTensor(x.primitive)

    def backward(self, x: TrackedTensor, create_graph: bool = False,
                 inputs: tuple[TrackedTensor, ...] = ()) -> Gradients:  # fmt: skip
        """The gradients of ``x`` (summed) w.r.t. every tracked leaf it depends on, or only
        w.r.t. ``inputs`` (tracked tensors of its graph, leaves or not) when given: inner
        primitives, or with ``create_graph`` tracked tensors of this backend whose graph
        (the backward rules' ops, recorded) a later ``backward`` differentiates again."""
        if x.node is None:
            raise UnsupportedError(
                "backward: the tensor does not depend on any tensor that requires gradients "
                "(call require_grad() on the inputs first)"
            )
        inner, prim = self.inner, x.primitive
        seed = inner.float_ones(inner.shape(prim), inner.device_of(prim), inner.dtype(prim))
        targets = frozenset(t.node.id for t in inputs if t.node is not None) if inputs else None
        if not create_graph:
            # A gradient listener (data-parallel sync) hears full passes only: the gradients
            # of a restricted or create_graph pass (a penalty's, an inner step's) are not
            # the parameters' gradients of the step.
            hear = listener.current() if targets is None else None
            if hear is None and self.checkpointing is None and self._keyed:
                return keyed_backward(x.node, seed, inner, self._accumulator, targets, self._ran)
            return backward(x.node, seed, inner, self._accumulator, hear, targets=targets)
        if self._graph_accumulator is None:
            self._graph_accumulator = Accumulator(self)
        self._recording_gradients += 1
        try:
            grads = backward(x.node, TrackedTensor(seed), self, self._graph_accumulator, None,
                             _lifted, targets)  # fmt: skip
        finally:
            self._recording_gradients -= 1
        grads.tracked = True
        return grads

    def grad(self, x: TrackedTensor, grads: Gradients) -> Any:
        return grads.get(x.node)

    def grad_remove(self, x: TrackedTensor, grads: Gradients) -> Any:
        return grads.remove(x.node)

    def grad_replace(self, x: TrackedTensor, grads: Gradients, grad: Any) -> None:
        if x.node is None:
            raise UnsupportedError("grad_replace: the tensor is not tracked (call require_grad() first)")
        grads.replace(x.node, grad)

    def inner_primitive(self, x: TrackedTensor) -> Any:
        return x.primitive

    def from_inner(self, prim: Any) -> TrackedTensor:
        return TrackedTensor(prim)


_COMPUTE_BOUND = frozenset({"matmul", "module"})


class FirstOrderOnlyError(UnsupportedError):
    """A gradient of a gradient went through an op whose backward has no rule of its own."""


def _first_order_only(name: str):
    def rule(_backend, _grad, _saved):
        raise FirstOrderOnlyError(
            f"backward: the op {name!r} (run by a backward rule) has no backward rule: "
            f"gradients through it are first order only"
        )

    return rule


def _lifted(node: Node, saved: Saved) -> Saved:
    """``saved`` (inner primitives) as tracked tensors: each input with its parent's node,
    the output with ``node``, so that ops on them record a graph back into the forward's."""
    inputs = saved.inputs
    if inputs is not None:
        inputs = tuple([None if p is None else TrackedTensor(p, parent)
                        for p, parent in zip(inputs, node.parents)])  # fmt: skip
    output = saved.output
    if output is not None:
        if type(output) is tuple:
            output = (TrackedTensor(output[0], node), *(TrackedTensor(o) for o in output[1:]))
        else:
            output = TrackedTensor(output, node)
    return Saved(inputs, output, saved.attrs, saved.shapes, saved.dtypes, saved.needs)


class _Plan:
    """What ``call`` needs of one primitive, looked up once: the inner backend's bound
    method, the number of tensor operands, whether the plain path applies (fixed tensor
    operands, no device attribute, tensor outputs) and the op's backward rule."""

    __slots__ = ("float_out", "n", "rule", "run", "simple")

    def __init__(self, op: OpDef, name: str, run: Any) -> None:
        self.run = run
        self.n = len(op.inputs)
        self.simple = (
            "*tensors" not in op.inputs and "device" not in op.attrs and op.name != "into_data"
        )
        self.rule = RULES.get(op.name)
        # Whether the output is Float whenever the op runs (no need to ask its dtype): a Float
        # primitive whose abstract rule keeps its input's dtype.
        self.float_out = (name.startswith("float_") or not op.prefixed) and op.rule in _KEEPS_DTYPE


# The abstract rules (ember.backend.rules) whose output has the dtype of the first input.
_KEEPS_DTYPE = frozenset({
    _abstract.same, _abstract.binary, _abstract.clamp, _abstract.reduce_all, _abstract.reduce_dim,
    _abstract.reshape, _abstract.permute, _abstract.expand, _abstract.flip, _abstract.slice_,
    _abstract.slice_assign, _abstract.matmul, _abstract.mask_where, _abstract.mask_fill,
    _abstract.conv, _abstract.conv_transpose, _abstract.conv_x_backward,
    _abstract.conv_weight_backward, _abstract.activation_backward, _abstract.dim_op,
})  # fmt: skip


def _refs(op: OpDef, args: tuple, inner_args: list) -> list:
    """The call arguments with each tracked input replaced by its node (kept untracked ones as is)."""
    refs = list(inner_args)
    for i, role in enumerate(op.inputs[: len(args)]):
        if role == "*tensors":
            refs[i] = [t.node if t.node is not None else t.primitive for t in args[i]]
        elif args[i] is not None and args[i].node is not None:
            refs[i] = args[i].node
    return refs
