"""Distributions that ``Tensor.random`` samples from."""

from __future__ import annotations

from dataclasses import dataclass

from ember.backend.errors import ArgumentError


@dataclass(frozen=True)
class Distribution:
    """A sampling distribution. Build one with the class methods.

    ``kind`` is ``"default"`` (uniform on [0, 1)), ``"bernoulli"`` (1 with
    probability ``a``), ``"uniform"`` (uniform on [a, b)) or ``"normal"``
    (mean ``a``, standard deviation ``b``).

    Example:
        >>> Distribution.normal(0.0, 2.0)
        Distribution(kind='normal', a=0.0, b=2.0)
    """

    kind: str
    a: float = 0.0
    b: float = 1.0

    @staticmethod
    def default() -> Distribution:
        return Distribution("default", 0.0, 1.0)

    @staticmethod
    def bernoulli(prob: float) -> Distribution:
        if not 0.0 <= prob <= 1.0:
            raise ArgumentError(f"Bernoulli probability must lie in [0, 1], got {prob}")
        return Distribution("bernoulli", float(prob), 0.0)

    @staticmethod
    def uniform(low: float, high: float) -> Distribution:
        if not low < high:
            raise ArgumentError(f"Uniform needs low < high, got low={low}, high={high}")
        return Distribution("uniform", float(low), float(high))

    @staticmethod
    def normal(mean: float, std: float) -> Distribution:
        if not std >= 0.0:
            raise ArgumentError(f"Normal needs std >= 0, got {std}")
        return Distribution("normal", float(mean), float(std))
