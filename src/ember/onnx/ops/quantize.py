"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, and the
integer products MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

Quantized values are ember's 2, 4, 8 and 16-bit integer dtypes (u2, i2, u4, i4, u8, i8, u16,
i16) or its float8 / float4 storage dtypes; the arithmetic runs in floats (exact for these
ranges) and rounds half to even, as ONNX does. Float targets round in the final cast.
"""

from __future__ import annotations

import numpy as np

from ember.onnx.context import NodeContext, Value
from ember.onnx.ops.math import dtype_attr, float8_max
from ember.onnx.registry import converter
from ember.tensor import DType
from ember.tensor.data import dtype_of_numpy

# The integer range of each quantized int dtype.
_RANGES = {DType.U8: (0, 255), DType.I8: (-128, 127), DType.U16: (0, 65535),
           DType.I16: (-32768, 32767), DType.U4: (0, 15), DType.I4: (-8, 7), DType.U2: (0, 3),
           DType.I2: (-2, 1)}  # fmt: skip
# The quantized float dtypes; f8e8m0fnu (a scale type, not a value type) is not one.
_FLOATS = (DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ, DType.F4E2M1FN)
_NAMES = ", ".join(d.value for d in (*_RANGES, *_FLOATS))
_LACKING = f"the quantized dtype must be one of {_NAMES}"


def _dtype(node: NodeContext, v: Value) -> DType | None:
    """The dtype of ``v`` (None when unknown); unsupported when ember lacks it."""
    const = v.const
    if const is not None:
        try:
            return dtype_of_numpy(const.dtype)
        except Exception:
            node.unsupported(f"input {v.name!r} has dtype {const.dtype}: {_LACKING}")
    return v.dtype


def _broadcastable(node: NodeContext, v: Value, x: Value, axis: int, block: int) -> str:
    """A scale or zero point that broadcasts against ``x``: as is when it has one element,
    along ``axis`` when 1-d, each entry repeated over its block of ``block`` along ``axis``
    when blocked."""
    shape = v.shape
    if shape is None:
        node.unsupported(f"the shape of {v.name!r} must be known at import time")
    if all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == 1 and not block:
        return v.expr
    rank = x.rank
    if rank is None and not block:
        # Along an axis of an input of unknown rank: the dims after it, counted when the
        # model runs (or from the end, for a negative axis).
        if axis < 0:
            return f"{v.expr}.reshape([-1{', 1' * (-axis - 1)}])" if axis != -1 else v.expr
        return f"{v.expr}.reshape([-1, *[1] * ({x.expr}.rank - {axis + 1})])"
    if rank is None:
        node.unsupported("blocked quantization needs the input's rank at import time")
    a = axis + rank if axis < 0 else axis
    if not block:
        trailing = rank - a - 1
        return f"{v.expr}.reshape([-1{', 1' * trailing}])" if trailing else v.expr
    size = x.shape[a] if x.shape is not None else None
    if not isinstance(size, int):
        node.unsupported("blocked quantization needs the size of the blocked dim at import time")
    index = [i // block for i in range(size)]
    return f"rt.gather({v.expr}, {index}, {a})"


def _axis_block(node: NodeContext) -> tuple[int, int]:
    return int(node.attr("axis", 1)), int(node.attr("block_size", 0))


@converter("QuantizeLinear", since=10,
           attrs=("axis", "saturate", "block_size", "output_dtype", "precision"),
           limits=_LACKING)  # fmt: skip
def quantize_linear(node: NodeContext) -> str:
    """``saturate(round(x / scale) + zero_point)`` in the zero point's dtype (``output_dtype``,
    else u8, without one); float targets skip the rounding, which their cast does, and
    ``saturate`` (float8 only) clamps them to their finite range."""
    x, scale, zero = node.input(0), node.input(1), node.input(2)
    axis, block = _axis_block(node)
    target = _dtype(node, zero) if zero.present else dtype_attr(node, "output_dtype") or DType.U8
    if target is None:
        node.unsupported("the zero point's dtype must be known at import time")
    if target not in _RANGES and target not in _FLOATS:
        node.unsupported(f"the quantized dtype {target.value} is not one of {_NAMES}")
    precision = dtype_attr(node, "precision")
    x_expr, s_expr = x.expr, _broadcastable(node, scale, x, axis, block)
    if precision is not None:
        x_expr, s_expr = f'{x_expr}.cast("{precision.value}")', f'{s_expr}.cast("{precision.value}")'
    q = f"({x_expr} / {s_expr})"
    if target in _RANGES:
        q = f"{q}.round()"
    if zero.present:
        # A float8 zero point is cast through f32: a storage dtype has no arithmetic.
        zp = _broadcastable(node, zero, x, axis, block)
        if target in _FLOATS:
            zp = f'{zp}.cast("f32")'
        q = f"({q} + {zp}.cast({x_expr}.dtype))"
    if target in _RANGES:
        low, high = _RANGES[target]
        q = f"{q}.clamp({low}, {high})"
    # float4 has no infinity or NaN to overflow to: it always saturates.
    elif node.attr("saturate", 1) or target is DType.F4E2M1FN:
        top = float8_max(target)
        q = f"{q}.clamp({-top}, {top})"
    return f'{node.outputs[0]} = {q}.cast("{target.value}")'


@converter("DequantizeLinear", since=10, attrs=("axis", "block_size", "output_dtype"),
           limits=_LACKING)  # fmt: skip
def dequantize_linear(node: NodeContext) -> str:
    """``(x - zero_point) * scale`` in f32, given the scale's dtype (or ``output_dtype``)."""
    x, scale, zero = node.input(0), node.input(1), node.input(2)
    _dtype(node, x)
    if zero.present:
        _dtype(node, zero)
    axis, block = _axis_block(node)
    dx = f'{x.expr}.cast("f32")'
    if zero.present:
        dx = f'({dx} - {_broadcastable(node, zero, x, axis, block)}.cast("f32"))'
    y = f"{dx} * {_broadcastable(node, scale, x, axis, block)}"
    target = dtype_attr(node, "output_dtype") or _dtype(node, scale)
    if target is not None and target is not DType.F32:
        y = f'({y}).cast("{target.value}")'
    elif target is None:
        y = f"({y}).cast({scale.expr}.dtype)"
    return f"{node.outputs[0]} = {y}"


