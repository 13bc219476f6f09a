"""The low-precision storage dtypes (float8, float4, 4 and 2-bit ints): data, casts on each
backend, no promotion, records. References: ml_dtypes arrays built from Python values, and
torch's float8 casts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import ember
from ember import DType, DTypeUsage, Tensor, TensorData
from ember.backend.errors import RecordFormatError
from ember.record.precision import FullPrecision, HalfPrecision
from ember.record.recorder import BinBytesRecorder, JsonGzFileRecorder, NamedMpkFileRecorder
from ember.record.safetensors import read_safetensors, write_safetensors
from ember.tensor.dtype import promote

ML_DTYPE = {
    DType.F8E4M3FN: ml_dtypes.float8_e4m3fn, DType.F8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    DType.F8E5M2: ml_dtypes.float8_e5m2, DType.F8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    DType.F8E8M0FNU: ml_dtypes.float8_e8m0fnu, DType.F4E2M1FN: ml_dtypes.float4_e2m1fn,
    DType.I4: ml_dtypes.int4, DType.U4: ml_dtypes.uint4, DType.I2: ml_dtypes.int2,
    DType.U2: ml_dtypes.uint2,
}  # fmt: skip
LOW = list(ML_DTYPE)
TORCH_F8 = {DType.F8E4M3FN: torch.float8_e4m3fn, DType.F8E4M3FNUZ: torch.float8_e4m3fnuz,
            DType.F8E5M2: torch.float8_e5m2, DType.F8E5M2FNUZ: torch.float8_e5m2fnuz}  # fmt: skip


def exact_values(dtype: DType) -> list:
    """Values every low-precision dtype of this kind holds exactly."""
    if dtype is DType.F8E8M0FNU:
        return [0.25, 1.0, 2.0, 64.0]  # powers of two only
    if dtype.is_float:
        return [-3.0, -0.5, 0.0, 1.5, 4.0]
    return [0, 1, 2, 3] if dtype.is_unsigned else [-2, -1, 0, 1]


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_data_round_trips_and_reads_as_python_numbers(dtype):
    values = exact_values(dtype)
    data = TensorData(values, dtype)
    assert data.dtype is dtype and data.to_numpy().dtype == np.dtype(ML_DTYPE[dtype])
    assert data.tolist() == values and data.convert("f64").tolist() == values
    assert TensorData(values[1:2], dtype).item() == values[1]
    assert dtype.itemsize == 1 and len(data.to_bytes()) == len(values)
    assert TensorData.from_bytes(data.to_bytes(), [len(values)], dtype) == data
    assert TensorData(np.array(values, ML_DTYPE[dtype])).dtype is dtype
    assert DType.parse(np.dtype(ML_DTYPE[dtype]).name) is dtype


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_ndarray_stores_and_casts_but_does_not_create(dtype):
    device = ember.device("ndarray")
    assert device.backend.dtype_usage(device, dtype) == DTypeUsage.STORAGE
    values = exact_values(dtype)
    x = Tensor.from_data(TensorData(values, dtype), device)
    assert x.dtype is dtype and x.kind is dtype.kind
    assert x.cast("f32").tolist() == values
    wide = Tensor.from_data(np.array(values, np.float32), device)
    assert wide.cast(dtype).into_data() == TensorData(values, dtype)
    with pytest.raises(ember.UnsupportedError, match=f"zeros: backend 'ndarray' does not support {dtype}"):
        Tensor.zeros([2], device, dtype)


@pytest.mark.parametrize("source", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("dtype", [DType.I4, DType.U4, DType.I2, DType.U2], ids=str)
def test_floats_cast_to_small_ints_truncate_and_wrap(dtype, source):
    # ONNX's Cast and every wider int wrap; ml_dtypes 0.7 alone makes out-of-range floats 0
    values = [-9.0, -8.0, -2.75, -0.5, 0.0, 2.75, 7.0, 8.0, 9.0, 15.0, 16.0, 17.5]
    bits = 4 if dtype in (DType.I4, DType.U4) else 2
    truncated = np.trunc(values).astype(np.int64)
    offset = 0 if dtype.is_unsigned else 2 ** (bits - 1)
    expected = ((truncated + offset) % 2**bits - offset).tolist()
    data = TensorData(values, source)
    assert data.convert(dtype).convert("i32").tolist() == expected
    x = Tensor.from_data(data, ember.device("ndarray"))
    assert x.cast(dtype).cast("i32").tolist() == expected


@pytest.mark.parametrize("dtype", TORCH_F8, ids=str)
def test_float8_rounds_like_torch_on_both_backends(dtype):
    values = np.array([0.1, -1.3, 3.3, 17.0, 100.0, -0.0078], np.float32)
    expected = torch.tensor(values).to(TORCH_F8[dtype]).float().numpy()
    for name in ("ndarray", "torch"):
        device = ember.device(name)
        x = Tensor.from_data(values, device).cast(dtype)
        assert x.dtype is dtype and device.backend.dtype_usage(device, dtype) == DTypeUsage.STORAGE
        np.testing.assert_array_equal(x.cast("f32").to_numpy(), expected)
    moved = Tensor.from_data(values, ember.device("ndarray")).cast(dtype).to_device(ember.device("torch"))
    assert moved.into_primitive().dtype == TORCH_F8[dtype]
    np.testing.assert_array_equal(moved.into_primitive().float().numpy(), expected)


@pytest.mark.parametrize("dtype", [d for d in LOW if d not in TORCH_F8], ids=str)
def test_torch_does_not_store_the_others(dtype):
    device = ember.device("torch")
    assert device.backend.dtype_usage(device, dtype) == DTypeUsage(0)
    with pytest.raises(ember.UnsupportedError, match=f"from_data: backend 'torch' does not store {dtype}"):
        Tensor.from_data(TensorData(exact_values(dtype), dtype), device)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_no_promotion_with_another_dtype(dtype):
    other = DType.F32 if dtype.is_float else DType.I32
    assert promote(dtype, dtype) is dtype
    with pytest.raises(ember.DTypeError, match=f"cannot combine {other} with {dtype}: {dtype} is a "
                                               "storage dtype that does not promote; cast it"):
        promote(other, dtype)
    device = ember.device("ndarray")
    x = Tensor.from_data(TensorData(exact_values(dtype), dtype), device)
    with pytest.raises(ember.DTypeError, match=f"cannot combine {dtype} with {other}"):
        _ = x + x.cast(other)


@pytest.mark.parametrize("recorder_type", [NamedMpkFileRecorder, JsonGzFileRecorder, BinBytesRecorder],
                         ids=lambda r: r.__name__)  # fmt: skip
def test_records_keep_the_storage_dtype(recorder_type):
    record = {d.value: TensorData(exact_values(d), d) for d in LOW}
    for precision in (FullPrecision, HalfPrecision):
        recorder = recorder_type(precision)
        loaded = recorder.from_bytes(recorder.to_bytes(record))
        for name, expected in record.items():
            assert loaded[name].dtype is expected.dtype
            assert loaded[name].tolist() == expected.tolist()


def test_safetensors_keeps_float8_and_rejects_packed_types(tmp_path):
    stored = [DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ, DType.F8E8M0FNU]
    record = {d.value: TensorData(exact_values(d), d) for d in stored}
    write_safetensors(tmp_path / "f8.safetensors", record)
    back, _ = read_safetensors(tmp_path / "f8.safetensors")
    assert {n: (t.dtype, t.tolist()) for n, t in back.items()} == {
        n: (t.dtype, t.tolist()) for n, t in record.items()
    }
    for dtype in (DType.F4E2M1FN, DType.I4, DType.U2):
        with pytest.raises(RecordFormatError, match=f"tensor 'w' has dtype {dtype}, which "
                                                          "safetensors cannot store"):
            write_safetensors(tmp_path / "x.safetensors", {"w": TensorData(exact_values(dtype), dtype)})
