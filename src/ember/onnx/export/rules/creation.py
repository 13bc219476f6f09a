"""Creation ops: data baked into the graph, filled tensors (whose shape may follow a dynamic
axis) and ranges."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall
from ember.tensor.data import numpy_dtype


@exporter("from_data")
def from_data(e: Emitter, call: OpCall) -> None:
    """The data as an initializer (the traced values: one trace, one graph)."""
    e.static(call, "data")
    e.bind(call, e.const(e.trace.value(call.outputs[0]), "data"))


@exporter("full", "empty")
def full(e: Emitter, call: OpCall) -> None:
    dtype = numpy_dtype(call.output_avals[0].dtype)
    value = 0 if call.op.name == "empty" else e.static(call, "value")
    shape = e.sizes(call, list(call.attr("shape")), list(e.alternate_attr(call, "shape")))
    fill = numpy_helper.from_array(np.asarray([value], dtype=dtype), "value")
    e.node("ConstantOfShape", [shape], [e.output(call)], value=fill)


@exporter("arange")
def arange(e: Emitter, call: OpCall) -> None:
    """``Range`` over 0-d bounds; an end that follows a dynamic axis is computed."""
    dtype = numpy_dtype(call.output_avals[0].dtype)
    start, step = e.static(call, "start"), e.static(call, "step")
    end_traced, end_other = call.attr("end"), e.alternate_attr(call, "end")
    if end_traced == end_other:
        end = e.const(np.asarray(end_traced, dtype=dtype))
    else:  # a 1-element size made a 0-d bound
        end = e.node("Reshape", [e.symbolic(call, end_traced, end_other), e.ints([])])
        end = e.node("Cast", [end], to=_onnx_int(dtype))
    e.node("Range", [e.const(np.asarray(start, dtype=dtype)), end,
                     e.const(np.asarray(step, dtype=dtype))], [e.output(call)])  # fmt: skip


def _onnx_int(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(dtype)
