"""Indexing: gather along a dim, select (index a dim by a list), scatter-add, embedding, matmul."""

from __future__ import annotations

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall


@exporter("gather")
def gather(e: Emitter, call: OpCall) -> None:
    e.node("GatherElements", [e.input(call, 0), e.input(call, 1)], [e.output(call)],
           axis=e.static(call, "dim"))  # fmt: skip


@exporter("select")
def select(e: Emitter, call: OpCall) -> None:
    e.node("Gather", [e.input(call, 0), e.input(call, 1)], [e.output(call)], axis=e.static(call, "dim"))


@exporter("scatter_add", since=16)
def scatter_add(e: Emitter, call: OpCall) -> None:
    """ScatterElements with ``reduction="add"`` (opset 16)."""
    indices, values = call.input_avals[1], call.input_avals[2]
    assert indices is not None and values is not None
    if indices.shape != values.shape:
        raise e.unsupported(call, "values and indices of different shapes")
    e.node("ScatterElements", [e.input(call, 0), e.input(call, 1), e.input(call, 2)],
           [e.output(call)], axis=e.static(call, "dim"), reduction="add")  # fmt: skip


@exporter("embedding")
def embedding(e: Emitter, call: OpCall) -> None:
    """The rows of the weights at the indices."""
    e.node("Gather", [e.input(call, 0), e.input(call, 1)], [e.output(call)], axis=0)


@exporter("matmul")
def matmul(e: Emitter, call: OpCall) -> None:
    e.node("MatMul", [e.input(call, 0), e.input(call, 1)], [e.output(call)])
