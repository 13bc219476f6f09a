"""NoamLrScheduler: the warmup-then-decay schedule of "Attention Is All You Need"."""

from __future__ import annotations

from dataclasses import dataclass

from ember.config.fields import FiniteFloat, PositiveInt
from ember.optim.lr_scheduler.base import LearningRate, LrSchedulerConfig, StepCounter


class NoamLrSchedulerConfig(LrSchedulerConfig):
    """Configuration of a :class:`NoamLrScheduler` (Vaswani et al., 2017).

    With ``s = i + 1`` the 1-based number of iteration ``i``::

        lr(i) = init_lr * model_size ** -0.5 * min(s ** -0.5, s * warmup_steps ** -1.5)

    The rate grows linearly for ``warmup_steps`` steps, peaks at step ``warmup_steps``,
    then decays as ``1 / sqrt(s)``. ``init_lr`` is a scale factor (PyTorch writes this
    schedule as a ``LambdaLR`` on an optimizer rate of ``init_lr``).

    Args:
        init_lr: the overall scale; any finite number (Burn does not restrict it).
        warmup_steps: the length of the warmup, >= 1. Default: 4000.
        model_size: the model's width ``d_model``, >= 1. Default: 512.

    Raises:
        ConfigError: ``warmup_steps`` or ``model_size`` below 1, or ``init_lr`` not finite.

    Example:
        >>> from ember.optim.lr_scheduler.noam import NoamLrSchedulerConfig
        >>> scheduler = NoamLrSchedulerConfig(1.0, warmup_steps=4, model_size=16).init()
        >>> [round(scheduler.step(), 6) for _ in range(5)]  # the peak: 16**-0.5 * 4**-0.5
        [0.03125, 0.0625, 0.09375, 0.125, 0.111803]
    """

    init_lr: FiniteFloat
    warmup_steps: PositiveInt = 4000
    model_size: PositiveInt = 512

    def init(self) -> NoamLrScheduler:
        """A new :class:`NoamLrScheduler` at iteration 0."""
        return NoamLrScheduler(self)


@dataclass
class NoamLrScheduler(StepCounter):
    """The Noam schedule; see :class:`NoamLrSchedulerConfig`.

    Args:
        config: the schedule.
        iteration: the number of steps taken (the iteration the next :meth:`step` is for).
    """

    config: NoamLrSchedulerConfig
    iteration: int = 0

    def lr_at(self, iteration: int) -> LearningRate:
        c = self.config
        s = iteration + 1
        return c.init_lr * c.model_size**-0.5 * min(s**-0.5, s * c.warmup_steps**-1.5)
