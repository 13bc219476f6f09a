"""Activation layers: one module per function of :mod:`ember.tensor.activation`, and PRelu.

Each layer applies its function to the whole input, whatever its shape; the
module's fields are the function's options (``LeakyRelu(negative_slope=0.1)``,
``Softmax(dim=-1)``). Layers without options are built directly (``Relu()``);
those with options also have a config (``LeakyReluConfig``), as in Burn, so they
save with a model's config. Only :class:`PRelu` has parameters.

An input the function rejects (an Int tensor, a ``dim`` out of range, an odd size
for :class:`Glu`) raises the function's error with the layer's name in front.

Example:
    >>> from ember import Tensor
    >>> from ember.nn.activation import LeakyReluConfig, Relu, Softmax
    >>> x = Tensor.from_data([[-2.0, 0.0, 2.0]])
    >>> Relu()(x).tolist(), LeakyReluConfig(negative_slope=0.5).init()(x).tolist()
    ([[0.0, 0.0, 2.0]], [[-1.0, 0.0, 2.0]])
    >>> Softmax(dim=1)(Tensor.zeros([1, 4])).tolist()
    [[0.25, 0.25, 0.25, 0.25]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from ember.backend.device import Device
from ember.backend.errors import EmberError
from ember.config import Config
from ember.config.fields import PositiveInt
from ember.module import Module, Param
from ember.nn.initializer import Constant
from ember.record.adapter import PYTORCH
from ember.tensor import Tensor
from ember.tensor import activation as A

__all__ = [
    "Celu", "CeluConfig", "Elu", "EluConfig", "Gelu", "GeluConfig", "Glu", "GluConfig",
    "HardSigmoid", "HardSigmoidConfig", "HardSwish", "LeakyRelu", "LeakyReluConfig",
    "LogSigmoid", "LogSoftmax", "LogSoftmaxConfig", "Mish", "PRelu", "PReluConfig",
    "QuietSoftmax", "QuietSoftmaxConfig", "Relu", "Relu6", "Selu", "Sigmoid", "Silu",
    "Softmax", "SoftmaxConfig", "Softmin", "SoftminConfig", "Softplus", "SoftplusConfig",
    "Swish", "Tanh",
]  # fmt: skip


def _named(layer: str, run: Callable[[], Tensor]) -> Tensor:
    """``run()``, with ``layer`` named in front of the message of any ember error it raises."""
    try:
        return run()
    except EmberError as error:
        raise type(error)(f"{layer}: {error}") from None


class _Activation(Module):
    """A layer that applies ``_function(x, **fields)``; subclasses name the function."""

    _function: ClassVar[Callable[..., Tensor]]

    def forward(self, x: Tensor) -> Tensor:
        options = dict(self.fields())
        return _named(type(self).__name__, lambda: self._function(x, **options))


class _ActivationConfig(Config):
    """A config whose fields are its layer's fields, one for one."""

    _layer: ClassVar[type[_Activation]]

    def init(self, device: Device | None = None) -> _Activation:
        """The layer (no parameters: ``device`` is not used)."""
        return self._layer(**{name: getattr(self, name) for name in type(self).model_fields})


# ---------------------------------------------------------------- without options
class Relu(_Activation):
    """``max(x, 0)``, element-wise.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.activation import Relu
        >>> Relu()(Tensor.from_data([-1.0, 3.0])).tolist()
        [0.0, 3.0]
    """

    _function = staticmethod(A.relu)


class Relu6(_Activation):
    """``min(max(x, 0), 6)``, element-wise."""

    _function = staticmethod(A.relu6)


class Sigmoid(_Activation):
    """``1 / (1 + exp(-x))``, element-wise."""

    _function = staticmethod(A.sigmoid)


class LogSigmoid(_Activation):
    """``log(sigmoid(x))``, element-wise, without overflow for large ``|x|``."""

    _function = staticmethod(A.log_sigmoid)


class Silu(_Activation):
    """``x * sigmoid(x)``, element-wise (also called Swish; :data:`Swish` is this class)."""

    _function = staticmethod(A.silu)


Swish = Silu


class HardSwish(_Activation):
    """``x * relu6(x + 3) / 6``, element-wise (MobileNetV3)."""

    _function = staticmethod(A.hard_swish)


class Mish(_Activation):
    """``x * tanh(softplus(x))``, element-wise."""

    _function = staticmethod(A.mish)


class Selu(_Activation):
    """Scaled ELU with the fixed constants of self-normalizing networks, element-wise."""

    _function = staticmethod(A.selu)


