"""TensorData on its own (no backend): construction, dtypes, conversion, bytes, comparisons.

References: PyTorch casting and byte layout, NumPy, and exact expected values.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
import torch

import ember
from ember import DType, Kind, TensorData

TORCH_DTYPE = {
    DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16,
    DType.BF16: torch.bfloat16, DType.I64: torch.int64, DType.I32: torch.int32,
    DType.I16: torch.int16, DType.I8: torch.int8, DType.U64: torch.uint64,
    DType.U32: torch.uint32, DType.U16: torch.uint16, DType.U8: torch.uint8, DType.BOOL: torch.bool,
}  # fmt: skip
NUMPY_DTYPE = {
    DType.F64: np.float64, DType.F32: np.float32, DType.F16: np.float16,
    DType.BF16: ml_dtypes.bfloat16, DType.I64: np.int64, DType.I32: np.int32,
    DType.I16: np.int16, DType.I8: np.int8, DType.U64: np.uint64, DType.U32: np.uint32,
    DType.U16: np.uint16, DType.U8: np.uint8, DType.BOOL: np.bool_,
}  # fmt: skip
# The dtypes ember computes with; the float8 / 4-bit storage dtypes are tested in
# tests/tensor/test_low_precision.py against ml_dtypes (torch lacks most of them).
ALL = [d for d in DType if not d.is_low_precision]

# Values exactly representable in every float dtype, in range of every signed int dtype.
FLOAT_VALUES = [-100.0, -3.75, -2.5, -1.0, -0.5, -0.0, 0.0, 0.25, 1.5, 2.0, 7.0, 100.0, 127.0]
INT_VALUES = [-128, -100, -3, -1, 0, 1, 2, 7, 100, 127]
BOOL_VALUES = [True, False, True, True, False]


def sample(dtype: DType) -> list:
    """Values of ``dtype`` whose conversion to any dtype is defined (no overflow)."""
    if dtype is DType.BOOL:
        return BOOL_VALUES
    if dtype.is_unsigned:
        return [v for v in INT_VALUES if v >= 0] + [200, 255]
    return FLOAT_VALUES if dtype.is_float else INT_VALUES


def in_range(values: list, target: DType) -> list:
    """The values a cast to ``target`` keeps defined: unsigned targets get no negatives."""
    if target.is_unsigned:
        values = [v for v in values if v >= 0]
    if target is DType.I8:
        values = [v for v in values if v <= 127]
    return values


def torch_tensor(values, dtype: DType) -> torch.Tensor:
    return torch.tensor(values, dtype=TORCH_DTYPE[dtype])


def torch_bytes(t: torch.Tensor) -> bytes:
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy().tobytes()


# ================================================================ construction
@pytest.mark.parametrize(
    ("value", "shape", "dtype"),
    [
        (1.5, (), DType.F64),
        (3, (), DType.I64),
        (True, (), DType.BOOL),
        ([1.0, 2.0], (2,), DType.F64),
        ([[1, 2, 3], [4, 5, 6]], (2, 3), DType.I64),
        ([[True], [False]], (2, 1), DType.BOOL),
        ([1, 2.5], (2,), DType.F64),  # mixed int/float infers float
        ([True, 2], (2,), DType.I64),  # mixed bool/int infers int
        ([], (0,), DType.F64),
        ([[], []], (2, 0), DType.F64),
        ([[[1.0]]], (1, 1, 1), DType.F64),
    ],
)
def test_python_values_infer_dtype_and_shape(value, shape, dtype):
    data = TensorData(value)
    assert (data.shape, data.dtype, data.rank, data.num_elements()) == (
        shape,
        dtype,
        len(shape),
        math.prod(shape),
    )
    assert data.kind is dtype.kind
    assert data.tolist() == value


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_python_values_with_dtype(dtype):
    values = sample(dtype)
    data = TensorData(values, dtype)
    assert data.dtype is dtype
    assert data.tolist() == torch_tensor(values, dtype).tolist()


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_numpy_array_keeps_dtype(dtype):
    array = np.array(sample(dtype), dtype=NUMPY_DTYPE[dtype]).reshape(-1, 1)
    data = TensorData(array)
    assert data.dtype is dtype
    assert data.shape == array.shape
    np.testing.assert_array_equal(data.to_numpy(), array)


@pytest.mark.parametrize(
    ("scalar", "dtype", "value"),
    [(np.float32(2.5), DType.F32, 2.5), (np.int8(-3), DType.I8, -3), (np.bool_(True), DType.BOOL, True),
     (ml_dtypes.bfloat16(1.5), DType.BF16, 1.5)],
)  # fmt: skip
def test_numpy_scalar_keeps_dtype(scalar, dtype, value):
    data = TensorData(scalar)
    assert (data.dtype, data.shape, data.item()) == (dtype, (), value)


def test_bf16_array_via_ml_dtypes():
    array = np.array([1.0, 0.1, -3.0e38], dtype=ml_dtypes.bfloat16)
    data = TensorData(array)
    assert data.dtype is DType.BF16
    ref = torch.tensor([1.0, 0.1, -3.0e38], dtype=torch.bfloat16)
    assert data.tolist() == ref.float().tolist()


def test_construction_copies_numpy_array():
    array = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    data = TensorData(array)
    array[0, 0] = 99.0
    assert data.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_to_numpy_is_read_only_view():
    data = TensorData([1, 2, 3])
    view = data.to_numpy()
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 5
    assert data.tolist() == [1, 2, 3]


def test_non_contiguous_array_becomes_contiguous():
    array = np.arange(12, dtype=np.int32).reshape(3, 4).T[::2]
    data = TensorData(array)
    assert data.shape == (2, 3)
    assert data.to_numpy().flags.c_contiguous
    assert data.tolist() == array.tolist()
    assert data.to_bytes() == np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("order", [">", "<"])
def test_byte_order_of_numpy_array_is_normalized(order):
    array = np.array([1, -2, 300], dtype=f"{order}i4")
    data = TensorData(array)
    assert data.dtype is DType.I32
    assert data.tolist() == [1, -2, 300]
    assert data.to_bytes() == np.array([1, -2, 300], dtype="<i4").tobytes()


def test_from_tensordata_with_and_without_dtype():
    base = TensorData([1.5, -2.5], "f32")
    assert TensorData(base) == base
    assert TensorData(base, "i32").tolist() == [1, -2]


@pytest.mark.parametrize(
    "ragged", [[[1, 2], [3]], [[1.0], [2.0, 3.0]], [[[1, 2]], [[3]]], [1, [2]]]
)
def test_ragged_lists_raise_shape_error(ragged):
    with pytest.raises(ember.ShapeError, match="ragged"):
        TensorData(ragged)


def test_non_numbers_raise_shape_error():
    with pytest.raises(ember.ShapeError, match="non-numbers"):
        TensorData([1, None])


@pytest.mark.parametrize(
    ("array", "name"),
    [
        (np.array([1 + 2j]), "complex128"),
        (np.array([1], dtype=np.complex64), "complex64"),
        (np.array([1, "a"], dtype=object), "object"),
        (np.array(["ab"]), "<U2"),
        (np.array([1], dtype="datetime64[s]"), "datetime64"),
    ],
)
def test_unsupported_numpy_dtype_raises_dtype_error(array, name):
    with pytest.raises(
        ember.DTypeError,
        match=rf"NumPy dtype {re.escape(name)}.* no ember equivalent; supported: f64, f32",
    ):
        TensorData(array)


def test_strings_raise_dtype_error():
    with pytest.raises(ember.DTypeError, match="<U1"):
        TensorData(["a", "b"])


def test_unknown_dtype_argument():
    with pytest.raises(ember.DTypeError, match="unknown dtype 'f8'"):
        TensorData([1.0], "f8")


# ================================================================ convert
@pytest.mark.parametrize("target", ALL, ids=str)
@pytest.mark.parametrize("source", ALL, ids=str)
def test_convert_matches_torch(source, target):
    values = in_range(sample(source), target)
    data = TensorData(values, source).convert(target)
    expected = torch_tensor(values, source).to(TORCH_DTYPE[target])
    assert data.dtype is target
    assert data.shape == tuple(expected.shape)
    assert data.tolist() == expected.tolist()
    assert data.to_bytes() == torch_bytes(expected)


@pytest.mark.parametrize("target", [DType.I64, DType.I32, DType.I16, DType.I8])
@pytest.mark.parametrize("source", [DType.F64, DType.F32, DType.F16, DType.BF16], ids=str)
def test_float_to_int_truncates_toward_zero(source, target):
    data = TensorData([-2.75, -1.5, -0.5, 0.5, 1.5, 2.75], source).convert(target)
    assert data.tolist() == [-2, -1, 0, 0, 1, 2]


@pytest.mark.parametrize("source", [DType.F64, DType.F32, DType.F16, DType.BF16], ids=str)
def test_float_to_bool_is_nonzero(source):
    data = TensorData([0.0, -0.0, 0.5, -3.0, math.inf, math.nan], source).convert("bool")
    assert data.tolist() == [False, False, True, True, True, True]


def test_f32_to_bf16_rounds_like_torch():
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    data = TensorData(values).convert("bf16")
    expected = torch.from_numpy(values).to(torch.bfloat16)
    assert data.to_bytes() == torch_bytes(expected)


def test_convert_to_same_dtype_returns_self():
    data = TensorData([1, 2], "i16")
    assert data.convert("int16") is data
    assert data.convert(DType.I32) is not data


def test_convert_keeps_shape_of_empty_and_0d():
    assert TensorData(np.zeros((2, 0, 3))).convert("i8").shape == (2, 0, 3)
    zero_d = TensorData(2.5).convert("bf16")
    assert (zero_d.shape, zero_d.item()) == ((), 2.5)


# ================================================================ bytes
@pytest.mark.parametrize("shape", [(5,), (0,), (), (1, 1)], ids=str)
@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_bytes_round_trip(dtype, shape):
    size = math.prod(shape)
    values = np.resize(np.array(sample(dtype)), size).reshape(shape).tolist()
    data = TensorData(values, dtype)
    raw = data.to_bytes()
    assert raw == torch_bytes(torch_tensor(values, dtype))
    assert len(raw) == size * dtype.itemsize
    back = TensorData.from_bytes(raw, shape, dtype)
    assert back == data
    assert back.dtype is dtype
    assert back.shape == shape


def test_bytes_round_trip_keeps_special_floats():
    data = TensorData([math.nan, math.inf, -math.inf, -0.0], "f32")
    back = TensorData.from_bytes(data.to_bytes(), [4], "float32")
    assert back.to_bytes() == data.to_bytes()
    assert math.copysign(1.0, back.tolist()[3]) == -1.0


def test_from_bytes_owns_its_buffer():
    buffer = bytearray(np.array([1, 2], dtype="<i2").tobytes())
    data = TensorData.from_bytes(bytes(buffer), [2], "i16")
    buffer[0] = 7
    assert data.tolist() == [1, 2]


@pytest.mark.parametrize(("n_bytes", "shape", "dtype", "expected"),
                         [(3, [2], "f32", 8), (16, [2, 3], "f64", 48), (1, [], "i16", 2), (2, [0], "u8", 0)])  # fmt: skip
def test_from_bytes_checks_byte_count(n_bytes, shape, dtype, expected):
    shape_text = re.escape("[" + ", ".join(map(str, shape)) + "]")
    pattern = rf"from_bytes: {n_bytes} bytes cannot hold shape {shape_text} of {dtype} \({expected} bytes expected\)"
    with pytest.raises(ember.ShapeError, match=pattern):
        TensorData.from_bytes(b"\x00" * n_bytes, shape, dtype)


# ================================================================ tolist / item
@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_tolist_gives_python_scalars(dtype):
    data = TensorData([sample(dtype)[:2]], dtype)
    out = data.tolist()
    expected_type = bool if dtype is DType.BOOL else float if dtype.is_float else int
    assert all(type(v) is expected_type for v in out[0])
    assert out == torch_tensor([sample(dtype)[:2]], dtype).tolist()


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_item(dtype):
    value = sample(dtype)[-1]
    item = TensorData([[value]], dtype).item()
    assert item == torch_tensor(value, dtype).item()
    assert type(item) is type(torch_tensor(value, dtype).item())


def test_tolist_of_0d_is_a_scalar():
    assert TensorData(7, "i8").tolist() == 7
    assert TensorData(1.5, "bf16").tolist() == 1.5


@pytest.mark.parametrize(("shape", "text"), [((2,), "[2]"), ((0,), "[0]"), ((2, 3), "[2, 3]")])
def test_item_needs_one_element(shape, text):
    with pytest.raises(
        ember.ShapeError, match=re.escape(f"item() needs exactly one element, got shape {text}")
    ):
        TensorData(np.zeros(shape)).item()


# ================================================================ assert_eq
@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_assert_eq_passes_on_equal_data(dtype):
    values = sample(dtype)
    TensorData(values, dtype).assert_eq(TensorData(values, dtype))


def test_assert_eq_accepts_lists_and_nan():
    TensorData([[1, 2], [3, 4]]).assert_eq([[1, 2], [3, 4]])
    TensorData([1.0, math.nan, math.inf]).assert_eq([1.0, math.nan, math.inf])


def test_assert_eq_strict_dtype():
    with pytest.raises(AssertionError, match="dtypes differ: i64 != i32"):
        TensorData([1, 2]).assert_eq(TensorData([1, 2], "i32"))
    TensorData([1, 2]).assert_eq(TensorData([1, 2], "i32"), strict=False)
    TensorData([1.0, 2.5], "f32").assert_eq(TensorData([1.0, 2.5], "f64"), strict=False)


def test_assert_eq_shape_mismatch():
    with pytest.raises(AssertionError, match=re.escape("shapes differ: [2, 2] != [4]")):
        TensorData([[1, 2], [3, 4]]).assert_eq([1, 2, 3, 4])


@pytest.mark.parametrize(
    ("actual", "expected", "message"),
    [
        ([[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [5.0, 4.5]],
         "elements differ: 2 of 4 elements; first at index [1, 0]: 3.0 != 5.0; largest difference 2"),
        ([1, 2, 3], [1, 2, -7], "elements differ: 1 of 3 elements; first at index [2]: 3.0 != -7.0; largest difference 10"),
        ([True, False], [True, True], "elements differ: 1 of 2 elements; first at index [1]: False != True; largest difference 1"),
        (1.0, 2.5, "elements differ: 1 of 1 elements; first at index []: 1.0 != 2.5; largest difference 1.5"),
        ([math.nan], [1.0], "elements differ: 1 of 1 elements; first at index [0]: nan != 1.0"),
    ],
)  # fmt: skip
def test_assert_eq_failure_message(actual, expected, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        TensorData(actual).assert_eq(expected)


# ================================================================ assert_approx_eq
def test_assert_approx_eq_passes_within_tolerance():
    TensorData([1.0, 2.0, 1e6]).assert_approx_eq([1.0 + 1e-7, 2.0, 1e6 + 5.0])
    TensorData([1.0, math.nan, math.inf, -math.inf]).assert_approx_eq(
        [1.0, math.nan, math.inf, -math.inf]
    )
    TensorData([0.0]).assert_approx_eq([1e-3], atol=1e-2)
    TensorData([100.0]).assert_approx_eq([101.0], rtol=0.02)
    TensorData([1.5], "bf16").assert_approx_eq(TensorData([1.5], "f64"))
    TensorData([1, 2], "i32").assert_approx_eq([1.0, 2.0])


@pytest.mark.parametrize(
    ("actual", "expected", "message"),
    [
        ([[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.5, 4.0]],
         "not within rtol=1e-05, atol=1e-08: 1 of 4 elements; first at index [1, 0]: 3.0 != 3.5; largest difference 0.5"),
        ([1.0, 2.0, 3.0], [1.1, 2.0, 2.0],
         "not within rtol=1e-05, atol=1e-08: 2 of 3 elements; first at index [0]: 1.0 != 1.1; largest difference 1"),
        ([math.inf], [1e300], "first at index [0]: inf != 1e+300; largest difference inf"),
        ([math.inf], [-math.inf], "first at index [0]: inf != -inf"),
        ([1.0, 2.0], [1.0, math.nan], "1 of 2 elements; first at index [1]: 2.0 != nan"),
    ],
)  # fmt: skip
def test_assert_approx_eq_failure_message(actual, expected, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        TensorData(actual).assert_approx_eq(expected)


def test_assert_approx_eq_names_its_tolerances():
    with pytest.raises(
        AssertionError, match=re.escape("not within rtol=0.001, atol=0.5: 1 of 1 elements")
    ):
        TensorData([1.0]).assert_approx_eq([3.0], rtol=1e-3, atol=0.5)


def test_assert_approx_eq_shape_mismatch():
    with pytest.raises(AssertionError, match=re.escape("shapes differ: [3] != [1, 3]")):
        TensorData([1.0, 2.0, 3.0]).assert_approx_eq([[1.0, 2.0, 3.0]])


# ================================================================ equality, repr, format
def test_equality():
    a = TensorData([1.0, math.nan], "f32")
    assert a == TensorData([1.0, math.nan], "f32")  # NaN equals NaN
    assert a != TensorData([1.0, math.nan], "f64")  # dtype differs
    assert a != TensorData([[1.0, math.nan]], "f32")  # shape differs
    assert a != TensorData([2.0, math.nan], "f32")
    assert TensorData([1, 2]) == TensorData(np.array([1, 2], dtype=np.int64))
    assert (a == [1.0, math.nan]) is False
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)


def test_repr():
    assert (
        repr(TensorData([[1.5, 2.0]], "bf16"))
        == "TensorData(shape=[1, 2], dtype=bf16, [[1.5, 2.0]])"
    )
    assert repr(TensorData(3, "u8")) == "TensorData(shape=[], dtype=u8, 3)"


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (TensorData([[1.0, 2.0], [3.0, 4.0]], "f32"), "[[1.0, 2.0],\n [3.0, 4.0]]"),
        (TensorData([0.1, -2.5, 1e-5, 1e9], "f32"), "[0.1, -2.5, 1.0e-05, 1.0e+09]"),
        (TensorData([math.nan, math.inf, -math.inf], "f64"), "[NaN, inf, -inf]"),
        (TensorData([[1, -20], [300, 4]], "i16"), "[[  1, -20],\n [300,   4]]"),
        (TensorData([True, False]), "[ True, False]"),
        (TensorData(2.5), "2.5"),
        (TensorData([], "f32"), "[]"),
    ],
)
def test_format(data, text):
    assert data.format() == text


def test_format_bf16_round_trips():
    data = TensorData([1.5, 0.1, -3.0e38], "bf16")
    numbers = [float(v) for v in data.format().strip("[]").split(",")]
    assert TensorData(numbers, "bf16") == data


def test_format_summarizes_past_threshold():
    data = TensorData(np.arange(2000, dtype=np.int64))
    assert data.format() == "[   0,    1,    2, ..., 1997, 1998, 1999]"
    assert data.format(threshold=5000).count(",") == 1999
    assert data.format(threshold=10, edge_items=1) == "[   0, ..., 1999]"
    assert TensorData(np.arange(6)).format(threshold=3, edge_items=2) == "[0, 1, ..., 4, 5]"


def test_kind_property():
    assert TensorData([1.0]).kind is Kind.FLOAT
    assert TensorData([1]).kind is Kind.INT
    assert TensorData([True]).kind is Kind.BOOL
