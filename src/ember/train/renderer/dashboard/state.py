"""What the dashboard knows about a run, shared between the training thread and the UI.

The training thread writes (:meth:`DashboardState.update`, :meth:`~DashboardState.render`,
:meth:`~DashboardState.end_epoch`), the UI thread reads (:meth:`~DashboardState.snapshot`).
Every method takes one lock for a few dictionary operations, so the learner never waits
for the screen: the UI polls the state a few times a second and redraws when its
``version`` moved.

A numeric metric keeps two histories per split:

* *recent*: the last ``recent_points`` values, one per iteration, placed on a shared
  x axis measured in epochs (``epoch - 1 + items_processed / items_total``), so the
  training and the validation curves of an epoch span the same interval;
* *epochs*: one value per epoch, the metric's value at the epoch's last iteration (a
  numeric metric reports its running mean over the epoch, so that is the epoch's value).

Example:
    >>> from ember.train.metric.base import MetricEntry, Progress
    >>> from ember.train.renderer.base import MetricUpdate, TrainingProgress
    >>> state = DashboardState(clock=lambda: 0.0)
    >>> state.update("train", MetricUpdate(MetricEntry("Loss", "epoch 0.50", "0.5"), 0.5))
    >>> state.render("train", TrainingProgress(Progress(8, 32), 1, 2, iteration=1))
    >>> view = state.snapshot()
    >>> view.numeric_names, view.history("train", "Loss").recent
    (('Loss',), ((0.25, 0.5),))
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ember.backend.errors import ArgumentError
from ember.train.renderer.base import MetricUpdate, Split, TrainingProgress

SPLITS: tuple[Split, ...] = ("train", "valid")


@dataclass(frozen=True)
class MetricHistory:
    """The plotted values of one metric in one split: ``(x, value)`` points."""

    recent: tuple[tuple[float, float], ...] = ()
    epochs: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class DashboardView:
    """A consistent copy of the state, taken under the lock, for the UI to draw.

    Args:
        version: increases with every change of the state.
        numeric_names: the numeric metrics, in the order they were first seen.
        histories: ``(split, name) -> MetricHistory`` for the numeric metrics.
        texts: ``(split, name) -> formatted`` for every metric (numeric ones included).
        progress: the last progress of each split rendered so far.
        split: the split rendered last (None before the first render).
        started: the clock when the first render came (None before).
        split_started: the clock when the current split's epoch began.
        now: the clock when the copy was taken.
        closed: whether the run is over.
    """

    version: int
    numeric_names: tuple[str, ...]
    text_names: tuple[str, ...]
    histories: dict[tuple[Split, str], MetricHistory]
    texts: dict[tuple[Split, str], str]
    progress: dict[Split, TrainingProgress]
    split: Split | None
    started: float | None
    split_started: float | None
    now: float
    closed: bool

    def history(self, split: Split, name: str) -> MetricHistory:
        return self.histories.get((split, name), MetricHistory())

    @property
    def current(self) -> TrainingProgress | None:
        return self.progress.get(self.split) if self.split is not None else None

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.now - self.started

    @property
    def items_per_second(self) -> float | None:
        """The current split's speed over its epoch so far (None until it is known)."""
        current = self.current
        if current is None or self.split_started is None:
            return None
        seconds = self.now - self.split_started
        return current.progress.items_processed / seconds if seconds > 0 else None

    @property
    def epoch_fraction(self) -> float:
        """How far the current split's epoch is, in [0, 1]."""
        current = self.current
        return 0.0 if current is None else _fraction(current)

    @property
    def run_fraction(self) -> float:
        """How far the run is, in [0, 1], counted in training epochs."""
        train = self.progress.get("train")
        if train is None or train.epoch_total <= 0:
            return 0.0
        return min(1.0, (train.epoch - 1 + _fraction(train)) / train.epoch_total)

    @property
    def eta(self) -> float | None:
        """Seconds left, extrapolated from the time the run's done fraction took."""
        done = self.run_fraction
        if done <= 0 or self.started is None:
            return None
        return self.elapsed * (1.0 - done) / done


def _fraction(progress: TrainingProgress) -> float:
    total = progress.progress.items_total
    return min(1.0, progress.progress.items_processed / total) if total > 0 else 0.0


@dataclass
class _Series:
    recent: deque[tuple[float, float]]
    epochs: dict[int, float] = field(default_factory=dict)


class DashboardState:
    """The thread-safe store between the renderer (training thread) and the app (UI thread).

    Args:
        recent_points: how many iterations the *recent* history keeps per split and metric.
        clock: seconds as a float; ``time.monotonic`` unless a test fixes it.
    """

    def __init__(self, recent_points: int = 600,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if recent_points < 2:
            raise ArgumentError(
                f"DashboardState: recent_points must be at least 2 to draw a line, got {recent_points}"
            )
        self._recent_points = recent_points
        self._clock = clock
        self._lock = threading.Lock()
        self._version = 0
        self._numeric: list[str] = []
        self._text: list[str] = []
        self._series: dict[tuple[Split, str], _Series] = {}
        self._texts: dict[tuple[Split, str], str] = {}
        self._pending: dict[Split, dict[str, float]] = {split: {} for split in SPLITS}
        self._progress: dict[Split, TrainingProgress] = {}
        self._split: Split | None = None
        self._started: float | None = None
        self._split_started: float | None = None
        self._closed = False

    # ------------------------------------------------------------- training thread
    def update(self, split: Split, update: MetricUpdate) -> None:
        """Records one metric's report; its value is plotted at the next :meth:`render`."""
        name = update.entry.name
        with self._lock:
            self._texts[(split, name)] = update.entry.formatted
            if update.value is not None:
                if name not in self._numeric:
                    self._numeric.append(name)
                self._pending[split][name] = float(update.value)
            elif name not in self._text:
                self._text.append(name)
            self._version += 1

    def render(self, split: Split, progress: TrainingProgress) -> None:
        """Places the iteration's pending values at the progress's point of the x axis."""
        now = self._clock()
        x = progress.epoch - 1 + _fraction(progress)
        with self._lock:
            if self._started is None:
                self._started = now
            previous = self._progress.get(split)
            if self._split != split or previous is None or previous.epoch != progress.epoch:
                # a split's epoch starts: its speed is measured from here
                self._split_started = now
            self._split = split
            self._progress[split] = progress
            for name, value in self._pending[split].items():
                series = self._series.get((split, name))
                if series is None:
                    series = _Series(deque(maxlen=self._recent_points))
                    self._series[(split, name)] = series
                series.recent.append((x, value))
                series.epochs[progress.epoch] = value
            self._pending[split].clear()
            self._version += 1

    def end_epoch(self, split: Split, epoch: int) -> None:
        """A split's epoch is over; its last values stay as the epoch's points."""
        with self._lock:
            self._pending[split].clear()
            self._version += 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._version += 1

    # ------------------------------------------------------------------- UI thread
    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def snapshot(self) -> DashboardView:
        """A copy of everything the UI draws, consistent with one moment of the run."""
        with self._lock:
            histories = {
                key: MetricHistory(
                    tuple(series.recent),
                    tuple((float(epoch), value) for epoch, value in sorted(series.epochs.items())),
                )
                for key, series in self._series.items()
            }
            return DashboardView(
                version=self._version,
                numeric_names=tuple(self._numeric),
                text_names=tuple(self._text),
                histories=histories,
                texts=dict(self._texts),
                progress=dict(self._progress),
                split=self._split,
                started=self._started,
                split_started=self._split_started,
                now=self._clock(),
                closed=self._closed,
            )
