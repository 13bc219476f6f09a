"""Ops with a quantized weight (linear, matmul, 2-d convolution), of a Float input or of a
quantized one.

A Float input runs the op table's ``quantized_linear`` / ``quantized_conv``, whose default
(every backend) dequantizes the weight and multiplies in float. A quantized input (static
activation quantization, ONNX's integer ops) runs ``integer_linear`` / ``integer_conv``,
whose products are integers where a backend has the kernel (PyTorch's ``_int_mm``,
fusion's int8 GEMM) and whose default dequantizes both operands. A backend may override
either with integer kernels. Under Autodiff the gradient flows to the Float input and the
bias; quantized operands are constants.

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
from ember.tensor import DType, Kind, Tensor
from ember.tensor.tensor import _same_device, _wrap

__all__ = ["conv2d", "linear", "matmul"]

IntOrSeq = int | Sequence[int]


def matmul(x: Tensor | QTensor, weight: QTensor) -> Tensor:
    """``x @ weight.dequantize()`` for a Float or quantized ``x`` of ``[..., M, K]`` and a
    quantized ``weight`` of ``[..., K, N]``, by the backend's quantized kernel; f32 for a
    quantized ``x``.

    Raises:
        KindError: ``x`` is neither a Float tensor nor a :class:`QTensor`.
        ArgumentError: ``weight`` is not a :class:`QTensor`.
        ShapeError: the inner dims differ, or the batch dims do not broadcast.
        DeviceError: ``x`` and ``weight`` are on different devices.
    """
    return linear(x, weight)


def linear(x: Tensor | QTensor, weight: QTensor, bias: Tensor | None = None) -> Tensor:
    """A linear layer with a quantized ``weight`` of ``[d_input, d_output]`` (ember's
    layout, as :class:`ember.nn.Linear`): ``x @ weight + bias``, in one op (PyTorch's int8
    kernel adds the bias in its output loop).

    Shape:
        x ``[..., d_input]`` -> ``[..., d_output]``; bias ``[d_output]``.

    Raises:
        as :func:`matmul`, and ShapeError for a bias of another shape.
    """
    if isinstance(x, QTensor):
        return _integer(ops.integer_linear, x, weight, bias)
    op = ops.quantized_linear
    _check(op.name, x, weight, bias)
    bias = None if bias is None else bias.cast(x.dtype)
    prims, avals = weight._operands()
    rules.quantized_linear(op.name, x._aval(), *avals, None if bias is None else bias._aval(),
                           weight.options)  # fmt: skip
    prim = x.backend.quantized_linear(x._prim, *prims, None if bias is None else bias._prim,
                                      weight.options)  # fmt: skip
    return _wrap(prim, x.device, Kind.FLOAT)


def conv2d(x: Tensor | QTensor, weight: QTensor, bias: Tensor | None = None,
           stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1,
           groups: int = 1) -> Tensor:  # fmt: skip
    """2-d convolution of a Float or quantized ``x`` by a quantized weight (arguments as
    :func:`ember.tensor.module.conv2d`).

    Shape:
        x ``[N, C_in, H, W]``, weight ``[C_out, C_in / groups, KH, KW]``, bias ``[C_out]``.
    """
    from ember.backend.options import ConvOptions
    from ember.tensor.module import _tuple

    op = ops.integer_conv if isinstance(x, QTensor) else ops.quantized_conv
    options = ConvOptions(_tuple(op.name, "stride", stride, 2, 1), _tuple(op.name, "padding", padding, 2, 0),
                          _tuple(op.name, "dilation", dilation, 2, 1), int(groups))  # fmt: skip
    if options.groups < 1:
        raise ArgumentError(f"{op.name}: groups must be >= 1, got {groups}")
    if isinstance(x, QTensor):
        return _integer(op, x, weight, bias, options)
    _check(op.name, x, weight, bias)
    bias = None if bias is None else bias.cast(x.dtype)
    prims, avals = weight._operands()
    rules.quantized_conv(op.name, x._aval(), *avals, None if bias is None else bias._aval(),
                         options, weight.options)  # fmt: skip
    prim = x.backend.quantized_conv(x._prim, *prims, None if bias is None else bias._prim,
                                    options, weight.options)  # fmt: skip
    return _wrap(prim, x.device, Kind.FLOAT)


def _integer(op, x: QTensor, weight: QTensor, bias: Tensor | None, conv=None) -> Tensor:
    """``integer_linear`` (``conv`` None) or ``integer_conv`` (``conv`` its ConvOptions)."""
    _check(op.name, None, weight, bias)
    _same_device(op.name, x.values, weight.values)
    bias = None if bias is None else bias.cast(DType.F32)
    x_prims, x_avals = x._operands()
    w_prims, w_avals = weight._operands()
    b_prim, b_aval = (None, None) if bias is None else (bias._prim, bias._aval())
    attrs = (x.options, weight.options) if conv is None else (conv, x.options, weight.options)
    getattr(rules, op.name)(op.name, *x_avals, *w_avals, b_aval, *attrs)
    prim = getattr(x.device.backend, op.name)(*x_prims, *w_prims, b_prim, *attrs)
    return _wrap(prim, x.device, Kind.FLOAT)


def _check(name: str, x: Tensor | None, weight: QTensor, bias: Tensor | None) -> None:
    """The operand checks every quantized op makes (kinds, the weight's type, devices); a
    quantized input passes None as ``x``."""
    if not isinstance(weight, QTensor):
        raise ArgumentError(f"{name}: weight must be a QTensor (tensor.quantize(scheme)), "
                            f"got {type(weight).__name__}")  # fmt: skip
    for what, t in (("input", x), ("bias", bias)):
        if t is not None and (not isinstance(t, Tensor) or t.kind is not Kind.FLOAT):
            kind = t.kind.value if isinstance(t, Tensor) else type(t).__name__
            raise KindError(f"{name}: the {what} must be a Float tensor, got {kind}")
    anchor = weight.values if x is None else x
    _same_device(name, anchor, weight.values)
    if bias is not None:
        _same_device(name, anchor, bias)
