"""CosineAnnealingLrScheduler: half a cosine wave from the initial to the minimum rate."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ember.backend.errors import ConfigError
from ember.config.fields import NonNegativeFloat, PositiveInt
from ember.optim.lr_scheduler.base import InitialLr, LearningRate, LrSchedulerConfig, StepCounter


class CosineAnnealingLrSchedulerConfig(LrSchedulerConfig):
    """Configuration of a :class:`CosineAnnealingLrScheduler`.

    For iteration ``i`` (0 for the first step), with ``t = i mod (num_iters + 1)``::

        lr(i) = min_lr + (initial_lr - min_lr) * (1 + cos(pi * t / num_iters)) / 2

    The rate falls from ``initial_lr`` to ``min_lr`` over ``num_iters`` steps and then,
    as in Burn, restarts at ``initial_lr`` (a cycle lasts ``num_iters + 1`` steps).
    PyTorch's ``CosineAnnealingLR`` (``T_max=num_iters``, ``eta_min=min_lr``) gives the
    same first ``num_iters + 1`` rates but then follows the cosine back up instead of
    restarting.

    Args:
        initial_lr: the rate of the first iteration, in ``(0, 1]``.
        num_iters: the number of steps from ``initial_lr`` to ``min_lr``, >= 1.
        min_lr: the lowest rate, in ``[0, initial_lr]``. Default: 0.0.

    Raises:
        ConfigError: a value out of its range (``min_lr`` above ``initial_lr`` at
            :meth:`init`); the message names the field.

    Example:
        >>> from ember.optim.lr_scheduler.cosine import CosineAnnealingLrSchedulerConfig
        >>> scheduler = CosineAnnealingLrSchedulerConfig(1.0, num_iters=2).init()
        >>> [round(scheduler.step(), 6) for _ in range(4)]
        [1.0, 0.5, 0.0, 1.0]
    """

    initial_lr: InitialLr
    num_iters: PositiveInt
    min_lr: NonNegativeFloat = 0.0

    def init(self) -> CosineAnnealingLrScheduler:
        """A new :class:`CosineAnnealingLrScheduler` at iteration 0."""
        if self.min_lr > self.initial_lr:
            field = "CosineAnnealingLrSchedulerConfig.min_lr"
            raise ConfigError(
                f"{field}: expected at most initial_lr ({self.initial_lr}), got {self.min_lr}",
                fields=(field,),
            )
        return CosineAnnealingLrScheduler(self)


@dataclass
class CosineAnnealingLrScheduler(StepCounter):
    """Cosine annealing with restarts; see :class:`CosineAnnealingLrSchedulerConfig`.

    Args:
        config: the schedule.
        iteration: the number of steps taken (the iteration the next :meth:`step` is for).
    """

    config: CosineAnnealingLrSchedulerConfig
    iteration: int = 0

    def lr_at(self, iteration: int) -> LearningRate:
        c = self.config
        phase = iteration % (c.num_iters + 1)
        return c.min_lr + 0.5 * (c.initial_lr - c.min_lr) * (
            1.0 + math.cos(math.pi * phase / c.num_iters)
        )
