"""Layer norm as ONNX's ``LayerNormalization`` (opset 17) over the last axis; before 17 the
tracer records its primitives."""

from __future__ import annotations

import numpy as np

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall
from ember.tensor.data import numpy_dtype


@exporter("layer_norm", since=17)
def layer_norm(e: Emitter, call: OpCall) -> None:
    x = call.input_avals[0]
    assert x is not None
    scale = e.input(call, 1)
    if not scale:  # ONNX's scale is required: ones of the last dim
        (size,) = e.static_dims(call, 0, [len(x.shape) - 1])
        scale = e.const(np.ones(size, numpy_dtype(x.dtype)), "ones")
    inputs = [e.input(call, 0), scale]
    if e.input(call, 2):  # no trailing empty input: onnxruntime 1.32 crashed loading one
        inputs.append(e.input(call, 2))
    e.node("LayerNormalization", inputs, [e.output(call)], axis=-1,
           epsilon=float(e.static(call, "epsilon")))  # fmt: skip
