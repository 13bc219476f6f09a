"""Times the NdArray backend's conv kernels against PyTorch CPU on the guide shapes.

Usage: ``python benchmarks/bench_conv_kernels.py [--threads 1 2] [--repeat 50] [--rounds 3]
[--baseline OLD_CONV_PY] [--no-numba]``

Thread counts are fixed per process (OpenBLAS reads ``OPENBLAS_NUM_THREADS``
when NumPy loads), so the script re-runs itself once per thread count with
the thread variables set (ember's kernels read them too), and torch gets
``torch.set_num_threads`` to match. Each library is timed in its own process
(see ``_child``); the processes take turns ``--rounds`` times, so that a burst
of load from elsewhere on a shared machine hits all of them alike. Each line
prints the median over rounds of each round's median milliseconds (and the
minimum over all runs) of ember's kernel and of torch, and their ratio
(ember / torch; below 2 meets the design target). ``--baseline`` also times
another copy of ``conv.py`` (say, the last commit's, from ``git show
HEAD:src/ember/backends/ndarray/conv.py``) in the same turns, and prints its
time and the speed-up over it.

Where numba is installed, the fusion backend's direct kernels
(``ember.backends.fusion.numba_conv``, with ``EMBER_FUSION_THREADS`` set to the thread
count: small convolutions still run on one, see ``numba_conv.PARALLEL_MIN_MACS``) are
timed in their own process too: the ``numba`` column, and ``nb/ember`` (below 1: numba is faster
than im2col). Transposed convolutions have no numba kernel (``-``).

``--backward`` times the gradients of the convolution cases instead: per case a ``dx`` row
(``conv_x_backward``: NdArray's transposed convolution, ``numba_conv_grad.conv2d_x_backward``,
torch's ``aten.convolution_backward`` for the input) and a ``dw`` row (``conv_weight_backward``:
NdArray's unfold and matmul, ``numba_conv_grad.conv2d_weight_backward``, torch's for the
weight).
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
    # The CNN of benchmarks/onnx_inference.py at batch 8.
    ("onnx 3->32", (8, 3, 32, 32), (32, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("onnx 32->32", (8, 32, 32, 32), (32, 32, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("onnx 32->64 s2", (8, 32, 32, 32), (64, 32, 3, 3), (2, 2), (1, 1), (1, 1), 1),
    ("onnx 64->64", (8, 64, 16, 16), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("onnx 1x1 32->64 s2", (8, 32, 32, 32), (64, 32, 1, 1), (2, 2), (0, 0), (1, 1), 1),
]
TRANSPOSE_CASES = [
    ("conv_transpose2d s=1", (64, 16, 24, 24), (16, 8, 3, 3), (1, 1), (0, 0), (0, 0), (1, 1), 1),
    ("conv_transpose2d s=2", (32, 32, 16, 16), (32, 16, 4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 1),
]


def _load_conv(path: str | None = None):
    """The conv module, imported by file path so the benchmark runs while the package is partial.

    With ``path``, that file instead (a baseline to compare with).
    """
    if path:
        spec = importlib.util.spec_from_file_location("_baseline_conv", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
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


def _time_ember(repeat: int, path: str | None = None) -> list[tuple[float, float]]:
    import numpy as np

    conv = _load_conv(path)
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


def _time_numba(repeat: int) -> list[tuple[float, float] | None]:
    import numpy as np

    sys.path.insert(0, str(SRC))
    from ember.backend.options import ConvOptions
    from ember.backends.fusion import numba_conv

    rng = np.random.default_rng(0)
    times: list[tuple[float, float] | None] = []
    for _, xs, ws, s, p, d, g in CASES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        b = rng.standard_normal(ws[0], dtype=np.float32)
        options = ConvOptions(s, p, d, g)
        times.append(
            _median_ms(lambda: numba_conv.conv2d(x, w, b, options), repeat)  # noqa: B023
        )
    return times + [None] * len(TRANSPOSE_CASES)


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


def _backward_cases():
    """Per convolution case, its arrays' shapes and options, and a gradient of its output."""
    import numpy as np

    sys.path.insert(0, str(SRC))
    from ember.backend.options import ConvOptions

    rng = np.random.default_rng(0)
    for _, xs, ws, s, p, d, g in CASES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        out = [(n + 2 * pad - dil * (k - 1) - 1) // st + 1
               for n, pad, dil, k, st in zip(xs[2:], p, d, ws[2:], s)]  # fmt: skip
        grad = rng.standard_normal((xs[0], ws[0], *out), dtype=np.float32)
        yield x, w, grad, ConvOptions(s, p, d, g)


