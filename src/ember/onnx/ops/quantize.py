"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, and the
integer products MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

Quantized values are ember's 2, 4, 8 and 16-bit integer dtypes (u2, i2, u4, i4, u8, i8, u16,
i16) or its float8 / float4 storage dtypes; the arithmetic runs in floats (exact for these
ranges) and rounds half to even, as ONNX does. Float targets round in the final cast.

Where the weight of an integer product is a constant u8 / i8 initializer with one scale and
zero point, or one per output column (channel), it becomes a :class:`QuantizedWeight` field
of the generated module (ember's int8 :class:`~ember.quantization.QTensor`, built at import)
and the product runs ``ember.quantization.linear`` / ``conv2d`` on the activation as a
quantized tensor (``rt.quantized_input``): exact int32 sums where the backend has the kernel.
MatMulInteger and ConvInteger give i32, so they take that path only where every sum is
exact in f32 too (below 2^24), or where the graph scales them to floats anyway
(:mod:`ember.onnx.quant_patterns`, which also turns DequantizeLinear of a constant weight
feeding MatMul, Gemm or Conv into the quantized ops). Everything else is the float
emulation below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NoReturn

import numpy as np

from ember.module import Module, Param
from ember.onnx.context import NodeContext, Value
from ember.onnx.ops.math import dtype_attr, float8_max
from ember.onnx.registry import OnnxImportError, converter
from ember.quantization import QTensor, QuantScheme
from ember.tensor import DType, Tensor
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


# ------------------------------------------------------------------ quantized weights
class QuantizedWeight(Module):
    """A constant weight of an imported model, kept quantized: ember's int8 values, the
    scales and (affine schemes) the zero points, none of them trained, with the
    :class:`~ember.quantization.QuantScheme` and the logical shape as configuration.
    ``rt.quantized_linear`` and ``rt.quantized_conv`` take it as its :meth:`qtensor`.
    """

    values: Param
    scales: Param
    zero_points: Param | None
    scheme: QuantScheme
    shape: tuple[int, ...]

    def qtensor(self) -> QTensor:
        """The weight as a :class:`~ember.quantization.QTensor`."""
        zero_points = None if self.zero_points is None else self.zero_points.val()
        return QTensor(self.values.val(), self.scales.val(), zero_points, self.scheme,
                       self.shape)  # fmt: skip


def quantized_weight(shape: list[int], mode: str, granularity: str, axis: int | None,
                     block_size: int | None, device=None, value: str = "int8") -> QuantizedWeight:  # fmt: skip
    """A :class:`QuantizedWeight` of ``shape`` with placeholder (zero) parts on ``device``:
    what a generated module builds before its record fills the parts (int4 values: two a
    byte, as :class:`~ember.quantization.QTensor` packs them)."""
    scheme = QuantScheme(value=value, mode=mode, granularity=granularity, axis=axis,
                         block_size=block_size)  # fmt: skip

    def part(dims, dtype: DType) -> Param:
        return Param(Tensor.zeros(list(dims), device, dtype, dtype.kind), require_grad=False)

    params = scheme.scales_shape(tuple(shape))
    values = part(shape, DType.I8) if value == "int8" else part([-(-int(np.prod(shape)) // 2)], DType.U8)
    zero_points = part(params, DType.I8) if mode == "affine" else None
    return QuantizedWeight(values, part(params, DType.F32), zero_points, scheme, tuple(shape))


def _pack_int4(values: np.ndarray) -> np.ndarray:
    """i8 values in [-8, 7] two a byte, in flat order, the first in the low nibble (ONNX's
    int4 layout and :class:`~ember.quantization.QTensor`'s)."""
    flat = values.reshape(-1).astype(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


# The weight dtypes ember's quantized tensors hold: (value type, offset to the signed range).
_WEIGHT_DTYPES = {"int8": ("int8", 0), "uint8": ("int8", 128), "int4": ("int4", 0),
                  "uint4": ("int4", 8)}  # fmt: skip

# Called with the index of the offending input (0 values, 1 scale, 2 zero point) and why.
Fail = Callable[[int, str], NoReturn]


@dataclass(frozen=True)
class ConstantWeight:
    """A constant quantized weight read at import time, in ember's terms: i8 ``values``
    (unpacked, for int4 too), f32 ``scales`` of the scheme's shape, i8 ``zero_points``
    (None: symmetric), the granularity with its axis (in ``[0, rank)``) and block size, and
    the value type (``"int8"`` or ``"int4"``)."""

    values: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    granularity: str
    axis: int | None
    block_size: int | None
    value: str = "int8"

    @property
    def mode(self) -> str:
        return "symmetric" if self.zero_points is None else "affine"

    def transposed(self) -> ConstantWeight:
        """The 2-d weight transposed (Gemm's ``transB``): its axis moves with its dim."""
        def flip(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a.T) if self.granularity == "block" else a

        zero = None if self.zero_points is None else flip(self.zero_points)
        axis = None if self.axis is None else 1 - self.axis
        return replace(self, values=np.ascontiguousarray(self.values.T),
                       scales=flip(self.scales), zero_points=zero, axis=axis)  # fmt: skip

    def centered(self) -> np.ndarray:
        """``values - zero_points`` as i64, each value with its own zero point."""
        out = self.values.astype(np.int64)
        if self.zero_points is None:
            return out
        zero = self.zero_points.astype(np.int64)
        if self.granularity == "axis":
            zero = zero.reshape([-1] + [1] * (out.ndim - self.axis - 1))
        elif self.granularity == "block":
            zero = np.repeat(zero, self.block_size, axis=self.axis)
        return out - zero

    def declare(self, node: NodeContext, hint: str) -> str:
        """A :class:`QuantizedWeight` field of the generated module holding this weight;
        returns the expression of it."""
        values = self.values if self.value == "int8" else _pack_int4(self.values)
        params = {"values": values, "scales": self.scales}
        if self.zero_points is not None:
            params["zero_points"] = self.zero_points
        build = (f"quantized_weight({list(self.values.shape)}, {self.mode!r}, "
                 f"{self.granularity!r}, {self.axis!r}, {self.block_size!r}, device, "
                 f"{self.value!r})")
        return node.layer(hint, "QuantizedWeight", build, params,
                          ["from ember.onnx.ops.quantize import QuantizedWeight, quantized_weight"])


def constant_weight(values: np.ndarray, scale: np.ndarray | None, zero: np.ndarray | None,
                    axis: int, block: int, fail: Fail) -> ConstantWeight | None:  # fmt: skip
    """ONNX's quantized constant ``values`` (u8, i8, u4 or i4) with ``scale`` (None: 1, as the
    integer ops have it) and ``zero`` point (None: 0) along ``axis`` (1-d parameters) or in
    blocks of ``block`` along it, as ember's int8 weight; None where ember's layouts do not
    hold it (another dtype, f16 scales, a block size that does not divide the axis).

    Calls ``fail`` (which raises) for parameters that make no sense: a scale that is not
    positive and finite, a zero point of another dtype than the values, parameters whose
    shapes do not fit the values or each other, an axis out of range.
    """
    kind = _WEIGHT_DTYPES.get(str(values.dtype))
    if kind is None or values.ndim == 0:
        return None
    value, offset = kind
    if zero is not None and zero.dtype != values.dtype:
        fail(2, f"has dtype {zero.dtype}, the values {values.dtype}: ONNX needs the same dtype")
    if scale is not None:
        if scale.dtype != np.float32:
            return None
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            bad = scale[~(np.isfinite(scale) & (scale > 0))].reshape(-1)[0]
            fail(1, f"has the scale {float(bad)!r}: every scale must be positive and finite")
    if scale is not None and zero is not None and scale.shape != zero.shape:
        fail(2, f"has shape {list(zero.shape)}, the scale {list(scale.shape)}: they must match")
    params = scale if scale is not None else zero
    shape = values.shape
    rank = len(shape)
    dims = () if params is None else params.shape
    per_tensor = len(dims) <= 1 and int(np.prod(dims)) == 1 and not block
    granularity, resolved, block_size = "tensor", None, None
    if not per_tensor:
        if not -rank <= axis < rank:
            fail(1, f"applies along axis {axis}, out of range for values of shape {list(shape)}")
        resolved = axis % rank
        which = 1 if scale is not None else 2
        if block:
            want = [-(-d // block) if i == resolved else d for i, d in enumerate(shape)]
            if list(dims) != want:
                fail(which, f"has shape {list(dims)}; blocks of {block} along axis {axis} of "
                            f"values {list(shape)} need {want}")  # fmt: skip
            if shape[resolved] % block:
                return None  # a short last block: ember's blocks divide the axis
            granularity, block_size = "block", block
        else:
            if list(dims) != [shape[resolved]]:
                fail(which, f"has shape {list(dims)}; along axis {axis} of values "
                            f"{list(shape)} it must be [{shape[resolved]}] (or one element)")  # fmt: skip
            granularity = "axis"
    out_dims = () if granularity == "tensor" else dims
    scales = (np.ones(out_dims, np.float32) if scale is None
              else np.ascontiguousarray(scale, np.float32).reshape(out_dims))  # fmt: skip
    ints = values.astype(np.int16)
    zeros = None if zero is None else zero.astype(np.int16).reshape(out_dims)
    if offset:  # unsigned v with zero point z is signed v - offset with z - offset
        ints = ints - offset
        zeros = np.full(out_dims, -offset, np.int16) if zeros is None else zeros - offset
    if zeros is not None and not zeros.any():
        zeros = None  # zero points of 0: symmetric, which the int8 kernels take
    return ConstantWeight(ints.astype(np.int8), scales,
                          None if zeros is None else zeros.astype(np.int8),
                          granularity, resolved, block_size, value)  # fmt: skip


def failing(node: NodeContext, inputs: list[Value], what: str = "") -> Fail:
    """A :data:`Fail` that raises :class:`OnnxImportError` naming ``node`` and the input
    (``inputs``: the values, scale and zero point); ``what`` says where they come from."""
    def fail(index: int, reason: str) -> NoReturn:
        op = node.attr("op", node.op_type)
        source = f", {what}" if what else ""
        raise OnnxImportError(f"ONNX import: node {node.name!r} ({op}{source}): input "
                              f"{inputs[index].name!r} {reason}")

    return fail


def _const(v: Value) -> np.ndarray | None:
    return v.const if v.present else None


def _per_tensor(v: Value) -> bool:
    """Whether ``v`` is absent or has one element known at import time."""
    if not v.present:
        return True
    shape = v.static_shape
    return shape is not None and len(shape) <= 1 and int(np.prod(shape)) == 1


def _activation(node: NodeContext, x: Value, scale: Value | None, zero: Value) -> str | None:
    """``rt.quantized_input`` of a u8 / i8 activation with one scale and zero point, or None
    where it is not one."""
    if x.dtype not in (DType.U8, DType.I8) or not _per_tensor(zero):
        return None
    if scale is not None and (not _per_tensor(scale) or scale.dtype is not DType.F32):
        return None
    if zero.present and zero.dtype is not x.dtype:
        failing(node, [x, x, zero])(2, f"has dtype {zero.dtype}, the values {x.dtype}: ONNX "
                                       "needs the same dtype")  # fmt: skip
    return f"rt.quantized_input({x.expr}, {'None' if scale is None else scale.expr}, {zero.expr})"


# Integer sums below this are exact in f32 (the float default of the integer ops).
_EXACT_F32 = 1 << 24


def integer_product(node: NodeContext, x: Value, x_scale: Value | None, x_zero: Value,
                    w: Value, w_scale: Value | None, w_zero: Value, *, exact: bool, conv: bool,
                    bias: Callable[[], str] | None = None) -> str | None:  # fmt: skip
    """The f32 product of the quantized activation ``x`` by the constant quantized weight
    ``w`` (scales None: 1) through ``ember.quantization`` (2-d Conv with ``conv``, plus the
    Float bias that ``bias`` declares; MatMul otherwise), or None where the pattern does not
    allow it (then nothing is declared). With ``exact``, only where every integer sum is
    below 2^24 (the f32 result is then the exact integer on every backend)."""
    if w.const is None or (w_zero.present and w_zero.const is None):
        return None
    if w_scale is not None and w_scale.const is None:
        return None
    rank = x.rank
    if conv and (rank != 4 or w.const.ndim != 4):
        return None
    if not conv and (rank is None or rank < 2 or w.const.ndim != 2):
        return None
    qx = _activation(node, x, x_scale, x_zero)
    if qx is None:
        return None
    scale = None if w_scale is None else w_scale.const
    weight = constant_weight(w.const, scale, _const(w_zero), 0 if conv else -1, 0,
                             failing(node, [w, w_scale or w, w_zero]))  # fmt: skip
    if weight is None or weight.granularity == "block":
        return None
    if exact:
        dims = tuple(range(1, 4)) if conv else (0,)
        # |x - x_zero| <= 255 for u8 and i8 alike.
        if int(np.abs(weight.centered()).sum(axis=dims).max(initial=0)) * 255 >= _EXACT_F32:
            return None
    if not conv:
        return f"rt.quantized_linear({qx}, {weight.declare(node, f'{node.name}_weight')})"
    from ember.onnx.ops.conv import window

    kernel = [int(k) for k in node.attr("kernel_shape", w.const.shape[2:])]
    if kernel != list(w.const.shape[2:]):
        return None
    strides, dilations, begin, end = window(node, x, kernel)
    layer = weight.declare(node, f"{node.name}_weight")
    return (f"rt.quantized_conv({qx}, {layer}, {'None' if bias is None else bias()}, {strides}, "
            f"{begin}, {end}, {dilations}, {int(node.attr('group', 1))})")


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
    quantized = integer_product(node, a, None, node.input(2), b, None, node.input(3), exact=True,
                                conv=False)  # fmt: skip
    if quantized is not None:
        return f'{node.outputs[0]} = {quantized}.round().cast("i32")'
    product = f"rt.matmul({_centered(node, a, node.input(2), -2)}, {_centered(node, b, node.input(3))})"
    return f'{node.outputs[0]} = {product}.cast("i32")'


@converter("ConvInteger", since=10, attrs=_CONV_ATTRS)
def conv_integer(node: NodeContext) -> str:
    """Conv of ``x - x_zero_point`` by ``w - w_zero_point`` (per output channel when 1-d), i32."""
    x, w = node.input(0), node.input(1)
    quantized = integer_product(node, x, None, node.input(2), w, None, node.input(3), exact=True,
                                conv=True)  # fmt: skip
    if quantized is not None:
        return f'{node.outputs[0]} = {quantized}.round().cast("i32")'
    conv = _conv(node, _centered(node, x, node.input(2)), _centered(node, w, node.input(3), 0), x, w)
    return f'{node.outputs[0]} = {conv}.cast("i32")'


def _requantize(node: NodeContext, acc: str, scale: str, y_zero: Value, like: Value,
                divide: bool = False) -> str:  # fmt: skip
    """``saturate(round(acc * scale) + y_zero_point)`` (``acc / scale`` with ``divide``) in
    the zero point's dtype (else that of ``like``)."""
    target = _dtype(node, y_zero) if y_zero.present else _dtype(node, like)
    if target not in _RANGES:
        node.unsupported(f"the quantized dtype {target} is not one of "
                         f"{', '.join(d.value for d in _RANGES)}")
    low, high = _RANGES[target]
    y = f"({acc} / {scale})" if divide else f"({acc} * {scale})"
    if y_zero.present:
        y = f'({y} + {y_zero.expr}.cast("f64"))'
    return f'{node.outputs[0]} = {y}.round().clamp({low}, {high}).cast("{target.value}")'


@converter("QLinearMatMul", since=10, attrs=())
def qlinear_matmul(node: NodeContext) -> list[str]:
    """Quantized MatMul: the integer product rescaled by ``a_scale * b_scale / y_scale``
    (computed in the scales' dtype) and requantized."""
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = (node.input(i) for i in range(8))
    acc, scale = node.tmp("acc"), node.tmp("scale")
    quantized = integer_product(node, a, a_s, a_z, b, b_s, b_z, exact=False, conv=False)
    if quantized is not None:  # the f32 product, already scaled by a_scale * b_scale
        return [f'{acc} = {quantized}.cast("f64")',
                _requantize(node, acc, f'{y_s.expr}.cast("f64")', y_z, a, divide=True)]  # fmt: skip
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
    quantized = integer_product(node, x, x_s, x_z, w, w_s, w_z, exact=False, conv=True,
                                bias=lambda: _float_bias(node, bias, x_s, w_s))  # fmt: skip
    if quantized is not None:  # the f32 convolution, already scaled by x_scale * w_scale
        return [f'{acc} = {quantized}.cast("f64")',
                _requantize(node, acc, f'{y_s.expr}.cast("f64")', y_z, x, divide=True)]  # fmt: skip
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


def _float_bias(node: NodeContext, bias: Value, x_scale: Value, w_scale: Value) -> str:
    """QLinearConv's i32 bias (quantized by ``x_scale * w_scale``) as the f32 bias of the
    float result: computed at import when the scales and the bias are constants."""
    if not bias.present:
        return "None"
    if bias.const is not None and x_scale.const is not None and w_scale.const is not None:
        value = (bias.const.astype(np.float32) * x_scale.const.astype(np.float32).reshape(())
                 * w_scale.const.astype(np.float32).reshape(-1))  # fmt: skip
        return node.param(value.astype(np.float32), f"{node.name}_bias", trainable=False)
    return (f'({bias.expr}.cast("f32") * {x_scale.expr}.reshape([]).cast("f32") '
            f'* {w_scale.expr}.reshape([-1]).cast("f32"))')


# ------------------------------------------------ patterns of several nodes (quant_patterns)
# ember.onnx.quant_patterns replaces a few chains of nodes by one node of its own domain,
# translated here: the inputs say where each part comes from.


def scaled_integer(node: NodeContext) -> str:
    """MatMulInteger or ConvInteger (``op``), then Cast to f32, then Mul by input 4: the
    f32 product through ``ember.quantization`` times the scale, or, where the pattern does
    not allow it, the float emulation of the three nodes."""
    conv = node.attr("op") == "ConvInteger"
    x, w, x_zero, w_zero, scale = (node.input(i) for i in range(5))
    product = integer_product(node, x, None, x_zero, w, None, w_zero, exact=False, conv=conv)
    if product is None:
        centered_x, centered_w = _centered(node, x, x_zero, None if conv else -2), _centered(
            node, w, w_zero, 0 if conv else None)  # fmt: skip
        exact = (_conv(node, centered_x, centered_w, x, w) if conv
                 else f"rt.matmul({centered_x}, {centered_w})")  # fmt: skip
        product = f'{exact}.cast("i32").cast("f32")'
    return f"{node.outputs[0]} = {product} * {scale.expr}"


def dequantized_weight(node: NodeContext) -> str:
    """MatMul, Gemm or Conv (``op``) by a constant DequantizeLinear weight (inputs 1-3 with
    the attributes ``weight_axis``, ``weight_block``) of the Float input 0, or of the
    quantized activation of inputs 4-6 (a DequantizeLinear's inputs); input 7 is Gemm's C
    or Conv's bias."""
    op = node.attr("op")
    x, w, w_scale, w_zero, xq, x_scale, x_zero, c = (node.input(i) for i in range(8))
    where = f"its weight from DequantizeLinear {node.attr('weight_node')!r}"
    weight = constant_weight(w.const, w_scale.const, _const(w_zero), int(node.attr("weight_axis")),
                             int(node.attr("weight_block")), failing(node, [w, w_scale, w_zero], where))  # fmt: skip
    if weight is None:  # quant_patterns fuses only weights ember's layouts hold
        node.unsupported("the quantized weight does not fit ember's layouts")
    activation = x.expr
    if xq.present:
        activation = _activation(node, xq, x_scale, x_zero)
        if activation is None:
            node.unsupported("the quantized activation has more than one scale or zero point")
    y = node.outputs[0]
    if op == "Conv":
        from ember.onnx.ops.conv import window

        kernel = list(w.const.shape[2:])
        strides, dilations, begin, end = window(node, xq if xq.present else x, kernel)
        layer = weight.declare(node, f"{node.name}_weight")
        return (f"{y} = rt.quantized_conv({activation}, {layer}, {c.expr}, {strides}, {begin}, "
                f"{end}, {dilations}, {int(node.attr('group', 1))})")
    if op == "MatMul":
        return f"{y} = rt.quantized_linear({activation}, {weight.declare(node, f'{node.name}_weight')})"
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if node.attr("transB", 0):
        weight = weight.transposed()
    if node.attr("transA", 0):
        activation = f"{activation}.transpose()"
    n = weight.values.shape[1]
    bias, after = "None", ""
    row = c.const if c.present else None
    if row is not None and alpha == 1.0 and row.size in (1, n) and row.dtype == np.float32 \
            and (row.ndim < 2 or (row.ndim == 2 and row.shape[0] == 1)):
        bias = node.param(np.broadcast_to(row.reshape(-1) * np.float32(beta), (n,)).copy(),
                          f"{node.name}_bias")  # fmt: skip
    elif c.present:
        after = f" + {c.expr}" if beta == 1.0 else f" + {c.expr} * {beta!r}"
    product = f"rt.quantized_linear({activation}, {weight.declare(node, f'{node.name}_weight')}, {bias})"
    if alpha != 1.0:
        product = f"{product} * {alpha!r}"
    return f"{y} = {product}{after}"
