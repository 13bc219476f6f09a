"""Experiment trackers fed by a short fit, read back with the tools' own readers.

TensorBoard's event files are read with TensorBoard's ``EventAccumulator``, MLflow's run
with ``MlflowClient``; the reference is what the learner's file loggers wrote (every
batch value, in order) and its history (every epoch value). Each test skips, with the
reason printed, only where its extra is missing (the test command installs both).
"""

from __future__ import annotations

import builtins
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from learner_support import CallbackRenderer, assert_same_weights, classifier, loaders

from ember import Config
from ember.backend.errors import ArgumentError
from ember.optim.adam import AdamConfig
from ember.train.learner.builder import LearnerBuilder
from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.loss import LossMetric
from ember.train.tracker import (
    ExperimentTracker,
    MissingExtraError,
    MlflowTracker,
    TensorBoardTracker,
    flatten_params,
)

EPOCHS, TRAIN_STEPS, VALID_STEPS = 2, 6, 2  # 24 training items and 8 valid, batches of 4
METRICS = ("Loss", "Accuracy")


class RunConfig(Config):
    hidden: int = 16
    lr: float = 0.05


class ExperimentConfig(Config):
    run: RunConfig = RunConfig()
    seed: int = 3


def build(artifact: Path, *trackers: ExperimentTracker, epochs: int = EPOCHS, resume: int = 0):
    builder = (LearnerBuilder(artifact).num_epochs(epochs).renderer(CallbackRenderer())
               .metric_train_numeric(LossMetric()).metric_valid_numeric(LossMetric())
               .metric_train_numeric(AccuracyMetric()).metric_valid_numeric(AccuracyMetric())
               .with_file_checkpointer(keep_last=None).params(ExperimentConfig()))  # fmt: skip
    for tracker in trackers:
        builder = builder.tracker(tracker)
    if resume:
        builder = builder.checkpoint(resume)
    return builder.build(classifier(3), AdamConfig().init(), 0.05)


def logged(artifact: Path, split: str, name: str, epochs=range(1, EPOCHS + 1)) -> list[float]:
    """The batch values the file logger wrote: the reference of the per-step values."""
    return [float(line) for e in epochs
            for line in (artifact / split / f"epoch-{e}" / f"{name}.log").read_text().split()]  # fmt: skip


def steps(split: str) -> list[int]:
    per_epoch = TRAIN_STEPS if split == "train" else VALID_STEPS
    return list(range(1, EPOCHS * per_epoch + 1))


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


@pytest.fixture(scope="module")
def fast_folder():
    """A folder in memory-backed /dev/shm where there is one: MLflow makes its SQLite
    tables with many small commits, each a sync on a disk."""
    pytest.importorskip("mlflow", reason="the 'mlflow' extra is not installed")
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="ember-mlflow-test-", dir=shm))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_uri(fast_folder):
    return f"sqlite:///{fast_folder}/mlflow.db"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, mlflow_uri):
    """One fit that feeds both trackers (they run side by side)."""
    pytest.importorskip("tensorboardX", reason="the 'tensorboard' extra is not installed")
    artifact = tmp_path_factory.mktemp("trackers") / "run"
    mlflow = MlflowTracker(mlflow_uri, experiment="trackers", run_name="short-fit", batch_size=5)
    learner = build(artifact, TensorBoardTracker(), mlflow)
    model = learner.fit(*loaders())
    return artifact, learner, model, mlflow, mlflow_uri


