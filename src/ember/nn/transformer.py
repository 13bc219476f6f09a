"""Transformer (Vaswani et al., 2017): feed-forward block, encoder and decoder stacks."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ember.backend.device import Device
from ember.backend.errors import ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt, Probability
from ember.module import Module
from ember.nn.attention import (
    MhaCache,
    MultiHeadAttention,
    MultiHeadAttentionConfig,
    _check_mask,
    _combined_mask,
)
from ember.nn.dropout import Dropout
from ember.nn.initializer import Initializer, KaimingUniform
from ember.nn.linear import Linear, LinearConfig
from ember.nn.norm import LayerNorm, LayerNormConfig
from ember.record.adapter import PYTORCH
from ember.tensor import Tensor
from ember.tensor.activation import gelu

_DEFAULT_INIT = KaimingUniform(gain=1 / math.sqrt(3))


# ---------------------------------------------------------------------- feed-forward
class PositionWiseFeedForwardConfig(Config):
    """Configuration of a :class:`PositionWiseFeedForward` block.

    Args:
        d_model: the size of each input and output vector.
        d_ff: the size of the hidden layer.
        dropout: the probability of dropping a hidden unit while training. Default: 0.1.
        initializer: how to fill both linear layers. Default: ``KaimingUniform(gain=1/sqrt(3))``.

    Example:
        >>> from ember.nn.transformer import PositionWiseFeedForwardConfig
        >>> pwff = PositionWiseFeedForwardConfig(8, 32).init()
        >>> pwff.linear_inner.weight.shape, pwff.linear_outer.weight.shape
        ((8, 32), (32, 8))
    """

    d_model: PositiveInt
    d_ff: PositiveInt
    dropout: Probability = 0.1
    initializer: Initializer = _DEFAULT_INIT

    def init(self, device: Device | None = None) -> PositionWiseFeedForward:
        """A new :class:`PositionWiseFeedForward` with freshly initialized layers."""
        inner = LinearConfig(self.d_model, self.d_ff, initializer=self.initializer)
        outer = LinearConfig(self.d_ff, self.d_model, initializer=self.initializer)
        dropout = Dropout(self.dropout)
        return PositionWiseFeedForward(inner.init(device), outer.init(device), dropout)


class PositionWiseFeedForward(Module):
    """The transformer's feed-forward block: ``linear_outer(dropout(gelu(linear_inner(x))))``.

    Applied to every position on its own. The activation is the exact GELU, as in Burn
    (PyTorch's transformer layers default to ReLU; build them with ``activation="gelu"``
    to compare).

    Args:
        linear_inner: ``d_model -> d_ff``.
        linear_outer: ``d_ff -> d_model``.
        dropout: dropout on the hidden units.

    Shape:
        - Input: ``[..., d_model]``.
        - Output: ``[..., d_model]``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.transformer import PositionWiseFeedForwardConfig
        >>> pwff = PositionWiseFeedForwardConfig(8, 32).init(ember.device("ndarray"))
        >>> pwff(Tensor.ones([2, 5, 8])).shape
        (2, 5, 8)
    """

    linear_inner: Linear
    linear_outer: Linear
    dropout: Dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_outer(self.dropout(gelu(self.linear_inner(x))))


def _residual(x: Tensor, block: Callable[[Tensor], Tensor], norm: LayerNorm, dropout: Dropout,
              norm_first: bool) -> Tensor:  # fmt: skip
    """One residual sub-block: ``x + dropout(block(norm(x)))`` (pre-norm) or
    ``norm(x + dropout(block(x)))`` (post-norm)."""
    if norm_first:
        return x + dropout(block(norm(x)))
    return norm(x + dropout(block(x)))


def _check_sequence(owner: str, name: str, x: Tensor, d_model: int) -> tuple[int, int]:
    if x.rank != 3 or x.shape[2] != d_model:
        raise ShapeError(
            f"{owner}: expected the {name} of shape [batch, seq, {d_model}] (d_model), "
            f"got {fmt_shape(x.shape)}"
        )
    return x.shape[0], x.shape[1]


def _check_progress(owner: str, seen: int, seq: int, batch: int, cached_batch: int | None) -> None:
    """The input of a cached step must extend the sequence the cache has seen."""
    if seq < seen:
        raise ShapeError(
            f"{owner}: the cache has seen {seen} positions, the input has {seq}; pass the "
            "whole sequence so far (a new cache starts a new sequence)"
        )
    if cached_batch is not None and cached_batch != batch:
        raise ShapeError(
            f"{owner}: the cache holds a batch of {cached_batch}, the input a batch of {batch}"
        )


def _rows_from(mask: Tensor | None, start: int) -> Tensor | None:
    """The rows of the query positions from ``start`` of a combined mask."""
    if mask is None or mask.shape[2] == 1:
        return mask
    return mask[:, :, start:]


def _append(cached: Tensor | None, new: Tensor) -> Tensor:
    return new if cached is None else Tensor.cat([cached, new], 1)


# ---------------------------------------------------------------------- encoder
@dataclass(frozen=True)
class TransformerEncoderInput:
    """The input of :class:`TransformerEncoder`.

    Args:
        tensor: ``[batch, seq, d_model]``.
        mask_pad: Bool ``[batch, seq]``, True at padding positions (not attended).
        mask_attn: Bool ``[batch, seq, seq]``, True where position ``i`` must not attend
            to ``j`` (e.g. a causal mask).
    """

    tensor: Tensor
    mask_pad: Tensor | None = None
    mask_attn: Tensor | None = None

    def with_mask_pad(self, mask_pad: Tensor | None) -> TransformerEncoderInput:
        return replace(self, mask_pad=mask_pad)

    def with_mask_attn(self, mask_attn: Tensor | None) -> TransformerEncoderInput:
        return replace(self, mask_attn=mask_attn)


class TransformerEncoderAutoregressiveCache:
    """What :meth:`TransformerEncoder.forward_autoregressive_inference` keeps between steps.

    One :class:`~ember.nn.attention.MhaCache` per layer and the outputs computed so far;
    mutable, one per sequence. Make one with
    :meth:`TransformerEncoder.new_autoregressive_cache`.
    """

    def __init__(self, n_layers: int) -> None:
        self.layers = [MhaCache() for _ in range(n_layers)]
        self.output: Tensor | None = None

    @property
    def seq_len(self) -> int:
        """The number of positions whose outputs are cached."""
        return 0 if self.output is None else self.output.shape[1]


class _StackConfig(Config):
    """The fields shared by the encoder and decoder configs, with Burn's defaults."""

    d_model: PositiveInt
    d_ff: PositiveInt
    n_heads: PositiveInt
    n_layers: PositiveInt
    dropout: Probability = 0.1
    norm_first: bool = False
    quiet_softmax: bool = False
    initializer: Initializer = _DEFAULT_INIT

    def _mha(self) -> MultiHeadAttentionConfig:
        return MultiHeadAttentionConfig(
            self.d_model, self.n_heads, dropout=self.dropout, quiet_softmax=self.quiet_softmax,
            initializer=self.initializer,
        )  # fmt: skip

    def _pwff(self) -> PositionWiseFeedForwardConfig:
        return PositionWiseFeedForwardConfig(
            self.d_model, self.d_ff, dropout=self.dropout, initializer=self.initializer
        )


