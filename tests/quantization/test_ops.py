"""A Float input by a quantized weight: the default (dequantize, then matmul) against
NumPy float64, PyTorch's int8 kernel on the Torch backend against PyTorch's own dynamically
quantized Linear and within the input's quantization error, gradients to the input, and
careless calls."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from quant_reference import per_element

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError, DeviceError, KindError, ShapeError
from ember.quantization import QuantScheme, linear, matmul

NDARRAY_LIKE = {
    "ndarray": lambda: ember.device("ndarray"),
    "autodiff": lambda: ember.device("ndarray").autodiff(),
    "fusion": lambda: ember.device("ndarray").fusion(runtime="interpreter"),
}
SCHEMES = [
    QuantScheme(),
    QuantScheme(granularity="axis", axis=1),
    QuantScheme(mode="affine", granularity="axis", axis=-1),
    QuantScheme(value="int4", granularity="block", axis=0, block_size=8),
    QuantScheme(value="int4", mode="affine", granularity="block", axis=0, block_size=16,
                scale_dtype="f16"),
]
RNG = np.random.default_rng(11)
X = RNG.standard_normal((3, 5, 32)).astype(np.float32)
W = RNG.standard_normal((32, 24)).astype(np.float32)
B = RNG.standard_normal(24).astype(np.float32)


def _dequantized(scheme: QuantScheme, weight: np.ndarray = W) -> np.ndarray:
    """The weight as the scheme stores it, dequantized in float64 from its numbers."""
    q = Tensor.from_data(weight, ember.device("ndarray")).quantize(scheme)
    values = q.int_values().to_numpy().astype(np.float64)
    scales = per_element(q.scales.to_numpy().astype(np.float64), weight.shape, scheme)
    zps = 0.0 if q.zero_points is None else per_element(
        q.zero_points.to_numpy().astype(np.float64), weight.shape, scheme)  # fmt: skip
    return (values - zps) * scales


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.describe())
@pytest.mark.parametrize("backend", list(NDARRAY_LIKE))
def test_the_default_is_dequantize_then_matmul(scheme, backend):
    device = NDARRAY_LIKE[backend]()
    q = Tensor.from_data(W, device).quantize(scheme)
    got = linear(Tensor.from_data(X, device), q, Tensor.from_data(B, device)).to_numpy()
    expected = X.astype(np.float64) @ _dequantized(scheme) + B
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.fixture
def torch_device():
    pytest.importorskip("torch", reason="the Torch backend needs torch (ember[torch])")
    return ember.device("torch")


@pytest.mark.parametrize("scheme", SCHEMES[:2], ids=lambda s: s.describe())
def test_torch_runs_pytorchs_dynamic_int8_linear(scheme, torch_device):
    import torch

    q = Tensor.from_data(W, torch_device).quantize(scheme)
    got = linear(Tensor.from_data(X, torch_device), q, Tensor.from_data(B, torch_device)).to_numpy()
    # PyTorch's own dynamically quantized Linear holding the same int8 weight and scales.
    values = torch.from_numpy(q.int_values().to_numpy().T.copy())
    scales = torch.from_numpy(q.scales.to_numpy().astype(np.float64))
    if scheme.granularity == "tensor":
        weight = torch._make_per_tensor_quantized_tensor(values, float(scales), 0)
    else:
        weight = torch._make_per_channel_quantized_tensor(values, scales,
                                                          torch.zeros(24, dtype=torch.long), 0)  # fmt: skip
    reference = torch.ao.nn.quantized.dynamic.Linear(32, 24, dtype=torch.qint8)
    reference.set_weight_bias(weight, torch.from_numpy(B))
    with torch.no_grad():
        expected = reference(torch.from_numpy(X)).numpy()
    np.testing.assert_array_equal(got, expected)
    # Within the input's quantization error of the exact product: PyTorch quantizes each
    # row block of the input to 7 bits over [min(x, 0), max(x, 0)].
    exact = X.astype(np.float64) @ _dequantized(scheme) + B
    step = (max(X.max(), 0) - min(X.min(), 0)) / 127
    bound = step / 2 * np.abs(_dequantized(scheme)).sum(axis=0) + 1e-4
    assert np.all(np.abs(got - exact) <= bound)


@pytest.mark.parametrize("scheme", SCHEMES[:2], ids=lambda s: s.describe())
def test_the_cuda_dynamic_form_quantizes_each_row_and_sums_in_integers(scheme, torch_device):
    # CUDA's dynamic linear (no GPU is needed: torch._int_mm runs on the CPU too, so the
    # function is called on CPU tensors here; on CUDA the backend picks it).
    import torch

    from ember.backends.torch.quantized import linear_dynamic_rows

    q = Tensor.from_data(W, torch_device).quantize(scheme)
    got = linear_dynamic_rows(torch.from_numpy(X), q.values._prim, q.scales._prim, None,
                              torch.from_numpy(B), q.options).numpy()  # fmt: skip
    rows = X.reshape(-1, 32).astype(np.float64)
    row_scales = np.float32(np.abs(rows).max(1, keepdims=True)) / np.float32(127)
    quantized = np.clip(np.round(rows / row_scales), -127, 127) * row_scales
    expected = (quantized @ _dequantized(scheme) + B).reshape(3, 5, 24)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    affine = Tensor.from_data(W, torch_device).quantize(SCHEMES[2])
    assert linear_dynamic_rows(torch.from_numpy(X), affine.values._prim, affine.scales._prim,
                               affine.zero_points._prim, None, affine.options) is None  # fmt: skip
    if torch.cuda.is_available():
        cuda = ember.device("torch", "cuda:0")
        x = Tensor.from_data(np.repeat(X, 4, axis=1), cuda)  # > 16 rows for CUDA's _int_mm
        on_gpu = linear(x, q.to_device(cuda), Tensor.from_data(B, cuda)).to_numpy()
        on_cpu = linear_dynamic_rows(torch.from_numpy(np.repeat(X, 4, axis=1)), q.values._prim,
                                     q.scales._prim, None, torch.from_numpy(B), q.options)  # fmt: skip
        np.testing.assert_allclose(on_gpu, on_cpu.numpy(), rtol=1e-5, atol=1e-5)
    else:
        print("no CUDA device: the CUDA dynamic linear ran on the CPU only")


def test_torch_falls_back_to_the_default_where_its_kernel_does_not_apply(torch_device):
    for scheme in SCHEMES[2:]:
        q = Tensor.from_data(W, torch_device).quantize(scheme)
        got = matmul(Tensor.from_data(X, torch_device), q).to_numpy()
        np.testing.assert_allclose(got, X.astype(np.float64) @ _dequantized(scheme), rtol=1e-5,
                                   atol=1e-5)  # fmt: skip


def test_the_packed_weight_is_made_once_and_dropped_with_the_weight(torch_device):
    from ember.backends.torch import quantized

    def packed_for(values) -> list:
        return [entry[1] for key, entry in quantized._kept.entries.items()
                if key[0] == "linear_prepack" and entry[0][0]() is values]

    q = Tensor.from_data(W, torch_device).quantize(QuantScheme(granularity="axis", axis=1))
    x = Tensor.from_data(X, torch_device)
    first = matmul(x, q).to_numpy()
    made = packed_for(q.values._prim)
    assert len(made) == 1
    np.testing.assert_array_equal(matmul(x, q).to_numpy(), first)
    assert packed_for(q.values._prim) == made  # reused, not packed again
    del q
    gc.collect()
    other = Tensor.from_data(W * 2, torch_device).quantize(QuantScheme(granularity="axis", axis=1))
    matmul(x, other)  # packs its own weight, and drops the dead one's
    assert all(entry[0][0]() is not None for entry in quantized._kept.entries.values())


@pytest.mark.parametrize("name", ["autodiff", "autodiff-torch"])
def test_the_gradient_flows_to_the_input_only(name):
    if name == "autodiff-torch":
        pytest.importorskip("torch", reason="the Torch backend needs torch (ember[torch])")
        device = ember.device("torch").autodiff()
    else:
        device = ember.device("ndarray").autodiff()
    scheme = QuantScheme(granularity="axis", axis=1)
    q = Tensor.from_data(W, device).quantize(scheme)
    x = Tensor.from_data(X, device).require_grad()
    b = Tensor.from_data(B, device).require_grad()
    upstream = RNG.standard_normal((3, 5, 24)).astype(np.float32)
    grads = (linear(x, q, b) * Tensor.from_data(upstream, device)).sum().backward()
    expected = upstream.astype(np.float64) @ _dequantized(scheme).T
    np.testing.assert_allclose(x.grad(grads).to_numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.grad(grads).to_numpy(), upstream.sum(axis=(0, 1)), rtol=1e-5)
    assert q.scales.grad(grads) is None


def test_careless_calls_are_typed_errors():
    device = ember.device("ndarray")
    q = Tensor.from_data(W, device).quantize(QuantScheme())
    x = Tensor.from_data(X, device)
    with pytest.raises(ArgumentError, match="weight must be a QTensor"):
        matmul(x, Tensor.from_data(W, device))
    with pytest.raises(KindError, match="the input must be a Float tensor, got Int"):
        matmul(Tensor.from_data(X.astype(np.int64), device, kind=ember.Kind.INT), q)
    with pytest.raises(ShapeError, match=r"inner dims differ: \[3, 5, 24\] @ \[32, 24\]"):
        matmul(Tensor.zeros([3, 5, 24], device), q)
    with pytest.raises(DeviceError):
        matmul(Tensor.from_data(X, ember.device("ndarray").autodiff()), q)
    with pytest.raises(ShapeError, match=r"bias must have shape \[24\], got \[32\]"):
        linear(x, q, Tensor.zeros([32], device))
    with pytest.raises(KindError, match="the bias must be a Float tensor, got Int"):
        linear(x, q, Tensor.zeros([24], device, kind=ember.Kind.INT))


# ------------------------------------------------------------------------ convolution


def _conv_reference(x, weight, bias, stride, padding, groups=1):
    """A float64 convolution of NumPy arrays, by PyTorch."""
    torch = pytest.importorskip("torch", reason="the reference convolution is PyTorch's")
    out = torch.nn.functional.conv2d(torch.from_numpy(x.astype(np.float64)),
                                     torch.from_numpy(weight.astype(np.float64)),
                                     None if bias is None else torch.from_numpy(bias.astype(np.float64)),
                                     stride, padding, 1, groups)  # fmt: skip
    return out.numpy()


def _dequantized_conv(weight: np.ndarray, scheme: QuantScheme) -> np.ndarray:
    q = Tensor.from_data(weight, ember.device("ndarray")).quantize(scheme)
    values = q.int_values().to_numpy().astype(np.float64)
    scales = q.scales.to_numpy().astype(np.float64).reshape(-1, *[1] * (weight.ndim - 1))
    zps = 0.0 if q.zero_points is None else q.zero_points.to_numpy().astype(np.float64).reshape(scales.shape)
    return (values - zps) * scales


CONV_X = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
CONV_W = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)  # groups=2
CONV_B = RNG.standard_normal(6).astype(np.float32)


@pytest.mark.parametrize("scheme", [QuantScheme(granularity="axis", axis=0),
                                    QuantScheme(mode="affine", value="int4", granularity="axis",
                                                axis=0)], ids=lambda s: s.describe())  # fmt: skip
@pytest.mark.parametrize("backend", ["ndarray", "torch", "fusion"])
def test_conv2d_by_a_quantized_weight(scheme, backend):
    from ember.quantization import conv2d

    if backend == "torch":
        pytest.importorskip("torch", reason="the Torch backend needs torch (ember[torch])")
        device = ember.device("torch")
    else:
        device = NDARRAY_LIKE[backend]()
    q = Tensor.from_data(CONV_W, device).quantize(scheme)
    got = conv2d(Tensor.from_data(CONV_X, device), q, Tensor.from_data(CONV_B, device),
                 stride=2, padding=1, groups=2).to_numpy()  # fmt: skip
    expected = _conv_reference(CONV_X, _dequantized_conv(CONV_W, scheme), CONV_B, 2, 1, groups=2)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_conv2d_gradients_flow_to_the_input_and_bias():
    torch = pytest.importorskip("torch", reason="the reference gradients are PyTorch's")
    from ember.quantization import conv2d

    device = ember.device("ndarray").autodiff()
    scheme = QuantScheme(granularity="axis", axis=0)
    q = Tensor.from_data(CONV_W, device).quantize(scheme)
    x = Tensor.from_data(CONV_X, device).require_grad()
    b = Tensor.from_data(CONV_B, device).require_grad()
    grads = conv2d(x, q, b, padding=1, groups=2).sum().backward()
    xt = torch.from_numpy(CONV_X.astype(np.float64)).requires_grad_(True)
    bt = torch.from_numpy(CONV_B.astype(np.float64)).requires_grad_(True)
    wt = torch.from_numpy(_dequantized_conv(CONV_W, scheme))
    torch.nn.functional.conv2d(xt, wt, bt, 1, 1, 1, 2).sum().backward()
    np.testing.assert_allclose(x.grad(grads).to_numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.grad(grads).to_numpy(), bt.grad.numpy(), rtol=1e-5)


def test_conv2d_careless_calls():
    from ember.quantization import conv2d

    device = ember.device("ndarray")
    q = Tensor.from_data(CONV_W, device).quantize(QuantScheme(granularity="axis", axis=0))
    with pytest.raises(ShapeError):
        conv2d(Tensor.from_data(CONV_X, device), q)  # 4 input channels, groups 1: 2 expected
    with pytest.raises(ShapeError, match="weight must be 4-d or 5-d"):
        conv2d(Tensor.from_data(CONV_X, device), Tensor.from_data(W, device).quantize(QuantScheme()))
    with pytest.raises(ArgumentError, match="groups must be >= 1"):
        conv2d(Tensor.from_data(CONV_X, device), q, groups=0)


# ------------------------------------------------------------------------ the numba kernel


@pytest.mark.parametrize("scheme", [
    QuantScheme(), QuantScheme(granularity="axis", axis=1), QuantScheme(granularity="axis", axis=0),
    QuantScheme(mode="affine", granularity="axis", axis=1, scale_dtype="f16"),
    QuantScheme(value="int4", granularity="block", axis=0, block_size=8),
    QuantScheme(value="int4", mode="affine", granularity="block", axis=1, block_size=8),
], ids=lambda s: s.describe())  # fmt: skip
@pytest.mark.parametrize("rows", [128, 3], ids=["gemm", "few-rows"])
def test_fusion_runs_a_dequantizing_gemm_where_the_layout_allows(scheme, rows):
    pytest.importorskip("numba", reason="the compiled kernel needs ember[jit]")
    from ember.backends.fusion import autotune, reset_stats, stats
    from ember.backends.fusion.autotune import Choice

    device = ember.device("ndarray").fusion(runtime="numba")
    # Large enough to be tuned; a few rows take the kernel that reads the weight directly.
    x = RNG.standard_normal((rows, 1024)).astype(np.float32)
    weight = RNG.standard_normal((1024, 128)).astype(np.float32)
    bias = RNG.standard_normal(128).astype(np.float32)
    q = Tensor.from_data(weight, device).quantize(scheme)
    device.sync()
    reset_stats()
    with autotune.forcing(Choice("fused", 2)):
        got = linear(Tensor.from_data(x, device), q, Tensor.from_data(bias, device)).to_numpy()
    expected = x.astype(np.float64) @ _dequantized(scheme, weight) + bias
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    # Blocks along the output dim are not a layout the kernel takes: the default runs.
    along_output = scheme.granularity == "block" and scheme.axis == 1
    assert stats()["op_kernels"] == (0 if along_output else 1)
