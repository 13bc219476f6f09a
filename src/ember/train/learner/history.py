"""MetricHistory: the value of every numeric metric at the end of every epoch.

The learner records, when a split's epoch ends, each numeric metric's ``value()`` (the
mean over the epoch, weighted by batch size). Best-checkpoint selection, early
stopping and the end-of-run summary read this history; it is saved with each
checkpoint, so a resumed run knows the epochs before it.

Example:
    >>> history = MetricHistory()
    >>> for epoch, loss in enumerate([0.9, 0.5, 0.7], start=1):
    ...     history.record("valid", "Loss", epoch, loss)
    >>> history.best_epoch("valid", "Loss", lower_is_better=True)
    2
    >>> MetricHistory.from_record(history.to_record()).values("valid", "Loss")
    {1: 0.9, 2: 0.5, 3: 0.7}
"""

from __future__ import annotations

import math
from typing import Any

from ember.backend.errors import RecordMismatchError
from ember.train.renderer.base import Split

SPLITS: tuple[Split, ...] = ("train", "valid")


class MetricHistory:
    """Epoch-level values of numeric metrics, by split and metric name."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], dict[int, float]] = {}

    def record(self, split: Split, name: str, epoch: int, value: float) -> None:
        """Sets the value of metric ``name`` of ``split`` at the end of ``epoch``."""
        self._values.setdefault((split, name), {})[epoch] = float(value)

    def values(self, split: Split, name: str) -> dict[int, float]:
        """``{epoch: value}`` of one metric, in epoch order (empty if never recorded)."""
        return dict(sorted(self._values.get((split, name), {}).items()))

    def value(self, split: Split, name: str, epoch: int) -> float | None:
        """The value at the end of ``epoch``; None if it was not recorded."""
        return self._values.get((split, name), {}).get(epoch)

    def metrics(self) -> list[tuple[Split, str]]:
        """Every ``(split, name)`` recorded, train before valid, then in recording order."""
        return sorted(self._values, key=lambda key: SPLITS.index(key[0]))  # type: ignore[arg-type]

    def best_epoch(self, split: Split, name: str, lower_is_better: bool) -> int | None:
        """The epoch of the best value (the earliest on a tie; NaN never wins)."""
        best: tuple[int, float] | None = None
        for epoch, value in self.values(split, name).items():
            if math.isnan(value):
                continue
            if best is None or (value < best[1] if lower_is_better else value > best[1]):
                best = (epoch, value)
        return None if best is None else best[0]

    def truncate(self, last_epoch: int) -> None:
        """Forgets every epoch after ``last_epoch`` (a run resumed from an earlier epoch)."""
        for values in self._values.values():
            for epoch in [e for e in values if e > last_epoch]:
                del values[epoch]

    # ------------------------------------------------------------------ records
    def to_record(self) -> dict[str, dict[str, list[list[float]]]]:
        """``{split: {name: [[epoch, value], ...]}}``: plain data for any recorder."""
        record: dict[str, dict[str, list[list[float]]]] = {}
        for (split, name), values in self._values.items():
            rows = [[epoch, value] for epoch, value in sorted(values.items())]
            record.setdefault(split, {})[name] = rows
        return record

    @staticmethod
    def from_record(record: Any) -> MetricHistory:
        """The history :meth:`to_record` saved.

        Raises:
            RecordMismatchError: ``record`` does not have that form.
        """
        history = MetricHistory()
        if not isinstance(record, dict):
            raise RecordMismatchError(
                f"MetricHistory: expected {{split: {{name: [[epoch, value], ...]}}}}, "
                f"got a {type(record).__name__}"
            )
        for split, metrics in record.items():
            if split not in SPLITS or not isinstance(metrics, dict):
                raise RecordMismatchError(
                    f"MetricHistory: expected the splits 'train' and 'valid' mapping metric "
                    f"names to rows, got {split!r}",
                    path=str(split),
                )
            for name, rows in metrics.items():
                try:
                    for epoch, value in rows:
                        history.record(split, name, int(epoch), float(value))
                except (TypeError, ValueError):
                    raise RecordMismatchError(
                        f"MetricHistory: the rows of {split}/{name} must be [epoch, value] "
                        f"pairs, got {rows!r:.60}",
                        path=f"{split}.{name}",
                    ) from None
        return history
