"""The digit page (examples/web) in a real browser.

Headless Chromium (Debian's, installed here when missing) opens the page from a local HTTP
server; onnxruntime-web runs the guide's model, exported to ONNX, on ten MNIST test digits,
and the page's scores, probabilities and predictions must equal ember's for the same digits.
The model is a small guide model trained for one epoch on a few hundred digits: the check is
about the export and the page's preprocessing, not accuracy. A screenshot of the page is
written to $EMBER_TEST_ARTIFACTS (else the test's tmp folder) and its path printed.

Selenium drives the browser: a pip package of the test extras speaking WebDriver to Debian's
chromedriver, which comes from the same source package as Debian's chromium and so always
matches its version (playwright-core pins its own Chromium revision and would need a second
npm install).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.data.dataset.transform.partial import PartialDataset
from ember.data.vision.mnist import MnistDataset, MnistItem
from ember.guide.data import MnistBatcher
from ember.guide.inference import load_trained
from ember.guide.model import ModelConfig
from ember.guide.training import TrainingConfig, train
from ember.optim.adam import AdamConfig
from ember.tensor.activation import softmax
from ember.train.renderer.plain import PlainRenderer

webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the test extras)")

WEB = Path(__file__).parents[2] / "examples" / "web"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
COUNT = 10

# Without these, headless Chromium in a closed network waits on lookups and updates.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1000,860",
)  # fmt: skip


def load_build_script():
    spec = importlib.util.spec_from_file_location("web_build", WEB / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def skip(reason: str):
    print(f"test_web_page skipped: {reason}")
    pytest.skip(reason)


def ensure_chromium() -> None:
    """Installs Debian's chromium and chromium-driver when missing (apt-get, as root); once
    they are there, this costs two file checks."""
    if CHROMIUM.is_file() and CHROMEDRIVER.is_file():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        skip("chromium and chromedriver are not installed and apt-get is unavailable "
             "(needs Debian and root): apt-get install chromium chromium-driver")  # fmt: skip
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Another test worker may be installing them too: wait for its lock rather than fail.
    apt = ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=300"]
    install = [*apt, "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"]
    done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # stale or missing package lists: refresh them once
        subprocess.run([*apt, "update"], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        skip(f"apt-get could not install chromium: {done.stderr.strip()[-500:]}")


def ensure_vendored(build) -> None:
    """onnxruntime-web in examples/web/vendor (npm; once, then vendor.sh returns at once)."""
    if shutil.which("npm") is None and not (WEB / "vendor" / ".lock-sha256").is_file():
        skip("npm is not installed, so onnxruntime-web cannot be vendored (Node.js 18+)")
    build.vendor()


@pytest.fixture(scope="module")
def build():
    """examples/web/build.py, once Chromium and onnxruntime-web are there (else a skip)."""
    build = load_build_script()
    ensure_chromium()
    ensure_vendored(build)
    return build


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """A guide artifact folder with a small model trained for one epoch on 384 digits."""
    folder = tmp_path_factory.mktemp("guide")
    config = TrainingConfig(ModelConfig(num_classes=10, hidden_size=64), AdamConfig(),
                            num_epochs=1, learning_rate=1e-3)  # fmt: skip
    train(folder, config, ember.device("ndarray"), renderer=PlainRenderer(every=0),
          train_dataset=PartialDataset(MnistDataset.train(), 0, 384),
          valid_dataset=PartialDataset(MnistDataset.test(), 0, 64))  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def site(tmp_path_factory, build, artifacts) -> Path:
    """A copy of the page with the artifacts' model and the first test digits (build.py);
    ``build`` comes first, so a skip spares the training."""
    site = tmp_path_factory.mktemp("site")
    for name in build.PAGE_FILES:
        shutil.copy(WEB / name, site / name)
    (site / "vendor").symlink_to(WEB / "vendor", target_is_directory=True)
    build.build(site, artifacts, count=COUNT)
    return site


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[str]:
    """The URL of ``folder``'s index.html, served on a free local port until the block ends."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=folder))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/index.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def url(site) -> Iterator[str]:
    with serving(site) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def ember_outputs(artifact_dir: Path, images: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """ember's logits and probabilities ``[n, 10]`` for ``n`` uint8 images ``[28, 28]``,
    normalized by the guide's batcher."""
    device = ember.device("ndarray")
    _, model = load_trained(artifact_dir, device)
    items = [MnistItem(image, 0) for image in images]
    logits = model(MnistBatcher().batch(items, device).images)
    return logits.to_numpy(), softmax(logits, 1).to_numpy()


def call_page(browser, function: str, *args):
    """Awaits ``window.emberDigits[function](...args)`` in the page; fails with the error and
    the browser's console when it rejects."""
    # Waits for app.js's module to have defined window.emberDigits rather than trusting the
    # navigation to have waited for it (it did not once, in a few dozen runs).
    outcome = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const args = Array.from(arguments).slice(0, -1);"
        "const call = () => window.emberDigits"
        f"  ? window.emberDigits.{function}(...args)"
        "      .then((value) => done({ value }), (error) => done({ error: String(error) }))"
        "  : setTimeout(call, 20);"
        "call();",
        *args,
    )
    if "error" in outcome:
        console = [entry["message"] for entry in browser.get_log("browser")]
        pytest.fail(f"{function}: {outcome['error']}; browser console: {console}")
    return outcome["value"]


