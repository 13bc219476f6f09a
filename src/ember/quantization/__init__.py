"""Quantization: schemes, quantized tensors and (to come) quantized models.

See ``docs/quantization_plan.md`` for the design: a :class:`QTensor` is Int values with
Float scales (and Int zero points), so every backend and decorator carries it unchanged.
"""

from ember.quantization.ops import linear, matmul
from ember.quantization.qtensor import QTensor, quantize
from ember.quantization.scheme import QuantScheme

__all__ = ["QTensor", "QuantScheme", "linear", "matmul", "quantize"]
