"""Conformance: creating tensors, dtypes and casts, reading data back, devices and printing.

References: PyTorch (creation ops, ``arange``, ``.to(dtype)``), the distributions' own
moments for random sampling, and exact expected values.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from reference import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, TORCH_DTYPE, assert_close, to_torch

import ember
from ember import Bool, Distribution, DType, DTypeUsage, Float, Int, Tensor, TensorData

SHAPES = [(), (0,), (3,), (2, 3), (1, 0, 2), (2, 1, 3)]
NUMPY_DTYPE = {
    DType.F64: np.float64, DType.F32: np.float32, DType.F16: np.float16,
    DType.BF16: ml_dtypes.bfloat16, DType.I64: np.int64, DType.I32: np.int32,
    DType.I16: np.int16, DType.I8: np.int8, DType.U8: np.uint8, DType.BOOL: np.bool_,
}  # fmt: skip
# Exactly representable in every float dtype; integral ones fit every signed int dtype.
FLOAT_VALUES = [-100.0, -3.75, -2.5, -1.0, -0.5, 0.0, 0.25, 1.5, 2.0, 7.0, 100.0, 127.0]
INT_VALUES = [-128, -100, -3, -1, 0, 1, 2, 7, 100, 127]
U8_VALUES = [0, 1, 2, 7, 100, 127, 200, 255]
BOOL_VALUES = [True, False, True, False, False]


def values_for(source: DType, target: DType | None = None) -> list:
    """Values of ``source`` whose conversion to ``target`` is defined (in range)."""
    if source is DType.BOOL:
        return BOOL_VALUES
    values = U8_VALUES if source is DType.U8 else FLOAT_VALUES if source.is_float else INT_VALUES
    if target is DType.U8:
        values = [v for v in values if v >= 0]
    if target is DType.I8:
        values = [v for v in values if v <= 127]
    return values


def reference(values, dtype: DType) -> torch.Tensor:
    return torch.tensor(values, dtype=TORCH_DTYPE[dtype])


def assert_exact(actual: Tensor, expected: torch.Tensor) -> None:
    """Same dtype, shape and elements (used where every value is exactly representable)."""
    assert TORCH_DTYPE[actual.dtype] == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == tuple(expected.shape)
    assert actual.tolist() == expected.tolist()


def shape_text(shape) -> str:
    return "\\[" + ", ".join(str(d) for d in shape) + "\\]"


# ================================================================ from_data
@pytest.mark.parametrize(
    ("value", "dtype", "shape"),
    [
        (1.5, DType.F32, ()),
        (2, DType.I64, ()),
        (True, DType.BOOL, ()),
        ([[1.0, 2.0], [3.0, 4.0]], DType.F32, (2, 2)),
        ([1, 2.5], DType.F32, (2,)),
        ([[1, 2, 3]], DType.I64, (1, 3)),
        ([False, True], DType.BOOL, (2,)),
        ([], DType.F32, (0,)),
        ([[], []], DType.F32, (2, 0)),
    ],
)
def test_from_data_python_values_take_backend_defaults(device, value, dtype, shape):
    x = Tensor.from_data(value, device)
    assert (x.dtype, x.kind, x.shape, x.device) == (dtype, dtype.kind, shape, device)
    assert x.tolist() == value


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_from_data_numpy_array_keeps_dtype(device, dtype):
    array = np.array(values_for(dtype), dtype=NUMPY_DTYPE[dtype]).reshape(-1, 1)
    x = Tensor.from_data(array, device)
    assert_exact(x, reference(values_for(dtype), dtype).reshape(-1, 1))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_from_data_tensordata_keeps_dtype(device, dtype):
    data = TensorData(values_for(dtype), dtype)
    x = Tensor.from_data(data, device)
    assert x.dtype is dtype
    assert x.into_data() == data


def test_from_data_numpy_scalar_keeps_dtype(device):
    assert Tensor.from_data(np.float64(2.5), device).dtype is DType.F64
    assert Tensor.from_data(np.int16(-3), device).dtype is DType.I16


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_from_data_dtype_override(device, dtype):
    values = values_for(DType.F64, dtype)
    x = Tensor.from_data(values, device, dtype=dtype)
    assert_exact(x, reference(values, DType.F64).to(TORCH_DTYPE[dtype]))
    assert Tensor.from_data(np.array(values), device, dtype=str(dtype)).dtype is dtype


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ([1, 2], Float, torch.tensor([1.0, 2.0])),
        ([-1.7, 2.7], Int, torch.tensor([-1, 2])),
        ([0.0, 2.5], Bool, torch.tensor([False, True])),
        (np.array([1.5, 0.0], dtype=np.float64), Bool, torch.tensor([True, False])),
        (np.array([3], dtype=np.int8), Float, torch.tensor([3.0])),
    ],
)
def test_from_data_kind_override(device, value, kind, expected):
    assert_exact(Tensor.from_data(value, device, kind=kind), expected)


def test_from_data_dtype_wins_over_kind(device):
    assert Tensor.from_data([1, 2], device, dtype="i8", kind=Float).dtype is DType.I8


def test_from_data_unknown_dtype(device):
    with pytest.raises(ember.DTypeError, match="unknown dtype 'float128'"):
        Tensor.from_data([1.0], device, dtype="float128")


def test_from_data_ragged(device):
    with pytest.raises(ember.ShapeError, match="ragged"):
        Tensor.from_data([[1.0, 2.0], [3.0]], device)


@pytest.mark.parametrize(
    ("make", "values", "expected"),
    [
        (Tensor.from_floats, [1, 2], torch.tensor([1.0, 2.0])),
        (Tensor.from_floats, [[0.5]], torch.tensor([[0.5]])),
        (Tensor.from_ints, [1.9, -1.9, 3], torch.tensor([1, -1, 3])),
        (Tensor.from_ints, [True, False], torch.tensor([1, 0])),
        (Tensor.from_bools, [1, 0, 2], torch.tensor([True, False, True])),
        (Tensor.from_bools, [[0.0]], torch.tensor([[False]])),
    ],
)
def test_from_kind_constructors(device, make, values, expected):
    assert_exact(make(values, device), expected)


# ================================================================ zeros / ones / full / empty
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_zeros_ones_full(device, dtype, shape):
    ref = TORCH_DTYPE[dtype]
    value = True if dtype is DType.BOOL else 7
    assert_exact(Tensor.zeros(shape, device, dtype), torch.zeros(shape, dtype=ref))
    assert_exact(Tensor.ones(shape, device, dtype), torch.ones(shape, dtype=ref))
    assert_exact(Tensor.full(shape, value, device, dtype), torch.full(shape, value, dtype=ref))
    empty = Tensor.empty(shape, device, dtype)
    assert (empty.shape, empty.dtype, empty.device) == (shape, dtype, device)


@pytest.mark.parametrize(
    ("kind", "dtype"), [(Float, DType.F32), (Int, DType.I64), (Bool, DType.BOOL)]
)
def test_creation_kind_takes_backend_default(device, kind, dtype):
    for make in (Tensor.zeros, Tensor.ones, Tensor.empty):
        x = make([2, 1], device, kind=kind)
        assert (x.dtype, x.kind, x.shape) == (dtype, kind, (2, 1))
    assert Tensor.zeros([2], device).dtype is DType.F32


@pytest.mark.parametrize(
    ("value", "expected"),
    [(2.5, torch.full((2,), 2.5)), (-3, torch.full((2,), -3)), (False, torch.full((2,), False))],
)
def test_full_kind_follows_value(device, value, expected):
    assert_exact(Tensor.full([2], value, device), expected)


def test_full_with_explicit_dtype_or_kind(device):
    assert_exact(
        Tensor.full([2], 3, device, dtype="f16"), torch.full((2,), 3.0, dtype=torch.float16)
    )
    assert_exact(Tensor.full([1], True, device, kind=Float), torch.tensor([1.0]))
    assert_exact(Tensor.full([1], -1.0, device, kind=Int), torch.tensor([-1]))


def test_creation_accepts_int_and_tuple_shapes(device):
    assert Tensor.zeros(3, device).shape == (3,)
    assert Tensor.ones((2, 2), device).shape == (2, 2)


@pytest.mark.parametrize("op", ["zeros", "ones", "empty"])
def test_creation_negative_dim(device, op):
    with pytest.raises(ember.ShapeError, match=rf"{op}: negative dimension in shape \[2, -1\]"):
        getattr(Tensor, op)([2, -1], device)


def test_full_negative_dim(device):
    with pytest.raises(ember.ShapeError, match=r"full: negative dimension in shape \[-3\]"):
        Tensor.full([-3], 1.0, device)


def test_creation_bad_shape(device):
    with pytest.raises(ember.ArgumentError, match="a shape must be a sequence of ints"):
        Tensor.zeros(None, device)


# ================================================================ arange
@pytest.mark.parametrize(
    "args",
    [(5,), (0,), (2, 5), (-4, 3), (3, 3), (0, 10, 3), (5, -5, -3), (10, 0, -1), (-2, 8, 4),
     (1, 2, 5), (-1, -1, -2)],
    ids=str,
)  # fmt: skip
def test_arange_matches_torch(device, args):
    x = Tensor.arange(*args, device=device)
    assert_exact(x, torch.arange(*args))
    assert x.kind is Int


@pytest.mark.parametrize("args", [(-3,), (5, 2), (0, 5, -1), (7, 1, 2)], ids=str)
def test_arange_empty_when_step_points_away(device, args):
    # torch.arange raises here; ember follows Python's range and gives an empty tensor.
    x = Tensor.arange(*args, device=device)
    assert (x.shape, x.dtype, x.tolist()) == ((0,), DType.I64, list(range(*args)))


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_arange_dtype(device, dtype):
    assert_exact(Tensor.arange(0, 100, 7, device=device, dtype=dtype),
                 torch.arange(0, 100, 7, dtype=TORCH_DTYPE[dtype]))  # fmt: skip


def test_arange_zero_step(device):
    with pytest.raises(ember.ArgumentError, match="arange: step must not be zero"):
        Tensor.arange(0, 5, 0, device=device)


@pytest.mark.parametrize("dtype", ["f32", "bool"])
def test_arange_needs_int_dtype(device, dtype):
    with pytest.raises(ember.DTypeError, match=f"arange makes Int tensors; got dtype {dtype}"):
        Tensor.arange(5, device=device, dtype=dtype)


# ================================================================ *_like
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_like_constructors_keep_shape_dtype_device(device, dtype):
    x = Tensor.zeros([2, 0, 3] if dtype is DType.U8 else [2, 3], device, dtype)
    ref = torch.zeros(x.shape, dtype=TORCH_DTYPE[dtype])
    value = True if dtype is DType.BOOL else 5
    assert_exact(x.zeros_like(), torch.zeros_like(ref))
    assert_exact(x.ones_like(), torch.ones_like(ref))
    assert_exact(x.full_like(value), torch.full_like(ref, value))
    assert x.ones_like().device == device


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=str)
def test_random_like_keeps_shape_dtype_device(device, dtype):
    x = Tensor.zeros([4, 5], device, dtype)
    y = x.random_like(Distribution.uniform(0.0, 2.0))
    assert (y.shape, y.dtype, y.device) == ((4, 5), dtype, device)


# ================================================================ random
N_SAMPLES = 100_000
DISTRIBUTIONS = {
    # name: (distribution, mean, std, [low, high) or None)
    "default": (Distribution.default(), 0.5, 1 / math.sqrt(12), (0.0, 1.0)),
    "uniform": (Distribution.uniform(-2.0, 3.0), 0.5, 5 / math.sqrt(12), (-2.0, 3.0)),
    "normal": (Distribution.normal(1.5, 2.0), 1.5, 2.0, None),
    "bernoulli": (Distribution.bernoulli(0.3), 0.3, math.sqrt(0.3 * 0.7), (0.0, 1.0)),
}


def check_moments(samples: np.ndarray, mean: float, std: float, slack: float = 0.0) -> None:
    """Sample mean and std within 6 standard errors (plus ``slack`` for rounding)."""
    tol = 6 * std / math.sqrt(samples.size) + slack
    assert abs(samples.mean() - mean) <= tol, f"mean {samples.mean()} vs {mean}"
    assert abs(samples.std() - std) <= tol, f"std {samples.std()} vs {std}"


def draw(device, distribution, dtype, shape=(N_SAMPLES,)) -> np.ndarray:
    """Seeded samples (so a statistical test cannot flake) as float64."""
    ember.seed(device, 2024)
    x = Tensor.random(shape, distribution, device, dtype)
    assert (x.shape, x.dtype, x.device) == (tuple(shape), dtype, device)
    return np.asarray(x.into_data().convert("f64").to_numpy())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_random_float_moments(device, name, dtype):
    distribution, mean, std, bounds = DISTRIBUTIONS[name]
    samples = draw(device, distribution, dtype)
    # f16/bf16 round each sample: allow for the rounding of the values themselves.
    slack = 0.0 if dtype in (DType.F32, DType.F64) else 0.01 * (abs(mean) + std)
    check_moments(samples, mean, std, slack)
    if bounds is not None:
        low, high = bounds  # [low, high), but Bernoulli gives exactly 0 and 1
        assert samples.min() >= low
        assert samples.max() <= high if name == "bernoulli" else samples.max() < high


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_random_bernoulli_values(device, dtype):
    for p in (0.0, 0.05, 0.5, 1.0):
        samples = draw(device, Distribution.bernoulli(p), dtype)
        assert set(np.unique(samples)) <= {0.0, 1.0}
        assert abs(samples.mean() - p) <= 6 * math.sqrt(p * (1 - p) / samples.size)


def test_random_uniform_is_flat(device):
    samples = draw(device, Distribution.uniform(10.0, 20.0), DType.F64)
    counts, _ = np.histogram(samples, bins=10, range=(10.0, 20.0))
    expected = samples.size / 10
    assert np.all(np.abs(counts - expected) <= 6 * math.sqrt(expected)), counts


def test_random_normal_shape(device):
    samples = draw(device, Distribution.normal(-1.0, 0.5), DType.F64)
    within = np.mean(np.abs(samples + 1.0) <= 0.5)
    assert abs(within - math.erf(1 / math.sqrt(2))) <= 0.01
    assert abs(np.mean(samples < -1.0) - 0.5) <= 0.01


def test_random_normal_zero_std(device):
    assert_close(Tensor.random([5], Distribution.normal(4.0, 0.0), device), torch.full((5,), 4.0))


def test_random_default_distribution(device):
    ember.seed(device, 7)
    samples = np.asarray(Tensor.random([N_SAMPLES], device=device).tolist())
    check_moments(samples, 0.5, 1 / math.sqrt(12))
    assert samples.min() >= 0.0 and samples.max() < 1.0


@pytest.mark.parametrize("dtype", [DType.I64, DType.I32, DType.I8, DType.U8], ids=str)
def test_random_int_uniform(device, dtype):
    samples = draw(device, Distribution.uniform(2, 7), dtype)
    assert set(np.unique(samples)) == {2, 3, 4, 5, 6}  # integers in [low, high)
    check_moments(samples, 4.0, math.sqrt((5**2 - 1) / 12))


def test_random_int_bernoulli_and_normal(device):
    bern = draw(device, Distribution.bernoulli(0.25), DType.I64)
    assert set(np.unique(bern)) == {0, 1}
    assert abs(bern.mean() - 0.25) <= 6 * math.sqrt(0.25 * 0.75 / bern.size)
    normal = draw(device, Distribution.normal(10.0, 3.0), DType.I32)
    assert np.all(normal == np.round(normal))
    check_moments(normal, 10.0, math.sqrt(9 + 1 / 12), slack=0.02)


def test_random_empty_and_0d(device):
    assert Tensor.random([0, 3], Distribution.normal(0.0, 1.0), device).shape == (0, 3)
    value = Tensor.random([], Distribution.uniform(1.0, 2.0), device).item()
    assert 1.0 <= value < 2.0


def test_random_bool_kind_is_rejected(device):
    with pytest.raises(
        ember.KindError, match=r"random is not defined for Bool tensors \(only Float, Int\)"
    ):
        Tensor.random([2], Distribution.bernoulli(0.5), device, kind=Bool)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: Distribution.bernoulli(1.5),
            r"Bernoulli probability must lie in \[0, 1\], got 1.5",
        ),
        (lambda: Distribution.uniform(2.0, 2.0), "Uniform needs low < high, got low=2.0, high=2.0"),
        (lambda: Distribution.normal(0.0, -1.0), "Normal needs std >= 0, got -1.0"),
    ],
)
def test_bad_distributions(make, message):
    with pytest.raises(ember.ArgumentError, match=message):
        make()


@pytest.mark.parametrize(("kind", "distribution"), [(Float, Distribution.normal(0.0, 1.0)),
                                                    (Int, Distribution.uniform(0, 1000))])  # fmt: skip
def test_seed_reproducibility(device, kind, distribution):
    def sample(seed: int) -> list:
        ember.seed(device, seed)
        return Tensor.random([64], distribution, device, kind=kind).tolist()

    first = sample(42)
    assert sample(42) == first
    assert sample(43) != first
    device.seed(42)
    assert Tensor.random([64], distribution, device, kind=kind).tolist() == first
    assert (
        Tensor.random([64], distribution, device, kind=kind).tolist() != first
    )  # the stream moves on


# ================================================================ cast
@pytest.mark.parametrize("target", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("source", ALL_DTYPES, ids=str)
def test_cast_matches_torch(device, source, target):
    values = values_for(source, target)
    x = Tensor.from_data(values, device, dtype=source)
    out = x.cast(target)
    assert out.kind is target.kind
    assert_exact(out, reference(values, source).to(TORCH_DTYPE[target]))


@pytest.mark.parametrize("source", FLOAT_DTYPES, ids=str)
def test_cast_float_to_int_truncates_toward_zero(device, source):
    x = Tensor.from_data([[-2.75, -1.5, -0.5], [0.5, 1.5, 2.75]], device, dtype=source)
    assert x.cast("i32").tolist() == [[-2, -1, 0], [0, 1, 2]]


def test_cast_same_dtype_returns_tensor(device):
    x = Tensor.from_data([1, 2], device, dtype="i16")
    assert x.cast("int16") is x
    assert x.cast(DType.I16) is x


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 1)], ids=str)
def test_cast_empty_and_0d(device, shape):
    x = Tensor.ones(shape, device, "f64")
    for target in ("bf16", "u8", "bool"):
        assert_exact(
            x.cast(target),
            torch.ones(shape, dtype=torch.float64).to(TORCH_DTYPE[DType.parse(target)]),
        )


def test_cast_unknown_dtype(device):
    with pytest.raises(ember.DTypeError, match="unknown dtype 'f128'"):
        Tensor.zeros([1], device).cast("f128")


@pytest.mark.parametrize(
    ("values", "source", "method", "expected"),
    [
        ([1, -2], DType.I64, "float", torch.tensor([1.0, -2.0])),
        ([True, False], DType.BOOL, "float", torch.tensor([1.0, 0.0])),
        ([-2.7, 2.7], DType.F32, "int", torch.tensor([-2, 2])),
        ([-2.5, 3.5], DType.F16, "int", torch.tensor([-2, 3])),
        ([True, False], DType.BOOL, "int", torch.tensor([1, 0])),
        ([0.0, -1.5, 0.1], DType.F32, "bool", torch.tensor([False, True, True])),
        ([0, 3, -1], DType.I8, "bool", torch.tensor([False, True, True])),
        ([True], DType.BOOL, "bool", torch.tensor([True])),
    ],
)
def test_kind_conversions(device, values, source, method, expected):
    assert_exact(getattr(Tensor.from_data(values, device, dtype=source), method)(), expected)


def test_kind_conversion_of_same_kind_keeps_tensor(device):
    f = Tensor.from_data([1.5], device, dtype="f16")
    i = Tensor.from_data([1], device, dtype="i8")
    assert f.float() is f
    assert i.int() is i


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_to_full_precision(device, dtype):
    x = Tensor.from_data(values_for(dtype), device, dtype=dtype)
    full = x.to_full_precision()
    if dtype in (DType.F16, DType.BF16):
        assert_exact(full, reference(values_for(dtype), DType.F32))
    else:
        assert full is x


# ================================================================ reading data back
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_into_data_round_trip(device, dtype):
    data = TensorData(np.resize(np.array(values_for(dtype)), (2, 3)).tolist(), dtype)
    x = Tensor.from_data(data, device)
    assert x.into_data() == data
    assert x.to_data() == data
    assert x.tolist() == data.tolist()
    assert_close(x, to_torch(x))


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [(2.5, "f32", 2.5), (1.5, "bf16", 1.5), (-7, "i8", -7), (200, "u8", 200), (True, "bool", True)],
)
def test_item_and_into_scalar(device, value, dtype, expected):
    x = Tensor.from_data([[value]], device, dtype=dtype)
    assert x.item() == expected
    assert type(x.item()) is type(expected)
    assert x.into_scalar() == expected


def test_item_needs_one_element(device):
    with pytest.raises(
        ember.ShapeError, match=r"item\(\) needs exactly one element, got shape \[2\]"
    ):
        Tensor.from_data([1.0, 2.0], device).item()


def test_python_number_protocols(device):
    assert float(Tensor.from_data([[2.5]], device)) == 2.5
    assert int(Tensor.from_data(-3.7, device)) == -3
    assert bool(Tensor.from_data([1], device)) is True
    assert bool(Tensor.from_data(0.0, device)) is False
    assert bool(Tensor.from_data([[False]], device)) is False


@pytest.mark.parametrize("shape", [(2,), (0,), (2, 2)], ids=str)
def test_bool_of_many_elements_is_ambiguous(device, shape):
    with pytest.raises(
        ember.ShapeError,
        match=rf"truth value of a tensor of shape {shape_text(shape)} is ambiguous",
    ):
        bool(Tensor.zeros(shape, device))


def test_len_and_iter(device):
    x = Tensor.from_data([[1, 2, 3], [4, 5, 6]], device)
    assert len(x) == 2
    rows = list(x)
    assert [r.tolist() for r in rows] == torch.tensor([[1, 2, 3], [4, 5, 6]]).tolist()
    assert all(r.shape == (3,) and r.dtype is DType.I64 for r in rows)
    assert list(Tensor.zeros([0, 4], device)) == []
    assert len(Tensor.zeros([5], device)) == 5


def test_len_of_0d(device):
    with pytest.raises(ember.ShapeError, match=r"len\(\) of a 0-d tensor"):
        len(Tensor.from_data(1.0, device))


def test_metadata(device):
    x = Tensor.zeros([2, 3, 4], device, "i32")
    assert (x.shape, x.dims(), x.rank, x.ndim, x.num_elements(), x.numel()) == (
        (2, 3, 4),
        [2, 3, 4],
        3,
        3,
        24,
        24,
    )
    assert (x.kind, x.backend, x.device) == (Int, device.backend, device)


# ================================================================ devices
def test_to_device_same_device_returns_tensor(device):
    x = Tensor.from_data([1.0, 2.0], device)
    assert x.to_device(device) is x
    assert x.to_device(x.device) is x


def test_to_device_ndarray(device):
    target = ember.device("ndarray")
    x = Tensor.from_data([[1.5, -2.0]], device, dtype="f64")
    y = x.to_device(target)
    assert y.device == target
    assert y.into_data() == x.into_data()


def test_device_equality(device):
    x = Tensor.zeros([1], device)
    assert x.device == device
    rebuilt = device.backend.device(f"{device.place}:{device.index}")
    assert rebuilt == device
    assert hash(rebuilt) == hash(device)


def test_device_wrap_and_inner(device):
    class Decorator:
        name = "decorator"

        def __init__(self, inner):
            self.inner = inner

    wrapped = device.wrap(Decorator)
    assert isinstance(wrapped.backend, Decorator)
    assert wrapped.backend.inner is device.backend
    assert (wrapped.place, wrapped.index) == (device.place, device.index)
    assert wrapped.inner() == device
    assert str(wrapped) == f"decorator:{device.place}:{device.index}"


def test_ndarray_device():
    d = ember.device("ndarray")
    assert (d.backend.name, d.place, d.index) == ("ndarray", "cpu", 0)
    assert str(d) == "ndarray:cpu:0"
    assert repr(d) == "Device(ndarray, cpu:0)"
    assert d.inner() is d  # a base backend has no inner backend
    assert ember.device("ndarray", "cpu:0") == d
    assert ember.device("ndarray", "cpu") == d
    assert ember.device() == d
    assert isinstance(d.backend, ember.Backend)


def test_unknown_backend_names_the_known_ones():
    with pytest.raises(
        ember.DeviceError, match=r"unknown backend 'tpu'; registered backends: .*ndarray"
    ):
        ember.device("tpu")
    with pytest.raises(ember.DeviceError, match="unknown backend 'tpu'"):
        ember.device_count("tpu")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cuda", r"backend 'ndarray' has no 'cuda' devices; it has \['cpu'\]"),
        ("mps:0", "has no 'mps' devices"),
        ("cpu:1", "backend 'ndarray' has 1 cpu device\\(s\\); index 1 is out of range"),
        ("cpu:-1", "bad device index '-1'"),
        ("cpu:x", "bad device index 'x'"),
    ],
)
def test_bad_place_or_index(spec, message):
    with pytest.raises(ember.DeviceError, match=message):
        ember.device("ndarray", spec)


def test_default_device_honours_ember_device(monkeypatch):
    monkeypatch.delenv("EMBER_DEVICE", raising=False)
    assert ember.default_device() == ember.device("ndarray")
    monkeypatch.setenv("EMBER_DEVICE", "ndarray:cpu:0")
    assert ember.default_device() == ember.device("ndarray", "cpu:0")
    assert Tensor.from_data([1.0]).device == ember.device("ndarray")
    monkeypatch.setenv("EMBER_DEVICE", "nowhere")
    with pytest.raises(ember.DeviceError, match="unknown backend 'nowhere'"):
        ember.default_device()
    with pytest.raises(ember.DeviceError, match="unknown backend 'nowhere'"):
        Tensor.zeros([1])
    monkeypatch.setenv("EMBER_DEVICE", "ndarray:gpu")
    with pytest.raises(ember.DeviceError, match="has no 'gpu' devices"):
        ember.default_device()


def test_device_count():
    assert ember.device_count() == 1
    assert ember.device_count("ndarray", "cpu") == 1
    assert ember.device_count("ndarray", "cuda") == 0


@pytest.mark.parametrize(
    ("float_dtype", "int_dtype"), [("f64", "i32"), ("f16", "i16"), ("bf16", "i8")]
)
def test_backend_default_dtypes_are_configurable(float_dtype, int_dtype):
    d = ember.device("ndarray", float_dtype=float_dtype, int_dtype=int_dtype)
    floats = DType.parse(float_dtype)
    ints = DType.parse(int_dtype)
    assert Tensor.from_data([1.5], d).dtype is floats
    assert Tensor.zeros([2], d).dtype is floats
    assert Tensor.random([2], Distribution.default(), d).dtype is floats
    assert Tensor.from_data([1], d).dtype is ints
    assert Tensor.arange(3, device=d).dtype is ints
    assert Tensor.from_data([True], d).float().dtype is floats
    assert Tensor.from_data([True], d).int().dtype is ints
    assert (
        Tensor.from_data(np.array([1.5], dtype=np.float32), d).dtype is DType.F32
    )  # arrays keep theirs
    assert d != ember.device("ndarray")
    assert d == ember.device("ndarray", float_dtype=float_dtype, int_dtype=int_dtype)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"float_dtype": "i32"},
            "default dtypes must be a float and an int dtype, got i32 and i64",
        ),
        ({"int_dtype": "f32"}, "default dtypes must be a float and an int dtype, got f32 and f32"),
        ({"float_dtype": "f99"}, "unknown dtype 'f99'"),
    ],
)
def test_backend_default_dtypes_are_validated(options, message):
    with pytest.raises(ember.DTypeError, match=message):
        ember.device("ndarray", **options)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dtype_usage_and_support(device, dtype):
    usage = device.backend.dtype_usage(device, dtype)
    assert isinstance(usage, DTypeUsage)
    general = DTypeUsage.general()
    assert general == DTypeUsage.STORAGE | DTypeUsage.ARITHMETIC
    assert device.backend.supports_dtype(device, dtype) == ((usage & general) == general)
    # Every backend of the suite stores and computes with every ember dtype.
    assert device.backend.supports_dtype(device, dtype)
    assert Tensor.zeros([1], device, dtype).dtype is dtype


def test_missing_primitives_is_empty(device):
    assert type(device.backend).missing_primitives() == []


# ================================================================ printing
def expected_print(t: Tensor, data: str, kind: str, dtype: str, shape: str) -> str:
    return (
        "Tensor {\n"
        f"  data:\n{data},\n"
        f"  shape:  {shape},\n"
        f"  device:  {t.device},\n"
        f'  backend:  "{t.backend.name}",\n'
        f'  kind:  "{kind}",\n'
        f'  dtype:  "{dtype}",\n'
        "}"
    )


@pytest.mark.parametrize(
    ("values", "dtype", "data", "kind", "shape"),
    [
        ([[1.0, 2.0], [3.0, 4.0]], "f32", "[[1.0, 2.0],\n [3.0, 4.0]]", "Float", "[2, 2]"),
        (
            [[1.5, -0.25], [1e-5, 3.0e9]],
            "f64",
            "[[1.5, -0.25],\n [1.0e-05, 3.0e+09]]",
            "Float",
            "[2, 2]",
        ),
        ([1, -20, 300], "i64", "[  1, -20, 300]", "Int", "[3]"),
        ([[True, False]], "bool", "[[ True, False]]", "Bool", "[1, 2]"),
        (2.5, "f32", "2.5", "Float", "[]"),
        ([], "i32", "[]", "Int", "[0]"),
    ],
)
def test_print(device, capsys, values, dtype, data, kind, shape):
    t = Tensor.from_data(values, device, dtype=dtype)
    print(t)
    expected = expected_print(t, data, kind, dtype, shape)
    assert capsys.readouterr().out == expected + "\n"
    assert str(t) == repr(t) == expected


def test_print_large_tensor_is_summarized(device, monkeypatch):
    monkeypatch.delenv("EMBER_PRINT_THRESHOLD", raising=False)
    t = Tensor.arange(2000, device=device)
    assert "[   0,    1,    2, ..., 1997, 1998, 1999]" in str(t)
    small = Tensor.arange(10, device=device)
    assert "..." not in str(small)
    monkeypatch.setenv("EMBER_PRINT_THRESHOLD", "4")
    assert "[0, 1, 2, ..., 7, 8, 9]" in str(small)
    monkeypatch.setenv("EMBER_PRINT_THRESHOLD", "5000")
    assert "..." not in str(t)
    assert str(t).count(",") == 1999 + 6  # elements and metadata lines


def test_rng_state_round_trip(device):
    # A checkpoint saves the generator's state so that a resumed run draws the same numbers.
    ember.seed(device, 5)
    Tensor.random([10], device=device)
    state = device.backend.rng_state(device)
    assert isinstance(state, str)
    expected = Tensor.random([32], Distribution.normal(0.0, 1.0), device).tolist()
    Tensor.random([7], device=device)  # move on, then go back
    device.backend.set_rng_state(device, state)
    assert Tensor.random([32], Distribution.normal(0.0, 1.0), device).tolist() == expected
    with pytest.raises(ember.ArgumentError, match="not a random generator state"):
        device.backend.set_rng_state(device, "garbage")
