"""Torch: a backend whose primitives are ``torch.Tensor``s (CPU, CUDA, MPS).

A thin mapping: most primitives are one torch function per op name, installed
for every kind of the op from the tables below; the module ops map to
``torch.nn.functional`` and their backward helpers to the ATen kernels PyTorch
itself uses. No torch autograd runs here: gradients come from ember's own
Autodiff decorator, as Burn's autodiff wraps LibTorch.

Host data moves through TensorData without copies where torch and NumPy can
share memory (CPU tensors). Primitives are never written in place.
"""

from __future__ import annotations

import base64
import math
import threading
import warnings
from collections.abc import Callable

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from ember.backend.base import Backend, DTypeUsage, bind_primitives
from ember.backend.device import Device
from ember.backend.errors import ArgumentError
from ember.backend.options import (
    ConvOptions,
    ConvTransposeOptions,
    InterpolateOptions,
    PadOptions,
    PoolOptions,
    QuantOptions,
)
from ember.tensor.data import TensorData, numpy_dtype
from ember.tensor.distribution import Distribution
from ember.tensor.dtype import DType, Kind

# TensorData buffers are shared read-only; torch warns about that once, but no primitive
# ever writes to its input, so the shared memory is never modified.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)

_TO_TORCH: dict[DType, torch.dtype] = {
    DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16,
    DType.BF16: torch.bfloat16, DType.I64: torch.int64, DType.I32: torch.int32,
    DType.I16: torch.int16, DType.I8: torch.int8, DType.U64: torch.uint64,
    DType.U32: torch.uint32, DType.U16: torch.uint16, DType.U8: torch.uint8, DType.BOOL: torch.bool,
    DType.F8E4M3FN: torch.float8_e4m3fn, DType.F8E4M3FNUZ: torch.float8_e4m3fnuz,
    DType.F8E5M2: torch.float8_e5m2, DType.F8E5M2FNUZ: torch.float8_e5m2fnuz,
}  # fmt: skip
# torch stores these but has almost no kernels for them (no add, compare or index on CPU).
_STORAGE_ONLY = frozenset({DType.U16, DType.U32, DType.U64}) | {
    d for d in _TO_TORCH if d.is_low_precision
}
_FROM_TORCH: dict[torch.dtype, DType] = {v: k for k, v in _TO_TORCH.items()}
# ml_dtypes arrays cross into torch as the raw bytes of a same-width int: (NumPy's int, torch's
# int, the torch dtype) for each.
_BITS_NUMPY: dict[np.dtype, tuple[type, torch.dtype, torch.dtype]] = {
    np.dtype(ml_dtypes.bfloat16): (np.int16, torch.int16, torch.bfloat16),
    **{numpy_dtype(d): (np.uint8, torch.uint8, _TO_TORCH[d]) for d in _TO_TORCH if d.is_low_precision},
}
_BITS_TORCH: dict[torch.dtype, tuple[torch.dtype, np.dtype]] = {
    t: (torch_bits, np_dtype) for np_dtype, (_, torch_bits, t) in _BITS_NUMPY.items()
}
_LONG = torch.int64


def _long(indices: torch.Tensor) -> torch.Tensor:
    # gather, scatter and embedding take int64 indices only.
    return indices if indices.dtype == _LONG else indices.long()


def _mean(x: torch.Tensor, *dim) -> torch.Tensor:
    if x.is_floating_point():
        return torch.mean(x, *dim, **({"keepdim": True} if dim else {}))
    # Int mean truncates toward zero, as NdArray's does.
    total = torch.sum(x, *dim, **({"keepdim": True} if dim else {}), dtype=torch.float64)
    count = x.shape[dim[0]] if dim else x.numel()
    return torch.trunc(total / count).to(x.dtype)


def _trunc_div(a, b):
    return torch.div(a, b, rounding_mode="trunc")


