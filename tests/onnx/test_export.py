"""ONNX export round trips: nn layers, the guide's model and a transformer encoder, each
exported, run in onnxruntime and imported back into ember, against the ember model."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX export needs the onnx package (ember[onnx])")
pytest.importorskip("onnxruntime")

from export_helpers import rand, round_trip, run_onnxruntime  # noqa: E402

import ember  # noqa: E402
from ember import Tensor, nn  # noqa: E402
from ember.guide.model import ModelConfig  # noqa: E402
from ember.module import Module  # noqa: E402
from ember.nn.attention import MhaInput, generate_autoregressive_mask  # noqa: E402
from ember.nn.rnn import LstmState  # noqa: E402
from ember.nn.transformer import TransformerDecoderInput, TransformerEncoderInput  # noqa: E402

DEVICE = ember.device("ndarray")


def with_random_statistics(module: Module) -> Module:
    """A batch norm whose running statistics are not the trivial 0 and 1."""
    rng = np.random.default_rng(1)

    def fill(path: str, param):
        values = rng.uniform(0.5, 2.0, param.shape) if path.endswith("var") else \
            rng.standard_normal(param.shape)
        return Tensor.from_data(values.astype(np.float32), DEVICE)

    return module.map(fill)


LAYERS = {
    "linear": (lambda: nn.LinearConfig(6, 4).init(DEVICE), (3, 6)),
    "linear_3d": (lambda: nn.LinearConfig(6, 4).init(DEVICE), (3, 2, 6)),
    "conv1d": (lambda: nn.Conv1dConfig(2, 3, 3, stride=2).init(DEVICE), (3, 2, 9)),
    "conv2d": (lambda: nn.Conv2dConfig([2, 4], [3, 3], padding=nn.PaddingConfig.Explicit(1, 1)
                                         ).init(DEVICE), (3, 2, 6, 5)),
    "conv2d_groups": (lambda: nn.Conv2dConfig([4, 4], [3, 3], groups=2).init(DEVICE),
                      (3, 4, 6, 6)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2dConfig([3, 2], [3, 3], stride=[2, 2]).init(
        DEVICE), (3, 3, 4, 4)),
    "batch_norm": (lambda: with_random_statistics(nn.BatchNormConfig(3).init(DEVICE)),
                   (3, 3, 4, 4)),
    "layer_norm": (lambda: nn.LayerNormConfig(5).init(DEVICE), (3, 4, 5)),
    "group_norm": (lambda: nn.GroupNormConfig(2, 4).init(DEVICE), (3, 4, 5)),
    "rms_norm": (lambda: nn.RmsNormConfig(5).init(DEVICE), (3, 4, 5)),
    "avg_pool1d": (lambda: nn.AvgPool1dConfig(2).init(), (3, 2, 8)),
    "avg_pool2d": (lambda: nn.AvgPool2dConfig([3, 2], stride=[1, 2]).init(), (3, 2, 6, 6)),
    "max_pool1d": (lambda: nn.MaxPool1dConfig(3).init(), (3, 2, 9)),
    "max_pool2d": (lambda: nn.MaxPool2dConfig([2, 2]).init(), (3, 2, 6, 6)),
    "adaptive_avg_pool1d": (lambda: nn.AdaptiveAvgPool1dConfig(3).init(), (3, 2, 7)),
    "adaptive_avg_pool2d_even": (lambda: nn.AdaptiveAvgPool2dConfig([2, 3]).init(),
                                 (3, 2, 6, 6)),
    "adaptive_avg_pool2d_uneven": (lambda: nn.AdaptiveAvgPool2dConfig([3, 2]).init(),
                                   (3, 2, 7, 5)),
    "adaptive_avg_pool2d_global": (lambda: nn.AdaptiveAvgPool2dConfig([1, 1]).init(),
                                   (3, 2, 5, 5)),
    "interpolate_nearest": (lambda: nn.Interpolate2dConfig(output_size=[7, 9]).init(),
                            (3, 2, 4, 5)),
    "interpolate_linear": (lambda: nn.Interpolate2dConfig(
        output_size=[7, 9], mode=nn.InterpolateMode.Linear(), align_corners=False).init(),
        (3, 2, 4, 5)),
    "interpolate_cubic": (lambda: nn.Interpolate2dConfig(
        output_size=[7, 9], mode=nn.InterpolateMode.Cubic()).init(), (3, 2, 4, 5)),
    "dropout_eval": (lambda: nn.DropoutConfig(0.5).init(), (3, 5)),
    "prelu": (lambda: nn.PReluConfig(num_parameters=3).init(DEVICE), (3, 3, 4)),
    "softmax": (lambda: nn.SoftmaxConfig(1).init(), (3, 5)),
    "log_softmax": (lambda: nn.LogSoftmaxConfig(-1).init(), (3, 5)),
    "swiglu": (lambda: nn.SwiGluConfig(4, 6).init(DEVICE), (3, 4)),
    "conv3d": (lambda: nn.Conv3dConfig([2, 3], [2, 2, 2]).init(DEVICE), (3, 2, 4, 4, 4)),
    "conv_transpose1d": (lambda: nn.ConvTranspose1dConfig([2, 3], 3, stride=2, padding=1,
                                                          padding_out=1).init(DEVICE),
                         (3, 2, 5)),
    "instance_norm": (lambda: nn.InstanceNormConfig(3).init(DEVICE), (3, 3, 5, 4)),
    "interpolate1d": (lambda: nn.Interpolate1dConfig(scale_factor=2.0).init(), (3, 3, 5)),
    "feed_forward": (lambda: nn.PositionWiseFeedForwardConfig(8, 16).init(DEVICE), (3, 5, 8)),
    "positional_encoding": (lambda: nn.PositionalEncodingConfig(8).init(DEVICE), (3, 5, 8)),
    "rotary_encoding": (lambda: nn.RotaryEncodingConfig(16, 8).init(DEVICE), (3, 5, 8)),
}
ACTIVATIONS = ["Relu", "Relu6", "Sigmoid", "Tanh", "Silu", "Mish", "LogSigmoid", "HardSwish",
               "Selu", "Gelu"]
ACTIVATION_CONFIGS = {"LeakyReluConfig": {"negative_slope": 0.2}, "GeluConfig": {
    "approximate": "tanh"}, "EluConfig": {"alpha": 0.7}, "CeluConfig": {"alpha": 1.5},
    "SoftplusConfig": {"beta": 2.0, "threshold": 1.0}, "HardSigmoidConfig": {},
    "SoftminConfig": {"dim": 1}, "QuietSoftmaxConfig": {"dim": 1}, "GluConfig": {}}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_layer_round_trips(name, tmp_path):
    build, shape = LAYERS[name]
    layer = build()
    other = rand(5, *shape[1:], seed=2)
    round_trip(layer, [rand(*shape)], tmp_path / "layer.onnx", others=[[other]],
               dynamic_axes={"input": {0: "batch"}})


@pytest.mark.parametrize("name", ACTIVATIONS + list(ACTIVATION_CONFIGS))
def test_an_activation_round_trips(name, tmp_path):
    if name.endswith("Config"):
        layer = getattr(nn, name)(**ACTIVATION_CONFIGS[name]).init()
    else:
        layer = getattr(nn, name)()
    round_trip(layer, [rand(3, 4)], tmp_path / "act.onnx", others=[[rand(6, 4, seed=3)]],
               dynamic_axes={"input": {0: "batch"}})


def test_embedding_round_trips_with_dynamic_batch_and_sequence(tmp_path):
    embedding = nn.EmbeddingConfig(10, 4).init(DEVICE)
    ids = Tensor.from_data([[1, 2, 3], [4, 5, 9]], DEVICE)
    longer = Tensor.from_data([[0, 9, 3, 3, 1], [4, 5, 9, 8, 7], [2, 2, 2, 2, 6]], DEVICE)
    round_trip(embedding, [ids], tmp_path / "emb.onnx", others=[[longer]],
               dynamic_axes={"input": {0: "batch", 1: "seq"}})


def test_the_guide_model_round_trips_with_a_dynamic_batch(tmp_path):
    model = ModelConfig(num_classes=10, hidden_size=32).init(DEVICE)
    images = rand(2, 28, 28)
    exported = round_trip(model, [images], tmp_path / "guide.onnx",
                          others=[[rand(7, 28, 28, seed=5)], [rand(1, 28, 28, seed=6)]],
                          dynamic_axes={"images": {0: "batch"}}, input_names=["images"],
                          output_names=["logits"])
    graph = exported.graph
    assert {i.name for i in graph.initializer} >= {
        "conv1.weight", "conv1.bias", "conv2.weight", "linear1.weight", "linear2.bias"}
    # The intermediate values carry their traced types (the pooled maps: [batch, 16, 8, 8]).
    shapes = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in graph.value_info]  # fmt: skip
    assert ["batch", 16, 8, 8] in shapes
    batch = graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param == "batch"
    assert graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"


@pytest.mark.parametrize("scheme", ["int8", "int4", "int8-static"])
def test_a_quantized_guide_model_round_trips(scheme, tmp_path):
    """The quantized weights stay integers in the file (dequantized in the graph); int4's
    unpacking masks run as ``Mod`` before opset 18. With static quantization the layers
    round their inputs to int8: a float difference of onnxruntime's convolution at a
    rounding boundary moves a value by one step, hence the looser tolerance."""
    from ember.guide.inference import quantize_config

    DEVICE.seed(18)  # fixed weights: static quantization's rounding steps stay where they are
    model = ModelConfig(num_classes=10, hidden_size=32).init(DEVICE)
    calibration = [rand(4, 28, 28, seed=s) for s in range(2)] if "static" in scheme else None
    quantized = model.quantize(quantize_config(scheme), calibration)
    tolerance = {"atol": 2e-3, "rtol": 1e-2} if "static" in scheme else {}
    exported = round_trip(quantized, [rand(2, 28, 28)], tmp_path / "q.onnx",
                          others=[[rand(5, 28, 28, seed=3)]], dynamic_axes={"input": {0: "b"}},
                          **tolerance)  # fmt: skip
    largest = max(exported.graph.initializer, key=lambda i: int(np.prod(i.dims)))
    assert largest.name.startswith("linear1.")
    assert onnx.helper.tensor_dtype_to_np_dtype(largest.data_type).kind in "iu", largest.name


@pytest.mark.parametrize("device_name", ["torch", "fusion"])
def test_models_on_other_backends_export(device_name, tmp_path, monkeypatch):
    """The tracer wraps whatever backend the model is on."""
    if device_name == "torch":
        pytest.importorskip("torch")
        device = ember.device("torch")
    else:
        monkeypatch.setenv("EMBER_FUSION_CACHE", str(tmp_path / "fusion-cache"))
        device = ember.device("ndarray").fusion()
    model = ModelConfig(num_classes=10, hidden_size=16).init(device)
    images = Tensor.from_data(rand(2, 28, 28).to_numpy(), device)
    path = ember.onnx.export(model, images, tmp_path / "m.onnx")
    np.testing.assert_allclose(run_onnxruntime(path, [images])[0], model(images).to_numpy(),
                               rtol=1e-4, atol=1e-5)  # fmt: skip


def test_an_autodiff_model_exports_its_inference_form(tmp_path):
    """Dropout off and batch norm on running statistics, as after ``valid()``."""
    device = DEVICE.autodiff()
    model = ModelConfig(num_classes=10, hidden_size=16, dropout=0.9).init(device)
    images = rand(2, 28, 28)
    path = ember.onnx.export(model, Tensor.from_data(images.to_numpy(), device),
                             tmp_path / "m.onnx")
    want = model.valid()(images).to_numpy()
    np.testing.assert_allclose(run_onnxruntime(path, [images])[0], want, rtol=1e-4, atol=1e-5)


class FirstOutput(Module):
    """The first output of a layer that returns several (a recurrent layer's sequence)."""

    layer: Module

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)[0]


