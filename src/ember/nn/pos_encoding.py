"""Position encodings: sinusoids added to embeddings, and rotary encoding (RoPE)."""

from __future__ import annotations

import numpy as np

from ember.backend.device import Device, default_device
from ember.backend.errors import ArgumentError, ConfigError, ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt
from ember.module import Module
from ember.tensor import Kind, Tensor


def _need_even(owner: str, d_model: int) -> None:
    if d_model % 2:
        raise ConfigError(
            f"{owner}.d_model: must be even (features come in sin / cos pairs), got {d_model}",
            fields=(f"{owner}.d_model",),
        )


def _angles(length: int, d_model: int, base: float) -> np.ndarray:
    """``[length, d_model / 2]`` in float64: position ``p`` times ``base^(-2i / d_model)``."""
    inv_freq = base ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    return np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]


def _constant(values: np.ndarray, device: Device | None) -> Tensor:
    """A host table as a Float tensor in the device's default float dtype."""
    device = device if device is not None else default_device()
    return Tensor.from_data(values, device, kind=Kind.FLOAT)


class PositionalEncodingConfig(Config):
    """Configuration of a :class:`PositionalEncoding`.

    Args:
        d_model: the size of each embedding; must be even.
        max_sequence_size: the longest sequence the table covers. Default: 5000.
        max_timescale: the base of the wavelengths' geometric progression. Default: 10000.

    Raises:
        ConfigError: at ``init``, for an odd ``d_model``.

    Example:
        >>> from ember.nn.pos_encoding import PositionalEncodingConfig
        >>> PositionalEncodingConfig(16, max_sequence_size=64).init().sinusoids.shape
        (1, 64, 16)
    """

    d_model: PositiveInt
    max_sequence_size: PositiveInt = 5000
    max_timescale: PositiveInt = 10000

    def init(self, device: Device | None = None) -> PositionalEncoding:
        """A new :class:`PositionalEncoding` whose table lives on ``device``."""
        _need_even("PositionalEncodingConfig", self.d_model)
        angles = _angles(self.max_sequence_size, self.d_model, float(self.max_timescale))
        # Interleaved: feature 2i holds the sine of pair i, feature 2i + 1 its cosine.
        table = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(
            1, self.max_sequence_size, self.d_model
        )
        return PositionalEncoding(_constant(table, device))


class PositionalEncoding(Module):
    """Adds the fixed sinusoidal position encoding of Vaswani et al. (2017) to embeddings.

    For position ``p`` and pair ``i``, feature ``2i`` gets ``sin(p / T^(2i / d_model))``
    and feature ``2i + 1`` gets ``cos(p / T^(2i / d_model))``, where ``T`` is
    ``max_timescale``. The table is computed once, in float64, and kept as a constant
    (moved with the module, never saved or trained). PyTorch has no such layer.

    Args:
        sinusoids: the table, ``[1, max_sequence_size, d_model]``.

    Shape:
        - Input: ``[batch, seq, d_model]`` with ``seq <= max_sequence_size``.
        - Output: the input's shape.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.pos_encoding import PositionalEncodingConfig
        >>> device = ember.device("ndarray")
        >>> encoding = PositionalEncodingConfig(4, max_sequence_size=10).init(device)
        >>> out = encoding(Tensor.zeros([2, 3, 4], device))
        >>> [round(v, 3) for v in out[0, 1].tolist()]  # sin(1), cos(1), sin(0.01), cos(0.01)
        [0.841, 0.54, 0.01, 1.0]
    """

    sinusoids: Tensor

    @property
    def max_sequence_size(self) -> int:
        return self.sinusoids.shape[1]

    @property
    def d_model(self) -> int:
        return self.sinusoids.shape[2]

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        if len(shape) != 3 or shape[2] != self.d_model:
            raise ShapeError(
                f"PositionalEncoding: expected an input of shape [batch, seq, {self.d_model}] "
                f"(d_model), got {fmt_shape(shape)}"
            )
        if shape[1] > self.max_sequence_size:
            raise ShapeError(
                f"PositionalEncoding: the sequence has {shape[1]} positions, more than "
                f"max_sequence_size ({self.max_sequence_size})"
            )
        return x + self.sinusoids[:, : shape[1]]


