"""all_reduce of 1, 16 and 128 MB: ember's collective against raw ``torch.distributed``.

Run: ``.venv/bin/python benchmarks/distributed.py [--nproc 2] [--repeat 9]``

The script starts ``--nproc`` copies of itself on localhost (gloo), as ``ember launch``
would. Each size is timed, interleaved in one run, as:

* **torch in place**: ``dist.all_reduce(t)`` on a preallocated torch tensor (what a
  PyTorch user writes; it overwrites its input);
* **ember**: ``ember.distributed.all_reduce(x)`` on an NdArray tensor: one copy into a new
  buffer (ember tensors never change), the shape/dtype agreement check, the collective,
  and the result wrapped without a copy;
* **ember, check=False**: the same without the agreement check (one small message less).

Rank 0 prints medians and each ember column's ratio to torch (1.00 is parity).
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

    import ember
    import ember.distributed as dist

    dist.init()
    rows = []
    for mb in SIZES_MB:
        count = mb * (1 << 20) // 4
        raw = torch.ones(count)
        x = ember.Tensor.from_data(np.ones(count, np.float32), ember.device("ndarray"))
        calls = {
            "torch": lambda raw=raw: tdist.all_reduce(raw),
            "ember": lambda x=x: dist.all_reduce(x),
            "ember, check=False": lambda x=x: dist.all_reduce(x, check=False),
        }
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():
            call()  # warm-up
        for _ in range(repeat):
            for name, call in calls.items():
                dist.barrier()
                start = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - start)
        medians = {name: float(np.median(s)) for name, s in samples.items()}
        base = medians["torch"]
        rows.append([f"{mb} MB", f"{base * 1e3:.2f}",
                     *(f"{medians[n] * 1e3:.2f} ({medians[n] / base:.2f}x)"
                       for n in ("ember", "ember, check=False"))])  # fmt: skip
    if dist.rank() == 0:
        print_table(f"all_reduce (sum, f32), {dist.world_size()} processes on localhost (gloo)",
                    ["size", "torch in place ms", "ember ms (x torch)",
                     "ember check=False ms (x torch)"], rows)  # fmt: skip
    dist.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    if "RANK" in os.environ:
        _rank_main(args.repeat)
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(args.nproc), OMP_NUM_THREADS="1")  # fmt: skip
    procs = [subprocess.Popen([sys.executable, __file__, "--repeat", str(args.repeat)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(args.nproc)]  # fmt: skip
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
