"""PlainRenderer: a line every N iterations and one per epoch end, on any stream."""

from __future__ import annotations

import io

import pytest
from learner_support import classifier, loaders

from ember.backend.errors import ArgumentError
from ember.optim.sgd import SgdConfig
from ember.train.learner.builder import LearnerBuilder
from ember.train.metric.base import MetricEntry, Progress
from ember.train.metric.loss import LossMetric
from ember.train.renderer.base import MetricUpdate, TrainingProgress
from ember.train.renderer.plain import PlainRenderer


def feed(renderer, split, iterations, total_items=10, batch=4, epoch=1, epochs=2):
    for i in range(1, iterations + 1):
        entry = MetricEntry("Loss", f"epoch {i}.0 - batch {i}.0", str(float(i)))
        getattr(renderer, f"update_{split}")(MetricUpdate(entry, value=float(i)))
        text = MetricEntry("Note", f"note {i}", "x")
        getattr(renderer, f"update_{split}")(MetricUpdate(text))
        progress = Progress(min(i * batch, total_items), total_items)
        getattr(renderer, f"render_{split}")(TrainingProgress(progress, epoch, epochs, i))


def test_lines_every_n_iterations_and_at_epoch_end():
    stream = io.StringIO()
    renderer = PlainRenderer(every=2, stream=stream)
    feed(renderer, "train", 3)
    renderer.on_epoch_end("train", 1)
    feed(renderer, "valid", 1)
    renderer.on_epoch_end("valid", 1)
    assert stream.getvalue().splitlines() == [
        "[train] epoch 1/2 iteration 2 items 8/10 (80%) | Loss epoch 2.0 - batch 2.0 | Note note 2",
        "[train] epoch 1/2 done | Loss 3 | Note note 3",
        "[valid] epoch 1/2 done | Loss 1 | Note note 1",
    ]


def test_every_zero_writes_only_epoch_ends_and_splits_stay_apart():
    stream = io.StringIO()
    renderer = PlainRenderer(every=0, stream=stream)
    feed(renderer, "train", 5)
    renderer.on_epoch_end("valid", 1)  # no valid update: nothing but the header
    renderer.on_epoch_end("train", 1)
    assert stream.getvalue().splitlines() == [
        "[valid] epoch 1 done",
        "[train] epoch 1/2 done | Loss 5 | Note note 5",
    ]


def test_writes_to_the_current_stdout_by_default(capsys):
    renderer = PlainRenderer(every=1)
    feed(renderer, "valid", 1, total_items=0)
    assert capsys.readouterr().out == "[valid] epoch 1/2 iteration 1 items 0/0 | Loss epoch 1.0 - batch 1.0 | Note note 1\n"


def test_in_a_learner_run(tmp_path):
    train, valid = loaders()  # 6 training and 2 validation batches per epoch
    stream = io.StringIO()
    (
        LearnerBuilder(tmp_path).num_epochs(2).renderer(PlainRenderer(every=3, stream=stream))
        .metric_train_numeric(LossMetric()).metric_valid_numeric(LossMetric())
        .build(classifier(0), SgdConfig().init(), 0.1)
        .fit(train, valid)
    )  # fmt: skip
    heads = [line.split(" | ")[0] for line in stream.getvalue().splitlines()]
    assert heads == [
        "[train] epoch 1/2 iteration 3 items 12/24 (50%)",
        "[train] epoch 1/2 iteration 6 items 24/24 (100%)",
        "[train] epoch 1/2 done",
        "[valid] epoch 1/2 done",
        "[train] epoch 2/2 iteration 3 items 12/24 (50%)",
        "[train] epoch 2/2 iteration 6 items 24/24 (100%)",
        "[train] epoch 2/2 done",
        "[valid] epoch 2/2 done",
    ]
    last_train = (tmp_path / "train/epoch-2/Loss.log").read_text().splitlines()
    mean = sum(map(float, last_train)) / len(last_train)  # equal batches: the epoch mean
    done = next(line for line in stream.getvalue().splitlines() if line.startswith("[train] epoch 2/2 done"))
    assert done == f"[train] epoch 2/2 done | Loss {mean:.4g}"


@pytest.mark.parametrize("every", [-1, 1.5, True])
def test_bad_every(every):
    with pytest.raises(ArgumentError, match=f"PlainRenderer: every must be an integer >= 0, got {every!r}"):
        PlainRenderer(every=every)
