"""The learner on a small synthetic classification task (NdArray autodiff)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from itertools import zip_longest

import numpy as np
import pytest
from learner_support import (
    DEVICE,
    CallbackRenderer,
    Classifier,
    ScriptedMetric,
    assert_same_weights,
    autodiff_device,
    classifier,
    loaders,
    log_tree,
)

import ember
from ember.backend.errors import ArgumentError, DeviceError
from ember.nn.dropout import Dropout, DropoutConfig
from ember.optim.adam import AdamConfig
from ember.optim.grads import GradientsParams
from ember.optim.lr_scheduler.linear import LinearLrSchedulerConfig
from ember.optim.sgd import SgdConfig
from ember.train.learner.builder import LearnerBuilder, default_renderer
from ember.train.learner.checkpoint import FileCheckpointer
from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.base import Metric
from ember.train.metric.learning_rate import LearningRateMetric
from ember.train.metric.loss import LossMetric
from ember.train.renderer.plain import PlainRenderer
from ember.train.step import TrainOutput


def builder(directory, epochs, renderer=None):
    return (
        LearnerBuilder(directory)
        .num_epochs(epochs)
        .renderer(renderer if renderer is not None else CallbackRenderer())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .with_file_checkpointer()
    )


def scheduler():
    return LinearLrSchedulerConfig(0.2, 0.02, num_iters=15).init()


def lines(path):
    return path.read_text().splitlines()


# ---------------------------------------------------------------------- the loop
@pytest.mark.parametrize("accumulation", [1, 4])
def test_fit_equals_a_hand_written_loop(tmp_path, accumulation):
    """Gradients of `accumulation` iterations are summed; one scheduler step per optimizer step;
    the last, shorter group of an epoch (6 batches, groups of 4) still steps."""
    train, valid = loaders()
    learner = builder(tmp_path, 2).grads_accumulation(accumulation).metric_train_numeric(
        LearningRateMetric()
    ).build(classifier(0), SgdConfig().init(), scheduler())
    trained = learner.fit(train, valid)

    model, optimizer, lrs = classifier(0), SgdConfig().init(), scheduler()
    expected_lr = []
    for epoch in (1, 2):
        train.set_epoch(epoch)
        batches = list(train)
        for start in range(0, len(batches), accumulation):
            lr = lrs.step()
            total: dict = {}
            for batch in batches[start : start + accumulation]:
                grads = GradientsParams.from_grads(model.classify(batch).loss.backward(), model)
                for pid in grads:
                    total[pid] = grads.get(pid) if pid not in total else total[pid] + grads.get(pid)
                expected_lr.append(lr)
            model = optimizer.step(lr, model, GradientsParams(total))
    assert_same_weights(trained, model)
    logged = [float(v) for e in (1, 2) for v in lines(tmp_path / f"train/epoch-{e}/LearningRate.log")]
    assert logged == expected_lr


def test_metric_files_renderer_calls_and_experiment_log(tmp_path):
    train, valid = loaders()
    renderer = CallbackRenderer()
    model = classifier(0)
    learner = builder(tmp_path, 2, renderer).build(model, SgdConfig().init(), 0.1)
    learner.fit(train, valid)

    for split, loader in (("train", train), ("valid", valid)):
        for epoch in (1, 2):
            for name in ("Loss", "Accuracy"):
                assert len(lines(tmp_path / split / f"epoch-{epoch}" / f"{name}.log")) == len(loader)
    assert not (tmp_path / "train" / "epoch-3").exists()
    # The first training line is the loss of the initial model on the first batch of epoch 1.
    train.set_epoch(1)
    first = model.classify(next(iter(train))).loss.item()
    assert float(lines(tmp_path / "train/epoch-1/Loss.log")[0]) == pytest.approx(first, rel=1e-6)

    assert renderer.epoch_ends == [("train", 1), ("valid", 1), ("train", 2), ("valid", 2)]
    assert renderer.closed == 1
    assert {(s, n) for s, n, v in renderer.updates if v is not None} == {
        ("train", "Loss"), ("valid", "Loss"), ("train", "Accuracy"), ("valid", "Accuracy")
    }  # fmt: skip
    text = (tmp_path / "experiment.log").read_text()
    assert "epoch 1/2 done" in text and "epoch 2/2 done" in text
    assert "saved the checkpoint of epoch 2" in text
    handlers = logging.getLogger("ember").handlers
    assert not [h for h in handlers if isinstance(h, logging.FileHandler)]


def test_non_plotted_metric_reports_no_value(tmp_path):
    train, _ = loaders()
    renderer = CallbackRenderer()
    LearnerBuilder(tmp_path).renderer(renderer).metric_train(LossMetric()).build(
        classifier(0), SgdConfig().init(), 0.1
    ).fit(train, None)
    assert renderer.updates and all(v is None for _, _, v in renderer.updates)
    assert len(lines(tmp_path / "train/epoch-1/Loss.log")) == len(train)
    assert not (tmp_path / "valid").exists()


def test_two_devices_split_each_epoch_and_sum_gradients(tmp_path):
    train, valid = loaders(train_size=22)  # parts of 11 items: batches of 4, 4, 3
    trained = builder(tmp_path, 2).devices([DEVICE, DEVICE]).build(
        classifier(0), SgdConfig().init(), 0.1
    ).fit(train, valid)

    model, optimizer = classifier(0), SgdConfig().init()
    parts = train.split(2)
    for epoch in (1, 2):
        for part in parts:
            part.set_epoch(epoch)
        for pair in zip_longest(*parts):
            total: dict = {}
            for batch in pair:
                grads = GradientsParams.from_grads(model.classify(batch).loss.backward(), model)
                for pid in grads:
                    total[pid] = grads.get(pid) if pid not in total else total[pid] + grads.get(pid)
            model = optimizer.step(0.1, model, GradientsParams(total))
    assert_same_weights(trained, model)
    assert len(lines(tmp_path / "train/epoch-1/Loss.log")) == 6  # one entry per device batch


# ---------------------------------------------------------------------- resume
@pytest.mark.parametrize("backend", ["ndarray", "torch", "torch-cuda"])
def test_resume_equals_an_uninterrupted_run(tmp_path, backend):
    device = autodiff_device(backend)
    train, valid = loaders(device=device)
    full = builder(tmp_path / "full", 4).build(classifier(0, device), AdamConfig().init(), scheduler())
    uninterrupted = full.fit(train, valid)
    assert uninterrupted.devices() == [device]

    builder(tmp_path / "parts", 2).build(classifier(0, device), AdamConfig().init(), scheduler()).fit(
        train, valid
    )
    # A different initialization and fresh optimizer and scheduler: all come from the checkpoint.
    second = builder(tmp_path / "parts", 4).checkpoint(2).build(
        classifier(9, device), AdamConfig().init(), scheduler()
    )
    resumed = second.fit(train, valid)

    assert_same_weights(resumed, uninterrupted)
    assert log_tree(tmp_path / "parts") == log_tree(tmp_path / "full")
    assert len(log_tree(tmp_path / "full")) == 16
    assert second.history.to_record() == full.history.to_record()
    assert "resumed from the checkpoint of epoch 2" in (tmp_path / "parts/experiment.log").read_text()


class DropoutClassifier(Classifier):
    dropout: Dropout

    def forward(self, x):
        return self.linear(self.dropout(x))


@pytest.mark.parametrize("backend", ["ndarray", "torch"])
def test_resume_with_dropout_draws_on_as_an_uninterrupted_run(tmp_path, backend):
    # The checkpoint keeps the device's generator state: the resumed run's masks are the same.
    device = autodiff_device(backend)
    train, valid = loaders(device=device)

    def model(seed):
        base = classifier(seed, device)
        return DropoutClassifier(base.linear, base.loss, DropoutConfig(0.5).init())

    full = builder(tmp_path / "full", 4).build(model(0), AdamConfig().init(), scheduler())
    uninterrupted = full.fit(train, valid)
    builder(tmp_path / "parts", 2).build(model(0), AdamConfig().init(), scheduler()).fit(train, valid)
    resumed = builder(tmp_path / "parts", 4).checkpoint(2).build(
        model(9), AdamConfig().init(), scheduler()  # model(9) reseeds the device: restored next
    ).fit(train, valid)
    assert_same_weights(resumed, uninterrupted)
    assert log_tree(tmp_path / "parts") == log_tree(tmp_path / "full")


def test_resume_from_a_missing_checkpoint(tmp_path):
    train, valid = loaders()
    learner = builder(tmp_path, 3).checkpoint(2).build(classifier(0), SgdConfig().init(), 0.1)
    with pytest.raises(ember.backend.errors.RecordFileNotFoundError, match="no checkpoint of epoch 2"):
        learner.fit(train, valid)


# ---------------------------------------------------------------------- stopping
def test_interrupter_stop_leaves_a_loadable_checkpoint_and_resume_is_exact(tmp_path):
    train, valid = loaders()
    reference = builder(tmp_path / "ref", 3).build(classifier(0), SgdConfig().init(), scheduler())
    uninterrupted = reference.fit(train, valid)

    renderer = CallbackRenderer()
    run = builder(tmp_path / "run", 3, renderer)
    interrupter = run.interrupter()
    renderer.on_train = lambda p: interrupter.stop() if (p.epoch, p.iteration) == (2, 3) else None
    stopped = run.build(classifier(0), SgdConfig().init(), scheduler()).fit(train, valid)

    checkpointer = FileCheckpointer(tmp_path / "run/checkpoint")
    assert checkpointer.epochs() == [1, 2]
    state = checkpointer.load_state(2)
    assert (state.complete, state.iteration) == (False, 3)
    loaded, _, _, _ = checkpointer.load(2, classifier(5), SgdConfig().init(), scheduler())
    assert_same_weights(loaded, stopped)
    assert len(lines(tmp_path / "run/train/epoch-2/Loss.log")) == 3
    assert not (tmp_path / "run/valid/epoch-2").exists()
    assert renderer.closed == 1
    assert "resume exactly with .checkpoint(1)" in (tmp_path / "run/experiment.log").read_text()

    with pytest.raises(ArgumentError, match=r"interrupted during that epoch .*\.checkpoint\(1\)"):
        builder(tmp_path / "run", 3).checkpoint(2).build(
            classifier(0), SgdConfig().init(), scheduler()
        ).fit(train, valid)
    resumed = builder(tmp_path / "run", 3).checkpoint(1).build(
        classifier(0), SgdConfig().init(), scheduler()
    ).fit(train, valid)
    assert_same_weights(resumed, uninterrupted)
    assert log_tree(tmp_path / "run") == log_tree(tmp_path / "ref")
    assert FileCheckpointer(tmp_path / "run/checkpoint").epochs() == [2, 3]


class StopAt(Metric):
    """Asks the interrupter to stop at one (epoch, iteration)."""

    name = "StopAt"
    input_type = None

    def __init__(self, interrupter, epoch, iteration):
        self.interrupter, self.at = interrupter, (epoch, iteration)

    def update(self, item, metadata):
        if (metadata.epoch, metadata.iteration) == self.at:
            self.interrupter.stop()
        return ember.train.metric.base.MetricEntry(self.name, "", "0")

    def clear(self):
        pass


def test_a_metric_can_stop_training_during_validation(tmp_path):
    train, valid = loaders()
    run = builder(tmp_path, 3)
    run.metric_valid(StopAt(run.interrupter(), 2, 1))
    run.build(classifier(0), SgdConfig().init(), 0.1).fit(train, valid)
    checkpointer = FileCheckpointer(tmp_path / "checkpoint")
    state = checkpointer.load_state(2)
    assert (state.complete, state.iteration) == (False, len(train))
    assert checkpointer.load_state(1).complete
    assert len(lines(tmp_path / "valid/epoch-2/Loss.log")) == 1


def test_sigint_stops_after_the_iteration_and_restores_the_handler(tmp_path):
    train, valid = loaders()
    previous = signal.getsignal(signal.SIGINT)

    def interrupt(progress):
        if (progress.epoch, progress.iteration) == (2, 2):
            os.kill(os.getpid(), signal.SIGINT)

    model = builder(tmp_path, 3, CallbackRenderer(interrupt)).build(
        classifier(0), SgdConfig().init(), 0.1
    ).fit(train, valid)
    assert signal.getsignal(signal.SIGINT) is previous
    checkpointer = FileCheckpointer(tmp_path / "checkpoint")
    state = checkpointer.load_state(2)
    assert (state.complete, state.iteration) == (False, 2)
    loaded = classifier(3).load_file(checkpointer.path("model", 2), checkpointer.recorder)
    assert_same_weights(loaded, model)
    assert "Ctrl-C: stopping after the current iteration" in (tmp_path / "experiment.log").read_text()


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler, as in a terminal (a shell starts a background job with
    SIGINT ignored, and a second Ctrl-C then does what SIGINT did before fit(): nothing)."""
    original = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, original)


