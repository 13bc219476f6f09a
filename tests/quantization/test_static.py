"""Static quantization: a quantized input by a quantized weight (``integer_linear`` /
``integer_conv``) against NumPy float64 and PyTorch's static int8 linear; observers against
NumPy; calibrated models (parameters, outputs, records) and careless calls."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor, nn
from ember.backend.errors import ArgumentError, ConfigError, KindError
from ember.module import Module
from ember.quantization import (
    ActivationConfig,
    MinMaxObserver,
    PercentileObserver,
    QuantizeConfig,
    QuantizedConv2d,
    QuantizedLinear,
    QuantScheme,
    conv2d,
    linear,
)

DEVICES = {
    "ndarray": lambda: ember.device("ndarray"),
    "autodiff": lambda: ember.device("ndarray").autodiff(),
    "fusion": lambda: ember.device("ndarray").fusion(runtime="interpreter"),
    "torch": lambda: ember.device("torch"),
}
INPUT_SCHEMES = [QuantScheme(mode="affine"), QuantScheme()]
WEIGHT_SCHEMES = [
    QuantScheme(),
    QuantScheme(granularity="axis", axis=-1),
    QuantScheme(mode="affine", granularity="axis", axis=1),  # no integer kernel: the default
    QuantScheme(value="int4", granularity="block", axis=0, block_size=8),
]
RNG = np.random.default_rng(5)
X = (RNG.standard_normal((2, 5, 32)) * 2 + 0.5).astype(np.float32)
W = RNG.standard_normal((32, 24)).astype(np.float32)
B = RNG.standard_normal(24).astype(np.float32)


def _device(name: str):
    if name == "torch":
        pytest.importorskip("torch", reason="the Torch backend needs torch (ember[torch])")
    return DEVICES[name]()


def _float64(q) -> np.ndarray:
    """A QTensor dequantized in float64 from its stored numbers (per tensor, or along one
    axis / in blocks, by the scheme)."""
    from quant_reference import per_element

    values = q.int_values().to_numpy().astype(np.float64)
    scales = per_element(q.scales.to_numpy().astype(np.float64), q.shape, q.scheme)
    zps = 0.0 if q.zero_points is None else per_element(
        q.zero_points.to_numpy().astype(np.float64), q.shape, q.scheme)  # fmt: skip
    return (values - zps) * scales


@pytest.mark.parametrize("weight_scheme", WEIGHT_SCHEMES, ids=lambda s: s.describe())
@pytest.mark.parametrize("input_scheme", INPUT_SCHEMES, ids=lambda s: s.mode)
@pytest.mark.parametrize("name", list(DEVICES))
def test_integer_linear_is_the_product_of_the_dequantized_operands(name, input_scheme,
                                                                   weight_scheme):  # fmt: skip
    device = _device(name)
    x = Tensor.from_data(X, device).quantize(input_scheme)
    w = Tensor.from_data(W, device).quantize(weight_scheme)
    got = linear(x, w, Tensor.from_data(B, device)).to_numpy()
    assert got.dtype == np.float32 and got.shape == (2, 5, 24)
    expected = _float64(x) @ _float64(w) + B
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)


def test_torch_integer_linear_matches_pytorchs_static_int8_linear():
    torch = pytest.importorskip("torch", reason="PyTorch is the reference here")
    import warnings

    device = ember.device("torch")
    rows = X.reshape(-1, 32) * 40  # saturates: the clamped ends must agree too
    scheme = QuantScheme(mode="affine")
    scale, zero_point = 0.05, -3  # ember's i8 zero point; PyTorch's u8 one is 128 above
    x = Tensor.from_data(rows, device).quantize(
        scheme, Tensor.from_data(np.float32(scale), device),
        Tensor.from_data(np.int8(zero_point), device))  # fmt: skip
    # Weights of 7 bits (PyTorch's reduce_range): without AVX-512 VNNI, fbgemm adds pairs of
    # u8 x s8 products in saturating int16, exact only while |weight| <= 64.
    weight_scales = np.abs(W).max(axis=0) / 63
    w = Tensor.from_data(W, device).quantize(
        QuantScheme(granularity="axis", axis=1), Tensor.from_data(weight_scales, device))
    assert np.abs(w.values.to_numpy()).max() <= 64
    got = linear(x, w, Tensor.from_data(B, device)).to_numpy()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        weight = torch._make_per_channel_quantized_tensor(
            torch.from_numpy(w.values.to_numpy().T.copy()),
            torch.from_numpy(w.scales.to_numpy()).double(), torch.zeros(24, dtype=torch.long), 0)
        packed = torch.ops.quantized.linear_prepack(weight, torch.from_numpy(B))
    expected = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        torch.from_numpy(rows), scale, zero_point + 128, packed).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", list(DEVICES))
def test_integer_conv_is_the_convolution_of_the_dequantized_operands(name):
    torch = pytest.importorskip("torch", reason="PyTorch's float64 convolution is the reference")
    device = _device(name)
    xs = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    ws = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    x = Tensor.from_data(xs, device).quantize(QuantScheme(mode="affine"))
    w = Tensor.from_data(ws, device).quantize(QuantScheme(granularity="axis", axis=0))
    got = conv2d(x, w, Tensor.from_data(B[:4], device), stride=(2, 1), padding=1).to_numpy()
    expected = torch.nn.functional.conv2d(
        torch.from_numpy(_float64(x)), torch.from_numpy(_float64(w)),
        torch.from_numpy(B[:4].astype(np.float64)), stride=(2, 1), padding=1).numpy()  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)


def test_integer_conv_agrees_with_pytorchs_quantized_conv_within_its_output_step():
    # PyTorch's int8 convolution quantizes its output too (to u8 of a given scale): ember's
    # f32 result lies within half a step of it.
    torch = pytest.importorskip("torch", reason="PyTorch's quantized conv is the reference")
    import warnings

    device = ember.device("ndarray")
    xs = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    ws = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    scale, zero_point = 0.03, 2  # ember's i8 zero point; PyTorch's u8 one is 128 above
    x = Tensor.from_data(xs, device).quantize(
        QuantScheme(mode="affine"), Tensor.from_data(np.float32(scale), device),
        Tensor.from_data(np.int8(zero_point), device))  # fmt: skip
    w = Tensor.from_data(ws, device).quantize(QuantScheme(granularity="axis", axis=0))
    got = conv2d(x, w, Tensor.from_data(B[:4], device), stride=(2, 1), padding=1).to_numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        qx = torch.quantize_per_tensor(torch.from_numpy(xs), scale, zero_point + 128, torch.quint8)
        qw = torch._make_per_channel_quantized_tensor(
            torch.from_numpy(w.values.to_numpy()), torch.from_numpy(w.scales.to_numpy()).double(),
            torch.zeros(4, dtype=torch.long), 0)  # fmt: skip
        step = float(np.ptp(got)) / 255
        out_zero = round(-float(got.min()) / step)
        expected = torch.ao.nn.quantized.functional.conv2d(
            qx, qw, torch.from_numpy(B[:4]), stride=(2, 1), padding=1, scale=step,
            zero_point=out_zero).dequantize().numpy()  # fmt: skip
    assert np.abs(got - expected).max() <= step / 2 + 1e-5


def test_only_the_bias_gets_a_gradient():
    device = ember.device("ndarray").autodiff()
    x = Tensor.from_data(X, device).require_grad()
    bias = Tensor.from_data(B, device).require_grad()
    w = Tensor.from_data(W, device).quantize(QuantScheme())
    out = linear(x.quantize(QuantScheme(mode="affine")), w, bias)
    grads = (out * out).sum().backward()
    np.testing.assert_allclose(bias.grad(grads).to_numpy(),
                               (2 * out.to_numpy()).reshape(-1, 24).sum(0), rtol=1e-5)  # fmt: skip
    assert x.grad(grads) is None  # rounding cuts the input off: quantized values are constants

    xc = Tensor.from_data(RNG.standard_normal((1, 2, 4, 4)).astype(np.float32), device)
    wc = Tensor.from_data(RNG.standard_normal((3, 2, 3, 3)).astype(np.float32), device)
    bc = Tensor.from_data(B[:3], device).require_grad()
    conv = conv2d(xc.quantize(QuantScheme()), wc.quantize(QuantScheme()), bc)
    np.testing.assert_allclose(bc.grad(conv.sum().backward()).to_numpy(), [4.0] * 3)


def test_careless_integer_calls_name_the_op():
    device = ember.device("ndarray")
    w = Tensor.from_data(W, device).quantize(QuantScheme())
    x = Tensor.from_data(X, device).quantize(QuantScheme())
    with pytest.raises(ArgumentError, match="integer_linear: weight must be a QTensor"):
        linear(x, Tensor.from_data(W, device))
    with pytest.raises(KindError, match="integer_linear: the bias must be a Float tensor"):
        linear(x, w, Tensor.from_data(np.arange(24), device))
    wide = Tensor.from_data(RNG.standard_normal((33, 24)).astype(np.float32), device)
    with pytest.raises(ember.ShapeError, match="integer_linear"):
        linear(x, wide.quantize(QuantScheme()))
    with pytest.raises(KindError, match="quantized_linear: the input must be a Float tensor"):
        linear(Tensor.from_data(np.ones((2, 32), np.int64), device), w)


# ------------------------------------------------------------------------------ observers


def test_minmax_observer_keeps_the_extremes_of_every_batch():
    observer = MinMaxObserver()
    batches = [RNG.standard_normal((4, 9)).astype(np.float32) * k for k in (1, 3, 2)]
    for batch in batches:
        observer.observe(Tensor.from_data(batch))
    everything = np.concatenate([b.reshape(-1) for b in batches])
    assert observer.range() == (float(everything.min()), float(everything.max()))


def test_percentile_observer_averages_the_batches_percentiles():
    observer = PercentileObserver(99.0)
    batches = [RNG.standard_normal(1000).astype(np.float32) * k for k in (1, 5)]
    for batch in batches:
        observer.observe(Tensor.from_data(batch))
    ends = np.array([np.percentile(b, [1.0, 99.0]) for b in batches]).mean(0)
    np.testing.assert_allclose(observer.range(), ends, rtol=1e-12)
    assert observer.range()[1] < max(b.max() for b in batches)  # outliers are clipped


def test_observers_refuse_what_they_cannot_use():
    with pytest.raises(ArgumentError, match="no values were observed"):
        MinMaxObserver().range()
    empty = MinMaxObserver()
    empty.observe(Tensor.zeros([0, 3]))
    with pytest.raises(ArgumentError, match="no values were observed"):
        empty.range()
    with pytest.raises(KindError, match="MinMaxObserver: expected a Float tensor, got Int"):
        MinMaxObserver().observe(Tensor.from_data(np.arange(3)))
    for observer in (MinMaxObserver(), PercentileObserver()):
        with pytest.raises(ArgumentError, match="NaN or infinity"):
            observer.observe(Tensor.from_data(np.array([1.0, np.nan], np.float32)))
    with pytest.raises(ArgumentError, match=r"percentile must lie in \(50, 100\], got 40"):
        PercentileObserver(40)


# ------------------------------------------------------------------------------ models


class Mlp(Module):
    first: nn.Linear
    second: nn.Linear

    def forward(self, x: Tensor) -> Tensor:
        return self.second(self.first(x).clamp(min=0.0))


def _mlp(device) -> Mlp:
    return Mlp(nn.LinearConfig(32, 48).init(device), nn.LinearConfig(48, 10).init(device))


def _batches(device, count: int = 3) -> list[Tensor]:
    rng = np.random.default_rng(3)
    return [Tensor.from_data(rng.standard_normal((8, 32)).astype(np.float32), device)
            for _ in range(count)]  # fmt: skip


def _affine_params(lo: float, hi: float) -> tuple[float, int]:
    """The int8 affine parameters of the range [lo, hi], in float64 as the plan's formulas."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = float(np.float32((hi - lo) / 255.0))
    return scale, int(np.clip(-128 - np.round(lo / scale), -128, 127))


