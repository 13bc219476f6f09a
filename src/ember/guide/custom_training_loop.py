"""The guide's model trained by a loop written out by hand, without the learner.

Each epoch iterates over the training batches: the forward pass, the cross-entropy
loss, ``loss.backward()``, the gradients mapped to the model's parameters
(:class:`~ember.optim.grads.GradientsParams`) and one optimizer step, which returns the
updated model. Then ``model.valid()`` (the same weights on the inner device: no
gradients, no dropout) runs over the validation batches. Nothing is registered with
the optimizer and there is no ``zero_grad``: the gradients of a step are a value that
the step consumes.
"""

from __future__ import annotations

from dataclasses import dataclass

import ember
from ember.backend.device import Device
from ember.backend.errors import ArgumentError
from ember.data.dataloader.loader import IndexedDataset
from ember.guide.data import MnistBatch
from ember.guide.model import Model
from ember.guide.training import TrainingConfig, autodiff_device, make_loaders
from ember.nn.loss import CrossEntropyLossConfig
from ember.optim.grads import GradientsParams
from ember.tensor import Tensor


@dataclass(frozen=True)
class EpochResult:
    """The mean loss and the accuracy (in percent) of one epoch, training and validation."""

    epoch: int
    train_loss: float
    train_accuracy: float
    valid_loss: float
    valid_accuracy: float


class _Running:
    """Sums of one epoch's losses and correct predictions, weighted by batch size."""

    def __init__(self) -> None:
        self.loss = 0.0
        self.correct = 0
        self.items = 0

    def add(self, loss: float, correct: int, items: int) -> None:
        self.loss += loss * items
        self.correct += correct
        self.items += items

    def means(self) -> tuple[float, float]:
        return self.loss / max(self.items, 1), 100.0 * self.correct / max(self.items, 1)


def _correct(output: Tensor, targets: Tensor) -> int:
    """How many rows of ``output`` have their highest score at the target class."""
    predicted = output.argmax(1).reshape([targets.shape[0]])
    return int(predicted.equal(targets).int().sum().item())


def run(
    config: TrainingConfig,
    device: Device,
    *,
    log_every: int = 100,
    train_dataset: IndexedDataset | None = None,
    valid_dataset: IndexedDataset | None = None,
) -> tuple[Model, list[EpochResult]]:
    """Trains the guide's model with a hand-written loop; returns it and each epoch's results.

    Args:
        config: the same settings as the learner's run (epochs, batch size, seed, ...).
        device: where to train (wrapped with ``device.autodiff()`` when it has no autodiff).
        log_every: print a line every this many training iterations (0: only the
            epoch lines). Default: 100.
        train_dataset: the training items. Default: MNIST's training split.
        valid_dataset: the validation items. Default: MNIST's test split.

    Example:
        >>> import ember
        >>> from ember.data.dataset.transform.partial import PartialDataset
        >>> from ember.data.vision.mnist import MnistDataset
        >>> from ember.guide.custom_training_loop import run
        >>> from ember.guide.training import default_config
        >>> digits = PartialDataset(MnistDataset.test(), 0, 64)
        >>> model, results = run(default_config().with_num_epochs(1), ember.device("ndarray"),
        ...                      log_every=0, train_dataset=digits, valid_dataset=digits)
        ... # doctest: +ELLIPSIS
        [Epoch 1] train: loss ... accuracy ...% | valid: loss ... accuracy ...%
        >>> [r.epoch for r in results]
        [1]
    """
    if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 0:
        raise ArgumentError(f"run: log_every must be an integer >= 0, got {log_every!r}")
    device = autodiff_device(device)
    ember.seed(device, config.seed)
    model = config.model.init(device)
    optimizer = config.optimizer.init()
    loss_fn = CrossEntropyLossConfig().init()
    train_loader, valid_loader = make_loaders(config, device, train_dataset, valid_dataset)

    def step(model: Model, batch: MnistBatch) -> tuple[Tensor, Tensor]:
        output = model(batch.images)
        return output, loss_fn(output, batch.targets)

    results = []
    for epoch in range(1, config.num_epochs + 1):
        train_loader.set_epoch(epoch)
        train = _Running()
        for iteration, batch in enumerate(train_loader, 1):
            output, loss = step(model, batch)
            # backward() gives the gradients of every tensor of the graph; the
            # optimizer wants them keyed by the model's parameters.
            grads = GradientsParams.from_grads(loss.backward(), model)
            model = optimizer.step(config.learning_rate, model, grads)

            correct, items = _correct(output, batch.targets), batch.targets.shape[0]
            train.add(loss.item(), correct, items)
            if log_every and iteration % log_every == 0:
                print(
                    f"[Train - Epoch {epoch} - Iteration {iteration}] loss {loss.item():.3f} "
                    f"| accuracy {100.0 * correct / items:.1f}%",
                    flush=True,
                )

        model_valid = model.valid()
        valid_loader.set_epoch(epoch)
        valid = _Running()
        for batch in valid_loader:
            output, loss = step(model_valid, batch)
            valid.add(loss.item(), _correct(output, batch.targets), batch.targets.shape[0])

        result = EpochResult(epoch, *train.means(), *valid.means())
        results.append(result)
        print(
            f"[Epoch {epoch}] train: loss {result.train_loss:.4f} accuracy "
            f"{result.train_accuracy:.2f}% | valid: loss {result.valid_loss:.4f} accuracy "
            f"{result.valid_accuracy:.2f}%",
            flush=True,
        )
    return model, results
