"""NdArray: the default CPU backend, on NumPy.

Primitives are ``numpy.ndarray``s. Most primitives are a NumPy function per op
name, installed for every kind of the op from the tables below; the rest are
written out where NumPy needs help (stable descending sort, truncating integer
division, gather with a smaller index, ...). The module ops (convolution,
pooling, resampling) live in ``conv.py``, ``pool.py`` and ``resample.py``.

Arrays are never written in place: views (reshape, permute, expand, slice)
share buffers freely because no primitive mutates its input.
"""

from __future__ import annotations

import json
import math
import operator
import threading
import warnings
from collections.abc import Callable

import ml_dtypes
import numpy as np

from ember.backend.base import Backend, DTypeUsage, bind_primitives
from ember.backend.device import Device
from ember.backend.errors import ArgumentError
from ember.backends.ndarray import conv, pool, resample
from ember.backends.ndarray.layout import MIN_ELEMENTS, contiguous_order, match_layout
from ember.backends.ndarray.special import erf
from ember.tensor.data import TensorData, cast_array, dtype_of_numpy, numpy_dtype
from ember.tensor.distribution import Distribution
from ember.tensor.dtype import DType, Kind

# NumPy warns on overflow, 0/0, log(0), NaN comparisons...; PyTorch returns inf and NaN
# silently, and so does ember. The filter covers only warnings raised from this package,
# at no cost per op (np.errstate would cost about a microsecond per call).
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"ember\.backends\.ndarray")

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_LOW_PRECISION = (_F16, _BF16)


def _array(out) -> np.ndarray:
    # NumPy returns scalars for 0-d results; primitives are always arrays.
    return out if type(out) is np.ndarray else np.asarray(out)


def _in_f32(fn: Callable) -> Callable:
    """Runs ``fn`` in float32 for f16/bf16 inputs, as PyTorch's CPU kernels accumulate."""

    def run(x, *args):
        if x.dtype in _LOW_PRECISION:
            return np.asarray(fn(x.astype(_F32), *args)).astype(x.dtype)
        return fn(x, *args)

    return run


