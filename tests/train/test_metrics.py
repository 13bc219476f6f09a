"""The built-in metrics against NumPy / torch float64 formulas written here independently."""

from __future__ import annotations

import math
import sys
import types
from collections import namedtuple

import numpy as np
import pytest
import torch

import ember
from ember.backend.errors import (
    ArgumentError,
    BackendUnavailableError,
    EmberIndexError,
    KindError,
    ShapeError,
)
from ember.tensor import Tensor
from ember.train.metric import gpu as gpu_module
from ember.train.metric.accuracy import (
    AccuracyInput,
    AccuracyMetric,
    TopKAccuracyInput,
    TopKAccuracyMetric,
)
from ember.train.metric.auroc import AurocInput, AurocMetric
from ember.train.metric.base import MetricMetadata, Numeric, Progress
from ember.train.metric.classification import (
    ConfusionStatsInput,
    FBetaScoreMetric,
    PrecisionMetric,
    RecallMetric,
    Threshold,
    TopK,
)
from ember.train.metric.cpu import CpuMemory, CpuTemperature, CpuUse
from ember.train.metric.gpu import CudaMetric, GpuMemory, GpuTemperature, GpuUse, nvml_unavailable
from ember.train.metric.learning_rate import LearningRateMetric
from ember.train.metric.loss import LossInput, LossMetric

META = MetricMetadata(Progress(1, 1), epoch=1, epoch_total=1, iteration=1)
DEVICES = {"ndarray": lambda: ember.device("ndarray"), "torch": lambda: ember.device("torch")}


@pytest.fixture(params=list(DEVICES))
def device(request) -> ember.Device:
    return DEVICES[request.param]()


def tensor(values, device, dtype=None) -> Tensor:
    return Tensor.from_data(np.asarray(values), device, dtype=dtype)


def batches(rng, sizes, num_classes):
    """Random f32 logits and Int targets of several batches."""
    return [
        (rng.standard_normal((n, num_classes)).astype(np.float32), rng.integers(0, num_classes, n))
        for n in sizes
    ]


# ---------------------------------------------------------------------- loss
def test_loss_weights_batches_by_their_size(device):
    metric = LossMetric()
    losses, sizes = [0.25, 1.5, 0.75], [4, 1, 3]
    for loss, n in zip(losses, sizes):
        entry = metric.update(LossInput(tensor([loss], device, "f32"), batch_size=n), META)
        assert float(entry.serialized) == pytest.approx(loss)
    assert metric.value() == pytest.approx(np.average(losses, weights=sizes))
    assert entry.name == "Loss" and entry.formatted.startswith("epoch ")
    assert metric.lower_is_better and isinstance(metric, Numeric)
    metric.clear()
    assert math.isnan(metric.value())


def test_loss_of_per_item_values_defaults_to_their_count(device):
    metric = LossMetric()
    first, second = np.array([1.0, 2.0, 6.0]), np.array([4.0])
    metric.update(LossInput(tensor(first, device)), META)
    metric.update(LossInput(tensor(second, device)), META)
    assert metric.value() == pytest.approx(np.concatenate([first, second]).mean())


def test_loss_errors(device):
    metric = LossMetric()
    with pytest.raises(KindError, match="LossMetric: the loss must be a Float tensor, got Int"):
        metric.update(LossInput(tensor([1], device)), META)
    with pytest.raises(ShapeError, match=r"LossMetric: the loss is empty \(shape \[0\]\)"):
        metric.update(LossInput(tensor(np.zeros(0, np.float32), device)), META)
    with pytest.raises(ArgumentError, match="batch_size must be positive, got 0"):
        metric.update(LossInput(tensor([1.0], device), batch_size=0), META)


# ---------------------------------------------------------------------- accuracy
def test_accuracy_over_batches_matches_numpy(device):
    rng = np.random.default_rng(0)
    data = batches(rng, [5, 8, 3], 4)
    metric = AccuracyMetric()
    for logits, targets in data:
        entry = metric.update(AccuracyInput(tensor(logits, device), tensor(targets, device)), META)
        assert float(entry.serialized) == pytest.approx(100 * np.mean(logits.argmax(1) == targets))
    logits = np.concatenate([x for x, _ in data])
    targets = np.concatenate([t for _, t in data])
    assert metric.value() == pytest.approx(100 * np.mean(logits.argmax(1) == targets))
    assert entry.name == "Accuracy" and entry.formatted.endswith("%")
    assert not metric.lower_is_better
    metric.clear()
    assert math.isnan(metric.value())


