"""StepLrScheduler: the learning rate times ``gamma`` every ``step_size`` steps."""

from __future__ import annotations

from dataclasses import dataclass

from ember.config.fields import FiniteFloat, PositiveInt
from ember.optim.lr_scheduler.base import LearningRate, LrSchedulerConfig, StepCounter


class StepLrSchedulerConfig(LrSchedulerConfig):
    """Configuration of a :class:`StepLrScheduler`.

    ``lr(i) = initial_lr * gamma ** (i // step_size)`` for iteration ``i`` (0 for the
    first step): ``initial_lr`` for the first ``step_size`` steps, then ``gamma`` times
    that for the next ``step_size``, and so on, as PyTorch's ``StepLR`` (same default
    ``gamma=0.1``).

    As in Burn, ``initial_lr`` and ``gamma`` are not range-checked (a growing rate or a
    zero rate can be useful, e.g. to debug); they only need to be finite.

    Args:
        initial_lr: the rate of the first ``step_size`` iterations.
        step_size: the number of iterations between two changes, >= 1.
        gamma: the factor applied every ``step_size`` iterations. Default: 0.1.

    Raises:
        ConfigError: ``step_size`` below 1, or a value that is not finite.

    Example:
        >>> from ember.optim.lr_scheduler.step import StepLrSchedulerConfig
        >>> scheduler = StepLrSchedulerConfig(0.5, step_size=2).with_gamma(0.5).init()
        >>> [scheduler.step() for _ in range(5)]
        [0.5, 0.5, 0.25, 0.25, 0.125]
    """

    initial_lr: FiniteFloat
    step_size: PositiveInt
    gamma: FiniteFloat = 0.1

    def init(self) -> StepLrScheduler:
        """A new :class:`StepLrScheduler` at iteration 0."""
        return StepLrScheduler(self)


@dataclass
class StepLrScheduler(StepCounter):
    """A learning rate that drops in steps; see :class:`StepLrSchedulerConfig`.

    Args:
        config: the schedule.
        iteration: the number of steps taken (the iteration the next :meth:`step` is for).
    """

    config: StepLrSchedulerConfig
    iteration: int = 0

    def lr_at(self, iteration: int) -> LearningRate:
        c = self.config
        return c.initial_lr * c.gamma ** (iteration // c.step_size)
