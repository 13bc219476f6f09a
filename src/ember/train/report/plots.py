"""One PNG chart per numeric metric, drawn with matplotlib.

Train and valid share the chart of a metric. The x axis counts epochs: the epoch values
(what the summary shows) are points joined by lines at ``x = epoch``; the per-step
values, where the metric was logged, are a faint line of the same colour, iteration
``i`` of ``n`` in epoch ``e`` at ``x = e - 1 + i / n``, so an epoch's batches lead up to
its point.

matplotlib is used through its object API (``Figure`` renders with the Agg canvas, no
pyplot): no global state, no GUI backend, safe beside a running dashboard. Text from the
files (the metric's name) is drawn with ``parse_math=False``, so a ``$`` in a name is a
dollar sign, not mathtext.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT, DPI = 8.0, 4.5, 100
"""The chart size in inches and its resolution: 800 x 450 pixels."""
SIZE = (int(WIDTH * DPI), int(HEIGHT * DPI))
"""The charts' size in pixels, (width, height)."""
COLORS = {"train": "#1f77b4", "valid": "#ff7f0e"}
LARGEST = 1e100
"""Values of a larger magnitude are left out of a chart (gaps, with a note): matplotlib
cannot lay out ticks over a range near the float limit, and no metric has such values."""


@dataclass(frozen=True)
class Curve:
    """One split's values of a metric: epoch values and (optionally) per-step values."""

    split: str
    epochs: tuple[list[float], list[float]]
    steps: tuple[list[float], list[float]] | None = None


def _drawable(values: Sequence[float]) -> tuple[list[float], int]:
    """``values`` with NaN for the non-finite and those beyond :data:`LARGEST`, and the
    count of the latter."""
    drawn, too_large = [], 0
    for value in values:
        if math.isfinite(value) and abs(value) <= LARGEST:
            drawn.append(value)
        else:
            too_large += math.isfinite(value) or math.isinf(value)
            drawn.append(math.nan)
    return drawn, too_large


def plot_metric(name: str, curves: Sequence[Curve]) -> bytes:
    """The PNG (:data:`SIZE` pixels) of metric ``name``'s curves."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI)
    # Fixed margins rather than a layout engine: half the drawing time, and the charts'
    # labels are short (long tick labels use matplotlib's offset notation).
    figure.subplots_adjust(left=0.09, right=0.98, bottom=0.11, top=0.92)
    axes = figure.add_subplot()
    left_out = 0
    for curve in curves:
        color = COLORS.get(curve.split, "#2ca02c")
        if curve.steps is not None and curve.steps[0]:
            xs, ys = curve.steps
            drawn, too_large = _drawable(ys)
            left_out += too_large
            axes.plot(xs, drawn, color=color, alpha=0.35, linewidth=0.8,
                      label=f"{curve.split} (batches)")  # fmt: skip
        if curve.epochs[0]:
            xs, ys = curve.epochs
            drawn, too_large = _drawable(ys)
            left_out += too_large
            axes.plot(xs, drawn, color=color, marker="o", markersize=4,
                      linewidth=1.8, label=f"{curve.split} (epoch)")  # fmt: skip
    axes.set_title(name, parse_math=False)
    axes.set_xlabel("epoch")
    axes.set_ylabel(name, parse_math=False)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    if any(curve.steps is not None and curve.steps[0] for curve in curves):
        axes.set_xlim(left=0)  # the first epoch's batches start after 0
    axes.grid(alpha=0.3)
    if axes.lines:
        axes.legend(loc="best")
    if left_out:
        axes.text(0.01, 0.01, f"{left_out} infinite values or beyond ±{LARGEST:g} left out",
                  transform=axes.transAxes, fontsize=8, color="#b00020")  # fmt: skip
    buffer = io.BytesIO()
    # No Software / date metadata: the same values give the same bytes.
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