def test_accuracy_leaves_out_the_pad_token(device):
    rng = np.random.default_rng(1)
    data = batches(rng, [6, 7], 3)
    metric = AccuracyMetric(pad_token=2)
    for logits, targets in data:
        metric.update(AccuracyInput(tensor(logits, device), tensor(targets, device)), META)
    logits = np.concatenate([x for x, _ in data])
    targets = np.concatenate([t for _, t in data])
    kept = targets != 2
    assert metric.value() == pytest.approx(100 * np.mean(logits.argmax(1)[kept] == targets[kept]))
    # a batch of padding alone has no accuracy and leaves the epoch's as it was
    before = metric.value()
    entry = metric.update(AccuracyInput(tensor(logits[:2], device), tensor([2, 2], device)), META)
    assert entry.serialized == "nan" and metric.value() == before
    assert AccuracyMetric().with_pad_token(0).pad_token == 0


def test_accuracy_errors(device):
    metric = AccuracyMetric()
    logits = tensor(np.zeros((3, 4), np.float32), device)
    with pytest.raises(ShapeError, match=r"outputs \[3, 4\] and targets \[2\] have different"):
        metric.update(AccuracyInput(logits, tensor([0, 1], device)), META)
    with pytest.raises(ShapeError, match=r"outputs must have rank 2, got shape \[3\]"):
        metric.update(
            AccuracyInput(tensor([0.1, 0.2, 0.3], device), tensor([0, 1, 0], device)), META
        )
    with pytest.raises(
        EmberIndexError, match=r"targets must be class indices in \[0, 4\), got 0 to 4"
    ):
        metric.update(AccuracyInput(logits, tensor([0, 4, 1], device)), META)
    with pytest.raises(KindError, match="targets must be Int tensors, got Float"):
        metric.update(AccuracyInput(logits, tensor([0.0, 1.0, 1.0], device)), META)
    with pytest.raises(ArgumentError, match="pad_token must be an int or None"):
        AccuracyMetric(pad_token=1.5)


def test_top_k_accuracy_matches_torch_topk(device):
    rng = np.random.default_rng(2)
    data = batches(rng, [6, 9], 5)
    metric = TopKAccuracyMetric(3)
    for logits, targets in data:
        metric.update(TopKAccuracyInput(tensor(logits, device), tensor(targets, device)), META)
    logits = torch.tensor(np.concatenate([x for x, _ in data]), dtype=torch.float64)
    targets = torch.tensor(np.concatenate([t for _, t in data]))
    hits = (logits.topk(3, dim=1).indices == targets[:, None]).any(dim=1)
    assert metric.value() == pytest.approx(100 * hits.double().mean().item())
    assert metric.name == "TopKAccuracy@3" and not metric.lower_is_better


def test_top_k_accuracy_of_one_is_the_accuracy_even_with_ties(device):
    logits = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0], [3.0, 3.0, 3.0], [0.0, 1.0, 0.0]])
    targets = np.array([1, 1, 0, 1])
    top1, accuracy = TopKAccuracyMetric(1), AccuracyMetric()
    top1.update(TopKAccuracyInput(tensor(logits, device), tensor(targets, device)), META)
    accuracy.update(AccuracyInput(tensor(logits, device), tensor(targets, device)), META)
    assert (
        top1.value()
        == accuracy.value()
        == pytest.approx(100 * np.mean(logits.argmax(1) == targets))
    )


def test_top_k_accuracy_with_pad_and_errors(device):
    logits = np.array([[0.1, 0.5, 0.4], [0.9, 0.04, 0.06], [0.2, 0.3, 0.5]], np.float32)
    targets = np.array([2, 1, 0])
    metric = TopKAccuracyMetric(2, pad_token=0)
    metric.update(TopKAccuracyInput(tensor(logits, device), tensor(targets, device)), META)
    assert metric.value() == pytest.approx(50.0)  # item 0 hits, item 1 misses, item 2 is padding
    with pytest.raises(ArgumentError, match="k must be a positive int, got 0"):
        TopKAccuracyMetric(0)
    with pytest.raises(ArgumentError, match=r"k=4 is more than the 3 classes of outputs \[3, 3\]"):
        TopKAccuracyMetric(4).update(
            TopKAccuracyInput(tensor(logits, device), tensor(targets, device)), META
        )