class TransformerEncoderConfig(_StackConfig):
    """Configuration of a :class:`TransformerEncoder`.

    Args:
        d_model: the size of each position's vector.
        d_ff: the hidden size of the feed-forward blocks.
        n_heads: the number of attention heads; must divide ``d_model``.
        n_layers: the number of layers.
        dropout: the dropout probability of the attention weights, the feed-forward
            hidden units and the residual branches. Default: 0.1.
        norm_first: normalize at the start of each residual branch (pre-norm) instead of
            after the residual sum (post-norm, the original paper). Default: False.
        quiet_softmax: use the quiet softmax in the attention. Default: False.
        initializer: how to fill every linear layer. Default:
            ``KaimingUniform(gain=1/sqrt(3))`` (PyTorch draws attention projections
            from Xavier uniform).

    Raises:
        ConfigError: at ``init``, when ``n_heads`` does not divide ``d_model``.

    Example:
        >>> from ember.nn.transformer import TransformerEncoderConfig
        >>> encoder = TransformerEncoderConfig(16, 32, 4, 2).init()
        >>> len(encoder.layers), encoder.num_params()
        (2, 4448)
    """

    def init(self, device: Device | None = None) -> TransformerEncoder:
        """A new :class:`TransformerEncoder` with freshly initialized layers."""
        return TransformerEncoder([self._layer(device) for _ in range(self.n_layers)], self.d_model)

    def _layer(self, device: Device | None) -> TransformerEncoderLayer:
        norm = LayerNormConfig(self.d_model)
        return TransformerEncoderLayer(
            mha=self._mha().init(device),
            pwff=self._pwff().init(device),
            norm_1=norm.init(device),
            norm_2=norm.init(device),
            dropout=Dropout(self.dropout),
            norm_first=self.norm_first,
        )


