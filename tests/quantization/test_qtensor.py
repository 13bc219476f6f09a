"""Quantize and dequantize on every scheme, against a NumPy reference of the documented
formulas (float32 arithmetic, as specified: exact integer values, scales and zero points),
a float64 bound on the error, and the same numbers on every backend."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from quant_reference import per_element

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError, ConfigError, DTypeError, KindError, ShapeError
from ember.quantization import QTensor, QuantScheme

BACKENDS = {
    "ndarray": lambda: ember.device("ndarray"),
    "torch": lambda: ember.device("torch"),
    "autodiff": lambda: ember.device("ndarray").autodiff(),
    "fusion": lambda: ember.device("ndarray").fusion(runtime="interpreter"),
}
EPS = np.float32(np.finfo(np.float32).eps)


@pytest.fixture(params=list(BACKENDS))
def device(request) -> ember.Device:
    if request.param == "torch":
        pytest.importorskip("torch", reason="the Torch backend needs torch (ember[torch])")
    return BACKENDS[request.param]()


def _schemes() -> list[QuantScheme]:
    places = [dict(granularity="tensor"), dict(granularity="axis", axis=0),
              dict(granularity="axis", axis=-1), dict(granularity="block", axis=-1, block_size=4),
              dict(granularity="block", axis=1, block_size=2)]  # fmt: skip
    out = []
    for value, mode, place in itertools.product(("int8", "int4"), ("symmetric", "affine"), places):
        out.append(QuantScheme(value=value, mode=mode, **place))
    out.append(QuantScheme(granularity="axis", axis=1, scale_dtype="f16"))
    out.append(QuantScheme(value="int4", mode="affine", granularity="block", axis=-1,
                           block_size=2, scale_dtype="f16"))  # fmt: skip
    return out


SCHEMES = _schemes()


def reference(x: np.ndarray, scheme: QuantScheme):
    """(q, scales, zero points) of the plan's formulas in float32 NumPy arithmetic."""
    shape = x.shape
    axis = None if scheme.axis is None else scheme.axis % x.ndim
    if scheme.granularity == "block":
        b = scheme.block_size
        view = x.reshape(*shape[:axis], shape[axis] // b, b, *shape[axis + 1 :])
        dims = (axis + 1,)
    else:
        view = x
        dims = tuple(d for d in range(x.ndim) if d != axis)
    qmin, qmax = np.float32(scheme.qmin), np.float32(scheme.qmax)
    sdtype = np.float16 if scheme.scale_dtype == "f16" else np.float32
    if scheme.mode == "affine":
        lo = np.minimum(view.min(axis=dims, keepdims=True), np.float32(0))
        hi = np.maximum(view.max(axis=dims, keepdims=True), np.float32(0))
        raw = (hi - lo) / (qmax - qmin)
    else:
        raw = np.abs(view).max(axis=dims, keepdims=True) / qmax
    scale = np.maximum(raw, EPS).astype(sdtype).astype(np.float32)
    zp = None
    if scheme.mode == "affine":
        zp = np.clip(qmin - np.round(lo / scale), qmin, qmax)
    q = np.round(view / scale) + (0 if zp is None else zp)
    q = np.clip(q, qmin, qmax).astype(np.int8).reshape(shape)
    qshape = scheme.scales_shape(shape)
    scales = scale.astype(sdtype).reshape(qshape)
    return q, scales, None if zp is None else zp.astype(np.int8).reshape(qshape)


def _check(x: np.ndarray, scheme: QuantScheme, device: ember.Device) -> QTensor:
    q = Tensor.from_data(x, device).quantize(scheme)
    want_q, want_scales, want_zp = reference(x, scheme)
    np.testing.assert_array_equal(q.int_values().to_numpy(), want_q)
    got_scales = q.scales.to_numpy()
    assert got_scales.dtype == want_scales.dtype and got_scales.shape == want_scales.shape
    np.testing.assert_array_equal(got_scales, want_scales)
    if want_zp is None:
        assert q.zero_points is None
    else:
        np.testing.assert_array_equal(q.zero_points.to_numpy(), want_zp)
    # Dequantized: the documented formula, in float64, rounded to f32 once.
    view_scales = scheme.scales_shape(x.shape)
    assert tuple(q.scales.shape) == view_scales
    return q


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.describe())
def test_quantize_matches_the_reference(scheme, device):
    x = np.random.default_rng(3).standard_normal((6, 8)).astype(np.float32) * 3
    q = _check(x, scheme, device)
    got = q.dequantize().to_numpy()
    want_q, want_scales, want_zp = reference(x, scheme)
    scale = per_element(want_scales.astype(np.float64), x.shape, scheme)
    zp = 0.0 if want_zp is None else per_element(want_zp.astype(np.float64), x.shape, scheme)
    expected = ((want_q.astype(np.float64) - zp) * scale).astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    # Quantization error: at most half a step inside the range.
    assert np.all(np.abs(got.astype(np.float64) - x) <= scale / 2 * (1 + 1e-5) + 1e-7)


