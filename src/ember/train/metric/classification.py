"""Precision, recall and F-beta score, from the counts of a confusion matrix, in percent.

The three metrics take a :class:`ConfusionStatsInput` (scores ``[N, C]`` and the true
classes as a Bool ``[N, C]`` mask) and share how scores become predicted classes and how
the classes are averaged:

* the decision rule: :class:`Threshold` (a class is predicted when its score is at least
  the threshold: binary and multilabel tasks) or :class:`TopK` (the ``k`` highest scores
  of an item are predicted: multiclass tasks; ``TopK(1)`` is the argmax);
* the class reduction: ``"micro"`` adds the counts of every class before dividing,
  ``"macro"`` divides per class and averages the classes (a class whose score is
  undefined, 0 / 0, is left out, as in Burn).

The constructors ``binary(threshold)``, ``multiclass(top_k, class_reduction)`` and
``multilabel(threshold, class_reduction)`` pick these as Burn's do.

Unlike Burn, which averages the batches' scores, the epoch's value is computed from
the confusion counts added over the epoch: it is the score of the whole epoch's
predictions, whatever the batches were. The batch's own score is shown and logged.
"""

from __future__ import annotations

import abc
import enum
import math
from dataclasses import dataclass

import numpy as np

from ember.backend.errors import ArgumentError, ShapeError, fmt_shape
from ember.tensor import Tensor
from ember.tensor.dtype import Kind
from ember.train.metric._common import read, top_k
from ember.train.metric.base import Metric, MetricEntry, MetricMetadata, Numeric, format_entry


class ClassReduction(str, enum.Enum):
    """How the classes' scores make one: add their counts (micro) or average them (macro)."""

    MICRO = "micro"
    MACRO = "macro"


@dataclass(frozen=True)
class Threshold:
    """A class is predicted when its score is at least ``value`` (probabilities, usually)."""

    value: float = 0.5


@dataclass(frozen=True)
class TopK:
    """The ``k`` highest scores of an item are its predicted classes (ties: lower index)."""

    k: int = 1


DecisionRule = Threshold | TopK


@dataclass
class ConfusionStatsInput:
    """The input of the confusion-count metrics.

    Args:
        predictions: Float scores ``[N, C]`` (one column for a binary task).
        targets: the true classes ``[N, C]``, Bool (or Int 0 / 1): one-hot for a
            multiclass task, any subset for a multilabel one.
    """

    predictions: Tensor
    targets: Tensor


