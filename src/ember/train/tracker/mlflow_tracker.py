"""MlflowTracker: one MLflow run per fit, through MLflow's own client.

Each fit creates a run in an experiment (made when missing) and records:

* **params**: the run's parameters, flattened (``learner.num_epochs``, and those given
  to ``LearnerBuilder.params``, e.g. the training Config's fields ``model.hidden_size``);
* **metrics**: ``<split>/<Metric>`` per step (the batch value at the global step) and
  ``epoch/<split>/<Metric>`` per epoch (the epoch value at the epoch number); names
  keep the characters MLflow accepts, any other becomes ``_`` (``TopKAccuracy@5`` ->
  ``TopKAccuracy_5``);
* **artifacts**: the final model record (``model/model.mpk``, with the recorder given)
  and the run's ``experiment.log``;
* the run's status: FINISHED, KILLED (interrupted) or FAILED.

Metrics are sent in batches (every ``batch_size`` values and at each epoch's end), so
a step costs no database round trip.

**Where runs go.** ``tracking_uri`` is any MLflow tracking URI (a server, a database).
Without one, MLflow's ``MLFLOW_TRACKING_URI`` is used when set, else a SQLite store in
the artifact directory, ``sqlite:///<artifact_dir>/mlflow.db``, with the artifacts in
``<artifact_dir>/mlflow-artifacts``; view it with
``mlflow ui --backend-store-uri sqlite:///<artifact_dir>/mlflow.db`` (the full ``mlflow``
package has the UI). A new experiment in any local SQLite store keeps its artifacts in
``mlflow-artifacts`` beside the database file (MLflow's own default, ``./mlruns``, would
put them wherever the script happens to run). The ``mlflow`` extra installs ``mlflow-skinny`` with SQLAlchemy and
Alembic, which a SQLite store needs (MLflow's file store is deprecated).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember.backend.errors import ArgumentError
from ember.train.tracker.base import (
    ExperimentTracker,
    ParamValue,
    RunInfo,
    RunStatus,
    finite,
    require,
)

if TYPE_CHECKING:
    from ember.module import Module
    from ember.record.recorder import FileRecorder
    from ember.train.renderer.base import Split

_PARAMS_PER_BATCH = 100  # MLflow's limit on params in one log_batch
_MAX_PARAM_VALUE = 6000  # MLflow's limit on a param value's length
_NOT_A_NAME_CHARACTER = re.compile(r"[^\w.\- /]")


def metric_key(*parts: str) -> str:
    """An MLflow metric or param key from ``parts``: joined by ``/``, odd characters as ``_``.

    Example:
        >>> metric_key("valid", "TopKAccuracy@5")
        'valid/TopKAccuracy_5'
    """
    return "/".join(_NOT_A_NAME_CHARACTER.sub("_", part) for part in parts)


class MlflowTracker(ExperimentTracker):
    """Records each fit as an MLflow run (see the module docstring).

    Args:
        tracking_uri: where runs go (``sqlite:///runs.db``, ``http://host:5000``, ...);
            None: ``MLFLOW_TRACKING_URI``, else ``sqlite:///<artifact_dir>/mlflow.db``.
        experiment: the experiment's name; made when missing.
        run_name: the run's name; None lets MLflow choose one.
        tags: tags of the run.
        artifact_location: where a *new* experiment keeps its artifacts; None:
            ``mlflow-artifacts`` beside the database of a local SQLite store, else MLflow's
            default (the server's, for a tracking server).
        log_model: upload the final model's record as an artifact.
        recorder: the recorder of that record; default: ember's ``DefaultRecorder``
            (NamedMpk at full precision).
        batch_size: the metric values sent in one request (MLflow takes at most 1000).

    Raises:
        MissingExtraError: MLflow is not installed (the ``mlflow`` extra).
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "ember",
        *,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        artifact_location: str | os.PathLike[str] | None = None,
        log_model: bool = True,
        recorder: FileRecorder | None = None,
        batch_size: int = 1000,
    ) -> None:
        self._mlflow = require("MlflowTracker", "mlflow", "mlflow")
        if not experiment or not isinstance(experiment, str):
            raise ArgumentError(f"MlflowTracker: experiment must be a name, got {experiment!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 1000:
            raise ArgumentError(f"MlflowTracker: batch_size must be in 1..1000, got {batch_size!r}")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.artifact_location = None if artifact_location is None else str(artifact_location)
        self.log_model = log_model
        self.recorder = recorder
        self.batch_size = batch_size
        self.client: Any = None
        self.run_id: str | None = None
        self._artifact_dir: Path | None = None
        self._pending: list[Any] = []

    def start(self, run: RunInfo) -> None:
        from mlflow.tracking import MlflowClient

        uri, location = self.tracking_uri, self.artifact_location
        if uri is None:
            uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            run.artifact_dir.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{(run.artifact_dir / 'mlflow.db').resolve()}"
        if location is None and uri.startswith("sqlite:///"):
            database = Path(uri.removeprefix("sqlite:///").split("?")[0])
            location = (database.parent / "mlflow-artifacts").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            experiment_id = self.client.create_experiment(self.experiment, artifact_location=location)
        tags = {"ember.model": run.model_name, **self.tags}
        self.run_id = self.client.create_run(experiment_id, tags=tags, run_name=self.run_name).info.run_id
        self._artifact_dir = run.artifact_dir
        self._log_params(run.params)

    def log_step(self, split: Split, values: Mapping[str, float], step: int) -> None:
        self._add({metric_key(split, name): value for name, value in values.items()}, step)

    def log_epoch(self, split: Split, values: Mapping[str, float], epoch: int) -> None:
        self._add({metric_key("epoch", split, name): value for name, value in values.items()}, epoch)
        self._flush()

    def finish(self, model: Module | None, status: RunStatus) -> None:
        if self.run_id is None:
            return
        try:
            self._flush()
            if model is not None and self.log_model:
                with tempfile.TemporaryDirectory(prefix="ember-mlflow-") as tmp:
                    path = model.save_file(Path(tmp) / "model", self.recorder)
                    self.client.log_artifact(self.run_id, str(path), artifact_path="model")
            log_file = None if self._artifact_dir is None else self._artifact_dir / "experiment.log"
            if log_file is not None and log_file.is_file():
                self.client.log_artifact(self.run_id, str(log_file))
        finally:
            self.client.set_terminated(self.run_id, status)

    # ------------------------------------------------------------------ batches
    def _log_params(self, params: Mapping[str, ParamValue]) -> None:
        from mlflow.entities import Param

        entries = [Param(metric_key(key), str(value)[:_MAX_PARAM_VALUE])
                   for key, value in params.items()]  # fmt: skip
        for start in range(0, len(entries), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=entries[start : start + _PARAMS_PER_BATCH])

    def _add(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending.extend(Metric(key, value, now, step) for key, value in finite(values).items())
        if len(self._pending) >= self.batch_size:
            self._flush()

    def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self.batch_size], self._pending[self.batch_size :]
            self.client.log_batch(self.run_id, metrics=batch)
