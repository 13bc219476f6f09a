"""Decorator: a backend that wraps another backend through one generic path.

Autodiff, fusion and tracing are decorators. None of them writes the op
surface out by hand: when a Decorator subclass is created, every primitive of
the op table gets a method that sends the call to :meth:`Decorator.call` with
the op's table entry. The default ``call`` unwraps the tensor operands, maps
device attributes to the inner backend's device, runs the inner backend's
primitive and wraps the outputs; a subclass overrides ``call`` (and ``wrap`` /
``unwrap`` if its primitives carry more than the inner primitive).

Composite ops are forwarded to the inner backend (which may have a fast
kernel) when ``forward_composite(op)`` says so; otherwise the protocol's
default composite runs on the decorator itself, so only its primitives are
seen by ``call``.
"""

from __future__ import annotations

from typing import Any

from ember.backend.base import Backend, DTypeUsage
from ember.backend.device import Device
from ember.backend.ops import OpDef, primitives
from ember.tensor.dtype import DType


def _generic(op: OpDef, name: str):
    def primitive(self: Decorator, *args: Any) -> Any:
        return self.call(op, name, args)

    primitive.__name__ = name
    primitive.__qualname__ = f"Decorator.{name}"
    primitive.__doc__ = f"The {op.name!r} op through the decorator's generic path."
    return primitive


class Decorator(Backend):
    """Base class of backend decorators.

    Args:
        inner: the backend whose primitives this one wraps.
    """

    prefix = "decorator"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for op, _kind, name in primitives():
            if name in cls.__dict__:
                continue  # the subclass wrote this one itself
            if op.composite and not cls.forward_composite(op):
                # The protocol's default composite runs on the decorator's own primitives.
                setattr(cls, name, getattr(Backend, name))
            else:
                setattr(cls, name, _generic(op, name))

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.float_dtype = inner.float_dtype
        self.int_dtype = inner.int_dtype
        self.places = inner.places
        self.name = f"{self.prefix}<{inner.name}>"

    @classmethod
    def forward_composite(cls, op: OpDef) -> bool:
        """Whether composite ``op`` goes to the inner backend (True) or is decomposed here."""
        return True

    def _config(self) -> tuple:
        return (type(self), self.inner._config())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    # ------------------------------------------------------------ the generic path
    def call(self, op: OpDef, name: str, args: tuple) -> Any:
        """Runs ``op`` (primitive ``name``) on the inner backend; override to intercept ops."""
        return self.forward(op, name, args)

    def forward(self, op: OpDef, name: str, args: tuple) -> Any:
        inner_args = self.unwrap_args(op, args)
        out = getattr(self.inner, name)(*inner_args)
        return self.wrap_output(op, out)

    def unwrap_args(self, op: OpDef, args: tuple) -> list:
        """The inner backend's call arguments: primitives unwrapped, devices mapped."""
        n = len(op.inputs)
        out = list(args)
        for i in range(min(n, len(out))):
            if op.inputs[i] == "*tensors":
                out[i] = [self.unwrap(t) for t in out[i]]
            elif out[i] is not None:
                out[i] = self.unwrap(out[i])
        if "device" in op.attrs:  # only creation ops and to_device take one
            for i in range(n, len(out)):
                if isinstance(out[i], Device):
                    out[i] = self.inner_device(out[i])
        return out

    @staticmethod
    def operands(op: OpDef, args: tuple | list) -> list:
        """This decorator's tensor operands of a call, one entry per tensor (``cat``'s list
        spread out, an absent optional operand as None)."""
        n = len(op.inputs)
        if n and op.inputs[0] == "*tensors":
            return list(args[0])
        return list(args[:n])

    def wrap_output(self, op: OpDef, out: Any) -> Any:
        if op.name == "into_data":
            return out
        if isinstance(out, tuple):
            return tuple(self.wrap(o) for o in out)
        return self.wrap(out)

    def wrap(self, inner_prim: Any) -> Any:
        """This decorator's primitive for an inner primitive (the same object by default)."""
        return inner_prim

    def unwrap(self, prim: Any) -> Any:
        """The inner primitive of one of this decorator's primitives."""
        return prim

    # ------------------------------------------------------------ devices and metadata
    def inner_device(self, device: Device) -> Device:
        return Device(self.inner, device.place, device.index)

    def device(self, spec: str | None = None) -> Device:
        inner = self.inner.device(spec)
        return Device(self, inner.place, inner.index)

    def device_count(self, place: str = "cpu") -> int:
        return self.inner.device_count(place)

    def seed(self, device: Device, seed: int) -> None:
        self.inner.seed(self.inner_device(device), seed)

    def rng_state(self, device: Device) -> str:
        return self.inner.rng_state(self.inner_device(device))

    def set_rng_state(self, device: Device, state: str) -> None:
        self.inner.set_rng_state(self.inner_device(device), state)

    def sync(self, device: Device) -> None:
        self.inner.sync(self.inner_device(device))

    def dtype_usage(self, device: Device, dtype: DType) -> DTypeUsage:
        return self.inner.dtype_usage(self.inner_device(device), dtype)

    def shape(self, x: Any) -> tuple[int, ...]:
        return self.inner.shape(self.unwrap(x))

    def dtype(self, x: Any) -> DType:
        return self.inner.dtype(self.unwrap(x))

    def device_of(self, x: Any) -> Device:
        inner = self.inner.device_of(self.unwrap(x))
        return Device(self, inner.place, inner.index)
