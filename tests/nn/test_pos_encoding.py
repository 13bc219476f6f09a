"""Sinusoidal positional encoding and rotary encoding (RoPE) against NumPy float64 references."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError, ConfigError, ShapeError
from ember.nn.pos_encoding import PositionalEncodingConfig, RotaryEncodingConfig


def sinusoids(length: int, d_model: int, timescale: float) -> np.ndarray:
    """The paper's table: PE[p, 2i] = sin(p / T^(2i/d)), PE[p, 2i+1] = cos(p / T^(2i/d))."""
    table = np.zeros((length, d_model))
    for i in range(d_model // 2):
        wavelength = timescale ** (2 * i / d_model)
        table[:, 2 * i] = np.sin(np.arange(length) / wavelength)
        table[:, 2 * i + 1] = np.cos(np.arange(length) / wavelength)
    return table


def rope(x: np.ndarray, start: int, theta: float) -> np.ndarray:
    """Rotates each interleaved pair (2i, 2i+1) at position p by p * theta^(-2i/d)."""
    x = x.astype(np.float64)
    d, seq = x.shape[-1], x.shape[-2]
    out = np.empty_like(x)
    for p in range(seq):
        for i in range(d // 2):
            angle = (start + p) * theta ** (-2 * i / d)
            rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
            out[..., p, 2 * i : 2 * i + 2] = x[..., p, 2 * i : 2 * i + 2] @ rotation.T
    return out


@pytest.mark.parametrize("timescale", [10000, 50])
def test_positional_encoding_adds_the_sinusoids(base_device, timescale):
    config = PositionalEncodingConfig(6, max_sequence_size=40, max_timescale=timescale)
    encoding = config.init(base_device)
    x = np.random.default_rng(0).standard_normal((2, 37, 6)).astype(np.float32)
    out = encoding(Tensor.from_data(x, base_device))
    np.testing.assert_allclose(out.to_numpy(), x + sinusoids(37, 6, timescale), atol=1e-6)


def test_positional_encoding_table_is_accurate_at_far_positions():
    table = PositionalEncodingConfig(64).init(ember.device("ndarray", float_dtype="f64")).sinusoids
    np.testing.assert_allclose(table.to_numpy()[0], sinusoids(5000, 64, 10000.0), atol=1e-12)


def test_positional_encoding_passes_gradients_and_saves_nothing(ad_device):
    encoding = PositionalEncodingConfig(4, max_sequence_size=8).init(ad_device)
    x = Tensor.random([2, 3, 4], device=ad_device).require_grad()
    upstream = Tensor.random([2, 3, 4], device=ad_device)
    grads = (encoding(x) * upstream).sum().backward()
    np.testing.assert_allclose(x.grad(grads).to_numpy(), upstream.to_numpy(), rtol=1e-6)
    assert encoding.num_params() == 0 and encoding.into_record() == {}
    assert (
        encoding.sinusoids.device == ad_device
        and encoding.valid().sinusoids.device == ad_device.inner()
    )


def test_positional_encoding_errors():
    with pytest.raises(
        ConfigError, match=r"PositionalEncodingConfig.d_model: must be even .* got 5"
    ):
        PositionalEncodingConfig(5).init()
    encoding = PositionalEncodingConfig(4, max_sequence_size=3).init()
    with pytest.raises(
        ShapeError, match=r"the sequence has 4 positions, more than max_sequence_size \(3\)"
    ):
        encoding(Tensor.zeros([1, 4, 4]))
    with pytest.raises(
        ShapeError, match=r"PositionalEncoding: expected an input of shape \[batch, seq, 4\]"
    ):
        encoding(Tensor.zeros([3, 4]))
    assert PositionalEncodingConfig(8).max_sequence_size == 5000
    assert PositionalEncodingConfig(8).max_timescale == 10000


@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 5, 8)], ids=["rank2", "rank4"])
@pytest.mark.parametrize("start", [0, 4])
def test_rotary_encoding_matches_the_rotation(base_device, shape, start):
    rotary = RotaryEncodingConfig(16, 8).init(base_device)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    out = rotary.apply(Tensor.from_data(x, base_device), start)
    np.testing.assert_allclose(out.to_numpy(), rope(x, start, 10000.0), atol=1e-5)
    if start == 0:
        np.testing.assert_array_equal(
            rotary(Tensor.from_data(x, base_device)).to_numpy(), out.to_numpy()
        )


def test_rotary_encoding_with_another_theta_and_relative_positions():
    rotary = RotaryEncodingConfig(32, 4, theta=100.0).init()
    x = np.random.default_rng(2).standard_normal((1, 4)).astype(np.float32)
    np.testing.assert_allclose(
        rotary.apply(Tensor.from_data(x), 9).to_numpy(), rope(x, 9, 100.0), atol=1e-5
    )
    # the dot product of rotated q (position m) and k (position n) depends on m - n only
    q, k = Tensor.from_data(x), Tensor.from_data(x[:, ::-1].copy())
    dots = [float((rotary.apply(q, m) * rotary.apply(k, m - 3)).sum()) for m in (3, 10, 20)]
    np.testing.assert_allclose(dots, dots[0], atol=1e-4)


def test_rotary_encoding_gradient_is_the_inverse_rotation(ad_device):
    rotary = RotaryEncodingConfig(8, 4).init(ad_device)
    x = Tensor.random([2, 6, 4], device=ad_device).require_grad()
    upstream = np.random.default_rng(3).standard_normal((2, 6, 4)).astype(np.float32)
    grads = (rotary.apply(x, 2) * Tensor.from_data(upstream, ad_device)).sum().backward()
    # the gradient of a rotation is the upstream gradient rotated back (the transpose)
    expected = _rotate_back(upstream, start=2)
    np.testing.assert_allclose(x.grad(grads).to_numpy(), expected, atol=1e-5)


def _rotate_back(y: np.ndarray, start: int) -> np.ndarray:
    """The transpose of the rope rotation, one pair at a time."""
    out = np.empty_like(y, dtype=np.float64)
    d, seq = y.shape[-1], y.shape[-2]
    for p in range(seq):
        for i in range(d // 2):
            angle = (start + p) * 10000.0 ** (-2 * i / d)
            rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
            out[..., p, 2 * i : 2 * i + 2] = y[..., p, 2 * i : 2 * i + 2] @ rotation
    return out


def test_rotary_encoding_errors():
    with pytest.raises(ConfigError, match=r"RotaryEncodingConfig.d_model: must be even"):
        RotaryEncodingConfig(8, 3).init()
    with pytest.raises(ConfigError, match=r"RotaryEncodingConfig.theta: must be > 0"):
        RotaryEncodingConfig(8, 4, theta=0.0).init()
    rotary = RotaryEncodingConfig(8, 4).init()
    with pytest.raises(
        ShapeError, match=r"RotaryEncoding: positions 6..9 exceed max_sequence_length \(8\)"
    ):
        rotary.apply(Tensor.zeros([4, 4]), 6)
    with pytest.raises(
        ShapeError, match=r"RotaryEncoding: expected an input of shape \[\.\.\., seq, 4\]"
    ):
        rotary(Tensor.zeros([4, 6]))
    with pytest.raises(
        ShapeError, match=r"expected an input of shape \[\.\.\., seq, 4\] \(d_model\), got \[4\]"
    ):
        rotary(Tensor.zeros([4]))
    with pytest.raises(ArgumentError, match=r"RotaryEncoding: start must be >= 0, got -1"):
        rotary.apply(Tensor.zeros([2, 4]), -1)
    assert RotaryEncodingConfig(8, 4).theta == 10000.0
