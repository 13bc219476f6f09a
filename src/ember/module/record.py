"""A module's record: its state as plain data, and loading that state back with checks.

``into_record`` walks a module and gives nested dicts and lists in the
module's shape; each parameter becomes ``{"id": "<16 hex digits>", "param":
TensorData}``. Constants and configuration are not state and are left out.

``load_record`` walks the module and the record side by side. A parameter
slot accepts that form or a bare TensorData (weights imported from another
tool, which keep the module's own ids); a container slot accepts a list or a
dict keyed ``"0"``, ``"1"``, ... (how flat names like ``layers.0.weight``
nest). Values are converted to the dtype the module holds, so a record of any
precision loads anywhere. Every problem found is reported at once, by path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ember.backend.device import Device
from ember.backend.errors import RecordMismatchError, fmt_shape
from ember.module.module import Module, _items, _join, _params_in
from ember.module.param import Param, ParamId
from ember.tensor import Tensor, TensorData


@dataclass
class LoadReport:
    """What :meth:`Module.load_record_partial` did, as lists of parameter paths."""

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        def names(paths: list[str]) -> str:
            return ", ".join(paths) if paths else "none"

        return (
            f"loaded {len(self.loaded)} parameters; missing: {names(self.missing)}; "
            f"unexpected: {names(self.unexpected)}"
        )


def into_record(value: Any) -> Any:
    """The record of a module, container or parameter (None for what holds no state)."""
    if isinstance(value, Param):
        return {"id": str(value.id), "param": value.val().into_data()}
    items = _items(value)
    if items is None:
        return None
    if isinstance(value, list | tuple):
        return [into_record(item) for _, item in items]
    return {str(name): into_record(item) for name, item in items if _is_slot(item)}


def _is_slot(value: Any) -> bool:
    """Whether a field holds saved state (a parameter somewhere inside it)."""
    if isinstance(value, Param):
        return True
    items = _items(value)
    return items is not None and any(_is_slot(item) for _, item in items)


@dataclass
class _Loading:
    strict: bool
    device: Device | None
    adapter: Any
    report: LoadReport = field(default_factory=LoadReport)
    mismatches: list[str] = field(default_factory=list)


def load_record(module: Module, record: Any, *, strict: bool, device: Device | None) -> tuple[Any, LoadReport]:
    from ember.record.imported import ImportedRecord

    adapter = None
    if isinstance(record, ImportedRecord):
        adapter, record = record.adapter, record.tree()
    loading = _Loading(strict, device, adapter)
    loaded = _load(module, record, "", loading)
    report = loading.report
    problems = list(loading.mismatches)
    if strict:
        problems += [f"{path}: missing from the record" for path in report.missing]
        problems += [f"{path}: in the record but not in the module" for path in report.unexpected]
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        first = problems[0].split(":", 1)[0]
        hint = "" if not strict or loading.mismatches else (
            "\n(load_record_partial loads what fits and reports the rest)"
        )
        raise RecordMismatchError(
            f"load_record: the record does not fit {type(module).__name__}:\n  {shown}{more}{hint}",
            path=first,
        )
    return loaded, report


def _load(value: Any, record: Any, path: str, loading: _Loading) -> Any:
    if isinstance(value, Param):
        return _load_param(value, record, path, loading)
    if isinstance(value, Module) and loading.adapter is not None and isinstance(record, Mapping):
        record = loading.adapter.adapt(value, record)
    if isinstance(value, list | tuple):
        slots = {str(i): item for i, item in enumerate(value)}
    elif isinstance(value, Module | dict):
        slots = {str(name): item for name, item in _items(value) or ()}
    else:
        return value
    entries = _entries(record, path, loading)
    if entries is None:
        return value
    rebuilt = {}
    for name, item in slots.items():
        sub = _join(path, name)
        if not _is_slot(item):
            rebuilt[name] = item
            loading.report.unexpected.extend(_record_paths(entries.get(name), sub))
        elif name in entries:
            rebuilt[name] = _load(item, entries[name], sub, loading)
        else:
            loading.report.missing.extend(p for p, _ in _params_in(item, sub))
            rebuilt[name] = item
    for name in entries:
        if name not in slots:
            loading.report.unexpected.extend(_record_paths(entries[name], _join(path, name)))
    return _assemble(value, rebuilt)


def _entries(record: Any, path: str, loading: _Loading) -> dict[str, Any] | None:
    """A record node as ``{name: sub-record}``; None (and a mismatch) if it is not a node."""
    if isinstance(record, Mapping):
        return {str(k): v for k, v in record.items()}
    if isinstance(record, list | tuple):
        return {str(i): v for i, v in enumerate(record)}
    loading.mismatches.append(
        f"{path or '<root>'}: the record holds {_describe(record)}, the module a group of parameters"
    )
    return None


def _assemble(value: Any, rebuilt: dict[str, Any]) -> Any:
    if isinstance(value, list):
        return list(rebuilt.values())
    if isinstance(value, tuple):
        return tuple(rebuilt.values())
    if isinstance(value, dict):
        return {key: rebuilt[str(key)] for key in value}
    module = object.__new__(type(value))
    for name, item in vars(value).items():
        object.__setattr__(module, name, rebuilt.get(name, item))
    return module


def _load_param(param: Param, record: Any, path: str, loading: _Loading) -> Param:
    param_id = param.id
    if isinstance(record, Mapping) and "param" in record:
        param_id = ParamId.parse(record["id"]) if "id" in record else param_id
        record = record["param"]
    if not isinstance(record, TensorData):
        loading.mismatches.append(f"{path}: the record holds {_describe(record)}, not a tensor")
        return param
    if record.shape != param.shape:
        loading.mismatches.append(
            f"{path}: shape {fmt_shape(record.shape)} in the record, {fmt_shape(param.shape)} in the module"
        )
        return param
    if record.kind is not param.kind:
        loading.mismatches.append(
            f"{path}: dtype {record.dtype.value} ({record.kind.value}) in the record, "
            f"{param.dtype.value} ({param.kind.value}) in the module"
        )
        return param
    device = loading.device if loading.device is not None else param.device
    value = Tensor.from_data(record.convert(param.dtype), device)
    loading.report.loaded.append(path)
    return type(param)(value, param_id, param.require_grad)


def _record_paths(record: Any, path: str) -> list[str]:
    """The tensor paths inside an unexpected record entry (for the report)."""
    if isinstance(record, Mapping) and "param" in record and isinstance(record["param"], TensorData):
        return [path]
    if isinstance(record, Mapping):
        return [p for k, v in record.items() for p in _record_paths(v, _join(path, k))] or [path]
    if isinstance(record, list | tuple):
        return [p for i, v in enumerate(record) for p in _record_paths(v, _join(path, i))] or [path]
    return [] if record is None else [path]


def _describe(record: Any) -> str:
    if isinstance(record, TensorData):
        return f"a tensor of shape {fmt_shape(record.shape)}"
    return f"a {type(record).__name__}"
