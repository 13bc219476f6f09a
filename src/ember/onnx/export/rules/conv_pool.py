"""Convolutions, transposed convolutions and pooling (fixed and adaptive windows)."""

from __future__ import annotations

import numpy as np

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall
from ember.tensor.data import numpy_dtype


def _conv_inputs(e: Emitter, call: OpCall) -> list[str]:
    inputs = [e.input(call, 0), e.input(call, 1)]
    if call.inputs[2] is not None:
        inputs.append(e.input(call, 2))
    return inputs


@exporter("conv1d", "conv2d", "conv3d")
def conv(e: Emitter, call: OpCall) -> None:
    options = e.static(call, "options")
    e.node("Conv", _conv_inputs(e, call), [e.output(call)], strides=list(options.stride),
           pads=list(options.padding) * 2, dilations=list(options.dilation),
           group=options.groups)  # fmt: skip


@exporter("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
def conv_transpose(e: Emitter, call: OpCall) -> None:
    """ember's weight layout ``[in, out / groups, *kernel]`` is ONNX's."""
    options = e.static(call, "options")
    e.node("ConvTranspose", _conv_inputs(e, call), [e.output(call)],
           strides=list(options.stride), pads=list(options.padding) * 2,
           dilations=list(options.dilation), group=options.groups,
           output_padding=list(options.padding_out))  # fmt: skip


@exporter("avg_pool1d", "avg_pool2d")
def avg_pool(e: Emitter, call: OpCall) -> None:
    options = e.static(call, "options")
    dilated = any(d != 1 for d in options.dilation)
    if dilated and e.opset < 19:
        raise e.unsupported(call, "a dilated average pool needs opset >= 19")
    e.node("AveragePool", [e.input(call, 0)], [e.output(call)],
           kernel_shape=list(options.kernel_size), strides=list(options.stride),
           pads=list(options.padding) * 2, ceil_mode=int(options.ceil_mode),
           count_include_pad=int(options.count_include_pad),
           dilations=list(options.dilation) if dilated else None)  # fmt: skip


@exporter("max_pool1d", "max_pool2d", "max_pool2d_with_indices")
def max_pool(e: Emitter, call: OpCall) -> None:
    """MaxPool; with indices, ONNX's flat index over the whole input ``((n * C + c) * H + h)
    * W + w`` is taken modulo ``H * W``: ember's ``h * W + w`` within the plane."""
    options = e.static(call, "options")
    outputs = [e.output(call, i) for i in range(len(call.outputs))]
    if len(outputs) == 2:
        outputs[1] = e.fresh("flat_indices")
    e.node("MaxPool", [e.input(call, 0)], outputs,
           kernel_shape=list(options.kernel_size), strides=list(options.stride),
           pads=list(options.padding) * 2, dilations=list(options.dilation),
           ceil_mode=int(options.ceil_mode))  # fmt: skip
    if len(outputs) == 2:
        aval = call.input_avals[0]
        assert aval is not None
        h, w = aval.shape[2:]
        h_other, w_other = e.alternate_input_shape(call, 0)[2:]
        plane = e.sizes(call, [h * w], [h_other * w_other])
        e.node("Mod", [outputs[1], plane], [e.output(call, 1)])


def averaging_matrix(size: int, out: int) -> np.ndarray:
    """``[out, size]``: row ``i`` averages the adaptive window ``floor(i * size / out)`` to
    ``ceil((i + 1) * size / out)``, as PyTorch's adaptive pooling cuts it."""
    matrix = np.zeros((out, size), dtype=np.float64)
    for i in range(out):
        start, end = (i * size) // out, -(-((i + 1) * size) // out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


@exporter("adaptive_avg_pool1d", "adaptive_avg_pool2d")
def adaptive_avg_pool(e: Emitter, call: OpCall) -> None:
    """A global pool for output size 1, a fixed pool when each size divides evenly, else
    products with averaging matrices (exact: an adaptive average is linear per dim)."""
    aval = call.input_avals[0]
    assert aval is not None
    out_size = tuple(e.static(call, "output_size"))
    x = e.input(call, 0)
    if all(o == 1 for o in out_size):
        e.node("GlobalAveragePool", [x], [e.output(call)])
        return
    spatial = e.static_dims(call, 0, range(2, len(aval.shape)))  # windows are baked in
    if all(s % o == 0 for s, o in zip(spatial, out_size, strict=True)):
        kernel = [s // o for s, o in zip(spatial, out_size, strict=True)]
        e.node("AveragePool", [x], [e.output(call)], kernel_shape=kernel, strides=kernel)
    else:
        dtype = numpy_dtype(aval.dtype)
        last = len(aval.shape) - 1
        for axis, (size, out) in enumerate(zip(spatial, out_size, strict=True), start=2):
            matrix = averaging_matrix(size, out).astype(dtype)
            if axis == last:  # [..., size] @ [size, out], into the op's output
                e.node("MatMul", [x, e.const(matrix.T, "adaptive")], [e.output(call)])
            else:  # [out, size] @ [..., size, width]
                x = e.node("MatMul", [e.const(matrix, "adaptive"), x])


@exporter("adaptive_max_pool2d")
def adaptive_max_pool(e: Emitter, call: OpCall) -> None:
    aval = call.input_avals[0]
    assert aval is not None
    out_size = tuple(e.static(call, "output_size"))
    if all(o == 1 for o in out_size):
        e.node("GlobalMaxPool", [e.input(call, 0)], [e.output(call)])
        return
    spatial = e.static_dims(call, 0, range(2, len(aval.shape)))
    if not all(s % o == 0 for s, o in zip(spatial, out_size, strict=True)):
        raise e.unsupported(call, f"input size {list(spatial)} is not a multiple of the output "
                                  f"size {list(out_size)} (uneven adaptive windows)")
    kernel = [s // o for s, o in zip(spatial, out_size, strict=True)]
    e.node("MaxPool", [e.input(call, 0)], [e.output(call)], kernel_shape=kernel, strides=kernel)
