"""The Learner in a job of two processes: the same history on every rank, only rank 0
writes, metrics combined over the ranks, and a job killed mid-epoch resumes exactly."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.distributed")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from harness import check_ok, run_job
from learner_support import classifier, loaders

from ember import Tensor


def _ranks(out: Path) -> list[tuple[dict, dict]]:
    return [(dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
            for r in range(2)]  # fmt: skip


def test_two_ranks_share_one_history_and_only_rank_0_writes(tmp_path):
    artifact = tmp_path / "run"
    check_ok(run_job(2, "learner", tmp_path, args=(str(artifact), "2")))
    (w0, s0), (w1, s1) = _ranks(tmp_path)
    assert s0["history"] == s1["history"]
    for path in w0:
        np.testing.assert_array_equal(w0[path], w1[path], err_msg=path)
    assert s0["train_updates"] == 2 * 6 * 3  # epochs x (24 items / batch 4) x metrics
    assert s1["train_updates"] == 0  # rank 1 shows nothing
    # Only rank 0 feeds its trackers: 2 epochs x (6 train + 2 valid iterations) steps.
    assert s0["tracker_calls"] == {"start": 1, "log_step": 2 * (6 + 2), "log_epoch": 4, "finish": 1}
    assert s1["tracker_calls"] == {"start": 0, "log_step": 0, "log_epoch": 0, "finish": 0}
    assert sorted(p.name for p in (artifact / "checkpoint").iterdir()) == [
        f"{kind}-{e}{ext}" for kind, ext in (("model", ".mpk.gz"), ("optim", ".mpk.gz"),
                                             ("scheduler", ".mpk.gz"), ("state", ".json"))
        for e in (1, 2)]  # fmt: skip
    assert (artifact / "experiment.log").is_file()

    # The combined validation metrics are those of the whole validation set (each rank
    # validated its half) with the weights after epoch 2.
    model = classifier(0)
    model = model.map(lambda path, p: Tensor.from_data(w0[path], p.val().device))
    _, valid = loaders(train_size=48, valid_size=16, batch_size=4)
    losses, correct = [], 0
    for x, y in valid:
        out = model.valid().classify((x.inner(), y.inner()))
        losses.append(out.loss.item())
        correct += int((out.output.argmax(1).to_numpy().reshape(-1) == y.to_numpy()).sum())
    assert s0["history"]["valid|Accuracy"]["2"] == pytest.approx(100.0 * correct / 16)
    assert s0["history"]["valid|Loss"]["2"] == pytest.approx(float(np.mean(losses)), rel=1e-6)


def test_a_job_killed_mid_epoch_resumes_like_an_uninterrupted_one(tmp_path):
    whole = tmp_path / "whole"
    whole.mkdir()
    check_ok(run_job(2, "learner", whole, args=(str(whole / "run"), "3")))

    killed = tmp_path / "killed"
    killed.mkdir()
    started = time.monotonic()
    results = run_job(2, "learner", killed, args=(str(killed / "run"), "3", "0", "2"))
    assert results[1].returncode == -9  # rank 1 killed itself in epoch 2
    assert results[0].returncode not in (0, None)  # rank 0 stopped: no hang
    assert "DistributedError" in results[0].output
    assert time.monotonic() - started < 100
    epochs = sorted(p.name for p in (killed / "run" / "checkpoint").glob("state-*.json"))
    assert epochs == ["state-1.json"]

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    check_ok(run_job(2, "learner", resumed, args=(str(killed / "run"), "3", "1")))
    expected, got = _ranks(whole)[0][0], _ranks(resumed)
    for weights, _ in got:
        for path, want in expected.items():
            np.testing.assert_array_equal(weights[path], want, err_msg=path)
