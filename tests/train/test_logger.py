"""Metric loggers: the artifact tree's files, reading them back, and experiment.log."""

from __future__ import annotations

import logging
import threading

import pytest

from ember.backend.errors import ArgumentError
from ember.train.logger import FileMetricLogger, InMemoryMetricLogger, experiment_log
from ember.train.metric.base import MetricEntry


def entry(name: str, value: float | str) -> MetricEntry:
    return MetricEntry(name, f"shown {value}", str(value))


def test_file_logger_writes_the_artifact_tree(tmp_path):
    logger = FileMetricLogger(tmp_path / "train")
    for value in (0.9, 0.7):
        logger.log(entry("Loss", value))
        logger.log(entry("Accuracy", value * 100))
    logger.end_epoch(1)
    logger.log(entry("Loss", 0.5))
    logger.end_epoch(2)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.log"))
    assert files == [
        "train/epoch-1/Accuracy.log",
        "train/epoch-1/Loss.log",
        "train/epoch-2/Loss.log",
    ]
    assert (tmp_path / "train/epoch-1/Loss.log").read_text() == "0.9\n0.7\n"
    assert logger.read_numeric("Loss", 1) == [0.9, 0.7]
    assert logger.read_numeric("Accuracy", 1) == [90.0, 70.0]
    assert logger.read_numeric("Loss", 2) == [0.5]
    # another logger of the same folder (a later process) reads the same values
    assert FileMetricLogger(tmp_path / "train").read_numeric("Loss", 1) == [0.9, 0.7]


def test_file_logger_read_errors(tmp_path):
    logger = FileMetricLogger(tmp_path)
    logger.log(entry("CUDA", "GPU #0 usage 5.00%"))
    with pytest.raises(
        ArgumentError,
        match=r"no values of 'Loss' were logged in epoch 1 \(.*Loss.log does not exist\)",
    ):
        logger.read_numeric("Loss", 1)
    with pytest.raises(
        ArgumentError, match=r"CUDA.log holds 'GPU #0 usage 5.00%' on line 1, not a number"
    ):
        logger.read_numeric("CUDA", 1)
    with pytest.raises(ArgumentError, match="epochs count from 1, got 0"):
        logger.read_numeric("CUDA", 0)
    with pytest.raises(ArgumentError, match="metric name 'a/b' cannot name a file"):
        logger.log(entry("a/b", 1.0))
    with pytest.raises(ArgumentError, match=r"the serialized value of 'Loss' must be one line"):
        logger.log(MetricEntry("Loss", "x", "1.0\n2.0"))


def test_a_line_being_written_is_not_read(tmp_path):
    logger = FileMetricLogger(tmp_path)
    logger.log(entry("Loss", 1.5))
    with open(tmp_path / "epoch-1" / "Loss.log", "a") as file:
        file.write("2.2")  # a writer caught in the middle of its line
    assert logger.read_numeric("Loss", 1) == [1.5]


def test_a_resumed_run_rewrites_the_epoch_it_restarts(tmp_path):
    first = FileMetricLogger(tmp_path)
    first.log(entry("Loss", 1.0))
    first.end_epoch(1)
    first.log(entry("Loss", 0.8))  # epoch 2 interrupted after one iteration
    first.close()
    resumed = FileMetricLogger(tmp_path)
    resumed.end_epoch(1)  # resuming from the checkpoint of epoch 1
    resumed.log(entry("Loss", 0.7))
    resumed.log(entry("Loss", 0.6))
    assert resumed.read_numeric("Loss", 1) == [1.0]
    assert resumed.read_numeric("Loss", 2) == [0.7, 0.6]
    # closing mid-epoch and logging again appends
    resumed.close()
    resumed.log(entry("Loss", 0.5))
    assert resumed.read_numeric("Loss", 2) == [0.7, 0.6, 0.5]
    assert FileMetricLogger(tmp_path, epoch=3).epoch == 3


def test_readers_see_whole_lines_while_a_thread_writes(tmp_path):
    logger = FileMetricLogger(tmp_path)
    values = [float(i) + 0.123456789 for i in range(3000)]
    logger.log(entry("Loss", values[0]))
    done = threading.Event()

    def write():
        for value in values[1:]:
            logger.log(entry("Loss", value))
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    reads = []
    while not done.is_set():
        reads.append(FileMetricLogger(tmp_path).read_numeric("Loss", 1))
    writer.join()
    for read in reads:  # each read is a prefix of what is written: no half line, no garbage
        assert read == values[: len(read)]
    assert logger.read_numeric("Loss", 1) == values


def test_in_memory_logger():
    logger = InMemoryMetricLogger()
    logger.log(entry("Loss", 0.4))
    logger.log(entry("Loss", 0.2))
    logger.end_epoch(1)
    logger.log(entry("Loss", 0.1))
    logger.log(entry("CUDA", "text"))
    assert logger.values == {1: {"Loss": ["0.4", "0.2"]}, 2: {"Loss": ["0.1"], "CUDA": ["text"]}}
    assert logger.read_numeric("Loss", 1) == [0.4, 0.2]
    assert logger.read_numeric("Loss", 2) == [0.1]
    with pytest.raises(ArgumentError, match="no values of 'Loss' were logged in epoch 3"):
        logger.read_numeric("Loss", 3)
    with pytest.raises(ArgumentError, match="holds 'text' on line 1, not a number"):
        logger.read_numeric("CUDA", 2)


def test_experiment_log_collects_embers_records(tmp_path):
    ember_logger = logging.getLogger("ember")
    handlers, level = list(ember_logger.handlers), ember_logger.level
    with experiment_log(tmp_path / "run") as path:
        logging.getLogger("ember.train.learner").info("epoch 1: loss 0.5")
        logging.getLogger("other").warning("not ember's")
    logging.getLogger("ember.train.learner").info("after the run")
    assert path == tmp_path / "run" / "experiment.log"
    text = path.read_text()
    assert "INFO ember.train.learner: epoch 1: loss 0.5" in text
    assert "not ember's" not in text and "after the run" not in text
    assert ember_logger.handlers == handlers and ember_logger.level == level
    with experiment_log(tmp_path / "run"):  # a resumed run appends
        logging.getLogger("ember").warning("resumed")
    assert path.read_text().startswith(text) and "resumed" in path.read_text()
