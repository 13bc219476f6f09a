"""The dashboard as text: a sample run drawn headless, for documents and bug reports.

Run ``python -m ember.train.renderer.dashboard.capture [WIDTH HEIGHT]`` to print it.
"""

from __future__ import annotations

import asyncio
import io
import math
import sys

from rich.console import Console

from ember.train.metric.base import MetricEntry, Progress
from ember.train.renderer.base import MetricUpdate, TrainingProgress
from ember.train.renderer.dashboard.app import DashboardApp
from ember.train.renderer.dashboard.state import DashboardState


class _Clock:
    """A clock that the sample run advances by hand, so the capture is reproducible."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sample_state(epochs_done: int = 2, epoch_total: int = 5, iterations: int = 40,
                 batch_size: int = 32) -> DashboardState:  # fmt: skip
    """A run in its epoch ``epochs_done + 1``, halfway through: loss, accuracy, a text metric."""
    clock = _Clock()
    state = DashboardState(clock=clock)
    total = iterations * batch_size

    def report(split, epoch: int, iteration: int, shift: float) -> None:
        step = (epoch - 1) * iterations + iteration
        loss = 2.3 * math.exp(-step / 45.0) + 0.08 + shift + 0.04 * math.sin(step)
        accuracy = 100.0 * (1.0 - math.exp(-step / 30.0)) * 0.97 - 40 * shift
        for name, value, unit in (("Loss", loss, ""), ("Accuracy", accuracy, " %")):
            entry = MetricEntry(name, f"epoch {value:.3f}{unit} - batch {value:.3f}{unit}",
                                repr(value))  # fmt: skip
            state.update(split, MetricUpdate(entry, value))
        device = MetricEntry("Device", "cpu (ndarray)", "cpu")
        state.update(split, MetricUpdate(device))
        items = min(iteration * batch_size, total)
        state.render(split, TrainingProgress(Progress(items, total), epoch, epoch_total, iteration))
        clock.now += 0.05

    for epoch in range(1, epochs_done + 1):
        for iteration in range(1, iterations + 1):
            report("train", epoch, iteration, 0.0)
        state.end_epoch("train", epoch)
        for iteration in range(1, iterations // 4 + 1):
            report("valid", epoch, iteration * 4, 0.05)
        state.end_epoch("valid", epoch)
    for iteration in range(1, iterations // 2 + 1):
        report("train", epochs_done + 1, iteration, 0.0)
    return state


async def _capture(state: DashboardState, width: int, height: int,
                   keys: tuple[str, ...]) -> str:  # fmt: skip
    app = DashboardApp(state)
    async with app.run_test(size=(width, height)) as pilot:
        await pilot.press(*keys)
        await pilot.pause()
        app.poll()  # a last draw at the laid-out size, without waiting for the timer
        await pilot.pause()
        console = Console(width=width, height=height, file=io.StringIO(), record=True,
                          color_system=None, legacy_windows=False)  # fmt: skip
        # the compositor's full frame, as App.export_screenshot draws it before its SVG
        console.print(app.screen._compositor.render_update(full=True))
        return console.export_text()


def capture(width: int = 100, height: int = 30, keys: tuple[str, ...] = (),
            state: DashboardState | None = None) -> str:  # fmt: skip
    """The dashboard of ``state`` (a sample run by default) as plain text, after ``keys``.

    Example:
        >>> text = capture(90, 26)
        >>> "Loss · recent iterations" in text, "Epoch     3/5" in text
        (True, True)
    """
    return asyncio.run(_capture(state or sample_state(), width, height, keys))


if __name__ == "__main__":
    size = [int(arg) for arg in sys.argv[1:3]]
    print(capture(size[0] if size else 100, size[1] if len(size) > 1 else 30))
