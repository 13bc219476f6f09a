"""The report page opened in headless Chromium (Debian's package): no console message,
and a screenshot kept as a test artifact.

How Chromium is driven: its own command line, ``--headless --screenshot`` with
``--enable-logging=stderr``, which writes every console message of the page (console
calls and uncaught exceptions) to standard error as ``INFO:CONSOLE`` lines. That is
the simplest way that can see console errors: no WebDriver, no chromedriver package, no
Python dependency. Its log does not give a message's level, so any console message
fails the test (the page runs no script; a message is a defect either way), and it
does not log failed resource loads, so :func:`test_report_page_loads_nothing` checks
statically that the page references nothing outside itself. A control page that
errors on purpose proves the detection works.

The screenshot goes to ``$EMBER_TEST_ARTIFACTS/report/`` when that variable is set,
else to the pytest run's base temporary folder (kept for the last runs; its path is
printed). The test skips, saying why, where ``/usr/bin/chromium`` is missing
(``apt-get install chromium``).
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from report_support import TRAIN_COLOR, VALID_COLOR, StrictPage, short_fit

CHROMIUM = "/usr/bin/chromium"
WINDOW = (1000, 2200)
FLAGS = [  # headless and offline: without these it waits on network lookups
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
]  # fmt: skip
CONSOLE = re.compile(r":CONSOLE(?:\(\d+\)|:\d+)\] (.*)")

if not os.path.exists(CHROMIUM):
    reason = f"{CHROMIUM} is missing (Debian: apt-get install chromium); the browser check is skipped"
    print(reason)
    pytest.skip(reason, allow_module_level=True)
Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")


def open_in_chromium(page: Path, screenshot: Path) -> list[str]:
    """Renders ``page``, saves a screenshot, and returns the console messages it logged."""
    with tempfile.TemporaryDirectory(prefix="ember-chromium-") as profile:
        done = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={screenshot}",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert screenshot.is_file(), f"no screenshot (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return [match.group(1) for match in CONSOLE.finditer(done.stderr)]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    root = os.environ.get("EMBER_TEST_ARTIFACTS")
    folder = (Path(root) if root else tmp_path_factory.getbasetemp() / "artifacts") / "report"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> Path:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the 'report' extra (matplotlib) is not installed; the test command installs it")
    artifact = tmp_path_factory.mktemp("browser") / "run"
    short_fit(artifact)
    (artifact / "config.json").write_text('{"lr": 0.05, "note": "<b>escaped</b>"}')
    from ember.train.report import write_report

    return write_report(artifact)


def test_the_detector_sees_console_errors(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>x</title></head>'
                    "<body><script>console.error('on purpose'); undefinedFunction();</script>"
                    "</body></html>")  # fmt: skip
    messages = open_in_chromium(page, tmp_path / "broken.png")
    assert len(messages) == 2, messages
    assert '"on purpose"' in messages[0] and "undefinedFunction is not defined" in messages[1]


def test_report_page_loads_nothing(report_page):
    page = StrictPage(report_page.read_text(encoding="utf-8"))
    for tag, attrs in page.tags:
        for attribute in ("src", "href", "srcset", "data", "action", "poster"):
            value = attrs.get(attribute)
            assert value is None or value.startswith("data:"), (tag, attribute, value)
    assert "url(" not in "".join(page.text.get("style", []))


def test_report_renders_without_console_messages(report_page, artifacts):
    screenshot = artifacts / "report-screenshot.png"
    shutil.copy(report_page, artifacts / "index.html")
    messages = open_in_chromium(report_page, screenshot)
    print(f"screenshot of the report: {screenshot}")
    assert messages == []
    image = Image.open(io.BytesIO(screenshot.read_bytes())).convert("RGB")
    assert image.size == WINDOW
    colors = {color for _, color in image.getcolors(maxcolors=image.width * image.height)}
    assert TRAIN_COLOR in colors and VALID_COLOR in colors  # the charts were drawn
