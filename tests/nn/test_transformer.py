"""Transformer encoder / decoder: against torch.nn.TransformerEncoder / Decoder (outputs and
gradients, post- and pre-norm, masks), the autoregressive caches, the adapter and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record, to_data

import ember
from ember import Tensor
from ember.backend.errors import ConfigError, KindError, RecordMismatchError, ShapeError
from ember.nn.attention import generate_autoregressive_mask
from ember.nn.transformer import (
    PositionWiseFeedForwardConfig,
    TransformerDecoderConfig,
    TransformerDecoderInput,
    TransformerEncoderConfig,
    TransformerEncoderInput,
)
from ember.record.adapter import PYTORCH
from ember.record.imported import ImportedRecord

D_MODEL, D_FF, HEADS, LAYERS = 8, 16, 2, 2


def _randomize_biases(module: torch.nn.Module) -> None:
    with torch.no_grad():  # PyTorch zeroes attention biases and sets norms to 1 / 0
        for name, p in module.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.rand_like(p) - 0.5)


def torch_encoder(norm_first: bool) -> torch.nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        D_MODEL,
        HEADS,
        D_FF,
        dropout=0.0,
        activation="gelu",
        batch_first=True,
        norm_first=norm_first,
    )
    encoder = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
    _randomize_biases(encoder)
    return encoder


def torch_decoder(norm_first: bool) -> torch.nn.TransformerDecoder:
    torch.manual_seed(1)
    layer = torch.nn.TransformerDecoderLayer(
        D_MODEL,
        HEADS,
        D_FF,
        dropout=0.0,
        activation="gelu",
        batch_first=True,
        norm_first=norm_first,
    )
    decoder = torch.nn.TransformerDecoder(layer, LAYERS)
    _randomize_biases(decoder)
    return decoder


def assert_param_grads(module, grads, reference: torch.nn.Module) -> None:
    """Every parameter's gradient against PyTorch's, mapped through the adapter's layout."""
    record = ImportedRecord(
        {n: to_data(p.grad) for n, p in reference.named_parameters()}, adapter=PYTORCH
    )
    expected = dict(module.load_record(record).params())  # strict: every tensor on both sides
    for path, param in module.params():
        actual = param.val().grad(grads)
        assert actual is not None, path
        np.testing.assert_allclose(
            actual.to_numpy(), expected[path].val().to_numpy(), atol=1e-5, rtol=1e-4, err_msg=path
        )


def padding(batch: int, seq: int) -> torch.Tensor:
    pad = torch.zeros(batch, seq, dtype=torch.bool)
    pad[1, seq - 2 :] = True
    return pad


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_encoder_matches_torch(ad_device, norm_first):
    reference = torch_encoder(norm_first)
    config = TransformerEncoderConfig(
        D_MODEL, D_FF, HEADS, LAYERS, dropout=0.0, norm_first=norm_first
    )
    encoder = config.init(ad_device).load_record(pytorch_record(reference))
    batch, seq = 2, 5
    x_ref = torch.randn(batch, seq, D_MODEL, requires_grad=True)
    pad = padding(batch, seq)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    y_ref = reference(x_ref, mask=causal, src_key_padding_mask=pad)
    upstream = torch.randn_like(y_ref)
    (y_ref * upstream).sum().backward()

    x = from_torch(x_ref, ad_device).require_grad()
    input = TransformerEncoderInput(x, mask_pad=from_torch(pad, ad_device))
    y = encoder(input.with_mask_attn(generate_autoregressive_mask(batch, seq, ad_device)))
    assert_close(y, y_ref, atol=1e-5)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-5)
    assert_param_grads(encoder, grads, reference)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_decoder_matches_torch(ad_device, norm_first):
    reference = torch_decoder(norm_first)
    config = TransformerDecoderConfig(
        D_MODEL, D_FF, HEADS, LAYERS, dropout=0.0, norm_first=norm_first
    )
    decoder = config.init(ad_device).load_record(pytorch_record(reference))
    batch, seq, seq_mem = 2, 4, 6
    t_ref = torch.randn(batch, seq, D_MODEL, requires_grad=True)
    m_ref = torch.randn(batch, seq_mem, D_MODEL, requires_grad=True)
    memory_pad = padding(batch, seq_mem)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    y_ref = reference(t_ref, m_ref, tgt_mask=causal, memory_key_padding_mask=memory_pad)
    upstream = torch.randn_like(y_ref)
    (y_ref * upstream).sum().backward()

    target, memory = (
        from_torch(t_ref, ad_device).require_grad(),
        from_torch(m_ref, ad_device).require_grad(),
    )
    input = TransformerDecoderInput(target, memory).with_memory_mask_pad(
        from_torch(memory_pad, ad_device)
    )
    y = decoder(input.with_target_mask_attn(generate_autoregressive_mask(batch, seq, ad_device)))
    assert_close(y, y_ref, atol=1e-5)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(target.grad(grads), t_ref.grad, atol=1e-5)
    assert_close(memory.grad(grads), m_ref.grad, atol=1e-5)
    assert_param_grads(decoder, grads, reference)


