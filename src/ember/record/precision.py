"""Precision settings: the element types a record's tensors are saved with.

A recorder saves every tensor at its settings' precision, whatever precision the
model trains at: each Float tensor is converted to ``float_dtype`` and each Int
tensor to ``int_dtype``. Two kinds keep their dtype:

- Bool tensors (a mask is a mask at any precision);
- byte tensors, ``u8`` and ``i8``: bytes (images, quantized weights, packed int4
  values, flags) mean something as bytes, and turning them into ``i16`` / ``i32``
  would only make them bigger (a quantized model's record would be as large as a
  float one).

Loading never converts: a tensor comes back in the dtype it was stored with, and
the module that loads it converts to its own dtype, so a record written at any
precision loads into a model of any precision.

Narrowing conversions behave differently by kind, on purpose:

- Floats round to the nearest value of the narrower type; values beyond its
  range become ``±inf`` (f16 tops out at 65504), as a cast does everywhere.
  That is the accepted price of a half-precision file, not an error.
- Ints never wrap silently: a value outside the narrower type's range (say
  40000 saved as ``i16``) raises :class:`~ember.backend.errors.RecordError`
  naming the record path, the values found and the range allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.backend.errors import ArgumentError, RecordError
from ember.tensor import DType, TensorData
from ember.tensor.data import numpy_dtype


@dataclass(frozen=True)
class PrecisionSettings:
    """The float and int dtypes a recorder stores tensors with.

    Args:
        name: a short name saved in the file's metadata (``"full"``).
        float_dtype: the dtype every Float tensor is saved as.
        int_dtype: the dtype every Int tensor except bytes (``u8``, ``i8``) and unsigned
            ones is saved as.

    Raises:
        ArgumentError: ``float_dtype`` is not a float dtype, or ``int_dtype`` not a signed
            int dtype.

    Example:
        >>> from ember import TensorData
        >>> HalfPrecision.convert(TensorData([1.5, 70000.0], "f32")).tolist()
        [1.5, inf]
        >>> HalfPrecision.convert(TensorData([1, 2], "i64")).dtype
        DType.I16
    """

    name: str
    float_dtype: DType
    int_dtype: DType

    def __post_init__(self) -> None:
        float_dtype = DType.parse(self.float_dtype)
        int_dtype = DType.parse(self.int_dtype)
        if not float_dtype.is_float:
            raise ArgumentError(f"precision {self.name!r}: float_dtype must be a float dtype, "
                                f"got {float_dtype}")
        if not int_dtype.is_int or int_dtype.is_unsigned:
            raise ArgumentError(f"precision {self.name!r}: int_dtype must be a signed int dtype, "
                                f"got {int_dtype}")
        object.__setattr__(self, "float_dtype", float_dtype)
        object.__setattr__(self, "int_dtype", int_dtype)

    def target(self, dtype: DType) -> DType:
        """The dtype a tensor of ``dtype`` is saved as under these settings."""
        # Low-precision storage dtypes (float8, 4-bit...) are already what the model chose to
        # store; widening or narrowing them would change the values or waste the saving.
        if dtype.is_low_precision:
            return dtype
        if dtype.is_float:
            return self.float_dtype
        # Unsigned ints keep their dtype: a signed int_dtype could not hold their range; so
        # do signed bytes (quantized values), which no int_dtype would make smaller.
        if dtype.is_int and not dtype.is_unsigned and dtype is not DType.I8:
            return self.int_dtype
        return dtype

    def convert(self, data: TensorData, path: str = "") -> TensorData:
        """``data`` at these settings' precision (``data`` itself when it already is).

        Args:
            data: the tensor to save.
            path: its record path, for the error message.

        Raises:
            RecordError: an Int value does not fit ``int_dtype``.
        """
        target = self.target(data.dtype)
        if target is data.dtype:
            return data
        if target.is_int and target.itemsize < data.dtype.itemsize and data.num_elements():
            _check_int_range(data, target, path)
        return data.convert(target)

    def metadata(self) -> dict[str, Any]:
        """The settings as saved in a file's metadata."""
        return {"name": self.name, "float": self.float_dtype.value, "int": self.int_dtype.value}

    def __repr__(self) -> str:
        known = _NAMES.get(self)
        if known is not None:
            return known
        return (f"PrecisionSettings({self.name!r}, float_dtype={self.float_dtype.value!r}, "
                f"int_dtype={self.int_dtype.value!r})")


def _check_int_range(data: TensorData, target: DType, path: str) -> None:
    values = data.to_numpy()
    low, high = int(values.min()), int(values.max())
    info = np.iinfo(numpy_dtype(target))
    if low < info.min or high > info.max:
        where = f"record path {path}" if path else "record"
        raise RecordError(
            f"{where}: {data.dtype} values range from {low} to {high}, which does not fit "
            f"{target} [{info.min}, {info.max}]; save at a precision with a wider int dtype "
            f"(FullPrecision stores i32, DoublePrecision i64)",
            path=path or None,
        )


DoublePrecision = PrecisionSettings("double", DType.F64, DType.I64)
"""f64 floats, i64 ints: nothing is ever rounded."""

FullPrecision = PrecisionSettings("full", DType.F32, DType.I32)
"""f32 floats, i32 ints: the default of every recorder."""

HalfPrecision = PrecisionSettings("half", DType.F16, DType.I16)
"""f16 floats, i16 ints: half the size of full precision; floats beyond ±65504 become ±inf."""

BF16Precision = PrecisionSettings("bf16", DType.BF16, DType.I16)
"""bfloat16 floats (f32's range, 8 bits of mantissa), i16 ints."""

_NAMES = {DoublePrecision: "DoublePrecision", FullPrecision: "FullPrecision",
          HalfPrecision: "HalfPrecision", BF16Precision: "BF16Precision"}