def test_tensorboard_event_files_hold_every_metric_at_every_step(fitted) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    artifact, learner, *_ = fitted
    for split in ("train", "valid"):
        events = EventAccumulator(str(artifact / "tensorboard" / split)).Reload()
        assert sorted(events.Tags()["scalars"]) == sorted(
            [*METRICS, *(f"epoch/{name}" for name in METRICS)])
        for name in METRICS:
            points = events.Scalars(name)
            assert [p.step for p in points] == steps(split)
            np.testing.assert_allclose([p.value for p in points], logged(artifact, split, name),
                                       rtol=1e-6)  # fmt: skip  (event files hold float32)
            epochs = events.Scalars(f"epoch/{name}")
            assert [p.step for p in epochs] == [1, 2]
            want = [learner.history.value(split, name, e) for e in (1, 2)]
            np.testing.assert_allclose([p.value for p in epochs], want, rtol=1e-6)
    params = EventAccumulator(str(artifact / "tensorboard" / "train"),
                              size_guidance={"tensors": 0}).Reload()  # fmt: skip
    text = params.Tensors("params/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| learner.num_epochs | 2 |" in text and "| run.hidden | 16 |" in text


def test_mlflow_run_holds_params_metrics_and_the_model(fitted) -> None:
    artifact, learner, model, mlflow, uri = fitted
    client = mlflow_client(uri)
    run = client.get_run(mlflow.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "short-fit"
    params = run.data.params
    assert params["learner.num_epochs"] == "2" and params["learner.model"] == "Classifier"
    assert params["learner.optimizer"] == type(learner.optimizer).__name__
    assert params["learner.lr_scheduler.lr"] == "0.05"
    assert (params["run.hidden"], params["run.lr"], params["seed"]) == ("16", "0.05", "3")
    for split in ("train", "valid"):
        for name in METRICS:
            history = client.get_metric_history(mlflow.run_id, f"{split}/{name}")
            assert [m.step for m in history] == steps(split)
            np.testing.assert_allclose([m.value for m in history], logged(artifact, split, name))
            epochs = client.get_metric_history(mlflow.run_id, f"epoch/{split}/{name}")
            assert [m.step for m in epochs] == [1, 2]
            want = [learner.history.value(split, name, e) for e in (1, 2)]
            np.testing.assert_allclose([m.value for m in epochs], want)

    # The artifact is the final model's record: loading it gives the trained weights.
    files = [f.path for f in client.list_artifacts(mlflow.run_id, "model")]
    assert files == ["model/model.mpk"]
    local = client.download_artifacts(mlflow.run_id, "model/model.mpk", str(artifact.parent))
    assert_same_weights(classifier(0).load_file(Path(local).with_suffix("")), model)
    assert "experiment.log" in [f.path for f in client.list_artifacts(mlflow.run_id)]


def test_a_resumed_run_goes_on_with_the_steps_of_its_epochs(fitted, tmp_path) -> None:
    """Epoch 2 resumed from the checkpoint of epoch 1 logs the steps 7..12; in TensorBoard
    they replace the points the first run had logged from step 7 on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    artifact, *_, uri = fitted
    run = tmp_path / "run"
    shutil.copytree(artifact / "checkpoint", run / "checkpoint")
    shutil.copytree(artifact / "tensorboard", run / "tensorboard")
    tracker = MlflowTracker(uri, experiment="resumed", log_model=False)
    build(run, tracker, TensorBoardTracker(), resume=1).fit(*loaders())
    history = mlflow_client(uri).get_metric_history(tracker.run_id, "train/Loss")
    assert [m.step for m in history] == list(range(TRAIN_STEPS + 1, 2 * TRAIN_STEPS + 1))
    np.testing.assert_allclose([m.value for m in history], logged(artifact, "train", "Loss", [2]))

    assert len(list((run / "tensorboard" / "train").iterdir())) == 2  # both runs' files
    events = EventAccumulator(str(run / "tensorboard" / "train")).Reload()
    assert [p.step for p in events.Scalars("Loss")] == steps("train")  # each step once
    np.testing.assert_allclose([p.value for p in events.Scalars("Loss")],
                               logged(artifact, "train", "Loss"), rtol=1e-6)  # fmt: skip


def test_by_default_runs_go_to_a_sqlite_store_in_the_artifact_dir(fast_folder, monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    artifact = fast_folder / "default-run"
    tracker = MlflowTracker()
    build(artifact, tracker, epochs=1).fit(*loaders())
    client = mlflow_client(f"sqlite:///{artifact / 'mlflow.db'}")
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.artifact_uri.startswith((artifact / "mlflow-artifacts").as_uri())
    assert len(list((artifact / "mlflow-artifacts").rglob("model.mpk"))) == 1


class Recording(ExperimentTracker):
    def __init__(self, fail_on: str = "") -> None:
        self.calls: list[tuple] = []
        self.fail_on = fail_on

    def _record(self, *call) -> None:
        self.calls.append(call)
        if call[0] == self.fail_on:
            raise RuntimeError(f"{self.fail_on} failed")

    def start(self, run) -> None:
        self._record("start", run.model_name, run.start_epoch, dict(run.first_steps))

    def log_step(self, split, values, step) -> None:
        self._record("step", split, step, sorted(values))

    def log_epoch(self, split, values, epoch) -> None:
        self._record("epoch", split, epoch, sorted(values))

    def finish(self, model, status) -> None:
        self._record("finish", model is not None, status)


def test_trackers_are_called_in_order_and_an_interrupted_run_is_killed(tmp_path) -> None:
    tracker = Recording()
    learner = build(tmp_path / "run", tracker, epochs=2)
    stop_in = 3
    learner.renderer.on_train = lambda progress: (
        learner.interrupter.stop() if progress.epoch == 2 and progress.iteration == stop_in else None)
    learner.fit(*loaders())
    kinds = [call[0] for call in tracker.calls]
    assert kinds[0] == "start" and kinds[-1] == "finish"
    assert tracker.calls[0] == ("start", "Classifier", 1, {"train": 1, "valid": 1})
    train_steps = [c[2] for c in tracker.calls if c[:2] == ("step", "train")]
    assert train_steps == list(range(1, TRAIN_STEPS + stop_in + 1))
    assert [c[1:3] for c in tracker.calls if c[0] == "epoch"] == [("train", 1), ("valid", 1)]
    assert all(c[3] == ["Accuracy", "Loss"] for c in tracker.calls if c[0] in ("step", "epoch"))
    assert tracker.calls[-1] == ("finish", True, "KILLED")


def test_a_failing_run_finishes_its_trackers_as_failed_and_keeps_its_error(tmp_path) -> None:
    first, failing = Recording(), Recording(fail_on="epoch")
    with pytest.raises(RuntimeError, match="epoch failed"):
        build(tmp_path / "run", first, failing).fit(*loaders())
    assert first.calls[-1] == ("finish", False, "FAILED")
    assert failing.calls[-1] == ("finish", False, "FAILED")


def test_a_tracker_that_cannot_finish_raises_after_the_others_finished(tmp_path) -> None:
    failing, other = Recording(fail_on="finish"), Recording()
    with pytest.raises(RuntimeError, match="finish failed"):
        build(tmp_path / "run", failing, other, epochs=1).fit(*loaders())
    assert other.calls[-1] == ("finish", True, "FINISHED")


def test_the_builder_rejects_what_is_not_a_tracker_and_a_tracker_added_twice(tmp_path) -> None:
    with pytest.raises(ArgumentError, match="expected an ExperimentTracker"):
        LearnerBuilder(tmp_path).tracker("tensorboard")  # type: ignore[arg-type]
    tracker = Recording()
    with pytest.raises(ArgumentError, match="already added"):
        LearnerBuilder(tmp_path).tracker(tracker).tracker(tracker)
    with pytest.raises(ArgumentError, match="a Config or a mapping"):
        LearnerBuilder(tmp_path).params([1, 2])


def test_params_flatten_configs_and_mappings() -> None:
    assert flatten_params(ExperimentConfig()) == {"run.hidden": 16, "run.lr": 0.05, "seed": 3}
    assert flatten_params({"a": {"b": (1, 2)}, "c": None}) == {"a.b": "(1, 2)", "c": None}


@pytest.mark.parametrize(("tracker", "extra", "module"), [
    (TensorBoardTracker, "tensorboard", "tensorboardX"), (MlflowTracker, "mlflow", "mlflow")])
def test_a_missing_extra_is_a_typed_error_naming_it(monkeypatch, tracker, extra, module) -> None:
    real_import = builtins.__import__

    def without(name, *args, **kwargs):
        if name == module or name.startswith(module + "."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingExtraError, match=rf"pip install 'ember\[{extra}\]'") as error:
        tracker()
    assert error.value.extra == extra and isinstance(error.value, ImportError)


def test_writers_in_one_second_keep_their_event_files_in_order(tmp_path, monkeypatch) -> None:
    """tensorboardX names its files by the second: runs logging into one folder within it
    must still write a file each, none over another, named in the order they began."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboardX import event_file_writer

    from ember.train.tracker.base import RunInfo

    # One second for every file name (TensorBoard reads a folder's files in name order: a
    # later writer's file, a resumed run's, must sort after the earlier ones).
    clock = type("Clock", (), {"time": staticmethod(lambda: 1_700_000_000.5)})
    monkeypatch.setattr(event_file_writer, "time", clock)
    made = []
    for value in (1.0, 2.0, 3.0, 4.0, 5.0):
        tracker = TensorBoardTracker(log_dir=tmp_path / "tb")
        tracker.start(RunInfo(artifact_dir=tmp_path, model_name="m"))
        tracker.log_step("train", {"Loss": value}, int(value))
        tracker.finish(None, "FINISHED")
        now = set((tmp_path / "tb" / "train").iterdir())
        made += sorted(now - set(made))
    assert len(made) == 5 and sorted(made) == made  # name order is creation order
    events = EventAccumulator(str(tmp_path / "tb" / "train")).Reload()
    assert [(p.step, p.value) for p in events.Scalars("Loss")] == [(n, float(n)) for n in range(1, 6)]