def test_a_three_dim_tensor_blocked_along_its_middle_axis(device):
    x = np.random.default_rng(4).standard_normal((2, 6, 3)).astype(np.float32)
    for mode in ("symmetric", "affine"):
        _check(x, QuantScheme(mode=mode, granularity="block", axis=1, block_size=3), device)


def test_ties_round_to_even(device):
    # max |x| = 127 makes the scale exactly 1, so x / scale is x itself.
    x = np.array([127.0, 2.5, -0.5, 1.5, -2.5, 0.5, -126.5], np.float32)
    q = Tensor.from_data(x, device).quantize(QuantScheme())
    assert q.scales.item() == 1.0
    assert q.int_values().tolist() == [127, 2, 0, 2, -2, 0, -126]


def test_given_scales_saturate(device):
    x = Tensor.from_data(np.array([[1.0, -1.0, 0.3], [50.0, -50.0, 0.0]], np.float32), device)
    scales = Tensor.from_data(np.array([0.01, 1.0], np.float32), device)
    q = x.quantize(QuantScheme(granularity="axis", axis=0), scales=scales)
    assert q.int_values().tolist() == [[100, -100, 30], [50, -50, 0]]
    small = Tensor.from_data(np.array([0.001, 0.1], np.float32), device)
    assert x.quantize(QuantScheme(granularity="axis", axis=0), scales=small).int_values().tolist() \
        == [[127, -127, 127], [127, -127, 0]]  # fmt: skip
    zp = Tensor.from_data(np.array([10, -128], np.int64), device, kind=ember.Kind.INT)
    affine = x.quantize(QuantScheme(mode="affine", granularity="axis", axis=0), scales=small, zero_points=zp)
    assert affine.int_values().tolist() == [[127, -128, 127], [127, -128, -128]]


def test_zero_blocks_quantize_to_zeros(device):
    x = np.zeros((4, 8), np.float32)
    x[1, :4] = [1.0, -2.0, 0.5, 3.0]
    for mode in ("symmetric", "affine"):
        scheme = QuantScheme(mode=mode, granularity="block", axis=1, block_size=4)
        q = _check(x, scheme, device)
        scales = q.scales.to_numpy()
        assert scales[0, 0] == EPS and scales[1, 0] > EPS
        back = q.dequantize().to_numpy()
        assert (back[[0, 2, 3]] == 0).all() and (back[1, 4:] == 0).all()


def test_int4_packs_two_values_a_byte_in_flat_order(device):
    x = np.arange(-7, 8, dtype=np.float32).reshape(3, 5)  # 15 values: an odd count
    q = Tensor.from_data(x, device).quantize(QuantScheme(value="int4"))
    assert q.scales.item() == 1.0
    packed = q.values.to_numpy()
    assert packed.dtype == np.uint8 and packed.shape == (8,)
    nibbles = [(v & 15) - 16 * ((v & 15) >= 8) for b in packed for v in (b & 15, b >> 4)]
    assert nibbles[:15] == list(range(-7, 8)) and nibbles[15] == 0
    np.testing.assert_array_equal(q.int_values().to_numpy(), x.astype(np.int8))
    np.testing.assert_array_equal(q.dequantize().to_numpy(), x)


def test_backends_agree():
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    pytest.importorskip("torch", reason="the Torch backend needs torch (ember[torch])")
    for scheme in SCHEMES:
        results = []
        for name in ("ndarray", "torch"):
            q = Tensor.from_data(x, BACKENDS[name]()).quantize(scheme)
            results.append((q.values.to_numpy(), q.scales.to_numpy(), q.dequantize().to_numpy()))
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)


