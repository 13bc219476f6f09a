"""Quantization of a model: the weights of its linear, 2-d convolution and embedding
layers, by path (weight-only); with ``dynamic`` the linear layers' inputs too, at each call;
with ``activations`` the inputs of its linear and convolution layers, by parameters fixed by
calibration (static).

:func:`quantize_module` (``model.quantize(config)``) returns a copy of the model in which
every :class:`ember.nn.Linear` becomes a :class:`QuantizedLinear` and every
:class:`ember.nn.Conv2d` a :class:`QuantizedConv2d` and every :class:`ember.nn.Embedding` a
:class:`QuantizedEmbedding` (of the kinds ``layers`` names), except
those a pattern of ``skip`` names; a layer whose path matches a pattern of ``overrides``
takes that scheme instead of its kind's default. Patterns are shell-style (``fnmatch``) over dotted parameter paths
(``encoder.layers.0.ffn.linear_inner``). A pattern that matches no linear layer is an
error: a typo must not leave a layer unquantized silently.

Static quantization: given :class:`ActivationConfig`, each layer to quantize gets an
observer on its input; the float model runs on the ``calibration`` inputs (at most
``batches`` of them); each quantized layer's input scale and zero point then come from its
observer's range, and its products run in integers.

Example:
    >>> import ember
    >>> from ember import nn
    >>> from ember.quantization import QuantizeConfig, QuantScheme
    >>> model = nn.LinearConfig(16, 4).init(ember.device("ndarray"))
    >>> type(model.quantize(QuantizeConfig())).__name__
    'QuantizedLinear'
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import model_validator

from ember.backend.errors import ArgumentError
from ember.config import Config
from ember.module import Module, Param
from ember.module.module import _rebuild
from ember.quantization.conv import QuantizedConv2d
from ember.quantization.embedding import QuantizedEmbedding
from ember.quantization.linear import ROWS, QuantizedLinear
from ember.quantization.observers import MinMaxObserver, Observer, PercentileObserver
from ember.quantization.qtensor import quantize
from ember.quantization.scheme import QuantScheme
from ember.tensor import Tensor

__all__ = ["ActivationConfig", "QuantizeConfig", "quantize_module"]


class ActivationConfig(Config):
    """Static quantization of the layers' inputs.

    Args:
        scheme: the inputs' scheme: int8, per tensor. Default: affine (the range after a
            ReLU is all positive; a symmetric scheme would waste half the values).
        observer: ``"minmax"`` or ``"percentile"`` (see ``ember.quantization.observers``).
        percentile: the percentile observer's ``p``, in ``(50, 100]``.
        batches: at most this many calibration inputs are run.
    """

    scheme: QuantScheme = QuantScheme(mode="affine")
    observer: Literal["minmax", "percentile"] = "minmax"
    percentile: float = 99.99
    batches: int = 16

    @model_validator(mode="after")
    def _supported(self) -> ActivationConfig:
        if self.scheme.value != "int8" or self.scheme.granularity != "tensor":
            raise ValueError(f"activations are quantized int8 per tensor, got "
                             f"{self.scheme.describe()}")  # fmt: skip
        if not 50.0 < self.percentile <= 100.0:
            raise ValueError(f"percentile must lie in (50, 100], got {self.percentile}")
        if self.batches < 1:
            raise ValueError(f"batches must be at least 1, got {self.batches}")
        return self

    def observer_of(self) -> Observer:
        """A new observer of this config's kind."""
        if self.observer == "minmax":
            return MinMaxObserver()
        return PercentileObserver(self.percentile)


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
        activations: static quantization of the quantized linear and convolution layers'
            inputs (needs calibration inputs); None (the default) keeps them Float.
        dynamic: dynamic quantization of the quantized linear layers' inputs (PyTorch's
            ``quantize_dynamic``): each row quantized at each call (symmetric int8, a scale
            per row), then integer products; no calibration. Not with ``activations``.
    """

    scheme: QuantScheme = QuantScheme(granularity="axis", axis=-1)
    conv_scheme: QuantScheme = QuantScheme(granularity="axis", axis=0)
    embedding_scheme: QuantScheme = QuantScheme(granularity="axis", axis=0)
    layers: tuple[Literal["linear", "conv2d", "embedding"], ...] = ("linear", "conv2d", "embedding")
    skip: tuple[str, ...] = ()
    overrides: dict[str, QuantScheme] = {}
    activations: ActivationConfig | None = None
    dynamic: bool = False

    @model_validator(mode="after")
    def _one_input_mode(self) -> QuantizeConfig:
        if self.dynamic and self.activations is not None:
            raise ValueError("dynamic=True quantizes the inputs at each call; activations "
                             "fixes them by calibration: choose one")  # fmt: skip
        return self


def quantize_module(model: Any, config: QuantizeConfig, calibration: Iterable | None = None,
                    forward: Callable[[Any, Any], Any] | None = None) -> Any:  # fmt: skip
    """``model`` with its layers quantized by ``config`` (see the module doc).

    Args:
        model: a module.
        config: which layers, and how.
        calibration: with ``config.activations``, the inputs to calibrate on (a DataLoader's
            batches, say); the first ``activations.batches`` are run.
        forward: ``forward(model, item)`` runs the model on one calibration item; default
            ``model(item)``.

    Raises:
        ArgumentError: a pattern of ``skip`` or ``overrides`` matches no layer to quantize;
            static quantization without calibration inputs, or calibration inputs without
            it; an observer that saw no value.
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
    static: set[str] = set()

    def replace(path: str, module: Module) -> Module | None:
        kind = kinds.get(type(module))
        if kind is None or kind[0] not in config.layers:
            return None
        found.append(path)
        scheme = scheme_for(path, kind[1])
        if scheme is None:
            return module
        layer = kind[2].quantize(module, scheme)
        if kind[0] != "embedding":  # a layer whose input static quantization fixes
            static.add(path)
        if config.dynamic and kind[0] == "linear":
            layer = dataclasses.replace(layer, input_scheme=ROWS)
        return layer

    out = _rebuild(model, "", lambda _path, param: param, None, replace)
    unused = [p for p in (*config.skip, *config.overrides) if p not in used]
    if unused:
        names = ", ".join(found) or "none"
        raise ArgumentError(f"quantize: pattern(s) {', '.join(map(repr, unused))} match no "
                            f"layer to quantize (layers: {names})")  # fmt: skip
    if config.activations is None:
        if calibration is not None:
            raise ArgumentError("quantize: calibration inputs were given but config.activations "
                                "is None (weight-only quantization needs none)")  # fmt: skip
        return out
    if calibration is None:
        raise ArgumentError("quantize: static quantization (config.activations) needs "
                            "calibration inputs")  # fmt: skip
    ranges = _calibrate(model, static, config.activations, calibration, forward)

    def fix(path: str, module: Module) -> Module | None:
        if path not in ranges:
            return None
        return _with_input(module, config.activations.scheme, *ranges[path])

    return _rebuild(out, "", lambda _path, param: param, None, fix)


