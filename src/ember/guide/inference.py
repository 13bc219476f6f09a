"""The guide's inference: the trained model from its artifact folder, applied to test digits."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ember.backend.device import Device
from ember.backend.errors import ArgumentError, EmberError
from ember.data.dataloader.loader import IndexedDataset
from ember.data.vision.mnist import MnistDataset, MnistItem
from ember.guide.data import MnistBatcher
from ember.guide.model import Model
from ember.guide.training import (
    CONFIG_FILE,
    MODEL_FILE,
    RECORDER,
    TrainingConfig,
    inference_device,
)


class NoTrainedModelError(EmberError, FileNotFoundError):
    """An artifact folder without the files of a finished training run."""


def load_trained(artifact_dir: str | os.PathLike, device: Device) -> tuple[TrainingConfig, Model]:
    """The run's config and its trained model, for inference on ``device``.

    The model is built from the saved config, then given the saved weights; on an
    autodiff device, it is moved to the inner device (no gradients, no dropout).

    Raises:
        NoTrainedModelError: ``artifact_dir`` lacks ``config.json`` or the model file.
    """
    folder = Path(artifact_dir)
    recorder = RECORDER()
    model_path = recorder.path_for(folder / MODEL_FILE)
    missing = [p.name for p in (folder / CONFIG_FILE, model_path) if not p.is_file()]
    if missing:
        raise NoTrainedModelError(
            f"no trained model in {folder} (missing {', '.join(missing)}): run "
            f"`ember guide train --artifact-dir {folder}` first"
        )
    config = TrainingConfig.load(folder / CONFIG_FILE)
    device = inference_device(device)
    model = config.model.init(device).load_record(recorder.load(model_path))
    return config, model


def predict(model: Model, items: Sequence[MnistItem], device: Device) -> list[int]:
    """The class ``model`` predicts for each item (one batch on ``device``)."""
    batch = MnistBatcher().batch(list(items), device)
    return model(batch.images).argmax(1).reshape([len(items)]).tolist()


QUANTIZE_CHOICES = ("int8", "int4", "int8-static")
"""How the guide can quantize its model (see :func:`quantize_config`)."""
CALIBRATION_BATCHES = 8
"""Batches of 64 training digits that calibrate ``int8-static``."""


def quantize_config(value: str):
    """The guide's quantization: ``"int8"`` weight-only (one scale per output channel of
    every convolution and linear layer), ``"int4"`` weight-only (the linear layers in blocks
    of 32 inputs, the convolutions per output channel), or ``"int8-static"`` (int8 weights,
    and every layer's input int8 with calibrated parameters)."""
    from ember.quantization import ActivationConfig, QuantizeConfig, QuantScheme

    if value not in QUANTIZE_CHOICES:
        choices = ", ".join(map(repr, QUANTIZE_CHOICES))
        raise ArgumentError(f"infer: quantize must be one of {choices}, got {value!r}")
    if value == "int4":
        return QuantizeConfig(
            scheme=QuantScheme(value="int4", granularity="block", axis=0, block_size=32),
            conv_scheme=QuantScheme(value="int4", granularity="axis", axis=0))  # fmt: skip
    return QuantizeConfig(scheme=QuantScheme(granularity="axis", axis=-1),
                          conv_scheme=QuantScheme(granularity="axis", axis=0),
                          activations=ActivationConfig() if value == "int8-static" else None)  # fmt: skip


def quantized(model: Model, value: str, device: Device,
              calibration: IndexedDataset | None = None) -> Model:  # fmt: skip
    """``model`` quantized as :func:`quantize_config` says; ``int8-static`` calibrates on the
    first :data:`CALIBRATION_BATCHES` batches of 64 of ``calibration`` (default: MNIST's
    training split)."""
    config = quantize_config(value)
    if config.activations is None:
        return model.quantize(config)
    calibration = MnistDataset.train() if calibration is None else calibration
    count = min(len(calibration), CALIBRATION_BATCHES * 64)
    batcher = MnistBatcher()
    batches = (batcher.batch([calibration[i] for i in range(start, min(start + 64, count))],
                             device).images for start in range(0, count, 64))  # fmt: skip
    return model.quantize(config, batches)


def infer(
    artifact_dir: str | os.PathLike,
    device: Device,
    item: MnistItem | None = None,
    *,
    count: int = 10,
    dataset: IndexedDataset | None = None,
    quantize: str | None = None,
    calibration: IndexedDataset | None = None,
) -> list[tuple[int, int]]:
    """Prints the predicted and expected digit of test items; returns the ``(predicted, expected)``.

    Args:
        artifact_dir: the folder a :func:`~ember.guide.training.train` run wrote.
        device: where to run the model (an autodiff device runs on its inner device).
        item: the one digit to classify; when None, the first ``count`` items of ``dataset``.
        count: how many items of ``dataset`` to classify when no ``item`` is given.
            Default: 10.
        dataset: the items to take them from. Default: MNIST's test split.
        quantize: ``"int8"``, ``"int4"`` or ``"int8-static"`` to run the model quantized
            (see :func:`quantize_config`); None (default) runs it in float.
        calibration: the digits ``int8-static`` calibrates on (default: MNIST's training
            split).

    Raises:
        NoTrainedModelError: no trained model in ``artifact_dir``.
        ArgumentError: ``count`` is not an integer from 1 to the dataset's size, or
            ``quantize`` is not one of :data:`QUANTIZE_CHOICES`.
    """
    _, model = load_trained(artifact_dir, device)
    device = inference_device(device)
    if quantize is not None:
        model = quantized(model, quantize, device, calibration)
    if item is not None:
        items, indices = [item], None
    else:
        dataset = MnistDataset.test() if dataset is None else dataset
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= len(dataset):
            raise ArgumentError(
                f"infer: count must be an integer from 1 to {len(dataset)} (the dataset's "
                f"size), got {count!r}"
            )
        indices = range(count)
        items = [dataset[i] for i in indices]

    results = list(zip(predict(model, items, device), (it.label for it in items)))
    for position, (predicted, expected) in enumerate(results):
        where = "item" if indices is None else f"test item {indices[position]}"
        mark = "" if predicted == expected else "  (wrong)"
        print(f"{where}: predicted {predicted}, expected {expected}{mark}")
    correct = sum(p == e for p, e in results)
    if len(results) > 1:
        print(f"{correct} of {len(results)} correct")
    return results
