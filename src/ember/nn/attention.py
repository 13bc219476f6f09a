"""Multi-head attention (Vaswani et al., 2017), its masks and its decoding cache."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ember.backend.device import Device, default_device
from ember.backend.errors import ArgumentError, ConfigError, KindError, ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt, Probability
from ember.module import Module
from ember.nn.dropout import Dropout
from ember.nn.initializer import Initializer, KaimingUniform
from ember.nn.linear import Linear, LinearConfig
from ember.record.adapter import PYTORCH
from ember.tensor import Kind, Tensor, TensorData
from ember.tensor.activation import quiet_softmax, softmax


@dataclass(frozen=True)
class MhaInput:
    """The inputs of :class:`MultiHeadAttention`: query, key, value and optional masks.

    Build self-attention inputs with :meth:`self_attn`; add masks with
    :meth:`with_mask_pad` and :meth:`with_mask_attn` (each returns a new input).

    Args:
        query: ``[batch, seq_q, d_model]``.
        key: ``[batch, seq_kv, d_model]``.
        value: ``[batch, seq_kv, d_model]``.
        mask_pad: Bool ``[batch, seq_kv]``, True where the key is padding (not attended).
        mask_attn: Bool ``[batch, seq_q, seq_kv]``, True where query ``i`` must not attend
            to key ``j`` (e.g. :func:`generate_autoregressive_mask`).
    """

    query: Tensor
    key: Tensor
    value: Tensor
    mask_pad: Tensor | None = None
    mask_attn: Tensor | None = None

    @staticmethod
    def self_attn(tensor: Tensor) -> MhaInput:
        """Query, key and value all equal to ``tensor``."""
        return MhaInput(tensor, tensor, tensor)

    def with_mask_pad(self, mask_pad: Tensor | None) -> MhaInput:
        return replace(self, mask_pad=mask_pad)

    def with_mask_attn(self, mask_attn: Tensor | None) -> MhaInput:
        return replace(self, mask_attn=mask_attn)


@dataclass(frozen=True)
class MhaOutput:
    """The result of :class:`MultiHeadAttention`.

    Args:
        context: ``[batch, seq_q, d_model]``, the attended values after the output projection.
        weights: ``[batch, n_heads, seq_q, seq_kv]``, the attention probabilities (before
            dropout); each row sums to 1 (less with ``quiet_softmax``).
    """

    context: Tensor
    weights: Tensor


class MhaCache:
    """What :meth:`MultiHeadAttention.forward_cache` remembers between decoding steps.

    It keeps the projected keys and values (``[batch, n_heads, seq_kv, d_k]``) and the
    outputs of the query positions already computed, so each step projects only the
    positions it has not seen. A cache belongs to one sequence (batch); start a new one
    for the next. It is mutable: ``forward_cache`` extends it.

    Example:
        >>> from ember.nn.attention import MhaCache
        >>> cache = MhaCache.autoregressive()
        >>> cache.query_len, cache.kv_len
        (0, 0)
    """

    def __init__(self) -> None:
        self.key: Tensor | None = None
        self.value: Tensor | None = None
        self.context: Tensor | None = None

    @staticmethod
    def autoregressive() -> MhaCache:
        """An empty cache (Burn's name for it)."""
        return MhaCache()

    @property
    def query_len(self) -> int:
        """The number of query positions whose outputs are cached."""
        return 0 if self.context is None else self.context.shape[1]

    @property
    def kv_len(self) -> int:
        """The number of key / value positions projected so far."""
        return 0 if self.key is None else self.key.shape[2]

    def __repr__(self) -> str:
        return f"MhaCache(query_len={self.query_len}, kv_len={self.kv_len})"


class MultiHeadAttentionConfig(Config):
    """Configuration of a :class:`MultiHeadAttention` layer.

    Args:
        d_model: the size of each query, key and value vector (and of the output).
        n_heads: the number of heads; must divide ``d_model``. Each head attends with
            ``d_k = d_model / n_heads`` features.
        dropout: the probability of dropping an attention weight while training.
            Default: 0.1 (as Burn; PyTorch's default is 0).
        min_float: the score given to masked positions before the softmax. Default:
            -1e4 (as Burn; PyTorch uses -inf). A large finite value keeps a fully masked
            row finite (uniform weights) where -inf would give NaN; it must stay within
            the range of the dtype (half precision ends near -65504).
        quiet_softmax: use the softmax with an extra zero logit, which lets a head attend
            to nothing (weights summing below 1). Default: False.
        initializer: how to fill the four projections' weights and biases. Default:
            ``KaimingUniform(gain=1/sqrt(3))``, as Burn (PyTorch draws the input
            projections from Xavier uniform and zeroes the biases).

    Raises:
        ConfigError: at ``init``, when ``n_heads`` does not divide ``d_model``.

    Example:
        >>> from ember.nn.attention import MultiHeadAttentionConfig
        >>> mha = MultiHeadAttentionConfig(16, 4).with_dropout(0.0).init()
        >>> mha.n_heads, mha.d_k, mha.query.weight.shape
        (4, 4, (16, 16))
    """

    d_model: PositiveInt
    n_heads: PositiveInt
    dropout: Probability = 0.1
    min_float: float = -1.0e4
    quiet_softmax: bool = False
    initializer: Initializer = KaimingUniform(gain=1 / math.sqrt(3))

    def init(self, device: Device | None = None) -> MultiHeadAttention:
        """A new :class:`MultiHeadAttention` with freshly initialized projections."""
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"MultiHeadAttentionConfig.n_heads: {self.n_heads} heads must divide "
                f"d_model ({self.d_model})",
                fields=("MultiHeadAttentionConfig.n_heads",),
            )
        linear = LinearConfig(self.d_model, self.d_model, initializer=self.initializer)
        return MultiHeadAttention(
            query=linear.init(device),
            key=linear.init(device),
            value=linear.init(device),
            output=linear.init(device),
            dropout=Dropout(self.dropout),
            n_heads=self.n_heads,
            min_float=self.min_float,
            quiet_softmax=self.quiet_softmax,
        )