def test_a_second_sigint_aborts(tmp_path, python_sigint):
    train, valid = loaders()
    previous = signal.getsignal(signal.SIGINT)

    def interrupt_twice(progress):
        if (progress.epoch, progress.iteration) == (1, 2):
            # Two SIGINTs pending at once reach the handler as one: each goes to this (the
            # main) thread, and a loop's backward jump runs the first's handler before the
            # second is sent.
            main = threading.main_thread().ident
            signal.pthread_kill(main, signal.SIGINT)
            for _ in range(100):
                pass
            signal.pthread_kill(main, signal.SIGINT)

    renderer = CallbackRenderer(interrupt_twice)
    learner = builder(tmp_path, 2, renderer).build(classifier(0), SgdConfig().init(), 0.1)
    with pytest.raises(KeyboardInterrupt):
        learner.fit(train, valid)
    assert signal.getsignal(signal.SIGINT) is previous
    assert renderer.closed == 1


@pytest.mark.parametrize(
    ("values", "min_delta", "lower_is_better", "last_epoch"),
    [
        ([5, 4, 4.5, 4.2, 3, 1], 0.0, True, 4),  # best at 2, patience 2 runs out after 4
        ([5, 4, 3.97, 3.96, 3, 1], 0.05, True, 4),  # 3.97 and 3.96 are within min_delta
        ([5, 4, 3.97, 3.96, 3, 1], 0.0, True, 6),  # every epoch improves
        ([1, 2, 2, 1, 3, 3], 0.0, False, 4),  # higher is better: best at 2
    ],
)
def test_early_stopping(tmp_path, values, min_delta, lower_is_better, last_epoch):
    train, valid = loaders(train_size=8)
    metric = ScriptedMetric(values, lower_is_better)
    learner = (
        builder(tmp_path, 6)
        .metric_valid_numeric(metric)
        .early_stopping("Scripted", "valid", min_delta=min_delta, patience=2)
        .build(classifier(0), SgdConfig().init(), 0.1)
    )
    learner.fit(train, valid)
    assert (tmp_path / f"train/epoch-{last_epoch}").is_dir()
    assert not (tmp_path / f"train/epoch-{last_epoch + 1}").exists()
    assert FileCheckpointer(tmp_path / "checkpoint").epochs()[-1] == last_epoch
    if last_epoch < 6:
        assert "early stopping after epoch" in (tmp_path / "experiment.log").read_text()


