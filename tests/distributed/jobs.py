"""What each rank of a test job runs (started by ``harness.run_job``).

``python jobs.py <job> <out_dir> [args]``: joins the job from the standard variables, runs
the named function and writes its results to ``out_dir/rank<r>.npz`` / ``.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

BACKENDS = ("ndarray", "torch", "autodiff-ndarray", "autodiff-torch", "fusion-ndarray")
OPS = ("sum", "mean", "max", "min", "product")


def make_device(name: str):
    import ember

    if name.startswith("autodiff-"):
        return ember.device(name.removeprefix("autodiff-")).autodiff()
    if name.startswith("fusion-"):
        return ember.device(name.removeprefix("fusion-")).fusion()
    return ember.device(name)


def value(rank: int, dtype: str, rows: int = 2) -> np.ndarray:
    """Rank ``rank``'s input: ones and twos (so products and sums fit every dtype)."""
    from ember.tensor.data import numpy_dtype
    from ember.tensor.dtype import DType

    pattern = (np.arange(rows * 3).reshape(rows, 3) + rank) % 2
    if dtype == "bool":
        return pattern == 0
    return (1 + pattern).astype(numpy_dtype(DType(dtype)))


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def collectives(out: Path, rank: int, world: int) -> None:
    import ember
    import ember.distributed as dist
    from ember import DType, Tensor

    results: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    try:  # before init: a typed error, not a torch one
        dist.all_reduce(Tensor.from_data([1.0]))
    except Exception as e:
        errors["before-init"] = _error(e)
    dist.init()
    for backend in BACKENDS:
        device = make_device(backend)
        for dtype in DType:
            if dtype.is_low_precision:
                continue
            x = Tensor.from_data(value(rank, dtype.value), device, dtype)
            stacked = Tensor.from_data(value(rank, dtype.value, rows=2 * world), device, dtype)
            calls = {f"all_reduce-{op}": (lambda x=x, op=op: dist.all_reduce(x, op)) for op in OPS}
            calls["broadcast"] = lambda x=x: dist.broadcast(x, src=world - 1)
            calls["all_gather"] = lambda x=x: Tensor.stack(dist.all_gather(x), 0)
            calls["reduce_scatter-sum"] = lambda s=stacked: dist.reduce_scatter(s, "sum")
            calls["reduce_scatter-max"] = lambda s=stacked: dist.reduce_scatter(s, "max")
            for name, call in calls.items():
                key = f"{backend}|{dtype.value}|{name}"
                try:
                    got = call()
                except Exception as e:
                    errors[key] = _error(e)
                    continue
                if got.device != device or got.dtype is not dtype:
                    errors[key] = f"WRONG: {got.device} {got.dtype} for {device} {dtype}"
                data = got.to_numpy()
                results[key] = data.astype(np.float64) if dtype is DType.BF16 else data
            # The input is left as it was.
            if not np.array_equal(x.to_numpy(), value(rank, dtype.value)):
                errors[f"{backend}|{dtype.value}|input-changed"] = "input changed"
    # Careless callers: every rank gets the same typed error, and the job goes on.
    device = ember.device("ndarray")
    mismatch = {
        "shape": lambda: dist.all_reduce(Tensor.zeros([2, 3 + rank], device)),
        "dtype": lambda: dist.all_reduce(Tensor.zeros([2], device, "f32" if rank else "f64")),
        "gather-shape": lambda: dist.all_gather(Tensor.zeros([1 + rank], device)),
        "bad-op": lambda: dist.all_reduce(Tensor.zeros([2], device), "average"),
        "bad-src": lambda: dist.broadcast(Tensor.zeros([2], device), src=world),
        "not-tensor": lambda: dist.all_reduce(np.zeros(2)),
        "scatter-rows": lambda: dist.reduce_scatter(Tensor.zeros([world + 1], device)),
        "bool-sum": lambda: dist.all_reduce(Tensor.zeros([2], device, "bool")),
        "int-mean": lambda: dist.all_reduce(Tensor.zeros([2], device, "i32"), "mean"),
    }
    for name, call in mismatch.items():
        try:
            call()
            errors[name] = "no error"
        except Exception as e:
            errors[name] = _error(e)
    after = dist.all_reduce(Tensor.ones([3], device))
    results["after-errors"] = after.to_numpy()
    dist.barrier()
    dist.shutdown()
    np.savez(out / f"rank{rank}.npz", **results)
    (out / f"rank{rank}.json").write_text(json.dumps(errors))


def main() -> None:
    import os

    job, out = sys.argv[1], Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    globals()[job](out, rank, world, *sys.argv[3:])


if __name__ == "__main__":
    main()
