"""Data parallelism on this machine: all_reduce against raw ``torch.distributed``, and the
guide's training throughput in one and several processes.

Run: ``.venv/bin/python benchmarks/distributed.py [--nproc 2] [--repeat 9] [--steps 30]``

The script starts copies of itself on localhost (gloo), as ``ember launch`` would.

**all_reduce** of 1, 16 and 128 MB (``--nproc`` processes), each size timed, interleaved
in one run. An ember tensor never changes, so ``all_reduce(x)`` returns a new tensor, and
by default it first checks that the ranks passed the same shape and dtype (one small
message; a mismatch otherwise makes gloo abort the process). torch offers each of these
semantics separately, so each ember mode is compared with the torch call that does the same
work:

=============================  ==============================================================
ember                          torch doing the same work
=============================  ==============================================================
``all_reduce(x, donate=True,   ``dist.all_reduce(t)``: in place, unchecked
check=False)``
``all_reduce(x, check=False)`` ``funcol.all_reduce(t)`` (``torch.distributed.
                               _functional_collectives``): a new result, unchecked
``all_reduce(x)`` (default)    ``funcol.all_reduce`` on a group made under
                               ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch's own check): a new
                               result, checked
=============================  ==============================================================

Every ember mode is also shown against torch in place. Small sizes repeat the call in each
sample (about 64 MB a sample) so a sample is not one scheduler wake-up. Rank 0 prints
medians.

**Guide training throughput**: the guide's CNN (``autodiff(ndarray)``, Adam, batches of 64
random 28x28 images per process), timed over ``--steps`` steps after warm-up, in 1 process
x 1 thread, 1 process x 2 threads and ``--nproc`` processes x 1 thread (gradients averaged
by ``GradientSync`` during the backward pass): images per second, and the time each step's
backward pass waited for communication at its end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import print_table

SIZES_MB = (1, 16, 128)


def _rank_main(repeat: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as tdist
    import torch.distributed._functional_collectives as funcol

    import ember
    import ember.distributed as dist

    dist.init()
    plain = tdist.group.WORLD
    tdist.set_debug_level(tdist.DebugLevel.DETAIL)  # groups made now check each collective
    checked = tdist.new_group(backend="gloo")
    tdist.set_debug_level(tdist.DebugLevel.OFF)
    pairs = {  # ember mode: the torch call doing the same work
        "ember, donate, check=False": "torch in place",
        "ember, check=False": "torch functional",
        "ember": "torch functional, checked",
    }
    unpaired = [e for e, t in pairs.items() if t != "torch in place"]
    rows, ratios = [], []
    for mb in SIZES_MB:
        count = mb * (1 << 20) // 4
        raw = torch.ones(count)
        x = ember.Tensor.from_data(np.ones(count, np.float32), ember.device("ndarray"))
        donor = [ember.Tensor.from_data(np.ones(count, np.float32), ember.device("ndarray")) * 1.0]

        def donating(donor=donor) -> None:
            # Each result takes the donated buffer and is donated to the next call, as a
            # loop hands on what it computed.
            donor.append(dist.all_reduce(donor.pop(), check=False, donate=True))

        calls = {
            "torch in place": lambda raw=raw: tdist.all_reduce(raw),
            "torch functional": lambda raw=raw: funcol.wait_tensor(
                funcol.all_reduce(raw, "sum", plain)),
            "torch functional, checked": lambda raw=raw: funcol.wait_tensor(
                funcol.all_reduce(raw, "sum", checked)),
            "ember": lambda x=x: dist.all_reduce(x),
            "ember, check=False": lambda x=x: dist.all_reduce(x, check=False),
            "ember, donate, check=False": donating,
        }
        per_sample = max(1, 64 // mb)
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():
            call()  # warm-up
        names = list(calls)
        for round_ in range(repeat):
            # Each round starts with another side: no side always runs first (or last).
            for name in names[round_ % len(names):] + names[: round_ % len(names)]:
                call = calls[name]
                dist.barrier()
                start = time.perf_counter()
                for _ in range(per_sample):
                    call()
                samples[name].append((time.perf_counter() - start) / per_sample)
        ms = {name: float(np.median(s)) * 1e3 for name, s in samples.items()}
        rows.append([f"{mb} MB", *(f"{ms[n]:.2f}" for n in names)])
        ratios.append([f"{mb} MB", *(f"{ms[e] / ms[t]:.2f}x" for e, t in pairs.items()),
                       *(f"{ms[e] / ms['torch in place']:.2f}x" for e in unpaired)])  # fmt: skip
    if dist.rank() == 0:
        where = f"{dist.world_size()} processes on localhost (gloo)"
        print_table(f"all_reduce (sum, f32), {where}: ms per call",
                    ["size", *names], rows)  # fmt: skip
        print_table("ember over torch: the same work, and torch in place",
                    ["size", *(f"{e} / {t}" for e, t in pairs.items()),
                     *(f"{e} / torch in place" for e in unpaired)], ratios)  # fmt: skip
    dist.shutdown()


def _guide_rank(steps: int, out: str) -> None:
    import json

    import numpy as np

    import ember
    import ember.distributed as dist
    from ember.guide.data import MnistBatch
    from ember.guide.training import default_config

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init()
    config = default_config()
    device = ember.device("ndarray").autodiff()
    ember.seed(device, 0)
    model = config.model.init(device)
    optimizer = config.optimizer.init()
    sync = dist.GradientSync()
    model = sync.broadcast_module(model)
    rng = np.random.default_rng(dist.rank())
    images = ember.Tensor.from_data(rng.random((64, 28, 28), np.float32), device)
    targets = ember.Tensor.from_data(rng.integers(0, 10, 64), device)
    batch = MnistBatch(images, targets)
    times = []
    for step in range(steps + 5):
        start = time.perf_counter()
        with sync.syncing(model):
            output = model.train_step(batch)
        model = optimizer.step(1e-4, model, output.grads)
        if step >= 5:  # warm-up: caches, pools
            times.append(time.perf_counter() - start)
        if step == 4:
            sync.stats.wait_seconds, sync.stats.steps = 0.0, 0
    waited = sync.stats.wait_seconds / max(sync.stats.steps, 1)
    if dist.rank() == 0:
        with open(out, "w") as f:
            json.dump({"step": float(np.median(times)), "wait": waited,
                       "world": dist.world_size()}, f)  # fmt: skip
    dist.shutdown()


def _spawn(nproc: int, threads: int, argv: list[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc),
               OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))  # fmt: skip
    procs = [subprocess.Popen([sys.executable, __file__, *argv],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(nproc)]  # fmt: skip
    if max(p.wait() for p in procs):
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--guide-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "RANK" in os.environ:
        if args.guide_out:
            _guide_rank(args.steps, args.guide_out)
        else:
            _rank_main(args.repeat)
        return
    _spawn(args.nproc, 1, ["--repeat", str(args.repeat)])

    import json
    import tempfile

    rows, base = [], None
    for nproc, threads in ((1, 1), (1, 2), (args.nproc, 1)):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            _spawn(nproc, threads, ["--steps", str(args.steps), "--guide-out", out.name])
            result = json.loads(Path(out.name).read_text())
        rate = 64 * nproc / result["step"]
        base = base or rate
        rows.append([f"{nproc} x {threads}", f"{result['step'] * 1e3:.1f}", f"{rate:.0f}",
                     f"{rate / base:.2f}x", f"{result['wait'] * 1e3:.2f}" if nproc > 1 else "-"])  # fmt: skip
    print_table("guide CNN training, autodiff(ndarray), batch 64 per process",
                ["processes x threads", "ms / step", "images / s", "x 1 x 1",
                 "backward waited ms / step"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
