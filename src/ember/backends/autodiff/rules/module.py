"""Backward rules of the module ops: convolutions, pooling, resampling and embedding.

Convolution gradients are the backend's ``conv_x_backward`` / ``conv_weight_backward``
(and their ``conv_transpose`` pair): composites whose generic defaults live in
:mod:`ember.backend.conv_grad`, which a backend may override with its own kernel
(Torch: ``aten.convolution_backward``); the bias gradient is ``g`` summed over
batch and spatial dims.

The 1-d ops and ``unfold4d`` are composites of the 2-d ops and need no rule.
"""

from __future__ import annotations

import math

from ember.backends.autodiff.rule import backward, zeros
from ember.tensor.data import TensorData
from ember.tensor.dtype import DType


# ------------------------------------------------------------------ convolution
def _bias_grad(B, g):
    """``g`` ``[N, C, *S]`` summed over every dim but the channels: ``[C]``."""
    n, c = B.shape(g)[:2]
    flat = B.float_reshape(g, (n, c, math.prod(B.shape(g)[2:])))
    return B.float_reshape(B.float_sum_dim(B.float_sum_dim(flat, 2), 0), (c,))


def _convolution(x_backward: str, weight_backward: str):
    """The rule of a (transposed) convolution, from the backend's gradient ops."""

    def rule(B, g, s):
        x, weight, _bias = s.inputs
        (options,) = s.attrs
        # The first layer's images need no gradient: skip the input gradient.
        gx = getattr(B, x_backward)(x, weight, g, options) if s.needs[0] else None
        gw = getattr(B, weight_backward)(x, weight, g, options) if s.needs[1] else None
        gb = _bias_grad(B, g) if s.shapes[2] is not None and s.needs[2] else None
        return gx, gw, gb

    return rule


backward("conv2d", "conv3d", keep="inputs")(_convolution("conv_x_backward", "conv_weight_backward"))


@backward("quantized_conv", keep="inputs")
def _quantized_conv(B, g, s):
    # A convolution by a constant weight (dequantized again here): gradients to the input
    # and the bias only, as the quantized linear's.
    x, values, scales, zero_points, bias = s.inputs
    options, quant = s.attrs
    gx = None
    if s.needs[0]:
        weight = B.float_cast(B.dequantize(values, scales, zero_points, quant), B.dtype(x))
        gx = B.conv_x_backward(x, weight, g, options)
    gb = _bias_grad(B, g) if bias is not None and s.needs[4] else None
    return gx, None, None, None, gb


@backward("integer_conv")
def _integer_conv(B, g, s):
    # Both operands are quantized (constants); only the bias has a gradient.
    gb = _bias_grad(B, g) if s.needs[6] else None
    return (None,) * 6 + (gb,)
backward("conv_transpose2d", "conv_transpose3d", keep="inputs")(
    _convolution("conv_transpose_x_backward", "conv_transpose_weight_backward")
)


# ------------------------------------------------------------------ pooling
@backward("avg_pool2d", keep="inputs")
def _avg_pool2d(B, g, s):
    return (B.avg_pool2d_backward(s.inputs[0], g, s.attrs[0]),)


@backward("max_pool2d_with_indices", keep=("inputs", "output"))
def _max_pool2d(B, g, s):
    indices = s.output[1]
    return (B.max_pool2d_with_indices_backward(s.inputs[0], g, indices, s.attrs[0]),)


@backward("adaptive_avg_pool2d", keep="inputs")
def _adaptive_avg_pool2d(B, g, s):
    return (B.adaptive_avg_pool2d_backward(s.inputs[0], g),)