# Element-wise ops: one torch function serves every kind the table gives the op; the
# ``_scalar`` and ``_elem`` forms take a Python number in place of the second tensor.
_ELEMENTWISE: dict[str, Callable] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "remainder": torch.remainder,
    "pow": torch.pow, "atan2": torch.atan2, "neg": torch.neg, "abs": torch.abs,
    "sign": torch.sign, "exp": torch.exp, "log": torch.log, "log1p": torch.log1p,
    "expm1": torch.expm1, "erf": torch.erf, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "recip": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh, "asin": torch.asin,
    "acos": torch.acos, "atan": torch.atan, "round": torch.round, "floor": torch.floor,
    "ceil": torch.ceil, "trunc": torch.trunc, "is_nan": torch.isnan, "is_inf": torch.isinf,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "bitwise_left_shift": torch.bitwise_left_shift,
    "bitwise_right_shift": torch.bitwise_right_shift, "bitwise_not": torch.bitwise_not,
    "and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
    "not": torch.logical_not, "equal": torch.eq, "not_equal": torch.ne, "greater": torch.gt,
    "greater_equal": torch.ge, "lower": torch.lt, "lower_equal": torch.le,
    "max_pair": torch.maximum, "min_pair": torch.minimum,
}  # fmt: skip
# Where the scalar form needs another function than the tensor form.
_SCALAR: dict[str, Callable] = {"max_pair_scalar": torch.clamp_min, "min_pair_scalar": torch.clamp_max}
# Ops whose Float and Int forms differ.
_BY_KIND: dict[str, tuple[Callable, Callable]] = {"div": (torch.div, _trunc_div)}
_REDUCTIONS: dict[str, Callable] = {
    "sum": lambda x: torch.sum(x, dtype=x.dtype),
    "sum_dim": lambda x, d: torch.sum(x, d, keepdim=True, dtype=x.dtype),
    "prod": lambda x: torch.prod(x, dtype=x.dtype),
    "prod_dim": lambda x, d: torch.prod(x, d, keepdim=True, dtype=x.dtype),
    "mean": _mean,
    "mean_dim": _mean,
    "max": torch.amax, "min": torch.amin,
    "max_dim": lambda x, d: torch.amax(x, d, keepdim=True),
    "min_dim": lambda x, d: torch.amin(x, d, keepdim=True),
    "argmax": lambda x, d: torch.argmax(x, d, keepdim=True),
    "argmin": lambda x, d: torch.argmin(x, d, keepdim=True),
    # torch.any / all of uint8 give uint8
    "any": lambda x: torch.any(x).bool(), "all": lambda x: torch.all(x).bool(),
    "any_dim": lambda x, d: torch.any(x, d, keepdim=True).bool(),
    "all_dim": lambda x, d: torch.all(x, d, keepdim=True).bool(),
    "cumsum": lambda x, d: torch.cumsum(x, d, dtype=x.dtype),
    "cumprod": lambda x, d: torch.cumprod(x, d, dtype=x.dtype),
}  # fmt: skip

_GENERATORS: dict[tuple[str, int], torch.Generator] = {}
_GENERATOR_LOCK = threading.Lock()
_PAD_MODE = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}
_aten = torch.ops.aten


def _pad_trailing(x: torch.Tensor, pads: list[tuple[int, int]], mode: str) -> torch.Tensor:
    """Reflect or replicate padding of the last ``len(pads)`` (at most 3) dims of ``x``."""
    # torch's reflect / replicate pad the trailing dims of a [N, C, ...] input.
    lead = x.shape[: x.dim() - len(pads)]
    y = x.reshape((1, -1) + tuple(x.shape[len(lead) :]))
    y = F.pad(y, [side for pair in reversed(pads) for side in pair], _PAD_MODE[mode])
    return y.reshape(tuple(lead) + tuple(y.shape[2:]))


