"""Fused numba kernels beside their peers: GELU, softmax and layer norm, 1 and 2 threads.

Run: ``.venv/bin/python benchmarks/fusion_kernels.py [--threads 1 2] [--repeat 7]``

* GELU ``x * 0.5 * (1 + erf(x / sqrt 2))`` on 16M float32, every candidate writing into a
  reused output buffer where it can (NumPy and PyTorch eager allocate their temporaries):
  the numba kernel, PyTorch eager, ``torch.compile`` (skipped with the reason when it does
  not work here), NumPy, and a plain copy into a reused buffer (the memory bound);
* softmax and layer norm (eps 1e-5, with weight and bias) over ``[4096, 1024]`` float32
  along dim 1, and softmax along dim 0 (a non-last axis): the numba kernel and PyTorch
  eager;
* attention ``softmax(q kᵀ / 8) v`` over ``[8, 4, 128, 64]`` (the ONNX encoder's heads):
  the numba kernel (``numba_attention``), PyTorch's fused
  ``scaled_dot_product_attention`` (the peer) and its unfused ops; and a training step's
  part, forward (writing the weights) and backward: the two numba kernels against
  ``scaled_dot_product_attention`` under autograd.

Each cell is the median seconds of one call; ratios are against the named peer. The
first-compile and warm-disk-cache times of the kernels come last (the warm start is
measured in a fresh process over the same cache folder).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import median_seconds, pin_threads, print_table

GELU_N = 16 * 1024 * 1024
ROWS, COLS = 4096, 1024
HEADS = (8, 4, 128, 64)


def blocks():
    """The fused blocks, as a fuser would hand them to the runtime."""
    from ember.backends.fusion import ir
    from ember.tensor.dtype import DType

    f = DType.F32

    def op(name, args, attrs, shape):
        return ir.Instr(name, tuple(args), tuple(attrs), shape, f)

    g = (GELU_N,)
    gelu = ir.Block(g, (ir.Input(g, f),), (
        op("div_scalar", (0,), (math.sqrt(2.0),), g), op("erf", (1,), (), g),
        op("add_scalar", (2,), (1.0,), g), op("mul", (0, 3), (), g),
        op("mul_scalar", (4,), (0.5,), g)), (5,))  # fmt: skip
    s, r, w = (ROWS, COLS), (ROWS, 1), (1, COLS)
    softmax = ir.Block(s, (ir.Input(s, f),), (
        op("max_dim", (0,), (1,), r), op("sub", (0, 1), (), s), op("exp", (2,), (), s),
        op("sum_dim", (3,), (1,), r), op("div", (3, 4), (), s)), (5,), axis=1)  # fmt: skip
    layer_norm = ir.Block(s, (ir.Input(s, f), ir.Input(w, f), ir.Input(w, f)), (
        op("mean_dim", (0,), (1,), r), op("sub", (0, 3), (), s), op("mul", (4, 4), (), s),
        op("mean_dim", (5,), (1,), r), op("add_scalar", (6,), (1e-5,), r),
        op("rsqrt", (7,), (), r), op("mul", (4, 8), (), s), op("mul", (9, 1), (), s),
        op("add", (10, 2), (), s)), (11,), axis=1)  # fmt: skip
    c = (1, COLS)
    softmax_dim0 = ir.Block(s, (ir.Input(s, f),), (
        op("max_dim", (0,), (0,), c), op("sub", (0, 1), (), s), op("exp", (2,), (), s),
        op("sum_dim", (3,), (0,), c), op("div", (3, 4), (), s)), (5,), axis=0)  # fmt: skip
    return {"gelu": gelu, "softmax": softmax, "layer_norm": layer_norm,
            "softmax_dim0": softmax_dim0}  # fmt: skip


def _compile_times(cache: str) -> dict[str, float]:
    """Seconds of the first run of each block (compiling, or loading from ``cache``)."""
    import numpy as np

    from ember.backends.fusion.numba_runtime import NumbaRuntime

    runtime = NumbaRuntime(cache=cache)
    times = {}
    for name, block in blocks().items():
        inputs = [np.ones(i.shape, np.float32) for i in block.inputs]
        start = time.perf_counter()
        runtime.run(block, inputs)
        times[name] = time.perf_counter() - start
    times["compiled"] = runtime.stats.compiled
    times["disk_hits"] = runtime.stats.disk_hits
    return times


def torch_gelu(v):
    """The GELU of Burn's README in PyTorch eager ops."""
    import torch

    return v * 0.5 * (1.0 + torch.erf(v / math.sqrt(2.0)))


