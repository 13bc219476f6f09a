"""ember's error hierarchy: each error class raised through the public API.

Every error is an ``ember.EmberError`` and the built-in exception a Python user
would catch for the same mistake, and its message names the op and the operands.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import ember
import ember.backend
from ember import DType, DTypeUsage, Tensor
from ember.backend import NdArray


def cpu() -> ember.Device:
    return ember.device("ndarray")


class NoHalfBackend(NdArray):
    """A backend that can store f16 but not compute with it."""

    name = "nohalf"

    def dtype_usage(self, device, dtype):
        if dtype is DType.F16:
            return DTypeUsage.STORAGE
        return super().dtype_usage(device, dtype)


class BareBackend(ember.Backend):
    """A backend that implements no primitive at all."""

    name = "bare"


def _add_mismatched_shapes():
    Tensor.from_data([1.0, 2.0], cpu()) + Tensor.from_data([1.0, 2.0, 3.0], cpu())


def _int_plus_float_scalar():
    Tensor.from_data([1, 2], cpu()) + 1.5


def _arange_float_dtype():
    Tensor.arange(3, device=cpu(), dtype="f32")


def _sum_dim_out_of_range():
    Tensor.zeros([2, 3], cpu()).sum_dim(5)


def _index_out_of_bounds():
    Tensor.zeros([2, 3], cpu())[5]


def _unsupported_dtype():
    Tensor.zeros([2], NoHalfBackend().default_device(), "f16")


def _missing_primitive():
    BareBackend().float_add(None, None)


CASES: dict[str, tuple[type, type, Callable[[], object], str]] = {
    # name: (ember error, built-in it also is, trigger, message pattern)
    "shape": (ember.ShapeError, ValueError, _add_mismatched_shapes,
              r"add: shapes \[2\] and \[3\] cannot be broadcast \(dim -1 is 2 vs 3\)"),
    "kind": (ember.KindError, TypeError, _int_plus_float_scalar,
             r"add: a float scalar \(1.5\) with an Int tensor; convert with .float\(\) first"),
    "dtype": (ember.DTypeError, TypeError, _arange_float_dtype,
              "arange makes Int tensors; got dtype f32"),
    "dtype_parse": (ember.DTypeError, TypeError, lambda: DType.parse("f128"),
                    "unknown dtype 'f128'; expected one of f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8, bool"),
    "device": (ember.DeviceError, ValueError, lambda: ember.device("tpu"),
               "unknown backend 'tpu'; registered backends: .*ndarray"),
    "device_index": (ember.DeviceError, ValueError, lambda: ember.device("ndarray", "cpu:3"),
                     "backend 'ndarray' has 1 cpu device\\(s\\); index 3 is out of range"),
    "argument": (ember.ArgumentError, ValueError, _sum_dim_out_of_range,
                 "sum_dim: dim 5 is out of range for a tensor of rank 2"),
    "distribution": (ember.ArgumentError, ValueError, lambda: ember.Distribution.normal(0.0, -2.0),
                     "Normal needs std >= 0, got -2.0"),
    "index": (ember.EmberIndexError, IndexError, _index_out_of_bounds,
              "index 5 is out of bounds for dim 0 of size 2"),
    "unsupported_dtype": (ember.UnsupportedError, NotImplementedError, _unsupported_dtype,
                          "zeros: backend 'nohalf' does not support f16 on nohalf:cpu:0"),
    "missing_primitive": (ember.UnsupportedError, NotImplementedError, _missing_primitive,
                          "backend 'bare' does not implement float_add \\(op 'add'\\)"),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_error_through_public_api(name):
    error, builtin, trigger, message = CASES[name]
    with pytest.raises(error, match=message) as info:
        trigger()
    assert isinstance(info.value, ember.EmberError)
    assert isinstance(info.value, builtin)


def test_builtin_except_clauses_catch_ember_errors():
    with pytest.raises(ValueError):
        _add_mismatched_shapes()
    with pytest.raises(TypeError):
        _int_plus_float_scalar()
    with pytest.raises(IndexError):
        _index_out_of_bounds()
    with pytest.raises(NotImplementedError):
        _missing_primitive()


def test_cast_needs_storage_only_and_a_dtype_not_stored_is_rejected():
    # A storage-only dtype is held and cast (how float8 weights load); creating one is not.
    x = Tensor.from_data([1.5], NoHalfBackend().default_device())
    half = x.cast("f16")
    assert half.dtype is DType.F16 and half.cast("f32").tolist() == [1.5]
    assert not x.device.backend.supports_dtype(x.device, DType.F16)
    on_torch = Tensor.from_data([1.5], ember.device("torch"))
    with pytest.raises(ember.UnsupportedError, match="cast: backend 'torch' does not store i4"):
        on_torch.cast("i4")


def test_missing_primitives_lists_unimplemented_ops():
    missing = BareBackend.missing_primitives()
    assert {"float_add", "int_add", "bool_not", "float_from_data", "conv2d"} <= set(missing)
    assert NdArray.missing_primitives() == []


HIERARCHY = [
    (ember.ShapeError, ValueError),
    (ember.KindError, TypeError),
    (ember.DTypeError, TypeError),
    (ember.DeviceError, ValueError),
    (ember.ArgumentError, ValueError),
    (ember.EmberIndexError, IndexError),
    (ember.UnsupportedError, NotImplementedError),
    (ember.BackendUnavailableError, ImportError),
]


@pytest.mark.parametrize(("error", "builtin"), HIERARCHY, ids=lambda c: c.__name__)
def test_hierarchy(error, builtin):
    assert issubclass(error, ember.EmberError)
    assert issubclass(error, builtin)
    assert issubclass(ember.EmberError, Exception)
    assert getattr(ember.backend, error.__name__) is error  # exported from both packages
    with pytest.raises(builtin, match="a message"):
        raise error("a message")


def test_backend_unavailable_error_is_an_import_error():
    # No optional backend is missing in the test environment; the class must still let
    # ``except ImportError`` (the usual guard around optional dependencies) catch it.
    try:
        raise ember.BackendUnavailableError("backend 'torch' needs the torch package")
    except ImportError as err:
        assert isinstance(err, ember.EmberError)
        assert "torch" in str(err)
