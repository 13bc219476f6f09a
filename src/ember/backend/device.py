"""Devices: where tensors live and which backend runs them.

A :class:`Device` pairs a backend instance with a place (``cpu``, ``cuda``,
``mps``) and an index. Decorators wrap devices: ``device.wrap(Decorator)``
gives the same place run through a decorated backend, and ``device.inner()``
takes the decorator off again.

Backends register a factory under a name, so ``ember.device("ndarray")`` and
``ember.device("torch", "cuda:0")`` find them. Decorators register one too
(:func:`register_decorator`), so ``device.autodiff()``, ``device.fusion()`` and
``device.decorate(name)`` find them: this module, the lowest layer, never imports
the decorators (``ember.backends`` registers them when it is imported).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ember.backend import host_memory
from ember.backend.errors import DeviceError

if TYPE_CHECKING:
    from ember.backend.base import Backend


@dataclass(frozen=True)
class Device:
    """A place on a backend. Equal devices hold interchangeable tensors.

    Example:
        >>> import ember
        >>> ember.device("ndarray")
        Device(ndarray, cpu:0)
    """

    backend: Backend
    place: str = "cpu"
    index: int = 0

    def wrap(self, decorator: Callable[[Backend], Backend]) -> Device:
        """The same place, run through ``decorator(self.backend)``.

        A decorator whose setup depends on the place (Fusion picks its GPU runtime on
        ``cuda``) has a ``placed(place, index)`` method, called here; it may raise."""
        backend = decorator(self.backend)
        placed = getattr(backend, "placed", None)
        if placed is not None:
            placed(self.place, self.index)
        return Device(backend, self.place, self.index)

    def inner(self) -> Device:
        """The device of the backend a decorator wraps; the device itself for a base backend."""
        inner = getattr(self.backend, "inner", None)
        if inner is None:
            return self
        return Device(inner, self.place, self.index)

    def decorate(self, name: str, **options) -> Device:
        """This place run through the decorator registered as ``name``.

        Example:
            >>> import ember
            >>> ember.device("ndarray").decorate("autodiff").backend.name
            'autodiff<ndarray>'
        """
        factory = _DECORATORS.get(name)
        if factory is None:
            known = ", ".join(sorted(_DECORATORS))
            raise DeviceError(f"unknown decorator {name!r}; registered decorators: {known}")
        return self.wrap(lambda inner: factory(inner, **options))

    def autodiff(self, **options) -> Device:
        """This place with gradients: the backend wrapped in the Autodiff decorator."""
        return self.decorate("autodiff", **options)

    def fusion(self, **options) -> Device:
        """This place with lazy, fused execution: the backend wrapped in the Fusion decorator.

        Example:
            >>> import ember
            >>> ember.device("ndarray").fusion().autodiff().backend.name
            'autodiff<fusion<ndarray>>'
        """
        return self.decorate("fusion", **options)

    def seed(self, seed: int) -> None:
        """Seeds this device's random generator."""
        self.backend.seed(self, seed)

    def sync(self) -> None:
        """Waits until every op queued on this device has run."""
        self.backend.sync(self)

    def __str__(self) -> str:
        return f"{self.backend.name}:{self.place}:{self.index}"

    def __repr__(self) -> str:
        return f"Device({self.backend.name}, {self.place}:{self.index})"


_REGISTRY: dict[str, Callable[..., Backend]] = {}
_DECORATORS: dict[str, Callable[..., Backend]] = {}


def register_decorator(name: str, factory: Callable[..., Backend]) -> None:
    """Makes ``device.decorate(name, **options)`` wrap backends with ``factory(inner, **options)``.

    Example:
        >>> import ember
        >>> from ember.backend import register_decorator
        >>> from ember.backends.trace import Trace
        >>> register_decorator("quiet_trace", lambda inner: Trace(inner, on_op=lambda r: None))
        >>> ember.device("ndarray").decorate("quiet_trace").backend.name
        'trace<ndarray>'
    """
    _DECORATORS[name] = factory


def register_backend(name: str, factory: Callable[..., Backend]) -> None:
    """Makes ``ember.device(name, ...)`` build backends with ``factory(**options)``."""
    _REGISTRY[name] = factory


def _backend(name: str, **options) -> Backend:
    factory = _REGISTRY.get(name)
    if factory is None:
        known = ", ".join(sorted(_REGISTRY))
        raise DeviceError(f"unknown backend {name!r}; registered backends: {known}")
    host_memory.keep_freed_memory()  # once per process (see host_memory.py)
    return factory(**options)


def device(name: str = "ndarray", spec: str | None = None, **options) -> Device:
    """The device ``spec`` (``"cpu"``, ``"cuda:1"``, ...) of the backend registered as ``name``.

    Keyword options configure the backend instance, e.g. its default element types:
    ``ember.device("ndarray", float_dtype="f64")``.

    Example:
        >>> import ember
        >>> ember.device("ndarray").backend.name
        'ndarray'
    """
    return _backend(name, **options).device(spec)


def default_device() -> Device:
    """The device of the ``EMBER_DEVICE`` environment variable (``name`` or ``name:spec``),
    else the NdArray CPU device."""
    setting = os.environ.get("EMBER_DEVICE", "ndarray")
    name, _, spec = setting.partition(":")
    return device(name, spec or None)


def device_count(name: str = "ndarray", place: str = "cpu") -> int:
    """How many devices of kind ``place`` the backend ``name`` can reach."""
    return _backend(name).device_count(place)
