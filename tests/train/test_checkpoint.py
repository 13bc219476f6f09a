"""FileCheckpointer, the training state, the metric history, early stopping and the summary."""

from __future__ import annotations

import math

import numpy as np
import pytest
from learner_support import assert_same_weights, classifier, loaders

from ember.backend.errors import ArgumentError, RecordFileNotFoundError, RecordMismatchError
from ember.optim.adam import AdamConfig
from ember.optim.lr_scheduler.linear import LinearLrSchedulerConfig
from ember.record.precision import FullPrecision
from ember.record.recorder import CompactRecorder, NamedMpkGzFileRecorder
from ember.tensor import TensorData
from ember.train.learner.checkpoint import FileCheckpointer, TrainingState
from ember.train.learner.early_stopping import MetricEarlyStopping
from ember.train.learner.history import MetricHistory
from ember.train.learner.summary import LearnerSummary


def trained(steps: int = 3):
    """A classifier after a few Adam steps, with its optimizer and scheduler."""
    model, optimizer = classifier(0), AdamConfig().init()
    scheduler = LinearLrSchedulerConfig(0.1, 0.01, num_iters=10).init()
    train, _ = loaders()
    train.set_epoch(1)
    for _, batch in zip(range(steps), train):
        model = optimizer.step(scheduler.step(), model, model.train_step(batch).grads)
    return model, optimizer, scheduler


def fresh():
    return classifier(7), AdamConfig().init(), LinearLrSchedulerConfig(0.1, 0.01, num_iters=10).init()


def history(values: dict[int, float]) -> MetricHistory:
    h = MetricHistory()
    for epoch, value in values.items():
        h.record("valid", "Loss", epoch, value)
    return h


def test_round_trip_restores_weights_ids_optimizer_and_scheduler(tmp_path):
    model, optimizer, scheduler = trained()
    checkpointer = FileCheckpointer(tmp_path)
    checkpointer.save(1, model, optimizer, scheduler, TrainingState(1, history=history({1: 0.5})))
    loaded, optim2, sched2, state = checkpointer.load(1, *fresh())

    assert_same_weights(loaded, model)
    assert [p.id for _, p in loaded.params()] == [p.id for _, p in model.params()]
    assert sched2.to_record() == scheduler.to_record() == 3
    assert state.epoch == 1 and state.complete and state.history.values("valid", "Loss") == {1: 0.5}
    # The next step from the loaded state is the next step of the original run, bit for bit.
    train, _ = loaders()
    train.set_epoch(1)
    batch = next(iter(train))
    a = optimizer.step(scheduler.step(), model, model.train_step(batch).grads)
    b = optim2.step(sched2.step(), loaded, loaded.train_step(batch).grads)
    assert_same_weights(a, b)


