"""PlainRenderer: a run as lines of text, for logs and CI where there is no terminal.

The learner uses it instead of the dashboard when standard output is not a terminal.
It writes one line every ``every`` iterations of each split, and one line when a
split's epoch ends, with each metric's latest report::

    [train] epoch 1/10 iteration 50 items 3200/60000 (5%) | Loss epoch 0.72 - batch 0.52
    [train] epoch 1/10 done | Loss 0.4218 | Accuracy 88.41

At the end of an epoch a numeric metric shows its value over the epoch, any other
metric its last formatted report.
"""

from __future__ import annotations

import sys
from typing import TextIO

from ember.backend.errors import ArgumentError
from ember.train.renderer.base import MetricsRenderer, MetricUpdate, Split, TrainingProgress


class PlainRenderer(MetricsRenderer):
    """Writes progress lines every ``every`` iterations and at each epoch's end.

    Args:
        every: write a progress line every this many iterations; 0 writes only the
            end-of-epoch lines. Default: 50.
        stream: where to write. Default: the current ``sys.stdout``.

    Example:
        >>> from ember.train.metric.base import MetricEntry, Progress
        >>> from ember.train.renderer.base import MetricUpdate, TrainingProgress
        >>> renderer = PlainRenderer(every=2)
        >>> for iteration in (1, 2):
        ...     entry = MetricEntry("Loss", f"epoch 0.{iteration} - batch 0.{iteration}", "0.1")
        ...     renderer.update_train(MetricUpdate(entry, value=iteration / 10))
        ...     renderer.render_train(TrainingProgress(Progress(iteration * 4, 8), 1, 3, iteration))
        [train] epoch 1/3 iteration 2 items 8/8 (100%) | Loss epoch 0.2 - batch 0.2
        >>> renderer.on_epoch_end("train", 1)
        [train] epoch 1/3 done | Loss 0.2
    """

    def __init__(self, every: int = 50, stream: TextIO | None = None) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ArgumentError(f"PlainRenderer: every must be an integer >= 0, got {every!r}")
        self.every = every
        self._stream = stream
        self._latest: dict[str, dict[str, MetricUpdate]] = {"train": {}, "valid": {}}
        self._epoch_total: dict[str, tuple[int, int]] = {}

    # ------------------------------------------------------------------ protocol
    def update_train(self, update: MetricUpdate) -> None:
        self._latest["train"][update.entry.name] = update

    def update_valid(self, update: MetricUpdate) -> None:
        self._latest["valid"][update.entry.name] = update

    def render_train(self, progress: TrainingProgress) -> None:
        self._render("train", progress)

    def render_valid(self, progress: TrainingProgress) -> None:
        self._render("valid", progress)

    def on_epoch_end(self, split: Split, epoch: int) -> None:
        latest = self._latest[split]
        _, total = self._epoch_total.get(split, (epoch, 0))
        where = f"epoch {epoch}/{total}" if total else f"epoch {epoch}"
        parts = [f"[{split}] {where} done"]
        for name, update in latest.items():
            shown = f"{update.value:.4g}" if update.numeric else update.entry.formatted
            parts.append(f"{name} {shown}")
        self._write(" | ".join(parts))
        latest.clear()

    # ------------------------------------------------------------------ lines
    def _render(self, split: Split, progress: TrainingProgress) -> None:
        self._epoch_total[split] = (progress.epoch, progress.epoch_total)
        if not self.every or progress.iteration % self.every:
            return
        done, total = progress.progress.items_processed, progress.progress.items_total
        percent = f" ({100 * done // total}%)" if total else ""
        parts = [
            f"[{split}] epoch {progress.epoch}/{progress.epoch_total} "
            f"iteration {progress.iteration} items {done}/{total}{percent}"
        ]
        parts += [f"{name} {u.entry.formatted}" for name, u in self._latest[split].items()]
        self._write(" | ".join(parts))

    def _write(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write(line + "\n")
        stream.flush()
