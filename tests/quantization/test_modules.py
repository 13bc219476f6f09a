"""Weight-only quantization of models: the transformer encoder keeps its outputs (cosine
similarity above 0.999 against f32), quantized models save and load with every recorder in
records about 4x smaller, patterns pick layers, and careless configs are typed errors."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor, nn
from ember.backend.errors import ArgumentError, ConfigError, ShapeError
from ember.quantization import QuantizeConfig, QuantizedLinear, QuantScheme
from ember.record import (
    BinFileRecorder,
    CompactRecorder,
    DefaultRecorder,
    JsonGzFileRecorder,
    NamedMpkGzFileRecorder,
    PrettyJsonFileRecorder,
)

RECORDERS = [DefaultRecorder, CompactRecorder, NamedMpkGzFileRecorder, BinFileRecorder,
             JsonGzFileRecorder, PrettyJsonFileRecorder]  # fmt: skip
# The nn benchmark's encoder: 2 layers, d_model 256, 8 heads, d_ff 1024 (a shorter input).
ENCODER = nn.TransformerEncoderConfig(256, 1024, 8, 2, dropout=0.0)


def _encoder_input(device) -> nn.TransformerEncoderInput:
    x = np.random.default_rng(0).standard_normal((2, 16, 256)).astype(np.float32)
    return nn.TransformerEncoderInput(Tensor.from_data(x, device))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("backend", ["ndarray", "torch"])
def test_a_weight_only_int8_encoder_keeps_its_outputs(backend):
    if backend == "torch":
        pytest.importorskip("torch", reason="the Torch backend needs torch (ember[torch])")
    device = ember.device(backend)
    ember.seed(device, 1)
    model = ENCODER.init(device)
    quantized = model.quantize(QuantizeConfig())
    layers = [m for _, m in _modules(quantized) if isinstance(m, QuantizedLinear)]
    assert len(layers) == 2 * 6  # per layer: query, key, value, output, and the two of the ffn
    x = _encoder_input(device)
    assert _cosine(quantized(x).to_numpy(), model(x).to_numpy()) > 0.999


def _modules(value, path=""):
    from ember.module import Module

    if isinstance(value, Module):
        yield path, value
        for name, item in value.fields():
            yield from _modules(item, f"{path}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _modules(item, f"{path}.{i}")


@pytest.mark.parametrize("recorder_type", RECORDERS, ids=lambda r: r.__name__)
def test_quantized_models_save_and_load_with_every_recorder(recorder_type, tmp_path):
    device = ember.device("ndarray")
    config = QuantizeConfig(overrides={"layers.1.*": QuantScheme(
        value="int4", mode="affine", granularity="block", axis=0, block_size=32)})
    model = ENCODER.init(device).quantize(config)
    path = model.save_file(tmp_path / "q", recorder_type())
    fresh = ENCODER.init(device).quantize(config)  # the same structure, other numbers
    loaded = fresh.load_file(path, recorder_type())
    x = _encoder_input(device)
    for name, param in model.params():
        if param.kind is ember.Kind.INT:  # quantized values come back exactly, as bytes
            got = dict(loaded.params())[name]
            assert got.dtype is param.dtype
            np.testing.assert_array_equal(got.val().to_numpy(), param.val().to_numpy())
    if recorder_type().precision.float_dtype is ember.DType.F32:
        np.testing.assert_array_equal(loaded(x).to_numpy(), model(x).to_numpy())
    else:  # a half-precision file rounds the scales and the float parameters
        np.testing.assert_allclose(loaded(x).to_numpy(), model(x).to_numpy(), atol=5e-3)


def test_a_quantized_record_is_about_4x_smaller(tmp_path):
    device = ember.device("ndarray")
    model = ENCODER.init(device)
    full = model.save_file(tmp_path / "f32").stat().st_size
    int8 = model.quantize(QuantizeConfig()).save_file(tmp_path / "int8").stat().st_size
    int4 = model.quantize(QuantizeConfig(scheme=QuantScheme(
        value="int4", granularity="block", axis=0, block_size=32))).save_file(tmp_path / "int4").stat().st_size
    # The norms and biases stay f32: a bit less than 4x (and 8x) on this model.
    assert full / int8 >= 3.5 and full / int4 >= 6.0


def test_quantized_layers_train_their_bias_only():
    device = ember.device("ndarray").autodiff()
    layer = nn.LinearConfig(8, 4).init(device)
    q = layer.quantize(QuantizeConfig())
    x = Tensor.from_data(np.ones((3, 8), np.float32), device)
    grads = q(x).sum().backward()
    from ember.optim import SgdConfig

    stepped = SgdConfig().init().step(0.1, q, grads)
    np.testing.assert_allclose(stepped.bias.val().to_numpy(), q.bias.val().to_numpy() - 0.1 * 3)
    np.testing.assert_array_equal(stepped.values.val().to_numpy(), q.values.val().to_numpy())


def test_patterns_skip_and_override_layers():
    device = ember.device("ndarray")
    model = ENCODER.init(device)
    config = QuantizeConfig(skip=("layers.0.mha.*",),
                            overrides={"*.pwff.*": QuantScheme(value="int4", granularity="block",
                                                               axis=0, block_size=64)})  # fmt: skip
    quantized = model.quantize(config)
    kinds = {path: m.scheme.value for path, m in _modules(quantized) if isinstance(m, QuantizedLinear)}
    plain = [path for path, m in _modules(quantized) if type(m) is nn.Linear]
    assert all(".layers.0.mha." in p for p in plain) and len(plain) == 4  # q, k, v, output
    assert {v for p, v in kinds.items() if ".pwff." in p} == {"int4"}
    assert {v for p, v in kinds.items() if ".pwff." not in p} == {"int8"}


def test_careless_configs_are_typed_errors():
    device = ember.device("ndarray")
    model = ENCODER.init(device)
    with pytest.raises(ArgumentError, match=r"'layers\.9\.\*' match no layer to quantize \(layers: layers\.0"):
        model.quantize(QuantizeConfig(skip=("layers.9.*",)))
    with pytest.raises(ShapeError, match="block size 100 does not divide dim 0"):
        model.quantize(QuantizeConfig(scheme=QuantScheme(granularity="block", axis=0, block_size=100)))
    with pytest.raises(ConfigError, match=r"QuantizeConfig.skip"):
        QuantizeConfig(skip="layers.*")


def test_the_guide_model_quantizes_its_convolutions_and_linear_layers(tmp_path):
    from ember.guide.model import ModelConfig
    from ember.quantization import QuantizedConv2d

    device = ember.device("ndarray")
    ember.seed(device, 3)
    model = ModelConfig(num_classes=10, hidden_size=64).init(device).valid()
    quantized = model.quantize(QuantizeConfig())
    kinds = sorted(type(m).__name__ for _, m in _modules(quantized)
                   if isinstance(m, QuantizedLinear | QuantizedConv2d))  # fmt: skip
    assert kinds == ["QuantizedConv2d", "QuantizedConv2d", "QuantizedLinear", "QuantizedLinear"]
    images = Tensor.from_data(np.random.default_rng(4).random((8, 28, 28), np.float32), device)
    assert _cosine(quantized(images).to_numpy(), model(images).to_numpy()) > 0.999
    path = quantized.save_file(tmp_path / "guide-int8")
    loaded = ModelConfig(num_classes=10, hidden_size=64).init(device).valid().quantize(
        QuantizeConfig()).load_file(path)  # fmt: skip
    np.testing.assert_array_equal(loaded(images).to_numpy(), quantized(images).to_numpy())


@pytest.mark.parametrize("scheme", [
    QuantScheme(granularity="axis", axis=0), QuantScheme(mode="affine", granularity="axis", axis=1),
    QuantScheme(value="int4", granularity="block", axis=1, block_size=4),
    QuantScheme(value="int4", mode="affine", granularity="block", axis=0, block_size=3),
    QuantScheme(value="int4"),
], ids=lambda s: s.describe())  # fmt: skip
@pytest.mark.parametrize("d_model", [8, 9], ids=["even", "odd"])
def test_a_quantized_embedding_looks_up_the_dequantized_rows(scheme, d_model):
    from ember.quantization import QuantizedEmbedding

    if scheme.granularity == "block" and scheme.axis == 1 and d_model % scheme.block_size:
        pytest.skip("the block size does not divide an odd row")
    device = ember.device("ndarray")
    table = nn.EmbeddingConfig(12, d_model).init(device)
    q = QuantizedEmbedding.quantize(table, scheme)
    ids = Tensor.from_data([[1, 5, 7], [11, 0, 5]], device, kind=ember.Kind.INT)
    full = table.weight.val().quantize(scheme).dequantize().to_numpy()
    np.testing.assert_array_equal(q(ids).to_numpy(), full[ids.to_numpy()])
    with pytest.raises(ember.EmberError, match="QuantizedEmbedding"):
        q(Tensor.from_data([[12]], device, kind=ember.Kind.INT))


def test_the_mapper_quantizes_embeddings_per_row():
    from ember.quantization import QuantizedEmbedding

    class Tagger(ember.Module):
        embed: nn.Embedding
        head: nn.Linear

        def forward(self, ids):
            return self.head(self.embed(ids))

    device = ember.device("ndarray")
    model = Tagger(nn.EmbeddingConfig(50, 16).init(device), nn.LinearConfig(16, 4).init(device))
    quantized = model.quantize(QuantizeConfig())
    assert isinstance(quantized.embed, QuantizedEmbedding) and quantized.embed.scales.shape == (50,)
    ids = Tensor.from_data([[3, 9, 49]], device, kind=ember.Kind.INT)
    assert _cosine(quantized(ids).to_numpy(), model(ids).to_numpy()) > 0.999
    only_linear = model.quantize(QuantizeConfig(layers=("linear",)))
    assert type(only_linear.embed) is nn.Embedding
