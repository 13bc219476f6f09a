"""Optimizers as module mappers: ``model = optimizer.step(lr, model, grads)``.

An :class:`Optimizer` never mutates a module. ``step`` returns a new module
whose trainable parameters are updated; each keeps its
:class:`~ember.module.ParamId` and, on an autodiff device, is a fresh graph
leaf, so the next forward pass starts a new graph. The update math runs on the
inner (non-autodiff) device: no graph grows across steps.

Most optimizers are written as a :class:`SimpleOptimizer`, the update rule of
one tensor with its state (moments, velocities, step counts), and wrapped in
an :class:`OptimizerAdaptor`, which walks the module, pairs each parameter with
its gradient, clips the gradient and keeps the state of every parameter by id.

The state is plain record data (:meth:`Optimizer.to_record`): a dict keyed by
the parameter id's string, one dict of named values per parameter (TensorData
for tensors, ints for counts), so every ember recorder saves it::

    {"3f2a...": {"time": 12, "moment_1": TensorData, "moment_2": TensorData}, ...}

:meth:`Optimizer.load_record` takes it back, from any recorder and precision:
tensors move to each parameter's device and dtype at its next step.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, TypeVar

from ember.backend import effects
from ember.backend.errors import ArgumentError, RecordMismatchError, fmt_shape
from ember.backends.autodiff.graph import Gradients
from ember.module import Module, Param, ParamId
from ember.optim.clipping import GradientClippingConfig
from ember.optim.grads import GradientsParams, check_grad_shape
from ember.tensor import Tensor, TensorData

M = TypeVar("M", bound=Module)
# One parameter's optimizer state: tensors on the parameter's inner device, and counts.
# Entries loaded from a record hold TensorData until the parameter's next step.
State = dict[str, Any]


class Optimizer(ABC):
    """The optimizer interface: a step that maps a module, and its state as a record."""

    @abstractmethod
    def step(self, lr: float, module: M, grads: GradientsParams | Gradients) -> M:
        """The module after one update with learning rate ``lr`` and gradients ``grads``."""

    @abstractmethod
    def to_record(self) -> dict[str, Any]:
        """The optimizer's state as plain record data."""

    @abstractmethod
    def load_record(self, record: Any) -> Optimizer:
        """Replaces the state with ``record`` (what :meth:`to_record` gave); returns self."""


class SimpleOptimizer(ABC):
    """The update rule of one parameter tensor, which :class:`OptimizerAdaptor` applies to
    every trainable parameter of a module."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @abstractmethod
    def state_fields(self) -> dict[str, type]:
        """The names in this rule's per-parameter state and their types (Tensor or int)."""

    @abstractmethod
    def step(
        self, lr: float, tensor: Tensor, grad: Tensor, state: State | None
    ) -> tuple[Tensor, State | None]:
        """One update of ``tensor``.

        Args:
            lr: the learning rate.
            tensor: the parameter's value, on its inner device.
            grad: its gradient (already clipped), same device, shape and dtype.
            state: the state of the last step (Tensor entries of ``tensor``'s shape,
                device and dtype), or None on the first step.

        Returns:
            the new value and the new state (None for a rule without state). The
            ``state`` passed in must not be changed: a failed step keeps the old one.
        """