@pytest.mark.parametrize("name", ["ndarray", "torch"])
def test_calibration_fixes_each_layers_input_parameters(name):
    device = _device(name)
    model = _mlp(device)
    batches = _batches(device)
    q = model.quantize(QuantizeConfig(activations=ActivationConfig()), batches)
    assert isinstance(q.first, QuantizedLinear) and isinstance(q.second, QuantizedLinear)

    # Observers see the float model's activations (as PyTorch calibrates).
    inputs = np.concatenate([b.to_numpy() for b in batches])
    hidden = np.concatenate([model.first(b).clamp(min=0.0).to_numpy() for b in batches])
    for layer, values in ((q.first, inputs), (q.second, hidden)):
        scale, zero_point = _affine_params(float(values.min()), float(values.max()))
        assert layer.input_scale.val().item() == pytest.approx(scale, rel=1e-6)
        assert layer.input_zero_point.val().item() == zero_point
    assert q.second.input_zero_point.val().item() == -128  # after a ReLU: all of it positive

    x = batches[0]
    manual = linear(x.quantize(QuantScheme(mode="affine"), q.first.input_scale.val(),
                               q.first.input_zero_point.val()),
                    q.first.weight(), q.first.bias.val()).to_numpy()  # fmt: skip
    np.testing.assert_array_equal(q.first(x).to_numpy(), manual)
    error = np.abs(q(x).to_numpy() - model(x).to_numpy()).max()
    assert error < 0.02 * np.abs(model(x).to_numpy()).max(), error


