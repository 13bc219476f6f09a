"""StepSeries: a metric's per-step values, kept in bounded memory for plotting.

A long run logs millions of batch values; a chart 800 pixels wide shows a few thousand
at most. :class:`StepSeries` takes the points one at a time and keeps at most
``2 * capacity`` of them: when it is full, each two neighbours become one (their mean),
and from then on every kept point stands for twice as many input points. The memory is
bounded whatever the input's length, and the curve keeps its shape.

Non-finite values (NaN, inf) are gaps: a kept point is the mean of the finite values it
stands for, NaN when there are none (matplotlib breaks the line there).

Example:
    >>> series = StepSeries(capacity=2)
    >>> for step in range(1, 10):
    ...     series.append(step, float(step))
    >>> series.points()
    ([2.5, 6.5, 9.0], [2.5, 6.5, 9.0])
"""

from __future__ import annotations

import math


class StepSeries:
    """Points ``(x, y)`` appended in order, averaged in blocks to stay under ``2 * capacity``.

    Args:
        capacity: half the most points kept (default 2000: a 4000-point line at most).
    """

    def __init__(self, capacity: int = 2000) -> None:
        if capacity < 1:
            raise ValueError(f"StepSeries: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.block = 1  # input points per kept point
        self._xs: list[float] = []
        self._sums: list[float] = []  # the sum of the finite y values of each kept point
        self._counts: list[int] = []  # how many finite y values each kept point has
        self._pending = [0.0, 0.0, 0, 0]  # x sum, finite y sum, points, finite points
        self.length = 0  # input points appended

    def append(self, x: float, y: float) -> None:
        """Adds the point ``(x, y)``; ``x`` must not decrease."""
        pending = self._pending
        pending[0] += x
        pending[2] += 1
        if math.isfinite(y):
            pending[1] += y
            pending[3] += 1
        self.length += 1
        if pending[2] == self.block:
            self._keep()

    def _keep(self) -> None:
        x_sum, y_sum, points, finite = self._pending
        self._xs.append(x_sum / points)
        self._sums.append(y_sum)
        self._counts.append(int(finite))
        self._pending = [0.0, 0.0, 0, 0]
        if len(self._xs) >= 2 * self.capacity:  # full: merge neighbours
            self._xs = [(a + b) / 2 for a, b in zip(self._xs[0::2], self._xs[1::2])]
            self._sums = [a + b for a, b in zip(self._sums[0::2], self._sums[1::2])]
            self._counts = [a + b for a, b in zip(self._counts[0::2], self._counts[1::2])]
            self.block *= 2

    def points(self) -> tuple[list[float], list[float]]:
        """The kept points (and the last, partial block's), as ``(xs, ys)``."""
        xs, sums, counts = list(self._xs), list(self._sums), list(self._counts)
        x_sum, y_sum, points, finite = self._pending
        if points:
            xs.append(x_sum / points)
            sums.append(y_sum)
            counts.append(int(finite))
        ys = [total / count if count else math.nan for total, count in zip(sums, counts)]
        return xs, ys
