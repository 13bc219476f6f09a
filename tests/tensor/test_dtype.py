"""DType and Kind: parsing, properties and promotion (compared with PyTorch)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import ember
from ember import Bool, DType, Float, Int, Kind
from ember.tensor.dtype import promote

TORCH_DTYPE = {
    DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16,
    DType.BF16: torch.bfloat16, DType.I64: torch.int64, DType.I32: torch.int32,
    DType.I16: torch.int16, DType.I8: torch.int8, DType.U8: torch.uint8, DType.BOOL: torch.bool,
}  # fmt: skip
FLOATS = [DType.F64, DType.F32, DType.F16, DType.BF16]
INTS = [DType.I64, DType.I32, DType.I16, DType.I8, DType.U8]
ALIASES = {
    "float64": DType.F64, "double": DType.F64, "float32": DType.F32, "float": DType.F32,
    "float16": DType.F16, "half": DType.F16, "bfloat16": DType.BF16, "int64": DType.I64,
    "long": DType.I64, "int32": DType.I32, "int": DType.I32, "int16": DType.I16,
    "int8": DType.I8, "uint8": DType.U8, "bool_": DType.BOOL,
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


@pytest.mark.parametrize("bad", ["f128", "complex64", "uint16", "", "f 32"])
def test_parse_unknown_name(bad):
    with pytest.raises(ember.DTypeError, match=rf"unknown dtype {bad!r}; expected one of f64, f32"):
        DType.parse(bad)


@pytest.mark.parametrize("bad", [None, 32, np.float32, torch.float32, Float])
def test_parse_non_string(bad):
    with pytest.raises(ember.DTypeError, match="unknown dtype") as info:
        DType.parse(bad)
    assert isinstance(info.value, TypeError)


# ---------------------------------------------------------------- properties
@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_kind_and_itemsize_match_torch(dtype):
    ref = TORCH_DTYPE[dtype]
    expected_kind = Bool if ref == torch.bool else Float if ref.is_floating_point else Int
    assert dtype.kind is expected_kind
    assert dtype.is_float == (expected_kind is Float)
    assert dtype.is_int == (expected_kind is Int)
    assert dtype.itemsize == torch.empty(0, dtype=ref).element_size()


def test_kinds_partition_the_dtypes():
    assert [d for d in DType if d.kind is Float] == FLOATS
    assert [d for d in DType if d.kind is Int] == INTS
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


@pytest.mark.parametrize(("a", "b"), _pairs(FLOATS) + _pairs(INTS) + [(DType.BOOL, DType.BOOL)],
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
