"""The dashboard renderer: the learner's calls on one side, a textual app on the other.

The learner calls the renderer from its training thread; the app runs its own event loop
in a background thread. They share a :class:`DashboardState`: each call of the learner
is a few dictionary operations under a lock (a couple of microseconds), and the app
reads a copy of the state ten times a second. The training thread never waits for the
screen, which a ``call_from_thread`` per update would make it do (it blocks until the
UI's loop has run the call).

Textual's Linux driver installs signal handlers (SIGTSTP, SIGCONT, SIGWINCH, ...), and
Python allows that only in the main thread, which the learner keeps. The driver used
here skips those calls off the main thread and checks the terminal's size by polling
instead of SIGWINCH; the rest (raw mode, alternate screen, restoring the terminal) is
textual's own.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from textual import events
from textual.driver import Driver
from textual.geometry import Size

from ember.train.renderer.base import (
    MetricsRenderer,
    MetricUpdate,
    Split,
    TrainingInterrupter,
    TrainingProgress,
)
from ember.train.renderer.dashboard.app import DashboardApp
from ember.train.renderer.dashboard.state import DashboardState

_log = logging.getLogger(__name__)


class DashboardRenderer(MetricsRenderer):
    """Shows a run on a full-screen terminal dashboard (see :class:`DashboardApp`).

    The app starts with :meth:`bind` (or the first update) and ends with :meth:`close`,
    which restores the terminal; what the run printed meanwhile is written out then.

    Args:
        headless: run the app without a terminal (tests, captures).
        size: the screen's ``(width, height)`` when headless.
        poll_interval: seconds between two redraws.
        recent_points: iterations kept by the plots' recent history.
        clock: seconds as a float, for the speed and the ETA.
    """

    def __init__(self, *, headless: bool = False, size: tuple[int, int] | None = None,
                 poll_interval: float = 0.1, recent_points: int = 600,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.state = DashboardState(recent_points, clock)
        self.interrupter = TrainingInterrupter()
        self._headless = headless
        self._size = size
        self._poll_interval = poll_interval
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.app: DashboardApp | None = None
        #: what ended the app's thread with an error, if anything did
        self.error: BaseException | None = None

    # ---------------------------------------------------------------- the protocol
    def bind(self, interrupter: TrainingInterrupter) -> None:
        self.interrupter = interrupter
        if self.app is not None:
            self.app.interrupter = interrupter
        self.start()

    def update_train(self, update: MetricUpdate) -> None:
        self._update("train", update)

    def update_valid(self, update: MetricUpdate) -> None:
        self._update("valid", update)

    def render_train(self, progress: TrainingProgress) -> None:
        self._render("train", progress)

    def render_valid(self, progress: TrainingProgress) -> None:
        self._render("valid", progress)

    def on_epoch_end(self, split: Split, epoch: int) -> None:
        self.state.end_epoch(split, epoch)

    def close(self, timeout: float = 10.0) -> None:
        """Ends the app, waits for it to restore the terminal, then replays its prints."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self.state.close()
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            _log.warning("the dashboard did not stop within %.0f s", timeout)
            return
        assert self.app is not None
        for to_stderr, text in self.app.printed:
            (sys.stderr if to_stderr else sys.stdout).write(text)
        if self.error is not None:
            _log.error("the dashboard failed: %r", self.error)

    # -------------------------------------------------------------------- internals
    def start(self) -> None:
        """Starts the app's thread (once; :meth:`bind` and the first update call it)."""
        with self._start_lock:
            if self._thread is not None or self._closed:
                return
            driver = None if self._headless else _background_driver_class()
            self.app = DashboardApp(self.state, self.interrupter, self._poll_interval,
                                    driver_class=driver)  # fmt: skip
            self._thread = threading.Thread(target=self._run, name="ember-dashboard",
                                            daemon=True)  # fmt: skip
            self._thread.start()
        # a daemon thread dies with the interpreter: close first, or the terminal stays raw
        atexit.register(self.close)

    def _run(self) -> None:
        assert self.app is not None
        try:
            self.app.run(headless=self._headless, size=self._size, mouse=False)
        except BaseException as error:  # reported by close(); the run itself goes on
            self.error = error

    def _update(self, split: Split, update: MetricUpdate) -> None:
        if self._thread is None:
            self.start()
        self.state.update(split, update)

    def _render(self, split: Split, progress: TrainingProgress) -> None:
        if self._thread is None:
            self.start()
        self.state.render(split, progress)


# ------------------------------------------------------- textual off the main thread
class _MainThreadSignals:
    """The ``signal`` module, except that handlers are only installed from the main thread."""

    def __getattr__(self, name: str) -> Any:
        return getattr(signal, name)

    @staticmethod
    def signal(signum: int, handler: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            return signal.signal(signum, handler)
        return None


def _with_main_thread_signals(function: Callable) -> Callable:
    """A copy of ``function`` whose global ``signal`` is :class:`_MainThreadSignals`.

    Only the copy sees the replacement, so neither textual's module nor the process's
    ``signal`` module changes.
    """
    namespace = dict(function.__globals__, signal=_MainThreadSignals())
    copy = types.FunctionType(function.__code__, namespace, function.__name__,
                              function.__defaults__, function.__closure__)  # fmt: skip
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


_DRIVER: type[Driver] | None = None


def _background_driver_class() -> type[Driver] | None:
    """Textual's Linux driver made safe to start off the main thread (None elsewhere)."""
    global _DRIVER
    if _DRIVER is not None or sys.platform == "win32":
        return _DRIVER
    from textual.drivers.linux_driver import LinuxDriver

    class BackgroundLinuxDriver(LinuxDriver):
        __init__ = _with_main_thread_signals(LinuxDriver.__init__)
        disable_input = _with_main_thread_signals(LinuxDriver.disable_input)
        _start = _with_main_thread_signals(LinuxDriver.start_application_mode)

        def start_application_mode(self) -> None:
            self._start()
            if threading.current_thread() is not threading.main_thread():
                self._resize_watch = asyncio.get_running_loop().create_task(self._watch_size())

        def stop_application_mode(self) -> None:
            watch = getattr(self, "_resize_watch", None)
            if watch is not None:
                watch.cancel()
            super().stop_application_mode()

        async def _watch_size(self) -> None:
            # SIGWINCH only reaches the main thread, so the size is checked instead
            last = self._get_terminal_size()
            while True:
                await asyncio.sleep(0.25)
                with contextlib.suppress(OSError):
                    size = self._get_terminal_size()
                    if size != last:
                        last = size
                        self._app.post_message(events.Resize(Size(*size), Size(*size)))

    _DRIVER = BackgroundLinuxDriver
    return _DRIVER