class _ConfusionMetric(Numeric, Metric):
    """Counts true positives, false positives and false negatives of each class."""

    input_type = ConfusionStatsInput
    _epoch: np.ndarray | None  # the epoch's counts so far; None before its first batch

    def __init__(self, rule: DecisionRule = TopK(1),
                 class_reduction: ClassReduction | str = ClassReduction.MICRO) -> None:  # fmt: skip
        owner = type(self).__name__
        if isinstance(rule, TopK):
            if isinstance(rule.k, bool) or not isinstance(rule.k, int) or rule.k < 1:
                raise ArgumentError(f"{owner}: top_k must be a positive int, got {rule.k!r}")
        elif isinstance(rule, Threshold):
            if not math.isfinite(rule.value):
                raise ArgumentError(f"{owner}: the threshold must be finite, got {rule.value}")
        else:
            raise ArgumentError(f"{owner}: rule must be a Threshold or a TopK, got {rule!r}")
        try:
            self.class_reduction = ClassReduction(class_reduction)
        except ValueError:
            raise ArgumentError(
                f"{owner}: class_reduction must be 'micro' or 'macro', got {class_reduction!r}"
            ) from None
        self.rule = rule
        self.clear()

    @classmethod
    def binary(cls, threshold: float = 0.5):
        """For one column of probabilities: positive when at least ``threshold``."""
        return cls(Threshold(threshold), ClassReduction.MICRO)

    @classmethod
    def multiclass(cls, top_k: int = 1, class_reduction: ClassReduction | str = "micro"):
        """For class scores: the ``top_k`` highest of each item are its predictions."""
        return cls(TopK(top_k), class_reduction)

    @classmethod
    def multilabel(cls, threshold: float = 0.5, class_reduction: ClassReduction | str = "micro"):
        """For per-class probabilities: each class at least ``threshold`` is predicted."""
        return cls(Threshold(threshold), class_reduction)

    @abc.abstractmethod
    def _score(self, tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
        """The score of each set of counts, NaN where it is 0 / 0 (float64, not in percent)."""

    def _reduce(self, counts: np.ndarray | None) -> float:
        if counts is None:
            return float("nan")
        if self.class_reduction is ClassReduction.MICRO:
            counts = counts.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = self._score(*counts)
        defined = scores[~np.isnan(scores)]
        return 100.0 * float(defined.mean()) if defined.size else float("nan")

    def _counts(self, item: ConfusionStatsInput) -> np.ndarray:
        owner = type(self).__name__
        scores = read(owner, "predictions", item.predictions, 2, (Kind.FLOAT,))
        truth = read(owner, "targets", item.targets, 2, (Kind.BOOL, Kind.INT))
        if scores.shape != truth.shape:
            raise ShapeError(
                f"{owner}: predictions {fmt_shape(scores.shape)} and targets "
                f"{fmt_shape(truth.shape)} must have the same shape [N, C]"
            )
        if scores.shape[0] == 0:
            raise ShapeError(f"{owner}: the batch is empty (predictions {fmt_shape(scores.shape)})")
        if truth.dtype != bool:
            if ((truth != 0) & (truth != 1)).any():
                raise ArgumentError(f"{owner}: Int targets must be 0 or 1 (a class mask)")
            truth = truth.astype(bool)
        if isinstance(self.rule, Threshold):
            predicted = scores >= self.rule.value
        else:
            if self.rule.k > scores.shape[1]:
                raise ArgumentError(
                    f"{owner}: top_k={self.rule.k} is more than the {scores.shape[1]} classes "
                    f"of predictions {fmt_shape(scores.shape)}"
                )
            predicted = np.zeros(scores.shape, dtype=bool)
            np.put_along_axis(predicted, top_k(scores, self.rule.k), True, axis=1)
        tp = (predicted & truth).sum(axis=0)
        fp = (predicted & ~truth).sum(axis=0)
        fn = (~predicted & truth).sum(axis=0)
        return np.stack([tp, fp, fn]).astype(np.int64)

    def update(self, item: ConfusionStatsInput, metadata: MetricMetadata) -> MetricEntry:
        counts = self._counts(item)
        if self._epoch is None:
            self._epoch = counts
        elif self._epoch.shape != counts.shape:
            raise ShapeError(
                f"{type(self).__name__}: predictions have {counts.shape[1]} classes, but the "
                f"earlier batches of the epoch had {self._epoch.shape[1]}"
            )
        else:
            self._epoch = self._epoch + counts
        return format_entry(self.name, self.value(), self._reduce(counts), unit="%")

    def clear(self) -> None:
        self._epoch = None

    def value(self) -> float:
        """The score of the epoch's predictions so far, in percent (NaN before any)."""
        return self._reduce(self._epoch)


class PrecisionMetric(_ConfusionMetric):
    """The share of predicted classes that are true: ``tp / (tp + fp)``, in percent.

    Args:
        rule: how scores become predictions (default ``TopK(1)``, the argmax).
        class_reduction: ``"micro"`` (default) or ``"macro"``.

    Example:
        >>> from ember.tensor import Tensor
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> scores = Tensor.from_data([[0.9], [0.8], [0.3], [0.6]])
        >>> truth = Tensor.from_data([[True], [False], [True], [True]])
        >>> meta = MetricMetadata(Progress(4, 4), epoch=1, epoch_total=1, iteration=1)
        >>> metric = PrecisionMetric.binary(threshold=0.5)
        >>> metric.update(ConfusionStatsInput(scores, truth), meta).formatted
        'epoch 66.67% - batch 66.67%'
    """

    name = "Precision"

    def _score(self, tp, fp, fn):
        return tp / (tp + fp)


class RecallMetric(_ConfusionMetric):
    """The share of true classes that are predicted: ``tp / (tp + fn)``, in percent.

    Args:
        rule: how scores become predictions (default ``TopK(1)``, the argmax).
        class_reduction: ``"micro"`` (default) or ``"macro"``.

    Example:
        >>> from ember.tensor import Tensor
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> scores = Tensor.from_data([[0.7, 0.2, 0.1], [0.1, 0.5, 0.4], [0.6, 0.3, 0.1]])
        >>> truth = Tensor.from_data([0, 2, 1]).one_hot(3).bool()
        >>> meta = MetricMetadata(Progress(3, 3), epoch=1, epoch_total=1, iteration=1)
        >>> metric = RecallMetric.multiclass(top_k=2, class_reduction="macro")
        >>> _ = metric.update(ConfusionStatsInput(scores, truth), meta)
        >>> metric.value()
        100.0
    """

    name = "Recall"

    def _score(self, tp, fp, fn):
        return tp / (tp + fn)


class FBetaScoreMetric(_ConfusionMetric):
    """The F-beta score ``(1 + β²) tp / ((1 + β²) tp + β² fn + fp)``, in percent.

    ``beta`` weighs recall ``beta`` times as much as precision (1: the F1 score); its
    name, and its log file's, carries it: ``"FBetaScore@1"``. With the macro reduction
    each class's score is computed, then the classes are averaged.

    Args:
        beta: a positive weight of recall against precision.
        rule: how scores become predictions (default ``TopK(1)``, the argmax).
        class_reduction: ``"micro"`` (default) or ``"macro"``.

    Example:
        >>> from ember.tensor import Tensor
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> scores = Tensor.from_data([[0.9, 0.8], [0.2, 0.7]])
        >>> truth = Tensor.from_data([[1, 0], [1, 1]])
        >>> meta = MetricMetadata(Progress(2, 2), epoch=1, epoch_total=1, iteration=1)
        >>> metric = FBetaScoreMetric.multilabel(beta=1.0, threshold=0.5)
        >>> metric.name, metric.update(ConfusionStatsInput(scores, truth), meta).serialized
        ('FBetaScore@1', '66.66666666666666')
    """

    def __init__(self, beta: float = 1.0, rule: DecisionRule = TopK(1),
                 class_reduction: ClassReduction | str = ClassReduction.MICRO) -> None:  # fmt: skip
        if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
            raise ArgumentError(f"FBetaScoreMetric: beta must be positive, got {beta!r}")
        self.beta = float(beta)
        self.name = f"FBetaScore@{self.beta:g}"
        super().__init__(rule, class_reduction)

    @classmethod
    def binary(cls, beta: float = 1.0, threshold: float = 0.5):  # type: ignore[override]
        """For one column of probabilities: positive when at least ``threshold``."""
        return cls(beta, Threshold(threshold), ClassReduction.MICRO)

    @classmethod
    def multiclass(cls, beta: float = 1.0, top_k: int = 1,  # type: ignore[override]
                   class_reduction: ClassReduction | str = "micro"):  # fmt: skip
        """For class scores: the ``top_k`` highest of each item are its predictions."""
        return cls(beta, TopK(top_k), class_reduction)

    @classmethod
    def multilabel(cls, beta: float = 1.0, threshold: float = 0.5,  # type: ignore[override]
                   class_reduction: ClassReduction | str = "micro"):  # fmt: skip
        """For per-class probabilities: each class at least ``threshold`` is predicted."""
        return cls(beta, Threshold(threshold), class_reduction)

    def _score(self, tp, fp, fn):
        b2 = self.beta**2
        return (1 + b2) * tp / ((1 + b2) * tp + b2 * fn + fp)