class SelfAttention(Module):
    attention: nn.MultiHeadAttention

    def forward(self, x: Tensor) -> Tensor:
        return self.attention(MhaInput.self_attn(x)).context


SEQUENCE_LAYERS = {
    "lstm": lambda: FirstOutput(nn.LstmConfig(3, 5).init(DEVICE)),
    "lstm_sequence_first": lambda: FirstOutput(nn.LstmConfig(3, 5, batch_first=False).init(
        DEVICE)),
    "bilstm": lambda: FirstOutput(nn.BiLstmConfig(3, 5).init(DEVICE)),
    "gru": lambda: FirstOutput(nn.GruConfig(3, 5).init(DEVICE)),
    "gru_reset_before": lambda: FirstOutput(nn.GruConfig(3, 5, reset_after=False).init(DEVICE)),
    "gru_without_bias": lambda: FirstOutput(nn.GruConfig(3, 5, bias=False).init(DEVICE)),
    "attention": lambda: SelfAttention(nn.MultiHeadAttentionConfig(3, 1).init(DEVICE)),
}


@pytest.mark.parametrize("name", sorted(SEQUENCE_LAYERS))
def test_a_sequence_layer_round_trips_with_dynamic_batch_and_sequence(name, tmp_path):
    model = SEQUENCE_LAYERS[name]()
    exported = round_trip(model, [rand(2, 4, 3)], tmp_path / "seq.onnx",
                          others=[[rand(4, 7, 3, seed=4)], [rand(1, 1, 3, seed=5)]],
                          dynamic_axes={"input": {0: "batch", 1: "seq"}})  # fmt: skip
    node_types = {node.op_type for node in exported.graph.node}
    if "lstm" in name or "gru" in name:  # one ONNX node, not an unrolled loop
        assert ("LSTM" if "lstm" in name else "GRU") in node_types
        assert "MatMul" not in node_types