# ---------------------------------------------------------------------- precision, recall, F
def confusion_counts(predicted: np.ndarray, truth: np.ndarray):
    """Per-class tp, fp, fn of Bool masks [N, C], through a 2x2 table per class."""
    table = np.zeros((predicted.shape[1], 2, 2), np.int64)  # class, truth, predicted
    for c in range(predicted.shape[1]):
        np.add.at(table[c], (truth[:, c].astype(int), predicted[:, c].astype(int)), 1)
    return table[:, 1, 1], table[:, 0, 1], table[:, 1, 0]


def multiclass_confusion(pred_classes: np.ndarray, true_classes: np.ndarray, num_classes: int):
    """Per-class tp, fp, fn from a multiclass confusion matrix (rows: truth)."""
    matrix = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(matrix, (true_classes, pred_classes), 1)
    tp = np.diag(matrix)
    return tp, matrix.sum(0) - tp, matrix.sum(1) - tp


def scores_from_counts(tp, fp, fn, beta):
    """Precision, recall and F-beta per entry, through P and R (NaN where undefined)."""
    tp, fp, fn = (np.asarray(x, np.float64) for x in (tp, fp, fn))
    with np.errstate(divide="ignore", invalid="ignore"):
        p, r = tp / (tp + fp), tp / (tp + fn)
        f = (1 + beta**2) * p * r / (beta**2 * p + r)
    f = np.where((tp == 0) & (fp + fn > 0), 0.0, f)
    return p, r, f


def reduce(values, reduction):
    values = values[~np.isnan(values)]
    return 100 * values.mean() if values.size else float("nan")


def expected(tp, fp, fn, reduction, beta=1.0):
    if reduction == "micro":
        tp, fp, fn = tp.sum(keepdims=True), fp.sum(keepdims=True), fn.sum(keepdims=True)
    return [reduce(v, reduction) for v in scores_from_counts(tp, fp, fn, beta)]


def run_all(metrics, inputs):
    for metric in metrics:
        for item in inputs:
            metric.update(item, META)
    return [m.value() for m in metrics]


@pytest.mark.parametrize("reduction", ["micro", "macro"])
def test_multiclass_scores_match_a_confusion_matrix(device, reduction):
    rng = np.random.default_rng(3)
    data = batches(rng, [7, 5, 9], 4)
    metrics = [
        PrecisionMetric.multiclass(class_reduction=reduction),
        RecallMetric.multiclass(class_reduction=reduction),
        FBetaScoreMetric.multiclass(beta=0.5, class_reduction=reduction),
    ]
    inputs = [
        ConfusionStatsInput(tensor(x, device), tensor(np.eye(4, dtype=bool)[t], device))
        for x, t in data
    ]
    values = run_all(metrics, inputs)
    logits = np.concatenate([x for x, _ in data])
    targets = np.concatenate([t for _, t in data])
    tp, fp, fn = multiclass_confusion(logits.argmax(1), targets, 4)
    assert values == pytest.approx(expected(tp, fp, fn, reduction, beta=0.5))
    assert [m.name for m in metrics] == ["Precision", "Recall", "FBetaScore@0.5"]
    assert not any(m.lower_is_better for m in metrics)
    # the batch's own score is the one logged
    last = PrecisionMetric.multiclass(class_reduction=reduction).update(inputs[-1], META)
    tp, fp, fn = multiclass_confusion(data[-1][0].argmax(1), data[-1][1], 4)
    assert float(last.serialized) == pytest.approx(expected(tp, fp, fn, reduction)[0])


def test_micro_multiclass_precision_and_recall_are_the_accuracy(device):
    rng = np.random.default_rng(4)
    ((logits, targets),) = batches(rng, [12], 3)
    item = ConfusionStatsInput(
        tensor(logits, device), tensor(np.eye(3, dtype=bool)[targets], device)
    )
    precision, recall = run_all([PrecisionMetric.multiclass(), RecallMetric.multiclass()], [item])
    accuracy = 100 * np.mean(logits.argmax(1) == targets)
    assert precision == pytest.approx(accuracy) and recall == pytest.approx(accuracy)


