"""Adapters: per-module rules that turn another framework's layout into ember's.

Weights imported from PyTorch are named and shaped the PyTorch way: a Linear
weight is ``[out, in]`` where ember's is ``[in, out]``; batch norm calls its
scale and shift ``weight`` and ``bias`` where ember says ``gamma`` and
``beta``. An :class:`Adapter` holds one rule per module class; loading an
imported record applies the rule of each module it reaches to that module's
part of the record, before matching names and shapes. A layer registers its
rule beside its own definition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Rule = Callable[[Any, dict[str, Any]], dict[str, Any]]


class Adapter:
    """A table of layout rules keyed by module class (subclasses inherit rules).

    Example:
        >>> from ember.module import Module
        >>> adapter = Adapter("example")
        >>> class Scale(Module):
        ...     pass
        >>> @adapter.register(Scale)
        ... def rename(module, record):
        ...     return {"w" if k == "weight" else k: v for k, v in record.items()}
        >>> adapter.adapt(Scale(), {"weight": 1})
        {'w': 1}
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._rules: dict[type, Rule] = {}

    def register(self, module_type: type) -> Callable[[Rule], Rule]:
        def add(rule: Rule) -> Rule:
            self._rules[module_type] = rule
            return rule

        return add

    def adapt(self, module: Any, record: Mapping[str, Any]) -> dict[str, Any]:
        """``record`` (one module's part) in ember's layout for ``module``."""
        for cls in type(module).__mro__:
            rule = self._rules.get(cls)
            if rule is not None:
                return rule(module, dict(record))
        return dict(record)

    def __repr__(self) -> str:
        return f"Adapter({self.name!r})"


PYTORCH = Adapter("pytorch")
"""The rules for weights saved by PyTorch (``torch.save`` state dicts, their safetensors)."""
