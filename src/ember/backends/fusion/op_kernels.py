"""Compiled kernels for single ops no fuser takes: candidates beside the inner backend's.

Convolution, pooling and matrix products are not element-wise, so they reach the executor
as records that run one by one. On NdArray (whose convolution is an im2col copy and a GEMM)
the numba runtime has direct kernels for them (``numba_conv``, ``numba_pool``): faster on
small channel counts and 3x3 windows, slower on 1x1 convolutions; a GEMM (``numba_gemm``),
faster than NumPy's BLAS where that is held to AVX2 kernels; a linear layer by an int8
weight that the GEMM dequantizes while it packs it (``ember.quantization``); an int8
input by an int8 weight, multiplied in integers (``numba_int8``, its panels packed once per
weight); a join of pieces (a split's gradient) copied into pooled memory by threads; and
a lone sum or mean (``numba_reduce``).
Which one runs is the tuner's choice (``autotune.py``), per op, options and work bucket,
like a fused block's.

Adding an op is one :class:`OpKernel` entry: when it applies (``supports``), what its
choice depends on besides size (``key``), how much work a call is (``work``: the bucket),
and how to run it at a thread count with an allocator for its outputs (``run(args,
threads, empty)``, returning what the inner op returns; ``empty`` is the runtime's pool, so
outputs reuse mapped pages instead of faulting fresh ones in).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.backend.kept import Kept
from ember.backends.fusion.buffers import empty_in_order
from ember.backends.ndarray.layout import contiguous_order

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class OpKernel:
    """A compiled kernel for the op (primitive) ``name``; see the module doc."""

    name: str
    supports: Callable[[list], bool]
    key: Callable[[list], tuple]
    work: Callable[[list], int]
    run: Callable[[list, int, Callable], Any]
    blas: bool = False
    """Whether the inner op is a BLAS call: where the runtime has workers, it runs with the
    BLAS held to one thread (see ``Executor.run_inner``)."""
    fuses: bool = False
    """Whether a fuser takes the op too (a reduction): its records are recorded and fused as
    any others, and the kernel runs only where one runs alone. The other ops' records on
    made operands with small results run at once, as nothing fuses with them."""


def _floats(array: Any) -> bool:
    return type(array) is np.ndarray and array.ndim == 4 and array.dtype in _FLOATS


def _conv_supports(args: list) -> bool:
    x, weight, bias, _ = args
    return (_floats(x) and type(weight) is np.ndarray and weight.dtype == x.dtype
            and (bias is None or (type(bias) is np.ndarray and bias.dtype == x.dtype)))  # fmt: skip


def _conv_key(args: list) -> tuple:
    x, weight, bias, options = args
    return ("conv2d", _dtype_name(x.dtype), weight.shape[1:], bias is None, _fields(options))


def _conv_work(args: list) -> int:
    """Multiply-adds: output elements times the taps of each."""
    x, weight, _, options = args
    out = [(s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in
           zip(x.shape[2:], options.padding, options.dilation, weight.shape[2:], options.stride)]  # fmt: skip
    return x.shape[0] * weight.shape[0] * max(0, math.prod(out)) * math.prod(weight.shape[1:])


def _conv_run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
    from ember.backends.fusion import numba_conv

    return numba_conv.conv2d(*args, threads=threads, empty=empty)


def _conv_grad_supports(args: list) -> bool:
    x, weight, grad, _ = args
    return (_floats(x) and type(weight) is np.ndarray and weight.dtype == x.dtype
            and type(grad) is np.ndarray and grad.dtype == x.dtype)  # fmt: skip


def _conv_grad_key(name: str) -> Callable[[list], tuple]:
    return lambda args: (name, _dtype_name(args[0].dtype), args[1].shape[1:], _fields(args[3]))


def _conv_grad_work(args: list) -> int:
    """Multiply-adds: those of the forward convolution."""
    x, weight, _, options = args
    return _conv_work([x, weight, None, options])


def _conv_x_backward_run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
    from ember.backends.fusion import numba_conv_grad

    return numba_conv_grad.conv2d_x_backward(*args, threads=threads, empty=empty)


def _conv_weight_backward_run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
    from ember.backends.fusion import numba_conv_grad

    return numba_conv_grad.conv2d_weight_backward(*args, threads=threads)


def _pool_supports(args: list) -> bool:
    return _floats(args[0])


def _pool_key(name: str) -> Callable[[list], tuple]:
    return lambda args: (name, _dtype_name(args[0].dtype), _fields(args[1]))


def _pool_work(args: list) -> int:
    x, options = args
    return x.size * math.prod(options.kernel_size)


def _max_pool_run(args: list, threads: int, empty: Callable = np.empty) -> tuple:
    from ember.backends.fusion import numba_pool

    return numba_pool.max_pool2d_with_indices(*args, threads=threads, empty=empty)


def _max_pool_values_run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
    return _max_pool_run(args, threads, empty)[0]


def _avg_pool_run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
    from ember.backends.fusion import numba_pool

    return numba_pool.avg_pool2d(*args, threads=threads, empty=empty)


def _matmul_supports(args: list) -> bool:
    from ember.backends.fusion import numba_gemm

    return numba_gemm.supports(*args)


def _matmul_key(args: list) -> tuple:
    """Rank and which operands are transposed or broadcast matter besides size: they change
    the packing (walked along the other stride) and the batch map; and whether the stack
    is shared out over threads (:func:`_splits`)."""
    a, b = args
    return ("float_matmul", _dtype_name(a.dtype), a.ndim, b.ndim, a.shape[:-2] == b.shape[:-2],
            a.strides[-1] > a.strides[-2], b.strides[-1] > b.strides[-2], _splits(a, b))  # fmt: skip


def _splits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a @ b`` is a stack whose first batch dim :func:`_stacked_matmul` can share
    out over threads (equal batch dims, more than one entry along the first)."""
    return a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2] and a.shape[0] > 1


