"""NotebookRenderer: a run shown in a Jupyter cell, as one HTML block updated in place.

The terminal dashboard needs a terminal and the plain renderer prints a line per update,
which piles up in a notebook cell. This renderer keeps one output of the cell
(``IPython.display.display(..., display_id=True)``) and replaces it as the run goes: a
progress bar per split with the epoch and iteration, the latest value of each metric,
and a table with one row per finished epoch. It carries a ``text/plain`` version too, for
front ends without HTML.

Updates are throttled (``refresh_seconds``; the end of an epoch and the end of the run
always show), because each one is a message to the front end.

The learner picks it by itself when it runs in a Jupyter kernel (see
:func:`in_notebook`); elsewhere it can be chosen with ``LearnerBuilder.renderer``.
"""

from __future__ import annotations

import html
import sys
import time
from collections.abc import Callable
from typing import Any

from ember.backend.errors import ArgumentError
from ember.train.renderer.base import MetricsRenderer, MetricUpdate, Split, TrainingProgress
from ember.train.tracker.base import require


def in_notebook() -> bool:
    """True when this process is a Jupyter kernel (an IPython shell with a kernel attached).

    IPython in a terminal has no kernel and keeps the terminal renderers. IPython is not
    imported here: a kernel has always loaded it already.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class NotebookRenderer(MetricsRenderer):
    """Shows a run in the current notebook cell, updated in place.

    Args:
        refresh_seconds: the least time between two updates of the cell's output.
            Default: 0.2.
        clock: the time source of the throttle (seconds). Default: ``time.monotonic``.

    Raises:
        MissingExtraError: IPython is not installed (the ``notebook`` extra), raised when
            the first output is shown.
    """

    def __init__(
        self, refresh_seconds: float = 0.2, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if isinstance(refresh_seconds, bool) or not isinstance(refresh_seconds, int | float) \
                or not refresh_seconds >= 0:  # fmt: skip
            raise ArgumentError(
                f"NotebookRenderer: refresh_seconds must be a number >= 0, got {refresh_seconds!r}"
            )
        self.refresh_seconds = float(refresh_seconds)
        self._clock = clock
        self._latest: dict[Split, dict[str, MetricUpdate]] = {"train": {}, "valid": {}}
        self._progress: dict[Split, TrainingProgress] = {}
        # one row per finished epoch of a split: (split, epoch, {metric: shown value})
        self._epochs: list[tuple[Split, int, dict[str, str]]] = []
        self._handle: Any = None
        self._last_shown: float | None = None

    # ------------------------------------------------------------------ protocol
    def update_train(self, update: MetricUpdate) -> None:
        self._latest["train"][update.entry.name] = update

    def update_valid(self, update: MetricUpdate) -> None:
        self._latest["valid"][update.entry.name] = update

    def render_train(self, progress: TrainingProgress) -> None:
        self._progress["train"] = progress
        self._show(force=False)

    def render_valid(self, progress: TrainingProgress) -> None:
        self._progress["valid"] = progress
        self._show(force=False)

    def on_epoch_end(self, split: Split, epoch: int) -> None:
        shown = {name: _shown(update) for name, update in self._latest[split].items()}
        self._epochs.append((split, epoch, shown))
        self._latest[split].clear()
        self._show(force=True)

    def close(self) -> None:
        if self._progress or self._epochs:
            self._show(force=True)

    # ------------------------------------------------------------------ output
    def html(self) -> str:
        """The current view as HTML (what the cell shows)."""
        parts = ['<div class="ember-run">']
        for split, progress in self._progress.items():
            done, total = progress.progress.items_processed, progress.progress.items_total
            bar = f'<progress value="{done}" max="{max(total, 1)}"></progress>'
            where = (
                f"{split} · epoch {progress.epoch}/{progress.epoch_total} · "
                f"iteration {progress.iteration} · items {done}/{total}"
            )
            metrics = " · ".join(
                f"{name} {u.entry.formatted}" for name, u in self._latest[split].items()
            )
            parts.append(
                f"<div>{bar} {html.escape(where)}"
                + (f"<br><small>{html.escape(metrics)}</small>" if metrics else "")
                + "</div>"
            )
        if self._epochs:
            names = list(dict.fromkeys(n for _, _, shown in self._epochs for n in shown))
            head = "".join(f"<th>{html.escape(n)}</th>" for n in ["epoch", "split", *names])
            rows = [
                "<tr>"
                + "".join(
                    f"<td>{html.escape(str(cell))}</td>"
                    for cell in [epoch, split, *(shown.get(n, "") for n in names)]
                )
                + "</tr>"
                for split, epoch, shown in self._epochs
            ]
            parts.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")
        parts.append("</div>")
        return "".join(parts)

    def text(self) -> str:
        """The current view as plain text, for front ends that do not show HTML."""
        lines = []
        for split, progress in self._progress.items():
            done, total = progress.progress.items_processed, progress.progress.items_total
            lines.append(
                f"[{split}] epoch {progress.epoch}/{progress.epoch_total} "
                f"iteration {progress.iteration} items {done}/{total}"
            )
        for split, epoch, shown in self._epochs:
            values = "".join(f" | {name} {value}" for name, value in shown.items())
            lines.append(f"[{split}] epoch {epoch} done{values}")
        return "\n".join(lines)

    def _show(self, force: bool) -> None:
        now = self._clock()
        if not force and self._last_shown is not None \
                and now - self._last_shown < self.refresh_seconds:  # fmt: skip
            return
        self._last_shown = now
        bundle = {"text/html": self.html(), "text/plain": self.text()}
        if self._handle is None:
            display = require("NotebookRenderer", "notebook", "IPython.display")
            self._handle = display.display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)


def _shown(update: MetricUpdate) -> str:
    """A metric's value at the end of an epoch: the number when numeric, else its text."""
    return f"{update.value:.4g}" if update.value is not None else update.entry.formatted