class OptimizerAdaptor(Optimizer):
    """A :class:`SimpleOptimizer` applied to every trainable parameter of a module.

    Built by the optimizer configs' ``init()`` (e.g. ``AdamConfig().init()``).

    Args:
        optimizer: the per-tensor update rule.
        gradient_clipping: how to clip each gradient before the rule sees it; None for
            no clipping.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.linear import LinearConfig
        >>> from ember.optim.sgd import SgdConfig
        >>> device = ember.device("ndarray").autodiff()
        >>> model = LinearConfig(2, 1).init(device)
        >>> bias = model.bias.val().item()
        >>> grads = model(Tensor.ones([1, 2], device)).sum().backward()
        >>> updated = SgdConfig().init().step(0.5, model, grads)  # bias gradient: 1
        >>> round(updated.bias.val().item() - bias, 6), updated.bias.id == model.bias.id
        (-0.5, True)
    """

    def __init__(
        self, optimizer: SimpleOptimizer, gradient_clipping: GradientClippingConfig | None = None
    ) -> None:
        if not isinstance(optimizer, SimpleOptimizer):
            raise ArgumentError(
                f"OptimizerAdaptor: expected a SimpleOptimizer, got {type(optimizer).__name__}"
            )
        if gradient_clipping is not None and not isinstance(
            gradient_clipping, GradientClippingConfig
        ):
            raise ArgumentError(
                "OptimizerAdaptor: gradient_clipping must be a GradientClippingConfig or None, "
                f"got {type(gradient_clipping).__name__}"
            )
        self.optimizer = optimizer
        self.gradient_clipping = gradient_clipping
        self._states: dict[ParamId, State] = {}

    def step(self, lr: float, module: M, grads: GradientsParams | Gradients) -> M:
        """The module with every trainable parameter that has a gradient updated.

        Parameters without ``require_grad`` or without a gradient in ``grads`` are kept
        as they are (and keep their state).

        Args:
            lr: the learning rate, a number >= 0.
            module: the module the gradients were computed for.
            grads: a :class:`~ember.optim.grads.GradientsParams`, or the Gradients of
                ``loss.backward()`` (converted with ``GradientsParams.from_grads``).

        Raises:
            ArgumentError: a bad ``lr``, ``module`` or ``grads``.
            ShapeError: a gradient whose shape is not its parameter's.
            RecordMismatchError: loaded state that does not fit its parameter.
        """
        effects.note("steps an optimizer, whose state changes in place")
        owner = f"{self.optimizer.name}.step"
        lr = _checked_lr(owner, lr)
        if not isinstance(module, Module):
            raise ArgumentError(f"{owner}: expected a Module, got {type(module).__name__}")
        if isinstance(grads, Gradients):
            grads = GradientsParams.from_grads(grads, module)
        elif not isinstance(grads, GradientsParams):
            raise ArgumentError(
                f"{owner}: expected GradientsParams or the Gradients of backward(), "
                f"got {type(grads).__name__}"
            )
        new_states: dict[ParamId, State | None] = {}

        def update(path: str, param: Param) -> Param:
            grad = grads.get(param.id) if param.require_grad else None
            if grad is None:
                return param
            value = param.val()
            inner = value.inner()
            check_grad_shape(owner, path, grad, param.shape)
            grad = grad.to_device(inner.device).cast(inner.dtype)
            if self.gradient_clipping is not None:
                grad = self.gradient_clipping.clip(grad)
            state = self._state_for(param.id, path, inner)
            updated, state = self.optimizer.step(lr, inner, grad, state)
            new_states[param.id] = state
            if value.device != inner.device:  # an autodiff device: the result is a new leaf
                updated = Tensor.from_inner(updated, value.device)
            return param.with_value(updated)

        result = module.map(update)
        # Committed only once every parameter stepped, so a failed step changes nothing.
        for param_id, state in new_states.items():
            if state is None:
                self._states.pop(param_id, None)
            else:
                self._states[param_id] = state
        return result

    def _state_for(self, param_id: ParamId, path: str, inner: Tensor) -> State | None:
        """The parameter's state with its tensors on ``inner``'s device and dtype."""
        state = self._states.get(param_id)
        if state is None:
            return None
        ready: State = {}
        for name, value in state.items():
            if isinstance(value, TensorData | Tensor):
                if value.shape != inner.shape:
                    raise RecordMismatchError(
                        f"{self.optimizer.name}.step: the state of parameter {path} "
                        f"(id {param_id}) holds {name} of shape {fmt_shape(value.shape)}, "
                        f"the parameter has shape {fmt_shape(inner.shape)}",
                        path=path,
                    )
                if isinstance(value, TensorData):
                    value = Tensor.from_data(value.convert(inner.dtype), inner.device)
                else:
                    value = value.to_device(inner.device).cast(inner.dtype)
            ready[name] = value
        return ready

    # ------------------------------------------------------------------ records
    def to_record(self) -> dict[str, Any]:
        """The state of every parameter stepped so far, keyed by the id's string.

        Example:
            >>> import ember
            >>> from ember import Tensor
            >>> from ember.nn.linear import LinearConfig
            >>> from ember.optim.adam import AdamConfig
            >>> device = ember.device("ndarray").autodiff()
            >>> model = LinearConfig(2, 1).init(device)
            >>> optimizer = AdamConfig().init()
            >>> grads = model(Tensor.ones([1, 2], device)).sum().backward()
            >>> model = optimizer.step(0.1, model, grads)
            >>> record = optimizer.to_record()
            >>> sorted(record[str(model.bias.id)]), record[str(model.bias.id)]["time"]
            (['moment_1', 'moment_2', 'time'], 1)
        """
        return {
            str(param_id): {
                name: value.into_data() if isinstance(value, Tensor) else value
                for name, value in state.items()
            }
            for param_id, state in self._states.items()
        }

    def load_record(self, record: Any) -> OptimizerAdaptor:
        """Replaces the state with ``record`` and returns the optimizer.

        The record may come from any recorder at any precision; each tensor moves to
        its parameter's device and dtype at that parameter's next step.

        Raises:
            RecordMismatchError: ``record`` is not a dict keyed by parameter ids, or an
                entry lacks a field of this optimizer's state, has one it does not
                know, or holds a value of the wrong type; the message names every
                offending key. The state is unchanged then.
        """
        owner = f"{self.optimizer.name}.load_record"
        if not isinstance(record, Mapping):
            raise RecordMismatchError(
                f"{owner}: expected a dict keyed by parameter id (what to_record() gives), "
                f"got {_describe(record)}"
            )
        fields = self.optimizer.state_fields()
        problems: list[tuple[str, str]] = []  # (record path, what is wrong there)
        states: dict[ParamId, State] = {}
        for key, entry in record.items():
            try:
                param_id = ParamId.parse(key) if isinstance(key, str) else None
            except ArgumentError:
                param_id = None
            if param_id is None:
                problems.append((str(key), f"not a parameter id (16 hex digits): {key!r}"))
                continue
            state = _checked_entry(key, entry, fields, self.optimizer.name, problems)
            if state is not None:
                states[param_id] = state
        if problems:
            shown = "\n  ".join(f"{path}: {message}" for path, message in problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise RecordMismatchError(
                f"{owner}: the record does not fit the {self.optimizer.name} state:\n"
                f"  {shown}{more}",
                path=problems[0][0],
            )
        self._states = states
        return self

    def __repr__(self) -> str:
        clipping = "" if self.gradient_clipping is None else f", {self.gradient_clipping!r}"
        return f"OptimizerAdaptor({self.optimizer!r}{clipping}, {len(self._states)} states)"


def _checked_entry(key: str, entry: Any, fields: dict[str, type], name: str,
                   problems: list[tuple[str, str]]) -> State | None:  # fmt: skip
    """One parameter's record entry, checked against ``fields``; None if it is not a dict.

    Each problem found is appended to ``problems`` as ``(record path, message)``.
    """
    if not isinstance(entry, Mapping):
        problems.append((key, f"expected a dict of {', '.join(fields)}, got {_describe(entry)}"))
        return None
    for field in entry:
        if field not in fields:
            holds = ", ".join(fields) or "nothing"
            problems.append(
                (f"{key}.{field}", f"not part of the {name} state (which holds {holds})")
            )
    shape = None
    for field, kind in fields.items():
        where = f"{key}.{field}"
        if field not in entry:
            problems.append((where, "missing from the record"))
            continue
        value = entry[field]
        if kind is int:
            if type(value) is not int or value < 0:
                problems.append((where, f"expected a count (an int >= 0), got {value!r:.40}"))
        elif not isinstance(value, TensorData) or not value.dtype.is_float:
            problems.append((where, f"expected a Float tensor, got {_describe(value)}"))
        elif shape is not None and value.shape != shape:
            problems.append((where, f"shape {fmt_shape(value.shape)}, while the entry's other "
                                    f"tensors have shape {fmt_shape(shape)}"))  # fmt: skip
        else:
            shape = value.shape
    return {field: entry[field] for field in fields if field in entry}


def _checked_lr(owner: str, lr: Any) -> float:
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(lr) or lr < 0:
        raise ArgumentError(f"{owner}: lr must be a finite number >= 0, got {lr!r:.40}")
    return float(lr)


def _describe(value: Any) -> str:
    if isinstance(value, TensorData):
        return f"a {value.dtype.value} tensor of shape {fmt_shape(value.shape)}"
    return f"a {type(value).__name__}"
