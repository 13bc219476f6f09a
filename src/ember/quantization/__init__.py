"""Quantization: schemes, quantized tensors, quantized layers (linear, 2-d convolution,
embedding) and
weight-only quantization of models (``model.quantize(QuantizeConfig(...))``).

See ``docs/quantization_plan.md`` for the design: a :class:`QTensor` is Int values with
Float scales (and Int zero points), so every backend and decorator carries it unchanged.
"""

from ember.quantization.conv import QuantizedConv2d
from ember.quantization.embedding import QuantizedEmbedding
from ember.quantization.linear import QuantizedLinear
from ember.quantization.mapper import QuantizeConfig, quantize_module
from ember.quantization.ops import conv2d, linear, matmul
from ember.quantization.qtensor import QTensor, quantize
from ember.quantization.scheme import QuantScheme

__all__ = ["QTensor", "QuantScheme", "QuantizeConfig", "QuantizedConv2d", "QuantizedEmbedding",
           "QuantizedLinear", "conv2d", "linear", "matmul", "quantize", "quantize_module"]