class MultiHeadAttention(Module):
    """Scaled dot-product attention with several heads (Vaswani et al., 2017).

    The query, key and value are projected by their :class:`~ember.nn.linear.Linear`
    layers and split into ``n_heads`` heads of ``d_k = d_model / n_heads`` features. Where
    they are one tensor (self-attention), the three projections run as one product with
    their weights side by side, which is faster than three and gives the same values up to
    rounding (plain ``Linear`` layers only: a quantized or calibrating one runs as itself).
    Each head computes ``softmax(q kᵀ / sqrt(d_k))`` over the keys, with masked
    positions set to ``min_float`` first, and averages the values with those weights;
    the heads are joined again and projected by ``output``.

    While training (an autodiff device), dropout is applied to the attention weights
    after the softmax, as in PyTorch and the original paper; the returned weights are
    those before dropout.

    PyTorch's ``nn.MultiheadAttention`` keeps the three input projections in one
    ``in_proj_weight [3 * d_model, d_model]`` and ``in_proj_bias``; the PyTorch adapter
    splits them into ``query``, ``key`` and ``value`` (and ``out_proj`` loads as
    ``output``), so its state dicts load directly. PyTorch's ``add_bias_kv`` and
    ``add_zero_attn`` have no counterpart here.

    Args:
        query: the query projection, ``[d_model, d_model]``.
        key: the key projection, ``[d_model, d_model]``.
        value: the value projection, ``[d_model, d_model]``.
        output: the output projection, ``[d_model, d_model]``.
        dropout: dropout on the attention weights.
        n_heads: the number of heads.
        min_float: the score of masked positions.
        quiet_softmax: whether the weights use the quiet softmax.

    Shape:
        - Input: an :class:`MhaInput` with query ``[batch, seq_q, d_model]``, key and
          value ``[batch, seq_kv, d_model]``, ``mask_pad`` ``[batch, seq_kv]`` and
          ``mask_attn`` ``[batch, seq_q, seq_kv]``.
        - Output: an :class:`MhaOutput` with context ``[batch, seq_q, d_model]`` and
          weights ``[batch, n_heads, seq_q, seq_kv]``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.attention import MhaInput, MultiHeadAttentionConfig
        >>> from ember.nn.attention import generate_autoregressive_mask
        >>> device = ember.device("ndarray")
        >>> mha = MultiHeadAttentionConfig(8, 2).init(device)
        >>> x = Tensor.random([3, 5, 8], device=device)
        >>> mask = generate_autoregressive_mask(3, 5, device)
        >>> out = mha(MhaInput.self_attn(x).with_mask_attn(mask))
        >>> out.context.shape, out.weights.shape
        ((3, 5, 8), (3, 2, 5, 5))
        >>> [round(w, 3) for w in out.weights[0, 0, 1].tolist()[2:]]  # no weight on the future
        [0.0, 0.0, 0.0]
    """

    query: Linear
    key: Linear
    value: Linear
    output: Linear
    dropout: Dropout
    n_heads: int = 8
    min_float: float = -1.0e4
    quiet_softmax: bool = False

    @property
    def d_model(self) -> int:
        return self.query.d_input

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    def forward(self, input: MhaInput) -> MhaOutput:
        batch, seq_q, seq_kv = self._check(input)
        mask = _combined_mask(input.mask_pad, input.mask_attn, batch, seq_q, seq_kv)
        return self._forward_masked(input.query, input.key, input.value, mask)

    def forward_cache(self, input: MhaInput, cache: MhaCache) -> MhaOutput:
        """Attention for autoregressive decoding: only new positions are computed.

        ``input`` holds the whole sequences so far, as :meth:`forward` takes them;
        positions the cache has already seen are not projected or attended again:
        new keys and values are projected and appended to the cache, and only the new
        query positions attend (to every key). The outputs of earlier query positions
        come from the cache, which is valid when they cannot see later positions, e.g.
        with a causal ``mask_attn`` or for cross-attention over a fixed memory.

        Args:
            input: as for :meth:`forward`; ``mask_attn`` covers all query positions.
            cache: the cache of this sequence; extended in place.

        Returns:
            The :class:`MhaOutput` of every query position for the context, and the
            weights ``[batch, n_heads, new_positions, seq_kv]`` of the new positions only.

        Raises:
            ShapeError: the inputs are shorter than what the cache has seen, or the
                batch differs from the cache's.

        Example:
            >>> import ember
            >>> from ember import Tensor
            >>> from ember.nn.attention import MhaCache, MhaInput, MultiHeadAttentionConfig
            >>> device = ember.device("ndarray")
            >>> mha = MultiHeadAttentionConfig(8, 2).init(device)
            >>> x = Tensor.random([1, 4, 8], device=device)
            >>> cache = MhaCache()
            >>> for n in range(1, 5):
            ...     out = mha.forward_cache(MhaInput.self_attn(x[:, :n]), cache)
            >>> out.context.shape, out.weights.shape, cache
            ((1, 4, 8), (1, 2, 1, 4), MhaCache(query_len=4, kv_len=4))
        """
        batch, seq_q, seq_kv = self._check(input)
        seen_q, seen_kv = cache.query_len, cache.kv_len
        if seq_q < seen_q or seq_kv < seen_kv:
            raise ShapeError(
                f"MultiHeadAttention: the cache has seen {seen_q} query and {seen_kv} key "
                f"positions, the input has {seq_q} and {seq_kv}; pass the whole sequences so "
                "far (a new MhaCache starts a new sequence)"
            )
        if cache.key is not None and cache.key.shape[0] != batch:
            raise ShapeError(
                f"MultiHeadAttention: the cache holds a batch of {cache.key.shape[0]}, "
                f"the input a batch of {batch}"
            )
        mask = _combined_mask(input.mask_pad, input.mask_attn, batch, seq_q, seq_kv)
        if mask is not None and mask.shape[2] != 1:
            mask = mask[:, :, seen_q:]
        context, weights = self._attend_cached(
            input.query[:, seen_q:], input.key[:, seen_kv:], input.value[:, seen_kv:], cache, mask
        )
        cache.context = (
            context if cache.context is None else Tensor.cat([cache.context, context], 1)
        )
        return MhaOutput(cache.context, weights)

    # ------------------------------------------------------------------ internals
    def _forward_masked(self, query: Tensor, key: Tensor, value: Tensor,
                        mask: Tensor | None) -> MhaOutput:  # fmt: skip
        """:meth:`forward` on checked inputs with the masks already combined."""
        layers = (self.query, self.key, self.value)
        if query is key is value and _packable(layers):
            q, k, v = (self._heads(x) for x in self._projected_together(query, layers))
        else:
            q = self._heads(self.query(query))
            k = self._heads(self.key(key))
            v = self._heads(self.value(value))
        context, weights = self._attend(q, k, v, mask)
        return MhaOutput(self.output(context), weights)

    def _attend_cached(
        self, query: Tensor, key: Tensor, value: Tensor, cache: MhaCache, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The outputs of new query rows; new key / value rows are appended to ``cache``.

        ``mask`` is None or broadcasts to ``[batch, 1, new_queries, all_keys]``.
        """
        if key.shape[1]:
            k, v = self._heads(self.key(key)), self._heads(self.value(value))
            cache.key = k if cache.key is None else Tensor.cat([cache.key, k], 2)
            cache.value = v if cache.value is None else Tensor.cat([cache.value, v], 2)
        if cache.key is None:
            raise ShapeError("MultiHeadAttention: there are no keys to attend to")
        context, weights = self._attend(
            self._heads(self.query(query)), cache.key, cache.value, mask
        )
        return self.output(context), weights

    def _projected_together(self, x: Tensor, layers: tuple[Linear, ...]) -> list[Tensor]:
        """Self-attention's query, key and value projections (``layers``) of ``x`` as one
        product with the three weights side by side (and their biases), split after: one
        product three times as wide runs faster than three (PyTorch keeps the weights
        packed for it), and its weights' gradient is one product too."""
        weight = Tensor.cat([layer.weight.val() for layer in layers], 1)
        y = x.matmul(weight)
        if layers[0].bias is not None:
            y = y + Tensor.cat([layer.bias.val() for layer in layers], 0)
        return y.split(self.d_model, 2)

    def _heads(self, x: Tensor) -> Tensor:
        """``[batch, seq, d_model]`` as ``[batch, n_heads, seq, d_k]``."""
        batch, seq, _ = x.shape
        return x.reshape([batch, seq, self.n_heads, self.d_k]).swap_dims(1, 2)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The joined heads ``[batch, seq_q, d_model]`` (not yet projected) and the weights."""
        batch, _, seq_q, _ = q.shape
        # Scaling the queries costs seq_q * d_k products per head instead of seq_q * seq_kv.
        scores = (q * (1.0 / math.sqrt(self.d_k))).matmul(k.swap_dims(2, 3))
        if mask is not None:
            scores = scores.mask_fill(mask, self.min_float)
        weights = quiet_softmax(scores, -1) if self.quiet_softmax else softmax(scores, -1)
        context = self.dropout(weights).matmul(v)
        return context.swap_dims(1, 2).reshape([batch, seq_q, self.d_model]), weights

    def _check(self, input: MhaInput) -> tuple[int, int, int]:
        """``(batch, seq_q, seq_kv)`` after checking every shape and mask kind."""
        if not isinstance(input, MhaInput):
            raise ArgumentError(
                f"MultiHeadAttention: expected an MhaInput, got {type(input).__name__} "
                "(wrap a tensor with MhaInput.self_attn(x))"
            )
        d = self.d_model
        for name in ("query", "key", "value"):
            shape = getattr(input, name).shape
            if len(shape) != 3 or shape[2] != d:
                raise ShapeError(
                    f"MultiHeadAttention: expected the {name} of shape [batch, seq, {d}] "
                    f"(d_model), got {fmt_shape(shape)}"
                )
        (batch, seq_q, _), key, value = input.query.shape, input.key.shape, input.value.shape
        if key[0] != batch or value[:2] != key[:2]:
            raise ShapeError(
                f"MultiHeadAttention: the query {fmt_shape(input.query.shape)}, key "
                f"{fmt_shape(key)} and value {fmt_shape(value)} must share the batch, "
                "and the key and the value the sequence length"
            )
        seq_kv = key[1]
        owner = "MultiHeadAttention"
        _check_mask(owner, "mask_pad", input.mask_pad, (batch, seq_kv), "[batch, seq_kv]")
        _check_mask(
            owner, "mask_attn", input.mask_attn, (batch, seq_q, seq_kv), "[batch, seq_q, seq_kv]"
        )
        return batch, seq_q, seq_kv


def _packable(layers: tuple) -> bool:
    """Whether the projections can run as one product: plain :class:`Linear` layers (not a
    quantized or an observed one, which runs as itself), all with biases or none."""
    return all(type(layer) is Linear for layer in layers) and len(
        {layer.bias is None for layer in layers}) == 1  # fmt: skip


def _check_mask(owner: str, name: str, mask: Tensor | None, shape: tuple[int, ...],
                dims: str) -> None:  # fmt: skip
    """Checks that an optional mask is a Bool tensor of ``shape`` (``dims`` names its dims)."""
    if mask is None:
        return
    if mask.kind is not Kind.BOOL:
        raise KindError(f"{owner}: {name} must be a Bool tensor, got {mask.kind.value}")
    if mask.shape != shape:
        raise ShapeError(
            f"{owner}: expected {name} of shape {dims} = {fmt_shape(shape)}, "
            f"got {fmt_shape(mask.shape)}"
        )


def _combined_mask(mask_pad: Tensor | None, mask_attn: Tensor | None, batch: int, seq_q: int,
                   seq_kv: int) -> Tensor | None:  # fmt: skip
    """One mask broadcasting over the heads: a single fill of the scores, however many masks."""
    pad = None if mask_pad is None else mask_pad.reshape([batch, 1, 1, seq_kv])
    attn = None if mask_attn is None else mask_attn.reshape([batch, 1, seq_q, seq_kv])
    if pad is None or attn is None:
        return pad if attn is None else attn
    return pad | attn


def generate_autoregressive_mask(batch_size: int, seq_length: int,
                                 device: Device | None = None) -> Tensor:  # fmt: skip
    """The causal mask: Bool ``[batch_size, seq_length, seq_length]``, True above the diagonal.

    Position ``i`` may attend to positions ``0..i`` only; pass the mask as
    ``MhaInput.mask_attn``.

    Example:
        >>> from ember.nn.attention import generate_autoregressive_mask
        >>> generate_autoregressive_mask(1, 3)[0].tolist()
        [[False, True, True], [False, False, True], [False, False, False]]
    """
    if batch_size < 1 or seq_length < 1:
        raise ArgumentError(
            f"generate_autoregressive_mask: batch_size and seq_length must be >= 1, "
            f"got {batch_size} and {seq_length}"
        )
    device = device if device is not None else default_device()
    position = Tensor.arange(seq_length, device=device)
    future = position.reshape([1, seq_length]).greater(position.reshape([seq_length, 1]))
    return future.reshape([1, seq_length, seq_length]).expand([batch_size, seq_length, seq_length])


@dataclass(frozen=True)
class PaddingMask:
    """The result of :func:`generate_padding_mask`.

    Args:
        tensor: Int ``[batch, seq]``, the token ids padded with the pad token.
        mask: Bool ``[batch, seq]``, True at the padding positions.
    """

    tensor: Tensor
    mask: Tensor


def generate_padding_mask(pad_token: int, tokens_list: Sequence[Sequence[int]],
                          max_seq_length: int | None = None,
                          device: Device | None = None) -> PaddingMask:  # fmt: skip
    """Pads token sequences of different lengths into one batch, with the padding mask.

    Each sequence is padded with ``pad_token`` to the longest one, and cut to
    ``max_seq_length`` when that is given. The mask marks the positions past each
    sequence's end, so a real token equal to ``pad_token`` is not masked (Burn masks
    every element equal to the pad token).

    Example:
        >>> from ember.nn.attention import generate_padding_mask
        >>> padded = generate_padding_mask(0, [[5, 6, 7], [8]])
        >>> padded.tensor.tolist(), padded.mask.tolist()
        ([[5, 6, 7], [8, 0, 0]], [[False, False, False], [False, True, True]])
    """
    if not tokens_list:
        raise ArgumentError("generate_padding_mask: needs at least one sequence of tokens")
    if max_seq_length is not None and max_seq_length < 1:
        raise ArgumentError(
            f"generate_padding_mask: max_seq_length must be >= 1, got {max_seq_length}"
        )
    lengths = np.array([len(tokens) for tokens in tokens_list])
    width = int(lengths.max()) if max_seq_length is None else max_seq_length
    width = max(min(width, int(lengths.max())), 1)
    ids = np.full((len(tokens_list), width), pad_token, dtype=np.int64)
    for row, tokens in enumerate(tokens_list):  # one copy per sequence
        kept = list(tokens)[:width]
        ids[row, : len(kept)] = kept
    padding = np.arange(width)[None, :] >= lengths[:, None]
    device = device if device is not None else default_device()
    return PaddingMask(
        Tensor.from_data(ids, device, kind=Kind.INT), Tensor.from_data(TensorData(padding), device)
    )


def _split_rows(entry: Any, parts: int) -> list[Any] | None:
    """A record entry cut into ``parts`` equal blocks of rows; None if it does not divide."""
    data = entry["param"] if isinstance(entry, dict) else entry
    if not isinstance(data, TensorData) or data.rank == 0 or data.shape[0] % parts:
        return None
    array = data.to_numpy()
    size = data.shape[0] // parts
    return [TensorData._wrap(array[i * size : (i + 1) * size].copy()) for i in range(parts)]


_PROJECTIONS = ("query", "key", "value")


@PYTORCH.register(MultiHeadAttention)
def _from_pytorch(module: MultiHeadAttention, record: dict[str, Any]) -> dict[str, Any]:
    """PyTorch packs the input projections in one tensor and calls the output ``out_proj``.

    The pieces are handed to the Linear rule, which transposes the weights.
    """
    adapted: dict[str, Any] = {}
    for name, value in record.items():
        if name in ("in_proj_weight", "in_proj_bias") and (pieces := _split_rows(value, 3)):
            for projection, piece in zip(_PROJECTIONS, pieces):
                adapted.setdefault(projection, {})[name.removeprefix("in_proj_")] = piece
        elif name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
            projection = _PROJECTIONS["qkv".index(name[0])]
            adapted.setdefault(projection, {})["weight"] = value
        elif name == "out_proj":
            adapted["output"] = value
        else:  # left for the loader to report (e.g. bias_k, bias_v)
            adapted[name] = value
    return adapted
