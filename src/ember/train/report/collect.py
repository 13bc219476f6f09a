"""Reads what a training run left in its artifact directory, for the report.

A fit leaves (see :mod:`ember.train.learner.learner`)::

    <artifact_dir>/train/epoch-<n>/<Metric>.log   one batch value per line (file loggers)
    <artifact_dir>/valid/epoch-<n>/<Metric>.log
    <artifact_dir>/checkpoint/state-<n>.json      the metric history (with a checkpointer)
    <artifact_dir>/config.json                    the run's config (the guide writes one)

:func:`collect` reads them into a :class:`RunData`: the epoch value of every numeric
metric (the learner's history when given, else the newest checkpoint's, else the mean
of each epoch's batch values) and its per-step values, bounded in memory
(:class:`~ember.train.report.series.StepSeries`).

Every file may be hostile. A value that is not a number in a numeric metric's log, a
line longer than :data:`MAX_LINE_BYTES`, too many files or values, a file too large, a
malformed state or config:
each raises :class:`ArtifactFileError` naming the file (and the line). NaN and inf
are kept as gaps. A metric whose first logged value is not a number is a text metric:
it is listed as not plotted. A last line without its newline is a value still being
written (as :class:`~ember.train.logger.FileMetricLogger` reads it): it is left out.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.backend.errors import ArgumentError, EmberError, RecordError
from ember.record.recorder import PrettyJsonFileRecorder
from ember.train.learner.checkpoint import TrainingState
from ember.train.learner.history import SPLITS, MetricHistory
from ember.train.renderer.base import Split
from ember.train.report.series import StepSeries

MAX_LINE_BYTES = 100
"""The longest line a metric log may hold (a serialized number is ~25 bytes)."""
MAX_VALUES_PER_FILE = 10_000_000
"""The most values one epoch's log of one metric may hold."""
MAX_LOG_BYTES = 256 << 20
"""The largest metric log read (10 million values of ~25 bytes)."""
MAX_EPOCHS = 100_000
"""The most ``epoch-<n>`` folders a split may have."""
MAX_METRICS = 1_000
"""The most metric logs an epoch folder may hold (and, twice that, the most metrics of
a run: its two splits)."""
MAX_STATE_BYTES = 64 << 20
"""The largest checkpoint state file read for the history."""
MAX_CONFIG_BYTES = 1 << 20
"""The largest ``config.json`` shown."""
CONFIG_FILE = "config.json"

_EPOCH_DIR = re.compile(r"epoch-([1-9][0-9]{0,8})\Z")
_STATE_FILE = re.compile(r"state-([1-9][0-9]{0,8})\.json\Z")


class ArtifactFileError(EmberError, ValueError):
    """A file of an artifact directory that cannot be read as what a fit writes there.

    Attributes:
        file: the file (or folder) at fault.
        line: the line at fault, from 1; None when the whole file is.
    """

    def __init__(self, message: str, file: str | os.PathLike[str], line: int | None = None) -> None:
        where = f"{file}" if line is None else f"{file}, line {line}"
        super().__init__(f"{where}: {message}")
        self.file = str(file)
        self.line = line


@dataclass
class RunData:
    """What the report shows of one run.

    Attributes:
        artifact_dir: the run's folder.
        history: the epoch value of every numeric metric, by split.
        history_source: where the epoch values come from, in words.
        steps: the per-step values of each ``(split, metric)`` that has logs; x in
            epochs (iteration ``i`` of ``n`` in epoch ``e`` is at ``e - 1 + i / n``).
        text_metrics: the ``(split, metric)`` whose logs are not numbers (not plotted).
        config: the run's config as indented JSON; None without ``config.json``.
    """

    artifact_dir: Path
    history: MetricHistory
    history_source: str
    steps: dict[tuple[Split, str], StepSeries] = field(default_factory=dict)
    text_metrics: list[tuple[Split, str]] = field(default_factory=list)
    config: str | None = None

    def metric_names(self) -> list[str]:
        """Every numeric metric's name, each once: the history's order, then the logs'."""
        names = [name for _, name in self.history.metrics()]
        names += [name for _, name in self.steps]
        return list(dict.fromkeys(names))


def collect(artifact_dir: str | os.PathLike[str], history: MetricHistory | None = None) -> RunData:
    """Reads the run in ``artifact_dir`` (see the module docstring).

    Args:
        artifact_dir: the learner's artifact directory.
        history: the run's epoch values, when the caller has them (the learner does);
            None reads them from the newest checkpoint, else averages the batch values.

    Raises:
        ArgumentError: ``artifact_dir`` is not a folder.
        ArtifactFileError: a file that is not what a fit writes (see the module docstring).
        RecordError: a checkpoint state file that cannot be decoded.
    """
    directory = Path(artifact_dir)
    if not directory.is_dir():
        raise ArgumentError(f"training report: {directory} is not a folder (an artifact "
                            "directory of a fit)")  # fmt: skip
    source = "the learner"
    if history is None:
        history, source = _checkpoint_history(directory)
    numeric = set(history.metrics())
    means = MetricHistory()  # the epoch means of the batch values, where no history has them
    run = RunData(directory, history, source)
    for split in SPLITS:
        for epoch, logs in _epoch_logs(directory / split):
            for name, path in logs:
                key = (split, name)
                if key in run.text_metrics:
                    continue
                if key not in run.steps:
                    if len(run.steps) + len(run.text_metrics) >= 2 * MAX_METRICS:
                        raise ArtifactFileError(f"more than {2 * MAX_METRICS} metrics in the "
                                                "epoch folders of train/ and valid/", directory)  # fmt: skip
                    first = _first_value_is_number(path)
                    if first is None:
                        continue  # an empty log: nothing to classify it by yet
                    if not first and key not in numeric:
                        run.text_metrics.append(key)
                        continue
                    run.steps[key] = StepSeries()
                mean = _read_log(path, epoch, run.steps[key])
                if not math.isnan(mean):
                    means.record(split, name, epoch, mean)
    if not numeric:  # no history: the epoch means stand in for it
        run.history = means
        if means.metrics():
            run.history_source = "the mean of each epoch's batch values (no checkpoint found)"
    run.config = _config(directory / CONFIG_FILE)
    return run


