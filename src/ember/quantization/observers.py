"""Observers: the range of an activation, seen over calibration batches.

Static quantization fixes each quantized layer's input parameters (scale, zero point)
before inference, from the values the layer saw on a few calibration batches. An observer
sees every batch (:meth:`Observer.observe`) and then gives the range ``(lo, hi)`` to cover
(:meth:`Observer.range`), from which :func:`activation_params` computes the parameters
with the formulas of :func:`~ember.quantization.quantize`.

* :class:`MinMaxObserver`: the smallest and largest value seen (nothing saturates on the
  calibration data; one outlier widens every step);
* :class:`PercentileObserver`: per batch, the ``100 - p`` and ``p`` percentiles, averaged
  over the batches (outliers saturate; finer steps for the rest). Memory is one batch.

Example:
    >>> from ember import Tensor
    >>> from ember.quantization import MinMaxObserver
    >>> observer = MinMaxObserver()
    >>> observer.observe(Tensor.from_data([[-1.0, 0.5], [2.0, 3.0]]))
    >>> observer.observe(Tensor.from_data([4.0, 0.0]))
    >>> observer.range()
    (-1.0, 4.0)
"""

from __future__ import annotations

import math

import numpy as np

from ember.backend.errors import ArgumentError, KindError
from ember.tensor import Kind, Tensor

__all__ = ["MinMaxObserver", "Observer", "PercentileObserver"]


class Observer:
    """The range of the values seen (see the module doc); a subclass says how."""

    def __init__(self) -> None:
        self.batches = 0

    def observe(self, x: Tensor) -> None:
        """Takes one batch of values (a Float tensor; NaN and infinities are refused)."""
        if not isinstance(x, Tensor) or x.kind is not Kind.FLOAT:
            kind = x.kind.value if isinstance(x, Tensor) else type(x).__name__
            raise KindError(f"{type(self).__name__}: expected a Float tensor, got {kind}")
        if x.num_elements() == 0:
            return
        self._observe(x)
        self.batches += 1

    def range(self) -> tuple[float, float]:
        """``(lo, hi)``: the range to cover.

        Raises:
            ArgumentError: nothing was observed.
        """
        if self.batches == 0:
            raise ArgumentError(f"{type(self).__name__}: no values were observed (calibration "
                                "saw no batch, or only empty ones)")  # fmt: skip
        return self._range()

    def _observe(self, x: Tensor) -> None:
        raise NotImplementedError

    def _range(self) -> tuple[float, float]:
        raise NotImplementedError


def _finite(observer: Observer, lo: float, hi: float) -> tuple[float, float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ArgumentError(f"{type(observer).__name__}: the calibration values hold NaN or "
                            f"infinity (range [{lo}, {hi}])")  # fmt: skip
    return lo, hi


class MinMaxObserver(Observer):
    """The smallest and largest value of every batch seen."""

    def __init__(self) -> None:
        super().__init__()
        self.lo, self.hi = math.inf, -math.inf

    def _observe(self, x: Tensor) -> None:
        lo, hi = _finite(self, float(x.min().item()), float(x.max().item()))
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)

    def _range(self) -> tuple[float, float]:
        return self.lo, self.hi


class PercentileObserver(Observer):
    """The mean over batches of each batch's ``100 - percentile`` and ``percentile``
    percentiles (NumPy's linear interpolation).

    Args:
        percentile: in ``(50, 100]``; 100 gives the mean of the batches' extremes.
    """

    def __init__(self, percentile: float = 99.99) -> None:
        super().__init__()
        if not 50.0 < percentile <= 100.0:
            raise ArgumentError(f"PercentileObserver: percentile must lie in (50, 100], got "
                                f"{percentile}")  # fmt: skip
        self.percentile = float(percentile)
        self.lo_sum, self.hi_sum = 0.0, 0.0

    def _observe(self, x: Tensor) -> None:
        values = x.to_numpy().reshape(-1)
        lo, hi = np.percentile(values, [100.0 - self.percentile, self.percentile])
        lo, hi = _finite(self, float(lo), float(hi))
        self.lo_sum, self.hi_sum = self.lo_sum + lo, self.hi_sum + hi

    def _range(self) -> tuple[float, float]:
        return self.lo_sum / self.batches, self.hi_sum / self.batches