def test_inference_matches_torch(base_device):
    reference = torch_encoder(False).eval()
    encoder = TransformerEncoderConfig(D_MODEL, D_FF, HEADS, LAYERS).init(base_device)
    encoder = encoder.load_record(pytorch_record(reference))
    x = torch.randn(3, 4, D_MODEL)
    with torch.no_grad():
        y_ref = reference(x)
    assert_close(encoder(TransformerEncoderInput(from_torch(x, base_device))), y_ref, atol=1e-5)


def test_feed_forward_is_linear_gelu_linear():
    torch.manual_seed(2)
    inner, outer = torch.nn.Linear(D_MODEL, D_FF), torch.nn.Linear(D_FF, D_MODEL)
    device = ember.device("ndarray")
    pwff = PositionWiseFeedForwardConfig(D_MODEL, D_FF).init(device)
    layers = {"linear_inner": inner, "linear_outer": outer}
    tensors = {f"{n}.{k}": to_data(v) for n, m in layers.items() for k, v in m.state_dict().items()}
    pwff = pwff.load_record(ImportedRecord(tensors, adapter=PYTORCH))
    x = torch.randn(2, 3, D_MODEL)
    expected = outer(torch.nn.functional.gelu(inner(x)))
    assert_close(pwff(from_torch(x, device)), expected, atol=1e-6)


def test_dropout_trains_on_autodiff_and_stops_after_valid():
    device = ember.device("ndarray").autodiff()
    encoder = TransformerEncoderConfig(D_MODEL, D_FF, HEADS, LAYERS, dropout=0.5).init(device)
    x = Tensor.random([2, 6, D_MODEL], device=device)
    ember.seed(device, 0)
    trained = encoder(TransformerEncoderInput(x)).to_numpy()
    valid = encoder.valid()
    inferred = valid(TransformerEncoderInput(x.inner())).to_numpy()
    assert not np.allclose(trained, inferred, atol=1e-3)
    no_dropout = TransformerEncoderConfig(D_MODEL, D_FF, HEADS, LAYERS, dropout=0.0).init(
        device.inner()
    )
    no_dropout = no_dropout.load_record(valid.into_record())
    np.testing.assert_allclose(
        no_dropout(TransformerEncoderInput(x.inner())).to_numpy(), inferred, atol=1e-6
    )


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_decoder_cache_gives_the_full_forward(base_device, norm_first):
    config = TransformerDecoderConfig(
        D_MODEL, D_FF, HEADS, LAYERS, dropout=0.0, norm_first=norm_first
    )
    decoder = config.init(base_device)
    batch, seq, seq_mem = 2, 6, 5
    target = Tensor.random([batch, seq, D_MODEL], device=base_device)
    memory = Tensor.random([batch, seq_mem, D_MODEL], device=base_device)
    memory_pad = Tensor.from_data([[False] * seq_mem, [False] * 3 + [True] * 2], base_device)
    causal = generate_autoregressive_mask(batch, seq, base_device)
    full = decoder(
        TransformerDecoderInput(target, memory, target_mask_attn=causal, memory_mask_pad=memory_pad)
    ).to_numpy()

    cache = decoder.new_autoregressive_cache()
    for end in (1, 2, 4, 5, 6):
        step = TransformerDecoderInput(
            target[:, :end],
            memory,
            target_mask_attn=causal[:, :end, :end],
            memory_mask_pad=memory_pad,
        )
        out = decoder.forward_autoregressive_inference(step, cache)
        np.testing.assert_allclose(out.to_numpy(), full[:, :end], atol=1e-5)
    assert cache.seq_len == seq
    assert all(c.cross_attn.kv_len == seq_mem and c.self_attn.kv_len == seq for c in cache.layers)


