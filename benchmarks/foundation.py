"""Foundation benchmarks: ember on NdArray side by side with raw NumPy and PyTorch (CPU).

Run: ``.venv/bin/python benchmarks/foundation.py [--threads N] [--quick]``

Prints four tables, each with the ratio ember / reference measured in one run:
per-op framework overhead on small tensors, matmul 1024x1024 f32, conv2d on
the guide's shapes, and the custom GELU of Burn's README on 16M f32 elements.
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
    args = parser.parse_args()
    pin_threads(args.threads)

    import math

    import numpy as np
    import torch

    import ember
    from ember import Tensor, activation
    from ember.tensor import module

    torch.set_num_threads(args.threads)
    device = ember.device("ndarray")
    repeat = 3 if args.quick else 7
    print(f"threads={args.threads}  numpy={np.__version__}  torch={torch.__version__}")

    # ---- per-op overhead over raw NumPy on small tensors
    a_np = np.random.rand(4, 4).astype(np.float32)
    b_np = np.random.rand(4, 4).astype(np.float32)
    a, b = Tensor.from_data(a_np, device), Tensor.from_data(b_np, device)
    cases = {
        "add": (lambda: a + b, lambda: np.add(a_np, b_np)),
        "mul_scalar": (lambda: a * 2.0, lambda: np.multiply(a_np, 2.0)),
        "exp": (lambda: a.exp(), lambda: np.exp(a_np)),
        "sum_dim": (lambda: a.sum_dim(1), lambda: np.sum(a_np, axis=1, keepdims=True)),
        "reshape": (lambda: a.reshape([16]), lambda: a_np.reshape(16)),
        "matmul": (lambda: a.matmul(b), lambda: np.matmul(a_np, b_np)),
        "slice": (lambda: a[1:3], lambda: a_np[1:3]),
        "greater": (lambda: a > b, lambda: np.greater(a_np, b_np)),
    }
    rows, added = [], []
    for name, (ember_fn, numpy_fn) in cases.items():
        t_e = median_seconds(ember_fn, repeat)
        t_n = median_seconds(numpy_fn, repeat)
        added.append((t_e - t_n) * 1e6)
        rows.append([name, f"{t_e * 1e6:.2f}", f"{t_n * 1e6:.2f}", f"{(t_e - t_n) * 1e6:.2f}", f"{t_e / t_n:.1f}x"])
    print_table("Per-op overhead, [4, 4] f32 (target: < 3 us added)",
                ["op", "ember us", "numpy us", "added us", "ratio"], rows)  # fmt: skip
    print(f"median added overhead: {sorted(added)[len(added) // 2]:.2f} us")

    # ---- matmul 1024 x 1024 f32
    x_np = np.random.rand(1024, 1024).astype(np.float32)
    y_np = np.random.rand(1024, 1024).astype(np.float32)
    x, y = Tensor.from_data(x_np, device), Tensor.from_data(y_np, device)
    xt, yt = torch.from_numpy(x_np), torch.from_numpy(y_np)
    t_e = median_seconds(lambda: x.matmul(y), repeat)
    t_t = median_seconds(lambda: torch.matmul(xt, yt), repeat)
    t_n = median_seconds(lambda: np.matmul(x_np, y_np), repeat)
    print_table("matmul 1024x1024 f32 (target: about 1x torch)", ["impl", "ms", "ember / impl"], [
        ["ember ndarray", f"{t_e * 1e3:.2f}", "1.00x"],
        ["raw numpy", f"{t_n * 1e3:.2f}", f"{t_e / t_n:.2f}x"],
        ["torch", f"{t_t * 1e3:.2f}", f"{t_e / t_t:.2f}x"],
    ])  # fmt: skip

    # ---- conv2d on the guide's shapes
    rows = []
    for name, shape_in, shape_w in (
        ("conv1 [64,1,28,28] -> 8", (64, 1, 28, 28), (8, 1, 3, 3)),
        ("conv2 [64,8,26,26] -> 16", (64, 8, 26, 26), (16, 8, 3, 3)),
    ):
        xi = np.random.rand(*shape_in).astype(np.float32)
        wi = np.random.rand(*shape_w).astype(np.float32) - 0.5
        bi = np.random.rand(shape_w[0]).astype(np.float32)
        xe, we, be = (Tensor.from_data(v, device) for v in (xi, wi, bi))
        xt, wt, bt = (torch.from_numpy(v) for v in (xi, wi, bi))
        t_e = median_seconds(lambda xe=xe, we=we, be=be: module.conv2d(xe, we, be), repeat)
        t_t = median_seconds(lambda xt=xt, wt=wt, bt=bt: torch.nn.functional.conv2d(xt, wt, bt), repeat)
        rows.append([name, f"{t_e * 1e3:.3f}", f"{t_t * 1e3:.3f}", f"{t_e / t_t:.2f}x"])
    print_table("conv2d forward, guide shapes (target: <= 2x torch)",
                ["layer", "ember ms", "torch ms", "ratio"], rows)  # fmt: skip

    # ---- the custom GELU of Burn's README
    n = 1 << 20 if args.quick else 1 << 24
    g_np = np.random.randn(n).astype(np.float32)
    g, gt = Tensor.from_data(g_np, device), torch.from_numpy(g_np)

    def gelu_ember():
        return g * ((g / math.sqrt(2.0)).erf() + 1.0) / 2.0

    def gelu_torch():
        return gt * (torch.erf(gt / math.sqrt(2.0)) + 1.0) / 2.0

    t_e = median_seconds(gelu_ember, repeat, min_time=0.0)
    t_t = median_seconds(gelu_torch, repeat, min_time=0.0)
    t_b = median_seconds(lambda: activation.gelu(g), repeat, min_time=0.0)
    print_table(f"custom GELU x*(erf(x/sqrt2)+1)/2 on {n} f32 (recorded; fusion comes later)",
                ["impl", "ms", "ratio vs torch eager"], [
                    ["ember ndarray (5 ops)", f"{t_e * 1e3:.1f}", f"{t_e / t_t:.2f}x"],
                    ["ember activation.gelu", f"{t_b * 1e3:.1f}", f"{t_b / t_t:.2f}x"],
                    ["torch eager (5 ops)", f"{t_t * 1e3:.1f}", "1.00x"],
                ])  # fmt: skip


if __name__ == "__main__":
    main()
