"""ComposedLrScheduler: several schedules at once, their rates combined at every step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from ember.backend.errors import ArgumentError
from ember.config.fields import list_as_tuple

# The variants a composed config accepts are those defined before it.
from ember.optim.lr_scheduler import constant, cosine, exponential, linear, noam, step  # noqa: F401
from ember.optim.lr_scheduler.base import (
    LearningRate,
    LrScheduler,
    LrSchedulerConfig,
    check_record_keys,
    init_children,
    load_children,
    short_repr,
)
from ember.optim.lr_scheduler.constant import as_scheduler

SchedulerReduction = Literal["prod", "sum", "avg"]
"""How a composed scheduler combines its children's rates (Burn's ``Prod``, ``Sum``, ``Avg``)."""

_REDUCTIONS: tuple[str, ...] = ("prod", "sum", "avg")


class ComposedLrSchedulerConfig(LrSchedulerConfig):
    """Configuration of a :class:`ComposedLrScheduler`.

    Every step advances all the child schedulers and combines their rates: their
    product (``"prod"``, the default, as in Burn), sum (``"sum"``) or mean (``"avg"``).
    The product makes one schedule a factor of another, e.g. a warmup from 0 to 1
    times a cosine decay.

    Args:
        schedulers: the child configs, any of the :class:`LrSchedulerConfig` family
            defined before this class (so not a sequential one). Default: none, as
            Burn's; :meth:`init` needs at least one.
        reduction: ``"prod"``, ``"sum"`` or ``"avg"``. Default: ``"prod"``.

    Raises:
        ConfigError: at :meth:`init`, no child, or a child config that does not
            validate (named as ``schedulers[i]``).

    Example:
        >>> from ember.optim.lr_scheduler.composed import ComposedLrSchedulerConfig
        >>> from ember.optim.lr_scheduler.linear import LinearLrSchedulerConfig
        >>> from ember.optim.lr_scheduler.step import StepLrSchedulerConfig
        >>> warmup = LinearLrSchedulerConfig(0.25, 1.0, num_iters=3)
        >>> decay = StepLrSchedulerConfig(0.4, step_size=2, gamma=0.5)
        >>> scheduler = ComposedLrSchedulerConfig(schedulers=[warmup, decay]).init()
        >>> [round(scheduler.step(), 6) for _ in range(5)]
        [0.1, 0.2, 0.15, 0.2, 0.1]
    """

    schedulers: Annotated[tuple[LrSchedulerConfig, ...], BeforeValidator(list_as_tuple)] = ()
    reduction: SchedulerReduction = "prod"

    def init(self) -> ComposedLrScheduler:
        """A new :class:`ComposedLrScheduler` with every child at iteration 0."""
        return ComposedLrScheduler(
            init_children("ComposedLrSchedulerConfig", self.schedulers), self.reduction
        )


class ComposedLrScheduler(LrScheduler):
    """Runs several schedulers side by side and combines their rates at every step.

    Its record is ``{"schedulers": [record of each child]}``.

    Args:
        schedulers: the children: schedulers, or numbers for constant rates (see
            :func:`~ember.optim.lr_scheduler.constant.as_scheduler`). The composed
            scheduler steps them; do not step them elsewhere.
        reduction: ``"prod"``, ``"sum"`` or ``"avg"``. Default: ``"prod"``.

    Raises:
        ArgumentError: no child, a child that is not a scheduler or number, or an
            unknown reduction.

    Example:
        >>> from ember.optim.lr_scheduler.composed import ComposedLrScheduler
        >>> from ember.optim.lr_scheduler.exponential import ExponentialLrSchedulerConfig
        >>> decay = ExponentialLrSchedulerConfig(1.0, gamma=0.5).init()
        >>> scheduler = ComposedLrScheduler([decay, 0.1])  # 0.1 times the decay
        >>> [scheduler.step() for _ in range(3)], scheduler.to_record()
        ([0.1, 0.05, 0.025], {'schedulers': [3, None]})
    """

    def __init__(
        self, schedulers: Sequence[LrScheduler | float], reduction: SchedulerReduction = "prod"
    ) -> None:
        if isinstance(schedulers, (str, bytes)) or not isinstance(schedulers, Sequence):
            raise ArgumentError(
                f"ComposedLrScheduler: schedulers must be a list of schedulers, "
                f"got {short_repr(schedulers)}"
            )
        if not schedulers:
            raise ArgumentError("ComposedLrScheduler: expected at least one scheduler, got none")
        if reduction not in _REDUCTIONS:
            raise ArgumentError(
                f"ComposedLrScheduler: reduction must be one of {list(_REDUCTIONS)}, "
                f"got {short_repr(reduction)}"
            )
        self.schedulers: list[LrScheduler] = [as_scheduler(s) for s in schedulers]
        self.reduction: SchedulerReduction = reduction

    def step(self) -> LearningRate:
        rates = [scheduler.step() for scheduler in self.schedulers]
        if self.reduction == "prod":
            return math.prod(rates)
        total = math.fsum(rates)
        return total if self.reduction == "sum" else total / len(rates)

    def to_record(self) -> dict[str, Any]:
        return {"schedulers": [scheduler.to_record() for scheduler in self.schedulers]}

    def load_record(self, record: Any) -> ComposedLrScheduler:
        record = check_record_keys("ComposedLrScheduler", record, ("schedulers",))
        children = load_children("ComposedLrScheduler", self.schedulers, record["schedulers"])
        return ComposedLrScheduler(children, self.reduction)

    def __repr__(self) -> str:
        return f"ComposedLrScheduler(schedulers={self.schedulers!r}, reduction={self.reduction!r})"