def test_encoder_cache_gives_the_causal_forward(base_device):
    encoder = TransformerEncoderConfig(D_MODEL, D_FF, HEADS, LAYERS, dropout=0.0).init(base_device)
    x = Tensor.random([1, 5, D_MODEL], device=base_device)
    causal = generate_autoregressive_mask(1, 5, base_device)
    full = encoder(TransformerEncoderInput(x, mask_attn=causal)).to_numpy()
    cache = encoder.new_autoregressive_cache()
    for end in (3, 4, 5):
        step = TransformerEncoderInput(x[:, :end], mask_attn=causal[:, :end, :end])
        out = encoder.forward_autoregressive_inference(step, cache)
    np.testing.assert_allclose(out.to_numpy(), full, atol=1e-5)


def test_cache_errors():
    decoder = TransformerDecoderConfig(D_MODEL, D_FF, HEADS, 1).init()
    target, memory = Tensor.random([1, 3, D_MODEL]), Tensor.random([1, 4, D_MODEL])
    cache = decoder.new_autoregressive_cache()
    decoder.forward_autoregressive_inference(TransformerDecoderInput(target, memory), cache)
    with pytest.raises(
        ShapeError, match=r"TransformerDecoder: the cache has seen 3 positions, the input has 2"
    ):
        decoder.forward_autoregressive_inference(
            TransformerDecoderInput(target[:, :2], memory), cache
        )
    with pytest.raises(
        ShapeError, match=r"the cache holds a memory of 4 positions, the input one of 2"
    ):
        decoder.forward_autoregressive_inference(
            TransformerDecoderInput(target, memory[:, :2]), cache
        )
    encoder = TransformerEncoderConfig(D_MODEL, D_FF, HEADS, 1).init()
    encoder_cache = encoder.new_autoregressive_cache()
    encoder.forward_autoregressive_inference(TransformerEncoderInput(target), encoder_cache)
    with pytest.raises(
        ShapeError,
        match=r"TransformerEncoder: the cache holds a batch of 1, the input a batch of 2",
    ):
        encoder.forward_autoregressive_inference(
            TransformerEncoderInput(Tensor.random([2, 4, D_MODEL])), encoder_cache
        )


def test_adapter_maps_pytorch_names():
    reference = torch_encoder(False)
    encoder = TransformerEncoderConfig(D_MODEL, D_FF, HEADS, LAYERS).init()
    encoder = encoder.load_record(pytorch_record(reference))
    layer, torch_layer = encoder.layers[1], reference.layers[1]
    assert_close(layer.pwff.linear_inner.weight.val(), torch_layer.linear1.weight.T)
    assert_close(layer.pwff.linear_outer.bias.val(), torch_layer.linear2.bias)
    assert_close(layer.norm_2.gamma.val(), torch_layer.norm2.weight)
    assert_close(layer.mha.value.bias.val(), torch_layer.self_attn.in_proj_bias[2 * D_MODEL :])
    decoder = TransformerDecoderConfig(D_MODEL, D_FF, HEADS, LAYERS).init()
    torch_dec = torch_decoder(False)
    decoder = decoder.load_record(pytorch_record(torch_dec))
    assert_close(
        decoder.layers[0].cross_attn.output.weight.val(),
        torch_dec.layers[0].multihead_attn.out_proj.weight.T,
    )
    assert_close(decoder.layers[0].norm_3.beta.val(), torch_dec.layers[0].norm3.bias)


