"""Embedding: against torch.nn.Embedding (forward, the table's gradient), init, errors."""

from __future__ import annotations

import pytest
import torch
from nn_helpers import assert_close, from_torch, pytorch_record

import ember
from ember import Tensor
from ember.backend.errors import ConfigError, EmberIndexError, KindError
from ember.nn.embedding import Embedding, EmbeddingConfig
from ember.nn.initializer import Initializer


def test_forward_and_gradient_match_torch(ad_device):
    torch.manual_seed(0)
    reference = torch.nn.Embedding(7, 4)
    layer = EmbeddingConfig(7, 4).init(ad_device).load_record(pytorch_record(reference))
    ids_ref = torch.tensor([[1, 3, 3, 0], [6, 1, 2, 1]])  # repeated ids: their gradients add up
    y_ref = reference(ids_ref)
    upstream = torch.randn(y_ref.shape)
    (y_ref * upstream).sum().backward()

    y = layer(from_torch(ids_ref, ad_device))
    assert y.shape == (2, 4, 4)
    assert_close(y, y_ref)
    grads = (y * from_torch(upstream, ad_device)).sum().backward()
    assert_close(layer.weight.val().grad(grads), reference.weight.grad)


def test_inference_matches_torch_for_any_shape_of_ids(base_device):
    torch.manual_seed(1)
    reference = torch.nn.Embedding(5, 3)
    layer = EmbeddingConfig(5, 3).init(base_device).load_record(pytorch_record(reference))
    for ids in (torch.tensor([[4, 0]]), torch.tensor([2, 2, 1]), torch.tensor([[[0], [4]]])):
        assert_close(layer(from_torch(ids, base_device)), reference(ids))


def test_default_initializer_is_standard_normal():
    device = ember.device("ndarray")
    ember.seed(device, 2)
    config = EmbeddingConfig(200, 50)
    assert config.initializer == Initializer.Normal(mean=0.0, std=1.0)
    values = config.init(device).weight.val().to_numpy()
    assert abs(values.mean()) < 0.02 and abs(values.std() - 1.0) < 0.02


def test_layout_properties_and_json():
    layer = EmbeddingConfig(10, 3, initializer=Initializer.Zeros()).init()
    assert isinstance(layer, Embedding)
    assert layer.weight.shape == (10, 3) and (layer.n_embedding, layer.d_model) == (10, 3)
    assert layer.weight.val().to_numpy().max() == 0
    config = EmbeddingConfig(10, 3, initializer=Initializer.XavierUniform(1.0))
    assert EmbeddingConfig.load_json(config.to_json()) == config
    assert config.init().weight.val().abs().max().item() <= (6 / 13) ** 0.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_embedding": 0, "d_model": 3}, r"EmbeddingConfig.n_embedding: expected greater"),
        ({"n_embedding": 3, "d_model": 2.5}, r"EmbeddingConfig.d_model: expected an integer"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EmbeddingConfig(**kwargs)


def test_float_ids_are_a_kind_error():
    layer = EmbeddingConfig(4, 2).init()
    with pytest.raises(KindError, match=r"Embedding: expected Int ids of shape \[batch, seq_length\], "
                                        r"got a Float tensor of shape \[2, 3\]"):  # fmt: skip
        layer(Tensor.ones([2, 3]))


@pytest.mark.parametrize("bad", [4, -1])
def test_ids_out_of_range_are_an_index_error_on_every_backend(base_device, bad):
    layer = EmbeddingConfig(4, 2).init(base_device)
    ids = Tensor.from_data([[0, bad], [3, 1]], base_device)
    low, high = min(bad, 0), max(bad, 3)
    with pytest.raises(EmberIndexError, match=rf"Embedding: ids \(n_embedding\) must be in \[0, 4\), "
                                              rf"got {low} to {high}"):  # fmt: skip
        layer(ids)


def test_empty_ids_give_an_empty_output():
    layer = EmbeddingConfig(4, 2).init()
    assert layer(Tensor.zeros([0, 3], kind=ember.Int)).shape == (0, 3, 2)