@converter("DynamicQuantizeLinear", since=11, attrs=())
def dynamic_quantize_linear(node: NodeContext) -> list[str]:
    """u8 quantization over the range of ``x`` widened to hold 0: ``scale = (max - min) / 255``
    (1/255 for an all-zero input) and ``zero_point = round(-min / scale)``."""
    x = node.input(0).expr
    y, scale, zero = node.outputs[:3]
    top, bottom, width = node.tmp("top"), node.tmp("bottom"), node.tmp("width")
    return [
        f"{top} = {x}.max().clamp_min(0.0)",
        f"{bottom} = {x}.min().clamp_max(0.0)",
        f"{width} = {top} - {bottom}",
        f"{scale} = {width}.mask_fill({width}.equal(0.0), 1.0) / 255.0",
        f"{zero} = (-{bottom} / {scale}).clamp(0.0, 255.0).round()",
        f'{y} = (({x} / {scale}).round() + {zero}).clamp(0.0, 255.0).cast("u8")',
        f'{zero} = {zero}.cast("u8")',
    ]


# --------------------------------------------------------------------- integer products
def _centered(node: NodeContext, v: Value, zero: Value, along: int | None = None) -> str:
    """``v - zero`` in f64 (exact for 8-bit values and their sums). A 1-d zero point with
    several entries applies along dim ``along`` of ``v`` (rows of A, output channels of W)."""
    _dtype(node, v)
    out = f'{v.expr}.cast("f64")'
    if not zero.present:
        return out
    _dtype(node, zero)
    z = f'{zero.expr}.cast("f64")'
    shape = zero.shape
    per_entry = shape is not None and len(shape) == 1 and shape[0] != 1
    if per_entry and along is not None and v.rank is not None:
        a = along % v.rank
        trailing = v.rank - a - 1
        if trailing:
            z = f"{z}.reshape([-1{', 1' * trailing}])"
    return f"({out} - {z})"


