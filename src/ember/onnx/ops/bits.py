"""Bit ops: BitCast, which reads a tensor's bytes as another dtype of the same width."""

from __future__ import annotations

from ember.onnx.context import NodeContext
from ember.onnx.ops.math import dtype_attr
from ember.onnx.registry import converter
from ember.tensor import DType
from ember.tensor.data import numpy_dtype

# Bytes per element of the dtypes whose bit patterns NumPy stores as ONNX does.
_WIDTH = {DType.F64: 8, DType.I64: 8, DType.U64: 8, DType.F32: 4, DType.I32: 4, DType.U32: 4,
          DType.F16: 2, DType.I16: 2, DType.U16: 2, DType.I8: 1, DType.U8: 1,
          DType.BOOL: 1}  # fmt: skip


@converter("BitCast", since=26, attrs=("to",),
           limits="ember dtypes only, bf16 excluded; the bytes pass through host memory "
                  "(NumPy), so the result has no gradient")  # fmt: skip
def bitcast(node: NodeContext) -> str:
    """The input's bytes (little endian, as NumPy stores them) viewed as dtype ``to``."""
    x = node.input(0)
    target = dtype_attr(node, "to")
    if target is None or target not in _WIDTH:
        node.unsupported("the 'to' attribute must name a dtype ember has (bf16 excluded)")
    source = x.dtype
    if source is None:
        node.unsupported("the input's dtype must be known at import time")
    if source not in _WIDTH:
        node.unsupported(f"the input's dtype {source.value} cannot be bit cast")
    if _WIDTH[source] != _WIDTH[target]:
        node.unsupported(f"{source.value} and {target.value} differ in width "
                         f"({_WIDTH[source] * 8} and {_WIDTH[target] * 8} bits)")
    expr = x.expr
    view = numpy_dtype(target).str  # e.g. "<i4": explicit little endian
    return (f'{node.outputs[0]} = Tensor.from_data({expr}.to_numpy().view("{view}"), '
            f'{expr}.device, "{target.value}")')