def test_other_float_dtypes_quantize_through_f32(device):
    x = np.random.default_rng(6).standard_normal((4, 4)).astype(np.float32)
    scheme = QuantScheme(granularity="axis", axis=1)
    q16 = Tensor.from_data(x.astype(np.float16), device).quantize(scheme)
    want_q, _, _ = reference(x.astype(np.float16).astype(np.float32), scheme)
    np.testing.assert_array_equal(q16.int_values().to_numpy(), want_q)
    assert q16.dequantize("f16").dtype == ember.DType.F16


# ------------------------------------------------------------------------ careless calls


def test_bad_inputs_are_typed_errors_naming_the_scheme(device):
    x = Tensor.from_data(np.ones((4, 6), np.float32), device)
    block = QuantScheme(granularity="block", axis=1, block_size=4)
    with pytest.raises(ShapeError, match=r"block size 4 does not divide dim 1 of shape \[4, 6\]"):
        x.quantize(block)
    with pytest.raises(ShapeError, match="axis 2 is out of range for a tensor of rank 2"):
        x.quantize(QuantScheme(granularity="axis", axis=2))
    with pytest.raises(KindError, match=r"quantize \(int8 symmetric per tensor\): expected a Float"):
        Tensor.from_data(np.ones(3, np.int64), device, kind=ember.Kind.INT).quantize(QuantScheme())
    per_row = QuantScheme(granularity="axis", axis=0)
    with pytest.raises(ShapeError, match=r"scales must have shape \[4\], got \[6\]"):
        x.quantize(per_row, scales=Tensor.ones([6], device))
    with pytest.raises(ArgumentError, match="every scale must be positive"):
        x.quantize(per_row, scales=Tensor.zeros([4], device))
    zp = Tensor.zeros([4], device, kind=ember.Kind.INT)
    with pytest.raises(ArgumentError, match="a symmetric scheme takes no zero points"):
        x.quantize(per_row, scales=Tensor.ones([4], device), zero_points=zp)
    affine = QuantScheme(mode="affine", granularity="axis", axis=0)
    with pytest.raises(ArgumentError, match="needs zero points"):
        x.quantize(affine, scales=Tensor.ones([4], device))
    with pytest.raises(ArgumentError, match=r"zero points must lie in \[-128, 127\]"):
        x.quantize(affine, scales=Tensor.ones([4], device), zero_points=zp + 200)
    with pytest.raises(DTypeError, match="zero points must be an Int tensor"):
        x.quantize(affine, scales=Tensor.ones([4], device), zero_points=Tensor.ones([4], device))
    with pytest.raises(DTypeError, match="dtype must be a float dtype"):
        x.quantize(per_row).dequantize("i32")


def test_scheme_errors_name_the_field():
    cases = [
        (dict(granularity="axis"), "needs an axis"),
        (dict(axis=0), "granularity is 'tensor'"),
        (dict(granularity="block", axis=0), "needs a positive block_size"),
        (dict(granularity="block", axis=0, block_size=-2), "needs a positive block_size"),
        (dict(granularity="axis", axis=0, block_size=8), "not 'block'"),
        (dict(value="int2"), r"QuantScheme.value: expected 'int8' or 'int4'"),
        (dict(scale_dtype="bf16"), r"QuantScheme.scale_dtype"),
        (dict(axis=True, granularity="axis"), r"QuantScheme.axis"),
        (dict(bits=8), "bits"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            QuantScheme(**kwargs)


def test_schemes_round_trip_through_json_and_print_their_numbers(tmp_path):
    scheme = QuantScheme(value="int4", mode="affine", granularity="block", axis=-1, block_size=32,
                         scale_dtype="f16")  # fmt: skip
    path = tmp_path / "scheme.json"
    scheme.save(path)
    assert QuantScheme.load(path) == scheme
    assert (scheme.qmin, scheme.qmax, scheme.bits) == (-8, 7, 4)
    assert scheme.describe() == "int4 affine per block of 32 along axis -1, f16 scales"
    assert repr(Tensor.zeros([2, 64]).quantize(scheme)).startswith(
        "QTensor(shape=[2, 64], int4 affine per block of 32 along axis -1, f16 scales")
    with pytest.raises(ConfigError):
        QuantScheme.from_dict({"value": "int8", "granularity": "axis", "axis": "__import__('os')"})