class RotaryEncodingConfig(Config):
    """Configuration of a :class:`RotaryEncoding`.

    Args:
        max_sequence_length: the number of positions the table covers.
        d_model: the size of each vector to rotate (per head); must be even.
        theta: the base of the rotation frequencies. Default: 10000.

    Raises:
        ConfigError: at ``init``, for an odd ``d_model``.

    Example:
        >>> from ember.nn.pos_encoding import RotaryEncodingConfig
        >>> RotaryEncodingConfig(32, 8).init().cos.shape
        (32, 4, 1)
    """

    max_sequence_length: PositiveInt
    d_model: PositiveInt
    theta: float = 10000.0

    def init(self, device: Device | None = None) -> RotaryEncoding:
        """A new :class:`RotaryEncoding` with its cosine and sine tables on ``device``."""
        _need_even("RotaryEncodingConfig", self.d_model)
        if not self.theta > 0:
            raise ConfigError(
                f"RotaryEncodingConfig.theta: must be > 0, got {self.theta}",
                fields=("RotaryEncodingConfig.theta",),
            )
        angles = _angles(self.max_sequence_length, self.d_model, self.theta)[..., None]
        return RotaryEncoding(_constant(np.cos(angles), device), _constant(np.sin(angles), device))


class RotaryEncoding(Module):
    """Rotary position embedding, RoPE (Su et al., 2021).

    Features are taken in interleaved pairs ``(2i, 2i + 1)``, as Burn does (PyTorch
    code often pairs ``i`` with ``i + d_model / 2`` instead): at position ``p`` each
    pair is rotated by the angle ``p * theta^(-2i / d_model)``::

        out[2i]     = x[2i] * cos - x[2i + 1] * sin
        out[2i + 1] = x[2i] * sin + x[2i + 1] * cos

    so the dot product of a rotated query and key depends only on their distance.
    The tables are computed once, in float64, and kept as constants.

    Args:
        cos: ``[max_sequence_length, d_model / 2, 1]``, the cosines of the angles.
        sin: ``[max_sequence_length, d_model / 2, 1]``, their sines.

    Shape:
        - Input: ``[..., seq, d_model]``, rank >= 2 (e.g. ``[batch, heads, seq, d_k]``).
        - Output: the input's shape.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.pos_encoding import RotaryEncodingConfig
        >>> device = ember.device("ndarray")
        >>> rope = RotaryEncodingConfig(16, 2).init(device)
        >>> x = Tensor.from_data([[1.0, 0.0], [1.0, 0.0]], device)  # positions 0 and 1
        >>> [[round(v, 4) for v in row] for row in rope(x).tolist()]  # rotated by 0 and 1 rad
        [[1.0, 0.0], [0.5403, 0.8415]]
    """

    cos: Tensor
    sin: Tensor

    @property
    def max_sequence_length(self) -> int:
        return self.cos.shape[0]

    @property
    def d_model(self) -> int:
        return 2 * self.cos.shape[1]

    def forward(self, x: Tensor) -> Tensor:
        """Rotates positions ``0 .. seq - 1``; the same as ``apply(x, 0)``."""
        return self.apply(x, 0)

    def apply(self, x: Tensor, start: int = 0) -> Tensor:
        """Rotates the positions ``start .. start + seq - 1``.

        ``start`` lets a decoding step that sees only its new positions (with cached
        keys) rotate them by their place in the whole sequence.
        """
        shape = x.shape
        if len(shape) < 2 or shape[-1] != self.d_model:
            raise ShapeError(
                f"RotaryEncoding: expected an input of shape [..., seq, {self.d_model}] "
                f"(d_model), got {fmt_shape(shape)}"
            )
        seq = shape[-2]
        if start < 0:
            raise ArgumentError(f"RotaryEncoding: start must be >= 0, got {start}")
        if start + seq > self.max_sequence_length:
            raise ShapeError(
                f"RotaryEncoding: positions {start}..{start + seq - 1} exceed "
                f"max_sequence_length ({self.max_sequence_length})"
            )
        cos = self.cos.narrow(0, start, seq)
        sin = self.sin.narrow(0, start, seq)
        pairs = x.reshape([*shape[:-1], self.d_model // 2, 2])  # [..., seq, pairs, 2]
        even, odd = pairs.narrow(-1, 0, 1), pairs.narrow(-1, 1, 1)
        # (x_even, x_odd) -> (-x_odd, x_even): the rotation by 90 degrees, scaled by sin below.
        turned = Tensor.cat([-odd, even], -1)
        return (pairs * cos + turned * sin).reshape(shape)
