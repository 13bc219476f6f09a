"""Assignments into a copy: values written over a slice, or added at selected indices."""

from __future__ import annotations

from onnx import TensorProto, helper

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.rules.logic import where
from ember.onnx.export.tracer import OpCall
from ember.tensor.dtype import Kind


@exporter("slice_assign")
def slice_assign(e: Emitter, call: OpCall) -> None:
    """The values padded to the tensor's shape with zeros, chosen where a padded mask of
    ones says. The padding after a range is ``size - stop``: 0 in every trace for a range
    that runs to the end, so a dynamic dim sliced whole stays dynamic."""
    ranges, other = call.attr("ranges"), e.alternate_attr(call, "ranges")
    if any(step != 1 for _start, _stop, step in ranges):
        raise e.unsupported(call, "a strided slice assignment (steps other than 1)")
    x_aval = call.input_avals[0]
    assert x_aval is not None
    shape, shape_other = x_aval.shape, e.alternate_input_shape(call, 0)
    rest = [0] * (len(shape) - len(ranges))

    def pads(rs, sizes) -> list[int]:
        return [r[0] for r in rs] + rest + [sizes[d] - r[1] for d, r in enumerate(rs)] + rest

    padding = e.sizes(call, pads(ranges, shape), pads(other, shape_other))
    values = e.input(call, 1)
    if call.kind is Kind.BOOL:  # padded as bytes
        values = e.node("Cast", [values], to=TensorProto.UINT8)
    one = helper.make_tensor("one", TensorProto.UINT8, [1], [1])
    ones = e.node("ConstantOfShape", [e.node("Shape", [values])], value=one)
    mask = e.node("Cast", [e.node("Pad", [ones, padding])], to=TensorProto.BOOL)
    padded = e.node("Pad", [values, padding])
    if call.kind is Kind.BOOL:
        padded = e.node("Cast", [padded], to=TensorProto.BOOL)
    where(e, call, mask, padded, e.input(call, 0))


@exporter("select_assign", since=16)
def select_assign(e: Emitter, call: OpCall) -> None:
    """The values added at ``indices`` along ``dim`` (repeated indices add up): a scatter
    with ``reduction="add"`` whose indices are broadcast to the values' shape."""
    dim = e.static(call, "dim")
    values_aval = call.input_avals[2]
    assert values_aval is not None
    rank = len(values_aval.shape)
    line = [1] * rank
    line[dim] = -1
    indices = e.node("Reshape", [e.input(call, 1), e.ints(line)])
    values = e.input(call, 2)
    indices = e.node("Expand", [indices, e.node("Shape", [values])])
    e.node("ScatterElements", [e.input(call, 0), indices, values], [e.output(call)], axis=dim,
           reduction="add")  # fmt: skip