class _Observing(Module):
    """A layer whose inputs an observer sees (during calibration only)."""

    layer: Module
    observer: Observer

    def forward(self, x: Tensor) -> Tensor:
        self.observer.observe(x)
        return self.layer(x)

    def __getattr__(self, name: str) -> Any:
        # What the parent reads of its layer (``attention.query.d_input``) reads through.
        if name in ("layer", "observer") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.layer, name)


def _calibrate(model: Any, paths: set[str], config: ActivationConfig, calibration: Iterable,
               forward: Callable[[Any, Any], Any] | None) -> dict[str, tuple[float, float]]:  # fmt: skip
    """The range of the inputs of the layers at ``paths``, seen by observers while the float
    ``model`` runs on ``calibration`` (as PyTorch calibrates: the same ranges on every
    backend, whatever its quantized kernels)."""
    observers: dict[str, Observer] = {}

    def observe(path: str, module: Module) -> Module | None:
        if path not in paths:
            return None
        observers[path] = config.observer_of()
        return _Observing(module, observers[path])

    observed = _rebuild(model, "", lambda _path, param: param, None, observe)
    run = observed.no_grad() if isinstance(observed, Module) else observed
    seen = 0
    for item in itertools.islice(calibration, config.batches):
        forward(run, item) if forward is not None else run(item)
        seen += 1
    if seen == 0:
        raise ArgumentError("quantize: the calibration inputs are empty")
    ranges = {}
    for path, observer in observers.items():
        try:
            ranges[path] = observer.range()
        except ArgumentError as e:
            raise ArgumentError(f"quantize: layer {path or '(the model)'!r}: {e} (did the "
                                f"calibration run reach it?)") from e  # fmt: skip
    return ranges


def _with_input(layer: Module, scheme: QuantScheme, lo: float, hi: float) -> Module:
    """``layer`` with its input quantized by the parameters of the range ``[lo, hi]``
    (those :func:`~ember.quantization.quantize` computes for a tensor holding both ends)."""
    ends = quantize(Tensor.from_data([lo, hi], layer.scales.val().device), scheme)
    zero_point = None if ends.zero_points is None else Param(ends.zero_points, require_grad=False)
    return dataclasses.replace(layer, input_scheme=scheme,
                               input_scale=Param(ends.scales, require_grad=False),
                               input_zero_point=zero_point)  # fmt: skip
