"""Accuracy and top-k accuracy of class scores against class indices, in percent."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.backend.errors import ArgumentError, fmt_shape
from ember.tensor import Tensor
from ember.tensor.dtype import Kind
from ember.train.metric._common import check_batch, check_classes, read, top_k
from ember.train.metric.base import MeanMetric, MetricEntry, MetricMetadata


@dataclass
class AccuracyInput:
    """The input of :class:`AccuracyMetric`: ``outputs [N, C]`` scores, ``targets [N]`` Int."""

    outputs: Tensor
    targets: Tensor


@dataclass
class TopKAccuracyInput:
    """The input of :class:`TopKAccuracyMetric`: ``outputs [N, C]``, ``targets [N]`` Int."""

    outputs: Tensor
    targets: Tensor


def _read(owner: str, outputs: Tensor, targets: Tensor, pad_token: int | None):
    scores = read(owner, "outputs", outputs, 2, (Kind.FLOAT,))
    classes = read(owner, "targets", targets, 1, (Kind.INT,))
    check_batch(owner, scores, classes, "targets")
    check_classes(owner, classes, scores.shape[1], ignore=pad_token)
    counted = np.ones(classes.shape, dtype=bool) if pad_token is None else classes != pad_token
    return scores, classes, counted


def _check_pad(owner: str, pad_token: int | None) -> int | None:
    if pad_token is not None and (isinstance(pad_token, bool) or not isinstance(pad_token, int)):
        raise ArgumentError(f"{owner}: pad_token must be an int or None, got {pad_token!r}")
    return pad_token


class AccuracyMetric(MeanMetric):
    """The share of items whose highest score is their target's, in percent.

    Args:
        pad_token: a target class that is not counted (the padding of sequences); as in
            Burn. Unlike Burn, the epoch's mean weighs each batch by its counted items, so
            it is the accuracy over all the epoch's non-padding items; a batch of padding
            alone shows NaN and leaves the mean as it was.

    Ties between scores go to the lower class index (``argmax``).

    Example:
        >>> from ember.tensor import Tensor
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> outputs = Tensor.from_data([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
        >>> targets = Tensor.from_data([0, 1, 1, 0])
        >>> meta = MetricMetadata(Progress(4, 4), epoch=1, epoch_total=1, iteration=1)
        >>> AccuracyMetric().update(AccuracyInput(outputs, targets), meta).formatted
        'epoch 50.00% - batch 50.00%'
        >>> metric = AccuracyMetric(pad_token=0)
        >>> _ = metric.update(AccuracyInput(outputs, targets), meta)
        >>> metric.value()
        50.0
    """

    name = "Accuracy"
    input_type = AccuracyInput

    def __init__(self, pad_token: int | None = None) -> None:
        self.pad_token = _check_pad("AccuracyMetric", pad_token)
        super().__init__()

    def with_pad_token(self, pad_token: int) -> AccuracyMetric:
        """A new metric that does not count the targets equal to ``pad_token``."""
        return AccuracyMetric(pad_token)

    def update(self, item: AccuracyInput, metadata: MetricMetadata) -> MetricEntry:
        scores, classes, counted = _read("AccuracyMetric", item.outputs, item.targets,
                                         self.pad_token)  # fmt: skip
        hits = (scores.argmax(axis=1) == classes) & counted
        count = int(counted.sum())
        value = 100.0 * hits.sum() / count if count else float("nan")
        return self.state.update(value, count, self.name, unit="%")



class TopKAccuracyMetric(MeanMetric):
    """The share of items whose target is among their ``k`` highest scores, in percent.

    Its name, and so its log file's, carries ``k``: ``"TopKAccuracy@5"``.

    Args:
        k: how many of the highest scores count as a hit (at least 1, at most the classes).
        pad_token: a target class that is not counted, as in :class:`AccuracyMetric`.

    Equal scores are ranked by class index (a stable sort), so ``k=1`` is the accuracy.

    Example:
        >>> from ember.tensor import Tensor
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> outputs = Tensor.from_data([[0.5, 0.3, 0.2], [0.1, 0.3, 0.6]])
        >>> targets = Tensor.from_data([1, 0])
        >>> meta = MetricMetadata(Progress(2, 2), epoch=1, epoch_total=1, iteration=1)
        >>> metric = TopKAccuracyMetric(2)
        >>> metric.name, metric.update(TopKAccuracyInput(outputs, targets), meta).serialized
        ('TopKAccuracy@2', '50.0')
    """

    input_type = TopKAccuracyInput

    def __init__(self, k: int, pad_token: int | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ArgumentError(f"TopKAccuracyMetric: k must be a positive int, got {k!r}")
        self.k = k
        self.name = f"TopKAccuracy@{k}"
        self.pad_token = _check_pad("TopKAccuracyMetric", pad_token)
        super().__init__()

    def update(self, item: TopKAccuracyInput, metadata: MetricMetadata) -> MetricEntry:
        scores, classes, counted = _read("TopKAccuracyMetric", item.outputs, item.targets,
                                         self.pad_token)  # fmt: skip
        if self.k > scores.shape[1]:
            raise ArgumentError(
                f"TopKAccuracyMetric: k={self.k} is more than the {scores.shape[1]} classes "
                f"of outputs {fmt_shape(scores.shape)}"
            )
        hits = (top_k(scores, self.k) == classes[:, None]).any(axis=1) & counted
        count = int(counted.sum())
        value = 100.0 * hits.sum() / count if count else float("nan")
        return self.state.update(value, count, self.name, unit="%")

