"""Learner: the training loop that ``LearnerBuilder.build`` returns; ``fit`` runs it.

Each epoch, ``fit``:

1. sets the epoch on the loaders (the order of an epoch depends only on the seed and
   the epoch, so a resumed run sees the batches an uninterrupted one saw);
2. trains: per iteration, ``model.train_step(batch)``; the gradients of
   ``grads_accumulation`` iterations are **summed** (as Burn does, not averaged) and
   one optimizer step applies them, with the learning rate of one ``scheduler.step()``
   per optimizer step; the training metrics are updated with the step's item
   (``adapt(item, metric.input_type)``), then the loggers and the renderer are told;
   a last, shorter group of iterations at an epoch's end still steps. The scheduler
   advances once per optimizer step, so with accumulation a schedule's ``num_iters``
   counts optimizer steps, not iterations;
3. validates: ``model.valid().valid_step(batch)`` on the validation loader moved to the
   inner device (``loader.to_device(device.inner())``), with the validation metrics;
4. records every numeric metric's epoch value, checks early stopping, and saves the
   checkpoint of the epoch (then prunes the old ones).

**Several devices.** With ``devices([d0, d1, ...])`` the training loader is split into
one part per device (``loader.split``); an iteration takes the next batch of every part,
runs each ``train_step`` on a copy of the model on its device (``model.fork``), sums the
gradients on ``d0`` and steps once. The steps run one after another in the training
thread; each item feeds the training metrics. Validation runs on ``d0``'s inner device.

**Several processes.** In a job of several processes (``ember launch``, ``torchrun``,
after ``ember.distributed.init()``) the learner trains data-parallel, one device per
process: each rank reads its part of every epoch, gradients are averaged over the ranks
during the backward pass, metrics are combined over the ranks, and only rank 0 writes
(see :mod:`ember.train.learner.data_parallel`).

**Stopping.** Ctrl-C (SIGINT, when ``fit`` runs in the main thread) and the
:class:`~ember.train.renderer.base.TrainingInterrupter` (the dashboard's stop key,
or any code holding ``builder.interrupter()``) both ask the learner to stop. It
finishes the current iteration, saves the current state as an incomplete checkpoint
of the epoch, restores the previous SIGINT handler and returns the model (the gradients of an
unfinished accumulation group are dropped). A second
Ctrl-C while it stops runs the previous handler (``KeyboardInterrupt`` by default).

**Resuming.** ``builder.checkpoint(epoch)`` loads the model, optimizer, scheduler and
training state of the end of ``epoch`` and continues with ``epoch + 1``: with the
default full-precision recorder and a deterministic ``train_step``, the final weights
and the metric logs equal those of an uninterrupted run. A run interrupted during an
epoch resumes from the last complete epoch (see
:mod:`ember.train.learner.checkpoint`); its incomplete checkpoint is there to use the
weights it reached. The state of each training device's random generator is saved
too, so a model that draws random numbers (dropout) draws on as it would have.

**Trackers.** The experiment trackers (``LearnerBuilder.tracker``: TensorBoard,
MLflow; see :mod:`ember.train.tracker`) start when training starts, with the run's
parameters (the learner's options under ``learner.`` and ``LearnerBuilder.params``),
get every numeric metric's batch value at each step (numbered over the run, so a
resumed run goes on with the steps of the epochs it resumes) and each epoch's
value (the one in the summary), and finish with the final model and how the run
ended: FINISHED, KILLED (interrupted) or FAILED (an error; the error propagates).

**Artifacts.** Under the artifact directory: ``experiment.log`` (every ``ember``
log record of the run, INFO and up, appended to), ``train/`` and ``valid/`` (the
metric loggers' files, ``epoch-<n>/<Metric>.log``), ``checkpoint/`` and, when
matplotlib is installed, ``report/`` (the training report: ``index.html`` and a PNG
chart per numeric metric, see :mod:`ember.train.report`; ``LearnerBuilder.report(False)``
turns it off).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

from ember.backend.device import Device
from ember.backend.errors import ArgumentError, EmberError, UnsupportedError
from ember.module import Module
from ember.optim.accumulator import GradientsAccumulator
from ember.optim.lr_scheduler.base import LrScheduler
from ember.optim.optimizer import Optimizer
from ember.train.learner.checkpoint import FileCheckpointer, TrainingState
from ember.train.learner.data_parallel import DataParallel
from ember.train.learner.early_stopping import MetricEarlyStopping
from ember.train.learner.history import MetricHistory
from ember.train.learner.summary import LearnerSummary
from ember.train.logger import MetricLogger, experiment_log
from ember.train.metric.base import Metric, MetricEntry, MetricMetadata, Numeric, Progress, adapt
from ember.train.renderer.base import (
    MetricsRenderer,
    MetricUpdate,
    Split,
    TrainingInterrupter,
    TrainingProgress,
)
from ember.train.step import TrainOutput
from ember.train.tracker.base import ExperimentTracker, ParamValue, RunInfo, RunStatus

log = logging.getLogger(__name__)


class Learner:
    """A configured training run; build it with :class:`~ember.train.learner.builder.LearnerBuilder`.

    A learner fits once: :meth:`fit` returns the trained model, and the optimizer and
    scheduler it was built with hold their final state.
    """

    def __init__(
        self,
        *,
        model: Module,
        optimizer: Optimizer,
        scheduler: LrScheduler,
        artifact_dir: Path,
        train_metrics: Sequence[tuple[Metric, bool]],
        valid_metrics: Sequence[tuple[Metric, bool]],
        loggers: tuple[MetricLogger | None, MetricLogger | None],
        renderer: MetricsRenderer,
        grads_accumulation: int,
        checkpointer: FileCheckpointer | None,
        num_epochs: int,
        devices: Sequence[Device],
        resume_epoch: int | None,
        early_stopping: MetricEarlyStopping | None,
        summary: bool,
        interrupter: TrainingInterrupter,
        trackers: Sequence[ExperimentTracker] = (),
        params: Mapping[str, ParamValue] | None = None,
        report: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.artifact_dir = artifact_dir
        self.metrics: dict[Split, Sequence[tuple[Metric, bool]]] = {
            "train": train_metrics, "valid": valid_metrics,
        }  # fmt: skip
        self.loggers: dict[Split, MetricLogger | None] = dict(zip(("train", "valid"), loggers))
        self.renderer = renderer
        self.grads_accumulation = grads_accumulation
        self.checkpointer = checkpointer
        self.num_epochs = num_epochs
        self.devices = list(devices)
        self.resume_epoch = resume_epoch
        self.early_stopping = early_stopping
        self.with_summary = summary
        self.with_report = report
        self.interrupter = interrupter
        self.history = MetricHistory()
        self.summary: LearnerSummary | None = None
        self._fitted = False
        self.parallel: DataParallel | None = None
        self._combined: dict[Split, dict[str, float]] = {"train": {}, "valid": {}}
        self._stop_asked = False
        self.trackers = list(trackers)
        self.params = dict(params or {})
        self._started: list[ExperimentTracker] = []  # the trackers whose run is open
        self._per_epoch: dict[Split, int | None] = {"train": None, "valid": None}
        self._interrupted_run = False

    # ------------------------------------------------------------------ the run
    def fit(self, train_loader: Any, valid_loader: Any | None) -> Module:
        """Trains the model and returns it (on the training device).

        Args:
            train_loader: a :class:`~ember.data.dataloader.loader.DataLoader` of training
                batches (made on the autodiff device).
            valid_loader: a loader of validation batches, moved to the inner device for
                validation; None skips validation.

        Returns:
            the model after the last epoch, or where an interruption stopped it.

        Raises:
            ArgumentError: the learner already fitted, a checkpoint to resume from that
                is incomplete, or a ``train_step`` that returns no ``TrainOutput``.
            RecordError: a checkpoint that cannot be loaded.
        """
        if self._fitted:
            raise ArgumentError("Learner.fit: a learner fits once; build a new one to train again")
        self._fitted = True
        self.parallel = DataParallel.current()
        if self._writes:
            self.artifact_dir.mkdir(parents=True, exist_ok=True)
        else:  # only rank 0 shows and writes (see data_parallel.py)
            self.renderer, self.with_summary, self.with_report = _Silent(), False, False
            self.loggers = {"train": None, "valid": None}
            self.trackers = []
        log_file = experiment_log(self.artifact_dir) if self._writes else contextlib.nullcontext()
        with log_file, _sigint_stops(self.interrupter):
            trained: Module | None = None
            try:
                self.renderer.bind(self.interrupter)
                model = trained = self._run(train_loader, valid_loader)
            finally:
                self.renderer.close()
                self._finish_trackers(trained)
            if self.with_summary:
                self.summary = LearnerSummary.from_history(
                    self.history, self.num_epochs, type(model).__name__
                )
                print(self.summary, flush=True)
                log.info("summary\n%s", self.summary)
            if self.with_report:
                self._write_report(type(model).__name__)
        return model

    def _write_report(self, model_name: str) -> None:
        """Writes the training report; a missing matplotlib or a failure is a notice only
        (the trained model matters more; ``ember report`` can write it again)."""
        if not self.history.metrics():
            return  # no numeric metric: nothing to chart
        from ember.train.report import write_report
        from ember.train.tracker.base import MissingExtraError

        try:
            path = write_report(self.artifact_dir, history=self.history, model=model_name,
                                num_epochs=self.num_epochs)  # fmt: skip
        except MissingExtraError:
            print("ember: no training report (it needs matplotlib: pip install "
                  "'ember[report]'; LearnerBuilder.report(False) turns it off)",
                  file=sys.stderr, flush=True)  # fmt: skip
            return
        except Exception as error:  # a hostile file in the folder, a full disk, a plot bug
            log.warning("the training report could not be written (%s: %s); write it with "
                        "`ember report %s`", type(error).__name__, error, self.artifact_dir,
                        exc_info=not isinstance(error, EmberError | OSError))  # fmt: skip
            return
        log.info("training report: %s", path)
        print(f"Training report: {path}", flush=True)

    def _run(self, train_loader: Any, valid_loader: Any | None) -> Module:
        model, start = self._resume()
        limit = valid_limit = None
        if self.parallel is not None:
            if len(self.devices) > 1:
                raise ArgumentError(
                    f"Learner: in a job of {self.parallel.world_size} processes each process "
                    f"trains on one device, got devices {', '.join(map(str, self.devices))}"
                )
            model = self.parallel.start(model)
            train_loader, limit = self.parallel.shard(train_loader)
            if valid_loader is not None:
                valid_loader, valid_limit = self.parallel.shard(valid_loader)
        log.info(
            "training %s (%d parameters) for epochs %d to %d on %s, artifacts in %s",
            type(model).__name__, model.num_params(), start, self.num_epochs,
            ", ".join(map(str, self.devices)), self.artifact_dir,
        )  # fmt: skip
        for logger in self.loggers.values():
            if logger is not None and start > 1:
                logger.end_epoch(start - 1)  # the loggers write the next epoch's files
        if len(self.devices) == 1:
            parts = [train_loader]
        else:
            parts = [part.to_device(device)
                     for part, device in zip(train_loader.split(len(self.devices)), self.devices)]  # fmt: skip
        valid = None if valid_loader is None else valid_loader.to_device(self.devices[0].inner())
        self._per_epoch = {"train": _iterations(parts, limit),
                           "valid": None if valid is None else _iterations([valid], valid_limit)}  # fmt: skip
        self._start_trackers(model, start)

        for epoch in range(start, self.num_epochs + 1):
            if self._should_stop():  # in a job: as every rank saw it at the last iteration
                log.info("stop requested before epoch %d: training ends", epoch)
                self._interrupted_run = True
                break
            model, iteration, stopped = self._train_epoch(model, parts, epoch, limit)
            if not stopped and valid is not None:
                stopped = self._valid_epoch(model.valid(), valid, epoch, valid_limit)
            if stopped:
                self._interrupted(model, epoch, iteration)
                break
            self._log_epoch(epoch)
            stop = self._check_early_stopping(epoch)
            if self.checkpointer is not None and self._writes:
                early = None if self.early_stopping is None else self.early_stopping.to_record()
                state = TrainingState(epoch, True, None, self.history, early, self._rng_states())
                self.checkpointer.save(epoch, model, self.optimizer, self.scheduler, state)
                log.info("saved the checkpoint of epoch %d in %s", epoch,
                         self.checkpointer.directory)  # fmt: skip
            if stop:
                break
        return model

    def _resume(self) -> tuple[Module, int]:
        model = self.model
        if self.resume_epoch is None:
            return model, 1
        assert self.checkpointer is not None  # the builder checks it
        epoch = self.resume_epoch
        state = self.checkpointer.load_state(epoch)
        if not state.complete:
            complete = [e for e in self.checkpointer.epochs() if e < epoch]
            hint = f"resume from .checkpoint({complete[-1]})" if complete else "start over"
            raise ArgumentError(
                f"Learner: the checkpoint of epoch {epoch} was written when training was "
                f"interrupted during that epoch (after {state.iteration} iterations); training "
                f"resumes exactly only from the end of an epoch: {hint}"
            )
        model, self.optimizer, self.scheduler, state = self.checkpointer.load(
            epoch, model, self.optimizer, self.scheduler
        )
        self.history = state.history
        self.history.truncate(epoch)
        if self.early_stopping is not None and state.early_stopping is not None:
            self.early_stopping.load_record(state.early_stopping)
        for device in self.devices:
            saved = (state.rng or {}).get(str(device))
            if saved is not None:
                device.backend.set_rng_state(device, saved)
        log.info("resumed from the checkpoint of epoch %d", epoch)
        return model, epoch + 1

    # ------------------------------------------------------------------ epochs
    @property
    def _writes(self) -> bool:
        return self.parallel is None or self.parallel.is_main

    def _train_epoch(self, model: Module, parts: list[Any], epoch: int,
                     limit: int | None = None) -> tuple[Module, int, bool]:  # fmt: skip
        """One training epoch; returns the model, the iterations run and whether it stopped.
        ``limit``: the iterations every rank of a job runs."""
        for part in parts:
            part.set_epoch(epoch)
        total = sum(part.num_items() for part in parts)
        per_iteration = parts[0].batch_size * len(parts)
        accumulator = GradientsAccumulator()
        pending, lr, iteration, stopped = 0, 0.0, 0, False
        batches_of = zip_longest(*parts)
        for batches in islice(batches_of, limit):
            iteration += 1
            if pending == 0:
                lr = self.scheduler.step()
            outputs = [
                self._train_step(model if i == 0 else model.fork(self.devices[i]), batch)
                for i, batch in enumerate(batches)
                if batch is not None
            ]
            pending += 1
            if self.grads_accumulation == 1 and len(outputs) == 1:  # nothing to sum
                model = self.optimizer.step(lr, model, outputs[0].grads)
                pending = 0
            else:
                for output in outputs:
                    accumulator.accumulate(model, output.grads)
                if pending == self.grads_accumulation:
                    model = self.optimizer.step(lr, model, accumulator.grads())
                    pending = 0
            progress = Progress(min(iteration * per_iteration, total), total)
            metadata = MetricMetadata(progress, epoch, self.num_epochs, iteration, lr)
            for output in outputs:
                self._update_metrics("train", output.item, metadata)
            self.renderer.render_train(TrainingProgress(progress, epoch, self.num_epochs, iteration))
            if self._should_stop():
                stopped = True
                break
        if pending and not stopped:  # the epoch's last, shorter group
            model = self.optimizer.step(lr, model, accumulator.grads())
        self._end_epoch("train", epoch, complete=not stopped)
        return model, iteration, stopped

    def _train_step(self, model: Module, batch: Any) -> TrainOutput[Any]:
        if self.parallel is None:
            output = model.train_step(batch)  # type: ignore[attr-defined]
        else:
            with self.parallel.syncing(model):
                output = model.train_step(batch)  # type: ignore[attr-defined]
        if not isinstance(output, TrainOutput):
            raise ArgumentError(
                f"Learner: {type(model).__name__}.train_step must return a TrainOutput "
                f"(TrainOutput.new(self, loss.backward(), item)), got {type(output).__name__}"
            )
        return output

    def _valid_epoch(self, model: Module, loader: Any, epoch: int, limit: int | None = None) -> bool:
        """One validation epoch; returns whether it was stopped."""
        loader.set_epoch(epoch)
        total, stopped = loader.num_items(), False
        count = len(loader) if limit is None else limit
        batches = islice(loader, limit)
        for iteration, batch in enumerate(batches, 1):
            item = model.valid_step(batch)  # type: ignore[attr-defined]
            progress = Progress(min(iteration * loader.batch_size, total), total)
            metadata = MetricMetadata(progress, epoch, self.num_epochs, iteration)
            self._update_metrics("valid", item, metadata)
            self.renderer.render_valid(TrainingProgress(progress, epoch, self.num_epochs, iteration))
            # A stop during the last iteration leaves the epoch complete.
            if self._should_stop() and iteration < count:
                stopped = True
                break
        self._end_epoch("valid", epoch, complete=not stopped)
        return stopped

    def _update_metrics(self, split: Split, item: Any, metadata: MetricMetadata) -> None:
        show = self.renderer.update_train if split == "train" else self.renderer.update_valid
        logger = self.loggers[split]
        metrics = self.metrics[split]
        entries = [metric.update(adapt(item, metric.input_type), metadata) for metric, _ in metrics]
        values = [metric.value() if isinstance(metric, Numeric) else math.nan for metric, _ in metrics]
        if self.parallel is not None:  # every rank's values, and its stop request, combined
            items = metadata.progress.items_processed
            values, self._stop_asked = self.parallel.combine(
                [(v, items) for v in values], self.interrupter.should_stop())
            self._combined[split] = {m.name: v for (m, _), v in zip(metrics, values, strict=True)}
        for (_, plotted), entry, value in zip(metrics, entries, values, strict=True):
            show(MetricUpdate(entry, value if plotted else None))
            if logger is not None:
                logger.log(entry)
        if self.trackers:
            step = self._step(split, metadata)
            numbers = {entry.name: number for (metric, _), entry in zip(metrics, entries, strict=True)
                       if isinstance(metric, Numeric) and (number := _number(entry)) is not None}  # fmt: skip
            for tracker in self.trackers:
                tracker.log_step(split, numbers, step)

    def _should_stop(self) -> bool:
        """A stop was asked (in a job: on any rank, as of the last metrics update)."""
        return self._stop_asked if self.parallel is not None else self.interrupter.should_stop()

    def _end_epoch(self, split: Split, epoch: int, complete: bool) -> None:
        """Records the epoch values (of a complete epoch), tells the others, clears."""
        if complete:
            combined = self._combined[split]
            for metric, _ in self.metrics[split]:
                if isinstance(metric, Numeric):
                    value = combined[metric.name] if self.parallel is not None else metric.value()
                    self.history.record(split, metric.name, epoch, value)
            self.renderer.on_epoch_end(split, epoch)
            if self.trackers:
                values = {name: self.history.value(s, name, epoch)
                          for s, name in self.history.metrics() if s == split}  # fmt: skip
                epoch_values = {name: v for name, v in values.items() if v is not None}
                for tracker in self.trackers:
                    tracker.log_epoch(split, epoch_values, epoch)
        logger = self.loggers[split]
        if logger is not None:
            logger.end_epoch(epoch)
        for metric, _ in self.metrics[split]:
            metric.clear()

    # ------------------------------------------------------------------ after an epoch
    def _check_early_stopping(self, epoch: int) -> bool:
        stopping = self.early_stopping
        if stopping is None:
            return False
        value = self.history.value(stopping.split, stopping.metric, epoch)
        if value is None or not stopping.update(epoch, value):
            return False
        log.info(
            "early stopping after epoch %d: %s of %s has not improved by more than %g since "
            "epoch %s (%s)", epoch, stopping.metric, stopping.split, stopping.min_delta,
            stopping.best_epoch, stopping.best_value,
        )  # fmt: skip
        return True

    def _rng_states(self) -> dict[str, str] | None:
        """Each device's generator state; None where a backend keeps none it can report."""
        try:
            return {str(device): device.backend.rng_state(device) for device in self.devices}
        except UnsupportedError:
            return None

    def _interrupted(self, model: Module, epoch: int, iteration: int) -> None:
        self._interrupted_run = True
        if not self._writes:
            return
        if self.checkpointer is None:
            log.warning("training stopped during epoch %d (iteration %d); no checkpointer is "
                        "configured, so nothing was saved", epoch, iteration)  # fmt: skip
            return
        early = None if self.early_stopping is None else self.early_stopping.to_record()
        state = TrainingState(epoch, False, iteration, self.history, early, self._rng_states())
        self.checkpointer.save(epoch, model, self.optimizer, self.scheduler, state)
        complete = [e for e in self.checkpointer.epochs() if e < epoch]
        log.warning(
            "training stopped during epoch %d (iteration %d): saved the current state as the "
            "incomplete checkpoint %d in %s; %s", epoch, iteration, epoch,
            self.checkpointer.directory,
            f"resume exactly with .checkpoint({complete[-1]})" if complete
            else "no epoch was complete, a new run starts over",
        )  # fmt: skip

    # ------------------------------------------------------------------ trackers
    def _step(self, split: Split, metadata: MetricMetadata) -> int:
        """The tracker step of an iteration: counted over the run's epochs, from 1."""
        per_epoch = self._per_epoch[split]
        if per_epoch is None:  # a loader without len(): steps count within each epoch
            return metadata.iteration
        return (metadata.epoch - 1) * per_epoch + metadata.iteration

    def _start_trackers(self, model: Module, start: int) -> None:
        if not self.trackers:
            return
        params: dict[str, ParamValue] = {
            "learner.model": type(model).__name__,
            "learner.num_params": model.num_params(),
            "learner.num_epochs": self.num_epochs,
            "learner.grads_accumulation": self.grads_accumulation,
            "learner.optimizer": type(self.optimizer).__name__,
            "learner.lr_scheduler": type(self.scheduler).__name__,
            "learner.devices": ", ".join(map(str, self.devices)),
            "learner.world_size": 1 if self.parallel is None else self.parallel.world_size,
            "learner.train_metrics": ", ".join(m.name for m, _ in self.metrics["train"]),
            "learner.valid_metrics": ", ".join(m.name for m, _ in self.metrics["valid"]),
        }
        if dataclasses.is_dataclass(self.scheduler):  # ConstantLr(lr=...), the schedules' fields
            for field in dataclasses.fields(self.scheduler):
                value = getattr(self.scheduler, field.name)
                if isinstance(value, int | float | str | bool):
                    params[f"learner.lr_scheduler.{field.name}"] = value
        first_steps: dict[str, int] = {split: 1 if n is None else (start - 1) * n + 1
                                       for split, n in self._per_epoch.items()}  # fmt: skip
        run = RunInfo(self.artifact_dir, type(model).__name__, {**params, **self.params},
                      start, self.num_epochs, first_steps)  # fmt: skip
        for tracker in self.trackers:
            tracker.start(run)
            self._started.append(tracker)

    def _finish_trackers(self, model: Module | None) -> None:
        """Ends the trackers' runs; ``model`` None: the run failed (its error propagates)."""
        status: RunStatus = "FAILED" if model is None else "KILLED" if self._interrupted_run else "FINISHED"
        failures = []
        for tracker in self._started:
            try:
                tracker.finish(model, status)
            except Exception as error:  # the other trackers still finish
                log.exception("%s could not finish the run", type(tracker).__name__)
                failures.append(error)
        self._started.clear()
        if failures and model is not None:  # a failed run raises its own error
            raise failures[0]

    def _log_epoch(self, epoch: int) -> None:
        parts = []
        for split in ("train", "valid"):
            values = [
                f"{name} {self.history.value(s, name, epoch):.6g}"
                for s, name in self.history.metrics()
                if s == split and self.history.value(s, name, epoch) is not None
            ]
            if values:
                parts.append(f"{split}: " + ", ".join(values))
        log.info("epoch %d/%d done; %s", epoch, self.num_epochs, "; ".join(parts) or "no metrics")


