"""The Backend protocol: primitives declared from the op table, composites built from them.

A backend is a class whose methods take and return *primitives* (its own
tensor type: a NumPy array, a ``torch.Tensor``, a graph node, ...). The op
table (:mod:`ember.backend.ops`) names every method. A concrete backend
implements the primitives; the composites below (activations, ``var``,
``sort``, 1-d module ops, ...) are written once here in terms of primitives and
may be overridden for speed. A decorator (autodiff, fusion) is a backend whose
primitives wrap another backend's.

Backend instances are configuration: two instances with the same class and
settings are equal, so devices built from them are equal too.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable
from typing import Any

from ember.backend import conv_grad
from ember.backend.device import Device
from ember.backend.errors import DeviceError, DTypeError, UnsupportedError
from ember.backend.ops import OPS, OpDef, primitives
from ember.backend.options import ConvOptions, ConvTransposeOptions, PoolOptions, QuantOptions
from ember.tensor.dtype import DType, Kind


class DTypeUsage(enum.Flag):
    """What a backend can do with a dtype on a device (Burn's ``DTypeUsage``)."""

    STORAGE = enum.auto()
    ARITHMETIC = enum.auto()
    ACCELERATED = enum.auto()

    @staticmethod
    def general() -> DTypeUsage:
        """Storage and arithmetic: what ``supports_dtype`` requires."""
        return DTypeUsage.STORAGE | DTypeUsage.ARITHMETIC


def normalized(B: Any, x: Any, epsilon: float) -> tuple[Any, Any]:
    """``((x - mean) * rstd, rstd)`` over the last dim of ``x`` on backend ``B``, with
    ``rstd = 1 / sqrt(var + epsilon)`` (the variance biased): layer norm's decomposition,
    and the statistics its backward rule computes again."""
    dim = len(B.shape(x)) - 1
    centered = B.float_sub(x, B.float_mean_dim(x, dim))
    var = B.float_mean_dim(B.float_mul(centered, centered), dim)
    rstd = B.float_rsqrt(B.float_add_scalar(var, epsilon))
    return B.float_mul(centered, rstd), rstd


def _kinded(generic, *bound_args):
    """A composite for one kind from a generic one taking the kind (and more) first."""

    def method(self, *args):
        return generic(self, *bound_args, *args)

    return method


def _missing(op: OpDef, name: str):
    def primitive(self, *args, **kwargs):
        raise UnsupportedError(f"backend {self.name!r} does not implement {name} (op {op.name!r})")

    primitive.__name__ = name
    primitive.__ember_missing__ = True
    return primitive


def bind_primitives(cls: type, kernel_for: Callable[[OpDef, Kind, str], Callable | None],
                    as_method: Callable[[Callable], Any] = staticmethod) -> None:  # fmt: skip
    """Installs a base backend's table-driven primitives on ``cls``, once, at import.

    For every primitive of the op table that ``cls`` does not write out itself,
    ``kernel_for(op, kind, base_name)`` names a library function (``base_name`` is the
    op's name without ``_scalar`` / ``_elem``: the scalar forms share their function);
    ``as_method`` turns it into a method. Without one, a method ``_<op name>`` written
    once for every kind serves.
    """
    for op in OPS.values():
        base = op.name.removesuffix("_scalar").removesuffix("_elem")
        for kind, name in op.primitive_names():
            written = cls.__dict__.get(name)
            if written is not None and not getattr(written, "__ember_missing__", False):
                continue  # written out in the class body
            fn = kernel_for(op, kind, base)
            if fn is not None:
                setattr(cls, name, as_method(fn))
            elif f"_{op.name}" in cls.__dict__:
                setattr(cls, name, cls.__dict__[f"_{op.name}"])


class Backend:
    """Base class of every backend. Subclasses implement the primitives of the op table.

    Args:
        float_dtype: the dtype of Float tensors made without an explicit dtype.
        int_dtype: the dtype of Int tensors made without an explicit dtype.
    """

    name: str = "backend"
    places: tuple[str, ...] = ("cpu",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every primitive of the table exists on every backend class; the ones a
        # backend lacks raise UnsupportedError naming the backend and the op.
        for op, _kind, name in primitives():
            if not hasattr(cls, name):
                setattr(cls, name, _missing(op, name))

    def __init__(self, float_dtype: DType | str = DType.F32, int_dtype: DType | str = DType.I64):
        self.float_dtype = DType.parse(float_dtype)
        self.int_dtype = DType.parse(int_dtype)
        if not self.float_dtype.is_float or not self.int_dtype.is_int:
            raise DTypeError(
                f"default dtypes must be a float and an int dtype, got {self.float_dtype} and "
                f"{self.int_dtype}"
            )

    # ------------------------------------------------------------ identity
    def _config(self) -> tuple:
        return (type(self), self.float_dtype, self.int_dtype)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Backend) and self._config() == other._config()

    def __hash__(self) -> int:
        return hash(self._config())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(float_dtype={self.float_dtype}, int_dtype={self.int_dtype})"

    def default_dtype(self, kind: Kind) -> DType:
        if kind is Kind.FLOAT:
            return self.float_dtype
        return self.int_dtype if kind is Kind.INT else DType.BOOL

    @classmethod
    def missing_primitives(cls) -> list[str]:
        """Names of the table's primitives this backend does not implement."""
        return [name for _, _, name in primitives() if getattr(getattr(cls, name), "__ember_missing__", False)]

    # ------------------------------------------------------------ devices
    def device(self, spec: str | None = None) -> Device:
        """The device named by ``spec`` (``"cpu"``, ``"cuda:1"``; None for the default)."""
        place, _, index = (spec or self.places[0]).partition(":")
        if place not in self.places:
            raise DeviceError(f"backend {self.name!r} has no {place!r} devices; it has {list(self.places)}")
        if index and not index.isdigit():
            raise DeviceError(f"backend {self.name!r}: bad device index {index!r} in {spec!r}")
        idx = int(index) if index else 0
        count = self.device_count(place)
        if not 0 <= idx < count:
            raise DeviceError(f"backend {self.name!r} has {count} {place} device(s); index {idx} is out of range")
        return Device(self, place, idx)

    def default_device(self) -> Device:
        return self.device(None)

    def device_count(self, place: str = "cpu") -> int:
        return 1 if place in self.places else 0

    def seed(self, device: Device, seed: int) -> None:
        raise UnsupportedError(f"backend {self.name!r} does not implement seed")

    def rng_state(self, device: Device) -> str:
        """The state of ``device``'s random generator as text, for checkpoints."""
        raise UnsupportedError(f"backend {self.name!r} does not implement rng_state")

    def set_rng_state(self, device: Device, state: str) -> None:
        """Restores a state :meth:`rng_state` gave: the same draws follow."""
        raise UnsupportedError(f"backend {self.name!r} does not implement set_rng_state")

    def sync(self, device: Device) -> None:
        """Waits for queued work on ``device``; eager CPU backends have none."""

    def replay_keyed(self, key: Hashable, inputs: list, fn: Callable[[list], list]) -> list:
        """``fn(inputs)``: a list of primitives (or None) that ``fn`` computes from the
        primitives ``inputs`` with this backend's ops alone, issuing the same ops with
        the same attributes whenever ``key`` is equal and the inputs have the same
        shapes, dtypes and devices. A backend that records its ops (Fusion) may push
        the ops an earlier call issued instead of running ``fn``; here it runs."""
        return fn(inputs)

    def dtype_usage(self, device: Device, dtype: DType) -> DTypeUsage:
        raise UnsupportedError(f"backend {self.name!r} does not implement dtype_usage")

    def supports_dtype(self, device: Device, dtype: DType) -> bool:
        general = DTypeUsage.general()
        return (self.dtype_usage(device, dtype) & general) == general

    # ------------------------------------------------------------ primitive metadata
    def shape(self, x: Any) -> tuple[int, ...]:
        """The shape of a primitive."""
        raise UnsupportedError(f"backend {self.name!r} does not implement shape")

    def dtype(self, x: Any) -> DType:
        """The ember dtype of a primitive."""
        raise UnsupportedError(f"backend {self.name!r} does not implement dtype")

    def device_of(self, x: Any) -> Device:
        """The device a primitive lives on."""
        raise UnsupportedError(f"backend {self.name!r} does not implement device_of")

    # ================================================================ composites
    # Each is written once from primitives. ``self._p(kind, name)`` finds the
    # primitive of ``name`` for ``kind`` when a composite serves several kinds.
    def _p(self, kind: Kind, name: str):
        return getattr(self, OPS[name].primitive(kind))

    def _zeros(self, kind, shape, device, dtype):
        return self._p(kind, "full")(shape, 0, device, dtype)

    def _ones(self, kind, shape, device, dtype):
        return self._p(kind, "full")(shape, 1, device, dtype)

    def _extreme_with_indices(self, kind, arg_name, x, dim):
        indices = self._p(kind, arg_name)(x, dim)
        return self._p(kind, "gather")(x, indices, dim), indices

    def _sort(self, kind, x, dim, descending):
        return self._p(kind, "sort_with_indices")(x, dim, descending)[0]

    def _argsort(self, kind, x, dim, descending):
        return self._p(kind, "sort_with_indices")(x, dim, descending)[1]

    float_zeros = _kinded(_zeros, Kind.FLOAT)
    int_zeros = _kinded(_zeros, Kind.INT)
    bool_zeros = _kinded(_zeros, Kind.BOOL)
    float_ones = _kinded(_ones, Kind.FLOAT)
    int_ones = _kinded(_ones, Kind.INT)
    bool_ones = _kinded(_ones, Kind.BOOL)
    float_max_dim_with_indices = _kinded(_extreme_with_indices, Kind.FLOAT, "argmax")
    int_max_dim_with_indices = _kinded(_extreme_with_indices, Kind.INT, "argmax")
    float_min_dim_with_indices = _kinded(_extreme_with_indices, Kind.FLOAT, "argmin")
    int_min_dim_with_indices = _kinded(_extreme_with_indices, Kind.INT, "argmin")
    float_sort = _kinded(_sort, Kind.FLOAT)
    int_sort = _kinded(_sort, Kind.INT)
    float_argsort = _kinded(_argsort, Kind.FLOAT)
    int_argsort = _kinded(_argsort, Kind.INT)

    # ------------------------------------------------------------ statistics
    def float_var_mean(self, x, dim: int, correction: int):
        """Variance with ``correction`` (0 biased, 1 unbiased) and mean along ``dim``, dims kept."""
        mean = self.float_mean_dim(x, dim)
        centered = self.float_sub(x, mean)
        squares = self.float_sum_dim(self.float_mul(centered, centered), dim)
        count = self.shape(x)[dim] - correction
        return self.float_div_scalar(squares, count if count > 0 else math.nan), mean

    def float_var(self, x, dim: int, correction: int):
        return self.float_var_mean(x, dim, correction)[0]

    # ------------------------------------------------------------ activations
    def relu(self, x):
        return self.float_clamp(x, 0.0, None)

    def relu6(self, x):
        return self.float_clamp(x, 0.0, 6.0)

    def log_sigmoid(self, x):
        # min(x, 0) - log(1 + e^-|x|) never overflows.
        tail = self.float_log1p(self.float_exp(self.float_neg(self.float_abs(x))))
        return self.float_sub(self.float_min_pair_scalar(x, 0.0), tail)

    def sigmoid(self, x):
        return self.float_exp(self.log_sigmoid(x))

    def hard_sigmoid(self, x):
        return self.float_clamp(self.float_add_scalar(self.float_div_scalar(x, 6.0), 0.5), 0.0, 1.0)

    def silu(self, x):
        return self.float_mul(x, self.sigmoid(x))

    def softplus(self, x, beta: float = 1.0, threshold: float = 20.0):
        bx = self.float_mul_scalar(x, beta)
        # max(bx, 0) + log1p(e^-|bx|) is log(1 + e^bx) without overflow.
        smooth = self.float_add(
            self.float_max_pair_scalar(bx, 0.0),
            self.float_log1p(self.float_exp(self.float_neg(self.float_abs(bx)))),
        )
        smooth = self.float_div_scalar(smooth, beta)
        return self.float_mask_where(smooth, self.float_greater_elem(bx, threshold), x)

    def mish(self, x):
        return self.float_mul(x, self.float_tanh(self.softplus(x, 1.0, 20.0)))

    def gelu(self, x):
        inner = self.float_erf(self.float_mul_scalar(x, 1.0 / math.sqrt(2.0)))
        return self.float_mul(x, self.float_mul_scalar(self.float_add_scalar(inner, 1.0), 0.5))

    def gelu_tanh(self, x):
        cube = self.float_mul(self.float_mul(x, x), x)
        inner = self.float_add(x, self.float_mul_scalar(cube, 0.044715))
        t = self.float_tanh(self.float_mul_scalar(inner, math.sqrt(2.0 / math.pi)))
        return self.float_mul(x, self.float_mul_scalar(self.float_add_scalar(t, 1.0), 0.5))

    def leaky_relu(self, x, negative_slope: float = 0.01):
        return self.float_mask_where(x, self.float_lower_elem(x, 0.0), self.float_mul_scalar(x, negative_slope))

    def leaky_relu_backward(self, x, grad, negative_slope: float = 0.01):
        # As PyTorch: the negative slope at 0 and for NaN inputs.
        return self.float_mask_where(
            self.float_mul_scalar(grad, negative_slope), self.float_greater_elem(x, 0.0), grad
        )

    def elu(self, x, alpha: float = 1.0):
        negative = self.float_mul_scalar(self.float_expm1(x), alpha)
        return self.float_mask_where(x, self.float_lower_equal_elem(x, 0.0), negative)

    def celu(self, x, alpha: float = 1.0):
        negative = self.float_mul_scalar(self.float_expm1(self.float_div_scalar(x, alpha)), alpha)
        return self.float_mask_where(x, self.float_lower_equal_elem(x, 0.0), negative)

    def selu(self, x):
        alpha, scale = 1.6732632423543772, 1.0507009873554805
        return self.float_mul_scalar(self.elu(x, alpha), scale)

    def hard_swish(self, x):
        return self.float_mul(x, self.float_div_scalar(self.relu6(self.float_add_scalar(x, 3.0)), 6.0))

    def prelu(self, x, alpha):
        rank, a_shape = len(self.shape(x)), self.shape(alpha)
        if rank >= 2 and len(a_shape) == 1 and a_shape[0] > 1:
            alpha = self.float_reshape(alpha, (1, a_shape[0]) + (1,) * (rank - 2))
        return self.float_mask_where(x, self.float_lower_elem(x, 0.0), self.float_mul(x, alpha))

    def softmax(self, x, dim: int):
        shifted = self.float_sub(x, self.float_max_dim(x, dim))
        e = self.float_exp(shifted)
        return self.float_div(e, self.float_sum_dim(e, dim))

    def log_softmax(self, x, dim: int):
        shifted = self.float_sub(x, self.float_max_dim(x, dim))
        return self.float_sub(shifted, self.float_log(self.float_sum_dim(self.float_exp(shifted), dim)))

    def softmin(self, x, dim: int):
        return self.softmax(self.float_neg(x), dim)

    def quiet_softmax(self, x, dim: int):
        # softmax with an extra logit fixed at zero: a row may attend to nothing.
        peak = self.float_max_dim(x, dim)
        e = self.float_exp(self.float_sub(x, peak))
        total = self.float_add(self.float_sum_dim(e, dim), self.float_exp(self.float_neg(peak)))
        return self.float_div(e, total)

    def glu(self, x, dim: int):
        shape = self.shape(x)
        half = shape[dim] // 2
        first = [(0, s, 1) for s in shape]
        second = list(first)
        first[dim], second[dim] = (0, half, 1), (half, shape[dim], 1)
        a = self.float_slice(x, tuple(first))
        b = self.float_slice(x, tuple(second))
        return self.float_mul(a, self.sigmoid(b))

    # ------------------------------------------------------------ normalization
    def layer_norm(self, x, weight, bias, epsilon: float):
        y, _ = normalized(self, x, epsilon)
        if weight is not None:
            y = self.float_mul(y, weight)
        return y if bias is None else self.float_add(y, bias)

    # ------------------------------------------------------------ quantized
    def dequantize(self, values, scales, zero_points, options: QuantOptions):
        """``(values - zero_points) * scales`` in f32, each value taking the parameters of
        its place in ``options``' layout (``ember.quantization`` says which)."""
        shape = self.shape(values)
        q = self.float_reshape(self.int_cast(values, DType.F32), options.blocked(shape))
        along = options.broadcast(shape)
        if zero_points is not None:
            q = self.float_sub(q, self.float_reshape(self.int_cast(zero_points, DType.F32), along))
        out = self.float_mul(q, self.float_reshape(self.float_cast(scales, DType.F32), along))
        return self.float_reshape(out, shape)

    def quantized_linear(self, x, values, scales, zero_points, bias, options: QuantOptions):
        """``x @ dequantize(values, scales, zero_points) + bias``: the reference every
        backend's integer kernel is tested against."""
        weight = self.dequantize(values, scales, zero_points, options)
        out = self.float_matmul(x, self.float_cast(weight, self.dtype(x)))
        return out if bias is None else self.float_add(out, bias)

    def quantized_conv(self, x, values, scales, zero_points, bias, options: ConvOptions,
                       quant: QuantOptions):
        """A convolution by ``dequantize(values, scales, zero_points)`` (2-d or 3-d, by the
        weight's rank)."""
        weight = self.float_cast(self.dequantize(values, scales, zero_points, quant), self.dtype(x))
        conv = self.conv2d if len(self.shape(values)) == 4 else self.conv3d
        return conv(x, weight, bias, options)

    def integer_linear(self, values, scales, zero_points, weight_values, weight_scales,
                       weight_zero_points, bias, input_quant: QuantOptions, options: QuantOptions):  # fmt: skip
        """``dequantize(input) @ dequantize(weight) + bias`` in f32: the reference of the
        integer kernels (whose sums are exact where these round)."""
        x = self.dequantize(values, scales, zero_points, input_quant)
        # The float default, not an override: PyTorch's dynamic kernel would quantize again.
        return Backend.quantized_linear(self, x, weight_values, weight_scales,
                                        weight_zero_points, bias, options)  # fmt: skip

    def integer_conv(self, values, scales, zero_points, weight_values, weight_scales,
                     weight_zero_points, bias, options: ConvOptions, input_quant: QuantOptions,
                     quant: QuantOptions):  # fmt: skip
        """A convolution of ``dequantize(input)`` by ``dequantize(weight)`` (2-d or 3-d)."""
        x = self.dequantize(values, scales, zero_points, input_quant)
        return Backend.quantized_conv(self, x, weight_values, weight_scales,
                                      weight_zero_points, bias, options, quant)  # fmt: skip

    # ------------------------------------------------------------ 1-d module ops via 2-d
    # A 1-d op is its 2-d op on [N, C, L, 1]: the options get a neutral second dim.
    def _as_2d(self, x):
        return self.float_reshape(x, self.shape(x) + (1,))

    def _from_2d(self, y):
        return self.float_reshape(y, self.shape(y)[:-1])

    def conv1d(self, x, weight, bias, options: ConvOptions):
        opts = ConvOptions(options.stride + (1,), options.padding + (0,), options.dilation + (1,), options.groups)
        return self._from_2d(self.conv2d(self._as_2d(x), self._as_2d(weight), bias, opts))

    def conv_transpose1d(self, x, weight, bias, options: ConvTransposeOptions):
        opts = ConvTransposeOptions(
            options.stride + (1,), options.padding + (0,), options.padding_out + (0,),
            options.dilation + (1,), options.groups,
        )  # fmt: skip
        return self._from_2d(self.conv_transpose2d(self._as_2d(x), self._as_2d(weight), bias, opts))

    @staticmethod
    def _pool_2d(options: PoolOptions) -> PoolOptions:
        return PoolOptions(
            options.kernel_size + (1,), options.stride + (1,), options.padding + (0,),
            options.dilation + (1,), options.ceil_mode, options.count_include_pad,
        )  # fmt: skip

    def avg_pool1d(self, x, options: PoolOptions):
        return self._from_2d(self.avg_pool2d(self._as_2d(x), self._pool_2d(options)))

    def max_pool1d_with_indices(self, x, options: PoolOptions):
        values, indices = self.max_pool2d_with_indices(self._as_2d(x), self._pool_2d(options))
        return self._from_2d(values), self.int_reshape(indices, self.shape(indices)[:-1])

    def max_pool1d(self, x, options: PoolOptions):
        return self.max_pool1d_with_indices(x, options)[0]

    def max_pool2d(self, x, options: PoolOptions):
        return self.max_pool2d_with_indices(x, options)[0]

    def adaptive_avg_pool1d(self, x, output_size):
        return self._from_2d(self.adaptive_avg_pool2d(self._as_2d(x), (output_size[0], 1)))

    def adaptive_max_pool1d(self, x, output_size):
        return self._from_2d(self.adaptive_max_pool2d(self._as_2d(x), (output_size[0], 1)))

    # ------------------------------------------------------------ convolution gradients
    # Generic formulations from the backend's own convolutions (ember.backend.conv_grad).
    def conv_x_backward(self, x, weight, grad, options: ConvOptions):
        return conv_grad.conv_x_backward(self, x, weight, grad, options)

    def conv_weight_backward(self, x, weight, grad, options: ConvOptions):
        return conv_grad.conv_weight_backward(self, x, weight, grad, options)

    def conv_transpose_x_backward(self, x, weight, grad, options: ConvTransposeOptions):
        return conv_grad.conv_transpose_x_backward(self, x, weight, grad, options)

    def conv_transpose_weight_backward(self, x, weight, grad, options: ConvTransposeOptions):
        return conv_grad.conv_transpose_weight_backward(self, x, weight, grad, options)

    def unfold4d(self, x, kernel_size, options: ConvOptions):
        """Sliding blocks ``[N, C*kh*kw, L]`` as a convolution with a one-hot kernel."""
        n, c = self.shape(x)[:2]
        kh, kw = kernel_size
        size = c * kh * kw
        device = self.device_of(x)
        rows = self.int_reshape(self.int_arange(0, size, 1, device, DType.I64), (size, 1))
        cols = self.int_reshape(rows, (1, size))
        eye = self.bool_cast(self.int_equal(rows, cols), self.dtype(x))
        weight = self.float_reshape(eye, (size, c, kh, kw))
        out = self.conv2d(x, weight, None, ConvOptions(options.stride, options.padding, options.dilation, 1))
        shape = self.shape(out)
        return self.float_reshape(out, (n, size, shape[2] * shape[3]))
