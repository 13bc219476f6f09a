"""The training dashboard: its state, its chart, the app driven headless, the renderer's threads."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from textual.widgets import ProgressBar, Static

from ember.backend.errors import ArgumentError
from ember.train.metric.base import MetricEntry, Progress
from ember.train.renderer.base import MetricUpdate, TrainingInterrupter, TrainingProgress
from ember.train.renderer.dashboard.app import STOPPING, DashboardApp
from ember.train.renderer.dashboard.capture import capture
from ember.train.renderer.dashboard.chart import LineChart, Series, braille_lines
from ember.train.renderer.dashboard.renderer import DashboardRenderer
from ember.train.renderer.dashboard.state import DashboardState


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def numeric(name: str, value: float) -> MetricUpdate:
    return MetricUpdate(MetricEntry(name, f"epoch {value:.2f}", repr(value)), value)


def text(name: str, formatted: str) -> MetricUpdate:
    return MetricUpdate(MetricEntry(name, formatted, formatted))


def progress(done: int, total: int, epoch: int, epochs: int, iteration: int) -> TrainingProgress:
    return TrainingProgress(Progress(done, total), epoch, epochs, iteration)


def feed_run(state: DashboardState, clock: FakeClock | None = None) -> None:
    """Two epochs of 4 training iterations (8 items each) and 2 validation iterations,
    then 2 iterations of epoch 3; Loss is 10 * epoch + iteration, Accuracy its negative."""
    for epoch in (1, 2, 3):
        for iteration in range(1, 5 if epoch < 3 else 3):
            value = 10.0 * epoch + iteration
            state.update("train", numeric("Loss", value))
            state.update("train", numeric("Accuracy", -value))
            state.update("train", text("Device", "cpu"))
            state.render("train", progress(8 * iteration, 32, epoch, 3, iteration))
            if clock is not None:
                clock.now += 2.0
        if epoch == 3:
            break
        state.end_epoch("train", epoch)
        for iteration in (1, 2):
            state.update("valid", numeric("Loss", 100.0 * epoch + iteration))
            state.render("valid", progress(5 * iteration, 10, epoch, 3, iteration))
        state.end_epoch("valid", epoch)


# ------------------------------------------------------------------------- state
def test_state_places_points_on_the_epoch_axis():
    state = DashboardState(clock=FakeClock())
    feed_run(state)
    view = state.snapshot()
    assert view.numeric_names == ("Loss", "Accuracy")
    assert view.text_names == ("Device",)
    train = view.history("train", "Loss")
    assert train.recent == (
        (0.25, 11.0), (0.5, 12.0), (0.75, 13.0), (1.0, 14.0),
        (1.25, 21.0), (1.5, 22.0), (1.75, 23.0), (2.0, 24.0),
        (2.25, 31.0), (2.5, 32.0),
    )  # fmt: skip
    # one point per epoch: the value at its last iteration (the epoch's running mean)
    assert train.epochs == ((1.0, 14.0), (2.0, 24.0), (3.0, 32.0))
    valid = view.history("valid", "Loss")
    assert valid.recent == ((0.5, 101.0), (1.0, 102.0), (1.5, 201.0), (2.0, 202.0))
    assert valid.epochs == ((1.0, 102.0), (2.0, 202.0))
    assert view.history("valid", "Accuracy").recent == ()
    assert view.texts[("train", "Device")] == "cpu"
    assert view.texts[("valid", "Loss")] == "epoch 202.00"
    assert view.split == "train" and view.current == progress(16, 32, 3, 3, 2)


def test_state_recent_history_keeps_the_last_points():
    state = DashboardState(recent_points=3, clock=FakeClock())
    feed_run(state)
    assert state.snapshot().history("train", "Loss").recent == (
        (2.0, 24.0),
        (2.25, 31.0),
        (2.5, 32.0),
    )
    # the epochs' history is not bounded by the recent window
    assert len(state.snapshot().history("train", "Loss").epochs) == 3


def test_state_speed_elapsed_and_eta_follow_the_clock():
    clock = FakeClock()
    state = DashboardState(clock=clock)
    state.render("train", progress(8, 32, 1, 2, 1))  # the run starts, at 100 s
    clock.now = 104.0
    state.render("train", progress(16, 32, 1, 2, 2))
    view = state.snapshot()
    assert view.elapsed == 4.0
    assert view.items_per_second == 16 / 4.0
    assert view.epoch_fraction == 0.5
    assert view.run_fraction == 0.25  # half of epoch 1 of 2
    assert view.eta == 12.0  # a quarter took 4 s
    # a new split's epoch restarts the speed measurement
    clock.now = 110.0
    state.render("valid", progress(4, 8, 1, 2, 1))
    clock.now = 112.0
    view = state.snapshot()
    assert view.items_per_second == 4 / 2.0
    assert view.run_fraction == 0.25  # the run is counted in training epochs


def test_state_rejects_a_recent_window_too_small_to_draw():
    with pytest.raises(ArgumentError, match=r"recent_points must be at least 2 .* got 1"):
        DashboardState(recent_points=1)


# ------------------------------------------------------------------------- chart
def test_braille_lines_draw_dots_where_the_points_are():
    # a cell is 2 x 4 dots; dot bits (row, column): (0,0)=1 (1,0)=2 (2,0)=4 (3,0)=0x40,
    # (0,1)=8 (1,1)=0x10 (2,1)=0x20 (3,1)=0x80
    top = Series("top", ((0.0, 1.0), (1.0, 1.0)), "red")
    rows = braille_lines([top], 3, 2, (0.0, 1.0), (0.0, 1.0))
    assert [row.plain for row in rows] == [chr(0x2809) * 3, chr(0x2800) * 3]
    vertical = Series("v", ((0.0, 0.0), (0.0, 1.0)), "red")
    rows = braille_lines([vertical], 2, 1, (0.0, 1.0), (0.0, 1.0))
    assert rows[0].plain == chr(0x2800 + 0x47) + chr(0x2800)
    # the diagonal of one cell: bottom-left dot to top-right dot, through the middle
    diagonal = Series("d", ((0.0, 0.0), (1.0, 1.0)), "red")
    rows = braille_lines([diagonal], 1, 1, (0.0, 1.0), (0.0, 1.0))
    assert rows[0].plain in {chr(0x2800 + 0x40 + 0x04 + 0x10 + 0x08),
                             chr(0x2800 + 0x40 + 0x02 + 0x20 + 0x08)}  # fmt: skip


def test_braille_lines_color_cells_by_the_series_drawn_last_and_break_at_nan():
    low = Series("low", ((0.0, 0.0), (1.0, 0.0)), "blue")
    high = Series("high", ((0.0, 1.0), (1.0, 1.0)), "red")
    rows = braille_lines([low, high], 2, 1, (0.0, 1.0), (0.0, 1.0))
    assert rows[0].plain == chr(0x2800 + 0x01 + 0x08 + 0x40 + 0x80) * 2  # top and bottom rows
    assert {str(span.style) for span in rows[0].spans} == {"red"}
    broken = Series("gap", ((0.0, 1.0), (0.5, float("nan")), (1.0, 1.0)), "red")
    rows = braille_lines([broken], 4, 1, (0.0, 1.0), (0.0, 1.0))
    assert rows[0].plain == chr(0x2801) + chr(0x2800) * 2 + chr(0x2808)


# ------------------------------------------------------------------- app, headless
async def _drive_app(state: DashboardState, interrupter: TrainingInterrupter) -> dict:
    seen: dict = {}
    app = DashboardApp(state, interrupter, poll_interval=0.05)
    async with app.run_test(size=(110, 32)) as pilot:
        await pilot.pause()
        chart = app.query_one("#chart", LineChart)
        panel = app.query_one("#plot-panel")
        seen["status"] = app.query_one("#status", Static).content.plain
        seen["metrics"] = app.query_one("#metrics", Static).content.plain
        seen["start"] = (app.selected, app.window, str(panel.border_title), chart.series)
        seen["bars"] = (app.query_one("#epoch-bar", ProgressBar).progress,
                        app.query_one("#run-bar", ProgressBar).progress)  # fmt: skip
        await pilot.press("right")
        seen["right"] = (app.selected, str(panel.border_title), chart.series)
        await pilot.press("left", "down")
        seen["down"] = (app.selected, app.window, str(panel.border_title), chart.series)
        await pilot.press("up")
        seen["up"] = app.window
        seen["before_q"] = interrupter.should_stop()
        await pilot.press("q")
        await pilot.pause()
        seen["footer"] = str(app.query_one("#footer", Static).content)
        seen["running_after_q"] = app.is_running
        state.close()  # what the renderer's close() does: the app exits at its next poll
        for _ in range(200):
            if not app.is_running:
                break
            await asyncio.sleep(0.01)
        seen["running_after_close"] = app.is_running
    return seen


def test_app_shows_the_run_and_reacts_to_the_keys():
    clock = FakeClock()
    state = DashboardState(clock=clock)
    feed_run(state, clock)
    interrupter = TrainingInterrupter()
    seen = asyncio.run(_drive_app(state, interrupter))

    status = seen["status"].splitlines()
    assert status[0].split() == ["Split", "Training"]
    assert status[1].split() == ["Epoch", "3/3"]
    assert status[2].split() == ["Iteration", "2"]
    assert status[3].split() == ["Items", "16/32"]
    # epoch 3 began at the first of the 10 renders (at 100 + 2 * 8 s); the clock now
    # reads 100 + 2 * 10, so 16 items took 4 s
    assert status[4].split() == ["Items/s", "4.0"]
    assert status[5].split() == ["Elapsed", "0:00:20"]
    assert status[6].split() == ["ETA", "0:00:04"]  # 2.5 of 3 epochs took 20 s
    for name in ("Loss", "Accuracy", "Device", "Training", "Validation", "epoch 202.00"):
        assert name in seen["metrics"]
    assert seen["bars"] == (0.5, 2.5 / 3)

    selected, window, title, series = seen["start"]
    assert (selected, window) == ("Loss", "recent")
    assert title.startswith("Loss · recent iterations")
    assert [line.label for line in series] == ["train", "valid"]
    assert series[0].points[-1] == (2.5, 32.0) and len(series[0].points) == 10
    assert series[1].points == ((0.5, 101.0), (1.0, 102.0), (1.5, 201.0), (2.0, 202.0))

    selected, title, series = seen["right"]
    assert selected == "Accuracy" and title.startswith("Accuracy · recent")
    assert [line.label for line in series] == ["train"]  # no validation accuracy
    assert series[0].points[0] == (0.25, -11.0)

    selected, window, title, series = seen["down"]
    assert (selected, window) == ("Loss", "epochs")
    assert "whole run, by epoch" in title
    assert series[0].points == ((1.0, 14.0), (2.0, 24.0), (3.0, 32.0))
    assert series[1].points == ((1.0, 102.0), (2.0, 202.0))
    assert seen["up"] == "recent"

    assert seen["before_q"] is False and interrupter.should_stop()
    assert seen["footer"] == STOPPING
    assert seen["running_after_q"] is True  # q asks the learner; the app waits for close()
    assert seen["running_after_close"] is False


async def _empty_app(interrupter: TrainingInterrupter) -> tuple[str, str]:
    app = DashboardApp(DashboardState(), interrupter, poll_interval=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("right", "down")  # no metric: nothing to switch, nothing fails
        shown = (
            app.query_one("#status", Static).content.plain,
            str(app.query_one("#plot-panel").border_title),
        )
        # the terminal is raw while the app runs: ctrl+c is a key, and it stops the run
        await pilot.press("ctrl+c")
        return shown


def test_app_waits_for_the_first_iteration_and_stops_on_ctrl_c():
    interrupter = TrainingInterrupter()
    status, title = asyncio.run(_empty_app(interrupter))
    assert status == "waiting for the first iteration..."
    assert title == "no numeric metric yet"
    assert interrupter.should_stop()


async def _recent_window_of(state: DashboardState) -> tuple[Series, ...]:
    app = DashboardApp(state, poll_interval=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        return app.query_one("#chart", LineChart).series


def test_app_shows_validation_only_within_the_training_window():
    state = DashboardState(recent_points=4, clock=FakeClock())
    feed_run(state)  # training keeps x in [1.75, 2.5]; validation [0.5, 2.0]
    series = asyncio.run(_recent_window_of(state))
    assert series[0].points == ((1.75, 23.0), (2.0, 24.0), (2.25, 31.0), (2.5, 32.0))
    assert series[1].points == ((2.0, 202.0),)


def test_capture_draws_the_sample_run_as_text():
    screen = capture(90, 26)
    lines = screen.splitlines()
    assert len(lines) == 26 and all(len(line) <= 90 for line in lines)
    assert "Loss · recent iterations (1/2)" in screen
    assert "Epoch     3/5" in screen and "Progress" in screen and "q stop" in screen
    after = capture(90, 26, keys=("right", "down", "q"))
    assert "Accuracy · whole run, by epoch (2/2)" in after
    assert STOPPING in after


# ----------------------------------------------------------------- the renderer
def test_renderer_is_safe_to_call_from_another_thread():
    renderer = DashboardRenderer(headless=True, size=(90, 26), poll_interval=0.005)
    interrupter = TrainingInterrupter()
    renderer.bind(interrupter)
    failures: list[BaseException] = []

    def train() -> None:
        try:
            for epoch in (1, 2):
                for iteration in range(1, 501):
                    renderer.update_train(numeric("Loss", epoch * 1000.0 + iteration))
                    renderer.update_train(text("Note", f"it {iteration}"))
                    renderer.render_train(progress(iteration, 500, epoch, 2, iteration))
                    if iteration % 50 == 0:
                        time.sleep(0.002)  # let the app's polls fall between iterations
                renderer.on_epoch_end("train", epoch)
                renderer.update_valid(numeric("Loss", -epoch))
                renderer.render_valid(progress(1, 1, epoch, 2, 1))
                renderer.on_epoch_end("valid", epoch)
        except BaseException as error:
            failures.append(error)

    app = renderer.app
    assert app is not None and app.interrupter is interrupter
    deadline = time.monotonic() + 30
    while not app.is_running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert app.is_running  # the app polls the state while the worker writes it
    worker = threading.Thread(target=train)
    worker.start()
    worker.join(60)
    while app.selected is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert app.selected == "Loss"  # the app has read the state the worker wrote
    renderer.close()
    renderer.close()  # a second close does nothing
    assert failures == [] and renderer.error is None
    assert not renderer._thread.is_alive() and not app.is_running
    view = renderer.state.snapshot()
    assert view.closed and view.current == progress(1, 1, 2, 2, 1)
    loss = view.history("train", "Loss")
    assert len(loss.recent) == 600 and loss.recent[-1] == (2.0, 2500.0)
    assert loss.epochs == ((1.0, 1500.0), (2.0, 2500.0))
    assert view.history("valid", "Loss").epochs == ((1.0, -1.0), (2.0, -2.0))
    assert view.texts[("train", "Note")] == "it 500"


def test_renderer_close_without_a_run_does_not_start_the_app():
    renderer = DashboardRenderer(headless=True)
    renderer.close()
    renderer.update_train(numeric("Loss", 1.0))  # after close: recorded, nothing started
    assert renderer.app is None and renderer._thread is None


_IN_A_TERMINAL = textwrap.dedent("""
    import sys, termios, time
    from ember.train.metric.base import MetricEntry, Progress
    from ember.train.renderer.base import MetricUpdate, TrainingInterrupter, TrainingProgress
    from ember.train.renderer.dashboard.renderer import DashboardRenderer

    before = termios.tcgetattr(0)
    renderer, interrupter = DashboardRenderer(poll_interval=0.02), TrainingInterrupter()
    renderer.bind(interrupter)
    iteration = 0
    deadline = time.monotonic() + 20
    while not interrupter.should_stop() and time.monotonic() < deadline:
        iteration += 1
        renderer.update_train(MetricUpdate(MetricEntry("Loss", "x", "1"), 1.0 / iteration))
        renderer.render_train(TrainingProgress(Progress(iteration, 10**6), 1, 1, iteration))
        time.sleep(0.005)
    print("printed during the run")
    renderer.close()
    restored = termios.tcgetattr(0) == before
    print(f"RESULT stopped={interrupter.should_stop()} restored={restored} error={renderer.error}")
