"""Learning-rate schedulers: the rate to pass to each optimizer step.

An optimizer takes the learning rate as an argument of every step
(``model = optimizer.step(lr, model, grads)``); a scheduler produces that rate.
As in Burn, a scheduler is built from its config with ``init()``, and:

* ``step() -> float`` advances it and returns the rate of the next optimizer step;
* ``to_record()`` returns its state as plain data, which any recorder of
  :mod:`ember.record` saves;
* ``load_record(record)`` returns a scheduler that continues from a saved state
  (a new one: write ``scheduler = scheduler.load_record(record)``).

**Convention.** The first ``step()`` returns the rate of iteration 0, the first
optimizer step: ``initial_lr`` for the linear, exponential, step and cosine
schedulers. Call it once per optimizer step, before the step. In PyTorch, this
is the rate the optimizer holds before the first ``scheduler.step()``: the
``k``-th ``step()`` here equals ``scheduler.get_last_lr()`` after ``k - 1`` calls
of PyTorch's ``scheduler.step()``. The formulas below use ``i``, the 0-based
iteration.

=================================== ================================================
scheduler (config)                  rate of iteration ``i``
=================================== ================================================
``ConstantLr(lr)`` or a float       ``lr``
``LinearLrSchedulerConfig``         ``initial_lr`` to ``final_lr`` in ``num_iters``
                                    equal steps, then ``final_lr``
``ExponentialLrSchedulerConfig``    ``initial_lr * gamma ** i``
``StepLrSchedulerConfig``           ``initial_lr * gamma ** (i // step_size)``
``CosineAnnealingLrSchedulerConfig`` half a cosine from ``initial_lr`` to ``min_lr`` in
                                    ``num_iters`` steps, then a restart
``NoamLrSchedulerConfig``           warmup then ``1 / sqrt(i + 1)`` decay
``SequentialLrSchedulerConfig``     one child after another, switching at milestones
``ComposedLrSchedulerConfig``       the children's rates multiplied, summed or averaged
=================================== ================================================

A plain float works wherever a scheduler is expected: :func:`as_scheduler`
turns it into a :class:`ConstantLr`. The configs form one family,
:class:`LrSchedulerConfig`, so a composition saves its children by name in JSON.

Example:
    >>> from ember.optim.lr_scheduler.cosine import CosineAnnealingLrSchedulerConfig
    >>> from ember.optim.lr_scheduler.linear import LinearLrSchedulerConfig
    >>> from ember.optim.lr_scheduler.sequential import SequentialLrSchedulerConfig
    >>> from ember.record import BinBytesRecorder
    >>> config = SequentialLrSchedulerConfig(
    ...     [LinearLrSchedulerConfig(0.01, 0.1, num_iters=2),
    ...      CosineAnnealingLrSchedulerConfig(0.1, num_iters=4, min_lr=0.02)],
    ...     milestones=[2])
    >>> scheduler = config.init()
    >>> [round(scheduler.step(), 4) for _ in range(3)]  # iterations 0, 1, 2
    [0.01, 0.055, 0.1]
    >>> saved = BinBytesRecorder().to_bytes(scheduler.to_record())
    >>> resumed = config.init().load_record(BinBytesRecorder().from_bytes(saved))
    >>> [round(resumed.step(), 4) for _ in range(4)]  # iterations 3 to 6
    [0.0883, 0.06, 0.0317, 0.02]
"""

from ember.optim.lr_scheduler.base import LearningRate, LrScheduler, LrSchedulerConfig, StepCounter
from ember.optim.lr_scheduler.composed import (
    ComposedLrScheduler,
    ComposedLrSchedulerConfig,
    SchedulerReduction,
)
from ember.optim.lr_scheduler.constant import ConstantLr, ConstantLrConfig, as_scheduler
from ember.optim.lr_scheduler.cosine import (
    CosineAnnealingLrScheduler,
    CosineAnnealingLrSchedulerConfig,
)
from ember.optim.lr_scheduler.exponential import (
    ExponentialLrScheduler,
    ExponentialLrSchedulerConfig,
)
from ember.optim.lr_scheduler.linear import LinearLrScheduler, LinearLrSchedulerConfig
from ember.optim.lr_scheduler.noam import NoamLrScheduler, NoamLrSchedulerConfig
from ember.optim.lr_scheduler.sequential import SequentialLrScheduler, SequentialLrSchedulerConfig
from ember.optim.lr_scheduler.step import StepLrScheduler, StepLrSchedulerConfig

__all__ = [
    "ComposedLrScheduler", "ComposedLrSchedulerConfig", "ConstantLr", "ConstantLrConfig",
    "CosineAnnealingLrScheduler", "CosineAnnealingLrSchedulerConfig", "ExponentialLrScheduler",
    "ExponentialLrSchedulerConfig", "LearningRate", "LinearLrScheduler",
    "LinearLrSchedulerConfig", "LrScheduler", "LrSchedulerConfig", "NoamLrScheduler",
    "NoamLrSchedulerConfig", "SchedulerReduction", "SequentialLrScheduler",
    "SequentialLrSchedulerConfig", "StepCounter", "StepLrScheduler", "StepLrSchedulerConfig",
    "as_scheduler",
]  # fmt: skip
