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
        return make_device(name.removeprefix("autodiff-")).autodiff()
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
    # Pooled buffers: a result keeps its values while later collectives of its size run.
    big = Tensor.ones([1 << 16], device)
    kept = dist.all_reduce(big)
    for _ in range(3):
        dist.all_reduce(big * 5.0)
    results["kept"] = kept.to_numpy()[:4]
    # Donation: a fresh tensor's buffer takes the result; one another tensor sees is copied.
    for name in ("ndarray", "torch"):
        on = ember.device(name)
        fresh = Tensor.ones([1 << 16], on) * 3.0
        before = fresh.to_numpy().__array_interface__["data"][0]
        reduced = dist.all_reduce(fresh, donate=True)
        results[f"donate-{name}"] = reduced.to_numpy()[:4].copy()  # a view would hold it
        results[f"donate-{name}-same-buffer"] = np.array(
            [reduced.to_numpy().__array_interface__["data"][0] == before])
        # A chain of donations (each result donated to the next call) stays in one buffer,
        # although the engine holds the previous call's tensor until the next collective.
        chained = [reduced]
        del reduced, fresh  # fresh too: the donated tensor shares the result's buffer
        for _ in range(4):
            chained.append(dist.all_reduce(chained.pop(), donate=True))
        results[f"donate-{name}-chain-same-buffer"] = np.array(
            [chained[0].to_numpy().__array_interface__["data"][0] == before])
        results[f"donate-{name}-chain"] = chained[0].to_numpy()[:4]
        shared = Tensor.ones([1 << 16], on) * 3.0
        view = shared.reshape([256, 256])  # refers to shared's buffer
        dist.all_reduce(shared, donate=True)
        results[f"donate-{name}-view-kept"] = view.to_numpy()[0, :4]
    dist.barrier()
    dist.shutdown()
    np.savez(out / f"rank{rank}.npz", **results)
    (out / f"rank{rank}.json").write_text(json.dumps(errors))


