"""Backward rules of the module ops: convolutions, pooling, resampling and embedding.

Convolution gradients are themselves convolutions:

* input of ``conv``: the transposed convolution of ``g`` with the same weight;
  ``padding_out`` restores the input rows that the forward's floor division
  left out of every window;
* weight of ``conv``: the correlation of the input with ``g``. In 2-d it is the
  product of ``g`` with the unfolded input (``unfold4d``, per block of samples);
  in 3-d one convolution whose batch is the input's channels and whose
  channels are the batch (stride and dilation trade places), groups kept;
* input of ``conv_transpose``: the ordinary convolution of ``g`` with the weight;
* weight of ``conv_transpose``: the weight gradient of a convolution with the
  roles of input and output gradient exchanged;
* bias: ``g`` summed over batch and spatial dims.

The 1-d ops and ``unfold4d`` are composites of the 2-d ops and need no rule.
"""

from __future__ import annotations

import math

from ember.backend.options import ConvOptions, ConvTransposeOptions
from ember.backends.autodiff.rule import backward, zeros
from ember.tensor.data import TensorData
from ember.tensor.dtype import DType


# ------------------------------------------------------------------ convolution helpers
def _conv_op(B, nd: int):
    return B.conv2d if nd == 2 else B.conv3d


def _conv_transpose_op(B, nd: int):
    return B.conv_transpose2d if nd == 2 else B.conv_transpose3d


def _crop(B, x, sizes: tuple[int, ...]):
    """The leading ``sizes`` of the spatial dims of ``x`` (``x`` itself when it fits)."""
    shape = B.shape(x)
    if shape[2:] == tuple(sizes):
        return x
    return B.float_slice(x, ((0, shape[0], 1), (0, shape[1], 1), *((0, s, 1) for s in sizes)))


def _bias_grad(B, g):
    """``g`` ``[N, C, *S]`` summed over every dim but the channels: ``[C]``."""
    n, c = B.shape(g)[:2]
    flat = B.float_reshape(g, (n, c, math.prod(B.shape(g)[2:])))
    return B.float_reshape(B.float_sum_dim(B.float_sum_dim(flat, 2), 0), (c,))


def _weight_grad(B, x, g, kernel, stride, padding, dilation, groups):
    """Gradient of ``conv(x, w)`` for ``w`` ``[O, C / groups, *kernel]`` given ``g`` ``[N, O, *S_out]``."""
    if len(kernel) == 2:
        return _weight_grad_unfold(B, x, g, kernel, stride, padding, dilation, groups)
    return _weight_grad_conv(B, x, g, kernel, stride, padding, dilation, groups)


# Bytes of unfolded input per block of samples in _weight_grad_unfold.
_UNFOLD_BLOCK_BYTES = 16 << 20