def test_default_recorder_is_full_precision_named_mpk_gz(tmp_path):
    checkpointer = FileCheckpointer(tmp_path)
    assert type(checkpointer.recorder) is NamedMpkGzFileRecorder
    assert checkpointer.recorder.precision is FullPrecision
    model, optimizer, scheduler = trained()
    checkpointer.save(4, model, optimizer, scheduler, TrainingState(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model-4.mpk.gz", "optim-4.mpk.gz", "scheduler-4.mpk.gz", "state-4.json",
    ]  # fmt: skip


def test_half_precision_recorder_is_not_exact(tmp_path):
    """Why the default is full precision: CompactRecorder rounds the weights to f16."""
    model, optimizer, scheduler = trained()
    checkpointer = FileCheckpointer(tmp_path, CompactRecorder())
    checkpointer.save(1, model, optimizer, scheduler, TrainingState(1))
    loaded = checkpointer.load(1, *fresh())[0]
    a, b = loaded.linear.weight.val().to_numpy(), model.linear.weight.val().to_numpy()
    assert not np.array_equal(a, b)
    np.testing.assert_allclose(a, b, rtol=1e-3)


class FailingRecorder(NamedMpkGzFileRecorder):
    """Fails when asked to write one file: a crash in the middle of a save."""

    def __init__(self, fail_on: str) -> None:
        super().__init__()
        self.fail_on = fail_on

    def save(self, record, path):
        if self.path_for(path).name.startswith(self.fail_on):
            raise OSError("disk full")
        return super().save(record, path)


def test_a_crash_mid_save_keeps_the_previous_checkpoints(tmp_path):
    model, optimizer, scheduler = trained()
    good = FileCheckpointer(tmp_path, keep_last=2)
    for epoch in (1, 2):
        good.save(epoch, model, optimizer, scheduler, TrainingState(epoch))
    with pytest.raises(OSError, match="disk full"):
        FileCheckpointer(tmp_path, FailingRecorder("optim-3"), keep_last=2).save(
            3, model, optimizer, scheduler, TrainingState(3)
        )
    assert good.epochs() == [1, 2]
    assert (tmp_path / "model-3.mpk.gz").exists() and not (tmp_path / "state-3.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert_same_weights(good.load(2, *fresh())[0], model)
    with pytest.raises(RecordFileNotFoundError, match=r"no checkpoint of epoch 3 .*epochs: 1, 2"):
        good.load(3, *fresh())


def test_a_crash_while_overwriting_an_epoch_uncommits_it(tmp_path):
    model, optimizer, scheduler = trained()
    FileCheckpointer(tmp_path).save(2, model, optimizer, scheduler, TrainingState(2, complete=False))
    other, _, _ = trained(steps=1)
    with pytest.raises(OSError):
        FileCheckpointer(tmp_path, FailingRecorder("scheduler-2")).save(
            2, other, optimizer, scheduler, TrainingState(2)
        )
    # model-2 is new, scheduler-2 old: no state file, so no mixed checkpoint is offered.
    assert FileCheckpointer(tmp_path).epochs() == []


def test_pruning_keeps_the_last_n_and_the_best(tmp_path):
    model, optimizer, scheduler = trained()
    losses = {1: 0.9, 2: 0.3, 3: 0.5, 4: 0.6, 5: 0.7}
    checkpointer = FileCheckpointer(tmp_path, keep_last=2, keep_best=("Loss", "valid"))
    kept = []
    for epoch in losses:
        h = history({e: v for e, v in losses.items() if e <= epoch})
        checkpointer.save(epoch, model, optimizer, scheduler, TrainingState(epoch, history=h))
        kept.append(checkpointer.epochs())
    assert kept == [[1], [1, 2], [2, 3], [2, 3, 4], [2, 4, 5]]
    assert len(list(tmp_path.iterdir())) == 12


def test_pruning_keep_all_and_higher_is_better(tmp_path):
    model, optimizer, scheduler = trained()
    h = history({1: 0.9, 2: 0.3, 3: 0.5})
    keep_all = FileCheckpointer(tmp_path / "all", keep_last=None)
    best_high = FileCheckpointer(tmp_path / "high", keep_last=1, keep_best=("Loss", "valid"),
                                 best_lower_is_better=False)  # fmt: skip
    for epoch in (1, 2, 3):
        for checkpointer in (keep_all, best_high):
            checkpointer.save(epoch, model, optimizer, scheduler, TrainingState(epoch, history=h))
    assert keep_all.epochs() == [1, 2, 3]
    assert best_high.epochs() == [1, 3]


def test_saving_an_earlier_epoch_drops_later_and_interrupted_ones(tmp_path):
    model, optimizer, scheduler = trained()
    checkpointer = FileCheckpointer(tmp_path, keep_last=3)
    for epoch in (1, 2, 3):
        checkpointer.save(epoch, model, optimizer, scheduler, TrainingState(epoch))
    checkpointer.save(4, model, optimizer, scheduler, TrainingState(4, complete=False, iteration=2))
    assert checkpointer.epochs() == [1, 2, 3, 4]  # an interrupted save prunes nothing
    checkpointer.save(2, model, optimizer, scheduler, TrainingState(2))  # resumed from epoch 1
    assert checkpointer.epochs() == [1, 2]


def test_interrupted_checkpoints_do_not_count_as_the_last_complete(tmp_path):
    model, optimizer, scheduler = trained()
    checkpointer = FileCheckpointer(tmp_path, keep_last=1)
    checkpointer.save(1, model, optimizer, scheduler, TrainingState(1))
    checkpointer.save(2, model, optimizer, scheduler, TrainingState(2, complete=False, iteration=1))
    assert checkpointer.epochs() == [1, 2]
    checkpointer.save(2, model, optimizer, scheduler, TrainingState(2))
    assert checkpointer.epochs() == [2]


def test_checkpointer_errors(tmp_path):
    with pytest.raises(ArgumentError, match=r"recorder must be a FileRecorder .* got str"):
        FileCheckpointer(tmp_path, "mpk")
    with pytest.raises(ArgumentError, match="keep_last must be an integer >= 1 or None, got True"):
        FileCheckpointer(tmp_path, keep_last=True)
    with pytest.raises(ArgumentError, match=r"keep_best must be \(metric name, 'train' or 'valid'\)"):
        FileCheckpointer(tmp_path, keep_best=("Loss", "test"))
    with pytest.raises(RecordFileNotFoundError, match=r"no checkpoint of epoch 1 .*epochs: none"):
        FileCheckpointer(tmp_path / "missing").load_state(1)


def test_training_state_record(tmp_path):
    state = TrainingState(3, False, 7, history({1: 0.5, 2: float("nan")}),
                          {"best_epoch": 1, "best_value": 0.5})  # fmt: skip
    back = TrainingState.from_record(state.to_record())
    assert (back.epoch, back.complete, back.iteration, back.early_stopping) == (
        3, False, 7, {"best_epoch": 1, "best_value": 0.5}
    )  # fmt: skip
    values = back.history.values("valid", "Loss")
    assert values[1] == 0.5 and math.isnan(values[2])
    record = state.to_record()
    with pytest.raises(RecordMismatchError, match=r"keys \['complete'.*got \['epoch'\]"):
        TrainingState.from_record({"epoch": 1})
    with pytest.raises(RecordMismatchError, match="training state version 99, this ember reads version 1"):
        TrainingState.from_record({**record, "version": 99})
    with pytest.raises(RecordMismatchError, match=r"rows of valid/Loss must be \[epoch, value\]"):
        TrainingState.from_record({**record, "history": {"valid": {"Loss": [1, 2]}}})
    with pytest.raises(RecordMismatchError, match="expected the splits 'train' and 'valid'"):
        MetricHistory.from_record({"test": {}})


def test_metric_history():
    h = MetricHistory()
    h.record("valid", "Accuracy", 1, 50.0)
    h.record("train", "Loss", 2, 0.4)
    h.record("train", "Loss", 1, float("nan"))
    h.record("valid", "Accuracy", 2, 50.0)
    assert h.metrics() == [("train", "Loss"), ("valid", "Accuracy")]
    assert h.best_epoch("train", "Loss", lower_is_better=True) == 2  # NaN never wins
    assert h.best_epoch("valid", "Accuracy", lower_is_better=False) == 1  # earliest on a tie
    assert h.best_epoch("valid", "Loss", lower_is_better=True) is None
    h.truncate(1)
    assert list(h.values("train", "Loss")) == [1] and h.value("valid", "Accuracy", 2) is None


def test_early_stopping_rule():
    stopping = MetricEarlyStopping("Accuracy", "train", min_delta=1.0, patience=2)
    stopping.bind(lower_is_better=False)
    decisions = [stopping.update(e, v) for e, v in enumerate([50, 52, 52.5, 70, 70.9, 70.95], 1)]
    assert decisions == [False, False, False, False, False, True]
    assert (stopping.best_epoch, stopping.best_value) == (4, 70.0)
    other = MetricEarlyStopping("Accuracy", "train", min_delta=1.0, patience=2).load_record(
        stopping.to_record()
    )
    assert (other.best_epoch, other.best_value) == (4, 70.0)
    nan = MetricEarlyStopping("Loss", patience=1)
    assert [nan.update(e, v) for e, v in enumerate([float("nan"), 1.0, float("nan")], 1)] == [
        False, False, True,
    ]  # fmt: skip
    with pytest.raises(RecordMismatchError, match=r"keys \['best_epoch', 'best_value'\]"):
        other.load_record({"best": 1})
    with pytest.raises(ArgumentError, match=r"min_delta must be a number >= 0, got -0\.1"):
        MetricEarlyStopping("Loss", min_delta=-0.1)
    with pytest.raises(ArgumentError, match="metric must be a metric name, got None"):
        MetricEarlyStopping(None)


def test_summary_rows_and_text():
    h = MetricHistory()
    for epoch, value in enumerate([0.8, float("nan"), 0.2, 0.5], 1):
        h.record("train", "Loss", epoch, value)
    summary = LearnerSummary.from_history(h, epochs=4, model="Net")
    row = summary.get("train", "Loss")
    assert (row.min, row.max, row.last) == ((0.2, 3), (0.8, 1), (0.5, 4))
    assert summary.get("valid", "Loss") is None
    assert str(summary).splitlines()[-1] == "| train | Loss   | 0.2    | 3     | 0.8    | 1     | 0.5    | 4     |"
    assert "no numeric metric" in str(LearnerSummary.from_history(MetricHistory(), 1))


def test_records_hold_tensor_data(tmp_path):
    model, optimizer, scheduler = trained()
    FileCheckpointer(tmp_path).save(1, model, optimizer, scheduler, TrainingState(1))
    record = NamedMpkGzFileRecorder().load(tmp_path / "optim-1.mpk.gz")
    entry = record[str(model.linear.weight.id)]
    assert entry["time"] == 3 and isinstance(entry["moment_1"], TensorData)
    assert entry["moment_1"].dtype.value == "f32"
