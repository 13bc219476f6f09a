"""A small synthetic classification task for the learner's tests, and test metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.data.dataloader.batcher import Batcher
from ember.data.dataloader.builder import DataLoaderBuilder
from ember.module import Module
from ember.nn.linear import Linear, LinearConfig
from ember.nn.loss import CrossEntropyLoss, CrossEntropyLossConfig
from ember.train.metric.base import Metric, MetricEntry, Numeric, NumericMetricState
from ember.train.output import ClassificationOutput
from ember.train.renderer.base import MetricsRenderer
from ember.train.step import TrainOutput

FEATURES, CLASSES = 4, 3
DEVICE = ember.device("ndarray").autodiff()


class Classifier(Module):
    linear: Linear
    loss: CrossEntropyLoss

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def classify(self, batch: tuple[Tensor, Tensor]) -> ClassificationOutput:
        x, y = batch
        logits = self(x)
        return ClassificationOutput(self.loss(logits, y), logits, y)

    def train_step(self, batch: tuple[Tensor, Tensor]) -> TrainOutput:
        item = self.classify(batch)
        return TrainOutput.new(self, item.loss.backward(), item)

    def valid_step(self, batch: tuple[Tensor, Tensor]) -> ClassificationOutput:
        return self.classify(batch)


def classifier(seed: int = 0, device: ember.Device = DEVICE) -> Classifier:
    device.seed(seed)
    return Classifier(LinearConfig(FEATURES, CLASSES).init(device), CrossEntropyLossConfig().init())


class PairBatcher(Batcher[tuple[np.ndarray, int], tuple[Tensor, Tensor]]):
    def batch(self, items, device):
        x = np.stack([features for features, _ in items]).astype(np.float32)
        y = np.array([label for _, label in items], dtype=np.int64)
        return Tensor.from_data(x, device), Tensor.from_data(y, device)


def dataset(size: int, seed: int) -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)  # learnable labels
    return [(x[i], int(y[i])) for i in range(size)]


def loaders(train_size: int = 24, valid_size: int = 8, batch_size: int = 4, seed: int = 5,
            device: ember.Device = DEVICE):  # fmt: skip
    train = DataLoaderBuilder(PairBatcher()).batch_size(batch_size).shuffle(seed)
    valid = DataLoaderBuilder(PairBatcher()).batch_size(batch_size)
    return (train.set_device(device).build(dataset(train_size, 1)),
            valid.set_device(device).build(dataset(valid_size, 2)))  # fmt: skip


def autodiff_device(name: str) -> ember.Device:
    """The autodiff device of ``ndarray``, ``torch`` or ``torch-cuda`` (skipped without a GPU)."""
    if name == "torch-cuda":
        if ember.device_count("torch", "cuda") == 0:
            pytest.skip("no CUDA device: the torch-cuda case runs only where torch sees a GPU")
        return ember.device("torch", "cuda:0").autodiff()
    return ember.device(name).autodiff()


def weights(model: Module) -> dict[str, np.ndarray]:
    return {path: param.val().to_numpy() for path, param in model.params()}


def assert_same_weights(a: Module, b: Module) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for path in wa:
        np.testing.assert_array_equal(wa[path], wb[path], err_msg=path)


def log_tree(directory: Path) -> dict[str, str]:
    """Every metric log under ``directory`` (train/ and valid/), by relative path."""
    return {
        str(path.relative_to(directory)): path.read_text()
        for split in ("train", "valid")
        for path in sorted((directory / split).rglob("*.log"))
    }


class ScriptedMetric(Numeric, Metric):
    """A numeric metric whose value in epoch ``e`` is ``values[e - 1]`` (any output feeds it)."""

    name = "Scripted"
    input_type = None

    def __init__(self, values: list[float], lower_is_better: bool = True) -> None:
        self.values = values
        self.lower_is_better = lower_is_better  # type: ignore[misc]
        self.state = NumericMetricState()

    def update(self, item, metadata) -> MetricEntry:
        return self.state.update(self.values[metadata.epoch - 1], 1, self.name)

    def clear(self) -> None:
        self.state.reset()

    def value(self) -> float:
        return self.state.value()


class CallbackRenderer(MetricsRenderer):
    """A silent renderer that calls ``on_train(progress)`` after each training iteration."""

    def __init__(self, on_train=None) -> None:
        self.on_train = on_train
        self.closed = 0
        self.epoch_ends: list[tuple[str, int]] = []
        self.updates: list[tuple[str, str, float | None]] = []

    def update_train(self, update) -> None:
        self.updates.append(("train", update.entry.name, update.value))

    def update_valid(self, update) -> None:
        self.updates.append(("valid", update.entry.name, update.value))

    def render_train(self, progress) -> None:
        if self.on_train is not None:
            self.on_train(progress)

    def render_valid(self, progress) -> None:
        pass

    def on_epoch_end(self, split, epoch) -> None:
        self.epoch_ends.append((split, epoch))

    def close(self) -> None:
        self.closed += 1