def _matmul_work(args: list) -> int:
    """Multiply-adds: output elements times the inner dim."""
    a, b = args
    batch = a.shape[:-2]
    if batch != b.shape[:-2]:
        batch = np.broadcast_shapes(batch, b.shape[:-2])
    return math.prod(batch) * a.shape[-2] * b.shape[-1] * a.shape[-1]


# Kernel keys are built on every call of a kernel's op: their parts are cached.
@functools.cache
def _dtype_name(dtype: np.dtype) -> str:
    return dtype.name  # a Python-level property in NumPy: microseconds a call


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _fields(options: Any) -> tuple:
    """``astuple(options)`` of options whose fields are ints and tuples, without its deep
    copies (13 us a call: a tenth of a small convolution)."""
    return tuple([getattr(options, name) for name in _field_names(type(options))])


def _matmul_run(args: list, threads: int, empty: Callable = np.empty,
                bias: np.ndarray | None = None,
                into: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    from ember.backends.fusion import numba_gemm

    a, b = args
    if threads > 1 and _splits(a, b) and bias is None and into is None:
        return _stacked_matmul(a, b, threads, empty)
    if a.ndim > 2 and b.ndim == 2:
        order = contiguous_order(a)
        if order is not None:  # a stack of rows: C-contiguous, or an imported [seq, batch, dim]
            return _rows_matmul(a, b, order, threads, empty, bias, into)
    return numba_gemm.matmul(a, b, threads=threads, empty=empty, bias=bias, into=into)


def matmul_with_bias(args: list, bias: np.ndarray, threads: int, empty: Callable) -> np.ndarray:
    """``a @ b + bias`` for the ``float_matmul`` kernel's ``args`` (``[a, b]``, ``b`` a
    matrix) and a bias ``[N]``: the GEMM's sums start from the bias (``numba_gemm.matmul``),
    so the product is written once, biased.

    Raises:
        KernelUnsupported: a bias the GEMM does not take (another length or dtype).
    """
    return _matmul_run(args, threads, empty, bias)


def matmul_into(args: list, into: np.ndarray, threads: int) -> np.ndarray:
    """``into += a @ b`` for the ``float_matmul`` kernel's ``args`` (``[a, b]``) and an
    ``into`` of the product's shape and dtype, laid out as the product would be (a stack of
    rows' output in the stack's order), the GEMM's sums starting from its values
    (``numba_gemm.matmul``).

    Raises:
        KernelUnsupported: an ``into`` the GEMM cannot add to.
    """
    return _matmul_run(args, threads, into=into)


def _rows_matmul(a: np.ndarray, b: np.ndarray, order: list[int], threads: int,
                 empty: Callable, bias: np.ndarray | None = None,
                 into: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """``a @ b`` (plus ``bias``, or added ``into``) for a matrix ``b`` and an ``a`` whose
    rows are C-contiguous in ``order`` of its dims: one product of all its rows where they
    lie (as NdArray's matmul; by stack entry, ``[8, 128, 256]`` was 8 products with an edge
    strip each, and a ``[128, 8, 256]`` view 128 products of 8 rows, 2-3x slower), into an
    output laid out in the same order."""
    from ember.backends.fusion import numba_gemm

    shape = (*a.shape[:-1], b.shape[-1])
    dtype = a.dtype if a.dtype == b.dtype else np.result_type(a, b)  # 2-5 us a call
    laid = None if order == sorted(order) else tuple(order)
    if into is not None:
        out = into
    elif empty is np.empty:
        out = empty_in_order(shape, dtype, laid)
    else:
        out = empty(shape, dtype) if laid is None else empty(shape, dtype, laid)
    rows = out if laid is None else out.transpose(order)
    if not rows.flags.c_contiguous:  # an ``into`` laid out otherwise
        raise numba_gemm.KernelUnsupported("numba matmul: an output not laid out as the rows")
    a2 = a.transpose(order).reshape(-1, a.shape[-1])
    rows2 = rows.reshape(-1, shape[-1])
    if into is not None:
        numba_gemm.matmul(a2, b, threads=threads, into=rows2)
    else:
        numba_gemm.matmul(a2, b, threads=threads, empty=lambda s, d: rows2, bias=bias)
    return out


def _stacked_matmul(a: np.ndarray, b: np.ndarray, threads: int, empty: Callable) -> np.ndarray:
    """``a @ b`` for stacks of equal batch dims on ``threads`` threads: NumPy's BLAS on each
    thread's share of the stack (split along the first batch dim), held to one thread.

    NumPy calls the BLAS once per matrix of a stack, and OpenBLAS runs a small product (an
    attention head's ``[128, 128] @ [128, 32]``) on one thread or splits it poorly over two;
    whole matrices per thread keep both cores busy. The numba GEMM is slower on these: it
    packs strided head views (measured 2.1-2.5 ms at one thread for what NumPy does in
    0.9). The runtime's workers run the shares (``numba_runtime._run_parts``), so a launch
    costs microseconds where a sleeping thread pool's would cost tens to hundreds."""
    from ember.backends.fusion.numba_runtime import _run_parts
    from ember.backends.ndarray.parallel import blas_held_to_one

    out = empty((*a.shape[:-1], b.shape[-1]), np.result_type(a, b))
    with blas_held_to_one():
        _run_parts(_stacked_share, [a, b, out], min(a.shape[0], 2 * threads))
    return out


def _stacked_share(a: np.ndarray, b: np.ndarray, out: np.ndarray, part: int, parts: int) -> None:
    """Part ``part`` of ``parts`` of :func:`_stacked_matmul`: its run of the first batch dim."""
    stack = a.shape[0]
    rows = slice(stack * part // parts, stack * (part + 1) // parts)
    np.matmul(a[rows], b[rows], out=out[rows])


def _cat_supports(args: list) -> bool:
    pieces = args[0]
    return (len(pieces) > 1 and all(type(p) is np.ndarray for p in pieces)
            and pieces[0].dtype in _FLOATS and all(p.dtype == pieces[0].dtype for p in pieces))  # fmt: skip


def _cat_key(args: list) -> tuple:
    pieces, dim = args
    return ("float_cat", _dtype_name(pieces[0].dtype), pieces[0].ndim, dim, len(pieces))


def _cat_work(args: list) -> int:
    """Elements copied."""
    return sum(p.size for p in args[0])


def _cat_run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
    """``pieces`` joined along ``dim`` into memory from ``empty`` (NumPy's ``concatenate``
    faults fresh pages in: gathering self-attention's three gradients, 6 MB, took 1.3 ms),
    on ``threads`` threads, each copying its share of the output's first dim."""
    from ember.backends.fusion.numba_runtime import _run_parts

    pieces, dim = args
    shape = list(pieces[0].shape)
    dim %= len(shape)
    shape[dim] = sum(p.shape[dim] for p in pieces)
    out = empty(tuple(shape), pieces[0].dtype)
    _run_parts(_cat_share, [pieces, dim, out], max(1, min(threads, shape[0])))
    return out


def _cat_share(pieces: list, dim: int, out: np.ndarray, part: int, parts: int) -> None:
    """Part ``part`` of ``parts`` of :func:`_cat_run`: its run of the output's first dim
    (NumPy's copies let the GIL go, so the parts run side by side)."""
    rows = out.shape[0]
    lo, hi = rows * part // parts, rows * (part + 1) // parts
    if dim:
        np.concatenate([p[lo:hi] for p in pieces], axis=dim, out=out[lo:hi])
        return
    at = 0  # where the piece starts along the joined dim
    for p in pieces:
        start, stop = max(lo, at), min(hi, at + p.shape[0])
        if start < stop:
            np.copyto(out[start:stop], p[start - at : stop - at])
        at += p.shape[0]


def _sum_supports(args: list) -> bool:
    from ember.backends.fusion import numba_reduce

    return numba_reduce.supports(*args)


def _sum_key(name: str) -> Callable[[list], tuple]:
    def key(args: list) -> tuple:
        x, dim = args
        inner = math.prod(x.shape[dim % x.ndim + 1 :])
        # Which kernel (rows in lanes, or columns in order) and how long its loops are.
        return (name, _dtype_name(x.dtype), inner == 1, x.shape[dim].bit_length(),
                inner.bit_length())  # fmt: skip

    return key


def _sum_work(args: list) -> int:
    """Elements read."""
    return args[0].size


def _sum_run(mean: bool) -> Callable[[list, int, Callable], np.ndarray]:
    def run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
        from ember.backends.fusion import numba_reduce

        return numba_reduce.sum_along(args[0], args[1], mean, threads, empty)

    return run


def _quantized_params(args: list) -> tuple | None:
    """The scales and zero points of a quantized linear as ``[KB, NB]`` arrays (see
    ``numba_gemm.matmul_dequantized``), or None for a layout the kernel does not take."""
    _, values, scales, zero_points, _, options = args
    k, n = values.shape
    if options.axis is None:
        shape = (1, 1)
    elif options.block_size is None:
        shape = (k, 1) if options.axis == 0 else (1, n)
    elif options.axis == 0:
        shape = (k // options.block_size, n)
    else:
        return None  # blocks along the output dim
    if type(scales) is not np.ndarray or (zero_points is not None and type(zero_points) is not np.ndarray):
        return None
    return scales.reshape(shape), None if zero_points is None else zero_points.reshape(shape)


def _qlinear_supports(args: list) -> bool:
    from ember.backends.fusion import numba_gemm

    x, values, _, _, bias, _ = args
    return (numba_gemm.supports_dequantized(x, values) and _quantized_params(args) is not None
            and (bias is None or (type(bias) is np.ndarray and bias.dtype == x.dtype)))  # fmt: skip


def _qlinear_key(args: list) -> tuple:
    x, _, _, zero_points, bias, options = args
    return ("quantized_linear", x.ndim, options.axis, options.block_size is None,
            zero_points is None, bias is None)  # fmt: skip


def _qlinear_work(args: list) -> int:
    x, values = args[:2]
    return math.prod(x.shape[:-1]) * values.shape[0] * values.shape[1]


def _qlinear_run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
    from ember.backends.fusion import numba_gemm

    x, values, _, _, bias, _ = args
    scales, zero_points = _quantized_params(args)
    out = numba_gemm.matmul_dequantized(x, values, scales, zero_points, threads, empty)
    if bias is not None:
        np.add(out, bias, out=out)  # the kernel's own new array
    return out


def _ilinear_supports(args: list) -> bool:
    from ember.backends.fusion import numba_int8

    values, scales, zero_points, weight, weight_scales, weight_zps, bias, quant, options = args
    arrays = (scales, weight_scales) + tuple(a for a in (zero_points, bias) if a is not None)
    per_row = quant.axis == 0 and quant.block_size is None and values.ndim == 2
    return (numba_int8.supports(values, weight) and weight_zps is None
            and (quant.axis is None or (per_row and zero_points is None))
            and options.block_size is None and options.axis in (None, 1)
            and all(type(a) is np.ndarray for a in arrays)
            and scales.dtype == weight_scales.dtype == np.float32
            and (bias is None or bias.dtype == np.float32))  # fmt: skip


def _ilinear_key(args: list) -> tuple:
    values, _, zero_points, _, _, _, bias, quant, options = args
    return ("integer_linear", values.ndim, quant.axis, options.axis, zero_points is None,
            bias is None)  # fmt: skip


def _ilinear_work(args: list) -> int:
    values, weight = args[0], args[3]
    return math.prod(values.shape[:-1]) * weight.shape[0] * weight.shape[1]


_packed_weights = Kept()
"""The int8 kernel's weight panels, per weight array (fusion hands a parameter's array again)."""


def _ilinear_run(args: list, threads: int, empty: Callable = np.empty) -> np.ndarray:
    from ember.backends.fusion import numba_int8

    values, scales, zero_points, weight, weight_scales, _, bias, _, _ = args
    packed = _packed_weights.get("int8_panels", (weight,), numba_int8.pack_weight)
    zero_point = 0 if zero_points is None else int(zero_points)
    return numba_int8.linear_int8(values, scales, zero_point, packed, weight_scales, bias,
                                  threads, empty)  # fmt: skip


NDARRAY_KERNELS = {
    k.name: k
    for k in (
        OpKernel("conv2d", _conv_supports, _conv_key, _conv_work, _conv_run),
        OpKernel("conv_x_backward", _conv_grad_supports, _conv_grad_key("conv_x_backward"),
                 _conv_grad_work, _conv_x_backward_run),
        OpKernel("conv_weight_backward", _conv_grad_supports,
                 _conv_grad_key("conv_weight_backward"), _conv_grad_work,
                 _conv_weight_backward_run),
        OpKernel("max_pool2d", _pool_supports, _pool_key("max_pool2d"), _pool_work,
                 _max_pool_values_run),
        OpKernel("max_pool2d_with_indices", _pool_supports, _pool_key("max_pool2d_with_indices"),
                 _pool_work, _max_pool_run),
        OpKernel("avg_pool2d", _pool_supports, _pool_key("avg_pool2d"), _pool_work,
                 _avg_pool_run),
        OpKernel("float_matmul", _matmul_supports, _matmul_key, _matmul_work, _matmul_run,
                 blas=True),
        # Pieces gathered (a split's or a chunk's gradient) into pooled memory, by threads.
        OpKernel("float_cat", _cat_supports, _cat_key, _cat_work, _cat_run),
        # A lone sum or mean (a global average pooling, a bias's gradient), by threads.
        OpKernel("float_sum_dim", _sum_supports, _sum_key("float_sum_dim"), _sum_work,
                 _sum_run(mean=False), fuses=True),
        OpKernel("float_mean_dim", _sum_supports, _sum_key("float_mean_dim"), _sum_work,
                 _sum_run(mean=True), fuses=True),
        # A weight-only quantized linear: the GEMM's packing dequantizes the int8 weight.
        OpKernel("quantized_linear", _qlinear_supports, _qlinear_key, _qlinear_work,
                 _qlinear_run),
        # A quantized input by a quantized weight: int8 products on AVX-512 VNNI.
        OpKernel("integer_linear", _ilinear_supports, _ilinear_key, _ilinear_work,
                 _ilinear_run),
    )
}
"""The compiled candidates of NdArray's ops, by primitive name."""
