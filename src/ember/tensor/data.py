"""TensorData: the backend-independent host container of a tensor's elements.

TensorData is what crosses the boundary between backends: ``Tensor.from_data``
takes one, ``Tensor.into_data`` gives one back, records save them. It holds a
C-contiguous NumPy buffer (with ``ml_dtypes`` for bfloat16), its shape and its
ember :class:`DType`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ember.backend.errors import DTypeError, ShapeError, fmt_shape
from ember.tensor.dtype import DType, Kind

_TO_NUMPY: dict[DType, np.dtype] = {
    DType.F64: np.dtype(np.float64),
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.I64: np.dtype(np.int64),
    DType.I32: np.dtype(np.int32),
    DType.I16: np.dtype(np.int16),
    DType.I8: np.dtype(np.int8),
    DType.U64: np.dtype(np.uint64),
    DType.U32: np.dtype(np.uint32),
    DType.U16: np.dtype(np.uint16),
    DType.U8: np.dtype(np.uint8),
    DType.BOOL: np.dtype(np.bool_),
    DType.F8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.F8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DType.F8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.F8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DType.F8E8M0FNU: np.dtype(ml_dtypes.float8_e8m0fnu),
    DType.F4E2M1FN: np.dtype(ml_dtypes.float4_e2m1fn),
    DType.I4: np.dtype(ml_dtypes.int4),
    DType.U4: np.dtype(ml_dtypes.uint4),
    DType.I2: np.dtype(ml_dtypes.int2),
    DType.U2: np.dtype(ml_dtypes.uint2),
}
_FROM_NUMPY: dict[np.dtype, DType] = {v: k for k, v in _TO_NUMPY.items()}
# ml_dtypes types, which Python's numbers and NumPy's printing see as opaque: shown through the
# f32 / i64 that holds each of them exactly.
_PLAIN: dict[np.dtype, np.dtype] = {
    _TO_NUMPY[d]: np.dtype(np.float32 if d.is_float else np.int64)
    for d in DType if d is DType.BF16 or d.is_low_precision
}


def _plain(array: np.ndarray) -> np.ndarray:
    plain = _PLAIN.get(array.dtype)
    return array if plain is None else array.astype(plain)


def numpy_dtype(dtype: DType) -> np.dtype:
    """The NumPy dtype that stores ``dtype``."""
    return _TO_NUMPY[dtype]


def dtype_of_numpy(np_dtype: np.dtype) -> DType:
    """The ember dtype of a NumPy dtype; a clear error for types ember has no equivalent of."""
    found = _FROM_NUMPY.get(np_dtype)
    if found is None:
        found = _FROM_NUMPY.get(np.dtype(np_dtype).newbyteorder("="))
        if found is None:
            known = ", ".join(d.value for d in DType)
            raise DTypeError(f"NumPy dtype {np_dtype} has no ember equivalent; supported: {known}")
    return found


class TensorData:
    """A tensor's elements on the host: a contiguous buffer, a shape and a dtype.

    Args:
        value: nested lists, a scalar, a NumPy array, or another TensorData.
        dtype: element type to convert to. Without it, NumPy arrays keep theirs
            and Python values get f64 / i64 / bool by kind.

    Example:
        >>> d = TensorData([[1.0, 2.0], [3.0, 4.0]], "f32")
        >>> d.shape, d.dtype
        ((2, 2), DType.F32)
    """

    __slots__ = ("_array",)

    def __init__(self, value: Any, dtype: DType | str | None = None) -> None:
        target = None if dtype is None else DType.parse(dtype)
        if isinstance(value, TensorData):
            array = value._array
        elif isinstance(value, np.ndarray | np.generic):
            # A copy: the caller may write to their array later, tensors never change.
            array = np.array(value, copy=True)
        else:
            array = _array_from_python(value)
        dtype_of_numpy(array.dtype)  # rejects unsupported NumPy dtypes early, by name
        if not array.dtype.isnative:  # big-endian input: store native order
            array = array.astype(array.dtype.newbyteorder("="))
        if target is not None:
            array = cast_array(array, target)
        self._array = np.asarray(array, order="C")

    @staticmethod
    def is_array(value: Any) -> bool:
        """Whether ``value`` is a NumPy array or scalar (which keeps its dtype in ``from_data``)."""
        return isinstance(value, np.ndarray | np.generic)

    @classmethod
    def _wrap(cls, array: np.ndarray) -> TensorData:
        """TensorData over ``array`` without a copy; for backends handing out their buffers."""
        data = object.__new__(cls)
        data._array = array
        return data

    # ----------------------------------------------------------------- access
    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @property
    def dtype(self) -> DType:
        return _FROM_NUMPY[self._array.dtype]

    @property
    def kind(self) -> Kind:
        return self.dtype.kind

    @property
    def rank(self) -> int:
        return self._array.ndim

    def num_elements(self) -> int:
        return self._array.size

    def to_numpy(self) -> np.ndarray:
        """The elements as a read-only NumPy array (no copy)."""
        view = self._array.view()
        view.flags.writeable = False
        return view

    def buffer(self) -> np.ndarray:
        """The underlying array itself, shared: for backends that wrap host memory without a
        copy. Nobody may write to it, since TensorData and tensors never change."""
        return self._array

    def tolist(self) -> Any:
        """Nested Python lists (a Python scalar for rank 0)."""
        return _plain(self._array).tolist()

    def item(self) -> float | int | bool:
        """The single element of a one-element TensorData."""
        if self._array.size != 1:
            raise ShapeError(f"item() needs exactly one element, got shape {fmt_shape(self.shape)}")
        return _plain(self._array.reshape(())).item()

    def convert(self, dtype: DType | str) -> TensorData:
        """A copy with the elements converted to ``dtype`` (self when it already is)."""
        target = DType.parse(dtype)
        if target is self.dtype:
            return self
        return TensorData(cast_array(self._array, target))

    def format(self, threshold: int = 1000, edge_items: int = 3) -> str:
        """The elements as nested brackets; past ``threshold`` elements only the edges show."""
        array = _plain(self._array)
        return np.array2string(
            array, separator=", ", threshold=threshold, edgeitems=edge_items,
            formatter={"float_kind": _format_float}, max_line_width=100,
        )  # fmt: skip

    # ------------------------------------------------------------------ bytes
    def to_bytes(self) -> bytes:
        """The raw little-endian element bytes, row-major."""
        array = self._array
        if array.dtype.byteorder == ">":
            array = array.byteswap().view(array.dtype.newbyteorder("<"))
        return array.tobytes()

    @staticmethod
    def from_bytes(buffer: bytes, shape: Sequence[int], dtype: DType | str) -> TensorData:
        """Rebuilds TensorData from :meth:`to_bytes` output; checks the byte count."""
        dt = DType.parse(dtype)
        shape = tuple(int(s) for s in shape)
        expected = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if len(buffer) != expected:
            raise ShapeError(
                f"from_bytes: {len(buffer)} bytes cannot hold shape {fmt_shape(shape)} of {dt} "
                f"({expected} bytes expected)"
            )
        array = np.frombuffer(buffer, dtype=_TO_NUMPY[dt].newbyteorder("<")).reshape(shape)
        return TensorData(array.astype(_TO_NUMPY[dt], copy=True))

    # ------------------------------------------------------------ comparisons
    def assert_eq(self, other: Any, strict: bool = True) -> None:
        """Asserts equal shapes and elements (NaN equals NaN); with ``strict`` also equal dtypes."""
        other = other if isinstance(other, TensorData) else TensorData(other)
        if strict and self.dtype is not other.dtype:
            raise AssertionError(f"dtypes differ: {self.dtype} != {other.dtype}")
        self._check_shape(other)
        a, b = _plain(self._array), _plain(other._array)
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            a, b = a.astype(np.float64), b.astype(np.float64)
        equal = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b
        if not np.all(equal):
            self._report(other, ~equal, "elements differ")

    def assert_approx_eq(self, other: Any, rtol: float = 1e-5, atol: float = 1e-8) -> None:
        """Asserts equal shapes and ``|self - other| <= atol + rtol * |other|`` everywhere.

        NaN equals NaN and infinities must match exactly. The error names the first
        mismatching index and the largest difference.

        Example:
            >>> TensorData([1.0, 2.0]).assert_approx_eq([1.0, 2.0 + 1e-7], rtol=1e-6)
        """
        other = other if isinstance(other, TensorData) else TensorData(other)
        self._check_shape(other)
        a = self._array.astype(np.float64)
        b = other._array.astype(np.float64)
        with np.errstate(invalid="ignore"):
            close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if not np.all(close):
            self._report(other, ~close, f"not within rtol={rtol}, atol={atol}")

    def _check_shape(self, other: TensorData) -> None:
        if self.shape != other.shape:
            raise AssertionError(
                f"shapes differ: {fmt_shape(self.shape)} != {fmt_shape(other.shape)}"
            )

    def _report(self, other: TensorData, bad: np.ndarray, what: str) -> None:
        first = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
        a = self._array.astype(np.float64) if self._array.dtype.kind != "b" else self._array
        b = other._array.astype(np.float64) if other._array.dtype.kind != "b" else other._array
        with np.errstate(invalid="ignore"):
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            # fmax skips NaN differences (a NaN mismatch) without nanmax's all-NaN warning.
            worst = float(np.fmax.reduce(np.where(bad, diff, 0.0), axis=None)) if diff.size else 0.0
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements; first at index {list(first)}: "
            f"{a[first]} != {b[first]}; largest difference {worst:.6g}"
        )

    # ---------------------------------------------------------------- dunders
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorData):
            return NotImplemented
        return (
            self.dtype is other.dtype
            and self.shape == other.shape
            and bool(np.array_equal(self._array, other._array, equal_nan=self.kind is Kind.FLOAT))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TensorData(shape={fmt_shape(self.shape)}, dtype={self.dtype}, {self.tolist()})"


def _format_float(value: np.floating) -> str:
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0 or 1e-4 <= abs(value) < 1e8:
        return np.format_float_positional(value, unique=True, trim="0")
    return np.format_float_scientific(value, unique=True, trim="0")


def _array_from_python(value: Any) -> np.ndarray:
    if isinstance(value, bool | int | float):
        return np.asarray(value)
    try:
        array = np.asarray(value)
    except ValueError as err:  # NumPy's message for ragged nested lists
        raise ShapeError(f"nested lists are ragged, they do not form a tensor: {err}") from None
    if array.dtype == object:
        raise ShapeError("nested lists are ragged or hold non-numbers; cannot build a tensor")
    if array.size == 0 and array.dtype == np.float64:
        return array.astype(np.float64)
    return array


def _holds_floats(np_dtype: np.dtype) -> bool:
    """Whether a NumPy dtype holds floats: NumPy's own or ml_dtypes' (bfloat16, float8...)."""
    found = _FROM_NUMPY.get(np_dtype)
    return np_dtype.kind == "f" or (found is not None and found.is_float)


def cast_array(array: np.ndarray, target: DType) -> np.ndarray:
    """``array`` as ``target``'s NumPy dtype (itself when it already is). Float to int
    truncates toward zero, as PyTorch and Rust casts do, and wraps out-of-range values."""
    np_target = _TO_NUMPY[target]
    if array.dtype == np_target:
        return array
    with np.errstate(invalid="ignore", over="ignore"):
        if target.is_int and _holds_floats(array.dtype):
            array = np.trunc(array)
            if np_target.kind == "V":
                # ml_dtypes' 4 and 2-bit ints through int64: from a float, ml_dtypes 0.7
                # makes an out-of-range value 0 instead of wrapping it as from an int
                array = array.astype(np.int64)
        return array.astype(np_target)
