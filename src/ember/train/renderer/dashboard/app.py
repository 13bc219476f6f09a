"""The dashboard's screen: a textual app that polls a :class:`DashboardState` and draws it.

Layout: the plot of one numeric metric (training and validation on the same axes) with
the status beside it (split, epoch, iteration, speed, elapsed, ETA) and the text of every
metric below the status; two progress bars (the epoch's items, the whole run); a footer
with the keys.

Keys: left/right pick the plotted metric; up/down switch its history between the recent
iterations and the whole run by epoch; ``q`` (or ctrl+c, which the terminal hands to the
app instead of raising KeyboardInterrupt while the dashboard is up) asks the learner to
stop through the :class:`~ember.train.renderer.base.TrainingInterrupter`: the run ends
after the current iteration and its checkpoint, then the renderer closes the app.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.widgets import Label, ProgressBar, Static

from ember.train.renderer.base import TrainingInterrupter
from ember.train.renderer.dashboard.chart import LineChart, Series
from ember.train.renderer.dashboard.state import SPLITS, DashboardState, DashboardView

Window = Literal["recent", "epochs"]
WINDOWS: tuple[Window, ...] = ("recent", "epochs")
WINDOW_TITLES = {"recent": "recent iterations", "epochs": "whole run, by epoch"}
COLORS = {"train": "dodger_blue1", "valid": "dark_orange"}
SPLIT_NAMES = {"train": "Training", "valid": "Validation"}
KEYS_HELP = "←/→ metric   ↑/↓ history   q stop"
STOPPING = "stopping after the current iteration, writing a checkpoint..."


def duration(seconds: float | None) -> str:
    """``h:mm:ss`` (``--:--:--`` when unknown)."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--:--:--"
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def status_text(view: DashboardView) -> Text:
    """The status panel: where the run is and how fast it goes."""
    current = view.current
    text = Text()
    if current is None:
        return Text("waiting for the first iteration...", style="dim")
    speed = view.items_per_second
    rows = [
        ("Split", SPLIT_NAMES[view.split] if view.split else "-"),
        ("Epoch", f"{current.epoch}/{current.epoch_total}"),
        ("Iteration", str(current.iteration)),
        ("Items", f"{current.progress.items_processed}/{current.progress.items_total}"),
        ("Items/s", "-" if speed is None else f"{speed:.1f}"),
        ("Elapsed", duration(view.elapsed)),
        ("ETA", duration(view.eta)),
    ]
    for index, (key, value) in enumerate(rows):
        text.append(f"{key:<10}", style="bold")
        text.append(value + ("\n" if index < len(rows) - 1 else ""))
    return text


def metrics_text(view: DashboardView, width: int = 80) -> Text:
    """The text panel: every metric's formatted entry, by split, in ``width`` columns.

    An entry too long for the line after its name goes on the next line.
    """
    names = view.numeric_names + view.text_names
    if not names:
        return Text("no metric yet", style="dim")
    column = max(len(name) for name in names) + 2
    text = Text()
    for split in SPLITS:
        entries = [(n, view.texts[(split, n)]) for n in names if (split, n) in view.texts]
        if not entries:
            continue
        if text:
            text.append("\n")
        text.append(SPLIT_NAMES[split], style=f"bold {COLORS[split]}")
        for name, formatted in entries:
            if 2 + column + len(formatted) <= width:
                text.append(f"\n  {name:<{column}}", style="bold")
            else:
                text.append(f"\n  {name}", style="bold").append("\n    ")
            text.append(formatted)
    return text