def train_steps(backend: str, rank: int, world: int, steps: int = 4, bucket_mb: float = 25.0,
                unused: bool = False):
    """A 3-layer MLP trained with Adam and gradient clipping on rank ``rank``'s share of
    64 rows; returns the final weights ({path: array}) and the sync's stats."""
    import ember
    import ember.distributed as dist
    from ember import Tensor
    from ember.module import Module
    from ember.nn.linear import Linear, LinearConfig
    from ember.optim.adam import AdamConfig
    from ember.optim.clipping import GradientClippingConfig
    from ember.tensor.activation import relu

    class MLP(Module):
        a: Linear
        b: Linear
        c: Linear
        spare: Linear  # never used when ``unused``: its gradient is zeros on every rank

        def forward(self, x):
            h = relu(self.b(relu(self.a(x))))
            return self.c(h) if unused else self.c(h) + self.spare(h) * 0.5

    device = make_device(backend)
    ember.seed(device, 7 + rank)  # ranks differ until broadcast_module
    model = MLP(LinearConfig(8, 16).init(device), LinearConfig(16, 16).init(device),
                LinearConfig(16, 4).init(device), LinearConfig(16, 4).init(device))  # fmt: skip
    sync = dist.GradientSync(bucket_mb=bucket_mb)
    if world == 1:
        ember.seed(device, 7)
        model = MLP(LinearConfig(8, 16).init(device), LinearConfig(16, 16).init(device),
                    LinearConfig(16, 4).init(device), LinearConfig(16, 4).init(device))  # fmt: skip
    model = sync.broadcast_module(model)
    rng = np.random.default_rng(1)
    x_all = rng.standard_normal((64, 8)).astype(np.float32)
    y_all = rng.standard_normal((64, 4)).astype(np.float32)
    share = slice(rank * 64 // world, (rank + 1) * 64 // world)
    x = Tensor.from_data(x_all[share], device)
    y = Tensor.from_data(y_all[share], device)
    optim = AdamConfig(gradient_clipping=GradientClippingConfig.Norm(0.05)).init()
    for _ in range(steps):
        loss = ((model(x) - y) ** 2).mean()
        with sync.syncing(model):
            grads = loss.backward()
        model = optim.step(0.01, model, grads)
    weights = {path: p.val().to_numpy() for path, p in model.params()}
    return weights, sync.stats


def train(out: Path, rank: int, world: int, backend: str, bucket_mb: str = "25",
          unused: str = "0") -> None:
    import ember.distributed as dist

    dist.init()
    weights, stats = train_steps(backend, rank, world, bucket_mb=float(bucket_mb),
                                 unused=unused == "1")  # fmt: skip
    dist.shutdown()
    np.savez(out / f"rank{rank}.npz", **weights)
    summary = {"events": stats.events, "steps": stats.steps, "buckets": stats.buckets,
               "bytes": stats.bytes}  # fmt: skip
    (out / f"rank{rank}.json").write_text(json.dumps(summary))


def mismatch(out: Path, rank: int, world: int) -> None:
    """Rank 1 trains another model than rank 0: every rank gets a typed error."""
    import ember
    import ember.distributed as dist
    from ember import Tensor
    from ember.nn.linear import LinearConfig

    dist.init()
    device = ember.device("ndarray").autodiff()
    model = LinearConfig(4, 3 if rank == 0 else 5).init(device)
    sync = dist.GradientSync()
    try:
        with sync.syncing(model):
            model(Tensor.ones([2, 4], device)).sum().backward()
        error = "no error"
    except Exception as e:
        error = _error(e)
    dist.shutdown()
    (out / f"rank{rank}.json").write_text(json.dumps({"error": error}))


def learner(out: Path, rank: int, world: int, artifact: str, epochs: str, resume: str = "0",
            kill: str = "0") -> None:
    """The Learner on a small classification task, data-parallel over the job's ranks.

    ``resume``: the epoch to resume from (0: none). ``kill``: rank 1 kills itself (SIGKILL)
    at iteration 3 of this epoch (0: never)."""
    import os
    import signal

    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    from learner_support import CallbackRenderer, classifier, loaders, weights

    import ember.distributed as dist
    from ember.optim.adam import AdamConfig
    from ember.train.learner.builder import LearnerBuilder
    from ember.train.metric.accuracy import AccuracyMetric
    from ember.train.metric.base import Metric, MetricEntry
    from ember.train.metric.loss import LossMetric
    from ember.train.tracker import ExperimentTracker

    class CountingTracker(ExperimentTracker):
        """Counts the calls the learner makes (only rank 0's tracker may get any)."""

        def __init__(self) -> None:
            self.calls = {"start": 0, "log_step": 0, "log_epoch": 0, "finish": 0}

        def start(self, run) -> None:
            self.calls["start"] += 1

        def log_step(self, split, values, step) -> None:
            self.calls["log_step"] += 1

        def log_epoch(self, split, values, epoch) -> None:
            self.calls["log_epoch"] += 1

        def finish(self, model, status) -> None:
            self.calls["finish"] += 1

    class KillRank1(Metric):
        name = "Kill"
        input_type = None

        def update(self, item, metadata) -> MetricEntry:
            if rank == 1 and metadata.epoch == int(kill) and metadata.iteration == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return MetricEntry(self.name, "", "")

        def clear(self) -> None:
            pass

    if world > 1:
        dist.init()
    renderer, tracker = CallbackRenderer(), CountingTracker()
    builder = (LearnerBuilder(Path(artifact)).num_epochs(int(epochs)).renderer(renderer)
               .tracker(tracker)
               .metric_train_numeric(LossMetric()).metric_valid_numeric(LossMetric())
               .metric_train_numeric(AccuracyMetric()).metric_valid_numeric(AccuracyMetric())
               .metric_train(KillRank1()).with_file_checkpointer(keep_last=None))  # fmt: skip
    if resume != "0":
        builder = builder.checkpoint(int(resume))
    train, valid = loaders(train_size=48, valid_size=16, batch_size=4)
    learner = builder.build(classifier(seed=3 + rank), AdamConfig().init(), 0.05)
    model = learner.fit(train, valid)
    if world > 1:
        dist.shutdown()
    np.savez(out / f"rank{rank}.npz", **weights(model))
    history = {f"{split}|{name}": {str(e): v for e, v in learner.history.values(split, name).items()}
               for split in ("train", "valid") for name in ("Loss", "Accuracy")}  # fmt: skip
    (out / f"rank{rank}.json").write_text(json.dumps(
        {"history": history, "train_updates": sum(1 for u in renderer.updates if u[0] == "train"),
         "tracker_calls": tracker.calls}))


def cuda_collectives(out: Path, rank: int, world: int) -> None:
    """NCCL on one GPU per rank: collectives on CUDA tensors; CPU tensors refused."""
    import ember
    import ember.distributed as dist
    from ember import Tensor

    dist.init(engine="nccl")
    device = ember.device("torch", f"cuda:{rank}")
    x = Tensor.from_data(value(rank, "f32"), device)
    results = {
        "all_reduce": dist.all_reduce(x).to_numpy(),
        "broadcast": dist.broadcast(x, src=0).to_numpy(),
        "all_gather": np.stack([t.to_numpy() for t in dist.all_gather(x)]),
        "device": np.array([dist.all_reduce(x).device == device]),
    }
    try:
        dist.all_reduce(Tensor.from_data(value(rank, "f32"), ember.device("ndarray")))
        error = "no error"
    except Exception as e:
        error = _error(e)
    dist.shutdown()
    np.savez(out / f"rank{rank}.npz", **results)
    (out / f"rank{rank}.json").write_text(json.dumps({"cpu": error}))


def raising(out: Path, rank: int, world: int) -> None:
    """Rank 1 raises while rank 0 waits in a collective: rank 0's error names rank 1."""
    import ember
    import ember.distributed as dist

    dist.init()
    if rank == 1:
        raise ValueError("boom from rank 1")
    try:
        dist.all_reduce(ember.Tensor.from_data([1.0]))
        error = "no error"
    except Exception as e:
        error = _error(e)
    (out / f"rank{rank}.json").write_text(json.dumps({"error": error}))


def main() -> None:
    import os

    job, out = sys.argv[1], Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    globals()[job](out, rank, world, *sys.argv[3:])


if __name__ == "__main__":
    main()
