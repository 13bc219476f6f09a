"""MultiHeadAttention: against torch.nn.MultiheadAttention (outputs, weights, gradients, masks),
the decoding cache, the mask helpers, the PyTorch adapter and errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record, to_data

import ember
from ember import Tensor, TensorData
from ember.backend.errors import (
    ArgumentError,
    ConfigError,
    KindError,
    RecordMismatchError,
    ShapeError,
)
from ember.nn.attention import (
    MhaCache,
    MhaInput,
    MultiHeadAttention,
    MultiHeadAttentionConfig,
    generate_autoregressive_mask,
    generate_padding_mask,
)
from ember.record.adapter import PYTORCH
from ember.record.imported import ImportedRecord

D_MODEL, HEADS = 8, 2


def torch_mha() -> torch.nn.MultiheadAttention:
    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(D_MODEL, HEADS, dropout=0.0, batch_first=True)
    with torch.no_grad():  # PyTorch zeroes the biases: make them count
        reference.in_proj_bias.uniform_(-0.5, 0.5)
        reference.out_proj.bias.uniform_(-0.5, 0.5)
    return reference


def ember_mha(reference: torch.nn.Module, device, **kwargs) -> MultiHeadAttention:
    config = MultiHeadAttentionConfig(D_MODEL, HEADS, dropout=0.0, **kwargs)
    return config.init(device).load_record(pytorch_record(reference))


def torch_grads(reference: torch.nn.Module) -> ImportedRecord:
    """PyTorch's parameter gradients as a record, loadable into an ember module."""
    return ImportedRecord(
        {name: to_data(p.grad) for name, p in reference.named_parameters()}, adapter=PYTORCH
    )


def assert_param_grads(module, grads, reference: torch.nn.Module, atol: float = 1e-5) -> None:
    expected = dict(module.load_record(torch_grads(reference)).params())
    for path, param in module.params():
        actual = param.val().grad(grads)
        assert actual is not None, path
        np.testing.assert_allclose(
            actual.to_numpy(), expected[path].val().to_numpy(), atol=atol, rtol=1e-4, err_msg=path
        )


MASKS = ["none", "pad", "causal", "both"]


@pytest.mark.parametrize("masks", MASKS)
def test_self_attention_matches_torch(ad_device, masks):
    reference = torch_mha()
    mha = ember_mha(reference, ad_device)
    batch, seq = 3, 5
    x_ref = torch.randn(batch, seq, D_MODEL, requires_grad=True)
    pad = torch.zeros(batch, seq, dtype=torch.bool)
    pad[1, 3:] = True
    pad[2, 4:] = True
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    use_pad, use_causal = masks in ("pad", "both"), masks in ("causal", "both")
    out_ref, weights_ref = reference(
        x_ref, x_ref, x_ref, key_padding_mask=pad if use_pad else None,
        attn_mask=causal if use_causal else None, average_attn_weights=False,
    )  # fmt: skip
    upstream = torch.randn_like(out_ref)
    (out_ref * upstream).sum().backward()

    x = from_torch(x_ref, ad_device).require_grad()
    input = MhaInput.self_attn(x)
    if use_pad:
        input = input.with_mask_pad(from_torch(pad, ad_device))
    if use_causal:
        input = input.with_mask_attn(generate_autoregressive_mask(batch, seq, ad_device))
    out = mha(input)
    assert_close(out.context, out_ref)
    assert_close(out.weights, weights_ref)
    grads = (out.context * from_torch(upstream, ad_device)).sum().backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-5)
    assert_param_grads(mha, grads, reference)


def test_cross_attention_matches_torch(ad_device):
    reference = torch_mha()
    mha = ember_mha(reference, ad_device)
    q_ref, k_ref, v_ref = (torch.randn(2, n, D_MODEL, requires_grad=True) for n in (3, 6, 6))
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    out_ref, weights_ref = reference(
        q_ref, k_ref, v_ref, key_padding_mask=pad, average_attn_weights=False
    )
    out_ref.square().sum().backward()

    q, k, v = (from_torch(t, ad_device).require_grad() for t in (q_ref, k_ref, v_ref))
    out = mha(MhaInput(q, k, v).with_mask_pad(from_torch(pad, ad_device)))
    assert_close(out.context, out_ref)
    assert_close(out.weights, weights_ref)
    grads = (out.context * out.context).sum().backward()
    for mine, theirs in ((q, q_ref), (k, k_ref), (v, v_ref)):
        assert_close(mine.grad(grads), theirs.grad, atol=1e-5)
    assert_param_grads(mha, grads, reference)


