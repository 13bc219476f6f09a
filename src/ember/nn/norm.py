"""Normalization layers: BatchNorm, LayerNorm, GroupNorm, InstanceNorm, RmsNorm.

All of them start as the identity map: scales (``gamma``) at one, shifts (``beta``)
at zero. PyTorch calls the scale and shift ``weight`` and ``bias``; the PyTorch
adapter renames them on import.
"""

from __future__ import annotations

from typing import Any

from ember.backend.device import Device
from ember.backend.errors import ConfigError, ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import NonNegativeFloat, PositiveInt
from ember.module import Module, Param, RunningState
from ember.nn._util import is_training
from ember.nn.initializer import Ones, Zeros
from ember.record.adapter import PYTORCH
from ember.tensor import Tensor, module


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


def _check_last_dim(layer: str, x: Tensor, d_model: int) -> None:
    if x.rank < 1 or x.shape[-1] != d_model:
        raise ShapeError(
            f"{layer}: expected an input of shape [..., {d_model}] (d_model), "
            f"got {fmt_shape(x.shape)}"
        )


class LayerNormConfig(Config):
    """Configuration of a :class:`LayerNorm` layer.

    Args:
        d_model: the size of the last dim, which is normalized.
        epsilon: added to the variance before its square root. Default: 1e-5.

    Example:
        >>> from ember.nn.norm import LayerNormConfig
        >>> norm = LayerNormConfig(8).init()
        >>> norm.gamma.shape, norm.beta.shape, norm.epsilon
        ((8,), (8,), 1e-05)
    """

    d_model: PositiveInt
    epsilon: NonNegativeFloat = 1e-5

    def init(self, device: Device | None = None) -> LayerNorm:
        """A new :class:`LayerNorm`: scale 1, shift 0."""
        shape = [self.d_model]
        return LayerNorm(
            gamma=Ones().init_param(shape, device),
            beta=Zeros().init_param(shape, device),
            epsilon=self.epsilon,
        )


class LayerNorm(Module):
    """Layer normalization (Ba et al., 2016) over the last dim.

    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``, with the mean and the
    biased variance of each vector along the last dim. Training and inference
    compute the same thing.

    Args:
        gamma: scale ``[d_model]``.
        beta: shift ``[d_model]``.
        epsilon: added to the variance for stability.

    Shape:
        - Input: ``[..., d_model]``, any rank >= 1.
        - Output: the input's shape.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.norm import LayerNormConfig
        >>> device = ember.device("ndarray")
        >>> norm = LayerNormConfig(2).init(device)
        >>> [round(v, 4) for v in norm(Tensor.from_data([[1.0, 3.0]], device)).tolist()[0]]
        [-1.0, 1.0]
    """

    gamma: Param
    beta: Param
    epsilon: float = 1e-5

    @property
    def d_model(self) -> int:
        return self.gamma.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        _check_last_dim("LayerNorm", x, self.d_model)
        return module.layer_norm(x, self.gamma.val(), self.beta.val(), self.epsilon)


def _affine_params(
    num_channels: int, affine: bool, device: Device | None
) -> tuple[Param | None, Param | None]:
    if not affine:
        return None, None
    shape = [num_channels]
    return Ones().init_param(shape, device), Zeros().init_param(shape, device)


def _group_norm(
    x: Tensor, groups: int, gamma: Param | None, beta: Param | None, epsilon: float
) -> Tensor:
    """Normalizes ``[batch, channels, *]`` over each group of channels and all other dims."""
    batch, channels = x.shape[0], x.shape[1]
    flat = x.reshape([batch, groups, -1])
    centered = flat - flat.mean_dim(2)
    var = (centered * centered).mean_dim(2)
    y = (centered * (var + epsilon).rsqrt()).reshape([batch, channels, -1])
    if gamma is not None:
        y = y * gamma.val().reshape([1, channels, 1])
    if beta is not None:
        y = y + beta.val().reshape([1, channels, 1])
    return y.reshape(x.shape)


