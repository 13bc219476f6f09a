"""``ember guide train --nproc 2``: the guide trains data-parallel in two processes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from ember.cli import _without_option

pytest.importorskip("torch.distributed")


def test_the_guide_trains_in_two_processes(tmp_path):
    folder = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "ember", "guide", "train", "--nproc", "2", "--limit", "256",
         "--epochs", "1", "--renderer", "plain", "--artifact-dir", str(folder)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("[valid] epoch 1/1 done") == 1  # rank 0 alone shows the run
    assert done.stdout.count(f"The trained model is in {folder / 'model.mpk.gz'}") == 1
    # With matplotlib (the test extra has it) rank 0 alone writes the training report.
    report = ["report"] if importlib.util.find_spec("matplotlib") is not None else []
    assert sorted(p.name for p in folder.iterdir()) == sorted([
        "checkpoint", "config.json", "experiment.log", "model.mpk.gz", "train", "valid", *report])
    if report:
        assert done.stdout.count(f"Training report: {folder / 'report' / 'index.html'}") == 1
        assert sorted(p.name for p in (folder / "report").iterdir()) == [
            "Accuracy.png", "Loss.png", "index.html"]
    infer = subprocess.run([sys.executable, "-m", "ember", "guide", "infer", "--artifact-dir",
                            str(folder), "--count", "2"], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert infer.returncode == 0, infer.stderr[-2000:]
    assert infer.stdout.count("test item ") == 2


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["guide", "train", "--nproc", "2", "--epochs", "1"], ["guide", "train", "--epochs", "1"]),
        (["guide", "train", "--nproc=4"], ["guide", "train"]),
        (["guide", "train", "--nprocs", "2"], ["guide", "train", "--nprocs", "2"]),
    ],
)  # fmt: skip
def test_the_job_reruns_the_command_without_nproc(argv, expected):
    assert _without_option(argv, "--nproc") == expected