def compile_torch(fn, example):
    """``(torch.compile(fn), "")`` after one call on ``example``, or ``(None, reason)`` when
    torch.compile does not work on this machine (no compiler, an unsupported Python)."""
    import torch

    try:
        compiled = torch.compile(fn)
        compiled(example)
    except Exception as error:  # any failure means "not on this machine"
        return None, f"torch.compile skipped: {type(error).__name__}: {str(error)[:120]}"
    return compiled, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--compile-times", help=argparse.SUPPRESS)  # the warm-start child
    args = parser.parse_args()
    if args.compile_times:
        print(json.dumps(_compile_times(args.compile_times)))
        return
    pin_threads(max(args.threads))

    import numpy as np
    import torch

    from ember.backends.fusion.numba_attention import attention, attention_backward
    from ember.backends.fusion.numba_runtime import NumbaRuntime
    from ember.backends.ndarray.backend import erf as np_erf

    cache = tempfile.mkdtemp(prefix="ember-fusion-bench-")
    cold = _compile_times(cache)
    warm = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--compile-times", cache],
            check=True, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        ).stdout.strip().splitlines()[-1]
    )  # fmt: skip
    runtime = NumbaRuntime(cache=cache)
    fused = blocks()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(GELU_N).astype(np.float32)
    xt = torch.from_numpy(x)
    gelu_out = np.empty_like(x)
    a = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    gamma = rng.standard_normal((1, COLS)).astype(np.float32)
    beta = rng.standard_normal((1, COLS)).astype(np.float32)
    at, gt, bt = torch.from_numpy(a), torch.from_numpy(gamma[0]), torch.from_numpy(beta[0])
    rows_out = np.empty_like(a)
    q, k, v = (rng.standard_normal(HEADS).astype(np.float32) for _ in range(3))
    qt, kt, vt = (torch.from_numpy(h) for h in (q, k, v))
    heads_out = np.empty_like(q)
    scale = 1 / math.sqrt(HEADS[3])

    def torch_attention():
        return torch.softmax((qt * scale) @ kt.transpose(2, 3), 3) @ vt

    d_heads = rng.standard_normal(HEADS).astype(np.float32)
    weights = np.empty(HEADS[:3] + (HEADS[2],), np.float32)
    grads = [np.empty_like(q) for _ in range(3)]
    tq_g, tk_g, tv_g = (t.clone().requires_grad_() for t in (qt, kt, vt))
    td = torch.from_numpy(d_heads)
    q_scaled = q * np.float32(scale)  # what the scores product reads (a step keeps it)

    def numba_step(threads):
        attention(q, k, v, scale, out=heads_out, weights=weights, threads=threads)
        attention_backward(q_scaled, k, v, weights, d_heads, d_q=grads[0],
                           d_k=grads[1], d_v=grads[2], threads=threads)  # fmt: skip

    def torch_step():
        out = torch.nn.functional.scaled_dot_product_attention(tq_g, tk_g, tv_g)
        torch.autograd.grad(out, (tq_g, tk_g, tv_g), td)

    compiled_gelu, compile_note = compile_torch(torch_gelu, xt)

    def numpy_gelu():
        np.multiply(x * np.float32(0.5), np_erf(x / np.float32(math.sqrt(2.0))) + 1, out=gelu_out)

    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)

        def run(name, inputs, out, t=threads):
            return lambda: runtime.run(fused[name], inputs, out=[out], threads=t)

        cells = {
            "gelu numba": median_seconds(run("gelu", [x], gelu_out), args.repeat),
            "gelu torch eager": median_seconds(lambda: torch_gelu(xt), args.repeat),
            "gelu numpy": median_seconds(numpy_gelu, args.repeat),
            "copy into reused": median_seconds(lambda: np.copyto(gelu_out, x), args.repeat),
            "softmax numba": median_seconds(run("softmax", [a], rows_out), args.repeat),
            "softmax torch eager": median_seconds(lambda: torch.softmax(at, 1), args.repeat),
            "softmax_dim0 numba": median_seconds(run("softmax_dim0", [a], rows_out), args.repeat),
            "softmax_dim0 torch eager": median_seconds(lambda: torch.softmax(at, 0), args.repeat),
            "layer_norm numba": median_seconds(
                run("layer_norm", [a, gamma, beta], rows_out), args.repeat
            ),
            "layer_norm torch eager": median_seconds(
                lambda: torch.nn.functional.layer_norm(at, (COLS,), gt, bt, 1e-5), args.repeat
            ),
            "attention numba": median_seconds(
                lambda t=threads: attention(q, k, v, scale, out=heads_out, threads=t), args.repeat
            ),
            "attention torch sdpa": median_seconds(
                lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt), args.repeat
            ),
            "attention torch unfused": median_seconds(torch_attention, args.repeat),
            "attention fwd+bwd numba": median_seconds(
                lambda t=threads: numba_step(t), args.repeat
            ),
            "attention fwd+bwd torch sdpa": median_seconds(torch_step, args.repeat),
        }
        if compiled_gelu is not None:
            cells["gelu torch.compile"] = median_seconds(lambda: compiled_gelu(xt), args.repeat)
        peer = {
            "gelu numba": cells.get("gelu torch.compile", cells["gelu torch eager"]),
            "softmax numba": cells["softmax torch eager"],
            "layer_norm numba": cells["layer_norm torch eager"],
            "softmax_dim0 numba": cells["softmax_dim0 torch eager"],
            "attention numba": cells["attention torch sdpa"],
            "attention fwd+bwd numba": cells["attention fwd+bwd torch sdpa"],
        }
        for name, seconds in cells.items():
            ratio = f"{seconds / peer[name]:.2f}x" if name in peer else ""
            if name == "gelu numba":
                ratio += f" (copy: {seconds / cells['copy into reused']:.2f}x)"
            if name == "attention numba":
                ratio += f" (unfused: {seconds / cells['attention torch unfused']:.2f}x)"
            rows.append([str(threads), name, f"{seconds * 1e3:.2f}", ratio])
    print_table(
        "fused kernels (ms, median; ratio vs torch.compile for GELU, scaled_dot_product_attention"
        " for attention, else torch eager)",
        ["threads", "kernel", "ms", "ratio"],
        rows,
    )
    if compile_note:
        print(compile_note)
    print_table(
        "first run of each kernel (s): compile in a new cache, then a new process warm",
        ["kernel", "first compile", "warm disk cache"],
        [[k, f"{cold[k]:.2f}", f"{warm[k]:.2f}"] for k in fused],
    )
    print(f"compiled {cold['compiled']} then {warm['compiled']}; disk hits {warm['disk_hits']}")


if __name__ == "__main__":
    main()
