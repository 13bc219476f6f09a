"""Ops with a quantized operand: a Float input by a quantized weight (linear, matmul, 2-d
convolution).

Each runs the op table's quantized op, whose default (every backend) dequantizes the
weight and multiplies in float; a backend may override it with integer kernels. Under
Autodiff the gradient flows to the Float input; the quantized weight is a constant.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.quantization import QuantScheme, linear
    >>> w = Tensor.from_data([[127.0, -2.0], [1.0, 4.0]]).quantize(QuantScheme())
    >>> w.scales.item()  # max |w| / 127: every value is exact
    1.0
    >>> linear(Tensor.from_data([[1.0, 1.0]]), w).tolist()
    [[128.0, 2.0]]
"""

from __future__ import annotations

from collections.abc import Sequence

from ember.backend import rules
from ember.backend.errors import ArgumentError, KindError
from ember.backend.ops import ops
from ember.quantization.qtensor import QTensor
from ember.tensor import Kind, Tensor
from ember.tensor.tensor import _same_device, _wrap

__all__ = ["conv2d", "linear", "matmul"]

IntOrSeq = int | Sequence[int]


def matmul(x: Tensor, weight: QTensor) -> Tensor:
    """``x @ weight.dequantize()`` for a Float ``x`` of ``[..., M, K]`` and a quantized
    ``weight`` of ``[..., K, N]``, by the backend's quantized kernel.

    Raises:
        KindError: ``x`` is not a Float tensor.
        ArgumentError: ``weight`` is not a :class:`QTensor`.
        ShapeError: the inner dims differ, or the batch dims do not broadcast.
        DeviceError: ``x`` and ``weight`` are on different devices.
    """
    return linear(x, weight)


def linear(x: Tensor, weight: QTensor, bias: Tensor | None = None) -> Tensor:
    """A linear layer with a quantized ``weight`` of ``[d_input, d_output]`` (ember's
    layout, as :class:`ember.nn.Linear`): ``x @ weight + bias``, in one op (PyTorch's int8
    kernel adds the bias in its output loop).

    Shape:
        x ``[..., d_input]`` -> ``[..., d_output]``; bias ``[d_output]``.

    Raises:
        as :func:`matmul`, and ShapeError for a bias of another shape.
    """
    op = ops.quantized_linear
    _check(op.name, x, weight, bias)
    bias = None if bias is None else bias.cast(x.dtype)
    prims, avals = weight._operands()
    rules.quantized_linear(op.name, x._aval(), *avals, None if bias is None else bias._aval(),
                           weight.options)  # fmt: skip
    prim = x.backend.quantized_linear(x._prim, *prims, None if bias is None else bias._prim,
                                      weight.options)  # fmt: skip
    return _wrap(prim, x.device, Kind.FLOAT)


def conv2d(x: Tensor, weight: QTensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
           padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1) -> Tensor:  # fmt: skip
    """2-d convolution by a quantized weight (arguments as
    :func:`ember.tensor.module.conv2d`).

    Shape:
        x ``[N, C_in, H, W]``, weight ``[C_out, C_in / groups, KH, KW]``, bias ``[C_out]``.
    """
    from ember.backend.options import ConvOptions
    from ember.tensor.module import _tuple

    op = ops.quantized_conv
    _check(op.name, x, weight, bias)
    options = ConvOptions(_tuple(op.name, "stride", stride, 2, 1), _tuple(op.name, "padding", padding, 2, 0),
                          _tuple(op.name, "dilation", dilation, 2, 1), int(groups))  # fmt: skip
    if options.groups < 1:
        raise ArgumentError(f"{op.name}: groups must be >= 1, got {groups}")
    bias = None if bias is None else bias.cast(x.dtype)
    prims, avals = weight._operands()
    rules.quantized_conv(op.name, x._aval(), *avals, None if bias is None else bias._aval(),
                         options, weight.options)  # fmt: skip
    prim = x.backend.quantized_conv(x._prim, *prims, None if bias is None else bias._prim,
                                    options, weight.options)  # fmt: skip
    return _wrap(prim, x.device, Kind.FLOAT)


def _check(name: str, x: Tensor, weight: QTensor, bias: Tensor | None) -> None:
    """The operand checks every quantized op makes (kinds, the weight's type, devices)."""
    if not isinstance(weight, QTensor):
        raise ArgumentError(f"{name}: weight must be a QTensor (tensor.quantize(scheme)), "
                            f"got {type(weight).__name__}")  # fmt: skip
    for what, t in (("input", x), ("bias", bias)):
        if t is not None and (not isinstance(t, Tensor) or t.kind is not Kind.FLOAT):
            kind = t.kind.value if isinstance(t, Tensor) else type(t).__name__
            raise KindError(f"{name}: the {what} must be a Float tensor, got {kind}")
    _same_device(name, x, weight.values)
    if bias is not None:
        _same_device(name, x, bias)
