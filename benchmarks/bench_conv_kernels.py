"""Times the NdArray backend's conv kernels against PyTorch CPU on the guide shapes.

Usage: ``python benchmarks/bench_conv_kernels.py [--threads 1 2] [--repeat 50]``

Thread counts are fixed per process (OpenBLAS reads ``OPENBLAS_NUM_THREADS``
when NumPy loads), so the script re-runs itself once per thread count with
the thread variables set, and torch gets ``torch.set_num_threads`` to match.
Each line prints the median (and minimum) milliseconds of ember's kernel and
of torch, and their ratio (ember / torch; below 2 meets the design target).
Each library is timed in its own process (see ``_child``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# (name, input shape, weight shape, stride, padding, dilation, groups)
CASES = [
    ("conv2d mnist-1", (64, 1, 28, 28), (8, 1, 3, 3), (1, 1), (0, 0), (1, 1), 1),
    ("conv2d mnist-2", (64, 8, 26, 26), (16, 8, 3, 3), (1, 1), (0, 0), (1, 1), 1),
    ("conv2d pad=1", (64, 16, 24, 24), (32, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("conv2d stride=2", (32, 32, 32, 32), (64, 32, 3, 3), (2, 2), (1, 1), (1, 1), 1),
    ("conv2d depthwise", (32, 32, 32, 32), (32, 1, 3, 3), (1, 1), (1, 1), (1, 1), 32),
]
TRANSPOSE_CASES = [
    ("conv_transpose2d s=1", (64, 16, 24, 24), (16, 8, 3, 3), (1, 1), (0, 0), (0, 0), (1, 1), 1),
    ("conv_transpose2d s=2", (32, 32, 16, 16), (32, 16, 4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 1),
]


def _load_conv():
    """The conv module, imported by file path so the benchmark runs while the package is partial."""
    try:
        sys.path.insert(0, str(SRC))
        from ember.backends.ndarray import conv

        return conv
    except ImportError:
        path = SRC / "ember" / "backends" / "ndarray" / "conv.py"
        spec = importlib.util.spec_from_file_location("_ember_ndarray_conv", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


def _median_ms(fn, repeat: int) -> tuple[float, float]:
    """Median and minimum milliseconds of ``fn`` over ``repeat`` runs after a warm-up.

    The minimum is printed too because on a shared machine the median of the
    multi-threaded runs swings with whatever else is running.
    """
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, min(times) * 1e3


def _time_ember(repeat: int) -> list[tuple[float, float]]:
    import numpy as np

    conv = _load_conv()
    rng = np.random.default_rng(0)
    times = []
    for _, xs, ws, s, p, d, g in CASES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        b = rng.standard_normal(ws[0], dtype=np.float32)
        times.append(_median_ms(lambda: conv.conv_nd(x, w, b, s, p, d, g), repeat))  # noqa: B023
    for _, xs, ws, s, p, po, d, g in TRANSPOSE_CASES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        b = rng.standard_normal(ws[1] * g, dtype=np.float32)
        times.append(
            _median_ms(lambda: conv.conv_transpose_nd(x, w, b, s, p, po, d, g), repeat)  # noqa: B023
        )
    return times


def _time_torch(threads: int, repeat: int) -> list[tuple[float, float]]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    times = []
    with torch.no_grad():
        for _, xs, ws, s, p, d, g in CASES:
            x, w = torch.randn(xs, generator=gen), torch.randn(ws, generator=gen)
            b = torch.randn(ws[0], generator=gen)
            times.append(_median_ms(lambda: F.conv2d(x, w, b, s, p, d, g), repeat))  # noqa: B023
        for _, xs, ws, s, p, po, d, g in TRANSPOSE_CASES:
            x, w = torch.randn(xs, generator=gen), torch.randn(ws, generator=gen)
            b = torch.randn(ws[1] * g, generator=gen)
            times.append(
                _median_ms(lambda: F.conv_transpose2d(x, w, b, s, p, po, g, d), repeat)  # noqa: B023
            )
    return times


def _child(which: str, threads: int, repeat: int) -> list[tuple[float, float]]:
    """Times one library in a fresh process: idle OpenBLAS threads spin for a while after
    each call and would steal the cores torch's threads run on (and vice versa)."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        which,
        "--threads",
        str(threads),
        "--repeat",
        str(repeat),
    ]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--child", choices=["ember", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        times = (
            _time_ember(args.repeat)
            if args.child == "ember"
            else _time_torch(args.threads[0], args.repeat)
        )
        print(json.dumps(times))
        return
    names = [case[0] for case in CASES + TRANSPOSE_CASES]
    for threads in args.threads:
        ours = _child("ember", threads, args.repeat)
        ref = _child("torch", threads, args.repeat)
        print(f"--- {threads} thread(s), float32, ms over {args.repeat} runs (median | min)")
        print(
            f"{'case':24s} {'ember':>9s} {'torch':>9s} {'ratio':>6s} | {'ember':>9s} {'torch':>9s} {'ratio':>6s}"
        )
        for name, (a, a_min), (b, b_min) in zip(names, ours, ref):
            print(
                f"{name:24s} {a:9.3f} {b:9.3f} {a / b:6.2f} | {a_min:9.3f} {b_min:9.3f} {a_min / b_min:6.2f}"
            )


if __name__ == "__main__":
    main()
