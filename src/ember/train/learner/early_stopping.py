"""Early stopping: end the run when a metric has stopped improving.

:class:`MetricEarlyStopping` watches one numeric metric of one split, at the end of
every epoch (its value over the epoch). An epoch *improves* when its value beats the
best so far by more than ``min_delta`` (lower for the loss, higher for the accuracy:
the metric's ``lower_is_better``). The run stops once ``patience`` epochs have passed
since the last improvement. The first epoch always sets the best.

Burn calls this condition "no improvement since n epochs" and has no ``min_delta``;
ember adds it, as Keras and Lightning have it (0 by default, Burn's behaviour).

Example:
    >>> stopping = MetricEarlyStopping("Loss", "valid", min_delta=0.05, patience=2)
    >>> stopping.bind(lower_is_better=True)
    >>> [stopping.update(epoch, loss) for epoch, loss in enumerate([1.0, 0.8, 0.78, 0.9], 1)]
    [False, False, False, True]
    >>> stopping.best_epoch, stopping.best_value
    (2, 0.8)
"""

from __future__ import annotations

import math
from typing import Any

from ember.backend.errors import ArgumentError, RecordMismatchError
from ember.train.renderer.base import Split


class MetricEarlyStopping:
    """Stops training when ``metric`` of ``split`` has not improved for ``patience`` epochs.

    Args:
        metric: the metric's name (``"Loss"``), registered as a numeric metric of ``split``.
        split: ``"train"`` or ``"valid"``. Default: ``"valid"``.
        min_delta: how much better than the best a value must be to count as an
            improvement; ``>= 0``. Default: 0.
        patience: the number of epochs without improvement after which training stops;
            ``>= 1``. Default: 1.

    Raises:
        ArgumentError: a bad split, ``min_delta`` or ``patience``.
    """

    def __init__(self, metric: str, split: Split = "valid", min_delta: float = 0.0,
                 patience: int = 1) -> None:  # fmt: skip
        if not isinstance(metric, str) or not metric:
            raise ArgumentError(f"early_stopping: metric must be a metric name, got {metric!r}")
        if split not in ("train", "valid"):
            raise ArgumentError(f"early_stopping: split must be 'train' or 'valid', got {split!r}")
        if isinstance(min_delta, bool) or not isinstance(min_delta, int | float) or not (
            math.isfinite(min_delta) and min_delta >= 0
        ):
            raise ArgumentError(f"early_stopping: min_delta must be a number >= 0, got {min_delta!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ArgumentError(f"early_stopping: patience must be an integer >= 1, got {patience!r}")
        self.metric = metric
        self.split: Split = split
        self.min_delta = float(min_delta)
        self.patience = patience
        self.lower_is_better = True
        self.best_epoch: int | None = None
        self.best_value: float | None = None

    def bind(self, lower_is_better: bool) -> None:
        """Sets the direction (the learner reads it from the registered metric)."""
        self.lower_is_better = bool(lower_is_better)

    def update(self, epoch: int, value: float) -> bool:
        """Takes the metric's value at the end of ``epoch``; True when training should stop."""
        improved = self.best_value is None or (
            value < self.best_value - self.min_delta
            if self.lower_is_better
            else value > self.best_value + self.min_delta
        )
        if improved and not math.isnan(value):
            self.best_epoch, self.best_value = epoch, float(value)
        if self.best_epoch is None:  # only NaN so far: count from the first epoch
            self.best_epoch = epoch
        return epoch - self.best_epoch >= self.patience

    # ------------------------------------------------------------------ records
    def to_record(self) -> dict[str, Any]:
        return {"best_epoch": self.best_epoch, "best_value": self.best_value}

    def load_record(self, record: Any) -> MetricEarlyStopping:
        """Restores the best epoch and value :meth:`to_record` saved; returns self."""
        if not isinstance(record, dict) or set(record) != {"best_epoch", "best_value"}:
            raise RecordMismatchError(
                "MetricEarlyStopping: expected a record with keys ['best_epoch', 'best_value'], "
                f"got {record!r:.60}"
            )
        self.best_epoch, self.best_value = record["best_epoch"], record["best_value"]
        return self

    def __repr__(self) -> str:
        return (f"MetricEarlyStopping({self.metric!r}, {self.split!r}, "
                f"min_delta={self.min_delta}, patience={self.patience})")  # fmt: skip
