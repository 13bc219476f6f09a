"""A linear layer whose weight is quantized: what weight-only quantization makes of
:class:`ember.nn.Linear`.

The quantized weight's parts are ordinary parameters (Int values, Float scales, Int zero
points for affine schemes), none of them trained, so records, recorders, devices and
decorators handle the layer like any other; the scheme and the weight's shape are
configuration, rebuilt by quantizing the same model with the same config before a record is
loaded (as Burn rebuilds a module from its config).

Example:
    >>> import ember
    >>> from ember import Tensor, nn
    >>> from ember.quantization import QuantizedLinear, QuantScheme
    >>> layer = nn.LinearConfig(64, 8).init(ember.device("ndarray"))
    >>> q = QuantizedLinear.quantize(layer, QuantScheme(granularity="axis", axis=-1))
    >>> q(Tensor.ones([2, 64])).shape, q.values.dtype.value, q.scales.shape
    ((2, 8), 'i8', (8,))
"""

from __future__ import annotations

from ember.module import Module, Param
from ember.quantization.ops import linear
from ember.quantization.qtensor import QTensor, quantize, quantize_with
from ember.quantization.scheme import QuantScheme
from ember.tensor import Tensor

__all__ = ["ROWS", "QuantizedLinear", "qtensor_of", "quantized_input", "quantized_params"]


def quantized_params(weight: Param, scheme: QuantScheme) -> tuple[Param, Param, Param | None]:
    """``weight`` quantized by ``scheme`` as untrained parameters: values, scales and zero
    points (None for a symmetric scheme)."""
    value = weight.val()
    if value.is_require_grad():
        value = value.detach()
    q = value.quantize(scheme)
    zero_points = None if q.zero_points is None else Param(q.zero_points, require_grad=False)
    return Param(q.values, require_grad=False), Param(q.scales, require_grad=False), zero_points


def qtensor_of(values: Param, scales: Param, zero_points: Param | None, scheme: QuantScheme,
               shape: tuple[int, ...]) -> QTensor:  # fmt: skip
    """The quantized tensor a layer's parameters hold (the inverse of :func:`quantized_params`)."""
    zero_points = None if zero_points is None else zero_points.val()
    return QTensor(values.val(), scales.val(), zero_points, scheme, shape)


ROWS = QuantScheme(granularity="axis", axis=0)
"""The scheme of a dynamically quantized input (as rows ``[-1, d_input]``): symmetric int8,
one scale per row, computed at each call (the int8 kernels take no per-row zero point)."""


def quantized_input(x: Tensor, scheme: QuantScheme | None, scale: Param | None,
                    zero_point: Param | None) -> Tensor | QTensor:  # fmt: skip
    """``x`` quantized by a layer's static input parameters (from calibration), or ``x``
    itself for a layer without them (weight-only)."""
    if scheme is None:
        return x
    return quantize_with(x, scheme, scale.val(), None if zero_point is None else zero_point.val())


class QuantizedLinear(Module):
    """``x @ dequantize(weight) + bias`` with a quantized weight of ``[d_input, d_output]``.

    Args:
        values: the weight's quantized values (i8, or u8 packing int4), not trained.
        scales: the weight's scales, not trained.
        zero_points: its zero points (affine schemes), or None.
        bias: ``[d_output]``, or None; trainable as in :class:`ember.nn.Linear`.
        scheme: the weight's :class:`QuantScheme`.
        shape: ``(d_input, d_output)``.
        input_scheme: with static quantization, the input's scheme (int8, per tensor); the
            input is then quantized by ``input_scale`` (and ``input_zero_point``, affine)
            and multiplied in integers. With dynamic quantization (``input_scale`` None),
            :data:`ROWS` (symmetric int8, a scale per row computed at each call). None
            (weight-only): the input stays Float.
        input_scale: the input's scale, ``[]``, from calibration; not trained.
        input_zero_point: the input's zero point, ``[]`` (affine), or None.

    Shape:
        ``[..., d_input]`` -> ``[..., d_output]``.
    """

    values: Param
    scales: Param
    zero_points: Param | None
    bias: Param | None
    scheme: QuantScheme
    shape: tuple[int, int]
    input_scheme: QuantScheme | None = None
    input_scale: Param | None = None
    input_zero_point: Param | None = None

    @staticmethod
    def quantize(layer, scheme: QuantScheme) -> QuantizedLinear:
        """``layer`` (an :class:`ember.nn.Linear`) with its weight quantized by ``scheme``;
        the bias stays as it is."""
        values, scales, zero_points = quantized_params(layer.weight, scheme)
        return QuantizedLinear(values, scales, zero_points, layer.bias, scheme,
                               tuple(layer.weight.shape))  # fmt: skip

    @property
    def d_input(self) -> int:
        return self.shape[0]

    @property
    def d_output(self) -> int:
        return self.shape[1]

    def weight(self) -> QTensor:
        """The quantized weight."""
        return qtensor_of(self.values, self.scales, self.zero_points, self.scheme, self.shape)

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else self.bias.val()
        if self.input_scheme is not None and self.input_scale is None:  # dynamic
            rows = quantize(x.reshape([-1, self.d_input]), self.input_scheme)
            return linear(rows, self.weight(), bias).reshape([*x.shape[:-1], self.d_output])
        x = quantized_input(x, self.input_scheme, self.input_scale, self.input_zero_point)
        return linear(x, self.weight(), bias)
