"""The step outputs and their adaptors to the metrics' inputs."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.backend.errors import ArgumentError, EmberIndexError
from ember.tensor import Tensor
from ember.train.metric.accuracy import (
    AccuracyInput,
    AccuracyMetric,
    TopKAccuracyInput,
    TopKAccuracyMetric,
)
from ember.train.metric.auroc import AurocInput, AurocMetric
from ember.train.metric.base import MetricMetadata, Progress, adapt
from ember.train.metric.classification import ConfusionStatsInput, PrecisionMetric, RecallMetric
from ember.train.metric.loss import LossInput, LossMetric
from ember.train.output import (
    ClassificationOutput,
    MultiLabelClassificationOutput,
    RegressionOutput,
)

META = MetricMetadata(Progress(1, 1), epoch=1, epoch_total=1, iteration=1)
DEVICES = {
    "ndarray": lambda: ember.device("ndarray"),
    "torch": lambda: ember.device("torch"),
    "torch-autodiff": lambda: ember.device("torch").autodiff(),
}


@pytest.fixture(params=list(DEVICES))
def device(request) -> ember.Device:
    return DEVICES[request.param]()


def classification(device, logits, targets, loss=0.5) -> ClassificationOutput:
    return ClassificationOutput(
        loss=Tensor.from_data([loss], device),
        output=Tensor.from_data(np.asarray(logits, np.float32), device),
        targets=Tensor.from_data(np.asarray(targets), device),
    )


def test_classification_output_feeds_its_metrics(device):
    logits = np.array([[2.0, 0.1, 0.3], [0.2, 0.1, 1.5], [0.1, 0.9, 0.05], [0.5, 0.4, 0.1]])
    targets = np.array([0, 2, 2, 1])
    out = classification(device, logits, targets, loss=0.25)

    loss = adapt(out, LossInput)
    assert loss.tensor is out.loss and loss.batch_size == 4
    for input_type in (AccuracyInput, TopKAccuracyInput, AurocInput):
        item = adapt(out, input_type)
        assert isinstance(item, input_type)
        assert item.outputs is out.output and item.targets is out.targets
    confusion = adapt(out, ConfusionStatsInput)
    assert confusion.predictions is out.output
    np.testing.assert_array_equal(confusion.targets.to_numpy(), np.eye(3, dtype=bool)[targets])

    # the metrics run on what the adaptors give, on any device
    metrics = [LossMetric(), AccuracyMetric(), TopKAccuracyMetric(2), RecallMetric(), AurocMetric()]
    for metric in metrics:
        metric.update(adapt(out, metric.input_type), META)
    accuracy = 100 * np.mean(logits.argmax(1) == targets)
    assert metrics[0].value() == pytest.approx(0.25)
    assert metrics[1].value() == pytest.approx(accuracy)
    assert metrics[2].value() == pytest.approx(75.0)  # item 2 (target 2) is third
    assert metrics[3].value() == pytest.approx(accuracy)  # micro recall of a multiclass task
    assert 0.0 <= metrics[4].value() <= 100.0


def test_classification_output_of_one_column_is_binary(device):
    out = classification(device, [[0.9], [0.2], [0.7]], [1, 0, 0])
    confusion = adapt(out, ConfusionStatsInput)
    np.testing.assert_array_equal(confusion.targets.to_numpy(), [[True], [False], [False]])
    metric = PrecisionMetric.binary(0.5)
    metric.update(confusion, META)
    assert metric.value() == pytest.approx(50.0)


def test_classification_output_checks_targets_before_one_hot(device):
    out = classification(device, [[0.9, 0.1], [0.2, 0.8]], [0, 2])
    with pytest.raises(
        EmberIndexError, match=r"ClassificationOutput: targets must be in \[0, 2\), got 0 to 2"
    ):
        adapt(out, ConfusionStatsInput)
    binary = classification(device, [[0.9], [0.2]], [0, 3])
    with pytest.raises(EmberIndexError, match=r"binary targets must be in \[0, 2\)"):
        adapt(binary, ConfusionStatsInput)


def test_regression_output_feeds_the_loss_only(device):
    out = RegressionOutput(
        loss=Tensor.from_data([1.25], device),
        output=Tensor.from_data(np.zeros((5, 2), np.float32), device),
        targets=Tensor.from_data(np.ones((5, 2), np.float32), device),
    )
    loss = adapt(out, LossInput)
    assert loss.tensor is out.loss and loss.batch_size == 5
    with pytest.raises(
        ArgumentError,
        match=r"turns a RegressionOutput into a AccuracyInput \(it adapts to: LossInput\)",
    ):
        adapt(out, AccuracyInput)


def test_multilabel_output_feeds_loss_and_confusion_stats(device):
    probs = np.array([[0.9, 0.2, 0.6], [0.1, 0.7, 0.4]], np.float32)
    truth = np.array([[1, 0, 0], [0, 1, 1]])
    out = MultiLabelClassificationOutput(
        loss=Tensor.from_data([0.3], device),
        output=Tensor.from_data(probs, device),
        targets=Tensor.from_data(truth, device),
    )
    assert adapt(out, LossInput).batch_size == 2
    confusion = adapt(out, ConfusionStatsInput)
    np.testing.assert_array_equal(confusion.targets.to_numpy(), truth.astype(bool))
    precision, recall = PrecisionMetric.multilabel(0.5), RecallMetric.multilabel(0.5)
    for metric in (precision, recall):
        metric.update(confusion, META)
    predicted = probs >= 0.5
    tp = np.sum(predicted & (truth == 1))
    assert precision.value() == pytest.approx(100 * tp / predicted.sum())
    assert recall.value() == pytest.approx(100 * tp / truth.sum())
    with pytest.raises(
        ArgumentError, match="no adaptor turns a MultiLabelClassificationOutput into a AurocInput"
    ):
        adapt(out, AurocInput)
