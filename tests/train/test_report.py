"""The training report: a short fit writes report/index.html and a PNG chart per metric.

References: the summary table against the learner's history (checked in turn against
the mean of the batch values the file loggers wrote), the per-step values against the
log files, the down-sampling against NumPy block means. Hostile artifact files give
typed errors naming the file and line, or come out escaped. Skips, with the reason
printed, only where matplotlib (the 'report' extra) is missing; the test extra has it.
"""

from __future__ import annotations

import base64
import builtins
import importlib
import importlib.util
import io
import math
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from learner_support import log_tree
from report_support import EPOCHS, METRICS, TRAIN_COLOR, VALID_COLOR, StrictPage, short_fit

from ember.backend.errors import ArgumentError, EmberError, RecordError
from ember.cli import main
from ember.train.learner.summary import LearnerSummary
from ember.train.report import ArtifactFileError, collect, write_report
from ember.train.report.series import StepSeries
from ember.train.tracker import MissingExtraError

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="the 'report' extra (matplotlib) is not installed; the test command installs it")
Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")

TRAIN_STEPS, VALID_STEPS = 6, 2
collect_module = importlib.import_module("ember.train.report.collect")  # the name is a function


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the 'report' extra (matplotlib) is not installed; the test command installs it")
    artifact = tmp_path_factory.mktemp("report") / "run"
    learner = short_fit(artifact)
    return artifact, learner


def logged(artifact: Path, split: str, name: str, epoch: int) -> list[float]:
    return [float(line) for line in (artifact / split / f"epoch-{epoch}" / f"{name}.log")
            .read_text().split()]  # fmt: skip


def pixels(png: bytes) -> set[tuple[int, int, int]]:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    return {color for _, color in image.getcolors(maxcolors=image.width * image.height)}


# ---------------------------------------------------------------------- after a fit
def test_fit_writes_the_page_and_one_chart_per_metric(fitted):
    artifact, _ = fitted
    files = sorted(p.name for p in (artifact / "report").iterdir())
    assert files == ["Accuracy.png", "Loss.png", "index.html"]
    for name in METRICS:
        image = Image.open(artifact / "report" / f"{name}.png")
        image.load()
        assert image.format == "PNG" and image.size == (800, 450)
        colors = pixels((artifact / "report" / f"{name}.png").read_bytes())
        assert TRAIN_COLOR in colors and VALID_COLOR in colors  # both splits drawn


def test_page_parses_embeds_the_charts_and_names_every_metric(fitted):
    artifact, _ = fitted
    page = StrictPage((artifact / "report" / "index.html").read_text(encoding="utf-8"))
    images = page.all("img")
    assert len(images) == len(METRICS)
    for attrs, name in zip(images, METRICS, strict=True):
        prefix = "data:image/png;base64,"
        assert attrs["src"].startswith(prefix)
        png = base64.b64decode(attrs["src"][len(prefix):], validate=True)
        assert png == (artifact / "report" / f"{name}.png").read_bytes()
        assert attrs["alt"].startswith(f"{name}:")
    captions = " ".join(page.text["figcaption"])
    assert all(name in captions for name in METRICS)
    # Self-contained: nothing to fetch, no script.
    assert not page.all("script")
    assert all(a["href"] == "data:," for a in page.all("link"))


def test_summary_table_holds_the_epoch_values(fitted):
    artifact, learner = fitted
    for split, steps in (("train", TRAIN_STEPS), ("valid", VALID_STEPS)):
        for name in METRICS:
            for epoch in range(1, EPOCHS + 1):
                batches = logged(artifact, split, name, epoch)  # equal batches: plain mean
                assert len(batches) == steps
                np.testing.assert_allclose(learner.history.value(split, name, epoch),
                                           np.mean(batches), rtol=1e-5)  # fmt: skip
    page = StrictPage((artifact / "report" / "index.html").read_text(encoding="utf-8"))
    cells = page.text["td"]
    rows = [cells[i:i + 8] for i in range(0, len(cells), 8)]
    expected = LearnerSummary.from_history(learner.history, EPOCHS)
    assert len(rows) == len(expected.metrics) == 2 * len(METRICS)
    for row, metric in zip(rows, expected.metrics, strict=True):
        values = [part for pair in (metric.min, metric.max, metric.last)
                  for part in (f"{pair[0]:.6g}", str(pair[1]))]  # fmt: skip
        assert row == [metric.split, metric.name, *values]


def test_collect_reads_the_history_and_every_step(fitted):
    artifact, learner = fitted
    run = collect(artifact)  # no history given: the newest checkpoint's
    assert run.history_source == f"checkpoint/state-{EPOCHS}.json"
    assert run.history.to_record() == learner.history.to_record()
    for split, steps in (("train", TRAIN_STEPS), ("valid", VALID_STEPS)):
        for name in METRICS:
            xs, ys = run.steps[(split, name)].points()
            assert xs == [e - 1 + i / steps for e in range(1, EPOCHS + 1) for i in range(1, steps + 1)]
            assert ys == [v for e in range(1, EPOCHS + 1) for v in logged(artifact, split, name, e)]
    assert run.text_metrics == [] and run.config is None


