"""The notebook renderer and the rich display of tensors and modules.

The unit tests check the renderer's view and throttle without a kernel; the notebook test
runs a real notebook (nbformat + nbclient on this interpreter's ipykernel): a short fit
that picks the notebook renderer by itself, then a tensor and a module as cell results.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
from learner_support import classifier

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError
from ember.notebook_display import MAX_MODULE_ROWS, module_html, tensor_html
from ember.train.learner.builder import default_renderer
from ember.train.metric.base import MetricEntry, Progress
from ember.train.renderer.base import MetricUpdate, TrainingProgress
from ember.train.renderer.notebook import NotebookRenderer, in_notebook
from ember.train.renderer.plain import PlainRenderer
from ember.train.tracker.base import MissingExtraError

HERE = Path(__file__).parent


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeHandle:
    """Stands in for IPython's DisplayHandle: records every bundle shown."""

    def __init__(self) -> None:
        self.shown: list[dict[str, str]] = []

    def update(self, bundle, raw):
        assert raw
        self.shown.append(bundle)


def progress(iteration: int, epoch: int = 1) -> TrainingProgress:
    return TrainingProgress(Progress(iteration * 4, 8), epoch, 2, iteration)


def loss_update(value: float) -> MetricUpdate:
    return MetricUpdate(MetricEntry("Loss", f"batch {value}", str(value)), value=value)


def renderer_with_handle(clock: FakeClock) -> tuple[NotebookRenderer, FakeHandle]:
    renderer = NotebookRenderer(refresh_seconds=1.0, clock=clock)
    handle = FakeHandle()
    renderer._handle = handle  # the cell's output exists already: updates go to the handle
    return renderer, handle


# ---------------------------------------------------------------------- the renderer
def test_view_shows_progress_latest_values_and_finished_epochs():
    clock = FakeClock()
    renderer, handle = renderer_with_handle(clock)
    renderer.update_train(loss_update(0.5))
    renderer.render_train(progress(1))
    html = handle.shown[-1]["text/html"]
    assert '<progress value="4" max="8"></progress>' in html
    assert "train · epoch 1/2 · iteration 1 · items 4/8" in html
    assert "Loss batch 0.5" in html

    renderer.update_train(loss_update(0.25))
    renderer.on_epoch_end("train", 1)
    html, text = handle.shown[-1]["text/html"], handle.shown[-1]["text/plain"]
    assert "<tr><th>epoch</th><th>split</th><th>Loss</th></tr>" in html
    assert "<tr><td>1</td><td>train</td><td>0.25</td></tr>" in html
    assert text.splitlines() == ["[train] epoch 1/2 iteration 1 items 4/8",
                                 "[train] epoch 1 done | Loss 0.25"]  # fmt: skip


def test_updates_are_throttled_but_epoch_ends_and_close_always_show():
    clock = FakeClock()
    renderer, handle = renderer_with_handle(clock)
    renderer.render_train(progress(1))
    renderer.render_train(progress(2))  # 0 s later: skipped
    clock.now = 0.5
    renderer.render_train(progress(2))  # 0.5 s < 1 s: skipped
    assert len(handle.shown) == 1
    clock.now = 1.0
    renderer.render_train(progress(2))
    assert len(handle.shown) == 2
    renderer.on_epoch_end("train", 1)
    renderer.close()
    assert len(handle.shown) == 4


def test_metric_names_and_values_are_escaped():
    renderer, handle = renderer_with_handle(FakeClock())
    entry = MetricEntry("<b>x</b>", "<script>", "<script>")
    renderer.update_valid(MetricUpdate(entry))
    renderer.render_valid(progress(1))
    renderer.on_epoch_end("valid", 1)
    html = handle.shown[-1]["text/html"]
    assert "<script>" not in html and "<b>x</b>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "&lt;script&gt;" in html


@pytest.mark.parametrize("bad", [-1, "0.2", True, float("nan")])
def test_bad_refresh_is_a_typed_error(bad):
    with pytest.raises(ArgumentError, match="refresh_seconds"):
        NotebookRenderer(refresh_seconds=bad)


def test_outside_a_kernel_the_terminal_renderers_are_kept():
    # pytest's stdout is captured, not a terminal, and no kernel runs: the plain renderer
    assert not in_notebook()
    assert isinstance(default_renderer(), PlainRenderer)


class FakeShell:
    def __init__(self, kernel: object | None) -> None:
        if kernel is not None:
            self.kernel = kernel


@pytest.mark.parametrize(("shell", "expected"), [
    (FakeShell(kernel=object()), True),  # a Jupyter kernel
    (FakeShell(kernel=None), False),  # IPython in a terminal: no kernel
    (None, False),  # IPython imported, but not running
])  # fmt: skip
def test_a_kernel_is_detected_and_picks_the_notebook_renderer(monkeypatch, shell, expected):
    fake_ipython = types.SimpleNamespace(get_ipython=lambda: shell)
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython)
    assert in_notebook() is expected
    assert isinstance(default_renderer(), NotebookRenderer) is expected


