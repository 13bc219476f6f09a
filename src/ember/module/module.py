"""Module: a typed container of parameters, sub-modules and configuration.

A module is a class whose fields are declared with type annotations, as in a
dataclass (the ``__init__`` is generated unless the class writes its own).
What a field holds decides its role, so no registration is needed:

* :class:`Param` (and :class:`RunningState`): saved state; parameters learn.
* :class:`Module`: a sub-module; lists, tuples and dicts of modules or params
  are containers whose items are addressed by index or key.
* :class:`~ember.Tensor`: a constant, moved with the module, never saved.
* anything else (numbers, strings, configs): configuration, kept as is.

Fields whose names start with ``_`` are private and take no part.

Modules are values: every method that changes something (``map``, ``fork``,
``to_device``, ``no_grad``, ``valid``, ``load_record``) returns a new module
and leaves the original as it was. Optimizers are module mappers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, dataclass_transform

from ember.backend.device import Device
from ember.backend.errors import fmt_shape
from ember.module.param import Param, RunningState
from ember.tensor import Tensor

if TYPE_CHECKING:
    from ember.module.record import LoadReport
    from ember.record.recorder import FileRecorder

M = TypeVar("M", bound="Module")
ParamFn = Callable[[str, Param], Param]
TensorFn = Callable[[str, Tensor], Tensor]


# Tells type checkers that subclasses are dataclasses (PEP 681), as __init_subclass__ makes them.
@dataclass_transform(eq_default=False)
class Module:
    """Base class of every model and layer.

    Subclasses declare their fields with annotations and write ``forward``;
    calling a module calls its ``forward``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.module import Module, Param
        >>> class Affine(Module):
        ...     scale: Param
        ...     shift: Param
        ...     def forward(self, x: Tensor) -> Tensor:
        ...         return x * self.scale.val() + self.shift.val()
        >>> device = ember.device("ndarray")
        >>> m = Affine(Param(Tensor.full([3], 2.0, device)), Param(Tensor.zeros([3], device)))
        >>> m(Tensor.ones([3], device)).tolist(), m.num_params()
        ([2.0, 2.0, 2.0], 6)
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Fields become __init__ arguments; identity equality, and our own repr.
        dataclasses.dataclass(cls, eq=False, repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    # ------------------------------------------------------------------ traversal
    def fields(self) -> Iterator[tuple[str, Any]]:
        """The public fields in declaration order, as ``(name, value)``."""
        for name, value in vars(self).items():
            if not name.startswith("_"):
                yield name, value

    def params(self) -> Iterator[tuple[str, Param]]:
        """Every parameter (and running state) with its path, e.g. ``("layers.0.weight", p)``."""
        yield from _params_in(self, "")

    def visit(self, visitor: Callable[[str, Param], None]) -> None:
        """Calls ``visitor(path, param)`` for every parameter, in field order."""
        for path, param in self.params():
            visitor(path, param)

    def map(self: M, mapper: ParamFn) -> M:
        """A new module whose parameters are ``mapper(path, param)``.

        The mapper may return a :class:`Param` or a Tensor (which keeps the
        parameter's id and ``require_grad``). Constants and configuration are kept.

        Example:
            >>> import ember
            >>> from ember import Tensor
            >>> from ember.module import Module, Param
            >>> class Scale(Module):
            ...     w: Param
            >>> m = Scale(Param(Tensor.ones([2], ember.device("ndarray"))))
            >>> m.map(lambda path, p: p.val() * 3).w.val().tolist()
            [3.0, 3.0]
        """

        def on_param(path: str, param: Param) -> Param:
            result = mapper(path, param)
            if result is param and isinstance(param, RunningState):
                # running states change in place: the new module gets its own
                return param.with_value(param.val())
            return result if isinstance(result, Param) else param.with_value(result)

        return _rebuild(self, "", on_param, None)

    def _map_tensors(self: M, on_param: ParamFn, on_tensor: TensorFn) -> M:
        return _rebuild(self, "", on_param, on_tensor)

    # ------------------------------------------------------------------ devices and grads
    def devices(self) -> list[Device]:
        """The devices the module's parameters and constants are on (each once)."""
        found: list[Device] = []
        for _, tensor in _tensors_in(self, ""):
            if tensor.device not in found:
                found.append(tensor.device)
        return found

    def to_device(self: M, device: Device) -> M:
        """The module on ``device``. On an autodiff device the move stays in the graph."""
        return self._map_tensors(
            lambda _, p: p.to_device(device), lambda _, t: t.to_device(device)
        )

    def fork(self: M, device: Device) -> M:
        """The module on ``device`` with fresh graph leaves: like ``to(device).detach()``."""
        return self._map_tensors(
            lambda _, p: p.with_value(p.val().detach().to_device(device)),
            lambda _, t: t.detach().to_device(device),
        )

    def no_grad(self: M) -> M:
        """The module with every parameter frozen (``require_grad=False``, detached)."""
        return self.map(lambda _, p: p.set_require_grad(False))

    def valid(self: M) -> M:
        """The same module on the inner (non-autodiff) backend, for validation and inference."""
        return self._map_tensors(lambda _, p: p.with_value(p.val().inner()), lambda _, t: t.inner())

    def num_params(self) -> int:
        """The number of elements in all parameters (running states included)."""
        return sum(param.num_elements() for _, param in self.params())

    # ------------------------------------------------------------------ records
    def quantize(self: M, config, calibration=None, forward=None) -> M:
        """This model with its layers quantized (weight-only, or with ``config.activations``
        static, calibrated on ``calibration``): see
        :func:`ember.quantization.quantize_module` and ``QuantizeConfig``."""
        from ember.quantization import quantize_module

        return quantize_module(self, config, calibration, forward)

    def into_record(self) -> dict[str, Any]:
        """The module's state as plain data: ``{field: {"id": ..., "param": TensorData}}``."""
        from ember.module.record import into_record

        return into_record(self)

    def load_record(self: M, record: Any, *, strict: bool = True, device: Device | None = None) -> M:
        """A new module with the parameters of ``record`` (from ``into_record`` or an importer).

        Args:
            record: a record tree, or an ``ImportedRecord`` from a weight importer.
            strict: with True (the default) a missing or unexpected key is an error;
                with False they are skipped (see :meth:`load_record_partial` for a report).
            device: where the loaded tensors go; each parameter's current device if None.

        Raises:
            RecordMismatchError: a missing or unexpected key (strict mode), a shape or
                kind mismatch; the message names every offending parameter path.
        """
        from ember.module.record import load_record

        return load_record(self, record, strict=strict, device=device)[0]

    def load_record_partial(self: M, record: Any, *, device: Device | None = None) -> tuple[M, LoadReport]:
        """Loads what fits and reports the rest: ``(module, report)``.

        ``report.loaded``, ``report.missing`` (kept as initialized) and
        ``report.unexpected`` (in the record, not in the module) list parameter paths.
        A shape or kind mismatch is still an error.
        """
        from ember.module.record import load_record

        return load_record(self, record, strict=False, device=device)

    def save_file(self, path: str | Path, recorder: FileRecorder | None = None) -> Path:
        """Saves the record with ``recorder`` (NamedMpk at full precision by default).

        The recorder adds its file extension; returns the path written.
        """
        from ember.record import DefaultRecorder

        recorder = recorder if recorder is not None else DefaultRecorder()
        return recorder.save(self.into_record(), path)

    def load_file(
        self: M,
        path: str | Path,
        recorder: FileRecorder | None = None,
        device: Device | None = None,
        *,
        strict: bool = True,
    ) -> M:
        """A new module with the weights of the file ``save_file`` wrote with ``recorder``."""
        from ember.record import DefaultRecorder

        recorder = recorder if recorder is not None else DefaultRecorder()
        return self.load_record(recorder.load(path), strict=strict, device=device)

    # ------------------------------------------------------------------ printing
    def __repr__(self) -> str:
        return _format(self, 0)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the field tree, folded, with parameter shapes and counts."""
        from ember.notebook_display import module_html

        return module_html(self)


# ---------------------------------------------------------------------- the one traversal
def _join(path: str, name: str | int) -> str:
    return f"{path}.{name}" if path else str(name)


def _items(value: Any) -> Iterator[tuple[str | int, Any]] | None:
    """The addressable items of a module or container; None for a leaf."""
    if isinstance(value, Module):
        return value.fields()
    if isinstance(value, list | tuple):
        return enumerate(value)
    if isinstance(value, dict):
        return iter(value.items())
    return None


def _params_in(value: Any, path: str) -> Iterator[tuple[str, Param]]:
    if isinstance(value, Param):
        yield path, value
        return
    items = _items(value)
    if items is not None:
        for name, item in items:
            yield from _params_in(item, _join(path, name))


def _tensors_in(value: Any, path: str) -> Iterator[tuple[str, Tensor]]:
    if isinstance(value, Param):
        yield path, value.val()
    elif isinstance(value, Tensor):
        yield path, value
    else:
        items = _items(value)
        if items is not None:
            for name, item in items:
                yield from _tensors_in(item, _join(path, name))


def _rebuild(value: Any, path: str, on_param: ParamFn, on_tensor: TensorFn | None,
             on_module: Callable[[str, Module], Module | None] | None = None) -> Any:  # fmt: skip
    """``value`` with every Param (and, given ``on_tensor``, every constant) replaced; given
    ``on_module``, a sub-module for which it returns a module is replaced by that one (and
    not entered)."""
    if on_module is not None and isinstance(value, Module):
        replaced = on_module(path, value)
        if replaced is not None:
            return replaced
    if isinstance(value, Param):
        return on_param(path, value)
    if isinstance(value, Tensor):
        return on_tensor(path, value) if on_tensor is not None else value
    if isinstance(value, Module):
        module = object.__new__(type(value))
        for name, item in vars(value).items():
            new = item if name.startswith("_") else _rebuild(item, _join(path, name), on_param,
                                                             on_tensor, on_module)  # fmt: skip
            object.__setattr__(module, name, new)
        return module
    if isinstance(value, list):
        return [_rebuild(v, _join(path, i), on_param, on_tensor, on_module) for i, v in enumerate(value)]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_rebuild(v, _join(path, i), on_param, on_tensor, on_module)
                     for i, v in enumerate(value))  # fmt: skip
    if isinstance(value, dict):
        return {k: _rebuild(v, _join(path, k), on_param, on_tensor, on_module)
                for k, v in value.items()}  # fmt: skip
    return value


# ---------------------------------------------------------------------- repr
def _holds_state(value: Any) -> bool:
    return any(True for _ in _tensors_in(value, ""))


def _format(value: Any, depth: int) -> str:
    """A module as an indented tree: leaves on one line with shapes and parameter counts."""
    if isinstance(value, Param):
        return fmt_shape(value.shape)
    if isinstance(value, Tensor):
        return f"Tensor{fmt_shape(value.shape)}"
    if isinstance(value, Module):
        entries = [(name, _format(item, depth + 1)) for name, item in value.fields()]
        entries.append(("params", str(value.num_params())))
        head = type(value).__name__
    elif isinstance(value, list | tuple | dict) and _holds_state(value):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        entries = [(str(k), _format(item, depth + 1)) for k, item in items]
        head = type(value).__name__
    else:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    one_line = f"{head} {{" + ", ".join(f"{k}: {v}" for k, v in entries) + "}"
    if "\n" not in one_line and len(one_line) + 2 * depth <= 100:
        return one_line
    pad = "  " * (depth + 1)
    body = "".join(f"{pad}{k}: {v}\n" for k, v in entries)
    return f"{head} {{\n{body}{'  ' * depth}}}"
