"""The autodiff graph: tracked tensors, nodes, the backward pass and the Gradients container.

A tracked tensor holds the inner backend's primitive and a :class:`Node`. A
node knows its parents (the nodes of the op's differentiable inputs), the
backward rule of the op that made it and what that rule saved. Ops on
untracked tensors make no node and save nothing.

Nodes get increasing ids as they are created, so a child always has a larger
id than its parents: the backward pass visits the nodes reachable from the
root in decreasing id order, and each node's gradient is complete when it is
visited. A node's saved state is dropped as soon as its rule has run.

Gradients are summed per node as they arrive. A rule may return a
:class:`~ember.backends.autodiff.partial.Partial` gradient (a slice's: a piece
of its input's gradient); the node keeps such pieces and the
:class:`~ember.backends.autodiff.partial.Accumulator` assembles them once, when
the node is visited.

A plain pass (no listener, no checkpointing, no ``create_graph``) goes through
:func:`keyed_backward`: keyed by the graph's structure, a backend that records its ops
(Fusion) may push an earlier pass's ops for the same structure instead of running the
rules' Python again.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from ember.backend.errors import EmberError
from ember.backends.autodiff.listener import GradientListener
from ember.backends.autodiff.partial import INCOMPLETE, Accumulator
from ember.backends.autodiff.rule import Saved

_ids = itertools.count()  # thread-safe under the GIL; ids only need to increase


class GraphFreedError(EmberError, RuntimeError):
    """backward() reached a node whose saved state an earlier backward() already freed."""


class Node:
    """One recorded op (or a leaf, when ``backward`` is None).

    Args:
        parents: one entry per tensor input of the op: its node, or None when that input is
            untracked or not differentiable.
        backward: the op's rule, ``backward(inner, grad, saved) -> tuple`` of one gradient (or
            None) per input.
        saved: what ``backward`` needs, captured at forward time.
    """

    __slots__ = ("backward", "freed", "id", "op", "parents", "saved", "value")

    def __init__(self, op: str, parents: tuple[Node | None, ...], backward: Callable | None, saved: Any,
                 value: Any = None):  # fmt: skip
        self.id = next(_ids)
        self.op = op
        self.parents = parents
        self.backward = backward
        self.saved = saved  # what the rule needs, or a Recompute recipe under checkpointing
        self.value = value  # the output, kept only by checkpoints (and leaves)
        self.freed = False

    @property
    def is_leaf(self) -> bool:
        return self.backward is None

    def __repr__(self) -> str:
        return f"Node({self.op}, id={self.id})"


class TrackedTensor:
    """The Autodiff backend's primitive: an inner primitive and, if tracked, its node."""

    __slots__ = ("node", "primitive")

    def __init__(self, primitive: Any, node: Node | None = None) -> None:
        self.primitive = primitive
        self.node = node

    def __repr__(self) -> str:
        return f"TrackedTensor({self.node!r})"


class Gradients:
    """The gradients of one backward pass, keyed by leaf node; values are inner primitives.

    Read one with ``tensor.grad(grads)``; parameters are never mutated.
    """

    __slots__ = ("_grads", "tracked")

    def __init__(self) -> None:
        self._grads: dict[int, Any] = {}
        self.tracked = False  # create_graph: the values are tracked tensors of the backend

    def get(self, node: Node | None) -> Any:
        return None if node is None else self._grads.get(node.id)

    def remove(self, node: Node | None) -> Any:
        return None if node is None else self._grads.pop(node.id, None)

    def replace(self, node: Node, grad: Any) -> None:
        self._grads[node.id] = grad

    def __len__(self) -> int:
        return len(self._grads)

    def __contains__(self, node: Node) -> bool:
        return node.id in self._grads

    def __repr__(self) -> str:
        return f"Gradients({len(self._grads)} tensors)"