def test_multiclass_top_k_scores(device):
    rng = np.random.default_rng(5)
    ((logits, targets),) = batches(rng, [10], 5)
    truth = np.eye(5, dtype=bool)[targets]
    predicted = np.zeros_like(truth)
    np.put_along_axis(predicted, torch.tensor(logits).topk(2, dim=1).indices.numpy(), True, axis=1)
    item = ConfusionStatsInput(tensor(logits, device), tensor(truth, device))
    metrics = [
        cls.multiclass(top_k=2, class_reduction="macro") for cls in (PrecisionMetric, RecallMetric)
    ]
    metrics.append(FBetaScoreMetric.multiclass(beta=2.0, top_k=2, class_reduction="macro"))
    values = run_all(metrics, [item])
    assert values == pytest.approx(expected(*confusion_counts(predicted, truth), "macro", beta=2.0))


@pytest.mark.parametrize("reduction", ["micro", "macro"])
def test_multilabel_scores_with_a_threshold(device, reduction):
    rng = np.random.default_rng(6)
    probs = [rng.random((n, 3)).astype(np.float32) for n in (6, 4)]
    truth = [rng.random((n, 3)) < 0.4 for n in (6, 4)]
    inputs = [  # Int 0 / 1 targets are accepted as well as Bool ones
        ConfusionStatsInput(tensor(p, device), tensor(t.astype(np.int64), device))
        for p, t in zip(probs, truth)
    ]
    metrics = [
        PrecisionMetric.multilabel(0.3, reduction),
        RecallMetric.multilabel(0.3, reduction),
        FBetaScoreMetric.multilabel(1.0, 0.3, reduction),
    ]
    values = run_all(metrics, inputs)
    counts = confusion_counts(np.concatenate(probs) >= 0.3, np.concatenate(truth))
    assert values == pytest.approx(expected(*counts, reduction), nan_ok=True)


def test_binary_scores_with_a_threshold(device):
    scores = np.array([[0.9], [0.2], [0.6], [0.4], [0.7], [0.1]], np.float32)
    truth = np.array([[1], [0], [0], [1], [1], [1]], bool)
    item = ConfusionStatsInput(tensor(scores, device), tensor(truth, device))
    metrics = [
        PrecisionMetric.binary(0.5),
        RecallMetric.binary(0.5),
        FBetaScoreMetric.binary(1.0, 0.5),
    ]
    values = run_all(metrics, [item])
    predicted, actual = scores[:, 0] >= 0.5, truth[:, 0]
    tp = np.sum(predicted & actual)
    precision, recall = tp / predicted.sum(), tp / actual.sum()
    f1 = 2 * precision * recall / (precision + recall)
    assert values == pytest.approx([100 * precision, 100 * recall, 100 * f1])


def test_macro_scores_leave_out_undefined_classes(device):
    # class 2 is never predicted nor true: its precision and recall are 0 / 0
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.7, 0.3, 0.0]], np.float32)
    truth = np.eye(3, dtype=bool)[[0, 1, 1]]
    item = ConfusionStatsInput(tensor(scores, device), tensor(truth, device))
    precision = PrecisionMetric.multiclass(class_reduction="macro")
    precision.update(item, META)
    assert precision.value() == pytest.approx(100 * (1 / 2 + 1 / 1) / 2)
    precision.clear()
    assert math.isnan(precision.value())


def test_confusion_metric_errors(device):
    scores = tensor(np.zeros((3, 2), np.float32), device)
    with pytest.raises(
        ShapeError, match=r"predictions \[3, 2\] and targets \[3, 3\] must have the same"
    ):
        PrecisionMetric().update(
            ConfusionStatsInput(scores, tensor(np.eye(3, dtype=bool), device)), META
        )
    with pytest.raises(ArgumentError, match="Int targets must be 0 or 1"):
        RecallMetric().update(ConfusionStatsInput(scores, tensor([[0, 2]] * 3, device)), META)
    with pytest.raises(
        ArgumentError, match=r"top_k=3 is more than the 2 classes of predictions \[3, 2\]"
    ):
        RecallMetric(TopK(3)).update(
            ConfusionStatsInput(scores, tensor(np.eye(2, dtype=bool)[[0, 1, 0]], device)), META
        )
    with pytest.raises(
        ArgumentError, match="class_reduction must be 'micro' or 'macro', got 'mean'"
    ):
        PrecisionMetric.multiclass(class_reduction="mean")
    with pytest.raises(ArgumentError, match="beta must be positive, got 0"):
        FBetaScoreMetric(0)
    with pytest.raises(ArgumentError, match="the threshold must be finite"):
        PrecisionMetric(Threshold(float("nan")))
    metric = PrecisionMetric()
    metric.update(
        ConfusionStatsInput(scores, tensor(np.eye(2, dtype=bool)[[0, 1, 0]], device)), META
    )
    with pytest.raises(
        ShapeError, match="predictions have 3 classes, but the earlier batches of the epoch had 2"
    ):
        metric.update(ConfusionStatsInput(tensor(np.eye(3, dtype=np.float32), device),
                                          tensor(np.eye(3, dtype=bool), device)), META)  # fmt: skip