def test_static_results_agree_across_backends():
    pytest.importorskip("torch", reason="the Torch backend needs torch (ember[torch])")
    model = _mlp(ember.device("ndarray"))
    config = QuantizeConfig(activations=ActivationConfig(observer="percentile", percentile=99.5))
    outputs = []
    for name in ("ndarray", "torch", "fusion"):
        device = DEVICES[name]()
        q = model.to_device(device).quantize(config, _batches(device))
        outputs.append(q(_batches(device)[1]).to_numpy())
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs[2], outputs[0], rtol=1e-5, atol=1e-5)


def test_a_static_model_saves_and_loads(tmp_path):
    from test_modules import RECORDERS

    device = ember.device("ndarray")
    config = QuantizeConfig(activations=ActivationConfig())
    q = _mlp(device).quantize(config, _batches(device))
    x = _batches(device)[2]
    for recorder_type in RECORDERS:
        path = q.save_file(tmp_path / f"static-{recorder_type.__name__}", recorder_type())
        # The structure comes from quantizing a fresh model with any calibration data.
        fresh = _mlp(device).quantize(config, [Tensor.ones([2, 32], device)])
        loaded = fresh.load_file(path, recorder_type())
        assert loaded.second.input_zero_point.val().item() == q.second.input_zero_point.val().item()
        if recorder_type().precision.float_dtype is ember.DType.F32:
            np.testing.assert_array_equal(loaded(x).to_numpy(), q(x).to_numpy())
        else:  # a half-precision file rounds the scales (an input's among them)
            np.testing.assert_allclose(loaded(x).to_numpy(), q(x).to_numpy(), atol=2e-2)