""")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_renderer_in_a_real_terminal_stops_on_q_and_restores_the_terminal():
    import pty

    leader, follower = pty.openpty()
    child = subprocess.Popen([sys.executable, "-c", _IN_A_TERMINAL], stdin=follower,
                             stdout=follower, stderr=follower, close_fds=True,
                             env={**os.environ, "TERM": "xterm-256color"})  # fmt: skip
    os.close(follower)
    output = b""

    def read_until(marker: bytes, seconds: float) -> None:
        nonlocal output
        deadline = time.monotonic() + seconds
        while marker not in output and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.05)[0]:
                try:
                    output += os.read(leader, 1 << 16)
                except OSError:  # the child closed the terminal
                    return

    try:
        read_until(b"Loss", 30)  # the dashboard drew the metric
        os.write(leader, b"q")
        read_until(b"RESULT", 30)
        child.wait(30)
    finally:
        child.kill()
        os.close(leader)
    screen = output.decode("utf-8", "replace")
    assert "\x1b[?1049h" in screen  # the alternate screen was entered...
    assert screen.rfind("\x1b[?1049l") > screen.rfind("\x1b[?1049h")  # ...and left
    # (the footer's stop message is checked headless: here the app may close before it paints)
    after = screen[screen.rfind("\x1b[?1049l") :]
    assert "printed during the run" in after  # replayed once the screen was given back
    assert "RESULT stopped=True restored=True error=None" in after
