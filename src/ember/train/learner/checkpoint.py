"""FileCheckpointer: the model, optimizer, scheduler and training state of an epoch, on disk.

At the end of every epoch the learner saves four files in ``<artifact_dir>/checkpoint``
(``NamedMpkGzFileRecorder`` shown; the extension is the recorder's)::

    model-<epoch>.mpk.gz        the model's record
    optim-<epoch>.mpk.gz        the optimizer's state (moments, step counts)
    scheduler-<epoch>.mpk.gz    the learning-rate scheduler's state
    state-<epoch>.json          the training state: the epoch, whether it was complete,
                                the metric history and the early-stopping state

**Exact resume.** The default recorder is ``NamedMpkGzFileRecorder()`` at full
precision (f32), so a model that trains in f32 resumes bit for bit. Burn's book uses
``CompactRecorder`` (half precision): its files are half the size, but a resumed run
then starts from rounded weights and moments and drifts from the uninterrupted one.
A model that trains in f64 needs ``NamedMpkGzFileRecorder(DoublePrecision)``.

**Crash safety.** Each file is written atomically, and the state file is the commit
mark of a checkpoint: it is removed before the other files of its epoch are
(re)written and written after them. A crash part way through a save therefore leaves
that epoch without a state file (not a checkpoint), and every earlier checkpoint
intact, since pruning runs only after the commit. A process killed during a write
leaves a temporary file behind; the checkpointer removes those whose writer is gone
when it starts (see :mod:`ember.atomic`).

**Pruning.** After each end-of-epoch save, the checkpointer keeps the last
``keep_last`` complete epochs and, with ``keep_best=(metric, split)``, the epoch where
that metric was best, and deletes the others. Checkpoints of epochs after the one just
saved belong to a run that was resumed from an earlier epoch: they are deleted too.

**Interruptions.** A run stopped during an epoch (Ctrl-C, the dashboard's stop key)
saves its current state as that epoch's checkpoint, marked incomplete
(``complete: false`` with the iteration reached). Its model file loads like any other;
training resumes exactly from the end of an epoch only, so ``learner.checkpoint(e)``
refuses an incomplete epoch ``e`` and names the last complete one (kept by pruning).

Example:
    >>> import tempfile
    >>> import ember
    >>> from ember.nn.linear import LinearConfig
    >>> from ember.optim.sgd import SgdConfig
    >>> from ember.optim.lr_scheduler.constant import ConstantLr
    >>> model = LinearConfig(2, 1).init(ember.device("ndarray").autodiff())
    >>> checkpointer = FileCheckpointer(tempfile.mkdtemp(), keep_last=1)
    >>> for epoch in (1, 2):
    ...     checkpointer.save(epoch, model, SgdConfig().init(), ConstantLr(0.1),
    ...                       TrainingState(epoch))
    >>> checkpointer.epochs()
    [2]
    >>> loaded, _, _, state = checkpointer.load(2, model, SgdConfig().init(), ConstantLr(0.1))
    >>> loaded.weight.val().tolist() == model.weight.val().tolist(), state.complete
    (True, True)
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ember.atomic import remove_stale_temporaries
from ember.backend.errors import ArgumentError, RecordFileNotFoundError, RecordMismatchError
from ember.module import Module
from ember.optim.lr_scheduler.base import LrScheduler
from ember.optim.optimizer import Optimizer
from ember.record.recorder import FileRecorder, NamedMpkGzFileRecorder, PrettyJsonFileRecorder
from ember.train.learner.history import MetricHistory
from ember.train.renderer.base import Split

M = TypeVar("M", bound=Module)

STATE_VERSION = 1


@dataclass
class TrainingState:
    """What a checkpoint holds besides the records: where the run was, and what it saw.

    Args:
        epoch: the epoch the checkpoint was written in (from 1).
        complete: True at the end of an epoch (training and validation done); False for
            a run interrupted during the epoch.
        iteration: for an incomplete checkpoint, the iterations of the epoch's training
            done (the training's iteration count if it stopped during validation).
        history: every numeric metric's value at the end of every complete epoch.
        early_stopping: the early-stopping state (``MetricEarlyStopping.to_record()``),
            or None without early stopping.
        rng: the random generator state of each training device (``backend.rng_state``),
            keyed by ``str(device)``, so dropout draws on after a resume as it would have.
    """

    epoch: int
    complete: bool = True
    iteration: int | None = None
    history: MetricHistory = field(default_factory=MetricHistory)
    early_stopping: dict[str, Any] | None = None
    rng: dict[str, str] | None = None

    def to_record(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "complete": self.complete,
            "iteration": self.iteration,
            "history": self.history.to_record(),
            "early_stopping": self.early_stopping,
            "rng": self.rng,
        }

    @staticmethod
    def from_record(record: Any, source: str = "training state") -> TrainingState:
        """The state :meth:`to_record` saved.

        Raises:
            RecordMismatchError: ``record`` is not a training state of this version.
        """
        keys = {"version", "epoch", "complete", "iteration", "history", "early_stopping", "rng"}
        if not isinstance(record, dict) or set(record) != keys:
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise RecordMismatchError(
                f"{source}: expected a training state with keys {sorted(keys)}, got {found}"
            )
        if record["version"] != STATE_VERSION:
            raise RecordMismatchError(
                f"{source}: training state version {record['version']!r}, this ember reads "
                f"version {STATE_VERSION}",
                path="version",
            )
        return TrainingState(
            epoch=int(record["epoch"]),
            complete=bool(record["complete"]),
            iteration=record["iteration"],
            history=MetricHistory.from_record(record["history"]),
            early_stopping=record["early_stopping"],
            rng=record["rng"],
        )


class FileCheckpointer:
    """Saves, loads and prunes the checkpoints of a run (see the module docstring).

    Args:
        directory: where the files go (created on the first save).
        recorder: the file recorder of the model, optimizer and scheduler records.
            Default: ``NamedMpkGzFileRecorder()`` at full precision, for exact resume.
        keep_last: how many of the latest complete checkpoints to keep; None keeps all.
            Default: 2.
        keep_best: ``(metric name, split)``: also keep the epoch where that numeric
            metric was best. Default: None.
        best_lower_is_better: the metric's direction; the learner sets it from the
            registered metric. Default: True.

    Raises:
        ArgumentError: a bad recorder, ``keep_last`` or ``keep_best``.
    """

    def __init__(
        self,
        directory: str | Path,
        recorder: FileRecorder | None = None,
        keep_last: int | None = 2,
        keep_best: tuple[str, Split] | None = None,
        best_lower_is_better: bool = True,
    ) -> None:
        if recorder is None:
            recorder = NamedMpkGzFileRecorder()
        if not isinstance(recorder, FileRecorder):
            raise ArgumentError(
                "FileCheckpointer: recorder must be a FileRecorder such as "
                f"NamedMpkGzFileRecorder(), got {type(recorder).__name__}"
            )
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise ArgumentError(
                f"FileCheckpointer: keep_last must be an integer >= 1 or None, got {keep_last!r}"
            )
        if keep_best is not None and not (
            isinstance(keep_best, tuple)
            and len(keep_best) == 2
            and isinstance(keep_best[0], str)
            and keep_best[1] in ("train", "valid")
        ):
            raise ArgumentError(
                "FileCheckpointer: keep_best must be (metric name, 'train' or 'valid'), "
                f"e.g. ('Loss', 'valid'), got {keep_best!r}"
            )
        self.directory = Path(directory)
        self.recorder = recorder
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.best_lower_is_better = best_lower_is_better
        self._state_recorder = PrettyJsonFileRecorder()
        # The temporaries of a run killed while saving (a live run's are left alone).
        remove_stale_temporaries(self.directory)

    # ------------------------------------------------------------------ paths
    def path(self, kind: str, epoch: int) -> Path:
        """The file of ``kind`` (``model``, ``optim``, ``scheduler`` or ``state``) of ``epoch``."""
        recorder = self._state_recorder if kind == "state" else self.recorder
        return recorder.path_for(self.directory / f"{kind}-{epoch}")

    def epochs(self) -> list[int]:
        """The epochs that have a committed checkpoint (a state file), ascending."""
        if not self.directory.is_dir():
            return []
        pattern = re.compile(r"state-(\d+)\." + re.escape(self._state_recorder.extension) + "$")
        found = (pattern.match(path.name) for path in self.directory.iterdir())
        return sorted(int(match.group(1)) for match in found if match)

    # ------------------------------------------------------------------ save and load
    def save(self, epoch: int, model: Module, optimizer: Optimizer, scheduler: LrScheduler,
             state: TrainingState) -> None:  # fmt: skip
        """Writes the checkpoint of ``epoch``; then, for a complete one, prunes.

        Raises:
            RecordError: a record that cannot be saved (the earlier checkpoints stay).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        # Uncommit first: a crash below must not leave new records beside an old state.
        self._unlink(self.path("state", epoch))
        self.recorder.save(model.into_record(), self.path("model", epoch))
        self.recorder.save(optimizer.to_record(), self.path("optim", epoch))
        self.recorder.save(scheduler.to_record(), self.path("scheduler", epoch))
        self._state_recorder.save(state.to_record(), self.path("state", epoch))
        if state.complete:
            self.prune(epoch, state.history)

    def load_state(self, epoch: int) -> TrainingState:
        """The training state of ``epoch``'s checkpoint.

        Raises:
            RecordFileNotFoundError: there is no committed checkpoint of ``epoch``.
        """
        path = self.path("state", epoch)
        if not path.is_file():
            found = ", ".join(map(str, self.epochs())) or "none"
            raise RecordFileNotFoundError(
                f"no checkpoint of epoch {epoch} in {self.directory} (no {path.name}; "
                f"the checkpoints there are of epochs: {found})",
                file=str(path),
            )
        return TrainingState.from_record(self._state_recorder.load(path), source=str(path))

    def load(self, epoch: int, model: M, optimizer: Optimizer, scheduler: LrScheduler
             ) -> tuple[M, Optimizer, LrScheduler, TrainingState]:  # fmt: skip
        """The model, optimizer, scheduler and training state of ``epoch``'s checkpoint.

        ``model`` gets the saved parameters (and their ids, which the optimizer state is
        keyed by), ``optimizer`` the saved state (it is changed in place), and a new
        scheduler continues from the saved one.

        Raises:
            RecordFileNotFoundError: the checkpoint or one of its files is missing.
            RecordMismatchError: a record that does not fit the model, optimizer or
                scheduler (the message names the file and the offending path).
        """
        state = self.load_state(epoch)
        model = model.load_record(self._load("model", epoch))
        optimizer.load_record(self._load("optim", epoch))
        scheduler = scheduler.load_record(self._load("scheduler", epoch))
        return model, optimizer, scheduler, state

    def _load(self, kind: str, epoch: int) -> Any:
        return self.recorder.load(self.path(kind, epoch))

    # ------------------------------------------------------------------ pruning
    def prune(self, epoch: int, history: MetricHistory) -> list[int]:
        """Deletes the checkpoints not kept after the save of complete ``epoch``.

        Kept: the last ``keep_last`` complete epochs up to ``epoch`` and the best epoch by
        ``keep_best``. Returns the epochs deleted.
        """
        complete, stale = [], []
        for found in self.epochs():
            if found > epoch:
                stale.append(found)
            elif found == epoch or self.load_state(found).complete:
                complete.append(found)
            else:
                stale.append(found)  # an interrupted epoch this run has gone past
        keep = set(complete if self.keep_last is None else complete[-self.keep_last :])
        if self.keep_best is not None:
            name, split = self.keep_best
            best = history.best_epoch(split, name, self.best_lower_is_better)
            if best is not None:
                keep.add(best)
        deleted = [found for found in complete + stale if found not in keep]
        for found in deleted:
            self.delete(found)
        return sorted(deleted)

    def delete(self, epoch: int) -> None:
        """Removes the files of ``epoch``'s checkpoint, the state file first."""
        for kind in ("state", "model", "optim", "scheduler"):
            self._unlink(self.path(kind, epoch))

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def __repr__(self) -> str:
        return (f"FileCheckpointer({str(self.directory)!r}, {self.recorder!r}, "
                f"keep_last={self.keep_last}, keep_best={self.keep_best})")  # fmt: skip
