"""Two saved runs side by side: what got slower beyond a threshold is a regression.

Results are matched by benchmark, case and implementation. The change is the new time
over the old one (or, with ``metric="ratio"``, the new ratio to the reference over the
old: that one cancels a machine that is faster or slower overall). A change above
``threshold`` is a regression, below ``1 / threshold`` an improvement, anything between
is noise and not flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ember.backend.errors import ArgumentError
from ember.bench.results import BenchRun, Result

Metric = Literal["seconds", "ratio"]


@dataclass(frozen=True)
class Change:
    """One result in both runs: the values compared and the verdict."""

    key: tuple[str, str, str]
    old: float
    new: float

    @property
    def factor(self) -> float:
        return self.new / self.old


@dataclass(frozen=True)
class Comparison:
    changes: list[Change]
    regressions: list[Change]
    improvements: list[Change]
    only_old: list[tuple[str, str, str]]
    only_new: list[tuple[str, str, str]]


def compare_runs(old: BenchRun, new: BenchRun, threshold: float = 1.10,
                 metric: Metric = "seconds") -> Comparison:  # fmt: skip
    """Compares ``new`` with ``old`` (see the module docstring).

    Raises:
        ArgumentError: ``threshold`` is not a number above 1, or ``metric`` is unknown.

    Example:
        >>> from ember.bench.results import BenchRun, Result
        >>> def run(seconds):
        ...     return BenchRun(created="", machine={}, threads=1, scripts=[], results=[
        ...         Result(benchmark="b", case="c", impl="ember", backend="ndarray",
        ...                seconds=seconds)])
        >>> [c.factor for c in compare_runs(run(1.0), run(1.25)).regressions]
        [1.25]
        >>> compare_runs(run(1.0), run(1.05)).regressions
        []
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) \
            or not 1 < threshold < float("inf"):  # fmt: skip
        raise ArgumentError(f"compare_runs: threshold must be a number above 1, got {threshold!r}")
    if metric not in ("seconds", "ratio"):
        raise ArgumentError(f"compare_runs: metric must be 'seconds' or 'ratio', got {metric!r}")
    before, after = _values(old, metric), _values(new, metric)
    changes = [Change(key, before[key], after[key]) for key in before if key in after]
    return Comparison(
        changes=changes,
        regressions=[c for c in changes if c.factor > threshold],
        improvements=[c for c in changes if c.factor < 1 / threshold],
        only_old=[k for k in before if k not in after],
        only_new=[k for k in after if k not in before],
    )


def _values(run: BenchRun, metric: Metric) -> dict[tuple[str, str, str], float]:
    values: dict[tuple[str, str, str], float] = {}
    for result in run.results:
        value = _value(result, metric)
        if value is not None:
            values.setdefault(result.key, value)
    return values


def _value(result: Result, metric: Metric) -> float | None:
    if metric == "seconds":
        return result.seconds
    if result.reference_seconds is None or result.impl == result.reference:
        return None  # no reference, or the reference itself (always 1)
    return result.ratio
