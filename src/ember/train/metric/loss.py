"""The loss metric: the value the backward pass started from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.backend.errors import ArgumentError, KindError, ShapeError, fmt_shape
from ember.tensor import Tensor
from ember.tensor.dtype import Kind
from ember.train.metric.base import MeanMetric, MetricEntry, MetricMetadata


@dataclass
class LossInput:
    """The input of :class:`LossMetric`.

    Args:
        tensor: the loss, a scalar or one value per item (their mean is the batch's loss).
        batch_size: the batch's weight in the epoch's mean; by default the length of
            ``tensor``'s first dimension (1 for a scalar). The outputs pass their batch size.
    """

    tensor: Tensor
    batch_size: int | None = None


class LossMetric(MeanMetric):
    """The loss: the batch's mean, and over the epoch a mean weighted by batch size.

    A NaN or infinite loss is reported as it is: a diverging run should show it.

    Example:
        >>> from ember.tensor import Tensor
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> metric = LossMetric()
        >>> meta = MetricMetadata(Progress(6, 6), epoch=1, epoch_total=1, iteration=1)
        >>> metric.update(LossInput(Tensor.from_data([0.5]), batch_size=2), meta).formatted
        'epoch 0.500 - batch 0.500'
        >>> metric.update(LossInput(Tensor.from_data([2.0]), batch_size=4), meta).formatted
        'epoch 1.500 - batch 2.000'
    """

    name = "Loss"
    input_type = LossInput
    lower_is_better = True

    def update(self, item: LossInput, metadata: MetricMetadata) -> MetricEntry:
        tensor = item.tensor
        if tensor.kind is not Kind.FLOAT:
            raise KindError(f"LossMetric: the loss must be a Float tensor, got {tensor.kind.value}")
        if tensor.num_elements() == 0:
            raise ShapeError(f"LossMetric: the loss is empty (shape {fmt_shape(tensor.shape)})")
        loss = float(np.asarray(tensor.to_numpy(), dtype=np.float64).mean())
        batch_size = item.batch_size
        if batch_size is None:
            batch_size = tensor.shape[0] if tensor.rank else 1
        elif batch_size < 1:
            raise ArgumentError(f"LossMetric: batch_size must be positive, got {batch_size}")
        return self.state.update(loss, batch_size, self.name, precision=3)