# ---------------------------------------------------------------------- AUROC
def mann_whitney(scores: np.ndarray, positive: np.ndarray) -> float:
    """AUROC as the share of (positive, negative) pairs ordered right, ties counting half."""
    pos, neg = scores[positive][:, None], scores[~positive][None, :]
    return float(np.mean((pos > neg) + 0.5 * (pos == neg)))


def test_binary_auroc_with_ties_matches_mann_whitney(device):
    rng = np.random.default_rng(7)
    sizes, data = [20, 13], []
    for n in sizes:
        logits = np.round(rng.standard_normal((n, 2)), 1)  # rounding makes ties
        logits[:, 0] = 0.0
        data.append((logits, rng.integers(0, 2, n)))
    metric = AurocMetric()
    areas = []
    for logits, targets in data:
        entry = metric.update(AurocInput(tensor(logits, device), tensor(targets, device)), META)
        prob = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=1)[:, 1].numpy()
        areas.append(mann_whitney(prob, targets == 1))
        assert float(entry.serialized) == pytest.approx(100 * areas[-1])
    assert metric.value() == pytest.approx(100 * np.average(areas, weights=sizes))
    assert metric.name == "AUROC" and not metric.lower_is_better


def test_binary_auroc_of_two_logits_is_that_of_the_softmax(device):
    rng = np.random.default_rng(8)
    logits, targets = rng.standard_normal((15, 2)).astype(np.float32), rng.integers(0, 2, 15)
    metric = AurocMetric()
    metric.update(AurocInput(tensor(logits, device), tensor(targets, device)), META)
    prob = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=1)[:, 1].numpy()
    assert metric.value() == pytest.approx(100 * mann_whitney(prob, targets == 1))


def test_binary_auroc_ties_items_whose_logits_differ_equally(device):
    # softmax(x)[1] = sigmoid(x1 - x0): equal differences are ties, which the rounding of a
    # softmax could break; f32 logits have exact float64 differences
    rng = np.random.default_rng(0)
    logits = np.round(rng.standard_normal((300, 2)) * 4) / 4  # quarters: many equal gaps
    logits = logits.astype(np.float32)
    targets = rng.integers(0, 2, 300)
    metric = AurocMetric()
    metric.update(AurocInput(tensor(logits, device), tensor(targets, device)), META)
    gap = logits[:, 1].astype(np.float64) - logits[:, 0]
    assert len(np.unique(gap)) < 60  # the case has ties
    assert metric.value() == pytest.approx(100 * mann_whitney(gap, targets == 1))


def test_auroc_of_one_score_column(device):
    scores = np.array([[0.1], [0.4], [0.35], [0.8], [0.4]], np.float32)
    targets = np.array([0, 0, 1, 1, 1])
    metric = AurocMetric()
    metric.update(AurocInput(tensor(scores, device), tensor(targets, device)), META)
    assert metric.value() == pytest.approx(100 * mann_whitney(scores[:, 0], targets == 1))


def test_multiclass_auroc_is_the_one_vs_rest_mean(device):
    rng = np.random.default_rng(9)
    logits, targets = np.round(rng.standard_normal((30, 4)), 1), rng.integers(0, 3, 30)
    metric = AurocMetric()
    metric.update(AurocInput(tensor(logits, device), tensor(targets, device)), META)
    prob = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=1).numpy()
    # class 3 has no positives in this batch: it is left out
    per_class = [mann_whitney(prob[:, c], targets == c) for c in range(3)]
    assert metric.value() == pytest.approx(100 * np.mean(per_class))