class TransformerEncoderLayer(Module):
    """One encoder layer: self-attention, then the feed-forward block, each residual.

    Post-norm: ``x = norm_1(x + dropout(mha(x)))``, ``x = norm_2(x + dropout(pwff(x)))``;
    pre-norm (``norm_first``): ``x = x + dropout(mha(norm_1(x)))``,
    ``x = x + dropout(pwff(norm_2(x)))``. The PyTorch adapter loads the weights of
    ``torch.nn.TransformerEncoderLayer`` (``self_attn``, ``linear1``, ``linear2``,
    ``norm1``, ``norm2``).
    """

    mha: MultiHeadAttention
    pwff: PositionWiseFeedForward
    norm_1: LayerNorm
    norm_2: LayerNorm
    dropout: Dropout
    norm_first: bool = False

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``mask``: the combined attention mask, broadcasting to ``[batch, 1, seq, seq]``."""

        def attend(h: Tensor) -> Tensor:
            return self.mha._forward_masked(h, h, h, mask).context

        x = self._sub_block(x, attend, self.norm_1)
        return self._sub_block(x, self.pwff, self.norm_2)

    def _forward_cached(self, x: Tensor, cache: MhaCache, mask: Tensor | None) -> Tensor:
        """The outputs of the new positions ``x``, attending to the cached ones too."""

        def attend(h: Tensor) -> Tensor:
            return self.mha._attend_cached(h, h, h, cache, mask)[0]

        x = self._sub_block(x, attend, self.norm_1)
        return self._sub_block(x, self.pwff, self.norm_2)

    def _sub_block(self, x: Tensor, block: Callable[[Tensor], Tensor], norm: LayerNorm) -> Tensor:
        return _residual(x, block, norm, self.dropout, self.norm_first)


class TransformerEncoder(Module):
    """A stack of :class:`TransformerEncoderLayer` (Vaswani et al., 2017).

    Build it with :class:`TransformerEncoderConfig`. Dropout is active on an autodiff
    device only. There is no final layer norm (PyTorch's ``norm`` argument), as in Burn.
    ``torch.nn.TransformerEncoder`` state dicts (``layers.N.self_attn...``) load through
    the PyTorch adapter, from layers made with ``batch_first=True`` and
    ``activation="gelu"``.

    Args:
        layers: the layers, applied in order.
        d_model: the size of each position's vector.

    Shape:
        - Input: a :class:`TransformerEncoderInput` with tensor ``[batch, seq, d_model]``.
        - Output: ``[batch, seq, d_model]``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.transformer import TransformerEncoderConfig, TransformerEncoderInput
        >>> device = ember.device("ndarray")
        >>> encoder = TransformerEncoderConfig(16, 32, 4, 2).init(device)
        >>> x = Tensor.random([3, 7, 16], device=device)
        >>> encoder(TransformerEncoderInput(x)).shape
        (3, 7, 16)
    """

    layers: list[TransformerEncoderLayer]
    d_model: int

    def forward(self, input: TransformerEncoderInput) -> Tensor:
        x = input.tensor
        mask = self._mask(input)
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def new_autoregressive_cache(self) -> TransformerEncoderAutoregressiveCache:
        """An empty cache for :meth:`forward_autoregressive_inference`."""
        return TransformerEncoderAutoregressiveCache(len(self.layers))

    def forward_autoregressive_inference(
        self, input: TransformerEncoderInput, cache: TransformerEncoderAutoregressiveCache
    ) -> Tensor:
        """:meth:`forward` for a sequence that grows step by step, computing only new positions.

        ``input.tensor`` holds the whole sequence so far; positions the cache has seen
        keep their outputs, and new ones attend to the cached keys and values of every
        layer. This equals :meth:`forward` when no position attends to a later one: pass
        a causal ``mask_attn`` (:func:`~ember.nn.attention.generate_autoregressive_mask`).

        Returns:
            ``[batch, seq, d_model]``, the outputs of every position so far.
        """
        mask = self._mask(input)
        batch, seq = input.tensor.shape[:2]
        seen = cache.seq_len
        _check_progress("TransformerEncoder", seen, seq, batch,
                        None if cache.output is None else cache.output.shape[0])  # fmt: skip
        x = input.tensor[:, seen:]
        rows = _rows_from(mask, seen)
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer._forward_cached(x, layer_cache, rows)
        cache.output = _append(cache.output, x)
        return cache.output

    def _mask(self, input: TransformerEncoderInput) -> Tensor | None:
        owner = "TransformerEncoder"
        batch, seq = _check_sequence(owner, "tensor", input.tensor, self.d_model)
        _check_mask(owner, "mask_pad", input.mask_pad, (batch, seq), "[batch, seq]")
        _check_mask(owner, "mask_attn", input.mask_attn, (batch, seq, seq), "[batch, seq, seq]")
        return _combined_mask(input.mask_pad, input.mask_attn, batch, seq, seq)


# ---------------------------------------------------------------------- decoder
@dataclass(frozen=True)
class TransformerDecoderInput:
    """The input of :class:`TransformerDecoder`.

    Args:
        target: ``[batch, seq_tgt, d_model]``, the sequence being decoded.
        memory: ``[batch, seq_mem, d_model]``, the encoder's output.
        target_mask_pad: Bool ``[batch, seq_tgt]``, True at target padding.
        target_mask_attn: Bool ``[batch, seq_tgt, seq_tgt]``, usually the causal mask of
            :func:`~ember.nn.attention.generate_autoregressive_mask`.
        memory_mask_pad: Bool ``[batch, seq_mem]``, True at memory padding.
        memory_mask_attn: Bool ``[batch, seq_tgt, seq_mem]``.
    """

    target: Tensor
    memory: Tensor
    target_mask_pad: Tensor | None = None
    target_mask_attn: Tensor | None = None
    memory_mask_pad: Tensor | None = None
    memory_mask_attn: Tensor | None = None

    def with_target_mask_pad(self, mask: Tensor | None) -> TransformerDecoderInput:
        return replace(self, target_mask_pad=mask)

    def with_target_mask_attn(self, mask: Tensor | None) -> TransformerDecoderInput:
        return replace(self, target_mask_attn=mask)

    def with_memory_mask_pad(self, mask: Tensor | None) -> TransformerDecoderInput:
        return replace(self, memory_mask_pad=mask)

    def with_memory_mask_attn(self, mask: Tensor | None) -> TransformerDecoderInput:
        return replace(self, memory_mask_attn=mask)


class TransformerDecoderLayerAutoregressiveCache:
    """The attention caches of one decoder layer: its own keys, and the projected memory."""

    def __init__(self) -> None:
        self.self_attn = MhaCache()
        self.cross_attn = MhaCache()


class TransformerDecoderAutoregressiveCache:
    """What :meth:`TransformerDecoder.forward_autoregressive_inference` keeps between steps.

    One cache per layer and the outputs computed so far; mutable, one per sequence.
    Make one with :meth:`TransformerDecoder.new_autoregressive_cache`.
    """

    def __init__(self, n_layers: int) -> None:
        self.layers = [TransformerDecoderLayerAutoregressiveCache() for _ in range(n_layers)]
        self.output: Tensor | None = None

    @property
    def seq_len(self) -> int:
        """The number of target positions whose outputs are cached."""
        return 0 if self.output is None else self.output.shape[1]


class TransformerDecoderConfig(_StackConfig):
    """Configuration of a :class:`TransformerDecoder`.

    Args:
        d_model: the size of each position's vector (target and memory).
        d_ff: the hidden size of the feed-forward blocks.
        n_heads: the number of attention heads; must divide ``d_model``.
        n_layers: the number of layers.
        dropout: the dropout probability of the attention weights, the feed-forward
            hidden units and the residual branches. Default: 0.1.
        norm_first: pre-norm instead of post-norm residual blocks. Default: False.
        quiet_softmax: use the quiet softmax in the attention. Default: False.
        initializer: how to fill every linear layer. Default:
            ``KaimingUniform(gain=1/sqrt(3))``.

    Raises:
        ConfigError: at ``init``, when ``n_heads`` does not divide ``d_model``.

    Example:
        >>> from ember.nn.transformer import TransformerDecoderConfig
        >>> decoder = TransformerDecoderConfig(16, 32, 4, 2).with_norm_first(True).init()
        >>> len(decoder.layers), decoder.layers[0].norm_first
        (2, True)
    """

    def init(self, device: Device | None = None) -> TransformerDecoder:
        """A new :class:`TransformerDecoder` with freshly initialized layers."""
        return TransformerDecoder([self._layer(device) for _ in range(self.n_layers)], self.d_model)

    def _layer(self, device: Device | None) -> TransformerDecoderLayer:
        norm = LayerNormConfig(self.d_model)
        return TransformerDecoderLayer(
            self_attn=self._mha().init(device),
            cross_attn=self._mha().init(device),
            pwff=self._pwff().init(device),
            norm_1=norm.init(device),
            norm_2=norm.init(device),
            norm_3=norm.init(device),
            dropout=Dropout(self.dropout),
            norm_first=self.norm_first,
        )


class TransformerDecoderLayer(Module):
    """One decoder layer: self-attention, cross-attention over the memory, feed-forward.

    Each sub-block is residual, with ``norm_1``, ``norm_2``, ``norm_3`` after the sum
    (post-norm) or at the start of the branch (``norm_first``). The memory itself is
    not normalized. The PyTorch adapter loads ``torch.nn.TransformerDecoderLayer``
    weights (``self_attn``, ``multihead_attn``, ``linear1``, ``linear2``, ``norm1..3``).
    """

    self_attn: MultiHeadAttention
    cross_attn: MultiHeadAttention
    pwff: PositionWiseFeedForward
    norm_1: LayerNorm
    norm_2: LayerNorm
    norm_3: LayerNorm
    dropout: Dropout
    norm_first: bool = False

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor | None = None,
                cross_mask: Tensor | None = None) -> Tensor:  # fmt: skip
        """Masks: combined, broadcasting to ``[batch, 1, seq_tgt, seq_tgt | seq_mem]``."""

        def attend_self(h: Tensor) -> Tensor:
            return self.self_attn._forward_masked(h, h, h, self_mask).context

        def attend_memory(h: Tensor) -> Tensor:
            return self.cross_attn._forward_masked(h, memory, memory, cross_mask).context

        x = self._sub_block(x, attend_self, self.norm_1)
        x = self._sub_block(x, attend_memory, self.norm_2)
        return self._sub_block(x, self.pwff, self.norm_3)

    def _forward_cached(self, x: Tensor, memory: Tensor,
                        cache: TransformerDecoderLayerAutoregressiveCache,
                        self_mask: Tensor | None, cross_mask: Tensor | None) -> Tensor:  # fmt: skip
        """The outputs of the new target positions ``x``."""
        fresh = memory[:, cache.cross_attn.kv_len :]  # empty after the first step: projected once

        def attend_self(h: Tensor) -> Tensor:
            return self.self_attn._attend_cached(h, h, h, cache.self_attn, self_mask)[0]

        def attend_memory(h: Tensor) -> Tensor:
            return self.cross_attn._attend_cached(h, fresh, fresh, cache.cross_attn, cross_mask)[0]

        x = self._sub_block(x, attend_self, self.norm_1)
        x = self._sub_block(x, attend_memory, self.norm_2)
        return self._sub_block(x, self.pwff, self.norm_3)

    def _sub_block(self, x: Tensor, block: Callable[[Tensor], Tensor], norm: LayerNorm) -> Tensor:
        return _residual(x, block, norm, self.dropout, self.norm_first)


class TransformerDecoder(Module):
    """A stack of :class:`TransformerDecoderLayer` (Vaswani et al., 2017).

    Build it with :class:`TransformerDecoderConfig`. As in Burn, the causal mask is not
    implied: pass ``target_mask_attn`` (e.g. from
    :func:`~ember.nn.attention.generate_autoregressive_mask`). There is no final layer
    norm. ``torch.nn.TransformerDecoder`` state dicts load through the PyTorch adapter.

    Args:
        layers: the layers, applied in order.
        d_model: the size of each position's vector.

    Shape:
        - Input: a :class:`TransformerDecoderInput` with target ``[batch, seq_tgt, d_model]``
          and memory ``[batch, seq_mem, d_model]``.
        - Output: ``[batch, seq_tgt, d_model]``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.attention import generate_autoregressive_mask
        >>> from ember.nn.transformer import TransformerDecoderConfig, TransformerDecoderInput
        >>> device = ember.device("ndarray")
        >>> decoder = TransformerDecoderConfig(16, 32, 4, 2).init(device)
        >>> target = Tensor.random([2, 5, 16], device=device)
        >>> memory = Tensor.random([2, 9, 16], device=device)
        >>> causal = generate_autoregressive_mask(2, 5, device)
        >>> decoder(TransformerDecoderInput(target, memory, target_mask_attn=causal)).shape
        (2, 5, 16)
    """

    layers: list[TransformerDecoderLayer]
    d_model: int

    def forward(self, input: TransformerDecoderInput) -> Tensor:
        self_mask, cross_mask = self._masks(input)
        x = input.target
        for layer in self.layers:
            x = layer(x, input.memory, self_mask, cross_mask)
        return x

    def new_autoregressive_cache(self) -> TransformerDecoderAutoregressiveCache:
        """An empty cache for :meth:`forward_autoregressive_inference`."""
        return TransformerDecoderAutoregressiveCache(len(self.layers))

    def forward_autoregressive_inference(
        self, input: TransformerDecoderInput, cache: TransformerDecoderAutoregressiveCache
    ) -> Tensor:
        """:meth:`forward` for a target that grows step by step, computing only new positions.

        ``input.target`` holds the whole target so far and ``input.memory`` the same
        memory at every step (it is projected once, at the first step). Earlier target
        positions keep their cached outputs, and new ones attend to the cached keys and
        values of every layer. This equals :meth:`forward` with a causal
        ``target_mask_attn``, which should be passed as there.

        Returns:
            ``[batch, seq_tgt, d_model]``, the outputs of every target position so far.

        Example:
            >>> import ember
            >>> from ember import Tensor
            >>> from ember.nn.transformer import TransformerDecoderConfig, TransformerDecoderInput
            >>> device = ember.device("ndarray")
            >>> decoder = TransformerDecoderConfig(16, 32, 4, 2).init(device)
            >>> target = Tensor.random([1, 3, 16], device=device)
            >>> memory = Tensor.random([1, 4, 16], device=device)
            >>> cache = decoder.new_autoregressive_cache()
            >>> for n in (1, 2, 3):
            ...     out = decoder.forward_autoregressive_inference(
            ...         TransformerDecoderInput(target[:, :n], memory), cache)
            >>> out.shape, cache.seq_len
            ((1, 3, 16), 3)
        """
        self_mask, cross_mask = self._masks(input)
        batch, seq = input.target.shape[:2]
        seen = cache.seq_len
        _check_progress("TransformerDecoder", seen, seq, batch,
                        None if cache.output is None else cache.output.shape[0])  # fmt: skip
        kv_len = cache.layers[0].cross_attn.kv_len if cache.layers else 0
        if input.memory.shape[1] < kv_len:
            raise ShapeError(
                f"TransformerDecoder: the cache holds a memory of {kv_len} positions, the "
                f"input one of {input.memory.shape[1]}; pass the same memory at every step"
            )
        x = input.target[:, seen:]
        self_rows, cross_rows = _rows_from(self_mask, seen), _rows_from(cross_mask, seen)
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer._forward_cached(x, input.memory, layer_cache, self_rows, cross_rows)
        cache.output = _append(cache.output, x)
        return cache.output

    def _masks(self, input: TransformerDecoderInput) -> tuple[Tensor | None, Tensor | None]:
        owner = "TransformerDecoder"
        batch, seq = _check_sequence(owner, "target", input.target, self.d_model)
        batch_mem, seq_mem = _check_sequence(owner, "memory", input.memory, self.d_model)
        if batch_mem != batch:
            raise ShapeError(
                f"{owner}: the target {fmt_shape(input.target.shape)} and the memory "
                f"{fmt_shape(input.memory.shape)} must share the batch"
            )
        _check_mask(
            owner, "target_mask_pad", input.target_mask_pad, (batch, seq), "[batch, seq_tgt]"
        )
        _check_mask(owner, "target_mask_attn", input.target_mask_attn, (batch, seq, seq),
                    "[batch, seq_tgt, seq_tgt]")  # fmt: skip
        _check_mask(owner, "memory_mask_pad", input.memory_mask_pad, (batch, seq_mem),
                    "[batch, seq_mem]")  # fmt: skip
        _check_mask(owner, "memory_mask_attn", input.memory_mask_attn, (batch, seq, seq_mem),
                    "[batch, seq_tgt, seq_mem]")  # fmt: skip
        return (
            _combined_mask(input.target_mask_pad, input.target_mask_attn, batch, seq, seq),
            _combined_mask(input.memory_mask_pad, input.memory_mask_attn, batch, seq, seq_mem),
        )


# ---------------------------------------------------------------------- PyTorch weights
def _feed_forward_from_pytorch(record: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """PyTorch's layer keeps the feed-forward linears and the norms at its own level."""
    adapted: dict[str, Any] = {}
    pwff: dict[str, Any] = {}
    for name, value in record.items():
        if name == "linear1":
            pwff["linear_inner"] = value
        elif name == "linear2":
            pwff["linear_outer"] = value
        else:
            adapted[renamed.get(name, name)] = value
    if pwff:
        adapted["pwff"] = pwff
    return adapted


@PYTORCH.register(TransformerEncoderLayer)
def _encoder_layer_from_pytorch(
    module: TransformerEncoderLayer, record: dict[str, Any]
) -> dict[str, Any]:
    return _feed_forward_from_pytorch(
        record, {"self_attn": "mha", "norm1": "norm_1", "norm2": "norm_2"}
    )


@PYTORCH.register(TransformerDecoderLayer)
def _decoder_layer_from_pytorch(
    module: TransformerDecoderLayer, record: dict[str, Any]
) -> dict[str, Any]:
    return _feed_forward_from_pytorch(
        record,
        {"multihead_attn": "cross_attn", "norm1": "norm_1", "norm2": "norm_2", "norm3": "norm_3"},
    )
