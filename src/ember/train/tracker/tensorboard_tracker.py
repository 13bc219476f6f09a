"""TensorBoardTracker: a run's metrics as TensorBoard event files, written by tensorboardX.

The event files go to ``<log_dir>/train`` and ``<log_dir>/valid``, one TensorBoard run
per split, so TensorBoard draws a metric's train and valid curves on one chart
(``tensorboard --logdir <log_dir>``). Tags: ``<Metric>`` per step (the batch value,
at the global step) and ``epoch/<Metric>`` per epoch (the epoch value, at the epoch).
The run's parameters are a text summary (``params``) of the train run.

A resumed run drops the events an interrupted run had written from its first step on
(tensorboardX's ``purge_step``), so each step has one point.

Needs the ``tensorboard`` extra: ``pip install 'ember[tensorboard]'`` (tensorboardX to
write; the ``tensorboard`` package to view and to read back).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember.train.tracker.base import ExperimentTracker, RunInfo, RunStatus, finite, require

if TYPE_CHECKING:
    from ember.module import Module
    from ember.train.renderer.base import Split


class TensorBoardTracker(ExperimentTracker):
    """Writes the run's metrics as TensorBoard event files (see the module docstring).

    Args:
        log_dir: the folder of the event files; default ``<artifact_dir>/tensorboard``.
        flush_secs: the longest time an event waits in memory before it is written
            (each epoch's end writes them too).

    Raises:
        MissingExtraError: tensorboardX is not installed (the ``tensorboard`` extra).
    """

    def __init__(self, log_dir: str | os.PathLike[str] | None = None, flush_secs: int = 30) -> None:
        self._tensorboardx = require("TensorBoardTracker", "tensorboard", "tensorboardX")
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.flush_secs = flush_secs
        self._run: RunInfo | None = None
        self._writers: dict[str, Any] = {}

    def start(self, run: RunInfo) -> None:
        self._run = run
        if self.log_dir is None:
            self.log_dir = run.artifact_dir / "tensorboard"
        if run.params:
            rows = "\n".join(f"| {key} | {value} |" for key, value in sorted(run.params.items()))
            table = f"| parameter | value |\n| --- | --- |\n{rows}"
            self._writer("train").add_text("params", table, run.first_steps.get("train", 1))

    def log_step(self, split: Split, values: Mapping[str, float], step: int) -> None:
        writer = self._writer(split)
        for name, value in finite(values).items():
            writer.add_scalar(name, value, step)

    def log_epoch(self, split: Split, values: Mapping[str, float], epoch: int) -> None:
        writer = self._writer(split)
        for name, value in finite(values).items():
            writer.add_scalar(f"epoch/{name}", value, epoch)
        writer.flush()  # a TensorBoard watching the run shows each epoch as it ends

    def finish(self, model: Module | None, status: RunStatus) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _writer(self, split: str) -> Any:
        writer = self._writers.get(split)
        if writer is None:
            if self._run is None or self.log_dir is None:
                raise RuntimeError("TensorBoardTracker: start(run) was not called")
            first = self._run.first_steps.get(split, 1)
            folder = self.log_dir / split
            # tensorboardX names an event file by the second and the host only: a second
            # writer in the same folder within that second (a resumed run, another run
            # writing there) would open the same file and write over the first one's events.
            # TensorBoard reads a folder's files in name order, so a resumed run's file must
            # also sort after the files before it (its purge of the later steps comes after
            # them): the count of files already there leads the suffix.
            before = sum(1 for _ in folder.glob("*tfevents*")) if folder.is_dir() else 0
            writer = self._writers[split] = self._tensorboardx.SummaryWriter(
                str(folder),
                purge_step=first if first > 1 else None,
                flush_secs=self.flush_secs,
                filename_suffix=f".{before:06d}.{os.getpid()}.{secrets.token_hex(4)}",
            )
        return writer