def test_auroc_of_a_single_class_batch_is_left_out(device):
    metric = AurocMetric()
    good = (np.array([[0.0, 1.0], [0.0, -1.0]]), np.array([1, 0]))
    metric.update(AurocInput(tensor(good[0], device), tensor(good[1], device)), META)
    entry = metric.update(AurocInput(tensor(good[0], device), tensor([1, 1], device)), META)
    assert entry.serialized == "nan" and metric.value() == pytest.approx(100.0)
    with pytest.raises(EmberIndexError, match=r"in \[0, 2\), got 0 to 2"):
        metric.update(AurocInput(tensor(good[0], device), tensor([0, 2], device)), META)
    metric.clear()
    assert math.isnan(metric.value())


# ---------------------------------------------------------------------- learning rate
def test_learning_rate_reads_the_metadata():
    metric = LearningRateMetric()
    for lr in (1e-3, 5e-4):
        entry = metric.update(None, MetricMetadata(Progress(1, 2), 1, 1, 1, lr=lr))
        assert float(entry.serialized) == lr and metric.value() == lr
    entry = metric.update(None, META)
    assert (entry.formatted, entry.serialized) == ("n/a", "nan") and math.isnan(metric.value())
    assert metric.name == "LearningRate" and metric.input_type is None


# ---------------------------------------------------------------------- CPU
def test_cpu_usage_reads_psutil_and_caches_between_refreshes(monkeypatch):
    import psutil

    readings = iter([12.5, 80.0, 40.0])
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: next(readings))
    metric = CpuUse(refresh_interval=3600.0)  # the first reading starts psutil's clock
    entry = metric.update(None, META)
    assert (entry.name, entry.formatted, metric.value()) == ("CPU Usage", "80.00%", 80.0)
    assert metric.update(None, META).serialized == "80.0"  # not refreshed yet
    metric.refresh_interval = 0.0
    assert metric.update(None, META).serialized == "40.0"
    assert metric.lower_is_better


def test_cpu_usage_of_the_real_system():
    metric = CpuUse(refresh_interval=0.0)
    metric.update(None, META)
    assert 0.0 <= metric.value() <= 100.0


def test_cpu_memory(monkeypatch):
    import psutil

    memory = namedtuple("memory", "total available")(8_000_000_000, 6_000_000_000)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)
    metric = CpuMemory()
    entry = metric.update(None, META)
    used, total = (memory.total - memory.available) / 1e9, memory.total / 1e9
    assert metric.value() == pytest.approx(used)
    assert entry.formatted == f"{used:.2f}/{total:.2f} GB ({100 * used / total:.2f}%)"


Reading = namedtuple("Reading", "label current high critical")
INTEL = [Reading("Core 0", 51.0, None, None), Reading("Package id 0", 55.0, None, None)]
AMD = [Reading("Tccd1", 61.0, 90, 95), Reading("Tccd2", 63.0, 90, 95)]
ACPI = [Reading("", 40.0, None, None)]


@pytest.mark.parametrize(
    ("chips", "value"),
    [
        ({"coretemp": INTEL}, 55.0),  # the package's reading
        ({"acpitz": ACPI, "k10temp": AMD}, 63.0),  # the CPU's own chip first, its hottest
        ({}, None),
        ({"nvme": [Reading("Composite", 35.0, None, None)]}, None),
    ],
)
def test_cpu_temperature(monkeypatch, chips, value):
    import psutil

    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: chips, raising=False)
    metric = CpuTemperature()
    entry = metric.update(None, META)
    if value is None:
        assert not metric.available and math.isnan(metric.value())
        assert (entry.formatted, entry.serialized) == (
            "unavailable (no CPU temperature sensor)",
            "nan",
        )
    else:
        assert metric.available and metric.value() == value
        assert entry.formatted == f"{value:.1f}°C"


def test_cpu_temperature_without_sensor_support(monkeypatch):
    import psutil

    monkeypatch.delattr(psutil, "sensors_temperatures", raising=False)
    metric = CpuTemperature()
    assert metric.update(None, META).serialized == "nan" and not metric.available


def test_cpu_temperature_of_the_real_system():
    metric = CpuTemperature()
    entry = metric.update(None, META)
    assert metric.available == (not math.isnan(metric.value())) == (entry.serialized != "nan")


