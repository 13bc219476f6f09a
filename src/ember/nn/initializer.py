"""Initializers: how a layer fills its parameters when it is built.

Every initializer is a small frozen config (it saves with the layer's config)
with :meth:`Initializer.init` to sample a tensor and :meth:`Initializer.init_param`
to wrap it in a :class:`~ember.module.Param`.

The scaled initializers read the layer's fans, which the layer's config passes:

* ``fan_in``: inputs per output. Linear: ``d_input``; convolution:
  ``channels_in / groups * prod(kernel_size)``.
* ``fan_out``: outputs per input. Linear: ``d_output``; convolution:
  ``channels_out / groups * prod(kernel_size)``.

======================================  ===========================================
initializer                             values
======================================  ===========================================
``Constant(value)``, ``Zeros``, ``Ones``  the value everywhere
``Uniform(min, max)``                   uniform on ``[min, max)``
``Normal(mean, std)``                   normal
``KaimingUniform(gain, fan_out_only)``  uniform on ``[-b, b)``, ``b = gain * sqrt(3 / fan)``
``KaimingNormal(gain, fan_out_only)``   normal, mean 0, ``std = gain * sqrt(1 / fan)``
``XavierUniform(gain)``                 uniform, ``b = gain * sqrt(6 / (fan_in + fan_out))``
``XavierNormal(gain)``                  normal, ``std = gain * sqrt(2 / (fan_in + fan_out))``
``Orthogonal(gain)``                    ``gain`` times a (semi-)orthogonal matrix
======================================  ===========================================

For Kaiming, ``fan`` is ``fan_in``, or ``fan_out`` with ``fan_out_only=True``.
PyTorch's default for ``nn.Linear`` and ``nn.Conv*d`` weights is
``KaimingUniform(gain=1/sqrt(3))``: a bound of ``1 / sqrt(fan_in)``.

Random initializers draw from the device's generator, so ``ember.seed(device, n)``
makes them repeatable.

Example:
    >>> import ember
    >>> from ember.nn import Initializer
    >>> init = Initializer.KaimingUniform(gain=1.0)
    >>> w = init.init([64, 32], ember.device("ndarray"), fan_in=64)
    >>> bool(w.abs().max() <= (3 / 64) ** 0.5)
    True
    >>> Initializer.Constant(0.5).init([2], ember.device("ndarray")).tolist()
    [0.5, 0.5]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ember.backend.device import Device, default_device
from ember.backend.errors import ArgumentError
from ember.config import Variant
from ember.config.fields import NonNegativeFloat
from ember.module.param import Param
from ember.tensor import Distribution, Tensor, TensorData

__all__ = [
    "Constant", "Initializer", "KaimingNormal", "KaimingUniform", "Normal", "Ones",
    "Orthogonal", "Uniform", "XavierNormal", "XavierUniform", "Zeros",
]  # fmt: skip

class Initializer(Variant):
    """How to fill a new parameter: one of the variants below, e.g. ``Initializer.Zeros()``.

    A config field typed ``Initializer`` accepts any variant and saves it by name.
    """

    def init(
        self,
        shape: Sequence[int],
        device: Device | None = None,
        fan_in: int | None = None,
        fan_out: int | None = None,
    ) -> Tensor:
        """A new Float tensor of ``shape`` on ``device`` (the default device if None).

        Args:
            shape: the tensor's shape.
            device: where the tensor is made.
            fan_in: inputs per output of the layer; the Kaiming and Xavier variants need it.
            fan_out: outputs per input; Xavier and ``fan_out_only`` Kaiming need it.

        Raises:
            ArgumentError: a fan this initializer needs is missing or below 1.
        """
        shape = tuple(int(d) for d in shape)
        return self._sample(shape, device if device is not None else default_device(), fan_in, fan_out)

    def init_param(
        self,
        shape: Sequence[int],
        device: Device | None = None,
        fan_in: int | None = None,
        fan_out: int | None = None,
        require_grad: bool = True,
    ) -> Param:
        """:meth:`init` wrapped in a new :class:`~ember.module.Param`."""
        return Param(self.init(shape, device, fan_in, fan_out), require_grad=require_grad)

    def _sample(self, shape: tuple[int, ...], device: Device, fan_in: int | None,
                fan_out: int | None) -> Tensor:  # fmt: skip
        raise NotImplementedError

    def _fan(self, name: str, value: int | None) -> int:
        if value is None:
            raise ArgumentError(
                f"{type(self).__name__}: needs {name} to scale its values; the layer's config "
                f"passes it (call init(shape, device, {name}=...))"
            )
        if value < 1:
            raise ArgumentError(f"{type(self).__name__}: {name} must be >= 1, got {value}")
        return int(value)


def _uniform(shape: tuple[int, ...], device: Device, low: float, high: float) -> Tensor:
    if low == high:  # e.g. gain 0: a point, which Distribution.uniform rejects as empty
        return Tensor.full(shape, float(low), device)
    return Tensor.random(shape, Distribution.uniform(low, high), device)


def _normal(shape: tuple[int, ...], device: Device, mean: float, std: float) -> Tensor:
    return Tensor.random(shape, Distribution.normal(mean, std), device)


class Constant(Initializer):
    """Every element equal to ``value``.

    Example:
        >>> from ember.nn.initializer import Constant
        >>> Constant(2.0).init([3]).tolist()
        [2.0, 2.0, 2.0]
    """

    value: float

    def _sample(self, shape, device, fan_in, fan_out):
        return Tensor.full(shape, float(self.value), device)


class Zeros(Initializer):
    """Zeros everywhere (biases, batch-norm shifts)."""

    def _sample(self, shape, device, fan_in, fan_out):
        return Tensor.zeros(shape, device)


class Ones(Initializer):
    """Ones everywhere (batch-norm scales)."""

    def _sample(self, shape, device, fan_in, fan_out):
        return Tensor.ones(shape, device)


class Uniform(Initializer):
    """Uniform on ``[min, max)``.

    Raises:
        ArgumentError: at ``init``, when ``min >= max``.
    """

    min: float
    max: float

    def _sample(self, shape, device, fan_in, fan_out):
        if not self.min < self.max:
            raise ArgumentError(f"Uniform: needs min < max, got min={self.min}, max={self.max}")
        return _uniform(shape, device, self.min, self.max)


class Normal(Initializer):
    """Normal with mean ``mean`` and standard deviation ``std`` (>= 0)."""

    mean: float
    std: NonNegativeFloat

    def _sample(self, shape, device, fan_in, fan_out):
        return _normal(shape, device, self.mean, self.std)


class _Kaiming(Initializer):
    gain: float
    fan_out_only: bool = False

    def _std(self, fan_in: int | None, fan_out: int | None) -> float:
        fan = self._fan("fan_out", fan_out) if self.fan_out_only else self._fan("fan_in", fan_in)
        return abs(self.gain) / math.sqrt(fan)


class KaimingUniform(_Kaiming):
    """He et al. (2015) uniform: on ``[-b, b)`` with ``b = gain * sqrt(3 / fan)``.

    ``fan`` is ``fan_in``, or ``fan_out`` with ``fan_out_only=True``.

    Example:
        >>> from ember.nn.initializer import KaimingUniform
        >>> KaimingUniform(gain=2 ** 0.5).with_fan_out_only(True)
        KaimingUniform(gain=1.4142135623730951, fan_out_only=True)
    """

    def _sample(self, shape, device, fan_in, fan_out):
        bound = math.sqrt(3.0) * self._std(fan_in, fan_out)
        return _uniform(shape, device, -bound, bound)


class KaimingNormal(_Kaiming):
    """He et al. (2015) normal: mean 0, ``std = gain * sqrt(1 / fan)``."""

    def _sample(self, shape, device, fan_in, fan_out):
        return _normal(shape, device, 0.0, self._std(fan_in, fan_out))


class _Xavier(Initializer):
    gain: float

    def _std(self, fan_in: int | None, fan_out: int | None) -> float:
        fans = self._fan("fan_in", fan_in) + self._fan("fan_out", fan_out)
        return abs(self.gain) * math.sqrt(2.0 / fans)


class XavierUniform(_Xavier):
    """Glorot & Bengio (2010) uniform: ``b = gain * sqrt(6 / (fan_in + fan_out))``."""

    def _sample(self, shape, device, fan_in, fan_out):
        bound = math.sqrt(3.0) * self._std(fan_in, fan_out)
        return _uniform(shape, device, -bound, bound)


class XavierNormal(_Xavier):
    """Glorot & Bengio (2010) normal: ``std = gain * sqrt(2 / (fan_in + fan_out))``."""

    def _sample(self, shape, device, fan_in, fan_out):
        return _normal(shape, device, 0.0, self._std(fan_in, fan_out))


class Orthogonal(Initializer):
    """``gain`` times a random (semi-)orthogonal matrix (Saxe et al., 2014).

    The tensor is seen as a ``[shape[0], prod(shape[1:])]`` matrix ``W``: its rows are
    orthonormal when it has no more rows than columns (``W Wᵀ = I``), its columns
    otherwise (``Wᵀ W = I``). Built from the QR decomposition of a normal sample,
    with signs fixed so the result is uniform over orthogonal matrices; the
    decomposition runs in float64 on the host, once per parameter.

    Raises:
        ArgumentError: at ``init``, for a shape of rank < 2.

    Example:
        >>> import numpy as np
        >>> from ember.nn.initializer import Orthogonal
        >>> w = Orthogonal(gain=1.0).init([3, 5]).to_numpy()
        >>> bool(np.allclose(w @ w.T, np.eye(3), atol=1e-5))
        True
    """

    gain: float

    def _sample(self, shape, device, fan_in, fan_out):
        if len(shape) < 2:
            raise ArgumentError(
                f"Orthogonal: needs a shape of rank >= 2 (rows, columns...), got {list(shape)} "
                "(a bias cannot be orthogonal: build the layer with bias=False)"
            )
        rows, cols = shape[0], math.prod(shape[1:])
        if rows * cols == 0:
            return Tensor.zeros(shape, device)
        sample = _normal((max(rows, cols), min(rows, cols)), device, 0.0, 1.0)
        q, r = np.linalg.qr(sample.to_numpy().astype(np.float64))
        # QR's factors are unique up to signs; tying them to diag(R) makes Q Haar-distributed.
        q = q * np.where(np.diag(r) < 0, -1.0, 1.0)
        matrix = q.T if rows < cols else q
        data = TensorData(self.gain * matrix.reshape(shape), sample.dtype)
        return Tensor.from_data(data, device)