@needs_matplotlib
def test_without_checkpoints_the_epoch_values_are_the_batch_means(tmp_path):
    learner = short_fit(tmp_path, report=False, checkpoints=False)
    assert not (tmp_path / "report").exists()  # report(False)
    run = collect(tmp_path)
    assert run.history_source.startswith("the mean of each epoch's batch values")
    for split, name in learner.history.metrics():
        for epoch in range(1, EPOCHS + 1):
            assert run.history.value(split, name, epoch) == pytest.approx(
                np.mean(logged(tmp_path, split, name, epoch)), rel=1e-12)
    page = write_report(tmp_path, out=tmp_path / "elsewhere")
    assert page == tmp_path / "elsewhere" / "index.html" and page.is_file()
    assert not (tmp_path / "report").exists()


@needs_matplotlib
def test_a_report_written_again_drops_charts_of_metrics_no_longer_logged(tmp_path):
    (tmp_path / "train" / "epoch-1").mkdir(parents=True)
    (tmp_path / "train" / "epoch-1" / "Loss.log").write_text("1.0\n0.5\n")
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "Old.png").write_bytes(b"not a chart")
    write_report(tmp_path)
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["Loss.png", "index.html"]


# ---------------------------------------------------------------------- fit and command
def test_fit_without_matplotlib_prints_a_notice_and_trains(tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def without(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    short_fit(tmp_path, checkpoints=False)
    err = capsys.readouterr().err
    assert "no training report" in err and "pip install 'ember[report]'" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "report").exists()
    assert len(log_tree(tmp_path)) == 2 * EPOCHS * len(METRICS)  # the run itself is whole
    with pytest.raises(MissingExtraError) as error:
        write_report(tmp_path)
    assert error.value.extra == "report"


@needs_matplotlib
def test_a_report_that_fails_leaves_the_fit_whole(tmp_path, log_records):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text("{not json")  # hostile, there before the run
    learner = short_fit(tmp_path)
    assert learner.history.value("valid", "Loss", EPOCHS) is not None
    warning = [r.getMessage() for r in log_records.records if "training report" in r.getMessage()]
    assert len(warning) == 1 and "ArtifactFileError" in warning[0] and "config.json" in warning[0]
    assert not (tmp_path / "report" / "index.html").exists()


@needs_matplotlib
def test_fit_prints_where_the_report_is(tmp_path, capsys):
    short_fit(tmp_path, checkpoints=False)
    assert f"Training report: {tmp_path / 'report' / 'index.html'}" in capsys.readouterr().out


def test_report_command(fitted, tmp_path, capsys):
    artifact, _ = fitted
    assert main(["report", str(artifact), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == f"Training report: {tmp_path / 'out' / 'index.html'}"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["Accuracy.png", "Loss.png",
                                                                     "index.html"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path / "missing")])
    assert exit_.value.code == 1
    assert "ember report: error:" in capsys.readouterr().err


def test_builder_report_takes_a_bool():
    from ember.train.learner.builder import LearnerBuilder

    with pytest.raises(ArgumentError, match="True or False"):
        LearnerBuilder("x").report("no")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- down-sampling
def test_step_series_keeps_block_means_in_bounded_memory():
    rng = np.random.default_rng(0)
    ys = rng.normal(size=10_007)
    ys[100:700] = np.nan  # a gap longer than a block
    ys[5000] = np.inf
    series = StepSeries(capacity=100)
    for x, y in enumerate(ys):
        series.append(float(x), float(y))
    xs, kept = series.points()
    assert len(xs) <= 2 * 100 + 1 and series.length == len(ys)
    block = series.block
    assert block == 64  # 10007 points in at most 200 blocks, doubling
    finite = np.where(np.isfinite(ys), ys, np.nan)
    starts = range(0, len(ys), block)
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning, match="Mean of empty"):
        expected = [np.nanmean(finite[s:s + block]) for s in starts]
    np.testing.assert_allclose(kept, expected, rtol=1e-9, equal_nan=True)
    np.testing.assert_allclose(xs, [np.mean(np.arange(s, min(s + block, len(ys)))) for s in starts])
    assert math.isnan(kept[2]) and not math.isnan(kept[0])


