"""ExponentialLrScheduler: the learning rate times a constant factor at every step."""

from __future__ import annotations

from dataclasses import dataclass

from ember.optim.lr_scheduler.base import (
    DecayFactor,
    InitialLr,
    LearningRate,
    LrSchedulerConfig,
    StepCounter,
)


class ExponentialLrSchedulerConfig(LrSchedulerConfig):
    """Configuration of an :class:`ExponentialLrScheduler`.

    ``lr(i) = initial_lr * gamma ** i`` for iteration ``i`` (0 for the first step), as
    PyTorch's ``ExponentialLR`` with ``initial_lr`` as the optimizer's rate. As in Burn,
    both values must lie in ``(0, 1]``, so the rate never grows.

    Args:
        initial_lr: the rate of the first iteration, in ``(0, 1]``.
        gamma: the factor applied at every step, in ``(0, 1]``.

    Raises:
        ConfigError: a value out of its range; the message names the field.

    Example:
        >>> from ember.optim.lr_scheduler.exponential import ExponentialLrSchedulerConfig
        >>> scheduler = ExponentialLrSchedulerConfig(0.8, gamma=0.5).init()
        >>> [scheduler.step() for _ in range(4)]
        [0.8, 0.4, 0.2, 0.1]
    """

    initial_lr: InitialLr
    gamma: DecayFactor

    def init(self) -> ExponentialLrScheduler:
        """A new :class:`ExponentialLrScheduler` at iteration 0."""
        return ExponentialLrScheduler(self)


@dataclass
class ExponentialLrScheduler(StepCounter):
    """An exponentially decaying learning rate; see :class:`ExponentialLrSchedulerConfig`.

    The rate is computed from the iteration count rather than by repeated multiplication,
    so a restored scheduler gives exactly the rates an uninterrupted one would.

    Args:
        config: the schedule.
        iteration: the number of steps taken (the iteration the next :meth:`step` is for).
    """

    config: ExponentialLrSchedulerConfig
    iteration: int = 0

    def lr_at(self, iteration: int) -> LearningRate:
        return self.config.initial_lr * self.config.gamma**iteration
