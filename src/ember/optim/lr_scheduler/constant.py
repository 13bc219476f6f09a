"""ConstantLr: the same learning rate at every step, and ``as_scheduler`` for plain floats."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from ember.backend.errors import ArgumentError, RecordMismatchError
from ember.config.fields import FiniteFloat
from ember.optim.lr_scheduler.base import (
    LearningRate,
    LrScheduler,
    LrSchedulerConfig,
    short_repr,
)


class ConstantLrConfig(LrSchedulerConfig):
    """Configuration of a :class:`ConstantLr`, for a constant phase inside a composition.

    Burn has no config for its constant scheduler; ember adds one so that a constant
    rate can be a child of a sequential or composed scheduler config.

    Args:
        lr: the learning rate; any finite number.

    Example:
        >>> from ember.optim.lr_scheduler.constant import ConstantLrConfig
        >>> ConstantLrConfig(0.01).init().step()
        0.01
    """

    lr: FiniteFloat

    def init(self) -> ConstantLr:
        """A :class:`ConstantLr` of ``lr``."""
        return ConstantLr(self.lr)


@dataclass(frozen=True)
class ConstantLr(LrScheduler):
    """A learning rate that never changes.

    A plain float works wherever ember expects a scheduler: :func:`as_scheduler` turns
    it into a ``ConstantLr``. The scheduler has no state; its record is ``None``.

    Args:
        lr: the learning rate; any finite number.

    Raises:
        ArgumentError: ``lr`` is not a real number or is not finite.

    Example:
        >>> from ember.optim.lr_scheduler.constant import ConstantLr
        >>> scheduler = ConstantLr(1e-3)
        >>> scheduler.step(), scheduler.step(), scheduler.to_record()
        (0.001, 0.001, None)
    """

    lr: LearningRate

    def __post_init__(self) -> None:
        lr = self.lr
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(lr):
            raise ArgumentError(f"ConstantLr: lr must be a finite number, got {short_repr(lr)}")
        object.__setattr__(self, "lr", float(lr))

    def step(self) -> LearningRate:
        return self.lr

    def to_record(self) -> None:
        return None

    def load_record(self, record: Any) -> ConstantLr:
        if record is not None:
            raise RecordMismatchError(
                f"ConstantLr: has no state, so its record is None, got {short_repr(record)}"
            )
        return self


def as_scheduler(value: LrScheduler | float) -> LrScheduler:
    """``value`` as a scheduler: a scheduler as it is, a number as a :class:`ConstantLr`.

    Use it where a learning rate or a scheduler is accepted, as Burn accepts a float for
    a scheduler.

    Args:
        value: an :class:`~ember.optim.lr_scheduler.base.LrScheduler`, or a finite number
            (``int`` or ``float``; not ``bool``).

    Raises:
        ArgumentError: ``value`` is neither a scheduler nor a finite number.

    Example:
        >>> from ember.optim.lr_scheduler.constant import as_scheduler
        >>> from ember.optim.lr_scheduler.step import StepLrSchedulerConfig
        >>> as_scheduler(0.1)
        ConstantLr(lr=0.1)
        >>> scheduler = StepLrSchedulerConfig(0.1, step_size=2).init()
        >>> as_scheduler(scheduler) is scheduler
        True
    """
    if isinstance(value, LrScheduler):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(
            "expected a learning rate scheduler (an LrScheduler) or a constant learning rate "
            f"(a float), got {type(value).__name__} {short_repr(value)}"
        )
    if not math.isfinite(value):
        raise ArgumentError(f"a constant learning rate must be finite, got {value!r}")
    return ConstantLr(float(value))