def test_early_stopping_state_survives_a_resume(tmp_path):
    train, valid = loaders(train_size=8)
    values = [5, 4, 4.5, 4.2, 3, 1]

    def run(epochs, resume=None):
        b = builder(tmp_path, epochs).metric_valid_numeric(ScriptedMetric(values))
        b.early_stopping("Scripted", patience=2)
        if resume:
            b.checkpoint(resume)
        b.build(classifier(0), SgdConfig().init(), 0.1).fit(train, valid)

    run(3)  # best at epoch 2, one epoch without improvement
    run(6, resume=3)  # a fresh early-stopping state would wait until epoch 5
    assert not (tmp_path / "train/epoch-5").exists()
    assert (tmp_path / "train/epoch-4").is_dir()


def test_checkpoints_keep_the_last_two_and_the_best(tmp_path):
    train, valid = loaders(train_size=8)
    (
        builder(tmp_path, 5)
        .metric_valid_numeric(ScriptedMetric([3, 1, 2, 4, 5]))
        .with_file_checkpointer(keep_last=2, keep_best=("Scripted", "valid"))
        .build(classifier(0), SgdConfig().init(), 0.1)
        .fit(train, valid)
    )
    directory = tmp_path / "checkpoint"
    names = sorted(path.name for path in directory.iterdir())
    expected = sorted(
        f"{kind}-{epoch}.{'json' if kind == 'state' else 'mpk.gz'}"
        for epoch in (2, 4, 5)
        for kind in ("model", "optim", "scheduler", "state")
    )
    assert names == expected


