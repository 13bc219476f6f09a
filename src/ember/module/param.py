"""Parameters: the tensors a module learns, each with a stable identity.

A :class:`Param` pairs a tensor with a :class:`ParamId`. The id survives
saving, loading, moving between devices and every optimizer step, so state
kept per parameter (optimizer moments, gradients) can find its parameter again
after any of those. ``require_grad`` says whether an optimizer updates it; on an
autodiff device such a parameter is a tracked leaf of the graph.

A :class:`RunningState` is the one mutable exception: state a module updates
as a side effect of its forward pass (batch-norm running statistics). It is
saved with the module's weights but never receives gradients.
"""

from __future__ import annotations

import secrets
from typing import Self

from ember.backend import effects
from ember.backend.device import Device
from ember.backend.errors import ArgumentError
from ember.tensor import DType, Kind, Tensor


class ParamId:
    """A parameter's identity: a random 64-bit number, written as 16 hex digits.

    Example:
        >>> ParamId.parse("00000000000000ff")
        ParamId(00000000000000ff)
        >>> ParamId.new() != ParamId.new()
        True
    """

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        if not 0 <= value < 2**64:
            raise ArgumentError(f"ParamId: {value} is not a 64-bit unsigned number")
        self.value = value

    @staticmethod
    def new() -> ParamId:
        return ParamId(secrets.randbits(64))

    @staticmethod
    def parse(text: str) -> ParamId:
        """The id written as ``str(param_id)``."""
        try:
            return ParamId(int(text, 16))
        except (TypeError, ValueError):
            raise ArgumentError(f"ParamId: {text!r} is not an id (16 hex digits)") from None

    def __str__(self) -> str:
        return f"{self.value:016x}"

    def __repr__(self) -> str:
        return f"ParamId({self})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ParamId) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def _tracked(value: Tensor, require_grad: bool) -> Tensor:
    """``value`` as a graph leaf when it should get gradients, detached when it should not."""
    if not hasattr(value.device.backend, "backward"):
        return value
    if require_grad and value.kind is Kind.FLOAT:
        return value if value.is_require_grad() else value.require_grad()
    return value.detach() if value.is_require_grad() else value


class Param:
    """A learnable tensor of a module, with its :class:`ParamId`.

    Args:
        value: the tensor.
        id: the parameter's identity; a new random one if omitted.
        require_grad: whether optimizers update it. On an autodiff device a Float
            parameter with ``require_grad`` is a graph leaf; without it, detached.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.module import Param
        >>> device = ember.device("ndarray").autodiff()
        >>> w = Param(Tensor.ones([2, 3], device=device))
        >>> w.shape, w.val().is_require_grad()
        ((2, 3), True)
    """

    __slots__ = ("_value", "id", "require_grad")
    recorded = True

    def __init__(self, value: Tensor, id: ParamId | None = None, require_grad: bool = True) -> None:
        if not isinstance(value, Tensor):
            raise ArgumentError(f"Param: needs a Tensor, got {type(value).__name__}")
        self.id = id if id is not None else ParamId.new()
        self.require_grad = bool(require_grad)
        self._value = _tracked(value, self.require_grad)

    def val(self) -> Tensor:
        """The tensor (a tracked leaf on an autodiff device when ``require_grad``)."""
        return self._value

    def with_value(self, value: Tensor) -> Self:
        """The same parameter (id, ``require_grad``) holding ``value``."""
        return type(self)(value, self.id, self.require_grad)

    def set_require_grad(self, flag: bool) -> Param:
        return type(self)(self._value, self.id, flag)

    def to_device(self, device: Device) -> Param:
        return self.with_value(self._value.to_device(device))

    @property
    def shape(self) -> tuple[int, ...]:
        return self._value.shape

    @property
    def dtype(self) -> DType:
        return self._value.dtype

    @property
    def kind(self) -> Kind:
        return self._value.kind

    @property
    def device(self) -> Device:
        return self._value.device

    def num_elements(self) -> int:
        return self._value.num_elements()

    def __repr__(self) -> str:
        grad = "" if self.require_grad else ", require_grad=False"
        return f"Param(id={self.id}, shape={list(self.shape)}, dtype={self.dtype.value}{grad})"


class RunningState(Param):
    """State a module updates in its forward pass (e.g. batch-norm running mean).

    Saved and loaded like a parameter, never tracked for gradients; ``update``
    replaces the value in place, the one mutation modules allow, so a training
    step can refresh statistics without rebuilding the module.
    """

    __slots__ = ()

    def __init__(self, value: Tensor, id: ParamId | None = None, require_grad: bool = False) -> None:
        super().__init__(value, id, require_grad=False)

    def update(self, value: Tensor) -> None:
        """Replaces the state (detached: no gradient flows into running statistics)."""
        effects.note("updates a module's running state in place (batch norm in training)")
        self._value = value.detach()

    def set_require_grad(self, flag: bool) -> RunningState:
        return self.with_value(self._value)

