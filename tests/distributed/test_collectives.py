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


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def job(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"collectives{world}")
    check_ok(run_job(world, "collectives", out))
    ranks = [(dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
             for r in range(world)]  # fmt: skip
    return world, ranks


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
def test_every_collective_matches_numpy(job, backend, dtype):
    world, ranks = job
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


def test_unsupported_dtypes_name_the_engine_and_dtype(job):
    _, ranks = job
    _, errors = ranks[0]
    message = errors["ndarray|u32|all_reduce-sum"]
    assert message.startswith("DTypeError: ember.distributed.all_reduce: gloo cannot carry u32")


def test_collective_before_init_is_a_typed_error(job):
    for _, errors in job[1]:
        assert errors["before-init"].startswith("NotInitializedError: ember.distributed.all_reduce")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("shape", "ShapeError: ember.distributed.all_reduce: the ranks passed different tensors (rank 0: f32 [2, 3], rank 1: f32 [2, 4]"),
        ("dtype", "DTypeError: ember.distributed.all_reduce: the ranks passed different tensors (rank 0: f64 [2], rank 1: f32 [2]"),
        ("gather-shape", "ShapeError: ember.distributed.all_gather: the ranks passed different tensors (rank 0: f32 [1], rank 1: f32 [2]"),
        ("bad-op", "ArgumentError: ember.distributed.all_reduce: op must be one of"),
        ("bad-src", "ArgumentError: ember.distributed.broadcast: src must be a rank in"),
        ("not-tensor", "ArgumentError: ember.distributed.all_reduce: expected an ember Tensor, got ndarray"),
        ("scatter-rows", "ShapeError: ember.distributed.reduce_scatter: dim 0 must be a multiple of the world size"),
        ("bool-sum", "DTypeError: ember.distributed.all_reduce: sum of bool tensors is not defined"),
        ("int-mean", "DTypeError: ember.distributed.all_reduce: mean of i32 tensors is not defined"),
    ],
)  # fmt: skip
def test_careless_calls_raise_typed_errors_on_every_rank(job, case, expected):
    world, ranks = job
    for results, errors in ranks:
        assert errors[case].startswith(expected), errors[case]
        # The job is still usable afterwards.
        np.testing.assert_array_equal(results["after-errors"], np.full(3, world, np.float32))


def test_a_result_keeps_its_values_while_later_collectives_reuse_buffers(job):
    world, ranks = job
    for results, _ in ranks:
        np.testing.assert_array_equal(results["kept"], np.full(4, world, np.float32))


@pytest.mark.parametrize("backend", ["ndarray", "torch"])
def test_a_donated_tensor_takes_the_result_unless_something_else_sees_it(job, backend):
    world, ranks = job
    for results, _ in ranks:
        np.testing.assert_array_equal(results[f"donate-{backend}"], np.full(4, 3.0 * world))
        assert results[f"donate-{backend}-same-buffer"].all()
        np.testing.assert_array_equal(results[f"donate-{backend}-view-kept"], np.full(4, 3.0))