def _iterations(loaders: Sequence[Any], limit: int | None) -> int | None:
    """The iterations of an epoch over ``loaders`` side by side; None without len()."""
    try:
        count = max(len(loader) for loader in loaders)
    except TypeError:
        return limit
    return count if limit is None else min(count, limit)


def _number(entry: MetricEntry) -> float | None:
    """A numeric metric's batch value (what its logger writes); None if it is not a number."""
    try:
        return float(entry.serialized)
    except ValueError:
        return None


# ---------------------------------------------------------------------- Ctrl-C
@contextlib.contextmanager
def _sigint_stops(interrupter: TrainingInterrupter) -> Iterator[None]:
    """Makes Ctrl-C ask ``interrupter`` to stop; the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        if interrupter.should_stop():  # asked twice: behave as before fit()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt
            return
        log.warning("Ctrl-C: stopping after the current iteration and saving a checkpoint "
                    "(press Ctrl-C again to abort at once)")  # fmt: skip
        interrupter.stop()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


class _Silent(MetricsRenderer):
    """The renderer of ranks other than 0: they show nothing."""

    def update_train(self, update: MetricUpdate) -> None:
        pass

    def update_valid(self, update: MetricUpdate) -> None:
        pass

    def render_train(self, progress: TrainingProgress) -> None:
        pass

    def render_valid(self, progress: TrainingProgress) -> None:
        pass
