"""The Torch backend's quantized matmuls: PyTorch's int8 kernels (fbgemm / oneDNN on x86,
and ``torch._int_mm``).

For a symmetric int8 weight ``[K, N]`` with one scale, or one per output column, on the
CPU, ``quantized_linear`` runs ``torch.ops.quantized.linear_dynamic``, the kernel of
``torch.ao.quantization.quantize_dynamic``: the input is quantized per call (uint8, the
range reduced to 7 bits as PyTorch does on x86) and multiplied in int8 with int32 sums.
Its results are those of PyTorch's dynamically quantized ``Linear``, which differ from
dequantize-then-matmul by the input's quantization error.

The weight (with the bias) is packed for the kernel once (about 70 ms for 4096 x 4096) and
the packing is kept while the weight's values, scales and bias live (ember tensors never change, so their
identity names their contents). On CUDA the input is quantized per row and multiplied by
``torch._int_mm`` (:func:`linear_dynamic_rows`). Every other case (affine or per-block
schemes, other dtypes) returns None and the backend runs the default (dequantize, then
matmul).

A quantized input by a quantized weight (``integer_linear``) runs ``torch._int_mm``: exact
int32 sums of the int8 values, then the scales (:func:`linear_integer`).
"""

from __future__ import annotations

import warnings

import torch

from ember.backend.kept import Kept
from ember.backend.options import QuantOptions

_kept = Kept()
"""Packed weights and column sums, per weight (see ``ember.backend.kept``)."""


def _engine_ready() -> bool:
    return torch.backends.quantized.engine in ("x86", "fbgemm", "onednn")


def _int8_columns(values, zero_points, options: QuantOptions) -> bool:
    """Whether a weight is what PyTorch's int8 kernels take: symmetric int8 ``[K, N]`` with
    one scale, or one per column."""
    return (zero_points is None and options.block_size is None and values.dim() == 2
            and options.axis in (None, 1) and values.dtype == torch.int8)  # fmt: skip


def linear_dynamic(x, values, scales, zero_points, bias, options: QuantOptions):
    """``x @ weight + bias`` by PyTorch's dynamic int8 kernel, or None where it does not
    apply."""
    if (not _int8_columns(values, zero_points, options)
            or x.dtype != torch.float32 or x.device.type != "cpu" or values.device.type != "cpu"
            or (bias is not None and bias.dtype != torch.float32) or not _engine_ready()):  # fmt: skip
        return None
    packed = _kept.get("linear_prepack", (values, scales, bias), _prepack, options.axis)
    if x.dim() == 2 and x.is_contiguous():
        return torch.ops.quantized.linear_dynamic(x, packed, True)
    k, n = values.shape
    out = torch.ops.quantized.linear_dynamic(x.reshape(-1, k).contiguous(), packed, True)
    return out.reshape(*x.shape[:-1], n)


def linear_integer(values, scales, zero_points, weight, weight_scales, weight_zero_points, bias,
                   input_quant: QuantOptions, options: QuantOptions):  # fmt: skip
    """``dequantize(input) @ dequantize(weight) + bias`` with the products summed exactly in
    int32 by ``torch._int_mm`` (CPU and CUDA), or None where it does not apply: an int8
    input with one scale (and zero point), or one per row of a 2-d input; a symmetric int8
    weight ``[K, N]`` with one scale or one per column.

    ``sum_k (a - z) w = (a @ w) - z * colsum(w)``: the column sums are kept per weight."""
    per_row = input_quant.axis == 0 and input_quant.block_size is None and values.dim() == 2
    if ((input_quant.axis is not None and not per_row) or values.dtype != torch.int8
            or values.dim() < 2 or not _int8_columns(weight, weight_zero_points, options)
            or (values.is_cuda and not _int_mm_fits_cuda(values, weight))):  # fmt: skip
        return None
    k, n = weight.shape
    rows = values.reshape(-1, k)
    sums = torch._int_mm(rows if rows.is_contiguous() else rows.contiguous(), weight)
    if per_row:  # a parameter per row: a column against the output's columns
        scales = scales.reshape(-1, 1)
        zero_points = None if zero_points is None else zero_points.reshape(-1, 1)
    if zero_points is not None:
        column_sums = _kept.get("column_sums", (weight,), lambda w: w.sum(0, dtype=torch.int32))
        sums = sums - zero_points.to(torch.int32) * column_sums
    out = sums.to(torch.float32) * (scales.to(torch.float32) * weight_scales.to(torch.float32))
    if bias is not None:
        out = out + bias
    return out.reshape(*values.shape[:-1], n)


def linear_dynamic_rows(x, values, scales, zero_points, bias, options: QuantOptions):
    """``x @ weight + bias`` with ``x`` quantized per row (symmetric int8, ``max|row| / 127``)
    and the products summed in int32 by ``torch._int_mm``: the CUDA form of dynamic
    quantization (fbgemm's kernel is CPU only), or None where it does not apply (a weight
    other than symmetric int8 ``[K, N]`` per tensor or per column, shapes CUDA's
    ``_int_mm`` refuses)."""
    if (not _int8_columns(values, zero_points, options) or not x.is_floating_point()
            or x.shape[-1] != values.shape[0]
            or (x.is_cuda and not _int_mm_fits_cuda(x, values))):  # fmt: skip
        return None
    k, n = values.shape
    rows = x.reshape(-1, k).to(torch.float32)
    row_scales = rows.abs().amax(1).clamp(min=torch.finfo(torch.float32).eps) / 127
    q = torch.round(rows / row_scales[:, None]).clamp(-127, 127).to(torch.int8)
    out = linear_integer(q, row_scales, None, values, scales, None,
                         None if bias is None else bias.to(torch.float32), _PER_ROW, options)  # fmt: skip
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


_PER_ROW = QuantOptions(axis=0)
"""The layout of a scale per row of a 2-d input."""


def _int_mm_fits_cuda(a, b) -> bool:
    """The shapes CUDA's ``_int_mm`` takes (more than 16 rows, K and N multiples of 8)."""
    k, n = b.shape
    return a.numel() // k > 16 and k % 8 == 0 and n % 8 == 0


def _prepack(values, scales, bias, axis: int | None):
    rows = values.t().contiguous()  # [N, K]: the kernel's weight layout
    with warnings.catch_warnings():  # PyTorch marks its quantized tensor types deprecated
        warnings.simplefilter("ignore", UserWarning)
        if axis is None:
            weight = torch._make_per_tensor_quantized_tensor(rows, float(scales), 0)
        else:
            weight = torch._make_per_channel_quantized_tensor(
                rows, scales.to(torch.float64), torch.zeros(rows.shape[0], dtype=torch.long), 0)
        return torch.ops.quantized.linear_prepack(weight, bias)