class Recurrent(Module):
    """An LSTM and a GRU given initial states, returning every output and state."""

    lstm: nn.Lstm
    gru: nn.Gru

    def forward(self, x: Tensor, cell: Tensor, hidden: Tensor, gru_hidden: Tensor):
        out, state = self.lstm(x, LstmState(cell, hidden))
        return out, state.cell, state.hidden, *self.gru(out, gru_hidden)


def test_recurrent_layers_with_initial_states_round_trip(tmp_path):
    model = Recurrent(nn.LstmConfig(3, 4).init(DEVICE), nn.GruConfig(4, 5).init(DEVICE))
    inputs = [rand(2, 6, 3), rand(2, 4, seed=1), rand(2, 4, seed=2), rand(2, 5, seed=3)]
    others = [rand(3, 2, 3, seed=4), rand(3, 4, seed=5), rand(3, 4, seed=6), rand(3, 5, seed=7)]
    batch = {0: "batch"}
    exported = round_trip(model, inputs, tmp_path / "rnn.onnx", others=[others],
                          input_names=["x", "c", "h", "g"],
                          dynamic_axes={"x": {0: "batch", 1: "seq"}, "c": batch, "h": batch,
                                        "g": batch})  # fmt: skip
    # The weights in ONNX's layout, named after the layer.
    names = {i.name.rsplit("_", 1)[0] for i in exported.graph.initializer}
    assert {"lstm.W", "lstm.R", "lstm.B", "gru.W", "gru.R", "gru.B"} <= names