def test_self_attention_projects_query_key_and_value_as_one_product(monkeypatch):
    """One tensor for the query, key and value: the three projections are one product with
    the weights side by side (as PyTorch's packed ``in_proj``), whose results and
    gradients match the three separate ones (a copy of the input takes that path)."""
    device = ember.device("ndarray").autodiff()
    reference = torch_mha()
    mha = ember_mha(reference, device)
    host = np.random.default_rng(4).standard_normal((3, 5, D_MODEL)).astype(np.float32)
    products = []
    inner = type(device.backend.inner)
    original = inner.float_matmul

    def counted(self, a, b):
        products.append(tuple(b.shape))
        return original(self, a, b)

    monkeypatch.setattr(inner, "float_matmul", counted)
    results = []
    for packed in (True, False):
        x = Tensor.from_data(host, device).require_grad()
        other = x if packed else Tensor.from_data(host, device).require_grad()
        products.clear()
        out = mha(MhaInput(x, other, other if packed else Tensor.from_data(host, device)))
        grads = (out.context * out.context).sum().backward()
        forward = [shape for shape in products if shape[-1] in (D_MODEL, 3 * D_MODEL)][:3]
        assert forward[0] == ((D_MODEL, 3 * D_MODEL) if packed else (D_MODEL, D_MODEL))
        results.append((out.context.to_numpy(), {
            path: p.val().grad(grads).to_numpy() for path, p in mha.params()}))  # fmt: skip
    (packed_out, packed_grads), (separate_out, separate_grads) = results
    np.testing.assert_allclose(packed_out, separate_out, rtol=1e-5, atol=1e-6)
    for path, grad in separate_grads.items():
        np.testing.assert_allclose(packed_grads[path], grad, rtol=1e-4, atol=1e-5, err_msg=path)


def test_self_attention_with_one_projection_unbiased_matches_torch():
    """Projections with and without biases are not packed together: each runs as it is."""
    device = ember.device("ndarray").autodiff()
    reference = torch_mha()
    with torch.no_grad():
        reference.in_proj_bias[D_MODEL : 2 * D_MODEL] = 0.0  # the key's
    mha = ember_mha(reference, device)
    mha = dataclasses.replace(mha, key=dataclasses.replace(mha.key, bias=None))
    x_ref = torch.randn(2, 4, D_MODEL, requires_grad=True)
    out_ref, _ = reference(x_ref, x_ref, x_ref)
    out_ref.sum().backward()
    x = from_torch(x_ref, device).require_grad()
    out = mha(MhaInput.self_attn(x))
    assert_close(out.context, out_ref)
    grads = out.context.sum().backward()
    assert_close(x.grad(grads), x_ref.grad, atol=1e-5)


def test_inference_matches_torch(base_device):
    reference = torch_mha().eval()
    mha = ember_mha(reference, base_device)
    x = torch.randn(2, 4, D_MODEL)
    with torch.no_grad():
        out_ref, weights_ref = reference(x, x, x, average_attn_weights=False)
    out = mha(MhaInput.self_attn(from_torch(x, base_device)))
    assert_close(out.context, out_ref)
    assert_close(out.weights, weights_ref)