def test_a_static_convolution_calibrates_on_its_padded_input():
    device = ember.device("ndarray")
    conv = nn.Conv2dConfig([2, 3], [3, 3], padding=nn.PaddingConfig.Same()).init(device)
    batches = [Tensor.from_data(RNG.uniform(1.0, 2.0, (2, 2, 5, 5)).astype(np.float32), device)]
    q = conv.quantize(QuantizeConfig(activations=ActivationConfig()), batches)
    assert isinstance(q, QuantizedConv2d) and q.input_scheme is not None
    x = batches[0]
    # The range takes in 0 (zero padding stays exact): the largest value is the top of 255
    # steps.
    top = float(batches[0].to_numpy().max())
    assert q.input_scale.val().item() == pytest.approx(top / 255, rel=1e-6)
    error = np.abs(q(x).to_numpy() - conv(x).to_numpy()).max()
    assert error < 0.02 * np.abs(conv(x).to_numpy()).max()


def test_calibration_runs_at_most_the_configured_batches():
    device = ember.device("ndarray")
    taken = []

    def inputs():
        for i, batch in enumerate(_batches(device, 10)):
            taken.append(i)
            yield batch

    _mlp(device).quantize(QuantizeConfig(activations=ActivationConfig(batches=4)), inputs())
    assert taken == [0, 1, 2, 3]


