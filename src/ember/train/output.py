"""The outputs a training or validation step returns, and the metric inputs they feed.

A step's output holds what every metric of its task needs. Each output class registers,
with :func:`~ember.train.metric.base.adaptor`, how it becomes the input of each metric it
can feed; the learner calls :func:`~ember.train.metric.base.adapt` for each metric.

============================== =====================================================
output                         feeds
============================== =====================================================
ClassificationOutput           Loss, Accuracy, TopKAccuracy, Precision / Recall /
                               F-beta (multiclass, or binary with one column), AUROC
RegressionOutput               Loss
MultiLabelClassificationOutput Loss, Precision / Recall / F-beta (multilabel)
============================== =====================================================

Example:
    >>> from ember.tensor import Tensor
    >>> from ember.train.metric.accuracy import AccuracyInput
    >>> from ember.train.metric.base import adapt
    >>> from ember.train.metric.classification import ConfusionStatsInput
    >>> output = ClassificationOutput(
    ...     loss=Tensor.from_data([0.7]),
    ...     output=Tensor.from_data([[2.0, 0.5, 0.1], [0.3, 0.2, 1.5]]),
    ...     targets=Tensor.from_data([0, 1]),
    ... )
    >>> adapt(output, AccuracyInput).targets.tolist()
    [0, 1]
    >>> adapt(output, ConfusionStatsInput).targets.tolist()
    [[True, False, False], [False, True, False]]
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.nn._util import check_indices
from ember.tensor import Tensor
from ember.train.metric.accuracy import AccuracyInput, TopKAccuracyInput
from ember.train.metric.auroc import AurocInput
from ember.train.metric.base import adaptor
from ember.train.metric.classification import ConfusionStatsInput
from ember.train.metric.loss import LossInput


@dataclass
class ClassificationOutput:
    """What a classification step returns.

    Args:
        loss: the loss of the batch, a scalar (shape ``[]`` or ``[1]``).
        output: the class scores (logits) ``[N, C]``.
        targets: the true classes ``[N]``, Int.
    """

    loss: Tensor
    output: Tensor
    targets: Tensor


@dataclass
class RegressionOutput:
    """What a regression step returns.

    Args:
        loss: the loss of the batch, a scalar (shape ``[]`` or ``[1]``).
        output: the predictions ``[N, ...]``.
        targets: the true values, shaped like ``output``.
    """

    loss: Tensor
    output: Tensor
    targets: Tensor


@dataclass
class MultiLabelClassificationOutput:
    """What a multilabel classification step returns.

    Args:
        loss: the loss of the batch, a scalar (shape ``[]`` or ``[1]``).
        output: the scores of each class ``[N, C]``; the precision, recall and F-beta
            metrics compare them with their threshold as they are, so a model that
            outputs logits passes ``sigmoid(logits)`` here for a threshold of 0.5.
        targets: the classes that hold for each item, ``[N, C]``, Int 0 / 1 or Bool.
    """

    loss: Tensor
    output: Tensor
    targets: Tensor


# ---------------------------------------------------------------- classification
@adaptor(ClassificationOutput, LossInput)
def _classification_loss(out: ClassificationOutput) -> LossInput:
    return LossInput(out.loss, batch_size=out.output.shape[0])


@adaptor(ClassificationOutput, AccuracyInput)
def _classification_accuracy(out: ClassificationOutput) -> AccuracyInput:
    return AccuracyInput(out.output, out.targets)


@adaptor(ClassificationOutput, TopKAccuracyInput)
def _classification_top_k(out: ClassificationOutput) -> TopKAccuracyInput:
    return TopKAccuracyInput(out.output, out.targets)


@adaptor(ClassificationOutput, ConfusionStatsInput)
def _classification_confusion(out: ClassificationOutput) -> ConfusionStatsInput:
    num_classes = out.output.shape[-1]
    if num_classes == 1:  # one column: a binary task, whose targets are 0 or 1
        check_indices("ClassificationOutput", "binary targets", out.targets, 2)
        return ConfusionStatsInput(out.output, out.targets.unsqueeze_dim(1).bool())
    # one_hot would turn a target outside the classes into a row of False: check first
    check_indices("ClassificationOutput", "targets", out.targets, num_classes)
    return ConfusionStatsInput(out.output, out.targets.one_hot(num_classes).bool())


@adaptor(ClassificationOutput, AurocInput)
def _classification_auroc(out: ClassificationOutput) -> AurocInput:
    return AurocInput(out.output, out.targets)


# ---------------------------------------------------------------- regression
@adaptor(RegressionOutput, LossInput)
def _regression_loss(out: RegressionOutput) -> LossInput:
    return LossInput(out.loss, batch_size=out.output.shape[0])


# ---------------------------------------------------------------- multilabel
@adaptor(MultiLabelClassificationOutput, LossInput)
def _multilabel_loss(out: MultiLabelClassificationOutput) -> LossInput:
    return LossInput(out.loss, batch_size=out.output.shape[0])


@adaptor(MultiLabelClassificationOutput, ConfusionStatsInput)
def _multilabel_confusion(out: MultiLabelClassificationOutput) -> ConfusionStatsInput:
    return ConfusionStatsInput(out.output, out.targets.bool())
