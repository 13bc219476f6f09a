"""LearnerSummary: the table printed at the end of a run when ``.summary()`` was asked.

One row per numeric metric and split: its lowest and highest epoch value, each with
the epoch it was reached in, and the value of the last epoch. The values are the
metrics' epoch means (what the learner records in its
:class:`~ember.train.learner.history.MetricHistory`), so a resumed run summarizes its
epochs before the resume too.

Example:
    >>> from ember.train.learner.history import MetricHistory
    >>> history = MetricHistory()
    >>> for epoch, (train, valid) in enumerate([(0.9, 1.0), (0.5, 0.7), (0.4, 0.8)], 1):
    ...     history.record("train", "Loss", epoch, train)
    ...     history.record("valid", "Loss", epoch, valid)
    >>> print(LearnerSummary.from_history(history, epochs=3, model="Net"))
    Learner summary: Net, 3 epochs
    | Split | Metric | Min.   | Epoch | Max.   | Epoch | Last   | Epoch |
    |-------|--------|--------|-------|--------|-------|--------|-------|
    | train | Loss   | 0.4    | 3     | 0.9    | 1     | 0.4    | 3     |
    | valid | Loss   | 0.7    | 2     | 1      | 1     | 0.8    | 3     |
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ember.train.learner.history import MetricHistory
from ember.train.renderer.base import Split


@dataclass(frozen=True)
class MetricSummary:
    """One metric of one split over the run: ``(value, epoch)`` of its min, max and last."""

    split: Split
    name: str
    min: tuple[float, int]
    max: tuple[float, int]
    last: tuple[float, int]


@dataclass(frozen=True)
class LearnerSummary:
    """The summary of a run: its model's name, its epoch count and one row per metric."""

    model: str
    epochs: int
    metrics: tuple[MetricSummary, ...]

    @staticmethod
    def from_history(history: MetricHistory, epochs: int, model: str = "model") -> LearnerSummary:
        """The summary of ``history`` (NaN values are left out of min and max)."""
        rows = []
        for split, name in history.metrics():
            values = history.values(split, name)
            if not values:
                continue
            last_epoch = max(values)
            finite = {epoch: value for epoch, value in values.items() if not math.isnan(value)}
            pool = finite or values
            low = min(pool, key=lambda epoch: (pool[epoch], epoch))
            high = max(pool, key=lambda epoch: (pool[epoch], -epoch))
            rows.append(MetricSummary(split, name, (pool[low], low), (pool[high], high),
                                      (values[last_epoch], last_epoch)))  # fmt: skip
        return LearnerSummary(model, epochs, tuple(rows))

    def get(self, split: Split, name: str) -> MetricSummary | None:
        """The row of metric ``name`` of ``split``; None if it has none."""
        return next((r for r in self.metrics if (r.split, r.name) == (split, name)), None)

    def __str__(self) -> str:
        header = ["Split", "Metric", "Min.", "Epoch", "Max.", "Epoch", "Last", "Epoch"]
        body = [
            [row.split, row.name, *(part for pair in (row.min, row.max, row.last)
                                    for part in (f"{pair[0]:.6g}", str(pair[1])))]
            for row in self.metrics
        ]  # fmt: skip
        widths = [max(len(cell) for cell in column) for column in zip(header, *body)]
        widths = [max(width, 6) if i in (2, 4, 6) else width for i, width in enumerate(widths)]

        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

        rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
        title = f"Learner summary: {self.model}, {self.epochs} epoch{'s' * (self.epochs != 1)}"
        if not body:
            return title + "\n(no numeric metric was recorded)"
        return "\n".join([title, line(header), rule, *map(line, body)])