class Tanh(_Activation):
    """The hyperbolic tangent, element-wise."""

    _function = staticmethod(A.tanh)


# ---------------------------------------------------------------- element-wise with options
class LeakyRelu(_Activation):
    """``x`` where ``x >= 0``, ``negative_slope * x`` elsewhere.

    Args:
        negative_slope: the slope below zero. Default: 0.01.
    """

    negative_slope: float = 0.01
    _function = staticmethod(A.leaky_relu)


class LeakyReluConfig(_ActivationConfig):
    """Configuration of a :class:`LeakyRelu` layer: ``negative_slope`` (default 0.01)."""

    negative_slope: float = 0.01
    _layer = LeakyRelu


class Gelu(_Activation):
    """``x * Phi(x)``, with ``Phi`` the standard normal CDF.

    Args:
        approximate: ``"none"`` for the exact ``Phi``, ``"tanh"`` for the tanh formula
            of Hendrycks & Gimpel. Default: ``"none"``.
    """

    approximate: Literal["none", "tanh"] = "none"
    _function = staticmethod(A.gelu)


class GeluConfig(_ActivationConfig):
    """Configuration of a :class:`Gelu` layer: ``approximate``, ``"none"`` or ``"tanh"``."""

    approximate: Literal["none", "tanh"] = "none"
    _layer = Gelu


class Elu(_Activation):
    """``x`` where ``x > 0``, ``alpha * (exp(x) - 1)`` elsewhere.

    Args:
        alpha: the value the negative side tends to, negated. Default: 1.0.
    """

    alpha: float = 1.0
    _function = staticmethod(A.elu)


class EluConfig(_ActivationConfig):
    """Configuration of an :class:`Elu` layer: ``alpha`` (default 1.0)."""

    alpha: float = 1.0
    _layer = Elu