def test_cpu_metrics_without_psutil(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)
    with pytest.raises(BackendUnavailableError, match=r"need psutil.*pip install psutil"):
        CpuUse()
    with pytest.raises(ArgumentError, match="refresh_interval must be >= 0 seconds, got -1"):
        CpuMemory(refresh_interval=-1)


# ---------------------------------------------------------------------- GPU (NVML)
def fake_nvml(count=2, init_error=None, temperature_error=None):
    """A stand-in for pynvml: GPU i is used 10 * (i + 1) percent."""
    module = types.ModuleType("pynvml")
    module.NVML_TEMPERATURE_GPU = 0

    def init():
        if init_error:
            raise RuntimeError(init_error)

    def temperature(handle, sensor):
        if temperature_error:
            raise RuntimeError(temperature_error)
        return 40 + handle

    module.nvmlInit = init
    module.nvmlDeviceGetCount = lambda: count
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=10 * (h + 1))
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=(h + 1) * 10**9, total=8 * 10**9
    )
    module.nvmlDeviceGetTemperature = temperature
    return module


@pytest.fixture
def nvml(monkeypatch):
    """Installs a fake pynvml (or none) and starts NVML afresh."""

    def install(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        monkeypatch.setattr(gpu_module, "_SESSION", None)

    return install


def test_gpu_metrics_read_nvml(nvml):
    nvml(fake_nvml())
    usage, memory, temperature = GpuUse(1), GpuMemory(1), GpuTemperature()
    assert usage.update(None, META).formatted == "20.00%" and usage.value() == 20.0
    assert memory.update(None, META).formatted == "2.00/8.00 GB (25.00%)" and memory.value() == 2.0
    assert temperature.update(None, META).formatted == "40.0°C" and temperature.reason is None
    assert (usage.name, memory.name, temperature.name) == (
        "GPU Usage #1",
        "GPU Memory #1",
        "GPU Temperature",
    )
    assert all(m.lower_is_better for m in (usage, memory, temperature))
    entry = CudaMetric().update(None, META)
    assert (
        entry.formatted
        == entry.serialized
        == ("GPU #0 usage 10.00% | memory 1.00/8.00 GB; GPU #1 usage 20.00% | memory 2.00/8.00 GB")
    )
    assert nvml_unavailable(1) is None


@pytest.mark.parametrize(
    ("module", "index", "reason"),
    [
        (None, 0, "pynvml is not installed: pip install nvidia-ml-py"),
        (fake_nvml(init_error="Driver Not Loaded"), 0, "NVML could not start: Driver Not Loaded"),
        (fake_nvml(count=0), 0, "NVML finds no GPU"),
        (fake_nvml(count=1), 2, "there is no GPU 2: NVML finds 1"),
    ],
)
def test_gpu_metrics_without_a_gpu_say_why(nvml, module, index, reason):
    nvml(module)
    assert nvml_unavailable(index) == reason
    for metric in (GpuUse(index), GpuMemory(index), GpuTemperature(index)):
        entry = metric.update(None, META)
        assert (entry.formatted, entry.serialized) == (f"unavailable ({reason})", "nan")
        assert metric.reason == reason and math.isnan(metric.value())
    if index == 0:
        assert CudaMetric().update(None, META).formatted == f"unavailable ({reason})"


def test_gpu_reading_that_fails_is_reported(nvml):
    nvml(fake_nvml(temperature_error="Not Supported"))
    metric = GpuTemperature(refresh_interval=0.0)
    assert metric.update(None, META).formatted == "unavailable (NVML: Not Supported)"
    with pytest.raises(ArgumentError, match="device_index must be an int >= 0, got -1"):
        GpuUse(-1)


def test_gpu_metrics_on_a_real_gpu():
    reason = nvml_unavailable()
    if reason is not None:
        pytest.skip(f"no GPU to read through NVML: {reason}")
    usage, memory, temperature = GpuUse(), GpuMemory(), GpuTemperature()
    for metric in (usage, memory, temperature):
        metric.update(None, META)
        assert metric.reason is None, metric.reason
    assert 0.0 <= usage.value() <= 100.0
    assert 0.0 < memory.value() <= memory.total
    assert 0.0 < temperature.value() < 120.0