class DashboardApp(App[None]):
    """The full-screen dashboard of a training run.

    Args:
        state: where the renderer writes the run; the app polls it every ``poll_interval``
            seconds and exits once the state is closed.
        interrupter: what the stop key triggers (a fresh one when the app runs alone).
        poll_interval: seconds between two reads of the state.
        driver_class: textual's driver (the renderer passes one that runs off the main
            thread); None lets textual choose.
    """

    TITLE = "ember"
    CSS = """
    Screen { layout: vertical; }
    #main { height: 1fr; }
    #plot-panel { width: 3fr; border: round $primary; padding: 0 1; }
    #side { width: 2fr; min-width: 30; }
    #status { height: auto; border: round $secondary; padding: 0 1; }
    #metrics { height: 1fr; border: round $secondary; padding: 0 1; }
    #bars { height: auto; border: round $secondary; padding: 0 1; }
    .bar-row { height: 1; }
    .bar-row Label { width: 8; }
    .bar-row ProgressBar { width: 1fr; }
    .bar-row Bar { width: 1fr; }
    #footer { height: 1; padding: 0 1; background: $panel; }
    #footer.stopping { background: $warning; color: $text; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "metric(-1)", "previous metric", show=False),
        Binding("right", "metric(1)", "next metric", show=False),
        Binding("up", "window(-1)", "history window", show=False),
        Binding("down", "window(1)", "history window", show=False),
        Binding("q", "stop", "stop", show=False),
        # the terminal is in raw mode: ctrl+c and ctrl+q arrive as keys, and closing the
        # app behind the learner's back would leave the run without a screen
        Binding("ctrl+c", "stop", "stop", show=False, priority=True),
        Binding("ctrl+q", "stop", "stop", show=False, priority=True),
    ]

    def __init__(self, state: DashboardState, interrupter: TrainingInterrupter | None = None,
                 poll_interval: float = 0.1, driver_class: type[Driver] | None = None) -> None:  # fmt: skip
        super().__init__(driver_class=driver_class)
        self.state = state
        self.interrupter = interrupter if interrupter is not None else TrainingInterrupter()
        self.poll_interval = poll_interval
        self.selected: str | None = None
        self.window: Window = "recent"
        self.stopping = False
        self._drawn: tuple[int, str | None, Window, int] | None = None
        #: what the run printed while the screen was taken: ``(to_stderr, text)``
        self.printed: list[tuple[bool, str]] = []

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="plot-panel"):
                yield LineChart(id="chart")
            with Vertical(id="side"):
                yield Static(id="status")
                yield Static(id="metrics")
        with Vertical(id="bars"):
            with Horizontal(classes="bar-row"):
                yield Label("Epoch")
                yield ProgressBar(total=1.0, show_eta=False, id="epoch-bar")
            with Horizontal(classes="bar-row"):
                yield Label("Run")
                yield ProgressBar(total=1.0, show_eta=False, id="run-bar")
        yield Static(KEYS_HELP, id="footer")

    def on_mount(self) -> None:
        self.query_one("#status", Static).border_title = "Status"
        self.query_one("#metrics", Static).border_title = "Metrics"
        self.query_one("#bars").border_title = "Progress"
        if not self.is_headless:
            # textual swallows prints while it runs; keep them to show after the run
            self.begin_capture_print(self, stdout=True, stderr=True)
        self.poll()
        self.set_interval(self.poll_interval, self.poll)

    def on_print(self, event: events.Print) -> None:
        self.printed.append((event.stderr, event.text))

    # -------------------------------------------------------------------- drawing
    @property
    def chart(self) -> LineChart:
        return self.query_one("#chart", LineChart)

    def poll(self) -> None:
        """Reads the state and redraws what changed; exits when the run is over."""
        view = self.state.snapshot()
        if view.closed:
            self.exit()
            return
        if self.selected not in view.numeric_names:
            self.selected = view.numeric_names[0] if view.numeric_names else None
        try:
            status = self.query_one("#status", Static)
        except NoMatches:  # a timer's last tick while the app shuts down
            return
        text = status_text(view)
        if text != status.content:  # the clock moves even when the run does not
            status.update(text)
        metrics = self.query_one("#metrics", Static)
        # the panel's width is known after the first layout, and changes with the terminal
        key = (view.version, self.selected, self.window, metrics.content_size.width)
        if key == self._drawn:
            return
        self._drawn = key
        metrics.update(metrics_text(view, metrics.content_size.width or 80))
        self.query_one("#epoch-bar", ProgressBar).update(progress=view.epoch_fraction)
        self.query_one("#run-bar", ProgressBar).update(progress=view.run_fraction)
        self._draw_chart(view)

    def _draw_chart(self, view: DashboardView) -> None:
        panel = self.query_one("#plot-panel")
        if self.selected is None:
            panel.border_title = "no numeric metric yet"
            self.chart.plot([], empty_message="the numeric metrics are plotted here")
            return
        histories = {split: view.history(split, self.selected) for split in SPLITS}
        # validation has fewer iterations per epoch, so its recent points reach further
        # back: the training window sets the x range both are shown in
        start = histories["train"].recent[0][0] if histories["train"].recent else float("-inf")
        series = []
        for split, history in histories.items():
            if self.window == "recent":
                points = tuple(point for point in history.recent if point[0] >= start)
            else:
                points = history.epochs
            if points:
                series.append(Series(split, points, COLORS[split]))
        position = view.numeric_names.index(self.selected) + 1
        panel.border_title = (
            f"{self.selected} · {WINDOW_TITLES[self.window]} ({position}/{len(view.numeric_names)})"
        )
        legend = Text()
        for line in series:
            legend.append(" ━ ", style=line.color).append(line.label)
        panel.border_subtitle = legend
        x_format = (lambda x: f"epoch {x:.2f}") if self.window == "recent" else (
            lambda x: f"epoch {x:.0f}")  # fmt: skip
        self.chart.plot(series, x_format, empty_message=f"no {self.selected} value yet")

    # -------------------------------------------------------------------- actions
    def action_metric(self, step: int) -> None:
        names = self.state.snapshot().numeric_names
        if names:
            index = names.index(self.selected) if self.selected in names else 0
            self.selected = names[(index + step) % len(names)]
            self.poll()

    def action_window(self, step: int) -> None:
        self.window = WINDOWS[(WINDOWS.index(self.window) + step) % len(WINDOWS)]
        self.poll()

    def action_stop(self) -> None:
        self.interrupter.stop()
        self.stopping = True
        footer = self.query_one("#footer", Static)
        footer.update(STOPPING)
        footer.add_class("stopping")