def test_careless_static_quantization_is_refused():
    device = ember.device("ndarray")
    model = _mlp(device)
    static = QuantizeConfig(activations=ActivationConfig())
    with pytest.raises(ArgumentError, match="needs calibration inputs"):
        model.quantize(static)
    with pytest.raises(ArgumentError, match=r"config\.activations is None"):
        model.quantize(QuantizeConfig(), _batches(device))
    with pytest.raises(ArgumentError, match="the calibration inputs are empty"):
        model.quantize(static, [])
    with pytest.raises(ArgumentError, match=r"layer 'second'.*did the calibration run reach it"):
        model.quantize(static, _batches(device), forward=lambda m, x: m.first(x))
    for bad in (dict(scheme=QuantScheme(granularity="axis", axis=0)),
                dict(scheme=QuantScheme(value="int4")), dict(batches=0), dict(percentile=20.0)):  # fmt: skip
        with pytest.raises(ConfigError):
            ActivationConfig(**bad)


def test_a_static_transformer_encoder_stays_close_to_float():
    # Its attention reads its projections' sizes through the calibration wrappers.
    from test_modules import ENCODER

    device = ember.device("ndarray")
    encoder = ENCODER.init(device)
    rng = np.random.default_rng(8)
    inputs = [nn.TransformerEncoderInput(Tensor.from_data(
        rng.standard_normal((2, 16, 256)).astype(np.float32), device)) for _ in range(3)]  # fmt: skip
    static = encoder.quantize(QuantizeConfig(activations=ActivationConfig()), inputs[:2])
    assert isinstance(static.layers[0].mha.query, QuantizedLinear)
    assert static.layers[0].mha.query.input_scheme is not None
    a, b = encoder(inputs[2]).to_numpy().ravel(), static(inputs[2]).to_numpy().ravel()
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.999


