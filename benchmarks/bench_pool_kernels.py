"""Times 2-d pooling forward: NdArray's NumPy kernels, fusion's numba kernels and PyTorch CPU.

Usage: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/bench_pool_kernels.py
[--threads 1] [--repeat 30] [--rounds 3]``

One process; the three libraries take turns ``--rounds`` times so that load from elsewhere
on a shared machine hits them alike, and each line prints the median over rounds of each
round's median milliseconds (float32), and numba's time over NdArray's and over torch's
(below 1: numba is faster). Max pooling is timed with indices (``return_indices=True``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).parent))
from timing import median_of_runs

# (name, op, input shape, kernel, stride, padding)
CASES = [
    ("guide max 2x2", "max", (64, 16, 24, 24), (2, 2), (2, 2), (0, 0)),
    ("resnet max 3x3 s2 p1", "max", (8, 64, 32, 32), (3, 3), (2, 2), (1, 1)),
    ("avg 2x2", "avg", (64, 16, 24, 24), (2, 2), (2, 2), (0, 0)),
    ("avg 3x3 s1 p1", "avg", (8, 64, 32, 32), (3, 3), (1, 1), (1, 1)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import torch
    import torch.nn.functional as F

    from ember.backend.options import PoolOptions
    from ember.backends.fusion import numba_pool
    from ember.backends.ndarray import pool as ndarray_pool

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"--- {args.threads} thread(s), float32, ms: median of {args.rounds} rounds' medians")
    print(
        f"{'case':24s} {'ndarray':>9s} {'numba':>9s} {'torch':>9s} {'nb/nd':>6s} {'nb/torch':>8s}"
    )
    for name, op, shape, k, s, p in CASES:
        x = rng.standard_normal(shape, dtype=np.float32)
        xt = torch.from_numpy(x)
        options = PoolOptions(k, s, p, (1, 1))
        if op == "max":
            fns = [
                lambda: ndarray_pool.max_pool2d_with_indices(x, options),  # noqa: B023
                lambda: numba_pool.max_pool2d_with_indices(x, options, args.threads),  # noqa: B023
                lambda: F.max_pool2d(xt, k, s, p, return_indices=True),  # noqa: B023
            ]
        else:
            fns = [
                lambda: ndarray_pool.avg_pool2d(x, options),  # noqa: B023
                lambda: numba_pool.avg_pool2d(x, options, args.threads),  # noqa: B023
                lambda: F.avg_pool2d(xt, k, s, p),  # noqa: B023
            ]
        rounds = [[median_of_runs(fn, args.repeat, warm_up=True) * 1e3 for fn in fns] for _ in range(args.rounds)]
        nd, nb, tc = (statistics.median(r[i] for r in rounds) for i in range(3))
        print(f"{name:24s} {nd:9.3f} {nb:9.3f} {tc:9.3f} {nb / nd:6.2f} {nb / tc:8.2f}")


if __name__ == "__main__":
    main()