def _int_matmul_by_blocks(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Integer matmul where torch has no kernel (CUDA): products summed over blocks of k.

    Integer arithmetic wraps on overflow here exactly as the CPU kernel's does, which a
    detour through float64 would not. Each block's products are bounded to 2**24 elements.
    """
    *batch_a, m, k = a.shape
    *batch_b, _, n = b.shape
    dtype = torch.promote_types(a.dtype, b.dtype)
    out = torch.zeros((*torch.broadcast_shapes(tuple(batch_a), tuple(batch_b)), m, n),
                      dtype=dtype, device=a.device)  # fmt: skip
    rows = max(1, math.prod(out.shape[:-1]) * n)
    block = max(1, (1 << 24) // rows)
    for start in range(0, k, block):
        lhs = a[..., start:start + block].unsqueeze(-1)
        rhs = b[..., start:start + block, :].unsqueeze(-3)
        out += (lhs * rhs).sum(-2, dtype=dtype)
    return out


def _conv_backward(x, weight, grad, o, transposed: bool, padding_out, which: int):
    """Gradient ``which`` (0: input, 1: weight) of a (transposed) convolution."""
    mask = [which == 0, which == 1, False]
    out = torch.ops.aten.convolution_backward(
        grad, x, weight, None, list(o.stride), list(o.padding), list(o.dilation), transposed,
        list(padding_out), o.groups, mask,
    )  # fmt: skip
    return out[which]


# Below this many elements torch.where's one call beats the three of the bitwise select.
_BITWISE_SELECT_MIN = 4096
_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def select(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.where(mask, a, b)`` for ``a`` and ``b`` of one dtype, bit for bit; on the CPU
    without branches.

    torch.where's CPU kernel branches per element: on a mask with no pattern (a ReLU's)
    it runs about three times slower than on a uniform one, slower than the integer passes
    of ``b ^ ((a ^ b) * mask)`` (``b * ~mask`` for a zero fill) used here, as
    NdArray does. GPUs select without branching: they keep torch.where.
    """
    if (
        a.device.type != "cpu"
        or a.dtype != b.dtype
        or max(mask.numel(), a.numel(), b.numel()) < _BITWISE_SELECT_MIN
    ):
        return torch.where(mask, a, b)
    ints = _SAME_SIZE_INT[a.element_size()]
    # Integer products by the mask's 0 / 1 are exact: bits * 1 keeps them, bits * 0 clears
    # them. In place where the left operand already has the result's shape
    # (torch.broadcast_shapes would cost more than a pass over 40k elements).
    bi = b.view(ints)
    if a.dim() == 0 and not a.view(ints).item():  # a zero fill (a ReLU's gradient): b * ~mask
        return (bi * ~mask).view(a.dtype)
    t = a.view(ints) ^ bi
    t = t.mul_(mask) if t.shape == mask.shape else t * mask
    return t.bitwise_xor_(bi).view(a.dtype)


class Torch(Backend):
    """The PyTorch backend: ``cpu``, ``cuda:N`` and (where torch has it) ``mps`` devices.

    Example:
        >>> import ember
        >>> ember.device("torch").backend.name
        'torch'
    """

    name = "torch"
    places = ("cpu", "cuda", "mps")

    def __init__(self, float_dtype: DType | str = DType.F32, int_dtype: DType | str = DType.I64):
        super().__init__(float_dtype, int_dtype)
        self._torch_devices: dict[tuple[str, int], torch.device] = {}

    # ------------------------------------------------------------ devices
    def device_count(self, place: str = "cpu") -> int:
        if place == "cpu":
            return 1
        if place == "cuda":
            return torch.cuda.device_count()
        if place == "mps":
            return int(torch.backends.mps.is_available())
        return 0

    def torch_device(self, device: Device) -> torch.device:
        """The ``torch.device`` of an ember device."""
        key = (device.place, device.index)
        found = self._torch_devices.get(key)
        if found is None:
            found = torch.device("cpu") if device.place == "cpu" else torch.device(device.place, device.index)
            self._torch_devices[key] = found
        return found

    def device_of(self, x: torch.Tensor) -> Device:
        place = x.device.type
        return Device(self, place, x.device.index or 0)

    def seed(self, device: Device, seed: int) -> None:
        generator = torch.Generator(device=self.torch_device(device))
        generator.manual_seed(seed)
        with _GENERATOR_LOCK:
            _GENERATORS[(device.place, device.index)] = generator

    def rng_state(self, device: Device) -> str:
        state = self._generator(device).get_state()
        return base64.b64encode(state.numpy().tobytes()).decode("ascii")

    def set_rng_state(self, device: Device, state: str) -> None:
        generator = torch.Generator(device=self.torch_device(device))
        try:
            raw = np.frombuffer(base64.b64decode(state, validate=True), dtype=np.uint8)
            generator.set_state(torch.from_numpy(raw.copy()))
        except (ValueError, RuntimeError) as error:
            raise ArgumentError(f"torch: not a random generator state for {device} ({error})") from None
        with _GENERATOR_LOCK:
            _GENERATORS[(device.place, device.index)] = generator

    def _generator(self, device: Device) -> torch.Generator:
        key = (device.place, device.index)
        with _GENERATOR_LOCK:
            if key not in _GENERATORS:
                generator = torch.Generator(device=self.torch_device(device))
                generator.seed()  # unseeded devices draw a fresh seed, like NumPy's default_rng()
                _GENERATORS[key] = generator
            return _GENERATORS[key]

    def sync(self, device: Device) -> None:
        if device.place == "cuda":
            torch.cuda.synchronize(self.torch_device(device))
        elif device.place == "mps":
            torch.mps.synchronize()

    def dtype_usage(self, device: Device, dtype: DType) -> DTypeUsage:
        if dtype in _STORAGE_ONLY:
            return DTypeUsage.STORAGE
        if dtype not in _TO_TORCH:
            return DTypeUsage(0)  # float8_e8m0fnu, float4 and 2/4-bit ints: no torch dtype
        usage = DTypeUsage.general()
        if device.place == "cuda":
            if dtype is DType.BF16 and not torch.cuda.is_bf16_supported():
                return DTypeUsage.STORAGE
            if dtype in (DType.F32, DType.F16, DType.BF16):
                usage |= DTypeUsage.ACCELERATED
        elif device.place == "mps" and dtype is DType.F64:
            return DTypeUsage(0)  # Metal has no float64
        elif dtype in (DType.F32, DType.F64):
            usage |= DTypeUsage.ACCELERATED
        return usage

    # ------------------------------------------------------------ metadata
    def shape(self, x: torch.Tensor) -> tuple[int, ...]:
        return tuple(x.shape)

    def dtype(self, x: torch.Tensor) -> DType:
        return _FROM_TORCH[x.dtype]

    # ------------------------------------------------------------ creation and data
    def _from_data(self, data: TensorData, device: Device) -> torch.Tensor:
        array = data.buffer()
        bits = _BITS_NUMPY.get(array.dtype)
        if bits is not None:
            tensor = torch.from_numpy(array.view(bits[0])).view(bits[2])
        else:
            tensor = torch.from_numpy(array)
        return tensor if device.place == "cpu" else tensor.to(self.torch_device(device))

    def _into_data(self, x: torch.Tensor) -> TensorData:
        x = x.detach().cpu().contiguous()  # no copy for contiguous CPU tensors
        bits = _BITS_TORCH.get(x.dtype)
        if bits is not None:
            return TensorData._wrap(x.view(bits[0]).numpy().view(bits[1]))
        return TensorData._wrap(x.numpy())

    def _to_device(self, x: torch.Tensor, device: Device) -> torch.Tensor:
        return x.to(self.torch_device(device))

    def _empty(self, shape, device, dtype: DType) -> torch.Tensor:
        return torch.empty(shape, dtype=_TO_TORCH[dtype], device=self.torch_device(device))

    def _full(self, shape, value, device, dtype: DType) -> torch.Tensor:
        return torch.full(shape, value, dtype=_TO_TORCH[dtype], device=self.torch_device(device))

    def _cast(self, x: torch.Tensor, dtype: DType) -> torch.Tensor:
        return x.to(_TO_TORCH[dtype])

    def float_random(self, shape, distribution: Distribution, device, dtype: DType) -> torch.Tensor:
        generator, target = self._generator(device), self.torch_device(device)
        kind, a, b = distribution.kind, distribution.a, distribution.b
        if kind == "normal":
            out = torch.randn(shape, generator=generator, device=target, dtype=torch.float64) * b + a
        else:
            out = torch.rand(shape, generator=generator, device=target, dtype=torch.float64)
            if kind == "bernoulli":
                out = (out < a).double()
            elif kind == "uniform":
                out = out * (b - a) + a
        result = out.to(_TO_TORCH[dtype])
        if kind in ("default", "uniform"):
            # Rounding to a narrow dtype (f16, bf16) can reach ``high``: keep [low, high) half-open.
            high = torch.tensor(1.0 if kind == "default" else b, dtype=result.dtype, device=target)
            low = torch.tensor(0.0 if kind == "default" else a, dtype=result.dtype, device=target)
            result = torch.minimum(result, torch.nextafter(high, low))
        return result

    def int_random(self, shape, distribution: Distribution, device, dtype: DType) -> torch.Tensor:
        """Int sampling, as NdArray: Default a fair 0/1 coin, Uniform integers in [low, high),
        Bernoulli 0/1, Normal rounded to the nearest integer."""
        generator, target = self._generator(device), self.torch_device(device)
        kind, a, b = distribution.kind, distribution.a, distribution.b
        if kind == "uniform":
            low, high = int(np.ceil(a)), int(np.ceil(b))
            out = torch.randint(low, high, shape, generator=generator, device=target)
        elif kind == "normal":
            out = torch.round(torch.randn(shape, generator=generator, device=target, dtype=torch.float64) * b + a)
        elif kind == "bernoulli":
            out = torch.rand(shape, generator=generator, device=target) < a
        else:
            out = torch.randint(0, 2, shape, generator=generator, device=target)
        return out.to(_TO_TORCH[dtype])

    def int_arange(self, start: int, end: int, step: int, device, dtype: DType) -> torch.Tensor:
        if (end - start) * step <= 0:  # torch rejects a step pointing away from the end
            return torch.empty(0, dtype=_TO_TORCH[dtype], device=self.torch_device(device))
        return torch.arange(start, end, step, dtype=_TO_TORCH[dtype], device=self.torch_device(device))

    # ------------------------------------------------------------ element-wise
    def _clamp(self, x, low, high):
        return torch.clamp(x, low, high)

    def _mask_where(self, x, mask, value):
        return select(mask, value, x)

    def _mask_fill(self, x, mask, value):
        return select(mask, torch.tensor(value, dtype=x.dtype, device=x.device), x)

    # ------------------------------------------------------------ sorting
    def _sort_with_indices(self, x, dim: int, descending: bool):
        values, indices = torch.sort(x, dim=dim, descending=descending, stable=True)
        return values, indices

    # ------------------------------------------------------------ layout
    def _reshape(self, x, shape):
        return torch.reshape(x, shape)

    def _permute(self, x, axes):
        return torch.permute(x, axes)

    def _expand(self, x, shape):
        return x.expand(shape)

    def _flip(self, x, axes):
        return torch.flip(x, axes) if axes else x

    def _slice(self, x, ranges):
        return x[tuple(slice(start, stop, step) for start, stop, step in ranges)]

    def _slice_assign(self, x, values, ranges):
        out = x.clone()
        out[tuple(slice(start, stop, step) for start, stop, step in ranges)] = values
        return out

    def _cat(self, tensors, dim):
        return torch.cat(tensors, dim)

    def _repeat_dim(self, x, dim, times):
        reps = [1] * x.dim()
        reps[dim] = times
        return x.repeat(reps)

    def bool_argwhere(self, x):
        return torch.argwhere(x)

    # ------------------------------------------------------------ indexing
    def _gather(self, x, indices, dim):
        return torch.gather(x, dim, _long(indices))

    def _scatter_add(self, x, indices, values, dim):
        return x.scatter_add(dim, _long(indices), values)

    def _select(self, x, indices, dim):
        return torch.index_select(x, dim, _long(indices))

    def _select_assign(self, x, indices, values, dim):
        return x.index_add(dim, _long(indices), values)

    def _matmul(self, a, b):
        if a.is_cuda and not a.is_floating_point():
            return _int_matmul_by_blocks(a, b)
        return torch.matmul(a, b)

    def quantized_linear(self, x, values, scales, zero_points, bias, options: QuantOptions):
        from ember.backends.torch.quantized import linear_dynamic, linear_dynamic_rows

        dynamic = linear_dynamic_rows if x.is_cuda else linear_dynamic
        out = dynamic(x, values, scales, zero_points, bias, options)
        if out is None:  # not a case PyTorch's int8 kernels take
            return super().quantized_linear(x, values, scales, zero_points, bias, options)
        return out

    def integer_linear(self, values, scales, zero_points, weight, weight_scales,
                       weight_zero_points, bias, input_quant: QuantOptions, options: QuantOptions):  # fmt: skip
        from ember.backends.torch.quantized import linear_integer

        args = (values, scales, zero_points, weight, weight_scales, weight_zero_points, bias)
        out = linear_integer(*args, input_quant, options)
        if out is None:  # not a case _int_mm takes
            return super().integer_linear(*args, input_quant, options)
        return out

    # ------------------------------------------------------------ module ops
    def conv2d(self, x, weight, bias, o: ConvOptions):
        return F.conv2d(x, weight, bias, o.stride, o.padding, o.dilation, o.groups)

    def conv3d(self, x, weight, bias, o: ConvOptions):
        return F.conv3d(x, weight, bias, o.stride, o.padding, o.dilation, o.groups)

    def conv_transpose2d(self, x, weight, bias, o: ConvTransposeOptions):
        return F.conv_transpose2d(x, weight, bias, o.stride, o.padding, o.padding_out, o.groups, o.dilation)

    def conv_transpose3d(self, x, weight, bias, o: ConvTransposeOptions):
        return F.conv_transpose3d(x, weight, bias, o.stride, o.padding, o.padding_out, o.groups, o.dilation)

    # aten.convolution_backward, the kernel torch autograd runs; the mask picks one gradient.
    def conv_x_backward(self, x, weight, grad, o: ConvOptions):
        return _conv_backward(x, weight, grad, o, False, (0,) * len(o.stride), 0)

    def conv_weight_backward(self, x, weight, grad, o: ConvOptions):
        return _conv_backward(x, weight, grad, o, False, (0,) * len(o.stride), 1)

    def conv_transpose_x_backward(self, x, weight, grad, o: ConvTransposeOptions):
        return _conv_backward(x, weight, grad, o, True, o.padding_out, 0)

    def conv_transpose_weight_backward(self, x, weight, grad, o: ConvTransposeOptions):
        return _conv_backward(x, weight, grad, o, True, o.padding_out, 1)

    def unfold4d(self, x, kernel_size, o: ConvOptions):
        return F.unfold(x, kernel_size, o.dilation, o.padding, o.stride)

    def avg_pool2d(self, x, o: PoolOptions):
        return F.avg_pool2d(x, o.kernel_size, o.stride, o.padding, o.ceil_mode, o.count_include_pad)

    def avg_pool2d_backward(self, x, grad, o: PoolOptions):
        return _aten.avg_pool2d_backward(grad, x, o.kernel_size, o.stride, o.padding, o.ceil_mode,
                                         o.count_include_pad, None)  # fmt: skip

    def max_pool2d_with_indices(self, x, o: PoolOptions):
        return F.max_pool2d(x, o.kernel_size, o.stride, o.padding, o.dilation, o.ceil_mode, return_indices=True)

    def max_pool2d_with_indices_backward(self, x, grad, indices, o: PoolOptions):
        return _aten.max_pool2d_with_indices_backward(grad, x, o.kernel_size, o.stride, o.padding,
                                                      o.dilation, o.ceil_mode, indices)  # fmt: skip

    def adaptive_avg_pool2d(self, x, output_size):
        return F.adaptive_avg_pool2d(x, output_size)

    def adaptive_avg_pool2d_backward(self, x, grad):
        return _aten._adaptive_avg_pool2d_backward(grad, x)

    def adaptive_max_pool2d(self, x, output_size):
        return F.adaptive_max_pool2d(x, output_size)

    def embedding(self, weights, indices):
        return F.embedding(_long(indices), weights)

    def embedding_backward(self, weights, grad, indices):
        return _aten.embedding_dense_backward(grad, _long(indices), weights.shape[0], -1, False)

    def interpolate(self, x, output_size, o: InterpolateOptions):
        if o.mode == "nearest":
            return F.interpolate(x, size=output_size, mode="nearest")
        return F.interpolate(x, size=output_size, mode=o.mode, align_corners=o.align_corners)

    def interpolate_backward(self, x, grad, output_size, o: InterpolateOptions):
        size = list(output_size)
        if o.mode == "nearest":
            return _aten.upsample_nearest2d_backward(grad, size, list(x.shape), None, None)
        backward = _aten.upsample_bilinear2d_backward if o.mode == "bilinear" else _aten.upsample_bicubic2d_backward
        return backward(grad, size, list(x.shape), o.align_corners, None, None)

    def _pad(self, x, o: PadOptions):
        flat = [side for pair in reversed(o.pads) for side in pair]
        if o.mode == "constant":
            return F.pad(x, flat, "constant", o.value)
        pads = list(o.pads)
        while pads and pads[0] == (0, 0):
            pads.pop(0)
        if len(pads) > 3:
            # torch reflects / replicates at most 3 trailing dims; both modes are separable,
            # so the dims are padded one at a time.
            first = x.dim() - len(pads)
            for offset, pair in enumerate(pads):
                if pair != (0, 0):
                    dim = first + offset
                    y = _pad_trailing(x.movedim(dim, -1), [pair], o.mode)
                    x = y.movedim(-1, dim)
            return x
        return _pad_trailing(x, pads, o.mode) if pads else x

    # ------------------------------------------------------------ faster composites
    def relu(self, x):
        return torch.relu(x)

    def leaky_relu(self, x, negative_slope: float = 0.01):
        return F.leaky_relu(x, negative_slope)

    def leaky_relu_backward(self, x, grad, negative_slope: float = 0.01):
        return _aten.leaky_relu_backward(grad, x, negative_slope, False)

    def sigmoid(self, x):
        return torch.sigmoid(x)

    def gelu(self, x):
        return F.gelu(x)

    def gelu_tanh(self, x):
        return F.gelu(x, approximate="tanh")

    def silu(self, x):
        return F.silu(x)

    def softmax(self, x, dim):
        return torch.softmax(x, dim)

    def log_softmax(self, x, dim):
        return torch.log_softmax(x, dim)

    def layer_norm(self, x, weight, bias, epsilon: float):
        return F.layer_norm(x, x.shape[-1:], weight, bias, epsilon)


def _kernel_for(op, kind, base: str) -> Callable | None:
    if op.name in _SCALAR:
        return _SCALAR[op.name]
    if base in _ELEMENTWISE:
        return _ELEMENTWISE[base]
    if base in _BY_KIND:
        return _BY_KIND[base][kind is Kind.INT]
    return _REDUCTIONS.get(op.name)


bind_primitives(Torch, _kernel_for)
