"""The converter registry: one converter per ONNX op type and opset range.

A converter is a small function that turns one ONNX node into lines of Python. It is
registered with :func:`converter` under its op type, its domain and the opset version
its behaviour starts at. For a model that imports opset ``v`` of a domain, the
converter with the greatest ``since <= v`` is used, so a converter written for
``since=13`` keeps serving opsets 13, 14, ... until one with a later ``since`` exists.

Converters live in ``ember.onnx.ops``, one module per op family; every module of that
package is imported (and so registers its converters) the first time the registry is
asked for one.

Example:
    >>> from ember.onnx.registry import lookup
    >>> spec = lookup("Add", "", 14)
    >>> spec.op_type, spec.since
    ('Add', 7)
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ember.backend.errors import EmberError, UnsupportedError

Lines = str | list[str] | None

_DOMAIN_ALIASES = {"ai.onnx": ""}


def canonical_domain(domain: str) -> str:
    """The registry's spelling of an operator domain (``"ai.onnx"`` is the default ``""``)."""
    return _DOMAIN_ALIASES.get(domain, domain)


class Converter(Protocol):
    """What a converter is: a function of the node's context returning source lines.

    The lines assign every output variable (``node.outputs[i]``) from the inputs'
    expressions (``node.input(i).expr``). A converter that knows an output at import
    time calls ``node.set_constant(i, value)`` instead and may return nothing. It
    raises through ``node.unsupported(...)`` for an attribute value or input it cannot
    translate. (The registry sits below the node context in the importer's layers, so
    the node is typed ``Any`` here; converters annotate it as ``NodeContext``.)
    """

    def __call__(self, node: Any) -> Lines: ...


@dataclass(frozen=True)
class ConverterSpec:
    """One registered converter.

    Args:
        op_type: the ONNX op type (``"Conv"``).
        domain: the operator domain; ``""`` is the default ONNX domain.
        since: the first opset version this converter handles.
        fn: the converter.
        attrs: the attribute names it understands; any other attribute on a node is an
            unsupported attribute. None accepts every attribute.
        limits: what is not supported yet (shown in the coverage table); None when the
            converter covers the whole op.
        foldable: whether a node whose inputs are all constants may be evaluated at import
            time (False for ops with side effects or randomness).
    """

    op_type: str
    domain: str
    since: int
    fn: Converter
    attrs: frozenset[str] | None = None
    limits: str | None = None
    foldable: bool = True


_REGISTRY: dict[tuple[str, str], list[ConverterSpec]] = {}
_loaded = False


def converter(
    op_type: str,
    since: int = 1,
    *,
    domain: str = "",
    attrs: Iterable[str] | None = None,
    limits: str | None = None,
    foldable: bool = True,
) -> Callable[[Converter], Converter]:
    """Registers the decorated function as the converter of ``op_type`` from opset ``since``.

    The decorator may be stacked to register one function for several op types or
    versions. Registering the same ``(domain, op_type, since)`` twice is an error.

    A converter of a family module (``ember/onnx/ops/<family>.py``) looks like::

        @converter("Neg", since=6, attrs=())
        def neg(node: NodeContext) -> str:
            return f"{node.outputs[0]} = -{node.input(0).expr}"
    """
    allowed = frozenset(attrs) if attrs is not None else None

    def register(fn: Converter) -> Converter:
        key = (canonical_domain(domain), op_type)
        specs = _REGISTRY.setdefault(key, [])
        if any(s.since == since for s in specs):
            raise ValueError(f"a converter for {op_type} (domain {domain!r}) since opset "
                             f"{since} is registered twice")
        specs.append(ConverterSpec(op_type, key[0], since, fn, allowed, limits, foldable))
        specs.sort(key=lambda s: s.since)
        return fn

    return register


def import_modules_of(package: Any) -> None:
    """Imports every module of ``package``, so the rules they hold register themselves."""
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")


def _load_ops() -> None:
    """Imports every module of ``ember.onnx.ops`` once, so their converters register."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import ember.onnx.ops as package

    import_modules_of(package)


def lookup(op_type: str, domain: str, opset: int) -> ConverterSpec | None:
    """The converter for ``op_type`` at ``opset``: the greatest ``since <= opset``, or None."""
    _load_ops()
    found = None
    for spec in _REGISTRY.get((canonical_domain(domain), op_type), ()):
        if spec.since <= opset:
            found = spec
    return found


def versions(op_type: str, domain: str = "") -> list[ConverterSpec]:
    """Every converter registered for ``op_type``, oldest first."""
    _load_ops()
    return list(_REGISTRY.get((canonical_domain(domain), op_type), ()))


def registered() -> Iterator[ConverterSpec]:
    """Every registered converter, by domain, op type and version."""
    _load_ops()
    for key in sorted(_REGISTRY):
        yield from _REGISTRY[key]


class OnnxImportError(EmberError, ValueError):
    """An ONNX model that cannot be read or does not make sense (a malformed graph)."""


class OnnxFileNotFoundError(OnnxImportError, FileNotFoundError):
    """A model file to import, or a generated module to load, that does not exist."""


class UnsupportedOnnxError(OnnxImportError, UnsupportedError):
    """A node the importer cannot translate: an unknown op, opset, attribute or input form
    (or an attribute value it refuses). It is an :class:`OnnxImportError` too.

    The message names the node, its op type and the opset, says why, and what would be
    needed. The same facts are attributes: ``node``, ``op_type``, ``domain``, ``opset``,
    ``reason``.
    """

    def __init__(self, node: str, op_type: str, domain: str, opset: int, reason: str) -> None:
        where = f"{domain}::{op_type}" if domain else op_type
        super().__init__(f"ONNX import: node {node!r} (op {where}, opset {opset}) is not "
                         f"supported: {reason}")
        self.node = node
        self.op_type = op_type
        self.domain = domain
        self.opset = opset
        self.reason = reason


def missing_reason(op_type: str, domain: str, opset: int) -> str:
    """Why no converter serves ``op_type`` at ``opset``, and what would be needed."""
    specs = versions(op_type, domain)
    where = f"{domain}::{op_type}" if domain else op_type
    if not specs:
        return (f"ember has no converter for {where}; one is needed in ember/onnx/ops "
                f"(see ember.onnx.registry.converter)")
    since = ", ".join(str(s.since) for s in specs)
    return (f"ember's converters for {where} start at opset {since}; a converter for opset "
            f"{opset} is needed, or a model exported with opset >= {specs[0].since}")