def backward(root: Node, seed: Any, inner: Any, accumulator: Accumulator,
             listener: GradientListener | None = None,
             lift: Callable[[Node, Any], Any] | None = None,
             targets: frozenset[int] | None = None,
             order: list[Node] | None = None) -> Gradients:  # fmt: skip
    """Runs every backward rule reachable from ``root`` once, in reverse creation order.

    Args:
        root: the node of the tensor ``backward()`` was called on.
        seed: the gradient of the root (ones of its shape).
        inner: the backend the rules run on.
        accumulator: adds the gradients of one node (with the inner backend's ops).
        listener: hears each leaf's gradient when it is complete, and the end of the pass
            (``listener.py``).
        lift: with ``create_graph``: ``lift(node, saved)`` gives the saved state as tracked
            tensors (each input with its parent's node), so that the rules, run on the
            autodiff backend itself (``inner``), record the graph of the gradients; the
            saved state is then kept (a later backward pass goes through these nodes
            again).
        targets: ids of the nodes (leaves or not) whose gradients are wanted; None: every
            leaf's. Only the nodes on a path to a target run, and their rules are told
            which inputs need a gradient (``Saved.needs``).
        order: the nodes reachable from ``root`` in decreasing id order, where the caller
            has them.
    """
    if order is None:
        order = _reachable(root)
    useful = None if targets is None else _leading_to(order, targets)
    recomputed: dict[int, Any] = {}  # outputs recomputed for checkpointing, during this pass only
    pending: dict[int, Any] = {root.id: seed}
    grads = Gradients()
    merge, resolve = accumulator.merge, accumulator.resolve
    for node in order:
        grad = pending.pop(node.id, None)
        if grad is None:
            recomputed.pop(node.id, None)
            continue
        if type(grad) in INCOMPLETE:
            grad = resolve(grad)
        if node.is_leaf:
            if targets is None or node.id in targets:
                grads.replace(node, grad)
                if listener is not None:
                    listener.on_gradient(node, grad)
            continue
        if targets is not None and node.id in targets:
            grads.replace(node, grad)
        if node.freed:
            raise GraphFreedError(
                f"backward() reached the {node.op!r} node whose saved state was freed by an earlier "
                "backward(); run the forward pass again to get a new graph"
            )
        saved = node.saved
        if isinstance(saved, Recompute):
            saved = saved.restore(node, recomputed)
        # Every consumer of this node's output has a larger id and ran already.
        recomputed.pop(node.id, None)
        if useful is not None and saved is not None:
            needs = tuple([p is not None and p.id in useful for p in node.parents])
            if needs != saved.needs:
                saved = saved.with_needs(needs)
        if lift is not None:
            input_grads = node.backward(inner, grad, lift(node, saved))
        else:
            input_grads = node.backward(inner, grad, saved)
            node.saved, node.freed = None, True  # nothing later needs it
        for parent, g in zip(node.parents, input_grads):
            if parent is None or g is None or (useful is not None and parent.id not in useful):
                continue
            previous = pending.get(parent.id)
            pending[parent.id] = g if previous is None else merge(previous, g)
    if listener is not None:
        listener.on_finish(grads)
    return grads


def keyed_backward(root: Node, seed: Any, inner: Any, accumulator: Accumulator,
                   targets: frozenset[int] | None, ran: dict) -> Gradients:  # fmt: skip
    """:func:`backward` (no listener, no ``lift``) as one call of ``inner.replay_keyed``,
    keyed by the graph's structure: a backend that records its ops (Fusion) then pushes
    an earlier step's ops for the same graph instead of running the rules' Python again.

    The key holds, per node in visiting order, its rule, its parents' positions, what it
    saved (the tensors as the call's inputs, the rest as values) and whether its
    gradient is wanted. ``ran`` maps a key to the positions of the nodes a plain pass of it
    ran (learned when it runs plainly), which a replayed pass frees as the plain one does.
    """
    order = _reachable(root)
    structure = _structure(order, targets)
    if structure is None:
        return backward(root, seed, inner, accumulator, targets=targets, order=order)
    key, inputs, wanted = structure
    inputs.append(seed)
    plain: list[Gradients] = []

    def run(_inputs: list) -> list:
        # The inputs are the nodes' own saved primitives (and the seed): the rules read them
        # from the nodes.
        grads = backward(root, seed, inner, accumulator, targets=targets, order=order)
        plain.append(grads)
        ran[key] = tuple([i for i, node in enumerate(order) if node.freed])
        while len(ran) > MAX_RAN:
            ran.pop(next(iter(ran), None), None)  # another thread may have taken it
        return [grads.get(order[i]) for i in wanted]

    outputs = inner.replay_keyed(key, inputs, run)
    if plain:
        return plain[-1]
    freed = ran.pop(key, None)
    if freed is not None:
        ran[key] = freed  # the most recently used last
    for i in range(len(order)) if freed is None else freed:
        node = order[i]
        if not node.is_leaf:
            node.saved, node.freed = None, True
    grads = Gradients()
    for i, grad in zip(wanted, outputs):
        if grad is not None:
            grads.replace(order[i], grad)
    return grads


MAX_RAN = 64
"""Keys whose freed positions :func:`keyed_backward` keeps (more than a fusion backend keeps
traces for: ``keyed.MAX_KEYS``)."""


