"""The Torch backend's quantized matmul: PyTorch's int8 kernels (fbgemm / oneDNN on x86).

For a symmetric int8 weight ``[K, N]`` with one scale, or one per output column, on the
CPU, ``quantized_linear`` runs ``torch.ops.quantized.linear_dynamic``, the kernel of
``torch.ao.quantization.quantize_dynamic``: the input is quantized per call (uint8, the
range reduced to 7 bits as PyTorch does on x86) and multiplied in int8 with int32 sums.
Its results are those of PyTorch's dynamically quantized ``Linear``, which differ from
dequantize-then-matmul by the input's quantization error.

The weight (with the bias) is packed for the kernel once (about 70 ms for 4096 x 4096) and
the packing is kept while the weight's values, scales and bias live (ember tensors never change, so their
identity names their contents). Every other case (affine or per-block schemes, CUDA,
other dtypes) returns None and the backend runs the default (dequantize, then matmul).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import deque
from typing import Any

import torch

from ember.backend.options import QuantOptions

# (ids of values, scales, bias) -> (weak references to them, the packed weight)
_packed: dict[tuple[int, int, int], tuple[tuple, Any]] = {}
_dead: deque[tuple[int, int, int]] = deque()  # keys whose tensors died (see drop)
_lock = threading.Lock()


def _engine_ready() -> bool:
    return torch.backends.quantized.engine in ("x86", "fbgemm", "onednn")


def linear_dynamic(x, values, scales, zero_points, bias, options: QuantOptions):
    """``x @ weight + bias`` by PyTorch's dynamic int8 kernel, or None where it does not
    apply."""
    if (zero_points is not None or options.block_size is not None or values.dim() != 2
            or options.axis not in (None, 1) or values.dtype != torch.int8
            or x.dtype != torch.float32 or x.device.type != "cpu" or values.device.type != "cpu"
            or (bias is not None and bias.dtype != torch.float32) or not _engine_ready()):  # fmt: skip
        return None
    packed = _prepacked(values, scales, bias, options.axis)
    if x.dim() == 2 and x.is_contiguous():
        return torch.ops.quantized.linear_dynamic(x, packed, True)
    k, n = values.shape
    out = torch.ops.quantized.linear_dynamic(x.reshape(-1, k).contiguous(), packed, True)
    return out.reshape(*x.shape[:-1], n)


def _prepacked(values, scales, bias, axis: int | None):
    key = (id(values), id(scales), id(bias))
    with _lock:
        while _dead:
            dead = _dead.popleft()
            entry = _packed.get(dead)
            if entry is not None and any(r is not _NONE and r() is None for r in entry[0]):
                del _packed[dead]  # not a later entry that reuses the ids
        hit = _packed.get(key)
        if hit is not None and all(r() is t for r, t in zip(hit[0], (values, scales, bias))):
            return hit[1]
    rows = values.t().contiguous()  # [N, K]: the kernel's weight layout
    with warnings.catch_warnings():  # PyTorch marks its quantized tensor types deprecated
        warnings.simplefilter("ignore", UserWarning)
        if axis is None:
            weight = torch._make_per_tensor_quantized_tensor(rows, float(scales), 0)
        else:
            weight = torch._make_per_channel_quantized_tensor(
                rows, scales.to(torch.float64), torch.zeros(rows.shape[0], dtype=torch.long), 0)
        packed = torch.ops.quantized.linear_prepack(weight, bias)

    def drop(_ref, key=key) -> None:
        # A weak-reference callback may run inside this module's own locked work (the
        # garbage collector runs anywhere): it takes no lock, the next call purges.
        _dead.append(key)

    refs = tuple(_NONE if t is None else weakref.ref(t, drop) for t in (values, scales, bias))
    with _lock:
        _packed[key] = (refs, packed)
    return packed


def _none() -> None:
    return None


_NONE = _none  # stands for a missing bias: calling it gives None, as a dead reference would
