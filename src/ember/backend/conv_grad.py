"""Generic gradients of the convolutions: the defaults of the conv backward composites.

:class:`ember.backend.Backend` implements ``conv_x_backward``,
``conv_weight_backward``, ``conv_transpose_x_backward`` and
``conv_transpose_weight_backward`` with these functions, from the backend's own
convolutions; a backend with a dedicated kernel overrides them (Torch uses
``aten.convolution_backward``, NdArray its blocked weight gradient). As in Burn's ``ModuleOps``, every function takes
the backend ``B`` and works on its primitives. Convolution gradients are
themselves convolutions:

* input of ``conv``: the transposed convolution of ``g`` with the same weight;
  ``padding_out`` restores the input rows that the forward's floor division
  left out of every window;
* weight of ``conv``: the correlation of the input with ``g``. In 2-d it is the
  product of ``g`` with the unfolded input (``unfold4d``, per block of samples);
  in 3-d one convolution whose batch is the input's channels and whose
  channels are the batch (stride and dilation trade places), groups kept;
* input of ``conv_transpose``: the ordinary convolution of ``g`` with the weight;
* weight of ``conv_transpose``: the weight gradient of a convolution with the
  roles of input and output gradient exchanged.
"""

from __future__ import annotations

import math

from ember.backend.options import ConvOptions, ConvTransposeOptions


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


def weight_grad(B, x, g, kernel, stride, padding, dilation, groups):
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
    if total is None:  # an empty batch
        return B.float_zeros((o, cg, *kernel), B.device_of(x), B.dtype(x))
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


def conv_x_backward(B, x, weight, g, options: ConvOptions):
    """Gradient of ``conv(x, weight)`` for ``x``: a transposed convolution of ``g``."""
    kernel = B.shape(weight)[2:]
    in_spatial, out_spatial = B.shape(x)[2:], B.shape(g)[2:]
    padding_out = tuple(
        size - ((o - 1) * s - 2 * p + d * (k - 1) + 1)
        for size, o, s, p, d, k in zip(
            in_spatial, out_spatial, options.stride, options.padding, options.dilation, kernel
        )
    )
    opts = ConvTransposeOptions(options.stride, options.padding, padding_out, options.dilation, options.groups)
    return _conv_transpose_op(B, len(kernel))(g, weight, None, opts)


def conv_weight_backward(B, x, weight, g, options: ConvOptions):
    """Gradient of ``conv(x, weight)`` for ``weight``."""
    return weight_grad(
        B, x, g, B.shape(weight)[2:], options.stride, options.padding, options.dilation, options.groups
    )


def conv_transpose_x_backward(B, x, weight, g, options: ConvTransposeOptions):
    """Gradient of ``conv_transpose(x, weight)`` for ``x``: the plain convolution of ``g``.

    When ``padding_out`` reaches the stride (allowed if the dilation is larger),
    that convolution has more positions than ``x``: the extra ones are cropped.
    """
    conv_options = ConvOptions(options.stride, options.padding, options.dilation, options.groups)
    nd = len(options.stride)
    return _crop(B, _conv_op(B, nd)(g, weight, None, conv_options), B.shape(x)[2:])


def conv_transpose_weight_backward(B, x, weight, g, options: ConvTransposeOptions):
    """Gradient of ``conv_transpose(x, weight)`` for ``weight``.

    ``y = conv_transpose(x, w)`` means ``x`` is the output gradient of ``conv(y, w)``:
    the weight gradient of that convolution with the roles exchanged.
    """
    return weight_grad(
        B, g, x, B.shape(weight)[2:], options.stride, options.padding, options.dilation, options.groups
    )