# Below this many elements np.where's one call beats the three of the bitwise select.
_BITWISE_SELECT_MIN = 4096
_SAME_SIZE_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def select(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.where(mask, a, b)`` for ``a`` and ``b`` of one dtype (broadcast together), bit
    for bit, without branches.

    NumPy's (and PyTorch's CPU) ``where`` branches per element: on a mask with no pattern
    (a ReLU's, half of it True at random) it runs about three times slower than on a
    uniform one, slower than five arithmetic passes. The select here is integer passes,
    independent of the mask: the values as integers of their size,
    ``b ^ ((a ^ b) * mask)``, and ``b * ~mask`` for a zero fill.
    """
    if max(mask.size, a.size, b.size) < _BITWISE_SELECT_MIN or a.dtype != b.dtype:
        return np.where(mask, a, b)
    ints = _SAME_SIZE_INT[a.dtype.itemsize]
    # Integer products by the mask's 0 / 1 are exact: bits * 1 keeps them, bits * 0 clears
    # them. In place where the left operand already has the result's shape.
    bi = b.view(ints)
    if a.ndim == 0 and not a.view(ints):  # a zero fill (a ReLU's gradient): b * ~mask
        return np.multiply(bi, ~mask).view(a.dtype)
    t = np.bitwise_xor(a.view(ints), bi)
    t = np.multiply(t, mask, out=t if t.shape == mask.shape else None)
    return np.bitwise_xor(t, bi, out=t).view(a.dtype)


def _int_div(a, b):
    # Integer division truncates toward zero, as Rust and Burn do.
    with np.errstate(all="ignore"):
        q = np.floor_divide(a, b)
        fix = (np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0))
        return q + fix.astype(q.dtype)


def _sign(x):
    out = np.sign(x)
    if out.dtype.kind == "f":  # sign(NaN) is 0, as in PyTorch (NumPy says NaN)
        out = np.where(np.isnan(out), out.dtype.type(0), out)
    return out


def _sum(x):
    return np.sum(x, dtype=x.dtype)


def _mean(x):
    return np.mean(x, dtype=np.float64 if x.dtype.kind != "f" else x.dtype).astype(x.dtype)


def _mean_dim(x, dim):
    return np.mean(
        x, axis=dim, keepdims=True, dtype=np.float64 if x.dtype.kind != "f" else x.dtype
    ).astype(x.dtype)


def _layout_matched(fn: Callable) -> Callable:
    """``fn`` of two operands, a large transposed view among them made contiguous first
    (``layout.py``: NumPy reads such a view an element per cache line). Every add, sub,
    mul and div passes here: small operands cost one size check."""

    def run(a, b):
        if type(b) is np.ndarray and b.size >= MIN_ELEMENTS:
            a, b = match_layout(a, b)
        return fn(a, b)

    return run


# Element-wise ops: one NumPy function serves every kind the table gives the op.
_ELEMENTWISE: dict[str, Callable] = {
    "add": _layout_matched(np.add), "sub": _layout_matched(np.subtract),
    "mul": _layout_matched(np.multiply), "max_pair": np.maximum,
    "min_pair": np.minimum, "atan2": np.arctan2,
    "remainder": np.remainder, "pow": np.power, "neg": np.negative, "abs": np.abs, "sign": _in_f32(_sign),  # in f32: bf16 sign(-0.0) is -0.0
    "exp": np.exp, "log": np.log, "log1p": np.log1p,
    "expm1": np.expm1, "erf": erf, "sqrt": np.sqrt,
    "rsqrt": lambda x: np.reciprocal(np.sqrt(x)), "recip": np.reciprocal,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "sinh": np.sinh,
    "cosh": np.cosh, "tanh": np.tanh, "asin": np.arcsin,
    "acos": np.arccos, "atan": np.arctan, "round": np.round, "floor": np.floor,
    "ceil": np.ceil, "trunc": np.trunc, "is_nan": np.isnan, "is_inf": np.isinf,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "bitwise_left_shift": np.left_shift, "bitwise_right_shift": np.right_shift,
    "bitwise_not": np.invert, "and": np.logical_and, "or": np.logical_or,
    "xor": np.logical_xor, "not": np.logical_not,
    "equal": np.equal, "not_equal": np.not_equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "lower": np.less, "lower_equal": np.less_equal,
}  # fmt: skip
# Ops whose Float and Int forms differ.
_BY_KIND: dict[str, tuple[Callable, Callable]] = {"div": (_layout_matched(np.true_divide), _int_div)}
_REDUCTIONS: dict[str, Callable] = {
    "sum": _in_f32(_sum),
    "sum_dim": _in_f32(lambda x, d: np.sum(x, axis=d, keepdims=True, dtype=x.dtype)),
    "prod": _in_f32(lambda x: np.prod(x, dtype=x.dtype)),
    "prod_dim": _in_f32(lambda x, d: np.prod(x, axis=d, keepdims=True, dtype=x.dtype)),
    "mean": _in_f32(_mean),
    "mean_dim": _in_f32(_mean_dim),
    # ufunc.reduce called here (not np.max) keeps NaN warnings inside the filtered package.
    "max": lambda x: np.maximum.reduce(x, axis=None),
    "min": lambda x: np.minimum.reduce(x, axis=None),
    "max_dim": lambda x, d: np.maximum.reduce(x, axis=d, keepdims=True),
    "min_dim": lambda x, d: np.minimum.reduce(x, axis=d, keepdims=True),
    "argmax": lambda x, d: np.argmax(x, axis=d, keepdims=True),
    "argmin": lambda x, d: np.argmin(x, axis=d, keepdims=True),
    "any": np.any, "all": np.all,
    "any_dim": lambda x, d: np.any(x, axis=d, keepdims=True),
    "all_dim": lambda x, d: np.all(x, axis=d, keepdims=True),
    "cumsum": _in_f32(lambda x, d: np.cumsum(x, axis=d, dtype=x.dtype)),
    "cumprod": _in_f32(lambda x, d: np.cumprod(x, axis=d, dtype=x.dtype)),
}  # fmt: skip


def _stable_argsort(x: np.ndarray, dim: int, descending: bool) -> np.ndarray:
    if not descending:
        return np.argsort(x, axis=dim, kind="stable")
    # Sorting the reversed array ascending and reversing the result gives a
    # descending order in which equal elements keep their original order.
    n = x.shape[dim]
    reversed_order = np.argsort(np.flip(x, dim), axis=dim, kind="stable")
    return np.flip(n - 1 - reversed_order, dim)


def _sort_key(x: np.ndarray) -> np.ndarray:
    # NaN sorts last ascending (first descending) in PyTorch, as NumPy does for floats.
    return x.astype(_F32) if x.dtype == _BF16 else x


def _index_grid(indices: np.ndarray, dim: int) -> tuple:
    """Open index grids addressing ``indices``' positions, with ``dim`` replaced by its values."""
    ndim = indices.ndim
    # Aranges shaped to broadcast along their own axis (np.ogrid builds the same in ~10 us)
    return tuple([indices if axis == dim else
                  np.arange(size).reshape((1,) * axis + (size,) + (1,) * (ndim - axis - 1))
                  for axis, size in enumerate(indices.shape)])  # fmt: skip


_DTYPES: dict[np.dtype, DType] = {numpy_dtype(d): d for d in DType}
_RNGS: dict[tuple, np.random.Generator] = {}
_RNG_LOCK = threading.Lock()


class NdArray(Backend):
    """The NumPy CPU backend (the default). One device: ``cpu:0``.

    Example:
        >>> from ember.backend import NdArray
        >>> NdArray(float_dtype="f64").default_device()
        Device(ndarray, cpu:0)
    """

    name = "ndarray"
    places = ("cpu",)

    # ------------------------------------------------------------ metadata
    shape = staticmethod(operator.attrgetter("shape"))  # a C-level getter: every op asks

    def dtype(self, x: np.ndarray) -> DType:
        found = _DTYPES.get(x.dtype)  # hot: every op asks
        return found if found is not None else dtype_of_numpy(x.dtype)

    def device_of(self, x: np.ndarray) -> Device:
        return Device(self, "cpu", 0)

    def dtype_usage(self, device: Device, dtype: DType) -> DTypeUsage:
        if dtype.is_low_precision:
            return DTypeUsage.STORAGE  # ml_dtypes holds and casts them; ops would run off-spec
        usage = DTypeUsage.general()
        if dtype in (DType.F32, DType.F64):
            usage |= DTypeUsage.ACCELERATED  # BLAS matmul
        return usage

    def seed(self, device: Device, seed: int) -> None:
        with _RNG_LOCK:
            _RNGS[(self.name, device.place, device.index)] = np.random.default_rng(seed)

    def rng_state(self, device: Device) -> str:
        # JSON keeps the 128-bit PCG64 words exact, which MessagePack's integers cannot.
        return json.dumps(self._rng(device).bit_generator.state)

    def set_rng_state(self, device: Device, state: str) -> None:
        try:
            decoded = json.loads(state)
            rng = np.random.Generator(getattr(np.random, decoded["bit_generator"])())
            rng.bit_generator.state = decoded
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            raise ArgumentError(f"ndarray: not a random generator state ({error})") from None
        with _RNG_LOCK:
            _RNGS[(self.name, device.place, device.index)] = rng

    def _rng(self, device: Device) -> np.random.Generator:
        key = (self.name, device.place, device.index)
        with _RNG_LOCK:
            if key not in _RNGS:
                _RNGS[key] = np.random.default_rng()
            return _RNGS[key]

    # ------------------------------------------------------------ creation and data
    def _from_data(self, data: TensorData, device: Device) -> np.ndarray:
        return data.to_numpy()

    def _into_data(self, x: np.ndarray) -> TensorData:
        return TensorData._wrap(np.asarray(x, order="C"))

    def _to_device(self, x: np.ndarray, device: Device) -> np.ndarray:
        return x

    def _empty(self, shape, device, dtype: DType) -> np.ndarray:
        return np.empty(shape, numpy_dtype(dtype))

    def _full(self, shape, value, device, dtype: DType) -> np.ndarray:
        return np.full(shape, value, numpy_dtype(dtype))

    def _cast(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        return cast_array(x, dtype)

    def float_random(self, shape, distribution: Distribution, device, dtype: DType) -> np.ndarray:
        rng = self._rng(device)
        kind, a, b = distribution.kind, distribution.a, distribution.b
        if kind == "bernoulli":
            out = rng.random(shape) < a
        elif kind == "normal":
            out = rng.standard_normal(shape) * b + a
        else:
            low, high = (0.0, 1.0) if kind == "default" else (a, b)
            out = rng.random(shape) * (high - low) + low
            # Rounding to a narrow dtype (f16, bf16) can reach ``high``: keep [low, high) half-open.
            top = np.asarray(high, numpy_dtype(dtype))
            below = np.nextafter(top, np.asarray(low, top.dtype))
            return np.minimum(out.astype(top.dtype), below)
        return out.astype(numpy_dtype(dtype))

    def int_random(self, shape, distribution: Distribution, device, dtype: DType) -> np.ndarray:
        """Int sampling: Default is a fair 0/1 coin, Uniform gives integers in [low, high),
        Bernoulli gives 0/1, Normal is rounded to the nearest integer."""
        rng = self._rng(device)
        kind, a, b = distribution.kind, distribution.a, distribution.b
        if kind == "uniform":
            out = rng.integers(int(np.ceil(a)), int(np.ceil(b)), shape)
        elif kind == "normal":
            out = np.rint(rng.standard_normal(shape) * b + a)
        elif kind == "bernoulli":
            out = rng.random(shape) < a
        else:
            out = rng.integers(0, 2, shape)
        return out.astype(numpy_dtype(dtype))

    def int_arange(self, start: int, end: int, step: int, device, dtype: DType) -> np.ndarray:
        return np.arange(start, end, step, dtype=numpy_dtype(dtype))

    # ------------------------------------------------------------ element-wise
    def _clamp(self, x, low, high):
        dtype = x.dtype  # NumPy gives float32 for bfloat16 with a Python float
        if x.size >= _BITWISE_SELECT_MIN and dtype in (_F32, _F64):
            # NumPy's maximum / minimum against a scalar runs 3-4x slower than against an
            # array on large inputs (a ReLU of 295k floats: 330 -> 75 us): the bound as a
            # filled array, which then takes the result.
            if low is not None:
                bound = np.full(x.shape, low, dtype)
                x = np.maximum(x, bound, out=bound)
            if high is not None:
                bound = np.full(x.shape, high, dtype)
                x = np.minimum(x, bound, out=bound)
            return x
        if low is not None:
            x = np.maximum(x, low)
        if high is not None:
            x = np.minimum(x, high)
        return _array(x).astype(dtype, copy=False)

    def _mask_where(self, x, mask, value):
        return select(mask, value, x)

    def _mask_fill(self, x, mask, value):
        return select(mask, np.asarray(value, x.dtype), x)

    # ------------------------------------------------------------ reductions and sorting
    def _sort_with_indices(self, x, dim: int, descending: bool):
        indices = _stable_argsort(_sort_key(x), dim, descending)
        return np.take_along_axis(x, indices, dim), indices

    # ------------------------------------------------------------ layout
    # Layout ops as the array's own methods: NumPy's functions add three Python calls each.
    def _reshape(self, x, shape):
        return x.reshape(shape)

    def _permute(self, x, axes):
        return x.transpose(axes)

    def _expand(self, x, shape):
        if x.ndim == len(shape) and x.flags.c_contiguous:
            # The read-only view np.broadcast_to makes, in a third of its time: size-1 dims
            # step by 0
            strides = tuple([step if n == m else 0 if m == 1 else -1
                             for n, m, step in zip(shape, x.shape, x.strides)])  # fmt: skip
            if -1 not in strides:
                out = np.ndarray(shape, x.dtype, x, 0, strides)
                out.flags.writeable = False
                return out
        return np.broadcast_to(x, shape)  # raises for a shape x does not expand to

    def _flip(self, x, axes):
        return np.flip(x, axes) if axes else x

    def _slice(self, x, ranges):
        return x[tuple([slice(start, stop, step) for start, stop, step in ranges])]

    def _slice_assign(self, x, values, ranges):
        out = x.copy()
        out[tuple(slice(start, stop, step) for start, stop, step in ranges)] = values
        return out

    def _cat(self, tensors, dim):
        return np.concatenate(tensors, axis=dim)

    def _repeat_dim(self, x, dim, times):
        reps = [1] * x.ndim
        reps[dim] = times
        return np.tile(x, reps)

    def bool_argwhere(self, x):
        return np.argwhere(x).astype(np.int64)

    # ------------------------------------------------------------ indexing
    def _gather(self, x, indices, dim):
        # PyTorch allows an index smaller than the tensor outside ``dim``.
        x = x[tuple(slice(0, s) if d != dim else slice(None) for d, s in enumerate(indices.shape))]
        return np.take_along_axis(x, indices, dim)

    def _scatter_add(self, x, indices, values, dim):
        out = x.copy()
        np.add.at(out, _index_grid(indices, dim), values)
        return out

    def _select(self, x, indices, dim):
        return np.take(x, indices, axis=dim)

    def _select_assign(self, x, indices, values, dim):
        out = x.copy()
        np.add.at(out, (slice(None),) * dim + (indices,), values)
        return out

    def _matmul(self, a, b):
        if a.dtype in _LOW_PRECISION:
            return self._matmul(a.astype(_F32), b.astype(_F32)).astype(a.dtype)
        if a.ndim > 2 and b.ndim == 2:
            # NumPy multiplies a stacked lhs matrix by matrix; its rows all at once are one
            # larger product (a transformer's linear layer, [8, 128, 256] @ [256, 768]: 1.1x
            # faster at one thread, 1.4x at two).
            order = contiguous_order(a)
            if order is not None:
                rows = a.transpose(order)
                out = np.matmul(rows.reshape(math.prod(rows.shape[:-1]), a.shape[-1]), b)
                out = out.reshape(*rows.shape[:-1], b.shape[-1])
                # The rows in a's order: a view (a permuted lhs, as attention's input in
                # [seq, batch, dim], is multiplied where it lies, not copied first).
                return out.transpose(np.argsort(order)) if order != sorted(order) else out
        return _array(np.matmul(a, b))

    # ------------------------------------------------------------ module ops
    conv2d = staticmethod(conv.conv2d)
    conv3d = staticmethod(conv.conv3d)
    conv_transpose2d = staticmethod(conv.conv_transpose2d)
    conv_transpose3d = staticmethod(conv.conv_transpose3d)
    unfold4d = staticmethod(conv.unfold4d)

    def conv_weight_backward(self, x, weight, grad, options):
        return conv.weight_grad_nd(x, grad, weight.shape[2:], options.stride, options.padding,
                                   options.dilation, options.groups)  # fmt: skip

    def conv_transpose_weight_backward(self, x, weight, grad, options):
        # The transposed convolution's input is the output gradient of a convolution of its
        # output (ember.backend.conv_grad): the same weight gradient, roles exchanged.
        return conv.weight_grad_nd(grad, x, weight.shape[2:], options.stride, options.padding,
                                   options.dilation, options.groups)  # fmt: skip

    avg_pool2d = staticmethod(pool.avg_pool2d)
    avg_pool2d_backward = staticmethod(pool.avg_pool2d_backward)
    max_pool2d_with_indices = staticmethod(pool.max_pool2d_with_indices)
    max_pool2d_with_indices_backward = staticmethod(pool.max_pool2d_with_indices_backward)
    adaptive_avg_pool2d = staticmethod(pool.adaptive_avg_pool2d)
    adaptive_avg_pool2d_backward = staticmethod(pool.adaptive_avg_pool2d_backward)
    adaptive_max_pool2d = staticmethod(pool.adaptive_max_pool2d)
    interpolate = staticmethod(resample.interpolate)
    interpolate_backward = staticmethod(resample.interpolate_backward)
    embedding = staticmethod(resample.embedding)
    embedding_backward = staticmethod(resample.embedding_backward)
    _pad = staticmethod(resample.pad)

    # ------------------------------------------------------------ faster composites
    def sigmoid(self, x):
        return _array(np.reciprocal(np.exp(np.negative(x)) + x.dtype.type(1)))


def _keep_dtype(name: str, fn: Callable) -> Callable:
    """``fn`` for a ``*_scalar`` op keeps its tensor's dtype: NumPy gives float32 for bfloat16
    with a Python float (ml_dtypes has no weak scalars), so the result is cast back, rounded
    once from float32 as PyTorch does."""
    if not name.endswith("_scalar"):
        return fn

    def run(x, scalar):
        out = fn(x, scalar)
        return out if out.dtype == x.dtype else out.astype(x.dtype)

    return run


def _array_method(fn: Callable) -> Callable:
    def primitive(self, *args):
        out = fn(*args)
        return out if type(out) is np.ndarray else np.asarray(out)

    return primitive


def _kernel_for(op, kind, base: str) -> Callable | None:
    if base in _ELEMENTWISE:
        return _keep_dtype(op.name, _ELEMENTWISE[base])
    if base in _BY_KIND:
        return _keep_dtype(op.name, _BY_KIND[base][kind is Kind.INT])
    return _REDUCTIONS.get(op.name)


bind_primitives(NdArray, _kernel_for, _array_method)
