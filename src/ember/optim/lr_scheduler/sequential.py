"""SequentialLrScheduler: one schedule after another, switching at given iterations."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BeforeValidator

from ember.backend.errors import ArgumentError, ConfigError, RecordMismatchError
from ember.config.fields import PositiveInt, list_as_tuple

# The variants a sequential config accepts are those defined before it, composed included.
from ember.optim.lr_scheduler import composed  # noqa: F401
from ember.optim.lr_scheduler.base import (
    LearningRate,
    LrScheduler,
    LrSchedulerConfig,
    check_record_keys,
    init_children,
    is_count,
    load_children,
    short_repr,
)
from ember.optim.lr_scheduler.constant import as_scheduler


class SequentialLrSchedulerConfig(LrSchedulerConfig):
    """Configuration of a :class:`SequentialLrScheduler`.

    Scheduler ``k`` gives the rates of iterations ``milestones[k-1]`` (0 for the first)
    up to ``milestones[k] - 1``; the last one runs until the end. Each child starts at
    its own iteration 0 when its phase begins, as with PyTorch's ``SequentialLR``.
    The usual use is a warmup followed by a decay.

    Args:
        schedulers: the child configs, in order: any of the :class:`LrSchedulerConfig`
            family (composed ones included).
        milestones: the iterations at which the next child takes over: one fewer than
            the children, strictly increasing, each >= 1.

    Raises:
        ConfigError: at :meth:`init`, no child, milestones that do not match the
            children, or a child config that does not validate (named as
            ``schedulers[i]``).

    Example:
        >>> from ember.optim.lr_scheduler.cosine import CosineAnnealingLrSchedulerConfig
        >>> from ember.optim.lr_scheduler.linear import LinearLrSchedulerConfig
        >>> from ember.optim.lr_scheduler.sequential import SequentialLrSchedulerConfig
        >>> warmup = LinearLrSchedulerConfig(0.1, 0.4, num_iters=3)
        >>> decay = CosineAnnealingLrSchedulerConfig(0.4, num_iters=2)
        >>> scheduler = SequentialLrSchedulerConfig([warmup, decay], milestones=[3]).init()
        >>> [round(scheduler.step(), 6) for _ in range(6)]
        [0.1, 0.2, 0.3, 0.4, 0.2, 0.0]
    """

    schedulers: Annotated[tuple[LrSchedulerConfig, ...], BeforeValidator(list_as_tuple)]
    milestones: Annotated[tuple[PositiveInt, ...], BeforeValidator(list_as_tuple)]

    def init(self) -> SequentialLrScheduler:
        """A new :class:`SequentialLrScheduler` with every child at iteration 0."""
        owner = "SequentialLrSchedulerConfig"
        children = init_children(owner, self.schedulers)
        problem = _milestone_problem(len(children), self.milestones)
        if problem is not None:
            raise ConfigError(f"{owner}.milestones: {problem}", fields=(f"{owner}.milestones",))
        return SequentialLrScheduler(children, self.milestones)


class SequentialLrScheduler(LrScheduler):
    """Runs schedulers one after another, switching at the milestones.

    Its record is ``{"iteration": steps taken, "schedulers": [record of each child]}``.

    Args:
        schedulers: the children, in order: schedulers, or numbers for constant rates
            (see :func:`~ember.optim.lr_scheduler.constant.as_scheduler`). The
            sequential scheduler steps them; do not step them elsewhere.
        milestones: the iterations at which the next child takes over: one fewer than
            the children, strictly increasing, each >= 1.
        iteration: the number of steps taken. Default: 0.

    Raises:
        ArgumentError: no child, a child that is neither a scheduler nor a number, or
            milestones that do not match the children.

    Example:
        >>> from ember.optim.lr_scheduler.exponential import ExponentialLrSchedulerConfig
        >>> from ember.optim.lr_scheduler.sequential import SequentialLrScheduler
        >>> decay = ExponentialLrSchedulerConfig(0.5, gamma=0.5).init()
        >>> scheduler = SequentialLrScheduler([1e-3, decay], milestones=[2])
        >>> [scheduler.step() for _ in range(4)]
        [0.001, 0.001, 0.5, 0.25]
        >>> scheduler.to_record()
        {'iteration': 4, 'schedulers': [None, 2]}
    """

    def __init__(
        self,
        schedulers: Sequence[LrScheduler | float],
        milestones: Sequence[int],
        iteration: int = 0,
    ) -> None:
        owner = "SequentialLrScheduler"
        for name, value in (("schedulers", schedulers), ("milestones", milestones)):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ArgumentError(f"{owner}: {name} must be a list, got {short_repr(value)}")
        if not schedulers:
            raise ArgumentError(f"{owner}: expected at least one scheduler, got none")
        problem = _milestone_problem(len(schedulers), milestones)
        if problem is not None:
            raise ArgumentError(f"{owner}: milestones: {problem}")
        if not is_count(iteration):
            raise ArgumentError(
                f"{owner}: iteration must be an integer >= 0 (the number of steps taken), "
                f"got {short_repr(iteration)}"
            )
        self.schedulers: list[LrScheduler] = [as_scheduler(s) for s in schedulers]
        self.milestones: tuple[int, ...] = tuple(milestones)
        self.iteration = iteration

    def step(self) -> LearningRate:
        phase = bisect.bisect_right(self.milestones, self.iteration)
        self.iteration += 1
        return self.schedulers[phase].step()

    def to_record(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "schedulers": [scheduler.to_record() for scheduler in self.schedulers],
        }

    def load_record(self, record: Any) -> SequentialLrScheduler:
        owner = "SequentialLrScheduler"
        record = check_record_keys(owner, record, ("iteration", "schedulers"))
        if not is_count(record["iteration"]):
            raise RecordMismatchError(
                f"{owner}: expected 'iteration' to be the number of steps taken (an integer "
                f">= 0), got {short_repr(record['iteration'])}",
                path="iteration",
            )
        children = load_children(owner, self.schedulers, record["schedulers"])
        return SequentialLrScheduler(children, self.milestones, record["iteration"])

    def __repr__(self) -> str:
        return (
            f"SequentialLrScheduler(schedulers={self.schedulers!r}, "
            f"milestones={list(self.milestones)!r}, iteration={self.iteration})"
        )


def _milestone_problem(count: int, milestones: Sequence[Any]) -> str | None:
    """What is wrong with ``milestones`` for ``count`` schedulers, or None."""
    shown = list(milestones)
    if len(shown) != count - 1:
        return (
            f"expected {count - 1} milestone(s), one fewer than the {count} scheduler(s), "
            f"got {len(shown)}: {shown}"
        )
    if not all(is_count(m) and m >= 1 for m in shown):
        return f"expected integers >= 1, got {short_repr(shown)}"
    if any(later <= earlier for earlier, later in itertools.pairwise(shown)):
        return f"expected strictly increasing iterations, got {shown}"
    return None