def _adaptive_taps(size: int, out: int) -> tuple[list[int], int]:
    """Positions read by the adaptive windows along one dim, ``longest`` taps per window.

    Window ``i`` is ``[floor(i * size / out), ceil((i + 1) * size / out))``; tap ``j``
    reads ``min(start + j, end - 1)``, so a short window repeats its last element.
    Repeats come after the element they copy, so the first maximum found in tap
    order is a real position, the one PyTorch picks.
    """
    starts = [i * size // out for i in range(out)]
    ends = [-(-(i + 1) * size // out) for i in range(out)]
    longest = max(e - b for b, e in zip(starts, ends))
    return [min(b + j, e - 1) for b, e in zip(starts, ends) for j in range(longest)], longest


@backward("adaptive_max_pool2d", keep="inputs")
def _adaptive_max_pool2d(B, g, s):
    # No backward op: gather every window's taps, find the first maximum (as
    # PyTorch, one position per window) and scatter-add g there.
    x = s.inputs[0]
    n, c, h, w = s.shapes[0]
    (oh, ow) = s.attrs[0]
    device = B.device_of(x)
    rows, kh = _adaptive_taps(h, oh)
    cols, kw = _adaptive_taps(w, ow)

    def index(values):
        return B.int_from_data(TensorData(values, DType.I64), device)

    def arange(size, scale):  # 0, scale, 2 * scale, ...
        return B.int_mul_scalar(B.int_arange(0, size, 1, device, DType.I64), scale)

    rows_t, cols_t = index(rows), index(cols)
    windows = x
    if h % oh:  # divisible sizes read every row once, in order: no gather needed
        windows = B.float_select(windows, rows_t, 2)
    if w % ow:
        windows = B.float_select(windows, cols_t, 3)
    windows = B.float_permute(B.float_reshape(windows, (n, c, oh, kh, ow, kw)), (0, 1, 2, 4, 3, 5))
    tap = B.int_argmax(B.float_reshape(windows, (n, c, oh, ow, kh * kw)), 4)  # first maximum
    tap = B.int_reshape(tap, (n, c, oh, ow))
    # Window (i, j), tap t reads row rows[i * kh + t // kw] and column cols[j * kw + t % kw].
    row_slot = B.int_add(B.int_div_scalar(tap, kw), B.int_reshape(arange(oh, kh), (1, 1, oh, 1)))
    col_slot = B.int_add(B.int_remainder_scalar(tap, kw), B.int_reshape(arange(ow, kw), (1, 1, 1, ow)))
    count = n * c * oh * ow
    row = B.int_select(rows_t, B.int_reshape(row_slot, (count,)), 0)
    col = B.int_select(cols_t, B.int_reshape(col_slot, (count,)), 0)
    position = B.int_reshape(B.int_add(B.int_mul_scalar(row, w), col), (n, c, oh * ow))
    grad = B.float_scatter_add(zeros(B, x, (n, c, h * w)), position, B.float_reshape(g, (n, c, oh * ow)), 2)
    return (B.float_reshape(grad, (n, c, h, w)),)


# ------------------------------------------------------------------ resampling and embedding
@backward("interpolate", keep="inputs")
def _interpolate(B, g, s):
    output_size, options = s.attrs
    return (B.interpolate_backward(s.inputs[0], g, output_size, options),)


@backward("embedding", keep="inputs")
def _embedding(B, g, s):
    weights, indices = s.inputs
    return B.embedding_backward(weights, g, indices), None


# ------------------------------------------------------------------ the backward ops' rules
# Each backward op above is linear in the gradient it takes (its input gives only a shape,
# indices are constants), so its own rule is its adjoint: the forward op. With these,
# gradients of gradients (``backward(create_graph=True)``) go through pooling, resampling
# and embeddings, to any order.
@backward("avg_pool2d_backward")
def _avg_pool2d_backward(B, gg, s):
    return None, B.avg_pool2d(gg, s.attrs[0])


@backward("adaptive_avg_pool2d_backward")
def _adaptive_avg_pool2d_backward(B, gg, s):
    return None, B.adaptive_avg_pool2d(gg, tuple(s.shapes[1][2:]))


@backward("interpolate_backward")
def _interpolate_backward(B, gg, s):
    output_size, options = s.attrs
    return None, B.interpolate(gg, output_size, options)


@backward("max_pool2d_with_indices_backward", keep="inputs")
def _max_pool2d_with_indices_backward(B, gg, s):
    # The pooled gradient read back at each window's maximum: a gather within each plane.
    indices = s.inputs[2]
    n, c, *spatial = s.shapes[1]
    planes = B.float_reshape(gg, (n, c, math.prod(s.shapes[0][2:])))
    flat = B.int_reshape(indices, (n, c, math.prod(spatial)))
    return None, B.float_reshape(B.float_gather(planes, flat, 2), s.shapes[1]), None


@backward("embedding_backward", keep="inputs")
def _embedding_backward(B, gg, s):
    return None, B.embedding(gg, s.inputs[2]), None


# A convolution's two gradient ops are linear in each of their other operands (the input
# ``x`` of conv_x_backward gives only a shape): their rules are the adjoint identities
# <conv(a, w), g> = <a, conv_x_backward(., w, g)> = <w, conv_weight_backward(a, ., g)>.
# With them, a gradient of a gradient runs the backend's own gradient kernels (and not the
# composites' unfold-and-multiply defaults).
def _conv_forward(B, x, weight, options):
    conv = B.conv2d if len(B.shape(weight)) == 4 else B.conv3d
    return conv(x, weight, None, options)


@backward("conv_x_backward", keep="inputs")
def _conv_x_backward(B, gg, s):
    # y = conv_x_backward(x, w, g): d w = conv_weight_backward(gg, w, g), d g = conv(gg, w).
    _, weight, g = s.inputs
    (options,) = s.attrs
    gw = B.conv_weight_backward(gg, weight, g, options) if s.needs[1] else None
    gg_out = _conv_forward(B, gg, weight, options) if s.needs[2] else None
    return None, gw, gg_out


@backward("conv_weight_backward", keep="inputs")
def _conv_weight_backward(B, gg, s):
    # y = conv_weight_backward(x, w, g): d x = conv_x_backward(x, gg, g), d g = conv(x, gg).
    x, _, g = s.inputs
    (options,) = s.attrs
    gx = B.conv_x_backward(x, gg, g, options) if s.needs[0] else None
    g_out = _conv_forward(B, x, gg, options) if s.needs[2] else None
    return gx, None, g_out
