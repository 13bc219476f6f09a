"""Normalization layers: BatchNorm."""

from __future__ import annotations

from typing import Any

from ember.backend.device import Device
from ember.backend.errors import ShapeError, fmt_shape
from ember.config import Config
from ember.module import Module, Param, RunningState
from ember.nn._util import NonNegativeFloat, PositiveInt, is_training
from ember.nn.initializer import Ones, Zeros
from ember.record.adapter import PYTORCH
from ember.tensor import Tensor


class BatchNormConfig(Config):
    """Configuration of a :class:`BatchNorm` layer.

    Args:
        num_features: the number of channels (dim 1 of the input).
        epsilon: added to the variance before its square root. Default: 1e-5.
        momentum: weight of the newest batch in the running statistics:
            ``running = (1 - momentum) * running + momentum * batch``. Default: 0.1.

    Example:
        >>> import ember
        >>> from ember.nn import BatchNormConfig
        >>> norm = BatchNormConfig(16).init(ember.device("ndarray"))
        >>> norm.gamma.shape, norm.running_var.val().tolist()[:3]
        ((16,), [1.0, 1.0, 1.0])
    """

    num_features: PositiveInt
    epsilon: NonNegativeFloat = 1e-5
    momentum: NonNegativeFloat = 0.1

    def init(self, device: Device | None = None) -> BatchNorm:
        """A new :class:`BatchNorm`: scale 1, shift 0, running mean 0, running variance 1."""
        shape = [self.num_features]
        return BatchNorm(
            gamma=Ones().init_param(shape, device),
            beta=Zeros().init_param(shape, device),
            running_mean=RunningState(Zeros().init(shape, device)),
            running_var=RunningState(Ones().init(shape, device)),
            momentum=self.momentum,
            epsilon=self.epsilon,
        )


class BatchNorm(Module):
    """Batch normalization (Ioffe & Szegedy, 2015) over the channel dim, for any rank.

    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``, per channel, with the
    statistics taken over every dim except the channel dim (dim 1).

    The mode follows the device, as in Burn: on an autodiff device the layer trains,
    normalizing with the batch's mean and biased variance and updating the running
    statistics (the running variance takes the *unbiased* batch variance, as in
    PyTorch); elsewhere (e.g. after ``module.valid()``) it normalizes with the
    running statistics. Training needs more than one value per channel.

    The running statistics are :class:`~ember.module.RunningState`: saved with the
    weights, never trained, and updated in place by the training forward pass.
    PyTorch's ``weight`` / ``bias`` load as ``gamma`` / ``beta`` through the PyTorch
    adapter, which drops ``num_batches_tracked``.

    Args:
        gamma: scale ``[num_features]``.
        beta: shift ``[num_features]``.
        running_mean: ``[num_features]``.
        running_var: ``[num_features]``.
        momentum: weight of the newest batch in the running statistics.
        epsilon: added to the variance for stability.

    Shape:
        - Input: ``[batch, num_features, *]`` (``[batch, num_features]`` as well).
        - Output: the input's shape.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn import BatchNormConfig
        >>> device = ember.device("ndarray").autodiff()
        >>> norm = BatchNormConfig(2).init(device)
        >>> x = Tensor.from_data([[[1.0], [3.0]], [[3.0], [5.0]]], device)
        >>> [round(v, 4) for v in norm(x).reshape([4]).tolist()]  # the batch's statistics
        [-1.0, -1.0, 1.0, 1.0]
        >>> [round(v, 3) for v in norm.running_mean.val().tolist()]
        [0.2, 0.4]
        >>> norm.valid()(x.inner()).shape  # inference: the running statistics
        (2, 2, 1)
    """

    gamma: Param
    beta: Param
    running_mean: RunningState
    running_var: RunningState
    momentum: float = 0.1
    epsilon: float = 1e-5

    @property
    def num_features(self) -> int:
        return self.gamma.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        c = self.num_features
        if x.rank < 2 or x.shape[1] != c:
            raise ShapeError(
                f"BatchNorm: expected an input of shape [batch, {c} (num_features), ...], "
                f"got {fmt_shape(x.shape)}"
            )
        if is_training(x.device):
            return self._forward_train(x)
        # Inference folds the statistics into one scale and one shift per channel.
        scale = self.gamma.val() * (self.running_var.val() + self.epsilon).rsqrt()
        shift = self.beta.val() - self.running_mean.val() * scale
        per_channel = [1, c] + [1] * (x.rank - 2)
        return x * scale.reshape(per_channel) + shift.reshape(per_channel)

    def _forward_train(self, x: Tensor) -> Tensor:
        c = self.num_features
        batch = x.shape[0]
        rest = x.num_elements() // (batch * c) if batch * c else 0
        count = batch * rest
        if count < 2:
            raise ShapeError(
                f"BatchNorm: training needs more than one value per channel, got an input "
                f"of shape {fmt_shape(x.shape)}"
            )
        flat = x.reshape([batch, c, rest])
        mean = flat.mean_dim(2).mean_dim(0)  # [1, c, 1]
        centered = flat - mean
        var = (centered * centered).mean_dim(2).mean_dim(0)  # biased: what normalizes
        y = centered * (var + self.epsilon).rsqrt()
        y = y * self.gamma.val().reshape([1, c, 1]) + self.beta.val().reshape([1, c, 1])

        m = self.momentum
        unbiased = count / (count - 1)
        self.running_mean.update(self.running_mean.val() * (1 - m) + mean.detach().reshape([c]) * m)
        self.running_var.update(
            self.running_var.val() * (1 - m) + var.detach().reshape([c]) * (m * unbiased)
        )
        return y.reshape(x.shape)


@PYTORCH.register(BatchNorm)
def _from_pytorch(module: BatchNorm, record: dict[str, Any]) -> dict[str, Any]:
    """PyTorch names the scale and shift ``weight`` and ``bias`` and counts batches."""
    renamed = {"weight": "gamma", "bias": "beta"}
    return {
        renamed.get(name, name): value
        for name, value in record.items()
        if name != "num_batches_tracked"
    }
