"""The exporter registry: each op of the op table with the function that writes its ONNX form.

An exporter is a function ``(emitter, call) -> None`` that appends the ONNX nodes computing
``call``'s outputs from its inputs (see :class:`ember.onnx.export.emitter.Emitter`). It is
registered with :func:`exporter` under one or more op names, optionally only for some
tensor kinds or from an opset on. Exporters live in ``ember.onnx.export.rules``, one module
per op family, imported the first time the registry is asked.

Ops that have no ONNX form are listed in :data:`WITHOUT_FORM` with the reason, so an op
added to the table shows up either here or as an exporter, and the per-op export test
fails for an op that is in neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ember.backend.ops import OPS, OpDef
from ember.tensor.dtype import Kind

ExportRule = Callable[[Any, Any], None]


@dataclass(frozen=True)
class RuleSpec:
    """One registered exporter: the op, its function, the kinds and first opset it serves."""

    op: str
    fn: ExportRule
    kinds: frozenset[Kind] | None
    since: int


_RULES: dict[str, list[RuleSpec]] = {}
_MODULE_RULES: dict[type, ExportRule] = {}
_loaded = False

_TRAINING = "a training-only gradient op; export runs the forward for inference"

WITHOUT_FORM: dict[str, str] = {
    "into_data": "reads values to the host; not a graph op",
    "random": "ONNX random ops do not reproduce ember's generator (dropout is off in export)",
    "cumprod": "ONNX has no cumulative product",
    "avg_pool2d_backward": _TRAINING,
    "max_pool2d_with_indices_backward": _TRAINING,
    "adaptive_avg_pool2d_backward": _TRAINING,
    "embedding_backward": _TRAINING,
    "interpolate_backward": _TRAINING,
}
"""Ops of the op table without an ONNX form (for every kind), with the reason."""

WITHOUT_FORM_BY_KIND: dict[tuple[str, Kind], str] = {}
"""(op, kind) pairs without an ONNX form at any opset, with the reason."""


def exporter(*ops: str, kinds: Iterable[Kind] | None = None, since: int = 1
             ) -> Callable[[ExportRule], ExportRule]:  # fmt: skip
    """Registers the decorated function as the exporter of ``ops`` (op table names).

    Example (a family module of ``ember/onnx/export/rules``)::

        @exporter("exp", "log")
        def unary(e: Emitter, call: OpCall) -> None:
            e.node(UNARY[call.op.name], [e.input(call, 0)], [e.output(call)])
    """
    kind_set = frozenset(kinds) if kinds is not None else None

    def register(fn: ExportRule) -> ExportRule:
        for op in ops:
            if op not in OPS:
                raise ValueError(f"exporter for {op!r}: no such op in the op table")
            _RULES.setdefault(op, []).append(RuleSpec(op, fn, kind_set, since))
            _RULES[op].sort(key=lambda spec: -spec.since)
        return fn

    return register


def module_exporter(*classes: type) -> Callable[[ExportRule], ExportRule]:
    """Registers the decorated function as the exporter of whole modules of ``classes`` (and
    their subclasses): the tracer records such a module's call as one, whose ``inputs`` and
    ``outputs`` are the tensors among its arguments and results, and ``call.module`` the
    module. For layers with an ONNX node of their own (``LSTM``, ``GRU``)."""

    def register(fn: ExportRule) -> ExportRule:
        for cls in classes:
            _MODULE_RULES[cls] = fn
        return fn

    return register


def module_rule_for(module: Any) -> ExportRule | None:
    """The exporter of ``module`` as a whole, or None (its ops are traced)."""
    _load_rules()
    for cls in type(module).__mro__:
        if cls in _MODULE_RULES:
            return _MODULE_RULES[cls]
    return None


def _load_rules() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import ember.onnx.export.rules as package
    from ember.onnx.registry import import_modules_of

    import_modules_of(package)


def rule_for(op: str, kind: Kind, opset: int) -> RuleSpec | None:
    """The exporter of ``op`` for ``kind`` tensors at ``opset`` (the latest ``since <=
    opset``), or None."""
    _load_rules()
    for spec in _RULES.get(op, ()):
        if spec.since <= opset and (spec.kinds is None or kind in spec.kinds):
            return spec
    return None


def has_form(op: OpDef) -> bool:
    """Whether ``op`` has an exporter for some kind and opset (the tracer records such a
    composite as itself instead of decomposing it)."""
    _load_rules()
    return op.name in _RULES


def why_no_form(op: str, kind: Kind, opset: int) -> str:
    """Why ``op`` on ``kind`` tensors has no ONNX form at ``opset``."""
    _load_rules()
    if op in WITHOUT_FORM:
        return WITHOUT_FORM[op]
    if (op, kind) in WITHOUT_FORM_BY_KIND:
        return WITHOUT_FORM_BY_KIND[op, kind]
    later = [s.since for s in _RULES.get(op, ()) if kind in (s.kinds or {kind})]
    if later:
        return f"its ONNX form needs opset >= {min(later)} (export with opset={min(later)})"
    return ("no exporter is registered for it (add one in ember/onnx/export/rules, see "
            "ember.onnx.export.registry.exporter)")


def coverage(opset: int = 17, newest: int = 21) -> dict[str, list[str]]:
    """The primitives of the built-in op table by how they export at ``opset``:
    ``"own"`` (an exporter of their own), ``"later_opset"`` (one from a later opset, up to
    ``newest``; at ``opset`` a composite is traced as its primitives), ``"decomposed"``
    (a composite traced as its primitives), ``"listed"`` (no ONNX form: WITHOUT_FORM)."""
    from ember.backend.ops import primitives

    found: dict[str, list[str]] = {"own": [], "later_opset": [], "decomposed": [], "listed": []}
    for op, kind, name in primitives():
        if op.group == "custom":
            continue
        if op.name in WITHOUT_FORM or (op.name, kind) in WITHOUT_FORM_BY_KIND:
            found["listed"].append(name)
        elif rule_for(op.name, kind, opset) is not None:
            found["own"].append(name)
        elif any(rule_for(op.name, kind, v) for v in range(opset + 1, newest + 1)):
            found["later_opset"].append(name)
        else:
            found["decomposed"].append(name)
    return found