def test_summary_table(tmp_path, capsys):
    train, valid = loaders()
    learner = builder(tmp_path, 3).summary().build(classifier(0), SgdConfig().init(), 0.5)
    learner.fit(train, valid)
    out = capsys.readouterr().out
    assert "Learner summary: Classifier, 3 epochs" in out
    for split in ("train", "valid"):
        for name in ("Loss", "Accuracy"):
            # All batches hold 4 items: the epoch value is the mean of the logged lines.
            means = {
                epoch: float(np.mean([float(v) for v in lines(tmp_path / split / f"epoch-{epoch}/{name}.log")]))
                for epoch in (1, 2, 3)
            }  # fmt: skip
            row = learner.summary.get(split, name)
            low = min(means, key=lambda e: (means[e], e))
            high = max(means, key=lambda e: (means[e], -e))
            assert row.min == (pytest.approx(means[low], rel=1e-9), low)
            assert row.max == (pytest.approx(means[high], rel=1e-9), high)
            assert row.last == (pytest.approx(means[3], rel=1e-9), 3)
            assert f"| {split} | {name}" in out
            assert f"{row.last[0]:.6g}" in out
    assert "Learner summary" in (tmp_path / "experiment.log").read_text()


def test_no_summary_unless_asked(tmp_path, capsys):
    train, valid = loaders(train_size=8)
    learner = builder(tmp_path, 1).build(classifier(0), SgdConfig().init(), 0.1)
    learner.fit(train, valid)
    assert learner.summary is None and "Learner summary" not in capsys.readouterr().out