class GroupNormConfig(Config):
    """Configuration of a :class:`GroupNorm` layer.

    Args:
        num_groups: the number of groups the channels are split into; it must divide
            ``num_channels``.
        num_channels: the number of channels (dim 1 of the input).
        epsilon: added to the variance before its square root. Default: 1e-5.
        affine: whether to learn a scale and a shift per channel. Default: True.

    Example:
        >>> from ember.nn.norm import GroupNormConfig
        >>> norm = GroupNormConfig(2, 6).init()
        >>> norm.gamma.shape, GroupNormConfig(2, 6, affine=False).init().gamma
        ((6,), None)
    """

    num_groups: PositiveInt
    num_channels: PositiveInt
    epsilon: NonNegativeFloat = 1e-5
    affine: bool = True

    def init(self, device: Device | None = None) -> GroupNorm:
        """A new :class:`GroupNorm`: scale 1, shift 0 (or none when not affine).

        Raises:
            ConfigError: ``num_groups`` does not divide ``num_channels``.
        """
        if self.num_channels % self.num_groups:
            raise ConfigError(
                f"GroupNormConfig.num_groups: {self.num_groups} groups must divide "
                f"num_channels ({self.num_channels})",
                fields=("GroupNormConfig.num_groups",),
            )
        gamma, beta = _affine_params(self.num_channels, self.affine, device)
        return GroupNorm(
            gamma=gamma,
            beta=beta,
            num_groups=self.num_groups,
            num_channels=self.num_channels,
            epsilon=self.epsilon,
        )


class GroupNorm(Module):
    """Group normalization (Wu & He, 2018): statistics per sample and group of channels.

    The channels (dim 1) are split into ``num_groups`` consecutive groups; each group
    of each sample is normalized with its own mean and biased variance, taken over
    its channels and every dim after them. The optional scale and shift are per
    channel. Training and inference compute the same thing.

    Args:
        gamma: scale ``[num_channels]``, or None.
        beta: shift ``[num_channels]``, or None.
        num_groups: the number of groups.
        num_channels: the number of channels.
        epsilon: added to the variance for stability.

    Shape:
        - Input: ``[batch, num_channels, *]`` (``[batch, num_channels]`` as well).
        - Output: the input's shape.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.norm import GroupNormConfig
        >>> device = ember.device("ndarray")
        >>> norm = GroupNormConfig(1, 2).init(device)
        >>> x = Tensor.from_data([[[1.0], [3.0]]], device)
        >>> [round(v, 4) for v in norm(x).reshape([2]).tolist()]
        [-1.0, 1.0]
    """

    gamma: Param | None
    beta: Param | None
    num_groups: int
    num_channels: int
    epsilon: float = 1e-5

    def forward(self, x: Tensor) -> Tensor:
        c = self.num_channels
        if x.rank < 2 or x.shape[1] != c:
            raise ShapeError(
                f"GroupNorm: expected an input of shape [batch, {c} (num_channels), ...], "
                f"got {fmt_shape(x.shape)}"
            )
        return _group_norm(x, self.num_groups, self.gamma, self.beta, self.epsilon)


class InstanceNormConfig(Config):
    """Configuration of an :class:`InstanceNorm` layer.

    Args:
        num_channels: the number of channels (dim 1 of the input).
        epsilon: added to the variance before its square root. Default: 1e-5.
        affine: whether to learn a scale and a shift per channel. Default: True, as in
            Burn (PyTorch's ``nn.InstanceNorm*d`` default to ``affine=False``).

    Example:
        >>> from ember.nn.norm import InstanceNormConfig
        >>> InstanceNormConfig(3).init().beta.shape
        (3,)
    """

    num_channels: PositiveInt
    epsilon: NonNegativeFloat = 1e-5
    affine: bool = True

    def init(self, device: Device | None = None) -> InstanceNorm:
        """A new :class:`InstanceNorm`: scale 1, shift 0 (or none when not affine)."""
        gamma, beta = _affine_params(self.num_channels, self.affine, device)
        return InstanceNorm(
            gamma=gamma, beta=beta, num_channels=self.num_channels, epsilon=self.epsilon
        )


