"""Gradient synchronisation: 2 processes at batch 32 train to the weights of 1 process at
batch 64; collectives start before the backward pass ends; careless use is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.distributed")
sys.path.insert(0, str(Path(__file__).parent))
from harness import check_ok, run_job
from jobs import train_steps

import ember
from ember import ArgumentError, Tensor
from ember.distributed import GradientSync
from ember.nn.linear import LinearConfig


def _ranks(out: Path, world: int) -> list[tuple[dict, dict]]:
    return [(dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
            for r in range(world)]  # fmt: skip


def _train_like_one(tmp_path: Path, backend: str, bucket_mb: str) -> list[tuple[dict, dict]]:
    """Runs the 2-process training job and checks its weights against 1 process at batch 64."""
    # The fusion case runs its kernels in the interpreter: nothing to compile in the job.
    env = {"EMBER_FUSION_RUNTIME": "interpreter"}
    check_ok(run_job(2, "train", tmp_path, args=(backend, bucket_mb), env=env))
    ranks = _ranks(tmp_path, 2)
    expected, _ = train_steps(backend.replace("fusion-", ""), 0, 1)  # one process, batch 64
    for weights, summary in ranks:
        assert summary["steps"] == 4
        assert set(weights) == set(expected)
        for path, want in expected.items():
            np.testing.assert_allclose(weights[path], want, rtol=1e-5, atol=1e-6, err_msg=path)
    for path in expected:  # every rank holds exactly the same weights
        np.testing.assert_array_equal(ranks[0][0][path], ranks[1][0][path], err_msg=path)
    return ranks


# One bucket (25 MB) or one per parameter (0.0001 MB); autodiff(ndarray) with small buckets
# is the next test's job. Starting the processes is what each case costs.
@pytest.mark.parametrize(
    ("backend", "bucket_mb"),
    [("autodiff-ndarray", "25"), ("autodiff-torch", "0.0001"),
     ("autodiff-fusion-ndarray", "0.0001")],
)  # fmt: skip
def test_two_processes_train_like_one_with_twice_the_batch(tmp_path, backend, bucket_mb):
    _train_like_one(tmp_path, backend, bucket_mb)


def test_buckets_are_sent_while_the_backward_pass_goes_on(tmp_path):
    ranks = _train_like_one(tmp_path, "autodiff-ndarray", "0.0001")
    events = [tuple(e) for e in ranks[0][1]["events"]]
    first_launch = events.index(("launch", 0))
    # The first layer's gradients are finished last; bucket 0 (the last layers) left before.
    assert first_launch < events.index(("ready", "a.weight"))
    assert events[-1] == ("finish", None)
    assert [e for e in events if e[0] == "launch"] == [("launch", b) for b in range(4)]


def test_a_parameter_the_pass_does_not_reach_stays_equal_on_every_rank(tmp_path):
    check_ok(run_job(2, "train", tmp_path, args=("autodiff-ndarray", "25", "1")))
    ranks = _ranks(tmp_path, 2)
    expected, _ = train_steps("autodiff-ndarray", 0, 1, unused=True)
    for weights, _ in ranks:
        for path, want in expected.items():
            np.testing.assert_allclose(weights[path], want, rtol=1e-5, atol=1e-6, err_msg=path)


def test_ranks_with_different_models_get_a_typed_error(tmp_path):
    check_ok(run_job(2, "mismatch", tmp_path))
    for rank in range(2):
        error = json.loads((tmp_path / f"rank{rank}.json").read_text())["error"]
        assert error.startswith("DistributedError: ember.distributed.GradientSync: the "
                                "parameters of rank(s) [1] differ from rank 0's")  # fmt: skip


def test_one_process_without_init_is_unchanged():
    device = ember.device("ndarray").autodiff()
    model = LinearConfig(3, 2).init(device)
    sync = GradientSync()
    with sync.syncing(model):
        grads = model(Tensor.ones([4, 3], device)).sum().backward()
    assert model.bias.val().grad(grads).tolist() == [4.0, 4.0]
    assert sync.stats.steps == 0
    assert sync.broadcast_module(model) is model


@pytest.mark.parametrize("bad", [0, -1.0, "25", True, float("nan")])
def test_bucket_size_must_be_positive(bad):
    with pytest.raises(ArgumentError, match="GradientSync: bucket_mb must be a number > 0"):
        GradientSync(bucket_mb=bad)


def test_syncing_needs_a_module():
    sync = GradientSync()
    with pytest.raises(ArgumentError, match=r"GradientSync\.syncing: expected a Module, got int"):
        sync.syncing(3).__enter__()