# ---------------------------------------------------------------------- renderer choice
def test_default_renderer_follows_the_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    assert isinstance(default_renderer(), PlainRenderer)


def test_default_renderer_on_a_terminal(monkeypatch, log_records):
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    try:
        from ember.train.renderer.dashboard import DashboardRenderer
    except ImportError:
        renderer = default_renderer()
        assert isinstance(renderer, PlainRenderer)
        assert "the dashboard is not available" in log_records.text
    else:
        assert isinstance(default_renderer(), DashboardRenderer)


# ---------------------------------------------------------------------- errors
class NoSteps(ember.module.Module):
    weight: ember.module.Param


class BadStep(ember.module.Module):
    weight: ember.module.Param

    def train_step(self, batch):
        return self.weight.val().sum()

    def valid_step(self, batch):
        return None


def test_build_errors(tmp_path):
    b = LearnerBuilder(tmp_path)
    param = ember.module.Param(ember.Tensor.ones([2], DEVICE))
    with pytest.raises(ArgumentError, match=r"NoSteps must define train_step\(batch\) and valid_step"):
        b.build(NoSteps(param), SgdConfig().init(), 0.1)
    with pytest.raises(ArgumentError, match="expected an Optimizer, got float"):
        b.build(classifier(0), 0.1, 0.1)
    with pytest.raises(ArgumentError, match="learning rate"):
        b.build(classifier(0), SgdConfig().init(), "fast")
    with pytest.raises(DeviceError, match=r"which has no autodiff.*device\.autodiff"):
        b.build(classifier(0).valid(), SgdConfig().init(), 0.1)
    with pytest.raises(DeviceError, match=r"LearnerBuilder\.devices: got ndarray"):
        b.devices([ember.device("ndarray")])
    with pytest.raises(ArgumentError, match=r"checkpoint\(2\).*with_file_checkpointer"):
        LearnerBuilder(tmp_path).checkpoint(2).build(classifier(0), SgdConfig().init(), 0.1)
    with pytest.raises(ArgumentError, match="early_stopping: no numeric valid metric named 'Loss'"):
        LearnerBuilder(tmp_path).early_stopping("Loss").build(classifier(0), SgdConfig().init(), 0.1)
    with pytest.raises(ArgumentError, match=r"keep_best\): no numeric train metric named 'Acc'"):
        LearnerBuilder(tmp_path).metric_train_numeric(LossMetric()).with_file_checkpointer(
            keep_best=("Acc", "train")
        ).build(classifier(0), SgdConfig().init(), 0.1)