def artifact_folder(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("EMBER_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_page_classifies_test_digits_as_ember_does(artifacts, url, browser, tmp_path):
    browser.get(url)
    results = call_page(browser, "classifyBundled", COUNT)
    screenshot = artifact_folder(tmp_path) / "web_page.png"
    browser.save_screenshot(str(screenshot))
    print(f"screenshot of the digit page: {screenshot}")

    test = MnistDataset.test()
    assert [r["index"] for r in results] == list(range(COUNT))
    assert [r["label"] for r in results] == [test[i].label for i in range(COUNT)]
    logits, probabilities = ember_outputs(artifacts, [test[i].image for i in range(COUNT)])
    page_logits = np.array([r["logits"] for r in results])
    page_probabilities = np.array([r["probabilities"] for r in results])
    np.testing.assert_allclose(page_logits, logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(page_probabilities, probabilities, rtol=1e-4)
    assert [r["predicted"] for r in results] == probabilities.argmax(1).tolist()

    # The page shows the last digit's prediction and a bar per class.
    assert browser.find_element("id", "predicted").text == str(results[-1]["predicted"])
    assert len(browser.find_elements("css selector", "#bars li")) == 10
    assert screenshot.read_bytes().startswith(b"\x89PNG")
    console = browser.get_log("browser")
    assert [entry["message"] for entry in console if entry["level"] == "SEVERE"] == []


# A "7" drawn on the 280x280 pad: offsets from the pad's centre, in CSS pixels.
SEVEN = [(-70, -90), (0, -90), (70, -90), (35, 0), (0, 90)]


@pytest.mark.parametrize("pointer", ["mouse", "touch"])
def test_a_drawn_digit_is_centred_like_mnist_and_classified_as_ember_does(
    artifacts, url, browser, pointer, tmp_path
):
    from selenium.webdriver.common.actions import interaction
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.actions.pointer_input import PointerInput

    browser.get(url)
    call_page(browser, "shown")  # the page has started
    pad = browser.find_element("id", "pad")
    kind = interaction.POINTER_MOUSE if pointer == "mouse" else interaction.POINTER_TOUCH
    # Each move is one pointermove event (no time spent interpolating): the pad joins them.
    actions = ActionBuilder(browser, mouse=PointerInput(kind, pointer), duration=0)
    actions.pointer_action.move_to(pad, *SEVEN[0]).pointer_down()
    for x, y in SEVEN[1:]:
        actions.pointer_action.move_to(pad, x, y)
    actions.pointer_action.pointer_up()
    actions.perform()

    shown = call_page(browser, "shown")
    screenshot = artifact_folder(tmp_path) / f"web_page_drawn_{pointer}.png"
    browser.save_screenshot(str(screenshot))
    print(f"screenshot of the digit page after a {pointer} stroke: {screenshot}")
    assert shown is not None, f"the {pointer} stroke drew nothing"
    pixels = np.array(shown["pixels"], dtype=np.uint8).reshape(28, 28)
    # MNIST's layout: the ink fits a 20x20 box (its longer side 20), centred by its mass.
    rows, cols = np.nonzero(pixels)
    extent = max(rows.max() - rows.min(), cols.max() - cols.min()) + 1
    assert 19 <= extent <= 20
    mass = pixels.astype(np.float64)
    centre = [(mass.sum(axis=1) @ np.arange(28)) / mass.sum(),
              (mass.sum(axis=0) @ np.arange(28)) / mass.sum()]  # fmt: skip
    np.testing.assert_allclose(centre, [13.5, 13.5], atol=0.5)

    logits, probabilities = ember_outputs(artifacts, [pixels])
    np.testing.assert_allclose([shown["logits"]], logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose([shown["probabilities"]], probabilities, rtol=1e-4)
    assert shown["predicted"] == int(probabilities.argmax())
    assert browser.find_element("id", "predicted").text == str(shown["predicted"])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no model", "guide.onnx: HTTP 404; run python examples/web/build.py first"),
        ("pixel 256", "digits.json: digit 1 needs 784 pixels 0-255 and a label 0-9"),
        ("label 10", "digits.json: digit 1 needs 784 pixels 0-255 and a label 0-9"),
        ("std 0", "digits.json: normalization needs a finite mean and a positive std"),
    ],
)
def test_a_missing_or_broken_file_is_named_on_the_page(site, browser, tmp_path, damage, message):
    from selenium.webdriver.support.wait import WebDriverWait

    broken = tmp_path / "site"
    shutil.copytree(site, broken, symlinks=True)
    digits = json.loads((broken / "digits.json").read_text())
    if damage == "no model":
        (broken / "guide.onnx").unlink()
    elif damage == "pixel 256":
        digits["digits"][1]["pixels"][400] = 256
    elif damage == "label 10":
        digits["digits"][1]["label"] = 10
    else:
        digits["normalization"]["std"] = 0
    (broken / "digits.json").write_text(json.dumps(digits))

    with serving(broken) as url:
        browser.get(url)
        status = browser.find_element("id", "status")
        WebDriverWait(browser, 30).until(lambda _: "error" in status.get_attribute("class"))
        assert status.text == f"cannot start: {message}"
