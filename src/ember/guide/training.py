"""The guide's training: the run's config, the data loaders and the learner.

:func:`train` writes everything under its artifact folder::

    <artifact_dir>/
        config.json          the TrainingConfig of the run (inference reads it)
        experiment.log       the learner's log
        train/epoch-<n>/     the training metrics of each epoch (Accuracy.log, Loss.log)
        valid/epoch-<n>/     the validation metrics
        checkpoint/          model, optimizer and scheduler of the last epochs
        model.mpk.gz         the trained model (CompactRecorder: half precision)
        report/              the training report, with matplotlib installed: index.html
                             and a chart per metric (``ember report`` writes it again)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import ember
import ember.distributed
from ember.backend.device import Device
from ember.config import Config
from ember.config.fields import NonNegativeInt, PositiveFloat, PositiveInt
from ember.data.dataloader.builder import DataLoaderBuilder
from ember.data.dataloader.loader import DataLoader, IndexedDataset
from ember.data.vision.mnist import MnistDataset
from ember.guide.data import MnistBatch, MnistBatcher
from ember.guide.model import Model, ModelConfig
from ember.nn._util import is_training
from ember.optim.adam import AdamConfig
from ember.record.recorder import CompactRecorder
from ember.train.learner.builder import LearnerBuilder
from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.loss import LossMetric
from ember.train.renderer.base import MetricsRenderer
from ember.train.tracker.base import ExperimentTracker

CONFIG_FILE = "config.json"
"""The run's config, in the artifact folder."""

MODEL_FILE = "model"
"""The trained model's record, in the artifact folder (the recorder adds its extension)."""

RECORDER = CompactRecorder
"""The recorder of the trained model: gzipped MessagePack at half precision, as the book."""


class TrainingConfig(Config):
    """The settings of a guide run; saved as ``config.json`` in the artifact folder.

    Args:
        model: the model's configuration.
        optimizer: the optimizer's configuration.
        num_epochs: passes over the training set. Default: 10.
        batch_size: digits per batch. Default: 64.
        num_workers: threads that prepare batches ahead. Default: 0: the guide's batcher
            is cheap enough that worker threads only add overhead on a CPU device (see
            :mod:`ember.data.dataloader.loader`); on CUDA, 1 is the fastest setting.
            Burn's book uses 4.
        seed: seeds the device's generator (weights, dropout) and the shuffling.
            Default: 42.
        learning_rate: the constant learning rate. Default: 1e-4.

    Example:
        >>> from ember.guide.model import ModelConfig
        >>> from ember.guide.training import TrainingConfig
        >>> from ember.optim.adam import AdamConfig
        >>> config = TrainingConfig(ModelConfig(10, 512), AdamConfig())
        >>> config.num_epochs, config.batch_size, config.learning_rate
        (10, 64, 0.0001)
        >>> TrainingConfig.load_json(config.to_json()) == config
        True
    """

    model: ModelConfig
    optimizer: AdamConfig
    num_epochs: PositiveInt = 10
    batch_size: PositiveInt = 64
    num_workers: NonNegativeInt = 0
    seed: NonNegativeInt = 42
    learning_rate: PositiveFloat = 1e-4


def default_config() -> TrainingConfig:
    """The guide's run: 10 classes, a hidden layer of 512, Adam with Burn's defaults."""
    return TrainingConfig(ModelConfig(num_classes=10, hidden_size=512), AdamConfig())


def autodiff_device(device: Device) -> Device:
    """``device`` itself when it has autodiff, else ``device.autodiff()``."""
    return device if is_training(device) else device.autodiff()


def inference_device(device: Device) -> Device:
    """``device`` without autodiff: its inner device when it has autodiff, else itself.

    Only the autodiff decorator comes off: ``fusion(ndarray)`` stays fused, and
    ``autodiff(fusion(ndarray))`` gives ``fusion(ndarray)``.
    """
    return device.inner() if is_training(device) else device


