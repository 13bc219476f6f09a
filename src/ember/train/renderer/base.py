"""The renderer protocol: how the learner shows a run, and how a person can stop it.

The learner calls a :class:`MetricsRenderer` from its training thread:

* ``update_train(update)`` / ``update_valid(update)`` once per metric per iteration,
  with the metric's :class:`MetricUpdate` (its entry, and its value when numeric);
* ``render_train(progress)`` / ``render_valid(progress)`` once per iteration, after the
  updates of that iteration;
* ``on_epoch_end(split, epoch)`` when a split's epoch is done;
* ``close()`` once, when the run ends (also on an error or an interruption).

``bind(interrupter)`` comes first: a renderer that takes input (the dashboard's stop
key) asks the learner to stop through the :class:`TrainingInterrupter`; the learner
stops after the current iteration and writes a checkpoint before it returns.
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from typing import Literal

from ember.train.metric.base import MetricEntry, Progress

Split = Literal["train", "valid"]


@dataclass(frozen=True)
class TrainingProgress:
    """Where the run is: the epoch's item progress, the epoch and the iteration."""

    progress: Progress
    epoch: int
    epoch_total: int
    iteration: int


@dataclass(frozen=True)
class MetricUpdate:
    """One metric's report for one iteration: its entry, and ``value()`` if it is numeric."""

    entry: MetricEntry
    value: float | None = None

    @property
    def numeric(self) -> bool:
        return self.value is not None


class TrainingInterrupter:
    """A thread-safe stop request: a renderer (or a signal handler) asks, the learner checks."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def stop(self) -> None:
        self._event.set()

    def should_stop(self) -> bool:
        return self._event.is_set()

    def reset(self) -> None:
        self._event.clear()


class MetricsRenderer(abc.ABC):
    """Shows the metrics and the progress of a run (see the module docstring for the calls)."""

    def bind(self, interrupter: TrainingInterrupter) -> None:  # noqa: B027 (optional hook)
        """Receives the interrupter before the run; renderers without input ignore it."""

    @abc.abstractmethod
    def update_train(self, update: MetricUpdate) -> None: ...

    @abc.abstractmethod
    def update_valid(self, update: MetricUpdate) -> None: ...

    @abc.abstractmethod
    def render_train(self, progress: TrainingProgress) -> None: ...

    @abc.abstractmethod
    def render_valid(self, progress: TrainingProgress) -> None: ...

    def on_epoch_end(self, split: Split, epoch: int) -> None:  # noqa: B027 (optional hook)
        """A split's epoch is done (its metrics are cleared next)."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """The run is over; release the terminal."""
