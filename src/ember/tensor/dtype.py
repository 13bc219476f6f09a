"""Tensor kinds and element types.

A tensor has one of three *kinds* (Float, Int, Bool), which decides which ops
it has, and a *dtype* of that kind, which decides how its elements are stored.
"""

from __future__ import annotations

import enum

from ember.backend.errors import DTypeError


class Kind(enum.Enum):
    """The three tensor kinds. ``prefix`` is the prefix of the kind's backend primitives."""

    FLOAT = "Float"
    INT = "Int"
    BOOL = "Bool"

    # Identity hashing in C: kinds key the dispatch tables of every op call.
    __hash__ = object.__hash__

    @property
    def prefix(self) -> str:
        return _PREFIX[self]

    def __repr__(self) -> str:
        return self.value


_PREFIX = {Kind.FLOAT: "float", Kind.INT: "int", Kind.BOOL: "bool"}

Float = Kind.FLOAT
Int = Kind.INT
Bool = Kind.BOOL


class DType(enum.Enum):
    """Element types. The value is the short name printed and accepted everywhere."""

    F64 = "f64"
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I64 = "i64"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"
    U64 = "u64"
    U32 = "u32"
    U16 = "u16"
    U8 = "u8"
    BOOL = "bool"
    # Low-precision storage dtypes (ONNX's float8 / float4 / 4 and 2-bit ints, via ml_dtypes):
    # tensors hold and cast them, but no op computes in them and they never promote.
    F8E4M3FN = "f8e4m3fn"
    F8E4M3FNUZ = "f8e4m3fnuz"
    F8E5M2 = "f8e5m2"
    F8E5M2FNUZ = "f8e5m2fnuz"
    F8E8M0FNU = "f8e8m0fnu"
    F4E2M1FN = "f4e2m1fn"
    I4 = "i4"
    U4 = "u4"
    I2 = "i2"
    U2 = "u2"

    __hash__ = object.__hash__

    @property
    def kind(self) -> Kind:
        return _KIND[self]

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return _KIND[self] is Kind.FLOAT

    @property
    def is_int(self) -> bool:
        return _KIND[self] is Kind.INT

    @property
    def is_unsigned(self) -> bool:
        """Whether this is an unsigned int dtype (u2, u4, u8, u16, u32, u64)."""
        return self in _UNSIGNED

    @property
    def is_low_precision(self) -> bool:
        """Whether this is a float8 / float4 / 4 or 2-bit int storage dtype (no arithmetic)."""
        return self in _LOW_PRECISION

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    def __str__(self) -> str:
        return self.value

    @staticmethod
    def parse(value: DType | str) -> DType:
        """Accepts a DType, its short name (``"f32"``) or a common alias (``"float32"``)."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            found = _ALIASES.get(value.lower())
            if found is not None:
                return found
        known = ", ".join(d.value for d in DType)
        raise DTypeError(f"unknown dtype {value!r}; expected one of {known}")


_KIND = {
    DType.F64: Kind.FLOAT, DType.F32: Kind.FLOAT, DType.F16: Kind.FLOAT, DType.BF16: Kind.FLOAT,
    DType.I64: Kind.INT, DType.I32: Kind.INT, DType.I16: Kind.INT, DType.I8: Kind.INT,
    DType.U64: Kind.INT, DType.U32: Kind.INT, DType.U16: Kind.INT, DType.U8: Kind.INT,
    DType.BOOL: Kind.BOOL, DType.F8E4M3FN: Kind.FLOAT, DType.F8E4M3FNUZ: Kind.FLOAT,
    DType.F8E5M2: Kind.FLOAT, DType.F8E5M2FNUZ: Kind.FLOAT, DType.F8E8M0FNU: Kind.FLOAT,
    DType.F4E2M1FN: Kind.FLOAT, DType.I4: Kind.INT, DType.U4: Kind.INT, DType.I2: Kind.INT,
    DType.U2: Kind.INT,
}  # fmt: skip
_LOW_PRECISION = frozenset({
    DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ, DType.F8E8M0FNU,
    DType.F4E2M1FN, DType.I4, DType.U4, DType.I2, DType.U2,
})  # fmt: skip
_ITEMSIZE = {
    DType.F64: 8, DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.I64: 8, DType.I32: 4,
    DType.I16: 2, DType.I8: 1, DType.U64: 8, DType.U32: 4, DType.U16: 2, DType.U8: 1,
    DType.BOOL: 1,
} | dict.fromkeys(_LOW_PRECISION, 1)  # NumPy (ml_dtypes) stores each element in a byte
_ALIASES = {d.value: d for d in DType} | {
    "float64": DType.F64, "double": DType.F64, "float32": DType.F32, "float": DType.F32,
    "float16": DType.F16, "half": DType.F16, "bfloat16": DType.BF16, "int64": DType.I64,
    "long": DType.I64, "int32": DType.I32, "int": DType.I32, "int16": DType.I16,
    "int8": DType.I8, "uint8": DType.U8, "uint16": DType.U16, "uint32": DType.U32,
    "uint64": DType.U64, "bool_": DType.BOOL, "float8_e4m3fn": DType.F8E4M3FN,
    "float8_e4m3fnuz": DType.F8E4M3FNUZ, "float8_e5m2": DType.F8E5M2,
    "float8_e5m2fnuz": DType.F8E5M2FNUZ, "float8_e8m0fnu": DType.F8E8M0FNU,
    "float4_e2m1fn": DType.F4E2M1FN, "int4": DType.I4, "uint4": DType.U4, "int2": DType.I2,
    "uint2": DType.U2,
}  # fmt: skip

# Rank of each float dtype when two are combined: f16 with bf16 gives f32, as in PyTorch.
_FLOAT_RANK = {DType.F16: 1, DType.BF16: 1, DType.F32: 2, DType.F64: 3}
_UNSIGNED = frozenset({DType.U8, DType.U16, DType.U32, DType.U64, DType.U4, DType.U2})
# Signed int dtypes by width: an unsigned operand needs a strictly wider one to fit.
_SIGNED_BY_SIZE = {1: DType.I8, 2: DType.I16, 4: DType.I32, 8: DType.I64}


def promote(a: DType, b: DType) -> DType:
    """The dtype two same-kind operands are brought to before a binary op.

    Mirrors PyTorch's promotion within one kind (NumPy's where PyTorch has no
    rule, for u16 / u32 / u64 with a signed dtype); mixing kinds is rejected by
    the Tensor layer before this is called.

    Raises:
        DTypeError: u64 with a signed int dtype: no int dtype holds both ranges,
            and ember never falls back to a float silently. A low-precision storage
            dtype (float8, 4-bit...) with any other dtype: cast it first.

    >>> promote(DType.F16, DType.BF16)
    DType.F32
    >>> promote(DType.U16, DType.I16)
    DType.I32
    """
    if a is b:
        return a
    if a.is_low_precision or b.is_low_precision:
        low = a if a.is_low_precision else b
        raise DTypeError(f"cannot combine {a} with {b}: {low} is a storage dtype that does not "
                         "promote; cast it to a wider dtype first")
    if a.is_float:
        ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
        if ra == rb:
            return DType.F32
        return a if ra > rb else b
    if a.is_unsigned == b.is_unsigned:
        return a if a.itemsize > b.itemsize else b
    unsigned, signed = (a, b) if a.is_unsigned else (b, a)
    if unsigned is DType.U64:
        raise DTypeError(
            f"cannot combine {a} with {b}: no int dtype holds both u64 and {signed} values; "
            "cast one operand first"
        )
    # The signed result must be wider than the unsigned operand and at least as wide as the other.
    return _SIGNED_BY_SIZE[max(2 * unsigned.itemsize, signed.itemsize)]
