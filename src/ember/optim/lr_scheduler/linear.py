"""LinearLrScheduler: a straight line from an initial to a final learning rate."""

from __future__ import annotations

from dataclasses import dataclass

from ember.config.fields import PositiveInt
from ember.optim.lr_scheduler.base import (
    FinalLr,
    InitialLr,
    LearningRate,
    LrSchedulerConfig,
    StepCounter,
)


class LinearLrSchedulerConfig(LrSchedulerConfig):
    """Configuration of a :class:`LinearLrScheduler`.

    The rate moves by equal amounts from ``initial_lr`` (iteration 0) to ``final_lr``
    (iteration ``num_iters``) and stays at ``final_lr`` afterwards:
    ``lr(i) = initial_lr + (final_lr - initial_lr) * min(i, num_iters) / num_iters``.
    It may rise (a warmup) or fall.

    PyTorch's ``LinearLR`` scales the optimizer's rate by factors (default
    ``start_factor=1/3``, ``end_factor=1``, ``total_iters=5``); here, as in Burn, the
    rates themselves are given and nothing has a default.

    Args:
        initial_lr: the rate of the first iteration, in ``(0, 1]``.
        final_lr: the rate from iteration ``num_iters`` on, in ``[0, 1]``.
        num_iters: the number of steps from ``initial_lr`` to ``final_lr``, >= 1.

    Raises:
        ConfigError: a value out of its range; the message names the field.

    Example:
        >>> from ember.optim.lr_scheduler.linear import LinearLrSchedulerConfig
        >>> scheduler = LinearLrSchedulerConfig(0.9, 0.5, num_iters=4).init()
        >>> [round(scheduler.step(), 6) for _ in range(6)]
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.5]
    """

    initial_lr: InitialLr
    final_lr: FinalLr
    num_iters: PositiveInt

    def init(self) -> LinearLrScheduler:
        """A new :class:`LinearLrScheduler` at iteration 0."""
        return LinearLrScheduler(self)


@dataclass
class LinearLrScheduler(StepCounter):
    """A linear learning-rate schedule; see :class:`LinearLrSchedulerConfig`.

    Args:
        config: the schedule.
        iteration: the number of steps taken (the iteration the next :meth:`step` is for).
    """

    config: LinearLrSchedulerConfig
    iteration: int = 0

    def lr_at(self, iteration: int) -> LearningRate:
        c = self.config
        if iteration >= c.num_iters:
            return c.final_lr  # exactly, not up to rounding
        return c.initial_lr + (c.final_lr - c.initial_lr) * (iteration / c.num_iters)
