"""Torch-backend specifics: moving data between backends, zero-copy sharing, optional import.

The op-by-op behaviour is the conformance suite's (tests/backend), which runs on
``torch`` and, where a GPU exists, on ``torch-cuda``.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import ember
from ember import DType, Tensor, TensorData

# torch stores u16 / u32 / u64 but cannot compute with them, so ember's Torch backend rejects them.
ALL_DTYPES = [
    d if ember.device("torch").backend.supports_dtype(ember.device("torch"), d)
    else pytest.param(d, marks=pytest.mark.skip(reason=f"the torch backend does not support {d}"))
    for d in DType
]  # fmt: skip


def _sample(dtype: DType) -> TensorData:
    values = np.array([[0, 1, -2, 3], [5, -7, 11, 13], [-1, 2, 100, -100]], dtype=np.float64)
    if dtype is DType.BOOL:
        values = values > 0
    elif dtype.is_unsigned:
        values = np.abs(values)
    elif dtype.is_float:
        values = values / 8.0  # exactly representable in every float dtype, bf16 included
    return TensorData(values).convert(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_ndarray_to_torch_and_back_is_identical(dtype):
    data = _sample(dtype)
    on_ndarray = Tensor.from_data(data, ember.device("ndarray"))
    on_torch = on_ndarray.to_device(ember.device("torch"))
    back = on_torch.to_device(ember.device("ndarray"))
    assert on_torch.backend.name == "torch" and on_torch.dtype is dtype
    assert back.dtype is dtype and back.kind is on_ndarray.kind
    back.into_data().assert_eq(data)
    on_torch.into_data().assert_eq(data)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_cpu_transfers_share_memory(dtype):
    data = _sample(dtype)
    on_torch = Tensor.from_data(data, ember.device("torch"))
    assert on_torch.into_primitive().data_ptr() == data.buffer().ctypes.data
    assert on_torch.into_data().buffer().ctypes.data == data.buffer().ctypes.data


def test_torch_primitive_is_a_torch_tensor_without_autograd():
    x = Tensor.from_data([[1.0, 2.0]], ember.device("torch"))
    y = (x * 3.0).exp()
    prim = y.into_primitive()
    assert isinstance(prim, torch.Tensor)
    assert not prim.requires_grad and prim.grad_fn is None


def test_default_dtypes_are_configurable():
    device = ember.device("torch", float_dtype="f64", int_dtype="i32")
    assert Tensor.from_data([1.5], device).dtype is DType.F64
    assert Tensor.arange(3, device=device).into_primitive().dtype == torch.int32


def test_devices_and_counts():
    assert ember.device_count("torch", "cpu") == 1
    assert ember.device_count("torch", "cuda") == torch.cuda.device_count()
    count = torch.cuda.device_count()
    with pytest.raises(ember.DeviceError, match=f"'torch' has {count} cuda device"):
        ember.device("torch", f"cuda:{count}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_round_trip():
    data = _sample(DType.F32)
    on_gpu = Tensor.from_data(data, ember.device("torch", "cuda:0"))
    assert on_gpu.into_primitive().is_cuda
    on_gpu.to_device(ember.device("ndarray")).into_data().assert_eq(data)


def test_same_seed_same_numbers_across_calls():
    device = ember.device("torch")
    ember.seed(device, 7)
    first = Tensor.random([64], ember.Distribution.normal(0.0, 1.0), device).into_data()
    ember.seed(device, 7)
    second = Tensor.random([64], ember.Distribution.normal(0.0, 1.0), device).into_data()
    first.assert_eq(second)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_ember_does_not_import_torch():
    result = _run("import sys, ember; ember.Tensor.ones([2]); print('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_torch_device_without_torch_names_the_install_command():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # as if torch were not installed
        "import ember\n"
        "try:\n"
        "    ember.device('torch')\n"
        "except ember.BackendUnavailableError as err:\n"
        "    print(type(err).__name__, isinstance(err, ImportError), err)\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("BackendUnavailableError True")
    assert "pip install 'ember[torch]'" in result.stdout


def test_int_matmul_by_blocks_matches_the_cpu_kernel_and_wraps_on_overflow():
    # CUDA has no integer matmul; the backend's fallback runs on the CPU too, so it is checked here.
    from ember.backends.torch.backend import _int_matmul_by_blocks

    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-9, 9, (3, 1, 4, 5), generator=generator)
    b = torch.randint(-9, 9, (2, 5, 7), generator=generator, dtype=torch.int32)
    result = _int_matmul_by_blocks(a, b)
    assert result.dtype == torch.int64
    assert torch.equal(result, torch.matmul(a, b.long()))
    big = torch.randint(-(2**62), 2**62, (4, 300), generator=generator)
    assert torch.equal(_int_matmul_by_blocks(big, big.T), torch.matmul(big, big.T))
    empty = _int_matmul_by_blocks(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long))
    assert torch.equal(empty, torch.zeros(2, 3, dtype=torch.long))
