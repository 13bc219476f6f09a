"""The guide's data: MNIST items batched into normalized image tensors and class targets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.backend.device import Device
from ember.backend.errors import ArgumentError
from ember.data.dataloader.batcher import Batcher
from ember.data.vision.mnist import MnistItem
from ember.tensor import Kind, Tensor

MEAN = 0.1307
"""The mean pixel intensity of the MNIST training images, once scaled to ``[0, 1]``."""

STD = 0.3081
"""The standard deviation of those intensities."""


@dataclass(frozen=True)
class MnistBatch:
    """A batch of digits: ``images`` ``[batch, 28, 28]`` Float, ``targets`` ``[batch]`` Int."""

    images: Tensor
    targets: Tensor


class MnistBatcher(Batcher[MnistItem, MnistBatch]):
    """Stacks MNIST items into an :class:`MnistBatch` on the loader's device.

    Each pixel ``x`` (0 to 255) becomes ``(x / 255 - MEAN) / STD``: scaled to ``[0, 1]``,
    then standardized with the training set's mean and standard deviation, so the
    images have about zero mean and unit variance. The arithmetic runs in NumPy on
    the host before the one transfer to the device; the tensors take the device's
    default Float and Int dtypes.

    Example:
        >>> import ember
        >>> import numpy as np
        >>> from ember.data.vision.mnist import MnistItem
        >>> from ember.guide.data import MnistBatcher
        >>> black, white = np.zeros([28, 28], np.uint8), np.full([28, 28], 255, np.uint8)
        >>> items = [MnistItem(black, 3), MnistItem(white, 7)]
        >>> batch = MnistBatcher().batch(items, ember.device("ndarray"))
        >>> batch.images.shape, batch.targets.tolist()
        ((2, 28, 28), [3, 7])
        >>> [round(v, 4) for v in batch.images[:, 0, 0].reshape([2]).tolist()]
        [-0.4242, 2.8215]
    """

    def batch(self, items: list[MnistItem], device: Device) -> MnistBatch:
        if not items:
            raise ArgumentError("MnistBatcher: cannot make a batch of no items")
        pixels = np.stack([item.image for item in items]).astype(np.float32)
        images = (pixels / 255.0 - MEAN) / STD
        labels = np.array([item.label for item in items], dtype=np.int64)
        return MnistBatch(
            images=Tensor.from_data(images, device, kind=Kind.FLOAT),
            targets=Tensor.from_data(labels, device, kind=Kind.INT),
        )
