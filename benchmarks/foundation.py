"""Foundation benchmarks: ember's backends side by side with raw NumPy and raw PyTorch.

Run: ``.venv/bin/python benchmarks/foundation.py [--threads N] [--quick] [--cuda]``

Every table is measured in one run and prints ratios:

1. per-op framework overhead on small tensors: ember-on-NdArray over raw NumPy,
   ember-on-Torch over raw torch (microseconds added per op);
2. matmul 1024x1024 f32;
3. conv2d forward on the guide's shapes;
4. the custom GELU of Burn's README, ``x * (erf(x / sqrt 2) + 1) / 2``, on 16M f32.

With ``--cuda`` (and a GPU), matmul 4096x4096 in f32 and bf16 and the GELU are
also measured on ``torch:cuda:0`` against raw torch on the same GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import median_seconds, pin_threads, print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smaller GELU input, fewer repeats")
    parser.add_argument("--cuda", action="store_true", help="also measure torch:cuda:0")
    args = parser.parse_args()
    pin_threads(args.threads)

    import math

    import numpy as np
    import torch

    import ember
    from ember import Tensor
    from ember.tensor import module

    torch.set_num_threads(args.threads)
    nd, tc = ember.device("ndarray"), ember.device("torch")
    repeat = 3 if args.quick else 7
    print(f"threads={args.threads}  numpy={np.__version__}  torch={torch.__version__}")

    def time_ms(fn, min_time: float = 0.05) -> float:
        return median_seconds(fn, repeat, min_time) * 1e3

    # ---- 1. per-op overhead on small tensors
    a_np = np.random.rand(4, 4).astype(np.float32)
    b_np = np.random.rand(4, 4).astype(np.float32)
    a_t, b_t = torch.from_numpy(a_np.copy()), torch.from_numpy(b_np.copy())
    a_nd, b_nd = Tensor.from_data(a_np, nd), Tensor.from_data(b_np, nd)
    a_tc, b_tc = Tensor.from_data(a_np, tc), Tensor.from_data(b_np, tc)
    ops = {  # name: (ember op on (a, b), raw NumPy op, raw torch op)
        "add": (lambda a, b: a + b, lambda: np.add(a_np, b_np), lambda: torch.add(a_t, b_t)),
        "mul_scalar": (lambda a, b: a * 2.0, lambda: np.multiply(a_np, 2.0), lambda: torch.mul(a_t, 2.0)),
        "exp": (lambda a, b: a.exp(), lambda: np.exp(a_np), lambda: torch.exp(a_t)),
        "sum_dim": (lambda a, b: a.sum_dim(1), lambda: np.sum(a_np, axis=1, keepdims=True),
                    lambda: torch.sum(a_t, 1, keepdim=True)),
        "reshape": (lambda a, b: a.reshape([16]), lambda: a_np.reshape(16), lambda: a_t.reshape(16)),
        "matmul": (lambda a, b: a.matmul(b), lambda: np.matmul(a_np, b_np), lambda: torch.matmul(a_t, b_t)),
        "slice": (lambda a, b: a[1:3], lambda: a_np[1:3], lambda: a_t[1:3]),
        "greater": (lambda a, b: a > b, lambda: np.greater(a_np, b_np), lambda: torch.gt(a_t, b_t)),
    }  # fmt: skip
    rows, added_nd, added_tc = [], [], []
    for name, (ember_op, numpy_op, torch_op) in ops.items():
        on_nd = lambda op=ember_op: op(a_nd, b_nd)  # noqa: E731
        on_tc = lambda op=ember_op: op(a_tc, b_tc)  # noqa: E731
        us = [median_seconds(f, repeat) * 1e6 for f in (on_nd, numpy_op, on_tc, torch_op)]
        added_nd.append(us[0] - us[1])
        added_tc.append(us[2] - us[3])
        rows.append([name, *(f"{u:.2f}" for u in us), f"{us[0] - us[1]:+.2f}", f"{us[2] - us[3]:+.2f}"])
    print_table(
        "1. Per-op overhead, [4, 4] f32, microseconds (target: < 3 us added)",
        ["op", "ember/ndarray", "numpy", "ember/torch", "torch", "added ndarray", "added torch"],
        rows,
    )
    print(f"median added: ndarray {np.median(added_nd):.2f} us, torch {np.median(added_tc):.2f} us")

    # ---- 2. matmul 1024 x 1024 f32
    x_np = np.random.rand(1024, 1024).astype(np.float32)
    y_np = np.random.rand(1024, 1024).astype(np.float32)
    x_t, y_t = torch.from_numpy(x_np), torch.from_numpy(y_np)
    pairs = {name: (Tensor.from_data(x_np, d), Tensor.from_data(y_np, d)) for name, d in (("nd", nd), ("tc", tc))}
    t_ref = time_ms(lambda: torch.matmul(x_t, y_t))
    rows = [["raw torch", f"{t_ref:.2f}", "1.00x"], ["raw numpy", f"{time_ms(lambda: np.matmul(x_np, y_np)):.2f}", ""]]
    rows[1][2] = f"{float(rows[1][1]) / t_ref:.2f}x"
    for label, key in (("ember/ndarray", "nd"), ("ember/torch", "tc")):
        x, y = pairs[key]
        t = time_ms(lambda x=x, y=y: x.matmul(y))
        rows.append([label, f"{t:.2f}", f"{t / t_ref:.2f}x"])
    print_table("2. matmul 1024x1024 f32 (target: about 1x torch)", ["impl", "ms", "vs raw torch"], rows)

    # ---- 3. conv2d on the guide's shapes
    rows = []
    for name, shape_in, shape_w in (
        ("conv1 [64,1,28,28] -> 8", (64, 1, 28, 28), (8, 1, 3, 3)),
        ("conv2 [64,8,26,26] -> 16", (64, 8, 26, 26), (16, 8, 3, 3)),
    ):
        xi = np.random.rand(*shape_in).astype(np.float32)
        wi = np.random.rand(*shape_w).astype(np.float32) - 0.5
        bi = np.random.rand(shape_w[0]).astype(np.float32)
        xt, wt, bt = (torch.from_numpy(v) for v in (xi, wi, bi))
        t_ref = time_ms(lambda xt=xt, wt=wt, bt=bt: torch.nn.functional.conv2d(xt, wt, bt))
        row = [name, f"{t_ref:.3f}"]
        for d in (nd, tc):
            xe, we, be = (Tensor.from_data(v, d) for v in (xi, wi, bi))
            t = time_ms(lambda xe=xe, we=we, be=be: module.conv2d(xe, we, be))
            row += [f"{t:.3f}", f"{t / t_ref:.2f}x"]
        rows.append(row)
    print_table("3. conv2d forward, guide shapes, ms (target: <= 2x torch)",
                ["layer", "raw torch", "ember/ndarray", "ratio", "ember/torch", "ratio"], rows)  # fmt: skip

    # ---- 4. the custom GELU of Burn's README
    n = 1 << 20 if args.quick else 1 << 24
    g_np = np.random.randn(n).astype(np.float32)
    g_t = torch.from_numpy(g_np)

    def gelu(x):
        return x * ((x / math.sqrt(2.0)).erf() + 1.0) / 2.0

    t_ref = time_ms(lambda: g_t * (torch.erf(g_t / math.sqrt(2.0)) + 1.0) / 2.0, 0.0)
    rows = [["raw torch eager", f"{t_ref:.1f}", "1.00x"]]
    for label, d in (("ember/ndarray", nd), ("ember/torch", tc)):
        g = Tensor.from_data(g_np, d)
        t = time_ms(lambda g=g: gelu(g), 0.0)
        rows.append([label, f"{t:.1f}", f"{t / t_ref:.2f}x"])
    print_table(f"4. custom GELU on {n} f32, 5 ops (recorded; fusion comes later)",
                ["impl", "ms", "vs torch eager"], rows)  # fmt: skip

    if args.cuda:
        _cuda_tables(time_ms, gelu)


def _cuda_tables(time_ms, gelu) -> None:
    import math

    import torch

    import ember
    from ember import Tensor

    if not torch.cuda.is_available():
        print("\n(no CUDA device: GPU tables skipped)")
        return
    gpu = ember.device("torch", "cuda:0")

    def synced(fn):
        def run():
            fn()
            torch.cuda.synchronize()

        return run

    rows = []
    for dtype, tdtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        xt = torch.randn(4096, 4096, device="cuda", dtype=tdtype)
        yt = torch.randn(4096, 4096, device="cuda", dtype=tdtype)
        x, y = Tensor.from_primitive(xt, gpu), Tensor.from_primitive(yt, gpu)
        t_ref = time_ms(synced(lambda xt=xt, yt=yt: xt @ yt))
        t = time_ms(synced(lambda x=x, y=y: x.matmul(y)))
        rows.append([f"matmul 4096 {dtype}", f"{t_ref:.3f}", f"{t:.3f}", f"{t / t_ref:.2f}x"])
    gt = torch.randn(1 << 24, device="cuda")
    g = Tensor.from_primitive(gt, gpu)
    t_ref = time_ms(synced(lambda: gt * (torch.erf(gt / math.sqrt(2.0)) + 1.0) / 2.0))
    t = time_ms(synced(lambda: gelu(g)))
    rows.append(["custom GELU 16M f32", f"{t_ref:.3f}", f"{t:.3f}", f"{t / t_ref:.2f}x"])
    print_table(f"5. CUDA ({torch.cuda.get_device_name()})", ["case", "raw torch ms", "ember/torch ms", "ratio"], rows)


if __name__ == "__main__":
    main()
