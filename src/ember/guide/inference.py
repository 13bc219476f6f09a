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


def quantize_config(value: str):
    """The guide's weight-only quantization: ``value`` (``"int8"`` or ``"int4"``) with one
    scale per output channel of every convolution and linear layer."""
    from ember.quantization import QuantizeConfig, QuantScheme

    if value not in ("int8", "int4"):
        raise ArgumentError(f"infer: quantize must be 'int8' or 'int4', got {value!r}")
    return QuantizeConfig(scheme=QuantScheme(value=value, granularity="axis", axis=-1),
                          conv_scheme=QuantScheme(value=value, granularity="axis", axis=0))  # fmt: skip


def infer(
    artifact_dir: str | os.PathLike,
    device: Device,
    item: MnistItem | None = None,
    *,
    count: int = 10,
    dataset: IndexedDataset | None = None,
    quantize: str | None = None,
) -> list[tuple[int, int]]:
    """Prints the predicted and expected digit of test items; returns the ``(predicted, expected)``.

    Args:
        artifact_dir: the folder a :func:`~ember.guide.training.train` run wrote.
        device: where to run the model (an autodiff device runs on its inner device).
        item: the one digit to classify; when None, the first ``count`` items of ``dataset``.
        count: how many items of ``dataset`` to classify when no ``item`` is given.
            Default: 10.
        dataset: the items to take them from. Default: MNIST's test split.
        quantize: ``"int8"`` or ``"int4"`` to run the model with its convolution and linear
            weights quantized (weight-only, one scale per output channel); None (default)
            runs it in float.

    Raises:
        NoTrainedModelError: no trained model in ``artifact_dir``.
        ArgumentError: ``count`` is not an integer from 1 to the dataset's size, or
            ``quantize`` is not ``"int8"`` / ``"int4"``.
    """
    _, model = load_trained(artifact_dir, device)
    device = inference_device(device)
    if quantize is not None:
        model = model.quantize(quantize_config(quantize))
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
