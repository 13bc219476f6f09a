"""Weight-only (dynamic) quantization of a model: its linear, 2-d convolution and embedding
layers, by path.

:func:`quantize_module` (``model.quantize(config)``) returns a copy of the model in which
every :class:`ember.nn.Linear` becomes a :class:`QuantizedLinear` and every
:class:`ember.nn.Conv2d` a :class:`QuantizedConv2d` and every :class:`ember.nn.Embedding` a
:class:`QuantizedEmbedding` (of the kinds ``layers`` names), except
those a pattern of ``skip`` names; a layer whose path matches a pattern of ``overrides``
takes that scheme instead of its kind's default. Patterns are shell-style (``fnmatch``) over dotted parameter paths
(``encoder.layers.0.ffn.linear_inner``). A pattern that matches no linear layer is an
error: a typo must not leave a layer unquantized silently.

Example:
    >>> import ember
    >>> from ember import nn
    >>> from ember.quantization import QuantizeConfig, QuantScheme
    >>> model = nn.LinearConfig(16, 4).init(ember.device("ndarray"))
    >>> type(model.quantize(QuantizeConfig())).__name__
    'QuantizedLinear'
"""

from __future__ import annotations

import fnmatch
from typing import Any, Literal

from ember.backend.errors import ArgumentError
from ember.config import Config
from ember.module import Module
from ember.module.module import _rebuild
from ember.quantization.conv import QuantizedConv2d
from ember.quantization.embedding import QuantizedEmbedding
from ember.quantization.linear import QuantizedLinear
from ember.quantization.scheme import QuantScheme

__all__ = ["QuantizeConfig", "quantize_module"]


class QuantizeConfig(Config):
    """Which layers to quantize, and how.

    Args:
        scheme: the default scheme of a linear layer's weight ``[d_input, d_output]``.
            Default: int8 symmetric, one scale per output feature (``axis=-1``).
        conv_scheme: the default scheme of a convolution's weight ``[C_out, C_in / groups,
            KH, KW]``. Default: int8 symmetric, one scale per output channel (``axis=0``).
        embedding_scheme: the default scheme of an embedding table ``[n_embedding, d_model]``.
            Default: int8 symmetric, one scale per row (``axis=0``).
        layers: the kinds of layers to quantize: ``"linear"``, ``"conv2d"``,
            ``"embedding"``. Default: all three.
        skip: path patterns of layers left in float.
        overrides: path pattern -> scheme, for the layers it matches (the first matching
            pattern wins), e.g. int4 blocks along the input (``axis=0``) for large layers.
    """

    scheme: QuantScheme = QuantScheme(granularity="axis", axis=-1)
    conv_scheme: QuantScheme = QuantScheme(granularity="axis", axis=0)
    embedding_scheme: QuantScheme = QuantScheme(granularity="axis", axis=0)
    layers: tuple[Literal["linear", "conv2d", "embedding"], ...] = ("linear", "conv2d", "embedding")
    skip: tuple[str, ...] = ()
    overrides: dict[str, QuantScheme] = {}


def quantize_module(model: Any, config: QuantizeConfig) -> Any:
    """``model`` with its layers quantized by ``config`` (see the module doc).

    Raises:
        ArgumentError: a pattern of ``skip`` or ``overrides`` matches no layer to quantize.
        ShapeError: a scheme's axis or block size does not fit a layer's weight.
    """
    from ember.nn import Conv2d, Embedding, Linear

    kinds = {Linear: ("linear", config.scheme, QuantizedLinear),
             Conv2d: ("conv2d", config.conv_scheme, QuantizedConv2d),
             Embedding: ("embedding", config.embedding_scheme, QuantizedEmbedding)}  # fmt: skip
    used: set[str] = set()

    def scheme_for(path: str, default: QuantScheme) -> QuantScheme | None:
        for pattern in config.skip:
            if fnmatch.fnmatchcase(path, pattern):
                used.add(pattern)
                return None
        for pattern, scheme in config.overrides.items():
            if fnmatch.fnmatchcase(path, pattern):
                used.add(pattern)
                return scheme
        return default

    found: list[str] = []

    def replace(path: str, module: Module) -> Module | None:
        kind = kinds.get(type(module))
        if kind is None or kind[0] not in config.layers:
            return None
        found.append(path)
        scheme = scheme_for(path, kind[1])
        return module if scheme is None else kind[2].quantize(module, scheme)

    out = _rebuild(model, "", lambda _path, param: param, None, replace)
    unused = [p for p in (*config.skip, *config.overrides) if p not in used]
    if unused:
        names = ", ".join(found) or "none"
        raise ArgumentError(f"quantize: pattern(s) {', '.join(map(repr, unused))} match no "
                            f"layer to quantize (layers: {names})")  # fmt: skip
    return out
