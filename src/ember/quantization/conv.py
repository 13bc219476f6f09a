"""A 2-d convolution whose weight is quantized: what weight-only quantization makes of
:class:`ember.nn.Conv2d` (the weight's parts are untrained parameters, as in
:class:`~ember.quantization.QuantizedLinear`).

Example:
    >>> import ember
    >>> from ember import Tensor, nn
    >>> from ember.quantization import QuantizedConv2d, QuantScheme
    >>> conv = nn.Conv2dConfig([3, 8], [3, 3]).init(ember.device("ndarray"))
    >>> q = QuantizedConv2d.quantize(conv, QuantScheme(granularity="axis", axis=0))
    >>> q(Tensor.ones([1, 3, 5, 5])).shape, q.scales.shape
    ((1, 8, 3, 3), (8,))
"""

from __future__ import annotations

from ember.module import Param
from ember.nn.conv import _Conv
from ember.quantization.linear import qtensor_of, quantized_input, quantized_params
from ember.quantization.ops import conv2d
from ember.quantization.qtensor import QTensor
from ember.quantization.scheme import QuantScheme
from ember.tensor import Tensor

__all__ = ["QuantizedConv2d"]


class QuantizedConv2d(_Conv):
    """:class:`ember.nn.Conv2d` with its weight ``[C_out, C_in / groups, KH, KW]`` quantized.

    Its fields are those of :class:`ember.nn.Conv2d` (``weight`` holds the quantized values,
    i8 or u8 packing int4, untrained) and ``scales``, ``zero_points`` (affine schemes, else
    None), ``scheme`` and ``shape`` (the weight's), and with static quantization the input's
    ``input_scheme``, ``input_scale`` and ``input_zero_point`` (as
    :class:`~ember.quantization.QuantizedLinear`'s).
    """

    scales: Param | None = None
    zero_points: Param | None = None
    scheme: QuantScheme | None = None
    shape: tuple[int, ...] = ()
    input_scheme: QuantScheme | None = None
    input_scale: Param | None = None
    input_zero_point: Param | None = None

    @staticmethod
    def quantize(layer, scheme: QuantScheme) -> QuantizedConv2d:
        """``layer`` (an :class:`ember.nn.Conv2d`) with its weight quantized by ``scheme``;
        the bias stays as it is."""
        values, scales, zero_points = quantized_params(layer.weight, scheme)
        return QuantizedConv2d(values, layer.bias, layer.stride, layer.padding, layer.dilation,
                               layer.groups, scales, zero_points, scheme,
                               tuple(layer.weight.shape))  # fmt: skip

    @property
    def channels_in(self) -> int:
        return self.shape[1] * self.groups

    @property
    def channels_out(self) -> int:
        return self.shape[0]

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return self.shape[2:]

    def quantized_weight(self) -> QTensor:
        return qtensor_of(self.weight, self.scales, self.zero_points, self.scheme, self.shape)

    def forward(self, x: Tensor) -> Tensor:
        x, start = self._padded(x)
        x = quantized_input(x, self.input_scheme, self.input_scale, self.input_zero_point)
        bias = self.bias.val() if self.bias is not None else None
        return conv2d(x, self.quantized_weight(), bias, self.stride, start, self.dilation, self.groups)