def _weight_grad_unfold(B, x, g, kernel, stride, padding, dilation, groups):
    """The 2-d weight gradient as ``g`` times the unfolded input, summed over samples.

    ``dw[o, (c, k)] = sum_n g[n, o, :] . unfold(x)[n, (c, k), :]`` is one batched
    matrix product per block of samples (groups are a batch dim of it). The
    unfolded input is ``kernel`` times the input, so samples go in blocks of
    about :data:`_UNFOLD_BLOCK_BYTES`. Measured on the guide's shapes, this beats
    the equivalent convolution with batch and channels exchanged (whose output is
    only the kernel's size) by 2 to 5 times on NdArray and matches it on Torch.
    """
    n, c, h, w = B.shape(x)
    o, out_h, out_w = B.shape(g)[1:]
    cg, og, taps, length = c // groups, o // groups, kernel[0] * kernel[1], out_h * out_w
    options = ConvOptions(tuple(stride), tuple(padding), tuple(dilation), 1)
    # The windows unfold4d makes; more than g's positions only under a transposed
    # convolution's padding_out (see the crop below).
    rows = tuple(
        (size + 2 * p - d * (k - 1) - 1) // st + 1
        for size, k, st, p, d in zip((h, w), kernel, stride, padding, dilation)
    )
    per_sample = c * taps * math.prod(rows) * B.dtype(x).itemsize
    block = max(1, min(n, _UNFOLD_BLOCK_BYTES // max(per_sample, 1)))
    total = None
    for start in range(0, n, block):
        stop = min(n, start + block)
        xs, gs = x, g
        if block < n:
            xs = B.float_slice(x, ((start, stop, 1), (0, c, 1), (0, h, 1), (0, w, 1)))
            gs = B.float_slice(g, ((start, stop, 1), (0, o, 1), (0, out_h, 1), (0, out_w, 1)))
        cols = B.unfold4d(xs, tuple(kernel), options)  # [m, C * taps, L]
        m = stop - start
        if rows != (out_h, out_w):
            # A transposed convolution's padding_out can leave windows past g's end.
            cols = B.float_reshape(cols, (m, c * taps, *rows))
            cols = B.float_slice(cols, ((0, m, 1), (0, c * taps, 1), (0, out_h, 1), (0, out_w, 1)))
            cols = B.float_reshape(cols, (m, c * taps, length))
        cols = B.float_permute(B.float_reshape(cols, (m, groups, cg * taps, length)), (0, 1, 3, 2))
        part = B.float_matmul(B.float_reshape(gs, (m, groups, og, length)), cols)  # [m, G, O/G, C/G * taps]
        part = B.float_sum_dim(part, 0)
        total = part if total is None else B.float_add(total, part)
    return B.float_reshape(total, (o, cg, *kernel))


def _weight_grad_conv(B, x, g, kernel, stride, padding, dilation, groups):
    """The weight gradient as one convolution.

    ``dw[o, c, k] = sum_{n, i} g[n, o, i] x[n, group(o) * C/groups + c, i * stride + k * dilation - padding]``:
    a convolution of ``x`` with channels and batch exchanged (``[C/groups, groups * N, *S]``)
    by the weight ``g`` with channels and batch exchanged (``[O, N, *S_out]``), with
    ``groups`` groups, stride ``dilation`` and dilation ``stride``. Its output
    ``[C/groups, O, *K']`` covers at least the kernel (``K' > kernel`` when the
    forward's floor division dropped trailing input rows) and is cropped to it.
    """
    nd = len(kernel)
    x_shape, g_shape = B.shape(x), B.shape(g)
    n, c, spatial = x_shape[0], x_shape[1], x_shape[2:]
    o, out_spatial = g_shape[1], g_shape[2:]
    tail = tuple(range(3, 3 + nd))
    if groups == 1:
        xt = B.float_permute(x, (1, 0, *range(2, 2 + nd)))
        gt = B.float_permute(g, (1, 0, *range(2, 2 + nd)))
    else:
        cg, og = c // groups, o // groups
        xt = B.float_reshape(x, (n, groups, cg, *spatial))
        xt = B.float_reshape(B.float_permute(xt, (2, 1, 0, *tail)), (cg, groups * n, *spatial))
        gt = B.float_reshape(g, (n, groups, og, *out_spatial))
        gt = B.float_reshape(B.float_permute(gt, (1, 2, 0, *tail)), (o, n, *out_spatial))
    options = ConvOptions(tuple(dilation), tuple(padding), tuple(stride), groups)
    dw = _crop(B, _conv_op(B, nd)(xt, gt, None, options), tuple(kernel))  # [C/groups, O, *kernel]
    return B.float_permute(dw, (1, 0, *range(2, 2 + nd)))


def _conv_input_grad(B, g, weight, in_spatial, options: ConvOptions):
    """Gradient of ``conv(x, weight)`` for ``x`` of spatial size ``in_spatial``."""
    kernel = B.shape(weight)[2:]
    out_spatial = B.shape(g)[2:]
    padding_out = tuple(
        size - ((o - 1) * s - 2 * p + d * (k - 1) + 1)
        for size, o, s, p, d, k in zip(
            in_spatial, out_spatial, options.stride, options.padding, options.dilation, kernel
        )
    )
    opts = ConvTransposeOptions(options.stride, options.padding, padding_out, options.dilation, options.groups)
    return _conv_transpose_op(B, len(kernel))(g, weight, None, opts)


def _conv(B, g, s):
    x, weight, _bias = s.inputs
    (options,) = s.attrs
    # The first layer's images need no gradient: skip the transposed convolution.
    gx = _conv_input_grad(B, g, weight, s.shapes[0][2:], options) if s.needs[0] else None
    gw = None if not s.needs[1] else _weight_grad(
        B, x, g, s.shapes[1][2:], options.stride, options.padding, options.dilation, options.groups
    )
    gb = None if s.shapes[2] is None else _bias_grad(B, g)
    return gx, gw, gb


def _conv_transpose(B, g, s):
    x, weight, _bias = s.inputs
    (options,) = s.attrs
    nd = len(options.stride)
    conv_options = ConvOptions(options.stride, options.padding, options.dilation, options.groups)
    # The input gradient is the plain convolution of g. When padding_out reaches the
    # stride (allowed if the dilation is larger), that convolution has more
    # positions than x: the extra ones are cropped.
    gx = _crop(B, _conv_op(B, nd)(g, weight, None, conv_options), s.shapes[0][2:])
    # y = conv_transpose(x, w) means x is the output gradient of conv(y, w): exchange roles.
    gw = _weight_grad(
        B, g, x, s.shapes[1][2:], options.stride, options.padding, options.dilation, options.groups
    )
    gb = None if s.shapes[2] is None else _bias_grad(B, g)
    return gx, gw, gb


backward("conv2d", "conv3d", keep="inputs")(_conv)
backward("conv_transpose2d", "conv_transpose3d", keep="inputs")(_conv_transpose)


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