# ---------------------------------------------------------------------- hostile files
def artifact_with(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode("utf-8")
        path.write_bytes(content)
    return tmp_path


@needs_matplotlib
def test_a_value_that_is_not_a_number_names_the_file_and_line(tmp_path):
    artifact_with(tmp_path, {"train/epoch-1/Loss.log": "0.5\n0.4\n0.3\n",
                             "train/epoch-2/Loss.log": "0.2\n0.1\nzero point one\n"})  # fmt: skip
    with pytest.raises(ArtifactFileError, match=r"epoch-2/Loss\.log, line 3: 'zero point one' "
                       "is not a number") as error:  # fmt: skip
        write_report(tmp_path)
    assert error.value.line == 3 and error.value.file.endswith("Loss.log")
    assert isinstance(error.value, EmberError) and not (tmp_path / "report").exists()


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path):
    artifact_with(tmp_path, {"valid/epoch-1/Loss.log": b"0.5\n" + b"1" * 20_000_000 + b"\n"})
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactFileError,
                           match=r"Loss\.log, line 2: line longer than 100 bytes"):  # fmt: skip
            collect(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000  # read in bounded pieces, not the 20 MB line


def test_too_many_values_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(collect_module, "MAX_VALUES_PER_FILE", 5)
    artifact_with(tmp_path, {"train/epoch-1/Loss.log": "1\n" * 6})
    with pytest.raises(ArtifactFileError, match="holds 6 values, more than 5"):
        collect(tmp_path)


@needs_matplotlib
def test_html_in_names_and_config_is_escaped(tmp_path):
    name = "<img src=x onerror=alert(1)> & \"Loss\" $x$"
    artifact_with(tmp_path, {
        f"train/epoch-1/{name}.log": "1.0\n0.5\n",
        "train/epoch-1/<b>Note.log": "<script>alert(2)</script>\n",  # a text metric
        "config.json": '{"note": "</pre><script>alert(3)</script>", "lr": 0.1}',
    })  # fmt: skip
    page_text = write_report(tmp_path).read_text(encoding="utf-8")
    page = StrictPage(page_text)
    assert not page.all("script")
    assert all(attrs["src"].startswith("data:image/png;base64,") for attrs in page.all("img"))
    assert [attrs["alt"] for attrs in page.all("img")] == [f"{name}: train and valid by epoch"]
    assert name in " ".join(page.text["figcaption"])
    assert "</pre><script>alert(3)</script>" in "".join(page.text["pre"])
    assert "<b>Note (train)" in "".join(page.text["p"])  # listed, not plotted
    charts = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert charts == ["img_src_x_onerror_alert_1_Loss_x.png"]


@needs_matplotlib
def test_nan_and_inf_are_gaps_and_huge_values_are_drawn_around(tmp_path):
    artifact_with(tmp_path, {"train/epoch-1/Loss.log": "1.0\nnan\ninf\n1e308\n-1e308\n0.5\n",
                             "train/epoch-2/Loss.log": "nan\n"})  # fmt: skip
    run = collect(tmp_path)
    _, ys = run.steps[("train", "Loss")].points()
    assert len(ys) == 7 and [ys[0], *ys[3:6]] == [1.0, 1e308, -1e308, 0.5]
    assert all(math.isnan(y) for y in (ys[1], ys[2], ys[6]))  # NaN and inf: gaps
    assert run.history.value("train", "Loss", 1) == ((1.0 + 1e308) - 1e308 + 0.5) / 4
    assert run.history.value("train", "Loss", 2) is None
    png = write_report(tmp_path).parent / "Loss.png"
    assert Image.open(png).size == (800, 450)


def test_bad_config_names_the_line(tmp_path):
    artifact_with(tmp_path, {"train/epoch-1/Loss.log": "1\n", "config.json": '{\n"a": 1,\n}'})
    with pytest.raises(ArtifactFileError, match=r"config\.json, line 3: not JSON") as error:
        collect(tmp_path)
    assert error.value.line == 3


def test_bad_checkpoint_state_is_a_typed_error(tmp_path):
    artifact_with(tmp_path, {"checkpoint/state-2.json": '{"version": 1}'})
    with pytest.raises(RecordError, match=r"state-2\.json"):
        collect(tmp_path)
    artifact_with(tmp_path, {"checkpoint/state-3.json": "{not json"})
    with pytest.raises(RecordError, match=r"state-3\.json"):
        collect(tmp_path)


def test_the_last_line_without_newline_is_still_being_written(tmp_path):
    artifact_with(tmp_path, {"train/epoch-1/Loss.log": "1.0\n2.0\n3."})
    xs, ys = collect(tmp_path).steps[("train", "Loss")].points()
    assert ys == [1.0, 2.0] and xs == [0.5, 1.0]


def test_not_a_folder(tmp_path):
    with pytest.raises(ArgumentError, match="is not a folder"):
        collect(tmp_path / "missing")


def test_too_large_a_log_or_too_many_metrics_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(collect_module, "MAX_LOG_BYTES", 10)
    artifact_with(tmp_path / "a", {"train/epoch-1/Loss.log": "0.123456\n0.5\n"})
    with pytest.raises(ArtifactFileError, match=r"Loss\.log: 13 bytes, larger than a metric log"):
        collect(tmp_path / "a")
    monkeypatch.setattr(collect_module, "MAX_METRICS", 2)
    artifact_with(tmp_path / "b", {f"train/epoch-{e}/M{e}.log": "1\n" for e in range(1, 6)})
    with pytest.raises(ArtifactFileError, match="more than 4 metrics in the epoch folders"):
        collect(tmp_path / "b")
