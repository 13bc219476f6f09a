"""The learning rate of each optimizer step, read from the metadata."""

from __future__ import annotations

from ember.train.metric.base import Metric, MetricEntry, MetricMetadata, Numeric


class LearningRateMetric(Numeric, Metric):
    """The learning rate the iteration's optimizer step used (``metadata.lr``).

    It needs no input from the step's output. Its value is the last iteration's rate, not
    a mean over the epoch; an iteration without one (validation) shows ``"n/a"`` and
    logs NaN. Rates are shown in scientific notation (``1.000e-03``), since two decimals,
    as Burn shows them, hide most schedules.

    Example:
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> metric = LearningRateMetric()
        >>> meta = MetricMetadata(Progress(8, 64), epoch=1, epoch_total=3, iteration=1, lr=1e-3)
        >>> entry = metric.update(None, meta)
        >>> entry.formatted, entry.serialized, metric.value()
        ('1.000e-03', '0.001', 0.001)
    """

    name = "LearningRate"
    input_type = None

    def __init__(self) -> None:
        self.clear()

    def update(self, item: None, metadata: MetricMetadata) -> MetricEntry:
        if metadata.lr is None:
            self._lr = float("nan")
            return MetricEntry(self.name, "n/a", "nan")
        self._lr = float(metadata.lr)
        return MetricEntry(self.name, f"{self._lr:.3e}", repr(self._lr))

    def clear(self) -> None:
        self._lr = float("nan")

    def value(self) -> float:
        return self._lr
