"""Every collective on every backend and dtype, in jobs of 2 and 4 processes (gloo on
localhost), against NumPy; and the typed errors of careless calls."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.distributed")
sys.path.insert(0, str(Path(__file__).parent))
from harness import check_ok, run_job
from jobs import BACKENDS, OPS, value

from ember import DType
from ember.distributed.bridge import ENGINE_DTYPES

DTYPES = [d for d in DType if not d.is_low_precision]
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "product": np.prod}


def _job(world: int, tmp_path: Path):
    check_ok(run_job(world, "collectives", tmp_path))
    return [(dict(np.load(tmp_path / f"rank{r}.npz")),
             json.loads((tmp_path / f"rank{r}.json").read_text())) for r in range(world)]  # fmt: skip


def _expected(name: str, dtype: DType, rank: int, world: int) -> np.ndarray | None:
    """What rank ``rank`` must get, or None where the call must be refused."""
    if dtype not in ENGINE_DTYPES["gloo"]:
        return None
    inputs = np.stack([value(r, dtype.value) for r in range(world)]).astype(np.float64)
    kind, _, op = name.partition("-")
    if kind == "all_reduce":
        if op == "mean":
            return None if not dtype.is_float else inputs.mean(0)
        if op == "sum" and dtype is DType.BOOL:
            return None
        return REDUCE[op](inputs, axis=0)
    if kind == "broadcast":
        return inputs[world - 1]
    if kind == "all_gather":
        return inputs
    stacked = np.stack([value(r, dtype.value, rows=2 * world) for r in range(world)]).astype(np.float64)
    if op == "sum" and dtype is DType.BOOL:
        return None
    return REDUCE[op](stacked, axis=0)[2 * rank: 2 * rank + 2]


CALLS = [f"all_reduce-{op}" for op in OPS] + ["broadcast", "all_gather", "reduce_scatter-sum",
                                              "reduce_scatter-max"]  # fmt: skip


def _collectives_match_numpy(ranks, world, backend, dtype):
    for rank, (results, errors) in enumerate(ranks):
        assert f"{backend}|{dtype.value}|input-changed" not in errors
        for name in CALLS:
            key = f"{backend}|{dtype.value}|{name}"
            want = _expected(name, dtype, rank, world)
            if want is None:
                assert errors.get(key, "").startswith("DTypeError: "), (key, errors.get(key))
                assert dtype.value in errors[key]
                continue
            assert key not in errors, (key, errors.get(key))
            got = results[key]
            assert got.shape == want.shape, key
            np.testing.assert_array_equal(got.astype(np.float64), want, err_msg=key)


CARELESS = [
    ("shape", "ShapeError: ember.distributed.all_reduce: the ranks passed different tensors (rank 0: f32 [2, 3], rank 1: f32 [2, 4]"),
    ("dtype", "DTypeError: ember.distributed.all_reduce: the ranks passed different tensors (rank 0: f64 [2], rank 1: f32 [2]"),
    ("gather-shape", "ShapeError: ember.distributed.all_gather: the ranks passed different tensors (rank 0: f32 [1], rank 1: f32 [2]"),
    ("bad-op", "ArgumentError: ember.distributed.all_reduce: op must be one of"),
    ("bad-src", "ArgumentError: ember.distributed.broadcast: src must be a rank in"),
    ("not-tensor", "ArgumentError: ember.distributed.all_reduce: expected an ember Tensor, got ndarray"),
    ("scatter-rows", "ShapeError: ember.distributed.reduce_scatter: dim 0 must be a multiple of the world size"),
    ("bool-sum", "DTypeError: ember.distributed.all_reduce: sum of bool tensors is not defined"),
    ("int-mean", "DTypeError: ember.distributed.all_reduce: mean of i32 tensors is not defined"),
]  # fmt: skip


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_in_a_job(world, tmp_path, subtests):
    """One job per world size (each rank runs every case; starting processes is the cost)."""
    ranks = _job(world, tmp_path)
    for backend in BACKENDS:
        for dtype in DTYPES:
            with subtests.test(backend=backend, dtype=dtype.value):
                _collectives_match_numpy(ranks, world, backend, dtype)
    with subtests.test("unsupported dtypes name the engine and the dtype"):
        message = ranks[0][1]["ndarray|u32|all_reduce-sum"]
        assert message.startswith("DTypeError: ember.distributed.all_reduce: gloo cannot carry u32")
    with subtests.test("a collective before init is a typed error"):
        for _, errors in ranks:
            assert errors["before-init"].startswith(
                "NotInitializedError: ember.distributed.all_reduce")
    for case, expected in CARELESS:
        with subtests.test("careless calls raise typed errors on every rank", case=case):
            for results, errors in ranks:
                assert errors[case].startswith(expected), errors[case]
                # The job is still usable afterwards.
                np.testing.assert_array_equal(results["after-errors"], np.full(3, world, np.float32))
    with subtests.test("a result keeps its values while later collectives reuse buffers"):
        for results, _ in ranks:
            np.testing.assert_array_equal(results["kept"], np.full(4, world, np.float32))
    for backend in ("ndarray", "torch"):
        with subtests.test("a donated tensor takes the result unless something else sees it",
                           backend=backend):  # fmt: skip
            for results, _ in ranks:
                np.testing.assert_array_equal(results[f"donate-{backend}"], np.full(4, 3.0 * world))
                assert results[f"donate-{backend}-same-buffer"].all()
                assert results[f"donate-{backend}-chain-same-buffer"].all()
                np.testing.assert_array_equal(results[f"donate-{backend}-chain"],
                                              np.full(4, 3.0 * world**5))
                np.testing.assert_array_equal(results[f"donate-{backend}-view-kept"], np.full(4, 3.0))
