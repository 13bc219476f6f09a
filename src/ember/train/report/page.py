"""The report's HTML page: one self-contained file.

The charts are embedded as base64 PNG ``data:`` URLs and the style is inline, so the
page loads nothing (it opens from a mail attachment, a CI artifact, a file share) and
runs no script. Every string that came from a file (metric names, the config, the
folder's name) is escaped with :func:`html.escape`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass

from ember.train.learner.summary import LearnerSummary
from ember.train.report.plots import SIZE

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1.5em 0; } img { max-width: 100%; height: auto; }
pre { background: #f5f5f5; padding: 1em; overflow-x: auto; }
.note { color: #555; }
"""


@dataclass(frozen=True)
class Chart:
    """A metric's chart: its name, the PNG file's name beside the page, and its bytes."""

    metric: str
    file: str
    png: bytes


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _summary_table(summary: LearnerSummary) -> str:
    if not summary.metrics:
        return '<p class="note">No numeric metric has an epoch value.</p>'
    head = "".join(f"<th>{h}</th>" for h in
                   ("Split", "Metric", "Min.", "Epoch", "Max.", "Epoch", "Last", "Epoch"))  # fmt: skip
    rows = []
    for row in summary.metrics:
        cells = [f"<td>{_e(row.split)}</td>", f"<td>{_e(row.name)}</td>"]
        for value, epoch in (row.min, row.max, row.last):
            cells += [f'<td class="number">{value:.6g}</td>', f'<td class="number">{epoch}</td>']
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows)
            + "\n</tbody>\n</table>")  # fmt: skip


def render_page(
    *,
    title: str,
    facts: Sequence[tuple[str, str]],
    summary: LearnerSummary,
    charts: Sequence[Chart],
    text_metrics: Sequence[tuple[str, str]] = (),
    config: str | None = None,
) -> str:
    """The report page.

    Args:
        title: the page's title (the run's name).
        facts: ``(label, value)`` lines shown under the title.
        summary: the summary table's rows.
        charts: one per metric, in order.
        text_metrics: ``(split, metric)`` of the metrics not plotted (not numbers).
        config: the run's config as text, shown when given.
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',  # no favicon request
        f"<title>Training report: {_e(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>Training report: {_e(title)}</h1>",
        "<ul>" + "".join(f"<li>{_e(label)}: {_e(value)}</li>" for label, value in facts)
        + "</ul>",
        "<h2>Summary</h2>",
        _summary_table(summary),
        "<h2>Metrics</h2>",
    ]
    if not charts:
        parts.append('<p class="note">No numeric metric was logged.</p>')
    for chart in charts:
        data = base64.b64encode(chart.png).decode("ascii")
        parts += [
            f'<figure id="metric-{_e(chart.file.removesuffix(".png"))}">',
            f'<img src="data:image/png;base64,{data}" alt="{_e(chart.metric)}: train and '
            f'valid by epoch" width="{SIZE[0]}" height="{SIZE[1]}">',
            f"<figcaption>{_e(chart.metric)} (also in {_e(chart.file)})</figcaption>",
            "</figure>",
        ]
    if text_metrics:
        listed = ", ".join(f"{_e(name)} ({_e(split)})" for split, name in text_metrics)
        parts.append(f'<p class="note">Not plotted (their values are not numbers): {listed}</p>')
    if config is not None:
        parts += ["<h2>Run config</h2>", f"<pre>{_e(config)}</pre>"]
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)