# ---------------------------------------------------------------------- history
def _checkpoint_history(directory: Path) -> tuple[MetricHistory, str]:
    """The history of the newest checkpoint state under ``directory/checkpoint``."""
    folder = directory / "checkpoint"
    states = [(int(match.group(1)), path) for name, path in _entries(folder, MAX_EPOCHS * 8)
              if (match := _STATE_FILE.match(name)) and path.is_file()]  # fmt: skip
    if not states:
        return MetricHistory(), "none found"
    _, path = max(states)
    record = PrettyJsonFileRecorder(max_bytes=MAX_STATE_BYTES).load(path)
    try:
        state = TrainingState.from_record(record, source=str(path))
    except RecordError:  # already typed, naming the file (a ValueError: not caught below)
        raise
    except (TypeError, ValueError, KeyError, OverflowError) as error:
        raise ArtifactFileError(f"not a training state ({error})", path) from None
    return state.history, f"{path.parent.name}/{path.name}"


# ---------------------------------------------------------------------- logs
def _entries(folder: Path, limit: int) -> list[tuple[str, Path]]:
    """The names and paths in ``folder`` (none if it is not a folder), at most ``limit``."""
    if not folder.is_dir():
        return []
    found: list[tuple[str, Path]] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if len(found) == limit:
                raise ArtifactFileError(f"holds more than {limit} entries", folder)
            found.append((entry.name, Path(entry.path)))
    return found


def _epoch_logs(split_dir: Path) -> Iterator[tuple[int, list[tuple[str, Path]]]]:
    """``(epoch, [(metric, log file), ...])`` of one split's folder, epoch by epoch."""
    epochs = [(int(match.group(1)), path) for name, path in _entries(split_dir, MAX_EPOCHS)
              if (match := _EPOCH_DIR.match(name)) and path.is_dir()]  # fmt: skip
    for epoch, folder in sorted(epochs):
        logs = [(name[: -len(".log")], path) for name, path in _entries(folder, MAX_METRICS)
                if name.endswith(".log") and name != ".log" and path.is_file()]  # fmt: skip
        yield epoch, sorted(logs)


def _lines(path: Path) -> tuple[int, Any]:
    """The count of complete lines of ``path``, and an iterator of ``(line number, bytes)``."""
    size = path.stat().st_size
    if size > MAX_LOG_BYTES:
        raise ArtifactFileError(f"{size} bytes, larger than a metric log ({MAX_LOG_BYTES})", path)
    count = 0
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            count += chunk.count(b"\n")
    if count > MAX_VALUES_PER_FILE:
        raise ArtifactFileError(f"holds {count} values, more than {MAX_VALUES_PER_FILE}", path)

    def lines() -> Any:
        with open(path, "rb") as file:
            for number in range(1, count + 1):
                line = file.readline(MAX_LINE_BYTES + 1)
                if not line.endswith(b"\n"):
                    raise ArtifactFileError(
                        f"line longer than {MAX_LINE_BYTES} bytes (a metric log holds one "
                        "number per line)", path, number)  # fmt: skip
                yield number, line

    return count, lines()


def _first_value_is_number(path: Path) -> bool | None:
    """Whether the log's first value is a number; None when it has no complete line."""
    with open(path, "rb") as file:
        line = file.readline(MAX_LINE_BYTES + 1)
    if not line.endswith(b"\n"):
        return None if len(line) <= MAX_LINE_BYTES else False
    try:
        float(line)
    except ValueError:
        return False
    return True


def _read_log(path: Path, epoch: int, series: StepSeries) -> float:
    """Appends one epoch's log to ``series``; returns the mean of its finite values (NaN
    when there are none)."""
    count, lines = _lines(path)
    total, finite = 0.0, 0
    for number, line in lines:
        try:
            value = float(line)
        except ValueError:
            shown = line.rstrip(b"\n").decode("utf-8", "replace")
            raise ArtifactFileError(
                f"{shown[:40]!r} is not a number (a numeric metric's log holds one number "
                "per line)", path, number) from None  # fmt: skip
        series.append(epoch - 1 + number / count, value)
        if math.isfinite(value):
            total += value
            finite += 1
    return total / finite if finite else math.nan


# ---------------------------------------------------------------------- config
def _config(path: Path) -> str | None:
    """``config.json`` as indented JSON; None when there is none."""
    if not path.is_file():
        return None
    with open(path, "rb") as file:
        data = file.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ArtifactFileError(f"larger than {MAX_CONFIG_BYTES} bytes: not a run config", path)
    try:
        record = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ArtifactFileError(f"not UTF-8 text ({error.reason} at byte {error.start})",
                                path) from None  # fmt: skip
    except json.JSONDecodeError as error:
        raise ArtifactFileError(f"not JSON: {error.msg} (column {error.colno})", path,
                                error.lineno) from None  # fmt: skip
    except RecursionError:
        raise ArtifactFileError("JSON nested too deeply", path) from None
    return json.dumps(record, indent=2, ensure_ascii=False)
