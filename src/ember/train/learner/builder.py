"""LearnerBuilder: the options of a training run, set one call at a time.

==================================  ===================================================
option                              what it does
==================================  ===================================================
``metric_train(m)``                 a training metric, logged and shown as text
``metric_valid(m)``                 a validation metric, logged and shown as text
``metric_train_numeric(m)``         a numeric training metric, also plotted
``metric_valid_numeric(m)``         a numeric validation metric, also plotted
``metric_loggers(train, valid)``    the metric loggers (default: files under
                                    ``<artifact_dir>/train`` and ``/valid``)
``tracker(t)``                      an experiment tracker (TensorBoard, MLflow); call
                                    again to add more
``params(config)``                  the run's parameters the trackers record
``renderer(r)``                     how the run is shown (default: the notebook
                                    renderer in Jupyter, the dashboard on a terminal,
                                    the plain renderer otherwise)
``grads_accumulation(n)``           sum the gradients of ``n`` iterations per step
``with_file_checkpointer(...)``     save the model, optimizer and scheduler each epoch
``num_epochs(n)``                   the number of epochs (default 1)
``devices([d, ...])``               the training devices; the batches of one iteration
                                    are split across them
``checkpoint(epoch)``               resume from the checkpoint of ``epoch``
``early_stopping(...)``             stop when a metric stops improving
``summary()``                       print a summary table at the end
``report(False)``                   no training report at the end (default: one in
                                    ``<artifact_dir>/report`` when matplotlib is there)
``interrupter()``                   the handle that stops the run (returns it)
==================================  ===================================================

``build(model, optimizer, lr_scheduler)`` checks the options together and returns a
:class:`~ember.train.learner.learner.Learner`; the scheduler may be a plain float.

Example:
    >>> import tempfile
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.module import Module
    >>> from ember.nn.linear import Linear, LinearConfig
    >>> from ember.optim.sgd import SgdConfig
    >>> from ember.train.renderer.plain import PlainRenderer
    >>> from ember.train.step import TrainOutput
    >>> class Regressor(Module):
    ...     linear: Linear
    ...     def train_step(self, batch):
    ...         loss = self.valid_step(batch)
    ...         return TrainOutput.new(self, loss.backward(), loss)
    ...     def valid_step(self, batch):
    ...         x, y = batch
    ...         return ((self.linear(x) - y) ** 2).mean()
    >>> class Batches(list):  # the loader interface the learner uses
    ...     batch_size = 4
    ...     def set_epoch(self, epoch): pass
    ...     def num_items(self): return 4 * len(self)
    ...     def to_device(self, device): return Batches(
    ...         tuple(t.to_device(device) for t in batch) for batch in self)
    >>> device = ember.device("ndarray").autodiff()
    >>> data = Batches([(Tensor.ones([4, 2], device), Tensor.ones([4, 1], device))])
    >>> model = Regressor(LinearConfig(2, 1).init(device))
    >>> learner = (LearnerBuilder(tempfile.mkdtemp()).num_epochs(2)
    ...            .renderer(PlainRenderer(every=0)).metric_loggers(None, None)
    ...            .build(model, SgdConfig().init(), 0.1))
    >>> trained = learner.fit(data, data)
    [train] epoch 1/2 done
    [valid] epoch 1/2 done
    [train] epoch 2/2 done
    [valid] epoch 2/2 done
    >>> loss = lambda m: round(m.valid().valid_step(data.to_device(device.inner())[0]).item(), 4)
    >>> loss(trained) < loss(model)
    True
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ember.backend.device import Device
from ember.backend.errors import ArgumentError, DeviceError
from ember.module import Module
from ember.optim.lr_scheduler.base import LrScheduler
from ember.optim.lr_scheduler.constant import as_scheduler
from ember.optim.optimizer import Optimizer
from ember.record.recorder import FileRecorder
from ember.train.learner.checkpoint import FileCheckpointer
from ember.train.learner.early_stopping import MetricEarlyStopping
from ember.train.learner.learner import Learner
from ember.train.logger import FileMetricLogger, MetricLogger
from ember.train.metric.base import Metric, Numeric
from ember.train.renderer.base import MetricsRenderer, Split, TrainingInterrupter
from ember.train.renderer.notebook import NotebookRenderer, in_notebook
from ember.train.renderer.plain import PlainRenderer
from ember.train.tracker.base import ExperimentTracker, ParamValue, flatten_params

log = logging.getLogger(__name__)

_UNSET: Any = object()


class LearnerBuilder:
    """Collects the options of a :class:`~ember.train.learner.learner.Learner`.

    Each option method returns the builder, so calls chain (``interrupter()`` returns
    the interrupter instead).

    Args:
        artifact_dir: where the run writes its logs, metrics and checkpoints (created by
            ``fit``).
    """

    def __init__(self, artifact_dir: str | Path) -> None:
        if not isinstance(artifact_dir, str | Path):
            raise ArgumentError(
                f"LearnerBuilder: artifact_dir must be a path, got {type(artifact_dir).__name__}"
            )
        self._artifact_dir = Path(artifact_dir)
        self._metrics: dict[Split, list[tuple[Metric, bool]]] = {"train": [], "valid": []}
        self._loggers: Any = _UNSET
        self._trackers: list[ExperimentTracker] = []
        self._params: dict[str, ParamValue] = {}
        self._renderer: MetricsRenderer | None = None
        self._grads_accumulation = 1
        self._checkpointer: tuple[FileRecorder | None, int | None, tuple[str, Split] | None]
        self._checkpointer = None  # type: ignore[assignment]
        self._num_epochs = 1
        self._devices: list[Device] | None = None
        self._checkpoint: int | None = None
        self._early_stopping: MetricEarlyStopping | None = None
        self._summary = False
        self._report = True
        self._interrupter = TrainingInterrupter()

    # ------------------------------------------------------------------ metrics
    def metric_train(self, metric: Metric) -> LearnerBuilder:
        """Adds a training metric (logged and shown; not plotted)."""
        return self._metric("train", metric, plotted=False)

    def metric_valid(self, metric: Metric) -> LearnerBuilder:
        """Adds a validation metric (logged and shown; not plotted)."""
        return self._metric("valid", metric, plotted=False)

    def metric_train_numeric(self, metric: Metric) -> LearnerBuilder:
        """Adds a numeric training metric: logged, shown and plotted."""
        return self._metric("train", metric, plotted=True)

    def metric_valid_numeric(self, metric: Metric) -> LearnerBuilder:
        """Adds a numeric validation metric: logged, shown and plotted."""
        return self._metric("valid", metric, plotted=True)

    def _metric(self, split: Split, metric: Metric, plotted: bool) -> LearnerBuilder:
        method = f"metric_{split}" + ("_numeric" if plotted else "")
        if isinstance(metric, type):
            raise ArgumentError(
                f"LearnerBuilder.{method}: got the class {metric.__name__}; pass an instance, "
                f"{metric.__name__}()"
            )
        if not isinstance(metric, Metric):
            raise ArgumentError(
                f"LearnerBuilder.{method}: expected a Metric instance, got {type(metric).__name__}"
            )
        if plotted and not isinstance(metric, Numeric):
            raise ArgumentError(
                f"LearnerBuilder.{method}: {type(metric).__name__} is not Numeric (it has no "
                f"value() to plot); register it with metric_{split}"
            )
        for other_split, metrics in self._metrics.items():
            for other, _ in metrics:
                if other is metric:
                    raise ArgumentError(
                        f"LearnerBuilder.{method}: this {type(metric).__name__} instance is "
                        f"already a {other_split} metric; each split needs its own instance"
                    )
                if other_split == split and other.name == metric.name:
                    raise ArgumentError(
                        f"LearnerBuilder.{method}: a {split} metric named {metric.name!r} is "
                        "already registered (the name is its log file's)"
                    )
        self._metrics[split].append((metric, plotted))
        return self

    def metric_loggers(self, train: MetricLogger | None, valid: MetricLogger | None) -> LearnerBuilder:
        """Sets the metric loggers of the two splits (None logs nothing for that split)."""
        self._loggers = (train, valid)
        return self

    def tracker(self, tracker: ExperimentTracker) -> LearnerBuilder:
        """Adds an experiment tracker (see :mod:`ember.train.tracker`); several may be added.

        Trackers run besides the metric loggers, on rank 0 only in a data-parallel job.
        """
        if not isinstance(tracker, ExperimentTracker):
            raise ArgumentError(
                f"LearnerBuilder.tracker: expected an ExperimentTracker such as "
                f"TensorBoardTracker() or MlflowTracker(), got {type(tracker).__name__}"
            )
        if any(other is tracker for other in self._trackers):
            raise ArgumentError("LearnerBuilder.tracker: this tracker was already added")
        self._trackers.append(tracker)
        return self

    def params(self, params: Any) -> LearnerBuilder:
        """The run's parameters that the trackers record: a Config or a (nested) mapping.

        Nested fields become dotted keys (``model.hidden_size``); repeated calls add to them.
        The learner's own options are recorded too, under ``learner.``.
        """
        self._params.update(flatten_params(params))
        return self

    def renderer(self, renderer: MetricsRenderer) -> LearnerBuilder:
        """Sets how the run is shown."""
        if not isinstance(renderer, MetricsRenderer):
            raise ArgumentError(
                f"LearnerBuilder.renderer: expected a MetricsRenderer, got {type(renderer).__name__}"
            )
        self._renderer = renderer
        return self

    # ------------------------------------------------------------------ training
    def grads_accumulation(self, steps: int) -> LearnerBuilder:
        """Sums the gradients of ``steps`` iterations before each optimizer step."""
        self._grads_accumulation = _count("grads_accumulation", steps)
        return self

    def num_epochs(self, epochs: int) -> LearnerBuilder:
        """The number of epochs to train (the last epoch's number, when resuming)."""
        self._num_epochs = _count("num_epochs", epochs)
        return self

    def devices(self, devices: Sequence[Device]) -> LearnerBuilder:
        """The autodiff devices to train on; the model is moved to the first one."""
        devices = list(devices) if isinstance(devices, list | tuple) else [devices]  # type: ignore[list-item]
        if not devices:
            raise ArgumentError("LearnerBuilder.devices: expected at least one device")
        for device in devices:
            if not isinstance(device, Device):
                raise ArgumentError(
                    f"LearnerBuilder.devices: expected Devices, got {type(device).__name__}"
                )
            _check_autodiff(device, "LearnerBuilder.devices: got")
        self._devices = devices
        return self

    def with_file_checkpointer(
        self,
        recorder: FileRecorder | None = None,
        keep_last: int | None = 2,
        keep_best: tuple[str, Split] | None = None,
    ) -> LearnerBuilder:
        """Saves the model, optimizer and scheduler in ``<artifact_dir>/checkpoint`` each epoch.

        Args:
            recorder: the file recorder; default ``NamedMpkGzFileRecorder()`` at full
                precision, so a resumed run equals an uninterrupted one (Burn's book
                uses ``CompactRecorder()``, half precision: smaller, not exact).
            keep_last: keep the checkpoints of the last ``keep_last`` epochs; None keeps
                all. Default: 2.
            keep_best: ``(metric name, split)``: also keep the best epoch's checkpoint by
                that numeric metric, e.g. ``("Loss", "valid")``. Default: None.
        """
        # Checked now, so a mistake shows at this call.
        FileCheckpointer(self._artifact_dir / "checkpoint", recorder, keep_last, keep_best)
        self._checkpointer = (recorder, keep_last, keep_best)
        return self

    def checkpoint(self, epoch: int) -> LearnerBuilder:
        """Resumes from the checkpoint of the end of ``epoch``; training goes on with ``epoch + 1``."""
        self._checkpoint = _count("checkpoint", epoch)
        return self

    def early_stopping(self, metric: str | Metric, split: Split = "valid", min_delta: float = 0.0,
                       patience: int = 1) -> LearnerBuilder:  # fmt: skip
        """Stops when ``metric`` of ``split`` has not improved by ``min_delta`` in ``patience`` epochs.

        See :class:`~ember.train.learner.early_stopping.MetricEarlyStopping`. ``metric`` is a
        name or a metric (its name is used); it must be registered as a numeric metric
        of ``split``.
        """
        name = metric.name if isinstance(metric, Metric) else metric
        self._early_stopping = MetricEarlyStopping(name, split, min_delta, patience)
        return self

    def summary(self) -> LearnerBuilder:
        """Prints a summary table of the numeric metrics when the run ends."""
        self._summary = True
        return self

    def report(self, enabled: bool = True) -> LearnerBuilder:
        """Whether ``fit`` ends by writing the training report (on by default).

        The report (:mod:`ember.train.report`: PNG charts of every numeric metric and
        ``index.html``) goes to ``<artifact_dir>/report``. It needs matplotlib (the
        ``report`` extra); without it, ``fit`` prints a one-line notice instead.
        """
        if not isinstance(enabled, bool):
            raise ArgumentError(f"LearnerBuilder.report: expected True or False, got {enabled!r}")
        self._report = enabled
        return self

    def interrupter(self) -> TrainingInterrupter:
        """The handle that stops the run: ``interrupter.stop()`` from any thread."""
        return self._interrupter

    # ------------------------------------------------------------------ build
    def build(self, model: Module, optimizer: Optimizer, lr_scheduler: LrScheduler | float) -> Learner:
        """The learner of these options for ``model``, ``optimizer`` and ``lr_scheduler``.

        Raises:
            ArgumentError: a model without ``train_step`` / ``valid_step``, a bad
                optimizer or scheduler, an early-stopping or best-checkpoint metric that
                is not a registered numeric metric, a resume without a checkpointer.
            DeviceError: a model not on an autodiff device.
        """
        if not isinstance(model, Module):
            raise ArgumentError(f"LearnerBuilder.build: expected a Module, got {type(model).__name__}")
        missing = [m for m in ("train_step", "valid_step") if not callable(getattr(model, m, None))]
        if missing:
            raise ArgumentError(
                f"LearnerBuilder.build: {type(model).__name__} must define "
                f"{' and '.join(f'{m}(batch)' for m in missing)} (see ember.train.step)"
            )
        if not isinstance(optimizer, Optimizer):
            raise ArgumentError(
                f"LearnerBuilder.build: expected an Optimizer, got {type(optimizer).__name__}"
            )
        scheduler = as_scheduler(lr_scheduler)
        devices = self._devices
        if devices is None:
            found = model.devices()
            if not found:
                raise ArgumentError(f"LearnerBuilder.build: {type(model).__name__} has no parameters")
            devices = [found[0]]
            _check_autodiff(devices[0], f"LearnerBuilder.build: {type(model).__name__} is on")
        if model.devices() != [devices[0]]:
            model = model.fork(devices[0])

        checkpointer = None
        if self._checkpointer is not None:
            recorder, keep_last, keep_best = self._checkpointer
            lower = True
            if keep_best is not None:
                lower = self._numeric(keep_best[0], keep_best[1], "with_file_checkpointer(keep_best)")
            checkpointer = FileCheckpointer(
                self._artifact_dir / "checkpoint", recorder, keep_last, keep_best, lower
            )
        if self._checkpoint is not None and checkpointer is None:
            raise ArgumentError(
                f"LearnerBuilder.checkpoint({self._checkpoint}): resuming reads the file "
                "checkpointer's files; call with_file_checkpointer() too"
            )
        if self._early_stopping is not None:
            stopping = self._early_stopping
            stopping.bind(self._numeric(stopping.metric, stopping.split, "early_stopping"))

        loggers = self._loggers
        if loggers is _UNSET:
            loggers = (FileMetricLogger(self._artifact_dir / "train"),
                       FileMetricLogger(self._artifact_dir / "valid"))  # fmt: skip
        return Learner(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            artifact_dir=self._artifact_dir,
            train_metrics=list(self._metrics["train"]),
            valid_metrics=list(self._metrics["valid"]),
            loggers=loggers,
            renderer=self._renderer if self._renderer is not None else default_renderer(),
            grads_accumulation=self._grads_accumulation,
            checkpointer=checkpointer,
            num_epochs=self._num_epochs,
            devices=devices,
            resume_epoch=self._checkpoint,
            early_stopping=self._early_stopping,
            summary=self._summary,
            report=self._report,
            interrupter=self._interrupter,
            trackers=list(self._trackers),
            params=dict(self._params),
        )

    def _numeric(self, name: str, split: Split, option: str) -> bool:
        """The ``lower_is_better`` of the registered numeric metric ``name`` of ``split``."""
        for metric, _ in self._metrics[split]:
            if metric.name == name and isinstance(metric, Numeric):
                return metric.lower_is_better
        known = [m.name for m, _ in self._metrics[split] if isinstance(m, Numeric)]
        raise ArgumentError(
            f"LearnerBuilder.{option}: no numeric {split} metric named {name!r} is registered "
            f"(numeric {split} metrics: {', '.join(known) or 'none'})"
        )


def default_renderer() -> MetricsRenderer:
    """The notebook renderer in a Jupyter kernel, the dashboard when standard output is a
    terminal, else the plain renderer."""
    if in_notebook():
        return NotebookRenderer()
    if sys.stdout.isatty():
        try:
            from ember.train.renderer.dashboard import DashboardRenderer
        except ImportError as error:
            log.warning("the dashboard is not available (%s); using the plain renderer", error)
        else:
            return DashboardRenderer()
    return PlainRenderer()


def _count(option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"LearnerBuilder.{option}: expected an integer >= 1, got {value!r}")
    return value


def _check_autodiff(device: Device, what: str) -> None:
    if not hasattr(device.backend, "backward"):
        raise DeviceError(
            f"{what} {device}, which has no autodiff; training needs gradients: "
            "use device.autodiff()"
        )
