"""Experiment trackers: the tools people already use (TensorBoard, MLflow) fed by the learner.

A :class:`~ember.train.logger.MetricLogger` keeps one split's entries, epoch by epoch,
in ember's own files. An :class:`ExperimentTracker` is the metric logger of a whole
*run* for an outside tool: it sees both splits, every numeric metric at every step
(the global step, numbered the same when a run is resumed), each epoch's value, the
run's parameters, and the final model. The learner calls it in this order::

    start(run)                         once, when fit starts
    log_step(split, values, step)      after every iteration (numeric batch values)
    log_epoch(split, values, epoch)    when a split's epoch is complete (epoch values)
    finish(model, status)              once, when fit ends (model None if it failed)

Only rank 0 of a data-parallel job calls its trackers (the other ranks write nothing).
Several trackers run side by side: ``LearnerBuilder.tracker`` may be called again.
Each tracker lives behind an extra (``pip install 'ember[tensorboard]'``, ``'ember[mlflow]'``);
without it, building the tracker raises :class:`MissingExtraError` naming the extra.
"""

from __future__ import annotations

import abc
import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from ember.backend.errors import ArgumentError, EmberError

if TYPE_CHECKING:
    from ember.module import Module
    from ember.train.renderer.base import Split

#: How a run ended: it ran all its epochs (or stopped early), it was interrupted
#: (Ctrl-C, the interrupter), or an error ended it.
RunStatus = Literal["FINISHED", "KILLED", "FAILED"]

ParamValue = str | int | float | bool | None


class MissingExtraError(EmberError, ImportError):
    """A feature's optional dependency is missing; the message names the extra to install.

    Attributes:
        extra: the name of ember's extra that installs it (``tensorboard``, ``mlflow``).
        package: the module that could not be imported.
    """

    def __init__(self, feature: str, extra: str, package: str) -> None:
        super().__init__(
            f"{feature} needs the {package!r} package, which is not installed; install "
            f"ember's {extra!r} extra: pip install 'ember[{extra}]'"
        )
        self.extra = extra
        self.package = package


def require(feature: str, extra: str, package: str) -> ModuleType:
    """Imports ``package``, or raises :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise MissingExtraError(feature, extra, package) from error


@dataclass(frozen=True)
class RunInfo:
    """What a tracker is told when a run starts.

    Args:
        artifact_dir: the learner's artifact directory (trackers may write under it).
        model_name: the model's class name.
        params: the run's parameters, flattened to dotted keys: the learner's options
            (``learner.num_epochs``, ...) and those given to ``LearnerBuilder.params``.
        start_epoch: the first epoch this fit trains (above 1 when resuming).
        num_epochs: the last epoch.
        first_steps: per split, the step of the first iteration this fit logs (above 1
            when resuming: a tracker may drop what an interrupted run logged from there).
    """

    artifact_dir: Path
    model_name: str
    params: Mapping[str, ParamValue] = field(default_factory=dict)
    start_epoch: int = 1
    num_epochs: int = 1
    first_steps: Mapping[str, int] = field(default_factory=dict)


class ExperimentTracker(abc.ABC):
    """The metric logger of a whole run for an outside tool (see the module docstring)."""

    @abc.abstractmethod
    def start(self, run: RunInfo) -> None:
        """A fit starts: open the run and record its parameters."""

    @abc.abstractmethod
    def log_step(self, split: Split, values: Mapping[str, float], step: int) -> None:
        """The numeric metrics of one iteration of ``split`` (its batch values).

        ``step`` counts the split's iterations over the whole run from 1:
        ``(epoch - 1) * iterations_per_epoch + iteration``.
        """

    @abc.abstractmethod
    def log_epoch(self, split: Split, values: Mapping[str, float], epoch: int) -> None:
        """The epoch values of ``split``'s numeric metrics (what the summary shows)."""

    @abc.abstractmethod
    def finish(self, model: Module | None, status: RunStatus) -> None:
        """The fit ended with ``status``; ``model`` is the final one (None if it failed)."""


def flatten_params(params: Any, prefix: str = "") -> dict[str, ParamValue]:
    """A config or nested mapping as flat ``{"a.b": value}`` parameters.

    A :class:`~ember.config.Config` is read through ``to_dict()``; lists and tuples are
    kept as their text, since trackers record parameters as scalars.

    Example:
        >>> flatten_params({"model": {"hidden": 64, "dropout": 0.5}, "seed": 1, "dims": [2, 3]})
        {'model.hidden': 64, 'model.dropout': 0.5, 'seed': 1, 'dims': '[2, 3]'}
    """
    if hasattr(params, "to_dict") and callable(params.to_dict):
        params = params.to_dict()
    if not isinstance(params, Mapping):
        raise ArgumentError(
            f"run parameters must be a Config or a mapping, got {type(params).__name__}"
        )
    flat: dict[str, ParamValue] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or hasattr(value, "to_dict"):
            flat.update(flatten_params(value, name + "."))
        elif value is None or isinstance(value, str | int | float | bool):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def finite(values: Mapping[str, float]) -> dict[str, float]:
    """The values that are numbers (a metric is NaN before its first counted batch)."""
    return {name: value for name, value in values.items() if math.isfinite(value)}