def _conv(node: NodeContext, x: str, w: str, xv: Value, wv: Value) -> str:
    """The expression of ONNX Conv (attributes of the node) of ``x`` by ``w``, in f64."""
    from ember.onnx.ops.conv import pad_args, spatial_rank, window

    n = spatial_rank(node, xv, wv)
    if n > 3 or wv.shape is None or not all(isinstance(d, int) for d in wv.shape[2:]):
        node.unsupported("needs a 1-d, 2-d or 3-d convolution with kernel dims known at import time")
    kernel = [int(k) for k in node.attr("kernel_shape", wv.shape[2:])]
    strides, dilations, begin, end = window(node, xv, kernel)
    common = [min(b, e) for b, e in zip(begin, end)]
    extra = pad_args([b - c for b, c in zip(begin, common)], [e - c for e, c in zip(end, common)])
    source = f"{x}.pad({extra})" if any(extra) else x
    return (f"F.conv{n}d({source}, {w}, None, {strides}, {common}, {dilations}, "
            f"{int(node.attr('group', 1))})")


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@converter("MatMulInteger", since=10, attrs=())
def matmul_integer(node: NodeContext) -> str:
    """``(A - a_zero_point) @ (B - b_zero_point)`` in i32; a 1-d ``a_zero_point`` is per row."""
    a, b = node.input(0), node.input(1)
    product = f"rt.matmul({_centered(node, a, node.input(2), -2)}, {_centered(node, b, node.input(3))})"
    return f'{node.outputs[0]} = {product}.cast("i32")'


@converter("ConvInteger", since=10, attrs=_CONV_ATTRS)
def conv_integer(node: NodeContext) -> str:
    """Conv of ``x - x_zero_point`` by ``w - w_zero_point`` (per output channel when 1-d), i32."""
    x, w = node.input(0), node.input(1)
    conv = _conv(node, _centered(node, x, node.input(2)), _centered(node, w, node.input(3), 0), x, w)
    return f'{node.outputs[0]} = {conv}.cast("i32")'


def _requantize(node: NodeContext, acc: str, scale: str, y_zero: Value, like: Value) -> str:
    """``saturate(round(acc * scale) + y_zero_point)`` in the zero point's dtype (else that
    of ``like``)."""
    target = _dtype(node, y_zero) if y_zero.present else _dtype(node, like)
    if target not in _RANGES:
        node.unsupported(f"the quantized dtype {target} is not one of "
                         f"{', '.join(d.value for d in _RANGES)}")
    low, high = _RANGES[target]
    y = f"({acc} * {scale})"
    if y_zero.present:
        y = f'({y} + {y_zero.expr}.cast("f64"))'
    return f'{node.outputs[0]} = {y}.round().clamp({low}, {high}).cast("{target.value}")'


@converter("QLinearMatMul", since=10, attrs=())
def qlinear_matmul(node: NodeContext) -> list[str]:
    """Quantized MatMul: the integer product rescaled by ``a_scale * b_scale / y_scale``
    (computed in the scales' dtype) and requantized."""
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = (node.input(i) for i in range(8))
    acc, scale = node.tmp("acc"), node.tmp("scale")
    return [
        f"{acc} = rt.matmul({_centered(node, a, a_z, -2)}, {_centered(node, b, b_z)})",
        f'{scale} = ({a_s.expr} * {b_s.expr} / {y_s.expr}).cast("f64")',
        _requantize(node, acc, scale, y_z, a),
    ]


@converter("QLinearConv", since=10, attrs=_CONV_ATTRS)
def qlinear_conv(node: NodeContext) -> list[str]:
    """Quantized Conv: the integer convolution plus the i32 bias, rescaled by
    ``x_scale * w_scale / y_scale`` (``w_scale`` per output channel when 1-d), requantized."""
    x, x_s, x_z, w, w_s, w_z, y_s, y_z, bias = (node.input(i) for i in range(9))
    acc, scale = node.tmp("acc"), node.tmp("scale")
    lines = [f"{acc} = {_conv(node, _centered(node, x, x_z), _centered(node, w, w_z, 0), x, w)}"]
    if bias.present:
        trailing = ", 1" * (x.rank - 2)
        lines.append(f'{acc} = {acc} + {bias.expr}.cast("f64").reshape([-1{trailing}])')
    w_scale = w_s.expr
    if w_s.shape is not None and len(w_s.shape) == 1 and w_s.shape[0] != 1:
        w_scale = f"{w_scale}.reshape([-1{', 1' * (x.rank - 2)}])"
    lines += [f'{scale} = ({x_s.expr} * {w_scale} / {y_s.expr}).cast("f64")',
              _requantize(node, acc, scale, y_z, x)]  # fmt: skip
    return lines
