"""Tensor: the user-facing, backend-independent n-dimensional array.

A Tensor is a handle: a backend primitive, the device it lives on and its kind
(Float, Int or Bool). Every method validates its arguments through the op
table's rules and then calls one backend primitive (or composite); nothing here
touches NumPy or torch. Tensors are immutable: every op returns a new tensor,
so the same tensor can be used any number of times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ember.backend import rules
from ember.backend.base import DTypeUsage
from ember.backend.device import Device, default_device
from ember.backend.errors import (
    ArgumentError,
    DeviceError,
    DTypeError,
    EmberIndexError,
    KindError,
    ShapeError,
    UnsupportedError,
    fmt_shape,
)
from ember.backend.ops import OpDef, ops
from ember.backend.rules import AVal, broadcast_shapes, check_dim
from ember.tensor.data import TensorData
from ember.tensor.distribution import Distribution
from ember.tensor.dtype import DType, Kind, promote
from ember.tensor.indexing import parse_key

Scalar = int | float | bool
ShapeLike = Sequence[int]

_NAMES: dict[tuple[OpDef, Kind], str] = {}


def _primitive(op: OpDef, kind: Kind) -> str:
    """The backend method name of ``op`` for ``kind``; a KindError when the op lacks the kind."""
    try:
        return _NAMES[op, kind]
    except KeyError:
        if kind not in op.kinds:
            have = ", ".join(sorted(k.value for k in op.kinds))
            raise KindError(f"{op.name} is not defined for {kind.value} tensors (only {have})") from None
        name = _NAMES[op, kind] = op.primitive(kind)
        return name


def _wrap(prim: Any, device: Device, kind: Kind) -> Tensor:
    t = object.__new__(Tensor)
    t._prim = prim
    t._device = device
    t._kind = kind
    return t


def _same_device(op: str, a: Tensor, b: Tensor) -> None:
    if a._device is not b._device and a._device != b._device:
        raise DeviceError(f"{op}: tensors are on different devices, {a._device} and {b._device}")


def _backend_types(backend: Any) -> tuple[type, ...]:
    """The classes of a backend and of every backend it decorates, outermost first.

    Primitives pass between two devices only when the whole stacks match:
    Autodiff(NdArray) and Autodiff(Torch) share a class but not their primitives.
    """
    types = []
    while backend is not None:
        types.append(type(backend))
        backend = getattr(backend, "inner", None)
    return tuple(types)


def _dims(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    try:
        return tuple([int(d) for d in shape])
    except TypeError:
        raise ArgumentError(f"a shape must be a sequence of ints, got {shape!r}") from None


class Tensor:
    """An n-dimensional array of one kind (Float, Int or Bool) on one device.

    Build tensors with the class methods (:meth:`from_data`, :meth:`zeros`,
    :meth:`random`, ...). Arithmetic operators broadcast like NumPy and PyTorch.

    Example:
        >>> import ember
        >>> x = Tensor.from_data([[2.0, 3.0], [4.0, 5.0]])
        >>> (x + Tensor.ones_like(x)).tolist()
        [[3.0, 4.0], [5.0, 6.0]]
    """

    __slots__ = ("__weakref__", "_device", "_kind", "_prim")
    __hash__ = object.__hash__  # a tensor is hashable by identity; == is element-wise

    # ================================================================ construction
    @staticmethod
    def from_data(
        data: Any,
        device: Device | None = None,
        dtype: DType | str | None = None,
        kind: Kind | None = None,
    ) -> Tensor:
        """A tensor from nested lists, a scalar, a NumPy array or :class:`TensorData`.

        Python values take the device backend's default dtype of their kind
        (f32 and i64 unless configured); arrays and TensorData keep their dtype.
        ``kind`` picks the backend's default dtype of another kind.

        Example:
            >>> Tensor.from_data([1, 2, 3]).dtype
            DType.I64
        """
        device = device or default_device()
        backend = device.backend
        keep = isinstance(data, TensorData) or TensorData.is_array(data)
        td = data if isinstance(data, TensorData) else TensorData(data)
        if dtype is not None:
            target = DType.parse(dtype)
        elif kind is not None:
            target = backend.default_dtype(kind)
        else:
            target = td.dtype if keep else backend.default_dtype(td.kind)
        Tensor._check_storage("from_data", device, target)
        td = td.convert(target)
        return _wrap(getattr(backend, _primitive(ops.from_data, target.kind))(td, device), device, target.kind)

    @staticmethod
    def from_floats(values: Any, device: Device | None = None) -> Tensor:
        return Tensor.from_data(values, device, kind=Kind.FLOAT)

    @staticmethod
    def from_ints(values: Any, device: Device | None = None) -> Tensor:
        return Tensor.from_data(values, device, kind=Kind.INT)

    @staticmethod
    def from_bools(values: Any, device: Device | None = None) -> Tensor:
        return Tensor.from_data(values, device, kind=Kind.BOOL)

    @staticmethod
    def _check_storage(op: str, device: Device, dtype: DType) -> None:
        # Holding data and casting need only storage: a storage-only dtype (float8) is loaded
        # and cast to one the backend computes with.
        if not device.backend.dtype_usage(device, dtype) & DTypeUsage.STORAGE:
            raise UnsupportedError(f"{op}: backend {device.backend.name!r} does not store {dtype} on {device}")

    @staticmethod
    def _check_dtype(op: str, device: Device, dtype: DType) -> None:
        if not device.backend.supports_dtype(device, dtype):
            raise UnsupportedError(f"{op}: backend {device.backend.name!r} does not support {dtype} on {device}")

    @staticmethod
    def _create(op: OpDef, shape, device, dtype, kind, *middle) -> Tensor:
        device = device or default_device()
        dt = DType.parse(dtype) if dtype is not None else device.backend.default_dtype(kind)
        Tensor._check_dtype(op.name, device, dt)
        attrs = (_dims(shape), *middle, device, dt)
        op.rule(op.name, *attrs)
        prim = getattr(device.backend, _primitive(op, dt.kind))(*attrs)
        return _wrap(prim, device, dt.kind)

    @staticmethod
    def empty(shape: ShapeLike, device: Device | None = None, dtype=None, kind: Kind = Kind.FLOAT) -> Tensor:
        """Uninitialized elements (the backend may return anything)."""
        return Tensor._create(ops.empty, shape, device, dtype, kind)

    @staticmethod
    def zeros(shape: ShapeLike, device: Device | None = None, dtype=None, kind: Kind = Kind.FLOAT) -> Tensor:
        return Tensor._create(ops.zeros, shape, device, dtype, kind)

    @staticmethod
    def ones(shape: ShapeLike, device: Device | None = None, dtype=None, kind: Kind = Kind.FLOAT) -> Tensor:
        return Tensor._create(ops.ones, shape, device, dtype, kind)

    @staticmethod
    def full(shape: ShapeLike, value: Scalar, device: Device | None = None, dtype=None, kind: Kind | None = None) -> Tensor:
        """Every element equal to ``value``; the kind follows the value unless given."""
        if kind is None:
            kind = Kind.BOOL if isinstance(value, bool) else Kind.INT if isinstance(value, int) else Kind.FLOAT
        return Tensor._create(ops.full, shape, device, dtype, kind, value)

    @staticmethod
    def random(shape: ShapeLike, distribution: Distribution | None = None, device: Device | None = None,
               dtype=None, kind: Kind = Kind.FLOAT) -> Tensor:  # fmt: skip
        """Samples from ``distribution`` (uniform on [0, 1) by default); seed with ``ember.seed``.

        Example:
            >>> Tensor.random([2, 3], Distribution.normal(0.0, 1.0)).shape
            (2, 3)
        """
        return Tensor._create(ops.random, shape, device, dtype, kind, distribution or Distribution.default())

    @staticmethod
    def arange(start: int, end: int | None = None, step: int = 1, device: Device | None = None, dtype=None) -> Tensor:
        """Int tensor ``[start, start + step, ...)`` below ``end``; ``arange(n)`` counts from 0."""
        if end is None:
            start, end = 0, start
        device = device or default_device()
        dt = DType.parse(dtype) if dtype is not None else device.backend.int_dtype
        if not dt.is_int:
            raise DTypeError(f"arange makes Int tensors; got dtype {dt} (cast the result with .float())")
        rules.arange("arange", start, end, step, device, dt)
        return _wrap(device.backend.int_arange(int(start), int(end), int(step), device, dt), device, Kind.INT)

    def zeros_like(self) -> Tensor:
        return Tensor.zeros(self.shape, self._device, self.dtype)

    def ones_like(self) -> Tensor:
        return Tensor.ones(self.shape, self._device, self.dtype)

    def full_like(self, value: Scalar) -> Tensor:
        return Tensor.full(self.shape, value, self._device, self.dtype, self._kind)

    def random_like(self, distribution: Distribution | None = None) -> Tensor:
        return Tensor.random(self.shape, distribution, self._device, self.dtype, self._kind)

    # ================================================================ metadata
    @property
    def shape(self) -> tuple[int, ...]:
        return self._device.backend.shape(self._prim)

    def dims(self) -> list[int]:
        return list(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    ndim = rank

    @property
    def dtype(self) -> DType:
        return self._device.backend.dtype(self._prim)

    @property
    def kind(self) -> Kind:
        return self._kind

    @property
    def device(self) -> Device:
        return self._device

    @property
    def backend(self):
        return self._device.backend

    def num_elements(self) -> int:
        return math.prod(self.shape)

    numel = num_elements

    def into_primitive(self) -> Any:
        """The backend primitive (a NumPy array on NdArray)."""
        return self._prim

    @staticmethod
    def from_primitive(prim: Any, device: Device) -> Tensor:
        """Wraps a primitive of ``device``'s backend."""
        return _wrap(prim, device, device.backend.dtype(prim).kind)

    def _aval(self) -> AVal:
        backend = self._device.backend
        return AVal(backend.shape(self._prim), backend.dtype(self._prim))

    # ================================================================ data
    def into_data(self) -> TensorData:
        """The elements on the host; this is the point where a lazy backend runs."""
        return getattr(self._device.backend, _primitive(ops.into_data, self._kind))(self._prim)

    to_data = into_data

    def tolist(self) -> Any:
        return self.into_data().tolist()

    def item(self) -> Scalar:
        """The single element as a Python number."""
        return self.into_data().item()

    into_scalar = item

    def to_numpy(self):
        """The elements as a read-only NumPy array (through TensorData)."""
        return self.into_data().to_numpy()

    def __bool__(self) -> bool:
        if self.num_elements() != 1:
            raise ShapeError(f"the truth value of a tensor of shape {fmt_shape(self.shape)} is ambiguous; use any() or all()")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __len__(self) -> int:
        shape = self.shape
        if not shape:
            raise ShapeError("len() of a 0-d tensor")
        return shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        from ember.tensor.printing import format_tensor

        return format_tensor(self)

    __str__ = __repr__

    def _repr_html_(self) -> str:
        """Jupyter's rich display: shape, dtype, device and the (summarized) values."""
        from ember.notebook_display import tensor_html

        return tensor_html(self)

    def __setitem__(self, key, value) -> None:
        raise TypeError("tensors are immutable; use x.slice_assign(ranges, values) or x.slice_fill(ranges, value), which return a new tensor")

    # ================================================================ devices and dtypes
    def to_device(self, device: Device) -> Tensor:
        """This tensor on ``device``; across backends the data goes through TensorData."""
        if device is self._device or device == self._device:
            return self
        if _backend_types(device.backend) == _backend_types(self._device.backend):
            prim = getattr(device.backend, _primitive(ops.to_device, self._kind))(self._prim, device)
            return _wrap(prim, device, self._kind)
        return Tensor.from_data(self.into_data(), device)

    def quantize(self, scheme, scales: Tensor | None = None, zero_points: Tensor | None = None):
        """This Float tensor quantized by ``scheme`` (an ``ember.quantization.QuantScheme``):
        a ``QTensor``; see :func:`ember.quantization.quantize`."""
        from ember.quantization import quantize

        return quantize(self, scheme, scales, zero_points)

    def cast(self, dtype: DType | str) -> Tensor:
        """Converts the elements to ``dtype`` (any kind). Float to Int truncates toward zero."""
        target = DType.parse(dtype)
        if target is self.dtype:
            return self
        Tensor._check_storage("cast", self._device, target)
        prim = getattr(self._device.backend, _primitive(ops.cast, self._kind))(self._prim, target)
        return _wrap(prim, self._device, target.kind)

    def float(self) -> Tensor:
        """A Float tensor with the backend's default float dtype (self if already Float)."""
        return self if self._kind is Kind.FLOAT else self.cast(self._device.backend.float_dtype)

    def int(self) -> Tensor:
        return self if self._kind is Kind.INT else self.cast(self._device.backend.int_dtype)

    def bool(self) -> Tensor:
        return self.cast(DType.BOOL)

    def to_full_precision(self) -> Tensor:
        """f16 / bf16 as f32; other dtypes unchanged."""
        return self.cast(DType.F32) if self.dtype in (DType.F16, DType.BF16) else self

    def from_full_precision(self, dtype: DType | str) -> Tensor:
        return self.cast(dtype)

    # ================================================================ autodiff
    def _autodiff(self, what: str):
        backend = self._device.backend
        if not hasattr(backend, "backward"):
            raise UnsupportedError(
                f"{what} needs an autodiff backend; {backend.name!r} has none: use a device from "
                "device.autodiff() (e.g. ember.device('ndarray').autodiff())"
            )
        return backend

    def require_grad(self) -> Tensor:
        """This Float tensor as a leaf whose gradient ``backward()`` computes."""
        return self.set_require_grad(True)

    def set_require_grad(self, flag: bool) -> Tensor:
        backend = self._autodiff("require_grad")
        return _wrap(backend.set_require_grad(self._prim, bool(flag)), self._device, self._kind)

    def is_require_grad(self) -> bool:
        """Whether gradients flow to or through this tensor (False off an autodiff backend)."""
        backend = self._device.backend
        return hasattr(backend, "backward") and backend.is_require_grad(self._prim)

    def detach(self) -> Tensor:
        """The same values, cut from the graph: no gradient flows through the result."""
        backend = self._device.backend
        if not hasattr(backend, "backward"):
            return self
        return _wrap(backend.detach(self._prim), self._device, self._kind)

    def backward(self, create_graph: bool = False, inputs: Sequence[Tensor] = ()):
        """Gradients of this tensor (summed, if not a scalar) w.r.t. every tracked leaf.

        Returns a ``Gradients`` container; read one gradient with ``leaf.grad(grads)``.
        With ``create_graph`` the gradients are themselves differentiable (tensors of this
        autodiff device, with the graph of how they were computed), so they can enter
        another ``backward()``: gradient penalties, Hessian-vector products, meta-learning.
        ``inputs`` restricts the pass to the gradients of those tensors of the graph
        (leaves or intermediate values): only the ops on a path to one of them run.

        Example:
            >>> import ember
            >>> from ember import Tensor
            >>> x = Tensor.from_data([2.0], ember.device("ndarray").autodiff()).require_grad()
            >>> dx = x.grad((x * x * x).sum().backward(create_graph=True))   # 3 x^2
            >>> x.grad(dx.sum().backward()).tolist()                          # 6 x
            [12.0]
        """
        if self._kind is not Kind.FLOAT:
            raise KindError(f"backward: needs a Float tensor, got {self._kind.value}")
        backend = self._autodiff("backward")
        if create_graph or inputs:
            return backend.backward(self._prim, create_graph=create_graph,
                                    inputs=tuple(t._prim for t in inputs))  # fmt: skip
        return backend.backward(self._prim)

    def grad(self, grads) -> Tensor | None:
        """This leaf's gradient in ``grads``; None if absent. On the inner (non-autodiff)
        device, or on this device when ``grads`` came from ``backward(create_graph=True)``."""
        backend = self._autodiff("grad")
        prim = backend.grad(self._prim, grads)
        if prim is None:
            return None
        return _wrap(prim, self._device if grads.tracked else self._device.inner(), Kind.FLOAT)

    def grad_remove(self, grads) -> Tensor | None:
        """Takes this leaf's gradient out of ``grads``."""
        backend = self._autodiff("grad_remove")
        prim = backend.grad_remove(self._prim, grads)
        return None if prim is None else _wrap(prim, self._device.inner(), Kind.FLOAT)

    def grad_replace(self, grads, grad: Tensor) -> None:
        """Sets this leaf's gradient in ``grads`` (a tensor on the inner device)."""
        backend = self._autodiff("grad_replace")
        if grad.shape != self.shape:
            raise ShapeError(f"grad_replace: gradient shape {fmt_shape(grad.shape)} != tensor shape {fmt_shape(self.shape)}")
        backend.grad_replace(self._prim, grads, grad._prim)

    def inner(self) -> Tensor:
        """The same values on the inner backend (no graph); self off an autodiff backend."""
        backend = self._device.backend
        if not hasattr(backend, "backward"):
            return self
        return _wrap(backend.inner_primitive(self._prim), self._device.inner(), self._kind)

    @staticmethod
    def from_inner(tensor: Tensor, device: Device) -> Tensor:
        """A tensor of the inner backend as an untracked tensor of autodiff ``device``."""
        backend = device.backend
        if not hasattr(backend, "backward"):
            raise UnsupportedError(f"from_inner: {backend.name!r} is not an autodiff backend")
        return _wrap(backend.from_inner(tensor._prim), device, tensor._kind)

    # ================================================================ dispatch helpers
    def _unary(self, op: OpDef, *attrs, kind: Kind | None = None) -> Tensor:
        prim = getattr(self._device.backend, _primitive(op, self._kind))(self._prim, *attrs)
        return _wrap(prim, self._device, kind or self._kind)

    def _checked(self, op: OpDef, *attrs, kind: Kind | None = None) -> Tensor:
        """A one-tensor op whose attributes the rule must check first."""
        name = _primitive(op, self._kind)
        op.rule(op.name, self._aval(), *attrs)
        return _wrap(getattr(self._device.backend, name)(self._prim, *attrs), self._device, kind or self._kind)

    def _binary(self, op: OpDef, scalar_op: OpDef | None, other: Any, kind: Kind | None = None) -> Tensor:
        if isinstance(other, Tensor):
            a, b = self._operands(op, other)
            return _wrap(getattr(self._device.backend, _primitive(op, self._kind))(a, b), self._device, kind or self._kind)
        if scalar_op is None:  # no scalar form in the table: the scalar becomes a 0-d tensor
            scalar = Tensor.full((), self._scalar(op, other), self._device, self.dtype, self._kind)
            return self._binary(op, None, scalar, kind)
        return self._unary(scalar_op, self._scalar(op, other), kind=kind)

    def _scalar(self, op: OpDef, value: Any) -> Scalar:
        if isinstance(value, bool) or not isinstance(value, int | float):
            if hasattr(value, "item") and not isinstance(value, Tensor):
                value = value.item()  # a NumPy scalar
            elif not isinstance(value, bool):
                raise ArgumentError(f"{op.name}: expected a tensor or a number, got {type(value).__name__}")
        if self._kind is Kind.INT and isinstance(value, float):
            raise KindError(f"{op.name}: a float scalar ({value}) with an Int tensor; convert with .float() first")
        return value

    def _operands(self, op: OpDef, other: Tensor) -> tuple[Any, Any]:
        """Validated primitives of a binary op: same kind and device, broadcastable, one dtype."""
        if other._kind is not self._kind:
            raise KindError(
                f"{op.name}: operands have different kinds, {self._kind.value} and {other._kind.value}; "
                "convert one with .float(), .int() or .bool()"
            )
        _same_device(op.name, self, other)
        backend = self._device.backend
        a, b = self._prim, other._prim
        sa, sb = backend.shape(a), backend.shape(b)
        if sa != sb:
            broadcast_shapes(op.name, sa, sb)
        da, db = backend.dtype(a), backend.dtype(b)
        if da is not db:
            target = promote(da, db)
            cast = getattr(backend, _primitive(ops.cast, self._kind))
            a = a if da is target else cast(a, target)
            b = b if db is target else cast(b, target)
        return a, b

    def _reflected(self, op: OpDef, value: Any) -> Tensor:
        scalar = self._scalar(op, value)
        return Tensor.full((), scalar, self._device, self.dtype, self._kind)._binary(op, None, self)

    def _dim(self, op: str, dim: int) -> int:
        return check_dim(op, dim, len(self.shape))

    # ================================================================ arithmetic
    def add(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.add, ops.add_scalar, other)

    def sub(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.sub, ops.sub_scalar, other)

    def mul(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.mul, ops.mul_scalar, other)

    def div(self, other: Tensor | Scalar) -> Tensor:
        """Division; on Int tensors it truncates toward zero (as Burn and Rust do)."""
        return self._binary(ops.div, ops.div_scalar, other)

    def remainder(self, other: Tensor | Scalar) -> Tensor:
        """Remainder with the sign of the divisor (Python's ``%``, ``torch.remainder``)."""
        return self._binary(ops.remainder, ops.remainder_scalar, other)

    def pow(self, exponent: Tensor | Scalar) -> Tensor:
        return self._binary(ops.pow, ops.pow_scalar, exponent)

    powf = powi = powf_scalar = powi_scalar = pow
    add_scalar, sub_scalar, mul_scalar, div_scalar = add, sub, mul, div

    def max_pair(self, other: Tensor | Scalar) -> Tensor:
        """Element-wise maximum (``torch.maximum``)."""
        return self._binary(ops.max_pair, ops.max_pair_scalar, other)

    def min_pair(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.min_pair, ops.min_pair_scalar, other)

    def atan2(self, other: Tensor) -> Tensor:
        return self._binary(ops.atan2, None, other)

    def neg(self) -> Tensor:
        return self._unary(ops.neg)

    def abs(self) -> Tensor:
        return self._unary(ops.abs)

    def sign(self) -> Tensor:
        return self._unary(ops.sign)

    def clamp(self, min: Scalar | None = None, max: Scalar | None = None) -> Tensor:
        if min is None and max is None:
            raise ArgumentError("clamp: give min, max or both")
        lo = None if min is None else self._scalar(ops.clamp, min)
        hi = None if max is None else self._scalar(ops.clamp, max)
        return self._checked(ops.clamp, lo, hi)

    def clamp_min(self, min: Scalar) -> Tensor:
        return self.clamp(min=min)

    def clamp_max(self, max: Scalar) -> Tensor:
        return self.clamp(max=max)

    __add__ = add
    __radd__ = add
    __sub__ = sub
    __mul__ = mul
    __rmul__ = mul
    __truediv__ = div
    __mod__ = remainder
    __pow__ = pow
    __neg__ = neg
    __abs__ = abs

    def __rsub__(self, other: Scalar) -> Tensor:
        return self._reflected(ops.sub, other)

    def __rtruediv__(self, other: Scalar) -> Tensor:
        return self._reflected(ops.div, other)

    def __rmod__(self, other: Scalar) -> Tensor:
        return self._reflected(ops.remainder, other)

    def __rpow__(self, other: Scalar) -> Tensor:
        return self._reflected(ops.pow, other)

    def __pos__(self) -> Tensor:
        return self

    # ================================================================ float math
    def exp(self) -> Tensor:
        return self._unary(ops.exp)

    def log(self) -> Tensor:
        return self._unary(ops.log)

    def log1p(self) -> Tensor:
        return self._unary(ops.log1p)

    def expm1(self) -> Tensor:
        return self._unary(ops.expm1)

    def erf(self) -> Tensor:
        return self._unary(ops.erf)

    def sqrt(self) -> Tensor:
        return self._unary(ops.sqrt)

    def rsqrt(self) -> Tensor:
        return self._unary(ops.rsqrt)

    def recip(self) -> Tensor:
        return self._unary(ops.recip)

    def sin(self) -> Tensor:
        return self._unary(ops.sin)

    def cos(self) -> Tensor:
        return self._unary(ops.cos)

    def tan(self) -> Tensor:
        return self._unary(ops.tan)

    def sinh(self) -> Tensor:
        return self._unary(ops.sinh)

    def cosh(self) -> Tensor:
        return self._unary(ops.cosh)

    def tanh(self) -> Tensor:
        return self._unary(ops.tanh)

    def asin(self) -> Tensor:
        return self._unary(ops.asin)

    def acos(self) -> Tensor:
        return self._unary(ops.acos)

    def atan(self) -> Tensor:
        return self._unary(ops.atan)

    def round(self) -> Tensor:
        """Rounds half to even, as PyTorch does."""
        return self._unary(ops.round)

    def floor(self) -> Tensor:
        return self._unary(ops.floor)

    def ceil(self) -> Tensor:
        return self._unary(ops.ceil)

    def trunc(self) -> Tensor:
        return self._unary(ops.trunc)

    def is_nan(self) -> Tensor:
        return self._unary(ops.is_nan, kind=Kind.BOOL)

    def is_inf(self) -> Tensor:
        return self._unary(ops.is_inf, kind=Kind.BOOL)

    def sigmoid(self) -> Tensor:
        return self._unary(ops.sigmoid)

    # ================================================================ bitwise and logical
    def bitwise_and(self, other: Tensor | int) -> Tensor:
        return self._binary(ops.bitwise_and, ops.bitwise_and_scalar, other)

    def bitwise_or(self, other: Tensor | int) -> Tensor:
        return self._binary(ops.bitwise_or, ops.bitwise_or_scalar, other)

    def bitwise_xor(self, other: Tensor | int) -> Tensor:
        return self._binary(ops.bitwise_xor, ops.bitwise_xor_scalar, other)

    def bitwise_left_shift(self, other: Tensor | int) -> Tensor:
        return self._binary(ops.bitwise_left_shift, ops.bitwise_left_shift_scalar, other)

    def bitwise_right_shift(self, other: Tensor | int) -> Tensor:
        return self._binary(ops.bitwise_right_shift, ops.bitwise_right_shift_scalar, other)

    def bitwise_not(self) -> Tensor:
        return self._unary(ops.bitwise_not)

    def bool_and(self, other: Tensor) -> Tensor:
        return self._binary(_AND, None, other)

    def bool_or(self, other: Tensor) -> Tensor:
        return self._binary(_OR, None, other)

    def bool_xor(self, other: Tensor) -> Tensor:
        return self._binary(_XOR, None, other)

    def bool_not(self) -> Tensor:
        return self._unary(_NOT)

    def __and__(self, other):
        return self.bool_and(other) if self._kind is Kind.BOOL else self.bitwise_and(other)

    def __or__(self, other):
        return self.bool_or(other) if self._kind is Kind.BOOL else self.bitwise_or(other)

    def __xor__(self, other):
        return self.bool_xor(other) if self._kind is Kind.BOOL else self.bitwise_xor(other)

    def __invert__(self):
        return self.bool_not() if self._kind is Kind.BOOL else self.bitwise_not()

    def __lshift__(self, other):
        return self.bitwise_left_shift(other)

    def __rshift__(self, other):
        return self.bitwise_right_shift(other)

    __rand__, __ror__, __rxor__ = __and__, __or__, __xor__

    # ================================================================ comparisons
    def equal(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.equal, ops.equal_elem, other, Kind.BOOL)

    def not_equal(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.not_equal, ops.not_equal_elem, other, Kind.BOOL)

    def greater(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.greater, ops.greater_elem, other, Kind.BOOL)

    def greater_equal(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.greater_equal, ops.greater_equal_elem, other, Kind.BOOL)

    def lower(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.lower, ops.lower_elem, other, Kind.BOOL)

    def lower_equal(self, other: Tensor | Scalar) -> Tensor:
        return self._binary(ops.lower_equal, ops.lower_equal_elem, other, Kind.BOOL)

    equal_elem, not_equal_elem = equal, not_equal
    greater_elem, greater_equal_elem, lower_elem, lower_equal_elem = greater, greater_equal, lower, lower_equal
    __eq__ = equal  # type: ignore[assignment]
    __ne__ = not_equal  # type: ignore[assignment]
    __gt__ = greater
    __ge__ = greater_equal
    __lt__ = lower
    __le__ = lower_equal

    def all_close(self, other: Tensor, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
        """Whether every element is within ``atol + rtol * |other|`` (NaN never is)."""
        a, b = self.float(), other.float()
        diff = (a - b).abs()
        bound = other.float().abs() * rtol + atol
        return bool(diff.lower_equal(bound).all().item())

    # ================================================================ selection by mask
    def mask_where(self, mask: Tensor, value: Tensor) -> Tensor:
        """``value`` where ``mask`` is true, else ``self`` (``torch.where(mask, value, self)``)."""
        op = ops.mask_where
        if value._kind is not self._kind:
            raise KindError(f"mask_where: value is {value._kind.value} but the tensor is {self._kind.value}")
        _same_device(op.name, self, mask)
        _same_device(op.name, self, value)
        x, v = self._operands(op, value)
        dtype = self._device.backend.dtype(x)  # both operands promoted to one dtype
        op.rule(op.name, AVal(self.shape, dtype), mask._aval(), AVal(value.shape, dtype))
        prim = getattr(self._device.backend, _primitive(op, self._kind))(x, mask._prim, v)
        return _wrap(prim, self._device, self._kind)

    def mask_fill(self, mask: Tensor, value: Scalar) -> Tensor:
        op = ops.mask_fill
        _same_device(op.name, self, mask)
        value = self._scalar(op, value)
        op.rule(op.name, self._aval(), mask._aval(), value)
        return _wrap(getattr(self._device.backend, _primitive(op, self._kind))(self._prim, mask._prim, value),
                     self._device, self._kind)  # fmt: skip

    # ================================================================ reductions
    def sum(self) -> Tensor:
        """Sum of all elements, as a 0-d tensor."""
        return self._unary(ops.sum)

    def prod(self) -> Tensor:
        return self._unary(ops.prod)

    def mean(self) -> Tensor:
        """Mean of all elements (Int tensors: truncated toward zero)."""
        return self._unary(ops.mean)

    def max(self) -> Tensor:
        return self._checked(ops.max)

    def min(self) -> Tensor:
        return self._checked(ops.min)

    def _along(self, op: OpDef, dim: int, kind: Kind | None = None) -> Tensor:
        rank = len(self._device.backend.shape(self._prim))
        if not -rank <= dim < rank:
            if rank == 0 and dim in (0, -1):
                return _on_0d(self, lambda t: t._along(op, 0, kind))
            dim = check_dim(op.name, dim, rank)  # raises with the op's name
        elif dim < 0:
            dim += rank
        if op.rule is rules.reduce_dim_index or op.rule is rules.reduce_dim_nonempty:
            op.rule(op.name, self._aval(), dim)  # max_dim / argmax / ... of an empty dim
        return self._unary(op, dim, kind=kind)

    def sum_dim(self, dim: int) -> Tensor:
        """Sum along ``dim``, which is kept with size 1 (as Burn does)."""
        return self._along(ops.sum_dim, dim)

    def prod_dim(self, dim: int) -> Tensor:
        return self._along(ops.prod_dim, dim)

    def mean_dim(self, dim: int) -> Tensor:
        return self._along(ops.mean_dim, dim)

    def max_dim(self, dim: int) -> Tensor:
        return self._along(ops.max_dim, dim)

    def min_dim(self, dim: int) -> Tensor:
        return self._along(ops.min_dim, dim)

    def argmax(self, dim: int) -> Tensor:
        """Index of the first maximum along ``dim`` (kept with size 1), as an Int tensor."""
        return self._along(ops.argmax, dim, Kind.INT)

    def argmin(self, dim: int) -> Tensor:
        return self._along(ops.argmin, dim, Kind.INT)

    def _with_indices(self, op: OpDef, dim: int) -> tuple[Tensor, Tensor]:
        dim = self._dim(op.name, dim)
        if not self.shape:
            return _on_0d(self, lambda t: t._with_indices(op, 0))
        op.rule(op.name, self._aval(), dim)
        values, indices = getattr(self._device.backend, _primitive(op, self._kind))(self._prim, dim)
        return _wrap(values, self._device, self._kind), _wrap(indices, self._device, Kind.INT)

    def max_dim_with_indices(self, dim: int) -> tuple[Tensor, Tensor]:
        return self._with_indices(ops.max_dim_with_indices, dim)

    def min_dim_with_indices(self, dim: int) -> tuple[Tensor, Tensor]:
        return self._with_indices(ops.min_dim_with_indices, dim)

    def any(self) -> Tensor:
        return self._unary(ops.any, kind=Kind.BOOL)

    def all(self) -> Tensor:
        return self._unary(ops.all, kind=Kind.BOOL)

    def any_dim(self, dim: int) -> Tensor:
        return self._along(ops.any_dim, dim, Kind.BOOL)

    def all_dim(self, dim: int) -> Tensor:
        return self._along(ops.all_dim, dim, Kind.BOOL)

    def cumsum(self, dim: int) -> Tensor:
        return self._along(ops.cumsum, dim)

    def cumprod(self, dim: int) -> Tensor:
        return self._along(ops.cumprod, dim)

    def var(self, dim: int) -> Tensor:
        """Unbiased variance along ``dim`` (kept with size 1)."""
        return self._along_correction(ops.var, dim, 1)

    def var_bias(self, dim: int) -> Tensor:
        """Biased (population) variance along ``dim``."""
        return self._along_correction(ops.var, dim, 0)

    def var_mean(self, dim: int) -> tuple[Tensor, Tensor]:
        return self._along_correction(ops.var_mean, dim, 1)

    def var_mean_bias(self, dim: int) -> tuple[Tensor, Tensor]:
        return self._along_correction(ops.var_mean, dim, 0)

    def _along_correction(self, op: OpDef, dim: int, correction: int):
        dim = self._dim(op.name, dim)
        if not self.shape:
            return _on_0d(self, lambda t: t._along_correction(op, 0, correction))
        op.rule(op.name, self._aval(), dim, correction)
        out = getattr(self._device.backend, _primitive(op, self._kind))(self._prim, dim, correction)
        if isinstance(out, tuple):
            return tuple(_wrap(p, self._device, self._kind) for p in out)
        return _wrap(out, self._device, self._kind)

    # ================================================================ sorting
    def sort(self, dim: int = -1, descending: bool = False) -> Tensor:
        """Stable sort along ``dim``: equal elements keep their order, in both directions."""
        return self._sorted(ops.sort, dim, descending)

    def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
        return self._sorted(ops.argsort, dim, descending, Kind.INT)

    def sort_with_indices(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        dim = self._dim("sort_with_indices", dim)
        if not self.shape:
            return _on_0d(self, lambda t: t.sort_with_indices(0, descending))
        op = ops.sort_with_indices
        values, indices = getattr(self._device.backend, _primitive(op, self._kind))(self._prim, dim, bool(descending))
        return _wrap(values, self._device, self._kind), _wrap(indices, self._device, Kind.INT)

    def _sorted(self, op: OpDef, dim: int, descending: bool, kind: Kind | None = None) -> Tensor:
        dim = self._dim(op.name, dim)
        if not self.shape:
            return _on_0d(self, lambda t: t._sorted(op, 0, descending, kind))
        return self._unary(op, dim, bool(descending), kind=kind)

    def topk_with_indices(self, k: int, dim: int = -1, largest: bool = True) -> tuple[Tensor, Tensor]:
        """The ``k`` largest (or smallest) elements along ``dim``, sorted, with their indices."""
        dim = self._dim("topk", dim)
        size = self.shape[dim] if self.shape else 1
        if not 0 <= k <= size:
            raise ArgumentError(f"topk: k={k} is out of range for dim {dim} of size {size}")
        if not self.shape:  # k = 0 gives the element too, as in PyTorch
            return _on_0d(self, lambda t: t.topk_with_indices(1, 0, largest))
        values, indices = self.sort_with_indices(dim, descending=largest)
        return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)

    def topk(self, k: int, dim: int = -1, largest: bool = True) -> Tensor:
        return self.topk_with_indices(k, dim, largest)[0]

    # ================================================================ linear algebra
    def matmul(self, other: Tensor) -> Tensor:
        """Matrix product over the last two dims, broadcasting the batch dims."""
        op = ops.matmul
        a, b = self._operands_unbroadcast(op, other)
        return _wrap(getattr(self._device.backend, _primitive(op, self._kind))(a, b), self._device, self._kind)

    __matmul__ = matmul

    def _operands_unbroadcast(self, op: OpDef, other: Tensor):
        if not isinstance(other, Tensor):
            raise ArgumentError(f"{op.name}: expected a tensor, got {type(other).__name__}")
        if other._kind is not self._kind:
            raise KindError(f"{op.name}: operands have different kinds, {self._kind.value} and {other._kind.value}")
        _same_device(op.name, self, other)
        backend = self._device.backend
        a, b = self._prim, other._prim
        da, db = backend.dtype(a), backend.dtype(b)
        if da is not db:
            target = promote(da, db)
            cast = getattr(backend, _primitive(ops.cast, self._kind))
            a, b = cast(a, target), cast(b, target)
            da = target
        sa, sb = backend.shape(a), backend.shape(b)
        if not (len(sa) == 2 == len(sb) and sa[1] == sb[0]):  # the plain 2-d case needs no rule
            op.rule(op.name, AVal(sa, da), AVal(sb, da))
        return a, b

    # ================================================================ layout
    def reshape(self, shape: ShapeLike) -> Tensor:
        """A new shape with the same elements; one dim may be -1 (inferred), 0 keeps that dim."""
        backend = self._device.backend
        current = backend.shape(self._prim)
        target = shape if type(shape) is tuple else _dims(shape)
        if target == current:
            return self
        if -1 in target or 0 in target:
            target = _resolve_shape(current, target)
        if math.prod(target) != math.prod(current) or min(target, default=0) < 0:
            ops.reshape.rule("reshape", self._aval(), target)  # raises ShapeError
        prim = getattr(backend, _primitive(ops.reshape, self._kind))(self._prim, target)
        return _wrap(prim, self._device, self._kind)

    view = reshape

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        shape = self.shape
        if not shape:
            return self.reshape([1])
        s, e = self._dim("flatten", start_dim), self._dim("flatten", end_dim)
        if s > e:
            raise ArgumentError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        return self.reshape(shape[:s] + (math.prod(shape[s : e + 1]),) + shape[e + 1 :])

    def squeeze(self, dim: int | None = None) -> Tensor:
        """Removes ``dim`` (which must have size 1), or every size-1 dim when ``dim`` is None."""
        shape = self.shape
        if dim is None:
            return self.reshape([d for d in shape if d != 1])
        d = self._dim("squeeze", dim)
        if shape[d] != 1:
            raise ShapeError(f"squeeze: dim {dim} of shape {fmt_shape(shape)} has size {shape[d]}, not 1")
        return self.reshape(shape[:d] + shape[d + 1 :])

    def squeeze_dims(self, dims: Sequence[int]) -> Tensor:
        shape = self.shape
        drop = {self._dim("squeeze_dims", d) for d in dims}
        for d in drop:
            if shape[d] != 1:
                raise ShapeError(f"squeeze_dims: dim {d} of shape {fmt_shape(shape)} has size {shape[d]}, not 1")
        return self.reshape([s for i, s in enumerate(shape) if i not in drop])

    def unsqueeze(self) -> Tensor:
        """Adds a leading dim of size 1."""
        return self.unsqueeze_dim(0)

    def unsqueeze_dim(self, dim: int) -> Tensor:
        shape = self.shape
        d = check_dim("unsqueeze_dim", dim, len(shape) + 1)
        return self._checked(ops.reshape, shape[:d] + (1,) + shape[d:])

    def unsqueeze_dims(self, dims: Sequence[int]) -> Tensor:
        out = self
        rank = self.rank + len(dims)
        for d in sorted(check_dim("unsqueeze_dims", d, rank) for d in dims):
            out = out.unsqueeze_dim(d)
        return out

    def permute(self, *axes: int | Sequence[int]) -> Tensor:
        order = _dims(axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else axes)
        rank = self.rank
        order = tuple([check_dim("permute", a, rank) for a in order])
        if order == tuple(range(rank)):
            return self
        return self._checked(ops.permute, order)

    def swap_dims(self, dim1: int, dim2: int) -> Tensor:
        rank = self.rank
        a, b = check_dim("swap_dims", dim1, rank), check_dim("swap_dims", dim2, rank)
        order = list(range(rank))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def transpose(self) -> Tensor:
        """Swaps the last two dims (Burn's ``transpose``)."""
        if self.rank < 2:
            return self
        return self.swap_dims(-2, -1)

    @property
    def T(self) -> Tensor:
        return self.transpose()

    def movedim(self, source: int, destination: int) -> Tensor:
        rank = self.rank
        s, d = check_dim("movedim", source, rank), check_dim("movedim", destination, rank)
        order = [i for i in range(rank) if i != s]
        order.insert(d, s)
        return self.permute(order)

    def expand(self, shape: ShapeLike) -> Tensor:
        """Broadcasts to ``shape`` without copying; -1 keeps a dim."""
        dims = list(_dims(shape))
        current = self.shape
        offset = len(dims) - len(current)
        for i, d in enumerate(dims):
            if d == -1:
                if i < offset:
                    raise ShapeError(f"expand: -1 is not allowed for the new leading dim {i}")
                dims[i] = current[i - offset]
        if tuple(dims) == current:
            return self
        return self._checked(ops.expand, tuple(dims))

    def broadcast_to(self, shape: ShapeLike) -> Tensor:
        return self.expand(shape)

    def flip(self, dims: Sequence[int]) -> Tensor:
        rank = self.rank
        axes = tuple(check_dim("flip", d, rank) for d in _dims(dims))
        return self._checked(ops.flip, axes)

    def slice(self, ranges: Sequence[Any]) -> Tensor:
        """Slices with one range per leading dim: ``(start, stop)``, ``(start, stop, step)``,
        a Python ``slice`` or ``None`` for the whole dim; negative bounds count from the end.

        Example:
            >>> Tensor.arange(10).slice([(2, 8, 3)]).tolist()
            [2, 5]
        """
        return self[tuple(_as_slice(r) for r in ranges)]

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        d = self._dim("narrow", dim)
        size = self.shape[d]
        if start < 0:
            start += size
        if not (start >= 0 and length >= 0 and start + length <= size):
            raise ArgumentError(f"narrow: start {start} and length {length} exceed dim {dim} of size {size}")
        ranges = [(0, s, 1) for s in self.shape]
        ranges[d] = (start, start + length, 1)
        return self._checked(ops.slice, tuple(ranges))

    def _ranges(self, op: str, ranges: Sequence[Any]) -> tuple[tuple[int, int, int], ...]:
        shape = self.shape
        if len(ranges) > len(shape):
            raise ShapeError(f"{op}: {len(ranges)} ranges for a tensor of shape {fmt_shape(shape)}")
        out = []
        for d, size in enumerate(shape):
            r = _as_slice(ranges[d]) if d < len(ranges) else slice(None)
            if r.step not in (None, 1):
                raise ArgumentError(f"{op}: ranges need step 1, got {r.step} for dim {d}")
            begin, end, _ = r.indices(size)
            out.append((begin, max(begin, end), 1))
        return tuple(out)

    def slice_assign(self, ranges: Sequence[Any], values: Tensor) -> Tensor:
        """A copy with the region ``ranges`` replaced by ``values`` (``x[ranges] = values``)."""
        op = ops.slice_assign
        norm = self._ranges(op.name, ranges)
        x, v = self._operands_values(op, values)
        op.rule(op.name, AVal(self.shape, self._device.backend.dtype(x)), values._aval_as(self), norm)
        return _wrap(getattr(self._device.backend, _primitive(op, self._kind))(x, v, norm), self._device, self._kind)

    def slice_fill(self, ranges: Sequence[Any], value: Scalar) -> Tensor:
        """A copy with every element of the region ``ranges`` set to ``value``."""
        norm = self._ranges("slice_fill", ranges)
        region = tuple(len(range(*r)) for r in norm)
        return self.slice_assign(ranges, Tensor.full(region, self._scalar(ops.slice_assign, value),
                                                     self._device, self.dtype, self._kind))  # fmt: skip

    def _operands_values(self, op: OpDef, values: Tensor) -> tuple[Any, Any]:
        if not isinstance(values, Tensor):
            raise ArgumentError(f"{op.name}: values must be a tensor, got {type(values).__name__}")
        if values._kind is not self._kind:
            raise KindError(f"{op.name}: values are {values._kind.value} but the tensor is {self._kind.value}")
        _same_device(op.name, self, values)
        v = values._prim
        if values.dtype is not self.dtype:
            v = getattr(self._device.backend, _primitive(ops.cast, self._kind))(v, self.dtype)
        return self._prim, v

    def _aval_as(self, like: Tensor) -> AVal:
        return AVal(self.shape, like.dtype)

    def __getitem__(self, key: Any) -> Tensor:
        shape = self._device.backend.shape(self._prim)
        if type(key) is slice and shape and key.step is None:
            # The common x[a:b]: one forward range on dim 0, no plan needed.
            start, stop, _ = key.indices(shape[0])
            ranges = ((start, max(start, stop), 1),)  # ranges cover leading dims only
            prim = getattr(self._device.backend, _primitive(ops.slice, self._kind))(self._prim, ranges)
            return _wrap(prim, self._device, self._kind)
        plan = parse_key(key, shape, lambda it: isinstance(it, Tensor))
        out = self
        if any(r != (0, s, 1) for r, s in zip(plan.ranges, shape)):
            out = out._checked(ops.slice, tuple(plan.ranges))
        if plan.flips:
            out = out._checked(ops.flip, tuple(plan.flips))
        final = list(plan.out_shape)
        if plan.select is not None:
            dim, index = plan.select
            index = index if isinstance(index, Tensor) else Tensor.from_data(index, self._device, kind=Kind.INT)
            if index.rank != 1:
                raise ShapeError(f"index tensors must be 1-d, got shape {fmt_shape(index.shape)}")
            out = out.select(dim, index)
            final[final.index(-1)] = index.shape[0]
        return out.reshape(final) if tuple(final) != out.shape else out

    def split(self, split_size: int | Sequence[int], dim: int = 0) -> list[Tensor]:
        """Pieces of ``split_size`` along ``dim`` (the last may be smaller), or of the given sizes."""
        d = self._dim("split", dim)
        size = self.shape[d]
        if isinstance(split_size, int):
            if split_size <= 0:
                raise ArgumentError(f"split: split_size must be positive, got {split_size}")
            sizes = [min(split_size, size - s) for s in range(0, size, split_size)] or [0]
        else:
            sizes = list(split_size)
            if sum(sizes) != size or any(s < 0 for s in sizes):
                raise ShapeError(f"split: sizes {sizes} do not add up to dim {dim} of size {size}")
        pieces, start = [], 0
        for s in sizes:
            pieces.append(self.narrow(d, start, s))
            start += s
        return pieces

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        """At most ``chunks`` pieces of equal size (the last may be smaller), like PyTorch."""
        if chunks <= 0:
            raise ArgumentError(f"chunk: chunks must be positive, got {chunks}")
        size = self.shape[self._dim("chunk", dim)]
        if size == 0:
            return self.split([0] * chunks, dim)  # torch gives ``chunks`` empty pieces
        return self.split(max(1, -(-size // chunks)), dim)

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int]) -> Tensor:
        """Rotates elements along ``dims``; elements shifted past the end come back at the start."""
        shifts, dims = _dims(shifts), _dims(dims)
        if len(shifts) != len(dims):
            raise ArgumentError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
        out = self
        for shift, dim in zip(shifts, dims):
            d = self._dim("roll", dim)
            size = self.shape[d]
            k = shift % size if size else 0
            if k:
                out = Tensor.cat([out.narrow(d, size - k, k), out.narrow(d, 0, size - k)], d)
        return out

    def repeat_dim(self, dim: int, times: int) -> Tensor:
        """The tensor repeated ``times`` times along ``dim`` (tiled, like ``torch.repeat``)."""
        return self._checked(ops.repeat_dim, self._dim("repeat_dim", dim), times)

    def repeat(self, sizes: Sequence[int]) -> Tensor:
        """Tiles the tensor ``sizes[i]`` times along dim ``i`` (``torch.Tensor.repeat``)."""
        sizes = _dims(sizes)
        if len(sizes) < self.rank:
            raise ArgumentError(f"repeat: {len(sizes)} sizes for a tensor of rank {self.rank}")
        out = self.reshape((1,) * (len(sizes) - self.rank) + self.shape)
        for d, times in enumerate(sizes):
            if times != 1:
                out = out.repeat_dim(d, times)
        return out

    @staticmethod
    def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
        """Concatenates tensors of one kind along an existing dim."""
        op = ops.cat
        tensors = list(tensors)
        if not tensors:
            raise ArgumentError("cat: needs at least one tensor")
        first = tensors[0]
        if not first.shape:
            raise ShapeError("cat: cannot concatenate 0-d tensors (shape []); use stack")
        d = first._dim("cat", dim)
        dtype = first.dtype
        for t in tensors[1:]:
            if t._kind is not first._kind:
                raise KindError(f"cat: tensors of kinds {first._kind.value} and {t._kind.value}")
            _same_device("cat", first, t)
            dtype = promote(dtype, t.dtype)
        tensors = [t.cast(dtype) for t in tensors]
        op.rule(op.name, *[t._aval() for t in tensors], d)
        prim = getattr(first._device.backend, _primitive(op, first._kind))([t._prim for t in tensors], d)
        return _wrap(prim, first._device, first._kind)

    @staticmethod
    def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
        """Joins tensors of one shape along a new dim."""
        tensors = list(tensors)
        if not tensors:
            raise ArgumentError("stack: needs at least one tensor")
        shape, kind = tensors[0].shape, tensors[0]._kind
        for t in tensors[1:]:
            if t._kind is not kind:
                raise KindError(f"stack: tensors of kinds {kind.value} and {t._kind.value}")
            if t.shape != shape:
                raise ShapeError(f"stack: shapes {fmt_shape(shape)} and {fmt_shape(t.shape)} differ")
        d = check_dim("stack", dim, len(shape) + 1)
        return Tensor.cat([t.unsqueeze_dim(d) for t in tensors], d)

    def tril(self, diagonal: int = 0) -> Tensor:
        """Zeroes the elements above the ``diagonal``-th diagonal of the last two dims."""
        return self._triangle(diagonal, upper=False)

    def triu(self, diagonal: int = 0) -> Tensor:
        return self._triangle(diagonal, upper=True)

    def _triangle(self, diagonal: int, upper: bool) -> Tensor:
        if self.rank < 2:
            raise ShapeError(f"{'triu' if upper else 'tril'}: needs rank >= 2, got {fmt_shape(self.shape)}")
        rows, cols = self.shape[-2:]
        r = Tensor.arange(rows, device=self._device).reshape([rows, 1])
        c = Tensor.arange(cols, device=self._device).reshape([1, cols])
        offset = c - r
        drop = offset.lower(diagonal) if upper else offset.greater(diagonal)
        zero = False if self._kind is Kind.BOOL else 0
        return self.mask_fill(drop, zero)

    def argwhere(self) -> Tensor:
        """Indices ``[n, rank]`` of the true (nonzero) elements, in row-major order."""
        mask = self if self._kind is Kind.BOOL else self.bool()
        return mask._unary(ops.argwhere, kind=Kind.INT)

    def nonzero(self) -> list[Tensor]:
        """One 1-d index tensor per dim, of the nonzero elements (``torch.nonzero(as_tuple=True)``)."""
        found = self.argwhere()
        return [found[:, d] for d in range(self.rank)]

    def one_hot(self, num_classes: int) -> Tensor:
        """Int indices ``[...]`` to a one-hot Int tensor ``[..., num_classes]``."""
        if self._kind is not Kind.INT:
            raise KindError(f"one_hot: needs an Int tensor of class indices, got {self._kind.value}")
        if num_classes <= 0:
            raise ArgumentError(f"one_hot: num_classes must be positive, got {num_classes}")
        classes = Tensor.arange(num_classes, device=self._device).cast(self.dtype)
        return self.unsqueeze_dim(-1).equal(classes).int()

    # ================================================================ indexing
    def gather(self, dim: int, indices: Tensor) -> Tensor:
        """``out[i][j] = self[indices[i][j]][j]`` for ``dim=0`` (``torch.gather``)."""
        return self._indexed(ops.gather, dim, indices)

    def scatter(self, dim: int, indices: Tensor, values: Tensor) -> Tensor:
        """Adds ``values`` into a copy at ``indices`` along ``dim`` (``torch.scatter_add``)."""
        return self._indexed(ops.scatter_add, dim, indices, values)

    scatter_add = scatter

    def select(self, dim: int, indices: Tensor | Sequence[int]) -> Tensor:
        """The slices at ``indices`` along ``dim`` (``torch.index_select``)."""
        return self._indexed(ops.select, dim, indices)

    def select_assign(self, dim: int, indices: Tensor, values: Tensor) -> Tensor:
        """Adds ``values`` into a copy at ``indices`` along ``dim`` (``torch.index_add``), as Burn does."""
        return self._indexed(ops.select_assign, dim, indices, values)

    def _indexed(self, op: OpDef, dim: int, indices: Any, values: Tensor | None = None) -> Tensor:
        d = self._dim(op.name, dim)
        if not isinstance(indices, Tensor):
            indices = Tensor.from_data(indices, self._device, kind=Kind.INT)
        _same_device(op.name, self, indices)
        operands = [self._aval(), indices._aval()]
        prims = [self._prim, indices._prim]
        if values is not None:
            x, v = self._operands_values(op, values)
            operands.append(values._aval_as(self))
            prims = [x, indices._prim, v]
        name = _primitive(op, self._kind)
        op.rule(op.name, *operands, d)
        try:
            prim = getattr(self._device.backend, name)(*prims, d)
        except (IndexError, RuntimeError) as error:
            # Bounds are the kernels' to check: a check here would read the indices (a sync).
            raise EmberIndexError(
                f"{op.name}: an index is outside [0, {self.shape[d]}) along dim {d} of a tensor "
                f"of shape {fmt_shape(self.shape)} ({error})"
            ) from None
        return _wrap(prim, self._device, self._kind)

    # ================================================================ module op on all kinds
    def pad(self, pads: Sequence[int], value: Scalar = 0, mode: str = "constant") -> Tensor:
        """Pads the last dims; ``pads`` is ``(left, right, top, bottom, ...)`` as in ``torch.nn.functional.pad``."""
        from ember.backend.options import PadOptions

        pads = _dims(pads)
        if len(pads) % 2:
            raise ArgumentError(f"pad: needs an even number of values, got {len(pads)}")
        pairs = tuple((pads[i], pads[i + 1]) for i in range(0, len(pads), 2))[::-1]
        value = self._scalar(ops.pad, value)
        return self._checked(ops.pad, PadOptions(pairs, mode, value))  # type: ignore[arg-type]


def _on_0d(x: Tensor, run: Any) -> Any:
    """A dim op of a 0-d tensor along dim 0: ``run`` on its one element as a [1] tensor,
    the result(s) back to 0-d, as PyTorch has it."""
    out = run(x.reshape([1]))
    return tuple(t.reshape([]) for t in out) if isinstance(out, tuple) else out.reshape([])


def _resolve_shape(current: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    """Fills in reshape's special dims: 0 keeps the current size, -1 takes what is left."""
    out = list(dims)
    for i, d in enumerate(out):
        if d == 0 and i < len(current) and 0 not in current:
            out[i] = current[i]
    if out.count(-1) > 1:
        raise ShapeError(f"reshape: only one dim can be -1, got {fmt_shape(dims)}")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(current)
        if known == 0 or total % known:
            raise ShapeError(f"reshape: cannot reshape {fmt_shape(current)} into {fmt_shape(dims)}")
        out[out.index(-1)] = total // known
    return tuple(out)


def _as_slice(r: Any) -> slice:
    if r is None:
        return slice(None)
    if isinstance(r, slice):
        return r
    if isinstance(r, int):
        return slice(r, r + 1 or None)  # -1 is the last element, not the empty -1:0
    if isinstance(r, tuple | list) and len(r) in (2, 3):
        return slice(*r)
    raise ArgumentError(f"a range must be (start, stop[, step]), a slice, an int or None; got {r!r}")



_AND, _OR, _XOR, _NOT = (getattr(ops, n) for n in ("and", "or", "xor", "not"))