@pytest.mark.parametrize("weight_scheme", WEIGHT_SCHEMES, ids=lambda s: s.describe())
@pytest.mark.parametrize("input_scheme", INPUT_SCHEMES, ids=lambda s: s.mode)
def test_fusion_multiplies_int8_operands_in_integers_where_the_layout_allows(input_scheme,
                                                                             weight_scheme):  # fmt: skip
    pytest.importorskip("numba", reason="the compiled kernel needs ember[jit]")
    from ember.backends.fusion import autotune, numba_int8, reset_stats, stats
    from ember.backends.fusion.autotune import Choice

    device = ember.device("ndarray").fusion(runtime="numba")
    xs = RNG.standard_normal((2, 64, 256)).astype(np.float32)
    ws = RNG.standard_normal((256, 80)).astype(np.float32)
    x = Tensor.from_data(xs, device).quantize(input_scheme)
    w = Tensor.from_data(ws, device).quantize(weight_scheme)
    device.sync()
    reset_stats()
    with autotune.forcing(Choice("fused", 2)):
        got = linear(x, w, Tensor.from_data(B[:1].repeat(80), device)).to_numpy()
    expected = _float64(x) @ _float64(w) + B[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    # The kernel takes a symmetric int8 weight per tensor or per column, on a VNNI host.
    integer = (weight_scheme.mode, weight_scheme.value, weight_scheme.granularity) in (
        ("symmetric", "int8", "tensor"), ("symmetric", "int8", "axis"))  # fmt: skip
    assert stats()["op_kernels"] == (1 if integer and numba_int8.has_vnni() else 0)


# ------------------------------------------------------------------------------ dynamic


@pytest.mark.parametrize("mode", ["symmetric", "affine"])
@pytest.mark.parametrize("name", list(DEVICES))
def test_integer_linear_takes_a_scale_per_row(name, mode):
    device = _device(name)
    rows = X.reshape(-1, 32)
    x = Tensor.from_data(rows, device).quantize(QuantScheme(mode=mode, granularity="axis", axis=0))
    w = Tensor.from_data(W, device).quantize(QuantScheme(granularity="axis", axis=1))
    got = linear(x, w, Tensor.from_data(B, device)).to_numpy()
    np.testing.assert_allclose(got, _float64(x) @ _float64(w) + B, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["ndarray", "torch", "fusion"])
def test_dynamic_quantization_quantizes_each_row_at_each_call(name):
    device = _device(name)
    model = _mlp(device)
    q = model.quantize(QuantizeConfig(dynamic=True))
    assert q.first.input_scheme == QuantScheme(granularity="axis", axis=0)
    assert q.first.input_scale is None  # nothing calibrated
    x = Tensor.from_data(X, device)  # [2, 5, 32]: rows through the leading dims
    got = q.first(x).to_numpy()
    rows = Tensor.from_data(X.reshape(-1, 32), device).quantize(QuantScheme(granularity="axis",
                                                                            axis=0))  # fmt: skip
    expected = _float64(rows) @ _float64(q.first.weight()) + q.first.bias.val().to_numpy()
    np.testing.assert_allclose(got, expected.reshape(2, 5, 48), rtol=1e-5, atol=2e-5)
    # Each row's error is at most half a step of that row, through the weight.
    exact = X.reshape(-1, 32).astype(np.float64) @ _float64(q.first.weight())
    steps = np.abs(X.reshape(-1, 32)).max(1, keepdims=True) / 127
    bound = steps / 2 * np.abs(_float64(q.first.weight())).sum(0) + 1e-4
    assert np.all(np.abs(got.reshape(-1, 48) - q.first.bias.val().to_numpy() - exact) <= bound)
    with pytest.raises(ConfigError, match="choose one"):
        QuantizeConfig(dynamic=True, activations=ActivationConfig())


def test_a_dynamic_encoder_stays_close_to_float_and_runs_int8_products_on_fusion():
    pytest.importorskip("numba", reason="the compiled kernel needs ember[jit]")
    from test_modules import ENCODER

    from ember.backends.fusion import numba_int8, reset_stats, stats

    device = ember.device("ndarray").fusion(runtime="numba")
    encoder = ENCODER.init(device)
    x = nn.TransformerEncoderInput(Tensor.from_data(
        np.random.default_rng(9).standard_normal((2, 16, 256)).astype(np.float32), device))  # fmt: skip
    dynamic = encoder.quantize(QuantizeConfig(dynamic=True))
    a = encoder(x).to_numpy().ravel()
    reset_stats()
    b = dynamic(x).to_numpy().ravel()
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.999
    if numba_int8.has_vnni():  # tuned per bucket: at least the first of each ran compiled
        assert stats()["op_kernels"] >= 1
