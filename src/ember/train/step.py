"""What a model gives the learner: a training step and a validation step.

The learner does not know how a model computes its loss. It calls two methods the
model defines:

* ``train_step(batch) -> TrainOutput``, on the autodiff device: the forward pass, the
  backward pass, and the item the training metrics read (a
  :class:`~ember.train.output.ClassificationOutput`, say);
* ``valid_step(batch) -> item``, on the model that ``model.valid()`` gives (the inner
  device, no gradients): the forward pass and the item the validation metrics read.

:class:`TrainStep` and :class:`ValidStep` name these protocols for type checkers; the
learner only needs the methods. A :class:`TrainOutput` is built with
``TrainOutput.new(model, loss.backward(), item)``, which keys the gradients by
parameter id so the optimizer can match them with the model's parameters.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.module import Module
    >>> from ember.nn.linear import Linear, LinearConfig
    >>> from ember.train.step import TrainOutput
    >>> class Regressor(Module):
    ...     linear: Linear
    ...     def forward(self, x: Tensor) -> Tensor:
    ...         return self.linear(x)
    ...     def train_step(self, batch: tuple[Tensor, Tensor]) -> TrainOutput:
    ...         loss = self.valid_step(batch)
    ...         return TrainOutput.new(self, loss.backward(), loss)
    ...     def valid_step(self, batch: tuple[Tensor, Tensor]) -> Tensor:
    ...         x, y = batch
    ...         return ((self(x) - y) ** 2).mean()
    >>> device = ember.device("ndarray").autodiff()
    >>> model = Regressor(LinearConfig(3, 1).init(device))
    >>> batch = (Tensor.ones([4, 3], device), Tensor.zeros([4, 1], device))
    >>> output = model.train_step(batch)
    >>> len(output.grads), output.item.shape
    (2, ())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ember.backend.errors import ArgumentError
from ember.backends.autodiff.graph import Gradients
from ember.module import Module
from ember.optim.grads import GradientsParams

T = TypeVar("T")
B_contra = TypeVar("B_contra", contravariant=True)
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class TrainOutput(Generic[T]):
    """The result of one training step: the gradients and the item the metrics read.

    Args:
        grads: the gradients of the step's loss, keyed by parameter id.
        item: what the training metrics are updated with (adapted to each metric's input).
    """

    grads: GradientsParams
    item: T

    def __post_init__(self) -> None:
        if not isinstance(self.grads, GradientsParams):
            raise ArgumentError(
                "TrainOutput: grads must be a GradientsParams; build the output with "
                f"TrainOutput.new(model, loss.backward(), item), got {type(self.grads).__name__}"
            )

    @staticmethod
    def new(model: Module, gradients: Gradients, item: T) -> TrainOutput[T]:
        """The output of a step whose backward pass gave ``gradients`` for ``model``.

        Args:
            model: the model the loss was computed with (its trainable parameters are
                looked up in ``gradients``).
            gradients: what ``loss.backward()`` returned.
            item: the step's output for the metrics.

        Raises:
            ArgumentError: ``gradients`` is not the result of ``backward()`` or ``model``
                not a Module.
        """
        return TrainOutput(GradientsParams.from_grads(gradients, model), item)


@runtime_checkable
class TrainStep(Protocol[B_contra, T_co]):
    """A model the learner can train: ``train_step(batch)`` on the autodiff device."""

    def train_step(self, batch: B_contra) -> TrainOutput[Any]: ...


@runtime_checkable
class ValidStep(Protocol[B_contra, T_co]):
    """A model the learner can validate: ``valid_step(batch)`` on the inner device."""

    def valid_step(self, batch: B_contra) -> T_co: ...
