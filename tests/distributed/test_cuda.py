"""NCCL on CUDA: a process group of one process per GPU (one GPU is enough)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import check_ok, run_job
from jobs import value

torch = pytest.importorskip("torch")


def _gpus() -> int:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the NCCL cases run only where torch sees a GPU")
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    return torch.cuda.device_count()


@pytest.mark.parametrize("world", [1, 2])
def test_nccl_collectives_on_cuda_tensors(tmp_path, world):
    if _gpus() < world:
        pytest.skip(f"{world} GPUs needed, {torch.cuda.device_count()} seen")
    check_ok(run_job(world, "cuda_collectives", tmp_path))
    inputs = np.stack([value(r, "f32") for r in range(world)])
    for rank in range(world):
        results = dict(np.load(tmp_path / f"rank{rank}.npz"))
        np.testing.assert_array_equal(results["all_reduce"], inputs.sum(0))
        np.testing.assert_array_equal(results["broadcast"], inputs[0])
        np.testing.assert_array_equal(results["all_gather"], inputs)
        assert results["device"].all()
        error = json.loads((tmp_path / f"rank{rank}.json").read_text())["cpu"]
        assert error.startswith("ArgumentError: ember.distributed.all_reduce: the nccl engine "
                                "carries CUDA tensors")  # fmt: skip
