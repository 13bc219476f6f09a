"""Activation functions on Float tensors.

Each is one op of the table with a composite default on the Backend protocol,
so a backend may override any of them with a faster kernel and a decorator may
give any of them its own backward rule.

Example:
    >>> from ember import Tensor, activation
    >>> activation.relu(Tensor.from_data([-1.0, 2.0])).tolist()
    [0.0, 2.0]
"""

from __future__ import annotations

from ember.backend.errors import ArgumentError
from ember.backend.ops import ops
from ember.tensor.tensor import Tensor, _primitive, _same_device


def relu(x: Tensor) -> Tensor:
    """``max(x, 0)``."""
    return x._unary(ops.relu)


def relu6(x: Tensor) -> Tensor:
    """``min(max(x, 0), 6)``."""
    return x._unary(ops.relu6)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``x`` for ``x >= 0``, ``negative_slope * x`` below."""
    return x._unary(ops.leaky_relu, float(negative_slope))


def prelu(x: Tensor, alpha: Tensor) -> Tensor:
    """Leaky ReLU with a learned slope: one for all, or one per channel (dim 1)."""
    name = _primitive(ops.prelu, x.kind)  # KindError for Int / Bool inputs
    _same_device("prelu", x, alpha)
    a = alpha.cast(x.dtype)
    ops.prelu.rule("prelu", x._aval(), a._aval())
    return type(x).from_primitive(getattr(x.backend, name)(x._prim, a._prim), x.device)


def sigmoid(x: Tensor) -> Tensor:
    """``1 / (1 + e^-x)``."""
    return x._unary(ops.sigmoid)


def log_sigmoid(x: Tensor) -> Tensor:
    """``log(sigmoid(x))``, computed without overflow."""
    return x._unary(ops.log_sigmoid)


def hard_sigmoid(x: Tensor) -> Tensor:
    """``clamp(x / 6 + 1/2, 0, 1)`` (PyTorch's ``hardsigmoid``)."""
    return x._unary(ops.hard_sigmoid)


def silu(x: Tensor) -> Tensor:
    """``x * sigmoid(x)`` (also called swish)."""
    return x._unary(ops.silu)


def hard_swish(x: Tensor) -> Tensor:
    """``x * relu6(x + 3) / 6``."""
    return x._unary(ops.hard_swish)


def mish(x: Tensor) -> Tensor:
    """``x * tanh(softplus(x))``."""
    return x._unary(ops.mish)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """``x * Phi(x)`` with the normal CDF ``Phi``; ``approximate="tanh"`` uses the tanh formula."""
    if approximate == "none":
        return x._unary(ops.gelu)
    if approximate == "tanh":
        return x._unary(ops.gelu_tanh)
    raise ArgumentError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """``x`` for ``x > 0``, ``alpha * (e^x - 1)`` below."""
    return x._unary(ops.elu, float(alpha))


def celu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """``max(0, x) + min(0, alpha * (e^(x/alpha) - 1))``."""
    if alpha == 0:
        raise ArgumentError("celu: alpha must not be zero")
    return x._unary(ops.celu, float(alpha))


def selu(x: Tensor) -> Tensor:
    """Scaled ELU with the self-normalizing constants of Klambauer et al."""
    return x._unary(ops.selu)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + e^(beta x)) / beta``; linear where ``beta * x > threshold``, as in PyTorch."""
    if beta <= 0:
        raise ArgumentError(f"softplus: beta must be positive, got {beta}")
    return x._unary(ops.softplus, float(beta), float(threshold))


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def _along(op, x: Tensor, dim: int) -> Tensor:
    d = x._dim(op.name, dim)
    if not x.shape:  # a 0-d tensor is one element along dim 0, as in PyTorch
        return _along(op, x.reshape([1]), d).reshape([])
    if x.shape[d] == 0:
        _primitive(op, x.kind)  # KindError for Int / Bool inputs
        return x  # nothing to normalize along an empty dim: the (empty) input is the result
    return x._checked(op, d)


def softmax(x: Tensor, dim: int) -> Tensor:
    """``e^x / sum(e^x)`` along ``dim``, shifted by the maximum for stability."""
    return _along(ops.softmax, x, dim)


def log_softmax(x: Tensor, dim: int) -> Tensor:
    return _along(ops.log_softmax, x, dim)


def softmin(x: Tensor, dim: int) -> Tensor:
    """``softmax(-x)``."""
    return _along(ops.softmin, x, dim)


def quiet_softmax(x: Tensor, dim: int) -> Tensor:
    """Softmax with an extra zero logit, so a row of very negative scores can sum below one."""
    return _along(ops.quiet_softmax, x, dim)


def glu(x: Tensor, dim: int = -1) -> Tensor:
    """Gated linear unit: the first half of ``dim`` times the sigmoid of the second half."""
    return _along(ops.glu, x, dim)
