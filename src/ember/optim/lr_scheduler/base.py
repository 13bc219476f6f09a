"""The learning-rate scheduler protocol, the family of scheduler configs, and shared checks."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

from pydantic import Field

from ember.backend.errors import ArgumentError, ConfigError, RecordError, RecordMismatchError
from ember.config import Variant

LearningRate = float

S = TypeVar("S", bound="LrScheduler")
C = TypeVar("C", bound="StepCounter")

# Field types of the configs. Burn keeps the learning rates of the linear, exponential and
# cosine schedulers in (0, 1]; the others only need to be finite numbers.
InitialLr = Annotated[float, Field(gt=0, le=1)]
FinalLr = Annotated[float, Field(ge=0, le=1)]
DecayFactor = Annotated[float, Field(gt=0, le=1)]


class LrScheduler(abc.ABC):
    """A schedule of learning rates: each :meth:`step` gives the rate of the next iteration.

    The first call of :meth:`step` returns the rate of the first optimizer step (iteration 0),
    the second call that of iteration 1, and so on. A scheduler is stateful: :meth:`step`
    advances it. Its state is plain data (:meth:`to_record`) that any recorder saves, and
    :meth:`load_record` returns a scheduler that continues from a saved state.

    Write a new schedule by subclassing and implementing the three methods (or subclass
    :class:`StepCounter`, which keeps the count of steps for you).
    """

    @abc.abstractmethod
    def step(self) -> LearningRate:
        """Advances the schedule and returns the learning rate of the next iteration."""

    @abc.abstractmethod
    def to_record(self) -> Any:
        """The scheduler's state as plain data (ints, floats, lists, dicts, ``None``)."""

    @abc.abstractmethod
    def load_record(self: S, record: Any) -> S:
        """This scheduler with the state ``record`` (from :meth:`to_record`).

        Returns a new scheduler and leaves this one as it was, as ``Module.load_record``
        does: write ``scheduler = scheduler.load_record(record)``.

        Raises:
            RecordMismatchError: ``record`` is not a state of this kind of scheduler.
        """


class StepCounter(LrScheduler):
    """A scheduler whose rate is a function of the number of steps taken (its whole state).

    Subclasses are dataclasses that declare their fields (the built-in ones a ``config``)
    followed by ``iteration: int = 0``, and implement :meth:`lr_at`. The record is the
    number of steps taken.

    Example:
        >>> from dataclasses import dataclass
        >>> from ember.optim.lr_scheduler.base import StepCounter
        >>> @dataclass
        ... class Halving(StepCounter):
        ...     lr: float
        ...     iteration: int = 0
        ...     def lr_at(self, iteration: int) -> float:
        ...         return self.lr / 2**iteration
        >>> scheduler = Halving(1.0)
        >>> [scheduler.step() for _ in range(3)], scheduler.to_record()
        ([1.0, 0.5, 0.25], 3)
        >>> scheduler.load_record(1).step()
        0.5
    """

    # Not a dataclass field here: each subclass declares it last, after its own fields.
    iteration: int

    def __post_init__(self) -> None:
        if not is_count(self.iteration):
            raise ArgumentError(
                f"{type(self).__name__}: iteration must be an integer >= 0 (the number of "
                f"steps taken), got {self.iteration!r}"
            )

    @abc.abstractmethod
    def lr_at(self, iteration: int) -> LearningRate:
        """The learning rate of iteration ``iteration`` (0 for the first optimizer step).

        Pure: it reads the schedule without advancing it.
        """

    def step(self) -> LearningRate:
        lr = self.lr_at(self.iteration)
        self.iteration += 1
        return lr

    def to_record(self) -> int:
        """The number of steps taken."""
        return self.iteration

    def load_record(self: C, record: Any) -> C:
        if not is_count(record):
            raise RecordMismatchError(
                f"{type(self).__name__}: expected a record holding the number of steps taken "
                f"(an integer >= 0), got {short_repr(record)}"
            )
        # C is bound to this dataclass, which mypy's replace() signature cannot see.
        return dataclasses.replace(self, iteration=record)  # type: ignore[type-var]


class LrSchedulerConfig(Variant):
    """The configs of the built-in schedulers, as one family of configs.

    A config field typed ``LrSchedulerConfig`` accepts any of them and saves it under
    its class name (``{"LinearLrSchedulerConfig": {...}}``), as the children of
    :class:`~ember.optim.lr_scheduler.composed.ComposedLrSchedulerConfig` and
    :class:`~ember.optim.lr_scheduler.sequential.SequentialLrSchedulerConfig` are saved.
    """

    def init(self) -> LrScheduler:
        """A new scheduler at its first iteration."""
        raise NotImplementedError(f"{type(self).__name__} does not define init()")


def init_children(owner: str, configs: Sequence[LrSchedulerConfig]) -> list[LrScheduler]:
    """The schedulers of ``configs``, with errors located at ``owner.schedulers[i]``."""
    if not configs:
        raise ConfigError(
            f"{owner}.schedulers: expected at least one scheduler config, got none",
            fields=(f"{owner}.schedulers",),
        )
    schedulers = []
    for index, config in enumerate(configs):
        try:
            schedulers.append(config.init())
        except ConfigError as error:
            where = f"{owner}.schedulers[{index}]"
            child = type(config).__name__
            fields = tuple(where + field.removeprefix(child) for field in error.fields)
            raise ConfigError(f"{where}: {error}", fields=fields or (where,)) from None
    return schedulers


def load_children(owner: str, schedulers: Sequence[LrScheduler], records: Any) -> list[LrScheduler]:
    """Each scheduler with its record loaded; errors name the child (``schedulers.1``)."""
    if not isinstance(records, list) or len(records) != len(schedulers):
        raise RecordMismatchError(
            f"{owner}: expected a list of {len(schedulers)} scheduler records under "
            f"'schedulers', got {short_repr(records)}",
            path="schedulers",
        )
    loaded = []
    for index, (scheduler, record) in enumerate(zip(schedulers, records)):
        try:
            loaded.append(scheduler.load_record(record))
        except RecordError as error:
            path = f"schedulers.{index}" + (f".{error.path}" if error.path else "")
            raise RecordMismatchError(f"{owner}.schedulers[{index}]: {error}", path=path) from None
    return loaded


def check_record_keys(owner: str, record: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """``record`` as a dict with exactly ``keys``, or a RecordMismatchError saying what differs."""
    if not isinstance(record, dict):
        raise RecordMismatchError(
            f"{owner}: expected a record dict with keys {list(keys)}, got {short_repr(record)}"
        )
    missing = [key for key in keys if key not in record]
    unexpected = [key for key in record if key not in keys]
    if missing or unexpected:
        raise RecordMismatchError(
            f"{owner}: expected a record dict with keys {list(keys)}, got keys "
            f"{list(record)} (missing {missing}, unexpected {unexpected})",
            path=(missing or unexpected)[0],
        )
    return record


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
