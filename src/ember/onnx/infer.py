"""Ember's own shape inference: the ranks, dims and dtypes ONNX's inference leaves unknown.

ONNX's shape inference gives up on some values that real exports have: a ``Reshape`` to
a shape computed in the graph, the loop-carried values inside a ``Loop`` body (and what
an ``If`` in that body computes from them), everything after an op it does not know or
a node it fails on. Converters need ranks (a Softmax before opset 13 folds the dims from
its axis on; a convolution picks its 1-, 2- or 3-d kernel), so :func:`infer` runs after
ONNX's inference: it walks the graph in order, evaluates each node's rule
(:mod:`ember.onnx.infer_rules`) on the facts of its inputs, and descends into the bodies
of If, Loop and Scan with the facts of what they receive.

What ONNX told stands; ember's rules fill in what it left out. Nothing is written until
the whole walk is done, and then into the graph's value infos and, for each subgraph, a
parsed :class:`~ember.onnx.ir.Graph` the translator takes (:meth:`Graph.body`). The walk
is bounded by the model's size: a model nesting loops to blow it up gets no inference
beyond ONNX's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ember.onnx.infer_rules  # noqa: F401  (registers the rules)
from ember.onnx.facts import RULES, UNKNOWN, Fact, Site, fact_of_array, merge
from ember.onnx.ir import Graph, Node, ValueInfo, graph_of

# Node evaluations allowed: a base, and so many per node of the model (loop bodies are
# evaluated up to three times each, nested ones more).
_BUDGET_BASE = 10_000
_BUDGET_PER_NODE = 32


class _Exhausted(Exception):
    """The walk ran out of its budget."""


@dataclass
class _Inferred:
    """One graph's facts, by value name, and its subgraphs' by the id of their proto."""

    graph: Graph
    facts: dict[str, Fact]
    bodies: dict[int, tuple[Any, _Inferred]] = field(default_factory=dict)


def _told(info: ValueInfo) -> Fact:
    """What ONNX's inference (or the model) says of a value."""
    return Fact(max(info.elem_type, 0), info.shape)


def _count(proto_nodes: Sequence[Any]) -> int:
    """The nodes of a graph's nodes' protos, subgraphs included."""
    total = 0
    for node in proto_nodes:
        total += 1
        for attr in node.attribute:
            graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            for graph in graphs:
                total += _count(graph.node)
    return total


class _Walker:
    """Evaluates the rules over a graph and its subgraphs, within a budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._parsed: dict[int, tuple[Any, Graph]] = {}

    def _parse(self, proto: Any, opsets: dict[str, int]) -> Graph:
        """A subgraph parsed once, however many times its body is walked."""
        cached = self._parsed.get(id(proto))
        if cached is None or cached[0] is not proto:
            cached = (proto, graph_of(proto, opsets))
            self._parsed[id(proto)] = cached
        return cached[1]

    def run(self, graph: Graph, outer: Callable[[str], Fact] | None,
            inputs: Sequence[Fact]) -> tuple[_Inferred, list[Fact]]:  # fmt: skip
        """The facts of ``graph``'s values given its inputs' facts (``inputs``, in order)
        and those of enclosing graphs (``outer``); and of its outputs, in order."""
        defined = {i.name for i in graph.inputs} | set(graph.constants) | {
            o for n in graph.nodes for o in n.outputs if o}
        facts = {name: _told(info) for name, info in graph.values.items() if name in defined}
        for name, array in graph.constants.items():
            facts[name] = merge(facts.get(name, UNKNOWN), fact_of_array(array))
        for info, given in zip(graph.inputs, inputs):
            facts[info.name] = merge(facts.get(info.name, UNKNOWN), given)

        def lookup(name: str) -> Fact:
            if name in defined:
                return facts.get(name, UNKNOWN)
            return outer(name) if outer is not None else UNKNOWN

        inferred = _Inferred(graph, facts)
        for node in graph.nodes:
            self.budget -= 1
            if self.budget < 0:
                raise _Exhausted
            outs = self._node(graph, node, lookup, inferred)
            for name, fact in zip(node.outputs, outs):
                if name:
                    facts[name] = merge(facts.get(name, UNKNOWN), fact)
        outputs = []
        for info in graph.outputs:
            fact = lookup(info.name)
            outputs.append(fact if info.name in defined else merge(_told(info), fact))
        return inferred, outputs

    def _node(self, graph: Graph, node: Node, lookup: Callable[[str], Fact],
              inferred: _Inferred) -> list[Fact]:  # fmt: skip
        fn = RULES.get(node.op_type) if node.domain == "" else None
        if fn is None:
            return []  # an op without a rule tells nothing of its outputs

        def body(proto: Any, facts: Sequence[Fact]) -> list[Fact]:
            sub, outs = self.run(self._parse(proto, graph.opsets), lookup, facts)
            inferred.bodies[id(proto)] = (proto, sub)
            return outs

        site = Site(node, graph.opset(node.domain), [lookup(n) if n else UNKNOWN
                                                     for n in node.inputs], body)  # fmt: skip
        try:
            result = fn(site)
        except _Exhausted:
            raise
        except Exception:
            # A rule that trips on a malformed node tells nothing, nor do the bodies it
            # may have walked with facts it had not settled.
            for proto in node.subgraphs:
                inferred.bodies.pop(id(proto), None)
            return []
        return [result] if isinstance(result, Fact) else list(result)


def _commit(inferred: _Inferred) -> None:
    """Writes the facts into the graph's value infos and hands it its subgraphs."""
    graph = inferred.graph
    for name, fact in inferred.facts.items():
        info = graph.values.get(name)
        if info is None:
            if fact.elem_type or fact.shape is not None:
                graph.values[name] = ValueInfo(name, fact.elem_type, fact.shape)
            continue
        if info.elem_type < 0:
            continue  # a sequence, map or optional value: not a tensor
        if not info.elem_type:
            info.elem_type = fact.elem_type
        if fact.shape is not None and (info.shape is None or len(info.shape) == len(fact.shape)):
            info.shape = fact.shape
    for key, (proto, body) in inferred.bodies.items():
        _commit(body)
        graph.bodies[key] = (proto, body.graph)


def _budget(graph: Graph) -> int:
    nodes = len(graph.nodes) + sum(_count(proto.node) for node in graph.nodes
                                   for proto in node.subgraphs)  # fmt: skip
    return _BUDGET_BASE + _BUDGET_PER_NODE * nodes


def infer(graph: Graph) -> None:
    """Completes ``graph``'s value infos (and its subgraphs') with what ember's rules tell
    beyond ONNX's inference. Leaves the graph as it is when the walk runs out of budget or
    trips on a malformed model (the translator then reports what is wrong with it)."""
    walker = _Walker(_budget(graph))
    try:
        inferred, _ = walker.run(graph, None, [])
    except Exception:  # _Exhausted, or a model too broken to walk: inference is a help
        return
    _commit(inferred)


def infer_values(graph: Graph) -> dict[str, Fact]:
    """The facts of ``graph``'s own values, without writing them anywhere (for tests and
    tools); empty when the walk runs out of budget."""
    walker = _Walker(_budget(graph))
    try:
        inferred, _ = walker.run(graph, None, [])
    except Exception:
        return {}
    return inferred.facts
