"""DType and Kind: parsing, properties, promotion (compared with PyTorch and NumPy), and the
wide unsigned ints on each backend."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import ember
from ember import Bool, DType, Float, Int, Kind, Tensor, TensorData
from ember.tensor.data import numpy_dtype
from ember.tensor.dtype import promote

TORCH_DTYPE = {
    DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16,
    DType.BF16: torch.bfloat16, DType.I64: torch.int64, DType.I32: torch.int32,
    DType.I16: torch.int16, DType.I8: torch.int8, DType.U64: torch.uint64,
    DType.U32: torch.uint32, DType.U16: torch.uint16, DType.U8: torch.uint8, DType.BOOL: torch.bool,
}  # fmt: skip
FLOATS = [DType.F64, DType.F32, DType.F16, DType.BF16]
SIGNED = [DType.I64, DType.I32, DType.I16, DType.I8]
UNSIGNED = [DType.U64, DType.U32, DType.U16, DType.U8]
INTS = SIGNED + UNSIGNED
# Storage dtypes (no arithmetic, no promotion): tests/tensor/test_low_precision.py covers them.
LOW_FLOATS = [DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ, DType.F8E8M0FNU,
              DType.F4E2M1FN]  # fmt: skip
LOW_INTS = [DType.I4, DType.U4, DType.I2, DType.U2]
# The ints whose promotion PyTorch defines (it has none for u16 / u32 / u64 with another dtype).
TORCH_INTS = SIGNED + [DType.U8]
ALIASES = {
    "float64": DType.F64, "double": DType.F64, "float32": DType.F32, "float": DType.F32,
    "float16": DType.F16, "half": DType.F16, "bfloat16": DType.BF16, "int64": DType.I64,
    "long": DType.I64, "int32": DType.I32, "int": DType.I32, "int16": DType.I16,
    "int8": DType.I8, "uint8": DType.U8, "uint16": DType.U16, "uint32": DType.U32,
    "uint64": DType.U64, "bool_": DType.BOOL,
}  # fmt: skip


# ---------------------------------------------------------------- parse
@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_parse_short_name_and_dtype_itself(dtype):
    assert DType.parse(dtype.value) is dtype
    assert DType.parse(dtype) is dtype
    assert DType.parse(dtype.value.upper()) is dtype


@pytest.mark.parametrize(("alias", "expected"), ALIASES.items())
def test_parse_aliases(alias, expected):
    assert DType.parse(alias) is expected
    assert DType.parse(alias.capitalize()) is expected


@pytest.mark.parametrize("bad", ["f128", "complex64", "uint128", "u128", "", "f 32"])
def test_parse_unknown_name(bad):
    with pytest.raises(ember.DTypeError, match=rf"unknown dtype {bad!r}; expected one of f64, f32"):
        DType.parse(bad)


@pytest.mark.parametrize("bad", [None, 32, np.float32, torch.float32, Float])
def test_parse_non_string(bad):
    with pytest.raises(ember.DTypeError, match="unknown dtype") as info:
        DType.parse(bad)
    assert isinstance(info.value, TypeError)


# ---------------------------------------------------------------- properties
@pytest.mark.parametrize("dtype", list(TORCH_DTYPE), ids=str)
def test_kind_and_itemsize_match_torch(dtype):
    ref = TORCH_DTYPE[dtype]
    expected_kind = Bool if ref == torch.bool else Float if ref.is_floating_point else Int
    assert dtype.kind is expected_kind
    assert dtype.is_float == (expected_kind is Float)
    assert dtype.is_int == (expected_kind is Int)
    assert dtype.is_unsigned == (dtype in UNSIGNED)
    assert dtype.itemsize == torch.empty(0, dtype=ref).element_size()


def test_kinds_partition_the_dtypes():
    assert [d for d in DType if d.kind is Float] == FLOATS + LOW_FLOATS
    assert [d for d in DType if d.kind is Int] == INTS + LOW_INTS
    assert [d for d in DType if d.is_low_precision] == LOW_FLOATS + LOW_INTS
    assert [d for d in DType if d.kind is Bool] == [DType.BOOL]


def test_kind_names_and_prefixes():
    assert [(k.value, k.prefix) for k in Kind] == [
        ("Float", "float"),
        ("Int", "int"),
        ("Bool", "bool"),
    ]
    assert (Float, Int, Bool) == (Kind.FLOAT, Kind.INT, Kind.BOOL)
    assert repr(Int) == "Int"


def test_str_and_repr():
    assert str(DType.BF16) == "bf16"
    assert repr(DType.BF16) == "DType.BF16"
    assert f"{DType.U8}" == "u8"


# ---------------------------------------------------------------- promotion
def _pairs(dtypes):
    return list(itertools.product(dtypes, repeat=2))


@pytest.mark.parametrize(("a", "b"), _pairs(FLOATS) + _pairs(TORCH_INTS) + [(DType.BOOL, DType.BOOL)],
                         ids=lambda d: str(d))  # fmt: skip
def test_promote_matches_torch(a, b):
    expected = torch.promote_types(TORCH_DTYPE[a], TORCH_DTYPE[b])
    assert TORCH_DTYPE[promote(a, b)] == expected
    assert promote(a, b) is promote(b, a)


def test_promote_examples():
    assert promote(DType.F16, DType.BF16) is DType.F32
    assert promote(DType.U8, DType.I8) is DType.I16
    assert promote(DType.U8, DType.I32) is DType.I32
    assert promote(DType.F64, DType.F16) is DType.F64


@pytest.mark.parametrize(("a", "b"), _pairs(INTS), ids=lambda d: str(d))
def test_int_promotion_matches_numpy_or_raises(a, b):
    expected = np.promote_types(numpy_dtype(a), numpy_dtype(b))
    if expected.kind == "f":  # NumPy's u64 with a signed int: ember refuses rather than go float
        with pytest.raises(ember.DTypeError, match=rf"cannot combine {a} with {b}: no int dtype"):
            promote(a, b)
    else:
        assert numpy_dtype(promote(a, b)) == expected
        assert promote(a, b) is promote(b, a)


def test_unsigned_promotion_examples():
    assert promote(DType.U16, DType.I8) is DType.I32
    assert promote(DType.U32, DType.I32) is DType.I64
    assert promote(DType.U32, DType.U16) is DType.U32
    assert promote(DType.U64, DType.U8) is DType.U64
    with pytest.raises(ember.DTypeError, match="cannot combine i8 with u64"):
        promote(DType.I8, DType.U64)


# ---------------------------------------------------------------- wide unsigned ints
@pytest.mark.parametrize("dtype", [DType.U16, DType.U32, DType.U64], ids=str)
def test_wide_unsigned_round_trip_and_compute_on_ndarray(dtype):
    top = np.iinfo(numpy_dtype(dtype)).max
    a = np.array([[0, 7, top], [3, 9, 12]], numpy_dtype(dtype))
    b = np.array([[5, 2, 1], [3, 4, 5]], numpy_dtype(dtype))
    data = TensorData(a)
    assert data.dtype is dtype and TensorData.from_bytes(data.to_bytes(), [2, 3], dtype) == data
    device = ember.device("ndarray")
    x, y = Tensor.from_data(a, device), Tensor.from_data(b, device)
    assert x.kind is Int and x.dtype is dtype
    (x + y).into_data().assert_eq(TensorData(a + b))  # wraps at the top like NumPy
    (x * y).into_data().assert_eq(TensorData(a * b))
    (x / y).into_data().assert_eq(TensorData(a // b))
    x.sum_dim(1).into_data().assert_eq(TensorData(a.sum(1, keepdims=True, dtype=a.dtype)))
    x.greater(y).into_data().assert_eq(TensorData(a > b))
    x.cast(DType.I64).cast(dtype).into_data().assert_eq(data)


def test_wide_unsigned_mix_promotes_on_ndarray():
    device = ember.device("ndarray")
    x = Tensor.from_data(np.array([40000, 2], np.uint16), device)
    y = Tensor.from_data(np.array([-1, 3], np.int16), device)
    (x + y).into_data().assert_eq(TensorData(np.array([39999, 5], np.int32)))
    big = Tensor.from_data(np.array([1], np.uint64), device)
    with pytest.raises(ember.DTypeError, match="cannot combine u64 with i64"):
        _ = big + Tensor.from_data(np.array([1], np.int64), device)


@pytest.mark.parametrize("dtype", [DType.U16, DType.U32, DType.U64], ids=str)
def test_torch_stores_but_does_not_compute_wide_unsigned(dtype):
    from ember.backend.base import DTypeUsage

    device = ember.device("torch")
    assert device.backend.dtype_usage(device, dtype) == DTypeUsage.STORAGE
    assert not device.backend.supports_dtype(device, dtype)
    with pytest.raises(ember.UnsupportedError, match=f"backend 'torch' does not support {dtype}"):
        Tensor.zeros([2], device, dtype)