class InstanceNorm(Module):
    """Instance normalization (Ulyanov et al., 2016): statistics per sample and channel.

    Each channel of each sample is normalized with the mean and biased variance of
    its spatial dims (a :class:`GroupNorm` with one channel per group). No running
    statistics are kept, so training and inference compute the same thing, as
    PyTorch's ``nn.InstanceNorm*d`` with ``track_running_stats=False`` (its default).

    Args:
        gamma: scale ``[num_channels]``, or None.
        beta: shift ``[num_channels]``, or None.
        num_channels: the number of channels.
        epsilon: added to the variance for stability.

    Shape:
        - Input: ``[batch, num_channels, *spatial]``, at least one spatial dim.
        - Output: the input's shape.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.norm import InstanceNormConfig
        >>> device = ember.device("ndarray")
        >>> norm = InstanceNormConfig(1).init(device)
        >>> [round(v, 4) for v in norm(Tensor.from_data([[[2.0, 4.0]]], device)).tolist()[0][0]]
        [-1.0, 1.0]
    """

    gamma: Param | None
    beta: Param | None
    num_channels: int
    epsilon: float = 1e-5

    def forward(self, x: Tensor) -> Tensor:
        c = self.num_channels
        if x.rank < 3 or x.shape[1] != c:
            raise ShapeError(
                f"InstanceNorm: expected an input of shape [batch, {c} (num_channels), "
                f"*spatial] with at least one spatial dim, got {fmt_shape(x.shape)}"
            )
        return _group_norm(x, c, self.gamma, self.beta, self.epsilon)


class RmsNormConfig(Config):
    """Configuration of an :class:`RmsNorm` layer.

    Args:
        d_model: the size of the last dim, which is normalized.
        epsilon: added to the mean square before its square root. Default: 1e-5, as in
            Burn (PyTorch's ``nn.RMSNorm`` defaults to the dtype's machine epsilon).

    Example:
        >>> from ember.nn.norm import RmsNormConfig
        >>> RmsNormConfig(4).init().gamma.val().tolist()
        [1.0, 1.0, 1.0, 1.0]
    """

    d_model: PositiveInt
    epsilon: NonNegativeFloat = 1e-5

    def init(self, device: Device | None = None) -> RmsNorm:
        """A new :class:`RmsNorm` with scale 1."""
        return RmsNorm(gamma=Ones().init_param([self.d_model], device), epsilon=self.epsilon)


class RmsNorm(Module):
    """Root mean square normalization (Zhang & Sennrich, 2019) over the last dim.

    ``y = x / sqrt(mean(x^2) + epsilon) * gamma``: a :class:`LayerNorm` that neither
    centers nor shifts.

    Args:
        gamma: scale ``[d_model]``.
        epsilon: added to the mean square for stability.

    Shape:
        - Input: ``[..., d_model]``, any rank >= 1.
        - Output: the input's shape.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.norm import RmsNormConfig
        >>> device = ember.device("ndarray")
        >>> norm = RmsNormConfig(2, epsilon=0.0).init(device)
        >>> [round(v, 4) for v in norm(Tensor.from_data([3.0, 4.0], device)).tolist()]  # rms 3.5355
        [0.8485, 1.1314]
    """

    gamma: Param
    epsilon: float = 1e-5

    @property
    def d_model(self) -> int:
        return self.gamma.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        _check_last_dim("RmsNorm", x, self.d_model)
        return x * ((x * x).mean_dim(-1) + self.epsilon).rsqrt() * self.gamma.val()


@PYTORCH.register(BatchNorm)
@PYTORCH.register(LayerNorm)
@PYTORCH.register(GroupNorm)
@PYTORCH.register(InstanceNorm)
@PYTORCH.register(RmsNorm)
def _from_pytorch(module: Module, record: dict[str, Any]) -> dict[str, Any]:
    """PyTorch names the scale and shift ``weight`` and ``bias``; batch norm counts batches."""
    renamed = {"weight": "gamma", "bias": "beta"}
    return {
        renamed.get(name, name): value
        for name, value in record.items()
        if name != "num_batches_tracked"
    }
