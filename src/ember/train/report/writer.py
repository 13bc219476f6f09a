"""write_report: the training report of an artifact directory, written into ``report/``.

::

    <artifact_dir>/report/index.html    the page: facts, summary table, charts, config
    <artifact_dir>/report/<Metric>.png  one chart per numeric metric (800 x 450)

Each file is written atomically (:mod:`ember.atomic`), the charts first and the page
last, so a page never names a chart that is not there; in ``report/``, charts an
earlier report left for metrics no longer logged are removed after.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ember.atomic import atomic_write
from ember.train.learner.history import SPLITS, MetricHistory
from ember.train.learner.summary import LearnerSummary
from ember.train.report.collect import RunData, collect
from ember.train.report.page import Chart, render_page
from ember.train.report.plots import Curve, plot_metric
from ember.train.tracker.base import require

REPORT_DIR = "report"
PAGE = "index.html"


def chart_file(name: str, taken: set[str]) -> str:
    """A safe file name for metric ``name``'s chart, not in ``taken`` (which it joins).

    Example:
        >>> taken = set()
        >>> chart_file("Loss", taken), chart_file("Top-5 Accuracy", taken), chart_file("Loss", taken)
        ('Loss.png', 'Top-5_Accuracy.png', 'Loss-2.png')
    """
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:60] or "metric"
    file, count = f"{stem}.png", 1
    while file.lower() in taken:  # lower: unique on case-insensitive file systems too
        count += 1
        file = f"{stem}-{count}.png"
    taken.add(file.lower())
    return file


def _curves(run: RunData, name: str) -> list[Curve]:
    curves = []
    for split in SPLITS:
        epochs = run.history.values(split, name)
        series = run.steps.get((split, name))
        if not epochs and series is None:
            continue
        steps = None if series is None else series.points()
        curves.append(Curve(split, ([float(e) for e in epochs], list(epochs.values())), steps))
    return curves


def write_report(
    artifact_dir: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str] | None = None,
    history: MetricHistory | None = None,
    model: str | None = None,
    num_epochs: int | None = None,
) -> Path:
    """Writes the training report of ``artifact_dir``; returns the page's path.

    Args:
        artifact_dir: the artifact directory of a fit.
        out: the folder to write into. Default: ``<artifact_dir>/report``.
        history: the run's epoch values (the learner passes its own); None reads them
            from the artifact directory (see :func:`~ember.train.report.collect.collect`).
        model: the model's name, shown in the title when given.
        num_epochs: the run's epoch count; default: the last epoch with a value.

    Raises:
        MissingExtraError: matplotlib is not installed (the ``report`` extra).
        ArgumentError: ``artifact_dir`` is not a folder.
        ArtifactFileError: a file of the run that is not what a fit writes.
        RecordError: a checkpoint state file that cannot be decoded.
    """
    require("the training report", "report", "matplotlib")
    run = collect(artifact_dir, history)
    folder = Path(out) if out is not None else run.artifact_dir / REPORT_DIR
    folder.mkdir(parents=True, exist_ok=True)

    charts: list[Chart] = []
    taken: set[str] = set()
    for name in run.metric_names():
        chart = Chart(name, chart_file(name, taken), plot_metric(name, _curves(run, name)))
        atomic_write(folder / chart.file, chart.png)
        charts.append(chart)

    last = max((max(run.history.values(s, n)) for s, n in run.history.metrics()
                if run.history.values(s, n)), default=0)  # fmt: skip
    epochs = num_epochs if num_epochs is not None else last
    title = model or run.artifact_dir.resolve().name or str(run.artifact_dir)
    summary = LearnerSummary.from_history(run.history, epochs, model or "model")
    facts = [("Artifact directory", str(run.artifact_dir.resolve())), ("Epochs", str(epochs)),
             ("Epoch values from", run.history_source)]  # fmt: skip
    if model:
        facts.insert(0, ("Model", model))
    page = render_page(title=title, facts=facts, summary=summary, charts=charts,
                       text_metrics=run.text_metrics, config=run.config)  # fmt: skip
    path = folder / PAGE
    atomic_write(path, page.encode("utf-8"))
    if out is None:  # the report's own folder: drop charts of metrics no longer logged
        written = {chart.file for chart in charts}
        for stale in folder.glob("*.png"):
            if stale.name not in written:
                stale.unlink(missing_ok=True)
    return path