def make_loaders(
    config: TrainingConfig,
    device: Device,
    train_dataset: IndexedDataset | None = None,
    valid_dataset: IndexedDataset | None = None,
) -> tuple[DataLoader[MnistBatch], DataLoader[MnistBatch]]:
    """The training loader (on ``device``) and the validation loader (on its inner device).

    The datasets default to MNIST's training and test splits; as in the book, the test
    split serves as the validation set (a real project would hold out its own).
    """
    train_dataset = MnistDataset.train() if train_dataset is None else train_dataset
    valid_dataset = MnistDataset.test() if valid_dataset is None else valid_dataset

    def loader(dataset: IndexedDataset, on: Device) -> DataLoader[MnistBatch]:
        return (
            DataLoaderBuilder(MnistBatcher())
            .batch_size(config.batch_size)
            .shuffle(config.seed)
            .num_workers(config.num_workers)
            .set_device(on)
            .build(dataset)
        )

    return loader(train_dataset, device), loader(valid_dataset, device.inner())


def train(
    artifact_dir: str | os.PathLike,
    config: TrainingConfig,
    device: Device,
    *,
    renderer: MetricsRenderer | None = None,
    train_dataset: IndexedDataset | None = None,
    valid_dataset: IndexedDataset | None = None,
    trackers: Sequence[ExperimentTracker] = (),
) -> Model:
    """Trains the guide's model and saves it in ``artifact_dir``; returns the trained model.

    Args:
        artifact_dir: the folder of the run's files (see the module's notes); created
            when missing.
        config: the run's settings.
        device: where to train; a device without autodiff is wrapped with
            ``device.autodiff()``, and validation runs on its inner device.
        renderer: how the run is shown. Default: the dashboard when standard output is
            a terminal, the plain renderer otherwise.
        train_dataset: the training items (:class:`~ember.data.vision.mnist.MnistItem`).
            Default: MNIST's training split.
        valid_dataset: the validation items. Default: MNIST's test split.
        trackers: experiment trackers (TensorBoard, MLflow) that also follow the run,
            with ``config``'s fields as the run's parameters.

    Example:
        >>> import pathlib, tempfile
        >>> import ember
        >>> from ember.data.dataset.transform.partial import PartialDataset
        >>> from ember.data.vision.mnist import MnistDataset
        >>> from ember.guide.training import default_config, train
        >>> from ember.train.renderer.plain import PlainRenderer
        >>> folder = tempfile.mkdtemp()
        >>> config = default_config().with_num_epochs(1)
        >>> digits = PartialDataset(MnistDataset.test(), 0, 128)
        >>> model = train(folder, config, ember.device("ndarray"), renderer=PlainRenderer(every=0),
        ...               train_dataset=digits, valid_dataset=digits)  # doctest: +ELLIPSIS
        [train] epoch 1/1 done | Accuracy ... | Loss ...
        [valid] epoch 1/1 done | Accuracy ... | Loss ...
        Learner summary: Model, 1 epoch
        ...
        >>> sorted(p.name for p in pathlib.Path(folder).iterdir() if p.is_file())
        ['config.json', 'experiment.log', 'model.mpk.gz']
    """
    artifact_dir = Path(artifact_dir)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    writes = ember.distributed.is_main_process()  # in a job of several processes, rank 0
    if writes:
        config.save(artifact_dir / CONFIG_FILE)

    device = autodiff_device(device)
    ember.seed(device, config.seed)
    train_loader, valid_loader = make_loaders(config, device, train_dataset, valid_dataset)

    builder = (
        LearnerBuilder(artifact_dir)
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer()
        .devices([device])
        .num_epochs(config.num_epochs)
        .summary()
    )
    if renderer is not None:
        builder = builder.renderer(renderer)
    for tracker in trackers:
        builder = builder.tracker(tracker)
    if trackers:
        builder = builder.params(config)
    learner = builder.build(
        config.model.init(device), config.optimizer.init(), config.learning_rate
    )
    model = cast(Model, learner.fit(train_loader, valid_loader))
    if writes:
        model.save_file(artifact_dir / MODEL_FILE, RECORDER())
    return model
