"""Quantization: schemes, quantized tensors, quantized layers (linear, 2-d convolution,
embedding), and quantization of models (``model.quantize(QuantizeConfig(...))``): weight-only,
or static with calibrated input parameters.

See ``docs/quantization_plan.md`` for the design: a :class:`QTensor` is Int values with
Float scales (and Int zero points), so every backend and decorator carries it unchanged.
"""

from ember.quantization.conv import QuantizedConv2d
from ember.quantization.embedding import QuantizedEmbedding
from ember.quantization.linear import QuantizedLinear
from ember.quantization.mapper import ActivationConfig, QuantizeConfig, quantize_module
from ember.quantization.observers import MinMaxObserver, Observer, PercentileObserver
from ember.quantization.ops import conv2d, linear, matmul
from ember.quantization.qtensor import QTensor, quantize
from ember.quantization.scheme import QuantScheme

__all__ = ["ActivationConfig", "MinMaxObserver", "Observer", "PercentileObserver", "QTensor",
           "QuantScheme", "QuantizeConfig", "QuantizedConv2d", "QuantizedEmbedding",
           "QuantizedLinear", "conv2d", "linear", "matmul", "quantize", "quantize_module"]