def _structure(order: list[Node], targets: frozenset[int] | None) -> tuple | None:
    """The key of a pass over ``order``, the saved primitives in key order, and the positions
    of the nodes whose gradients the pass returns; None where a node was freed or saved
    something else than a :class:`Saved` (checkpointing's recipes)."""
    position = {node.id: i for i, node in enumerate(order)}
    parts: list = []
    inputs: list = []
    wanted: list[int] = []
    for i, node in enumerate(order):
        parents = tuple([-1 if p is None else position[p.id] for p in node.parents])
        if targets is not None and node.id in targets:
            wanted.append(i)
        if node.backward is None:
            parts.append(parents)
            if targets is None:
                wanted.append(i)
            continue
        saved = node.saved
        if node.freed or (saved is not None and type(saved) is not Saved):
            return None
        if saved is None:
            parts.append((node.backward, parents))
            continue
        kept = saved.inputs
        if kept is not None:
            kept = tuple([x is not None for x in kept])
            inputs.extend([x for x in saved.inputs if x is not None])
        output = saved.output
        if output is not None:
            if type(output) is tuple:
                inputs.extend(output)
                output = len(output)
            else:
                inputs.append(output)
                output = -1
        parts.append((node.backward, parents, kept, output, _typed(saved.attrs), saved.shapes,
                      saved.dtypes, saved.needs))  # fmt: skip
    if targets is not None:
        parts.append(tuple(wanted))
    return tuple(parts), inputs, wanted


def _typed(values: tuple) -> tuple:
    """``values`` as a key that tells ``1``, ``1.0`` and ``True`` apart, and ``0.0`` from
    ``-0.0`` (equal in Python, not to the ops that take them)."""
    out = []
    for v in values:
        kind = type(v)
        if kind is int or kind is str or v is None:
            out.append(v)
        elif kind is float:
            out.append((v, math.copysign(1.0, v)))
        elif kind is tuple:
            out.append((tuple, _typed(v)))
        else:
            out.append((kind, v))
    return tuple(out)


def _leading_to(order: list[Node], targets: frozenset[int]) -> set[int]:
    """The ids of the nodes of ``order`` (decreasing ids) that are targets or have one
    among their ancestors."""
    useful: set[int] = set()
    for node in reversed(order):  # parents before children
        if node.id in targets:
            useful.add(node.id)
            continue
        for p in node.parents:
            if p is not None and p.id in useful:
                useful.add(node.id)
                break
    return useful


class Recompute:
    """Gradient checkpointing: how to rebuild a node's saved state in the backward pass.

    Instead of keeping its inputs and output, a node keeps the op and references
    to its inputs (parent nodes, or the primitives of untracked inputs). Values
    are rebuilt from the nearest nodes that kept theirs (checkpoints: leaves and
    compute-bound ops), recomputing the memory-bound ops in between once per pass.
    """

    __slots__ = ("args", "attrs", "keep_inputs", "keep_output", "make_saved", "run", "tensor_slots")

    def __init__(self, run: Callable, args: list, tensor_slots: int, make_saved: Callable,
                 keep_inputs: bool, keep_output: bool) -> None:  # fmt: skip
        self.run = run  # the inner primitive
        self.args = args  # inner call arguments, tracked inputs replaced by their nodes
        self.tensor_slots = tensor_slots
        self.make_saved = make_saved  # (inputs, output) -> Saved
        self.keep_inputs = keep_inputs
        self.keep_output = keep_output

    def _resolve(self, ref: Any, cache: dict[int, Any]) -> Any:
        if isinstance(ref, list):
            return [self._resolve(r, cache) for r in ref]
        return value_of(ref, cache) if isinstance(ref, Node) else ref

    def output(self, cache: dict[int, Any]) -> Any:
        return self.run(*[self._resolve(a, cache) for a in self.args])

    def restore(self, node: Node, cache: dict[int, Any]) -> Any:
        inputs = [self._resolve(a, cache) for a in self.args[: self.tensor_slots]]
        output = full_output(node, cache) if self.keep_output else None
        return self.make_saved(inputs if self.keep_inputs else None, output)


def full_output(node: Node, cache: dict[int, Any]) -> Any:
    """Everything ``node``'s op returned: kept, recomputed earlier in this pass, or now."""
    if node.value is not None:
        return node.value
    found = cache.get(node.id)
    if found is None:
        recipe = node.saved
        if not isinstance(recipe, Recompute):
            raise GraphFreedError(f"the output of the {node.op!r} node is needed but was not kept")
        found = cache[node.id] = recipe.output(cache)
    return found


def value_of(node: Node, cache: dict[int, Any]) -> Any:
    """The tensor ``node`` belongs to (the first output of a multi-output op)."""
    found = full_output(node, cache)
    return found[0] if isinstance(found, tuple) else found


def _reachable(root: Node) -> list[Node]:
    seen: dict[int, Node] = {root.id: root}
    stack = [root]
    while stack:
        for p in stack.pop().parents:
            if p is not None and p.id not in seen:
                seen[p.id] = p
                stack.append(p)
    return [seen[i] for i in sorted(seen, reverse=True)]
