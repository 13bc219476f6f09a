"""The metric protocol: what a metric takes, how it keeps state, what it reports.

A metric declares the *input* it needs (``input_type``, a small class of its own, such
as :class:`~ember.train.metric.loss.LossInput`) and is updated once per iteration with
that input and a :class:`MetricMetadata`. The learner gets the input from the step's
output through the adaptor table: ``adapt(output, input_type)`` runs the rule that
``@adaptor(OutputType, InputType)`` registered (an output class registers one rule per
metric input it can feed), so adding a metric never touches the outputs' classes.

``update`` returns a :class:`MetricEntry`: the name, the text a renderer shows, and
the serialized value a logger writes. A metric that is a number also implements
:class:`Numeric` (``value()``), which makes it plottable. Numeric metrics usually keep a
:class:`NumericMetricState`, a running mean over the epoch weighted by batch sizes.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class SquareInput:
    ...     value: float
    >>> class Square(Numeric, Metric):
    ...     name = "Square"
    ...     input_type = SquareInput
    ...     def __init__(self):
    ...         self.state = NumericMetricState()
    ...     def update(self, item, metadata):
    ...         return self.state.update(item.value ** 2, 1, self.name, precision=1)
    ...     def clear(self):
    ...         self.state.reset()
    ...     def value(self):
    ...         return self.state.value()
    >>> metric = Square()
    >>> metadata = MetricMetadata(Progress(1, 2), epoch=1, epoch_total=1, iteration=1)
    >>> metric.update(SquareInput(3.0), metadata).formatted
    'epoch 9.0 - batch 9.0'
    >>> metric.update(SquareInput(1.0), metadata).formatted, metric.value()
    ('epoch 5.0 - batch 1.0', 5.0)
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ember.backend.errors import ArgumentError


@dataclass(frozen=True)
class Progress:
    """How far an epoch is: ``items_processed`` of ``items_total`` (items, not batches)."""

    items_processed: int
    items_total: int


@dataclass(frozen=True)
class MetricMetadata:
    """What a metric may want to know about the iteration it is updated for.

    Args:
        progress: the items of the epoch processed so far, this batch included.
        epoch: the epoch, from 1.
        epoch_total: the number of epochs of the run.
        iteration: the iteration within the epoch, from 1.
        lr: the learning rate of this iteration's optimizer step (None in validation).
    """

    progress: Progress
    epoch: int
    epoch_total: int
    iteration: int
    lr: float | None = None


@dataclass(frozen=True)
class MetricEntry:
    """One update's report.

    Args:
        name: the metric's name; loggers name their files after it (``Loss.log``).
        formatted: what a renderer shows, e.g. ``"epoch 0.52 - batch 0.48"``.
        serialized: what a logger writes, one line per update (a number for numeric metrics).
    """

    name: str
    formatted: str
    serialized: str


class Metric(abc.ABC):
    """A metric: updated with its input once per iteration, cleared at each epoch's end.

    Subclasses set ``name`` and ``input_type`` and implement :meth:`update` and
    :meth:`clear`. A metric that needs no input (CPU usage, the learning rate) sets
    ``input_type = None`` and receives ``None``.
    """

    name: str  # a class attribute, or set per instance (``TopKAccuracy@5``)
    input_type: ClassVar[type | None]

    @abc.abstractmethod
    def update(self, item: Any, metadata: MetricMetadata) -> MetricEntry:
        """Updates the state with one iteration's input; returns the current entry."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Forgets the state (the learner calls it at the end of every epoch)."""


class Numeric(abc.ABC):
    """A metric whose state is a number: renderers plot it, checkpointers rank by it."""

    @abc.abstractmethod
    def value(self) -> float:
        """The current value: over the epoch so far for running metrics."""

    #: Whether a smaller value is better (the loss) or a larger one (the accuracy);
    #: early stopping and best-checkpoint selection read it.
    lower_is_better: ClassVar[bool] = False


def format_entry(name: str, epoch: float, batch: float, precision: int = 2,
                 unit: str = "") -> MetricEntry:  # fmt: skip
    """The entry of a numeric metric: both values shown, the batch's serialized."""
    formatted = f"epoch {epoch:.{precision}f}{unit} - batch {batch:.{precision}f}{unit}"
    return MetricEntry(name, formatted, repr(float(batch)))


class NumericMetricState:
    """A running mean over an epoch, weighted by batch size, with the last batch's value.

    ``update(value, batch_size, name, precision)`` returns the entry that shows both
    (``"epoch 0.52 - batch 0.48"``) and serializes the batch's value. A batch whose
    value is undefined (NaN: only padding, a single class for the AUROC) or that weighs
    nothing is reported as NaN and left out of the mean.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sum = 0.0
        self._count = 0

    def update(self, value: float, batch_size: int, name: str, precision: int = 2,
               unit: str = "") -> MetricEntry:  # fmt: skip
        value = float(value)
        if batch_size > 0 and not math.isnan(value):
            self._sum += value * batch_size
            self._count += batch_size
        return format_entry(name, self.value(), value, precision, unit)

    def value(self) -> float:
        """The mean over the epoch so far (NaN before the first counted update)."""
        return self._sum / self._count if self._count else float("nan")


class MeanMetric(Numeric, Metric):
    """A numeric metric whose value is the running mean of its batches over the epoch.

    Subclasses call ``super().__init__()`` and report each batch through
    ``self.state.update(value, batch_size, self.name, ...)``; clearing and the value
    come from the :class:`NumericMetricState`.
    """

    def __init__(self) -> None:
        self.state = NumericMetricState()

    def clear(self) -> None:
        self.state.reset()

    def value(self) -> float:
        return self.state.value()


# ---------------------------------------------------------------------- adaptors
Adaptor = Callable[[Any], Any]
_ADAPTORS: dict[tuple[type, type], Adaptor] = {}


def adaptor(output_type: type, input_type: type) -> Callable[[Adaptor], Adaptor]:
    """Registers how an output of ``output_type`` becomes a metric input of ``input_type``."""

    def register(rule: Adaptor) -> Adaptor:
        _ADAPTORS[(output_type, input_type)] = rule
        return rule

    return register


def adapt(output: Any, input_type: type | None) -> Any:
    """The metric input of ``input_type`` made from a step's ``output``.

    Raises:
        ArgumentError: no rule turns this output into that input.
    """
    if input_type is None:
        return None
    if isinstance(output, input_type):
        return output
    for cls in type(output).__mro__:
        rule = _ADAPTORS.get((cls, input_type))
        if rule is not None:
            return rule(output)
    known = sorted(i.__name__ for o, i in _ADAPTORS if isinstance(output, o))
    raise ArgumentError(
        f"no adaptor turns a {type(output).__name__} into a {input_type.__name__} "
        f"(it adapts to: {', '.join(known) or 'nothing'}); register one with "
        f"@adaptor({type(output).__name__}, {input_type.__name__})"
    )
