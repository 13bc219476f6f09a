"""The area under the ROC curve (AUROC) of class scores, in percent."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.tensor import Tensor
from ember.tensor.dtype import Kind
from ember.train.metric._common import check_batch, check_classes, read
from ember.train.metric.base import MeanMetric, MetricEntry, MetricMetadata


@dataclass
class AurocInput:
    """The input of :class:`AurocMetric`: ``outputs [N, C]`` Float, ``targets [N]`` Int."""

    outputs: Tensor
    targets: Tensor


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """The ranks (from 1) of ``values`` along the last axis, equal values sharing their mean."""
    order = np.argsort(values, axis=-1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=-1)
    n = values.shape[-1]
    # A tie group runs from its first to its last position in sorted order; each member
    # gets the mean of the two, found by carrying the group's bounds along the row.
    starts = np.ones(ordered.shape, dtype=bool)
    starts[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    positions = np.broadcast_to(np.arange(n), ordered.shape)
    first = np.maximum.accumulate(np.where(starts, positions, 0), axis=-1)
    ends = np.ones(ordered.shape, dtype=bool)
    ends[..., :-1] = starts[..., 1:]
    last = np.flip(np.minimum.accumulate(np.flip(np.where(ends, positions, n), -1), axis=-1), -1)
    ranks = np.empty(ordered.shape, dtype=np.float64)
    np.put_along_axis(ranks, order, (first + last) / 2.0 + 1.0, axis=-1)
    return ranks


def auroc(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """The AUROC of each row of ``scores`` for the Bool labels ``positive`` (same shape).

    It is the Mann-Whitney statistic: the chance that a positive item scores above a
    negative one, ties counting half. NaN for a row without positives or negatives.
    """
    n_pos = positive.sum(axis=-1)
    n_neg = positive.shape[-1] - n_pos
    rank_sum = np.where(positive, _average_ranks(scores), 0.0).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


class AurocMetric(MeanMetric):
    """The area under the ROC curve of class scores, in percent.

    ``outputs`` are logits ``[N, C]`` and ``targets`` class indices ``[N]``:

    * ``C == 2`` (binary, as Burn): the probability of class 1 after a softmax, which
      orders the items as ``outputs[:, 1] - outputs[:, 0]`` does; that difference is
      what is ranked, since in float64 it is exact for f32 logits, where the rounding
      of a softmax can make or break ties;
    * ``C == 1``: that one column is the score of class 1 (a logit or a probability);
    * ``C > 2``: one-vs-rest, the mean over the classes of each class's AUROC of its
      softmax probability (the classes without both positives and negatives in the
      batch are left out).

    Equal scores count half, as in the Mann-Whitney statistic. The epoch's value is the
    batches' AUROC averaged with their sizes as weights (as Burn does; the exact AUROC of
    an epoch would need all of its scores). A batch whose AUROC is undefined (one class
    only) shows NaN and is left out of that mean, where Burn counts it as 50%.

    Example:
        >>> from ember.tensor import Tensor
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> outputs = Tensor.from_data([[0.0, 2.0], [0.0, -1.0], [0.0, 0.5], [0.0, 0.5]])
        >>> targets = Tensor.from_data([1, 0, 0, 1])
        >>> meta = MetricMetadata(Progress(4, 4), epoch=1, epoch_total=1, iteration=1)
        >>> AurocMetric().update(AurocInput(outputs, targets), meta).formatted
        'epoch 87.50% - batch 87.50%'
    """

    name = "AUROC"
    input_type = AurocInput

    def update(self, item: AurocInput, metadata: MetricMetadata) -> MetricEntry:
        owner = "AurocMetric"
        outputs = read(owner, "outputs", item.outputs, 2, (Kind.FLOAT,))
        targets = read(owner, "targets", item.targets, 1, (Kind.INT,))
        check_batch(owner, outputs, targets, "targets")
        num_classes = outputs.shape[1]
        check_classes(owner, targets, max(num_classes, 2))
        if num_classes == 1:
            area: float | np.ndarray = auroc(outputs[:, 0], targets == 1)
        elif num_classes == 2:
            area = auroc(outputs[:, 1] - outputs[:, 0], targets == 1)
        else:
            one_vs_rest = targets[None, :] == np.arange(num_classes)[:, None]
            per_class = auroc(_softmax(outputs).T, one_vs_rest)
            defined = per_class[~np.isnan(per_class)]
            area = defined.mean() if defined.size else np.nan
        return self.state.update(100.0 * float(area), len(targets), self.name, unit="%")