class Celu(_Activation):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``, element-wise.

    Args:
        alpha: the scale of the negative side; not zero. Default: 1.0.
    """

    alpha: float = 1.0
    _function = staticmethod(A.celu)


class CeluConfig(_ActivationConfig):
    """Configuration of a :class:`Celu` layer: ``alpha`` (default 1.0, not zero)."""

    alpha: float = 1.0
    _layer = Celu

    @field_validator("alpha")
    @classmethod
    def _nonzero(cls, alpha: float) -> float:
        if alpha == 0:
            raise ValueError("must not be zero (it divides x)")
        return alpha


class Softplus(_Activation):
    """``log(1 + exp(beta * x)) / beta``; the identity where ``beta * x > threshold``.

    Args:
        beta: the sharpness; positive. Default: 1.0.
        threshold: above it ``beta * x`` is returned as is, which avoids overflow.
            Default: 20.0.
    """

    beta: float = 1.0
    threshold: float = 20.0
    _function = staticmethod(A.softplus)


class SoftplusConfig(_ActivationConfig):
    """Configuration of a :class:`Softplus` layer: ``beta`` (> 0, default 1.0) and
    ``threshold`` (default 20.0), as in Burn and PyTorch."""

    beta: Annotated[float, Field(gt=0)] = 1.0
    threshold: float = 20.0
    _layer = Softplus


def _hard_sigmoid(x: Tensor, alpha: float, beta: float) -> Tensor:
    if alpha == 1 / 6 and beta == 0.5:
        return A.hard_sigmoid(x)  # PyTorch's constants: the op, which backends may fuse
    return (x * alpha + beta).clamp(0.0, 1.0)


class HardSigmoid(_Activation):
    """``clamp(alpha * x + beta, 0, 1)``, element-wise.

    Burn's (and ONNX's) defaults are ``alpha=0.2``, ``beta=0.5``; PyTorch's
    ``nn.Hardsigmoid`` is ``alpha=1/6``, ``beta=0.5``.

    Args:
        alpha: the slope. Default: 0.2.
        beta: the value at zero. Default: 0.5.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.activation import HardSigmoid
        >>> HardSigmoid()(Tensor.from_data([-5.0, 0.0, 1.25, 5.0])).tolist()
        [0.0, 0.5, 0.75, 1.0]
    """

    alpha: float = 0.2
    beta: float = 0.5
    _function = staticmethod(_hard_sigmoid)


class HardSigmoidConfig(_ActivationConfig):
    """Configuration of a :class:`HardSigmoid` layer: ``alpha`` (default 0.2) and ``beta``
    (default 0.5), Burn's defaults; ``with_alpha(1 / 6)`` gives PyTorch's ``Hardsigmoid``."""

    alpha: float = 0.2
    beta: float = 0.5
    _layer = HardSigmoid


# ---------------------------------------------------------------- along a dim
class Softmax(_Activation):
    """``exp(x) / sum(exp(x))`` along ``dim``: each slice sums to one.

    Args:
        dim: the dim to normalize along (negative counts from the end).
    """

    dim: int
    _function = staticmethod(A.softmax)


class SoftmaxConfig(_ActivationConfig):
    """Configuration of a :class:`Softmax` layer: the ``dim`` to normalize along."""

    dim: int
    _layer = Softmax


class LogSoftmax(_Activation):
    """``log(softmax(x))`` along ``dim``, computed stably.

    Args:
        dim: the dim to normalize along.
    """

    dim: int
    _function = staticmethod(A.log_softmax)


class LogSoftmaxConfig(_ActivationConfig):
    """Configuration of a :class:`LogSoftmax` layer: the ``dim`` to normalize along."""

    dim: int
    _layer = LogSoftmax


class Softmin(_Activation):
    """``softmax(-x)`` along ``dim``.

    Args:
        dim: the dim to normalize along.
    """

    dim: int
    _function = staticmethod(A.softmin)


class SoftminConfig(_ActivationConfig):
    """Configuration of a :class:`Softmin` layer: the ``dim`` to normalize along."""

    dim: int
    _layer = Softmin


class QuietSoftmax(_Activation):
    """Softmax with an extra zero logit along ``dim``: a slice may sum to less than one,
    so attention can attend to nothing.

    Args:
        dim: the dim to normalize along.
    """

    dim: int
    _function = staticmethod(A.quiet_softmax)


class QuietSoftmaxConfig(_ActivationConfig):
    """Configuration of a :class:`QuietSoftmax` layer: the ``dim`` to normalize along."""

    dim: int
    _layer = QuietSoftmax


class Glu(_Activation):
    """Gated linear unit: the first half of ``dim`` times the sigmoid of the second half.

    Args:
        dim: the dim to split in two halves; its size must be even. Default: -1.

    Shape:
        - Input: ``[*, 2n, *]`` (size ``2n`` along ``dim``).
        - Output: ``[*, n, *]``.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.activation import Glu
        >>> Glu()(Tensor.ones([2, 6])).shape
        (2, 3)
    """

    dim: int = -1
    _function = staticmethod(A.glu)


class GluConfig(_ActivationConfig):
    """Configuration of a :class:`Glu` layer: the ``dim`` to split (default -1)."""

    dim: int = -1
    _layer = Glu


# ---------------------------------------------------------------- learned
class PReluConfig(Config):
    """Configuration of a :class:`PRelu` layer.

    Args:
        num_parameters: 1 for one slope shared by all channels, or the number of
            channels (dim 1 of the input) for one slope each. Default: 1.
        alpha: the slopes' initial value. Default: 0.25.

    Example:
        >>> import ember
        >>> from ember.nn.activation import PReluConfig
        >>> PReluConfig(num_parameters=3).init(ember.device("ndarray")).alpha.val().tolist()
        [0.25, 0.25, 0.25]
    """

    num_parameters: PositiveInt = 1
    alpha: float = 0.25

    def init(self, device: Device | None = None) -> PRelu:
        """A new :class:`PRelu` with every slope at ``alpha`` on ``device``."""
        return PRelu(Constant(self.alpha).init_param([self.num_parameters], device))


class PRelu(Module):
    """Leaky ReLU with learned slopes: ``x`` where ``x >= 0``, ``alpha * x`` elsewhere.

    PyTorch's ``nn.PReLU`` calls the slopes ``weight``; the PyTorch adapter loads them
    as ``alpha``.

    Args:
        alpha: the slopes, ``[1]`` or ``[channels]``.

    Shape:
        - Input: ``[batch, channels, *]`` for per-channel slopes; any shape for one slope.
        - Output: the input's shape.

    Example:
        >>> from ember import Tensor
        >>> from ember.nn.activation import PReluConfig
        >>> prelu = PReluConfig(num_parameters=2, alpha=0.5).init()
        >>> prelu(Tensor.from_data([[-2.0, -4.0], [1.0, 3.0]])).tolist()
        [[-1.0, -2.0], [1.0, 3.0]]
    """

    alpha: Param

    @property
    def num_parameters(self) -> int:
        return self.alpha.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        return _named("PRelu", lambda: A.prelu(x, self.alpha.val()))


@PYTORCH.register(PRelu)
def _from_pytorch(module: PRelu, record: dict[str, Any]) -> dict[str, Any]:
    """PyTorch names the slopes ``weight``."""
    return {"alpha" if name == "weight" else name: value for name, value in record.items()}