def test_option_errors(tmp_path):
    b = LearnerBuilder(tmp_path)
    loss = LossMetric()
    b.metric_train_numeric(loss)
    with pytest.raises(ArgumentError, match="already a train metric; each split needs its own"):
        b.metric_valid_numeric(loss)
    with pytest.raises(ArgumentError, match="a train metric named 'Loss' is already registered"):
        b.metric_train(LossMetric())
    with pytest.raises(ArgumentError, match="metric_valid_numeric: StopAt is not Numeric"):
        b.metric_valid_numeric(StopAt(None, 1, 1))
    with pytest.raises(ArgumentError, match=r"got the class LossMetric; pass an instance, LossMetric\(\)"):
        b.metric_train(LossMetric)
    with pytest.raises(ArgumentError, match="expected a Metric instance, got str"):
        b.metric_train("Loss")
    with pytest.raises(ArgumentError, match="num_epochs: expected an integer >= 1, got 0"):
        b.num_epochs(0)
    with pytest.raises(ArgumentError, match="grads_accumulation: expected an integer >= 1"):
        b.grads_accumulation(1.5)
    with pytest.raises(ArgumentError, match="keep_last must be an integer >= 1 or None, got 0"):
        b.with_file_checkpointer(keep_last=0)
    with pytest.raises(ArgumentError, match="keep_best must be"):
        b.with_file_checkpointer(keep_best="Loss")
    with pytest.raises(ArgumentError, match="patience must be an integer >= 1, got 0"):
        b.early_stopping("Loss", patience=0)
    with pytest.raises(ArgumentError, match="split must be 'train' or 'valid', got 'test'"):
        b.early_stopping("Loss", split="test")
    with pytest.raises(ArgumentError, match="expected a MetricsRenderer"):
        b.renderer(print)


def test_fit_errors(tmp_path):
    train, valid = loaders(train_size=8)
    param = ember.module.Param(ember.Tensor.ones([2], DEVICE))
    learner = LearnerBuilder(tmp_path).renderer(CallbackRenderer()).build(
        BadStep(param), SgdConfig().init(), 0.1
    )
    with pytest.raises(ArgumentError, match=r"BadStep.train_step must return a TrainOutput"):
        learner.fit(train, valid)
    with pytest.raises(ArgumentError, match="a learner fits once"):
        learner.fit(train, valid)
    with pytest.raises(ArgumentError, match="TrainOutput: grads must be a GradientsParams"):
        TrainOutput({}, None)