class Encoder(Module):
    """A transformer encoder over ``[batch, seq, d_model]`` with a padding mask."""

    encoder: nn.TransformerEncoder

    def forward(self, x: Tensor, pad: Tensor | None = None) -> Tensor:
        return self.encoder(TransformerEncoderInput(x, mask_pad=pad))


def test_a_transformer_encoder_round_trips_with_dynamic_batch_and_sequence(tmp_path):
    config = nn.TransformerEncoderConfig(d_model=8, d_ff=16, n_heads=2, n_layers=2)
    model = Encoder(config.init(DEVICE))
    round_trip(model, [rand(2, 5, 8)], tmp_path / "encoder.onnx",
               others=[[rand(4, 3, 8, seed=7)], [rand(1, 9, 8, seed=8)]],
               dynamic_axes={"input": {0: "batch", 1: "seq"}})


def test_a_transformer_encoder_with_a_padding_mask_round_trips(tmp_path):
    config = nn.TransformerEncoderConfig(d_model=8, d_ff=16, n_heads=2, n_layers=1,
                                         norm_first=True)  # fmt: skip
    model = Encoder(config.init(DEVICE))
    pad = Tensor.from_data([[False] * 4 + [True], [False] * 5], DEVICE)
    other_pad = Tensor.from_data([[False] * 3, [False, False, True], [False, True, True]],
                                 DEVICE)  # fmt: skip
    round_trip(model, [rand(2, 5, 8), pad], tmp_path / "masked.onnx",
               others=[[rand(3, 3, 8, seed=9), other_pad]], input_names=["x", "pad"],
               dynamic_axes={"x": {0: "batch", 1: "seq"}, "pad": {0: "batch", 1: "seq"}})