def test_quiet_softmax_weights_follow_the_formula():
    reference = torch_mha()
    device = ember.device("ndarray")
    mha = ember_mha(reference, device, quiet_softmax=True)
    x = torch.randn(2, 4, D_MODEL)
    # the scores from PyTorch's own projections, then exp(s) / (1 + sum exp(s)) in float64
    q, k, _ = torch.nn.functional.linear(x, reference.in_proj_weight, reference.in_proj_bias).chunk(
        3, -1
    )

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(2, 4, HEADS, D_MODEL // HEADS).transpose(1, 2).double()

    scores = heads(q) @ heads(k).transpose(2, 3) / math.sqrt(D_MODEL // HEADS)
    expected = scores.exp() / (1 + scores.exp().sum(-1, keepdim=True))
    out = mha(MhaInput.self_attn(from_torch(x, device)))
    assert_close(out.weights, expected, atol=1e-6)
    assert (out.weights.sum_dim(3).to_numpy() < 1).all()


def test_a_fully_masked_row_gives_uniform_weights_not_nan(base_device):
    mha = MultiHeadAttentionConfig(D_MODEL, HEADS, dropout=0.0).init(base_device)
    x = Tensor.random([1, 3, D_MODEL], device=base_device)
    out = mha(
        MhaInput.self_attn(x).with_mask_pad(Tensor.from_data([[True, True, True]], base_device))
    )
    np.testing.assert_allclose(out.weights.to_numpy(), np.full((1, HEADS, 3, 3), 1 / 3), atol=1e-6)
    assert np.isfinite(out.context.to_numpy()).all()


def test_dropout_acts_on_the_weights_while_training_only(ad_device):
    mha = MultiHeadAttentionConfig(D_MODEL, HEADS, dropout=0.5).init(ad_device)
    x = Tensor.random([2, 16, D_MODEL], device=ad_device)
    ember.seed(ad_device, 3)
    train = mha(MhaInput.self_attn(x))
    valid = mha.valid()(MhaInput.self_attn(x.inner()))
    # the returned weights are those before dropout, the context is not
    np.testing.assert_allclose(train.weights.to_numpy(), valid.weights.to_numpy(), atol=1e-6)
    assert not np.allclose(train.context.to_numpy(), valid.context.to_numpy(), atol=1e-3)
    again = mha.valid()(MhaInput.self_attn(x.inner()))
    np.testing.assert_array_equal(again.context.to_numpy(), valid.context.to_numpy())


def test_cache_gives_the_outputs_of_the_full_causal_forward(base_device):
    mha = MultiHeadAttentionConfig(D_MODEL, HEADS, dropout=0.0).init(base_device)
    batch, seq = 2, 6
    x = Tensor.random([batch, seq, D_MODEL], device=base_device)
    pad = Tensor.from_data([[False] * seq, [False] * 5 + [True]], base_device)
    causal = generate_autoregressive_mask(batch, seq, base_device)
    full = mha(MhaInput.self_attn(x).with_mask_attn(causal).with_mask_pad(pad))

    cache = MhaCache()
    for end in (2, 3, 6):  # several new positions at once, then one, then three
        step = MhaInput.self_attn(x[:, :end]).with_mask_pad(pad[:, :end])
        out = mha.forward_cache(step.with_mask_attn(causal[:, :end, :end]), cache)
        np.testing.assert_allclose(
            out.context.to_numpy(), full.context[:, :end].to_numpy(), atol=1e-5
        )
    # the weights of the last step's new positions
    np.testing.assert_allclose(out.weights.to_numpy(), full.weights[:, :, 3:].to_numpy(), atol=1e-6)
    assert (cache.query_len, cache.kv_len) == (6, 6)
    assert cache.key.shape == (batch, HEADS, seq, D_MODEL // HEADS)


def test_cache_over_a_fixed_memory_projects_it_once(base_device):
    mha = MultiHeadAttentionConfig(D_MODEL, HEADS, dropout=0.0).init(base_device)
    query = Tensor.random([1, 4, D_MODEL], device=base_device)
    memory = Tensor.random([1, 7, D_MODEL], device=base_device)
    full = mha(MhaInput(query, memory, memory))
    cache = MhaCache.autoregressive()
    out = mha.forward_cache(MhaInput(query[:, :1], memory, memory), cache)
    projected = cache.key
    for end in range(2, 5):
        out = mha.forward_cache(MhaInput(query[:, :end], memory, memory), cache)
        assert cache.key is projected  # nothing new to project
    np.testing.assert_allclose(out.context.to_numpy(), full.context.to_numpy(), atol=1e-5)


def test_cache_errors():
    mha = MultiHeadAttentionConfig(D_MODEL, HEADS).init()
    x = Tensor.random([2, 4, D_MODEL])
    cache = MhaCache()
    mha.forward_cache(MhaInput.self_attn(x), cache)
    with pytest.raises(
        ShapeError, match=r"the cache has seen 4 query and 4 key positions, the input has 3"
    ):
        mha.forward_cache(MhaInput.self_attn(x[:, :3]), cache)
    with pytest.raises(ShapeError, match=r"the cache holds a batch of 2, the input a batch of 1"):
        mha.forward_cache(MhaInput.self_attn(Tensor.random([1, 5, D_MODEL])), cache)


def test_autoregressive_mask_is_true_above_the_diagonal(base_device):
    mask = generate_autoregressive_mask(2, 4, base_device)
    assert mask.shape == (2, 4, 4) and mask.device == base_device
    expected = np.triu(np.ones((4, 4), bool), k=1)
    np.testing.assert_array_equal(mask.to_numpy(), np.broadcast_to(expected, (2, 4, 4)))


def test_padding_mask_pads_cuts_and_marks_the_padding():
    padded = generate_padding_mask(9, [[1, 2], [3, 4, 5, 6], [9]])
    assert padded.tensor.tolist() == [[1, 2, 9, 9], [3, 4, 5, 6], [9, 9, 9, 9]]
    # the real token 9 of the last sequence is not padding
    assert padded.mask.tolist() == [
        [False, False, True, True],
        [False] * 4,
        [False, True, True, True],
    ]
    cut = generate_padding_mask(0, [[1, 2, 3], [4]], max_seq_length=2)
    assert cut.tensor.tolist() == [[1, 2], [4, 0]]
    assert cut.mask.tolist() == [[False, False], [False, True]]
    with pytest.raises(ArgumentError, match="generate_padding_mask: needs at least one sequence"):
        generate_padding_mask(0, [])


def test_adapter_splits_packed_and_separate_projections():
    reference = torch_mha()
    mha = ember_mha(reference, ember.device("ndarray"))
    e = D_MODEL
    for i, name in enumerate(("query", "key", "value")):
        weight = reference.in_proj_weight[i * e : (i + 1) * e]
        assert_close(getattr(mha, name).weight.val(), weight.T)
        assert_close(getattr(mha, name).bias.val(), reference.in_proj_bias[i * e : (i + 1) * e])
    assert_close(mha.output.weight.val(), reference.out_proj.weight.T)
    # PyTorch's separate projections (kept when kdim / vdim differ from embed_dim)
    separate = {f"{c}_proj_weight": np.full((e, e), i, np.float32) for i, c in enumerate("qkv")}
    adapted = PYTORCH.adapt(mha, {k: TensorData(v) for k, v in separate.items()})
    assert [adapted[n]["weight"].to_numpy()[0, 0] for n in ("query", "key", "value")] == [0, 1, 2]


def test_unsupported_pytorch_parameters_are_reported():
    reference = torch.nn.MultiheadAttention(D_MODEL, HEADS, add_bias_kv=True, batch_first=True)
    with pytest.raises(RecordMismatchError, match=r"bias_k: in the record but not in the module"):
        MultiHeadAttentionConfig(D_MODEL, HEADS).init().load_record(pytorch_record(reference))


def test_config_defaults_and_json():
    config = MultiHeadAttentionConfig(16, 4)
    assert (config.dropout, config.min_float, config.quiet_softmax) == (0.1, -1e4, False)
    assert config.initializer.to_dict() == {
        "KaimingUniform": {"gain": 1 / math.sqrt(3), "fan_out_only": False}
    }
    assert MultiHeadAttentionConfig.load_json(config.to_json()) == config
    mha = config.init()
    assert (mha.d_model, mha.n_heads, mha.d_k, mha.dropout.prob) == (16, 4, 4, 0.1)
    assert mha.num_params() == 4 * (16 * 16 + 16)


def test_heads_must_divide_d_model():
    with pytest.raises(
        ConfigError, match=r"MultiHeadAttentionConfig.n_heads: 3 heads must divide d_model \(8\)"
    ):
        MultiHeadAttentionConfig(8, 3).init()


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (
            [(2, 3, 5), (2, 3, 8), (2, 3, 8)],
            r"expected the query of shape \[batch, seq, 8\] \(d_model\), got \[2, 3, 5\]",
        ),
        (
            [(3, 8), (2, 3, 8), (2, 3, 8)],
            r"expected the query of shape \[batch, seq, 8\] \(d_model\), got \[3, 8\]",
        ),
        (
            [(2, 3, 8), (1, 4, 8), (1, 4, 8)],
            r"the query \[2, 3, 8\], key \[1, 4, 8\] and value \[1, 4, 8\] must share",
        ),
        (
            [(2, 3, 8), (2, 4, 8), (2, 5, 8)],
            r"the query .* must share the batch, and the key and the value the",
        ),
    ],
)
def test_input_shape_errors(shapes, message):
    mha = MultiHeadAttentionConfig(D_MODEL, HEADS).init()
    with pytest.raises(ShapeError, match="MultiHeadAttention: " + message):
        mha(MhaInput(*(Tensor.zeros(s) for s in shapes)))


def test_mask_errors():
    mha = MultiHeadAttentionConfig(D_MODEL, HEADS).init()
    q, kv = Tensor.zeros([2, 3, D_MODEL]), Tensor.zeros([2, 4, D_MODEL])
    base = MhaInput(q, kv, kv)
    with pytest.raises(
        ShapeError, match=r"expected mask_pad of shape \[batch, seq_kv\] = \[2, 4\], got \[2, 3\]"
    ):
        mha(base.with_mask_pad(Tensor.full([2, 3], False)))
    with pytest.raises(
        ShapeError, match=r"mask_attn of shape \[batch, seq_q, seq_kv\] = \[2, 3, 4\], got \[3, 4\]"
    ):
        mha(base.with_mask_attn(Tensor.full([3, 4], False)))
    with pytest.raises(
        KindError, match=r"MultiHeadAttention: mask_pad must be a Bool tensor, got Float"
    ):
        mha(base.with_mask_pad(Tensor.zeros([2, 4])))
    with pytest.raises(ArgumentError, match=r"expected an MhaInput, got Tensor"):
        mha(q)