def test_a_final_pytorch_norm_is_reported():
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, batch_first=True)
    reference = torch.nn.TransformerEncoder(
        layer, 1, norm=torch.nn.LayerNorm(D_MODEL), enable_nested_tensor=False
    )
    encoder = TransformerEncoderConfig(D_MODEL, D_FF, HEADS, 1).init()
    with pytest.raises(
        RecordMismatchError, match=r"norm.weight: in the record but not in the module"
    ):
        encoder.load_record(pytorch_record(reference))


def test_config_defaults_and_json():
    config = TransformerEncoderConfig(16, 32, 4, 3)
    assert (config.dropout, config.norm_first, config.quiet_softmax) == (0.1, False, False)
    assert config.initializer.to_dict() == {
        "KaimingUniform": {"gain": 1 / math.sqrt(3), "fan_out_only": False}
    }
    assert TransformerEncoderConfig.load_json(config.to_json()) == config
    decoder_config = TransformerDecoderConfig(16, 32, 4, 3, quiet_softmax=True)
    assert TransformerDecoderConfig.load_json(decoder_config.to_json()) == decoder_config
    decoder = decoder_config.init()
    assert len(decoder.layers) == 3 and decoder.layers[2].self_attn.quiet_softmax
    assert decoder.layers[0].dropout.prob == 0.1 and decoder.layers[0].pwff.dropout.prob == 0.1
    assert PositionWiseFeedForwardConfig(4, 8).dropout == 0.1


def test_heads_must_divide_d_model():
    with pytest.raises(
        ConfigError, match=r"MultiHeadAttentionConfig.n_heads: 3 heads must divide d_model"
    ):
        TransformerEncoderConfig(8, 16, 3, 1).init()


def test_input_errors():
    encoder = TransformerEncoderConfig(D_MODEL, D_FF, HEADS, 1).init()
    with pytest.raises(
        ShapeError, match=r"TransformerEncoder: expected the tensor of shape \[batch, seq, 8\]"
    ):
        encoder(TransformerEncoderInput(Tensor.zeros([2, 3, 4])))
    x = Tensor.zeros([2, 3, D_MODEL])
    with pytest.raises(
        ShapeError, match=r"TransformerEncoder: expected mask_attn of shape \[batch, seq, seq\]"
    ):
        encoder(TransformerEncoderInput(x, mask_attn=generate_autoregressive_mask(2, 4)))
    with pytest.raises(
        KindError, match=r"TransformerEncoder: mask_pad must be a Bool tensor, got Int"
    ):
        encoder(TransformerEncoderInput(x, mask_pad=Tensor.zeros([2, 3], kind=ember.Kind.INT)))
    decoder = TransformerDecoderConfig(D_MODEL, D_FF, HEADS, 1).init()
    with pytest.raises(
        ShapeError, match=r"TransformerDecoder: the target \[2, 3, 8\] and the memory \[1, 5, 8\]"
    ):
        decoder(TransformerDecoderInput(x, Tensor.zeros([1, 5, D_MODEL])))
    with pytest.raises(
        ShapeError, match=r"TransformerDecoder: expected the memory of shape \[batch, seq, 8\]"
    ):
        decoder(TransformerDecoderInput(x, Tensor.zeros([2, 5])))
    with pytest.raises(
        ShapeError, match=r"expected memory_mask_pad of shape \[batch, seq_mem\] = \[2, 5\]"
    ):
        decoder(
            TransformerDecoderInput(
                x, Tensor.zeros([2, 5, D_MODEL]), memory_mask_pad=Tensor.full([2, 3], False)
            )
        )
