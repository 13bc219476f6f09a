"""Times the fusion backend's int8 VNNI kernels (``numba_int8``) against float32 GEMMs and
torch's int8 product.

Usage: ``python benchmarks/bench_int8_kernels.py [--threads 1,2] [--repeat 30]``

Per shape and thread count: ``linear_int8`` (the int32 sums, scaled per row and column,
plus a bias: a quantized linear layer's output), ``matmul_int8`` (the raw int32 sums),
``numba_gemm.matmul`` on float32, ``torch._int_mm`` (int8 x int8 -> int32, no epilogue) and
torch's float32 matmul. The weights are packed once beforehand (a model packs them when it
loads); the float32 GEMM packs its right operand on each call, as it does in use. Each line
prints milliseconds from the median of single calls taken in turns, in a new order each
turn (a burst of load from elsewhere, or a cache emptied by the side before, hits all
alike), on the calling thread's CPU time (``thread_time``, meaningful at
one thread only) and on wall time, and the speed-ups of ``linear_int8`` on wall time.
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
    ("batch 1 linear", 1, 4096, 4096),
    ("batch 64 linear", 64, 4096, 4096),
    ("encoder feed-forward", 1024, 256, 1024),
]


SIDES = ["int8 linear", "int8 raw", "f32 numba", "torch _int_mm", "torch f32"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, comma separated")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    pin_threads(max(counts))

    import torch

    from ember.backends.fusion import numba_int8

    if not numba_int8.has_vnni():
        sys.exit("numba_int8 needs numba and a CPU with AVX-512 VNNI")
    for threads in counts:
        torch.set_num_threads(threads)
        rows = [_time_shape(*shape, threads, args.repeat) for shape in SHAPES]
        print_table(
            f"int8 kernels, {threads} thread(s), ms on thread time / wall time; speed-ups of "
            "int8 linear on wall time",
            ["case", "shape", *SIDES, "vs f32 numba", "vs _int_mm", "vs torch f32"],
            rows,
        )


def _time_shape(name: str, m: int, k: int, n: int, threads: int, repeat: int) -> list[str]:
    """One table row: every side on ``[m, k] @ [k, n]``, checked against exact sums first."""
    import numpy as np
    import torch

    from ember.backends.fusion import numba_gemm, numba_int8

    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = numba_int8.pack_weight(b)
    a_scale = rng.uniform(0.01, 0.1, m).astype(np.float32)
    b_scales = rng.uniform(0.01, 0.1, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    af, bf = a.astype(np.float32), b.astype(np.float32)
    at, bt, aft, bft = (torch.from_numpy(x) for x in (a, b, af, bf))
    sides = dict(zip(SIDES, [
        lambda: numba_int8.linear_int8(a, a_scale, 3, packed, b_scales, bias, threads=threads),
        lambda: numba_int8.matmul_int8(a, packed, threads=threads),
        lambda: numba_gemm.matmul(af, bf, threads=threads),
        lambda: torch._int_mm(at, bt),
        lambda: torch.matmul(aft, bft),
    ]))  # fmt: skip
    exact = a.astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(sides["int8 raw"](), exact)
    np.testing.assert_array_equal(sides["torch _int_mm"]().numpy(), exact)
    cpu = {side: [] for side in sides}
    wall = {side: [] for side in sides}
    for _ in range(repeat):
        # A new order each turn: the side after torch's float32 product (64 MB of weights
        # through the caches) would otherwise always start from a cold cache.
        for side in rng.permutation(SIDES):
            fn = sides[side]
            began, began_cpu = time.perf_counter(), time.thread_time()
            fn()
            wall[side].append(time.perf_counter() - began)
            cpu[side].append(time.thread_time() - began_cpu)
    ms = {s: (statistics.median(cpu[s]) * 1e3, statistics.median(wall[s]) * 1e3) for s in sides}
    mine = ms["int8 linear"][1]
    return [name, f"{m}x{k} @ {k}x{n}", *(f"{ms[s][0]:.3f} / {ms[s][1]:.3f}" for s in sides),
            *(f"{ms[s][1] / mine:.2f}" for s in ("f32 numba", "torch _int_mm", "torch f32"))]  # fmt: skip


if __name__ == "__main__":
    main()