def _time_backward(which: str, threads: int, repeat: int) -> list[tuple[float, float]]:
    """The ``dx`` and ``dw`` rows of every convolution case, by ``which`` library."""
    times = []
    if which == "torch":
        import torch

        torch.set_num_threads(threads)
    for x, w, grad, options in _backward_cases():
        if which == "torch":
            xt, wt, gt = (torch.from_numpy(a) for a in (x, w, grad))
            conv_backward = torch.ops.aten.convolution_backward

            def dx(xt=xt, wt=wt, gt=gt, o=options, conv_backward=conv_backward):
                return conv_backward(gt, xt, wt, None, o.stride, o.padding, o.dilation, False,
                                     (0, 0), o.groups, (True, False, False))  # fmt: skip

            def dw(xt=xt, wt=wt, gt=gt, o=options, conv_backward=conv_backward):
                return conv_backward(gt, xt, wt, None, o.stride, o.padding, o.dilation, False,
                                     (0, 0), o.groups, (False, True, False))  # fmt: skip

        elif which == "numba":
            from ember.backends.fusion import numba_conv_grad

            def dx(x=x, w=w, grad=grad, o=options):
                return numba_conv_grad.conv2d_x_backward(x, w, grad, o)

            def dw(x=x, w=w, grad=grad, o=options):
                return numba_conv_grad.conv2d_weight_backward(x, w, grad, o)

        else:
            from ember.backends.ndarray import NdArray

            backend = NdArray()

            def dx(x=x, w=w, grad=grad, o=options, backend=backend):
                return backend.conv_x_backward(x, w, grad, o)

            def dw(x=x, w=w, grad=grad, o=options, backend=backend):
                return backend.conv_weight_backward(x, w, grad, o)

        times += [_median_ms(dx, repeat), _median_ms(dw, repeat)]
    return times


def _child(which: str, threads: int, repeat: int, baseline: str | None = None,
           backward: bool = False) -> list:  # fmt: skip
    """Times one library in a fresh process: idle OpenBLAS threads spin for a while after
    each call and would steal the cores torch's threads run on (and vice versa)."""
    env = dict(os.environ)
    for var in (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "EMBER_FUSION_THREADS",
    ):
        env[var] = str(threads)
    cmd = [sys.executable, __file__, "--child", which, "--threads", str(threads)]
    cmd += ["--repeat", str(repeat)]
    if baseline:
        cmd += ["--baseline", baseline]
    if backward:
        cmd += ["--backward"]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(rounds: list[list]) -> list[tuple[float, float] | None]:
    """Per case: the median of the rounds' medians and the minimum of their minimums
    (``None`` where the library has no kernel for the case)."""
    return [
        None if runs[0] is None else
        (statistics.median(r[0] for r in runs), min(r[1] for r in runs))
        for runs in zip(*rounds)
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", help="another conv.py to time alongside")
    parser.add_argument("--no-numba", action="store_true", help="skip the numba kernels")
    parser.add_argument("--backward", action="store_true", help="time the gradients instead")
    parser.add_argument(
        "--child", choices=["ember", "baseline", "torch", "numba"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        if args.backward:
            times = _time_backward(args.child, args.threads[0], args.repeat)
        elif args.child == "torch":
            times = _time_torch(args.threads[0], args.repeat)
        elif args.child == "numba":
            times = _time_numba(args.repeat)
        else:
            times = _time_ember(args.repeat, args.baseline if args.child == "baseline" else None)
        print(json.dumps(times))
        return
    names = [case[0] for case in CASES + TRANSPOSE_CASES]
    if args.backward:
        if args.baseline:
            parser.error("--baseline times forward convolutions only")
        names = [f"{case[0]} {row}" for case in CASES for row in ("dx", "dw")]
    with_numba = not args.no_numba and importlib.util.find_spec("numba") is not None
    children = ["ember", "torch"] + (["baseline"] if args.baseline else [])
    children += ["numba"] if with_numba else []
    for threads in args.threads:
        runs = {child: [] for child in children}
        for _ in range(args.rounds):
            for child in children:
                runs[child].append(
                    _child(child, threads, args.repeat, args.baseline, args.backward)
                )
        ours, ref = _summary(runs["ember"]), _summary(runs["torch"])
        old = _summary(runs["baseline"]) if args.baseline else None
        fast = _summary(runs["numba"]) if with_numba else None
        print(
            f"--- {threads} thread(s), float32, ms: median of {args.rounds} rounds' medians over"
            f" {args.repeat} runs | minimum"
        )
        header = f"{'case':27s} {'ember':>9s} {'torch':>9s} {'ratio':>6s}"
        header += f" {'before':>9s} {'speedup':>7s}" if old else ""
        header += f" {'numba':>9s} {'nb/ember':>8s} {'nb/torch':>8s}" if fast else ""
        tail = f" {'numba':>9s}" if fast else ""
        print(f"{header} | {'ember':>9s} {'torch':>9s} {'ratio':>6s}{tail}")
        for i, name in enumerate(names):
            (a, a_min), (b, b_min) = ours[i], ref[i]
            line = f"{name:27s} {a:9.3f} {b:9.3f} {a / b:6.2f}"
            if old:
                line += f" {old[i][0]:9.3f} {old[i][0] / a:7.2f}"
            if fast and fast[i] is not None:
                c = fast[i][0]
                line += f" {c:9.3f} {c / a:8.2f} {c / b:8.2f}"
            elif fast:
                line += f" {'-':>9s} {'-':>8s} {'-':>8s}"
            tail = ""
            if fast:
                tail = f" {fast[i][1]:9.3f}" if fast[i] is not None else f" {'-':>9s}"
            print(f"{line} | {a_min:9.3f} {b_min:9.3f} {a_min / b_min:6.2f}{tail}")


if __name__ == "__main__":
    main()
