"""The guide's model: a small convolutional network that classifies MNIST digits.

Two 3x3 convolutions (1 -> 8 -> 16 channels) with dropout, a ReLU, an adaptive
average pool down to 8x8, then two linear layers (1024 -> hidden -> classes) with
dropout and a ReLU between them. The model also defines the two steps the learner
calls (:meth:`Model.train_step`, :meth:`Model.valid_step`), both built on
:meth:`Model.forward_classification`.
"""

from __future__ import annotations

from ember.backend.device import Device
from ember.backend.errors import ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt, Probability
from ember.guide.data import MnistBatch
from ember.module import Module
from ember.nn.activation import Relu
from ember.nn.conv import Conv2d, Conv2dConfig
from ember.nn.dropout import Dropout, DropoutConfig
from ember.nn.linear import Linear, LinearConfig
from ember.nn.loss import CrossEntropyLossConfig
from ember.nn.pool import AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig
from ember.tensor import Tensor
from ember.train.output import ClassificationOutput
from ember.train.step import TrainOutput

CHANNELS = (8, 16)
"""Output channels of the two convolutions."""

POOLED = (8, 8)
"""The size the adaptive pool brings every feature map to."""

# Holds no tensor (no class weights), so one instance serves every device.
_LOSS = CrossEntropyLossConfig().init()


class ModelConfig(Config):
    """Configuration of the guide's :class:`Model`.

    Args:
        num_classes: the number of classes (10 for MNIST).
        hidden_size: the width of the hidden linear layer (the guide uses 512).
        dropout: the dropout probability after each convolution and the hidden layer.
            Default: 0.5.

    Example:
        >>> import ember
        >>> from ember.guide.model import ModelConfig
        >>> model = ModelConfig(num_classes=10, hidden_size=512).init(ember.device("ndarray"))
        >>> model.num_params()
        531178
    """

    num_classes: PositiveInt
    hidden_size: PositiveInt
    dropout: Probability = 0.5

    def init(self, device: Device | None = None) -> Model:
        """A new :class:`Model` with freshly initialized parameters on ``device``."""
        first, second = CHANNELS
        return Model(
            conv1=Conv2dConfig((1, first), (3, 3)).init(device),
            conv2=Conv2dConfig((first, second), (3, 3)).init(device),
            pool=AdaptiveAvgPool2dConfig(POOLED).init(),
            dropout=DropoutConfig(self.dropout).init(),
            linear1=LinearConfig(second * POOLED[0] * POOLED[1], self.hidden_size).init(device),
            linear2=LinearConfig(self.hidden_size, self.num_classes).init(device),
            activation=Relu(),
        )


class Model(Module):
    """The guide's digit classifier; build it with :class:`ModelConfig`.

    As every ember layer, it trains on an autodiff device (dropout drops) and infers
    after ``model.valid()`` (dropout passes its input through).

    Shape:
        - Images: ``[batch, height, width]``, Float (the guide's are 28x28; any size of
          at least 5x5 works, the pool adapts).
        - Output: ``[batch, num_classes]``, the class scores (logits).

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.guide.model import ModelConfig
        >>> device = ember.device("ndarray")
        >>> model = ModelConfig(num_classes=10, hidden_size=32).init(device)
        >>> model(Tensor.zeros([2, 28, 28], device)).shape
        (2, 10)
    """

    conv1: Conv2d
    conv2: Conv2d
    pool: AdaptiveAvgPool2d
    dropout: Dropout
    linear1: Linear
    linear2: Linear
    activation: Relu

    def forward(self, images: Tensor) -> Tensor:
        if images.ndim != 3:
            raise ShapeError(
                "Model: expected images [batch, height, width], got shape "
                f"{fmt_shape(images.shape)}"
            )
        batch, height, width = images.shape
        x = images.reshape([batch, 1, height, width])  # the one input channel

        x = self.dropout(self.conv1(x))
        x = self.activation(self.dropout(self.conv2(x)))

        x = self.pool(x).reshape([batch, -1])
        x = self.activation(self.dropout(self.linear1(x)))
        return self.linear2(x)

    def forward_classification(self, images: Tensor, targets: Tensor) -> ClassificationOutput:
        """The scores of ``images`` and their cross-entropy loss against ``targets`` ``[batch]``."""
        output = self.forward(images)
        return ClassificationOutput(_LOSS(output, targets), output, targets)

    def train_step(self, batch: MnistBatch) -> TrainOutput[ClassificationOutput]:
        """One training step: the loss's gradients and the output for the metrics."""
        item = self.forward_classification(batch.images, batch.targets)
        return TrainOutput.new(self, item.loss.backward(), item)

    def valid_step(self, batch: MnistBatch) -> ClassificationOutput:
        """One validation step (on the model ``valid()`` gives): the output for the metrics."""
        return self.forward_classification(batch.images, batch.targets)