class Decoder(Module):
    """A transformer decoder with a causal mask built in the forward (from the target's
    length, so the mask follows the dynamic sequence axis)."""

    decoder: nn.TransformerDecoder

    def forward(self, target: Tensor, memory: Tensor) -> Tensor:
        batch, length, _ = target.shape
        causal = generate_autoregressive_mask(batch, length, target.device)
        return self.decoder(TransformerDecoderInput(target, memory, target_mask_attn=causal))


def test_a_transformer_decoder_with_a_causal_mask_round_trips(tmp_path):
    config = nn.TransformerDecoderConfig(d_model=8, d_ff=16, n_heads=2, n_layers=2)
    model = Decoder(config.init(DEVICE))
    round_trip(model, [rand(2, 5, 8), rand(2, 6, 8, seed=1)], tmp_path / "decoder.onnx",
               others=[[rand(3, 7, 8, seed=2), rand(3, 4, 8, seed=3)]],
               input_names=["target", "memory"],
               dynamic_axes={"target": {0: "batch", 1: "length"},
                             "memory": {0: "batch", 1: "memory_length"}})  # fmt: skip


def test_several_outputs_and_an_output_that_is_an_input(tmp_path):
    class Two(Module):
        linear: nn.Linear

        def forward(self, x: Tensor):
            return self.linear(x), x

    model = Two(nn.LinearConfig(3, 2).init(DEVICE))
    exported = round_trip(model, [rand(2, 3)], tmp_path / "two.onnx", importer=False,
                          output_names=["y", "same"])
    assert [o.name for o in exported.graph.output] == ["y", "same"]


class _LayerNormOnly(Module):
    """``module.layer_norm`` with or without its weight and bias."""

    weight: Tensor | None
    bias: Tensor | None

    def forward(self, x: Tensor) -> Tensor:
        from ember.tensor import module

        return module.layer_norm(x, self.weight, self.bias, 1e-3)


@pytest.mark.parametrize("affine", ["both", "bias", "none"])
@pytest.mark.parametrize("opset", [16, 17])
def test_layer_norm_is_one_node_from_opset_17_and_its_primitives_before(affine, opset, tmp_path):
    weight = rand(5, seed=4) if affine == "both" else None
    bias = rand(5, seed=5) if affine != "none" else None
    model = round_trip(_LayerNormOnly(weight, bias), [rand(3, 4, 5)], tmp_path / "ln.onnx",
                       others=[[rand(6, 4, 5, seed=3)]], dynamic_axes={"input": {0: "batch"}},
                       opset=opset)  # fmt: skip
    types = [node.op_type for node in model.graph.node]
    if opset >= 17:
        assert types.count("LayerNormalization") == 1 and len(types) == 1
    else:
        assert "LayerNormalization" not in types and "ReduceMean" in types
