"""Times the fusion backend's numba GEMM (``numba_gemm.matmul``) against NumPy and torch.

Usage: ``python benchmarks/bench_matmul_kernels.py [--threads 1] [--repeat 30] [--dtype
float32] [--transposed]``

The shapes are those of the ONNX encoder benchmark (``onnx_inference.py``: d_model 256, 4
heads, feed-forward 1024, 8 x 128 tokens) and a square 1024 product. ``--transposed``
stores each 2-d right operand as ``[N, K]`` and multiplies by its transpose (a Linear
weight kept the other way round). Thread counts are fixed when the libraries load, so one
process times one count. Each line prints GFLOP/s from the median of each library's
single calls, taking turns call by call (so a burst of load from elsewhere on a shared
machine hits all alike), on the calling thread's CPU time (``thread_time``, insensitive
to other processes; meaningful at one thread only) and on wall time, and the speed-up of
numba over NumPy and torch on wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import pin_threads, print_table

SHAPES = [
    ("qkv projection", (1024, 256), (256, 768)),
    ("out projection", (1024, 256), (256, 256)),
    ("feed-forward 1", (1024, 256), (256, 1024)),
    ("feed-forward 2", (1024, 1024), (1024, 256)),
    ("scores q @ k^T", (32, 128, 64), (32, 64, 128)),
    ("probs @ v", (32, 128, 128), (32, 128, 64)),
    ("square 1024", (1024, 1024), (1024, 1024)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--transposed", action="store_true")
    args = parser.parse_args()
    pin_threads(args.threads)

    import numpy as np
    import torch

    from ember.backends.fusion import numba_gemm

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows = []
    for name, sa, sb in SHAPES:
        a = rng.standard_normal(sa).astype(args.dtype)
        b = rng.standard_normal(sb).astype(args.dtype)
        if args.transposed and b.ndim == 2:
            b = np.ascontiguousarray(b.T).T
        at, bt = torch.from_numpy(a), torch.from_numpy(b)
        sides = {
            "numba": lambda a=a, b=b: numba_gemm.matmul(a, b, threads=args.threads),
            "numpy": lambda a=a, b=b: np.matmul(a, b),
            "torch": lambda at=at, bt=bt: torch.matmul(at, bt),
        }
        np.testing.assert_allclose(sides["numba"](), sides["numpy"](), rtol=1e-3, atol=1e-3)
        cpu = {side: [] for side in sides}
        wall = {side: [] for side in sides}
        for _ in range(args.repeat):
            for side, fn in sides.items():
                began, began_cpu = time.perf_counter(), time.thread_time()
                fn()
                wall[side].append(time.perf_counter() - began)
                cpu[side].append(time.thread_time() - began_cpu)
        flops = 2 * int(np.prod(sa)) * sb[-1]
        rate = {s: (flops / statistics.median(cpu[s]) / 1e9, flops / statistics.median(wall[s])
                    / 1e9) for s in sides}  # fmt: skip
        shape = f"{'x'.join(map(str, sa))} @ {'x'.join(map(str, sb))}"
        rows.append([name, shape, *(f"{rate[s][0]:.0f} / {rate[s][1]:.0f}" for s in sides),
                     f"{rate['numba'][1] / rate['numpy'][1]:.2f}",
                     f"{rate['numba'][1] / rate['torch'][1]:.2f}"])  # fmt: skip
    title = (f"matmul {args.dtype}{' (B transposed)' if args.transposed else ''}, "
             f"{args.threads} thread(s), GFLOP/s on thread time / wall time")  # fmt: skip
    print_table(title, ["case", "shape", "numba", "numpy", "torch", "nb/np", "nb/torch"], rows)


if __name__ == "__main__":
    main()
