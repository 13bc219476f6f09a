"""Attention, quantization, signal, vision and Det converters on what the node suite leaves
out: dynamic batch dims, larger and singular matrices, cropped and padded transforms,
negative axes, and the torch backend."""

from __future__ import annotations

import numpy as np
import pytest
from op_helpers import check, node_model, ort

import ember
from ember.onnx.importer import convert

RNG = np.random.default_rng(11)


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("device_name", ["ndarray", "torch"])
def test_det_of_larger_and_singular_matrices(device_name):
    x = _randn(4, 5, 5)
    x[1, 3] = x[1, 0] * 2.0  # a singular matrix
    x[2] = np.triu(x[2])  # a zero below the first pivot
    x[2, 0, 0] = 0.0
    conversion = check(node_model("Det", x, opset=22), x, device_name, rtol=1e-4, atol=1e-4)
    device = ember.device(device_name)
    got = conversion.build(device)(ember.Tensor.from_data(x, device)).to_numpy()
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("length", "inverse", "onesided"),
                         [(6, 0, 0), (12, 0, 1), (7, 1, 0), (10, 1, 1)])  # fmt: skip
def test_dft_crops_and_pads_to_dft_length(length, inverse, onesided):
    x = _randn(2, 8, 3, 2)
    constants = {"dft_length": np.array(length, np.int64), "axis": np.array(1, np.int64)}
    model = node_model("DFT", x, constants, opset=20, inverse=inverse, onesided=onesided)
    got = convert(model).build(ember.device("ndarray"))(ember.Tensor.from_data(x)).to_numpy()
    z = x[..., 0] + 1j * x[..., 1]
    if inverse and onesided:
        want = np.fft.irfft(z, n=length, axis=1)[..., None]
    elif inverse:
        want = np.fft.ifft(z, n=length, axis=1)
    else:
        want = np.fft.fft(z, n=length, axis=1)[:, : length // 2 + 1 if onesided else length]
    if want.shape[-1] != 1:
        want = np.stack([want.real, want.imag], -1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_matches_onnxruntime_far_outside(mode, padding):
    x = _randn(2, 3, 4, 5)
    grid = (RNG.uniform(-3.5, 3.5, (2, 3, 6, 2))).astype(np.float32)
    for corners in (0, 1):
        check(node_model("GridSample", x, {"grid": grid}, opset=20, mode=mode,
                         padding_mode=padding, align_corners=corners), x, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("device_name", ["ndarray", "torch"])
def test_quantize_round_trip_per_axis_negative_axis(device_name):
    x = _randn(2, 3, 4) * 3
    scale = np.array([0.02, 0.05, 0.1, 0.03], np.float32)
    zero = np.array([-3, 0, 5, 127], np.int8)
    check(node_model("QuantizeLinear", x, {"scale": scale, "zero": zero}, opset=19, axis=-1), x,
          device_name)  # fmt: skip
    q = RNG.integers(0, 256, (2, 3, 4)).astype(np.uint8)
    zero = np.array([3, 0, 250, 127], np.uint8)
    constants = {"scale": scale, "zero": zero}
    model = node_model("DequantizeLinear", q, constants, opset=19, axis=-1)
    device = ember.device(device_name)
    got = convert(model).build(device)(ember.Tensor.from_data(q, device)).to_numpy()
    want = (q.astype(np.float32) - zero) * scale
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_quantize_rejects_a_dtype_wider_than_16_bits():
    x = _randn(2, 3)
    model = node_model("QuantizeLinear", x, {"scale": np.float32(0.1),
                                             "zero": np.uint32(3)}, opset=21)  # fmt: skip
    with pytest.raises(ember.onnx.UnsupportedOnnxError,
                       match="the quantized dtype u32 is not one of u8, i8, u16, i16, u4, i4, "
                             "u2, i2, f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f4e2m1fn"):
        convert(model)


def test_attention_with_a_dynamic_batch_matches_onnxruntime():
    q = _randn(3, 4, 2, 8)
    k, v = _randn(3, 2, 5, 8), _randn(3, 2, 5, 8)
    mask = RNG.integers(0, 2, (2, 5)).astype(bool)
    mask[:, 0] = True
    model = node_model("Attention", q, {"k": k, "v": v, "mask": mask}, opset=23, is_causal=1,
                       softcap=3.0)  # fmt: skip
    try:
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception as error:
        pytest.skip(f"onnxruntime cannot run this Attention node: {error}")
    check(model, q, atol=1e-4)