def test_without_ipython_the_first_output_is_a_missing_extra_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "IPython.display", None)  # makes the import fail
    renderer = NotebookRenderer()
    with pytest.raises(MissingExtraError, match=r"ember\[notebook\]"):
        renderer.render_train(progress(1))


# ---------------------------------------------------------------------- rich display
def test_tensor_html_names_shape_dtype_device_and_values():
    tensor = Tensor.from_data([[1.0, 2.0], [3.0, 4.0]], ember.device("ndarray"))
    assert tensor._repr_html_() == tensor_html(tensor) == (
        '<div class="ember-tensor"><b>Tensor</b> shape [2, 2] · dtype f32 · '
        "device ndarray:cpu:0 · backend ndarray<pre>[[1.0, 2.0],\n [3.0, 4.0]]</pre></div>"
    )


def test_large_tensor_html_is_summarized(monkeypatch):
    monkeypatch.setenv("EMBER_PRINT_THRESHOLD", "10")
    html = Tensor.arange(0, 1000, device=ember.device("ndarray"))._repr_html_()
    assert "<pre>[  0,   1,   2, ..., 997, 998, 999]</pre>" in html


def test_module_html_is_the_field_tree_with_counts():
    model = classifier(0, ember.device("ndarray"))
    assert model._repr_html_() == module_html(model)
    html = module_html(model)
    assert "<summary>Classifier <i>(15 params)</i></summary>" in html
    assert "<summary>linear: Linear <i>(15 params)</i></summary>" in html
    assert "<tr><td>weight</td><td>[4, 3]</td><td>f32</td><td>12</td></tr>" in html
    assert "<tr><td>bias</td><td>[3]</td><td>f32</td><td>3</td></tr>" in html


def test_module_html_is_bounded():
    from ember.module import Module, Param

    class Many(Module):
        layers: list

    device = ember.device("ndarray")
    model = Many([Param(Tensor.zeros([1], device)) for _ in range(MAX_MODULE_ROWS + 50)])
    html = module_html(model)
    assert html.count("<tr>") == MAX_MODULE_ROWS - 2  # the module and the list take a row each
    assert f"cut after {MAX_MODULE_ROWS} rows" in html


# ---------------------------------------------------------------------- in a real notebook
SETUP = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from learner_support import classifier, loaders
from ember.optim.sgd import SgdConfig
from ember.train.learner.builder import LearnerBuilder
from ember.train.metric.loss import LossMetric
"""

FIT = """
import tempfile
train, valid = loaders()
learner = (LearnerBuilder(tempfile.mkdtemp()).num_epochs(2).metric_loggers(None, None)
           .report(False)  # the training report prints its path: tested in test_report.py
           .metric_train_numeric(LossMetric()).metric_valid_numeric(LossMetric())
           .build(classifier(0), SgdConfig().init(), 0.1))
print(type(learner.renderer).__name__)
model = learner.fit(train, valid)
"""


def test_a_notebook_runs_a_fit_and_shows_rich_reprs(tmp_path, monkeypatch):
    for package in ("nbclient", "nbformat", "ipykernel"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (ember's test extra installs it)")
    import nbclient
    import nbformat

    # a kernel of this interpreter, whatever kernels the machine has installed
    spec = tmp_path / "kernels" / "ember-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ember test", "language": "python",
    }))  # fmt: skip
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))

    cells = [SETUP, FIT, "model.valid()",
             "from ember import Tensor\nTensor.ones([2, 3], model.devices()[0].inner())"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="ember-test").execute()

    outputs = [cell.outputs for cell in notebook.cells]
    assert not [o for cell in outputs for o in cell if o.output_type == "error"]
    fit = outputs[1]
    assert [o.text for o in fit if o.output_type == "stream"] == ["NotebookRenderer\n"]
    [display] = [o for o in fit if o.output_type == "display_data"]  # one output, updated
    html = display.data["text/html"]
    assert html.startswith('<div class="ember-run">')
    for row in ("<td>1</td><td>train</td>", "<td>1</td><td>valid</td>",
                "<td>2</td><td>train</td>", "<td>2</td><td>valid</td>"):  # fmt: skip
        assert row in html
    assert "<th>Loss</th>" in html
    assert "[valid] epoch 2 done | Loss" in display.data["text/plain"]
    [module] = outputs[2]
    assert module.data["text/html"].startswith('<div class="ember-module">')
    assert "linear: Linear <i>(15 params)</i>" in module.data["text/html"]
    [tensor] = outputs[3]
    assert tensor.data["text/html"].startswith('<div class="ember-tensor"><b>Tensor</b> shape [2, 3]')
