"""The Fusion decorator end to end: Tensor-API code on ``fusion(ndarray)`` beside its peers.

Run: ``.venv/bin/python benchmarks/fusion.py [--threads 1 2] [--rounds 15]``, or with
``--cuda`` the GPU rows (below).

Everything goes through the Tensor API (``benchmarks/fusion_kernels.py`` times the numba
kernels alone), side by side in one run, at each ``--threads`` count:

* the custom GELU of Burn's README, ``x * 0.5 * (1 + erf(x / sqrt 2))`` written with
  Tensor ops, on 16M float32: ``ndarray``, ``fusion(ndarray)``, the same fused kernel
  alone (the runtime writing into a reused buffer: what the decorator adds is the
  difference), PyTorch eager, ``torch.compile`` (skipped with the reason when it does not
  work here) and a plain copy into a reused buffer (the memory bound);
* ``activation.softmax`` and ``nn.LayerNorm`` over ``[4096, 1024]`` float32 on
  ``fusion(ndarray)``, ``ndarray`` and PyTorch eager.

Each workload also runs on ``fusion(ndarray)`` through ``ember.backends.fusion.replay``
(row "replayed"): the same records, pushed from a trace without the Python that made them.

Each cell is the median milliseconds of one call (recording, running at ``sync``, freeing
the result), a workload's sides alternating call by call (``timing.interleaved_seconds``,
``--rounds``); at one thread the GELU row also gives its ratio to the copy in CPU time of
the calling thread. Then: the first call of each workload in a fresh process with an empty kernel
cache (``EMBER_FUSION_CACHE``), and again in another fresh process over the warmed
folder; and the peak memory of one GELU call above what the process held before it
(Linux ``VmHWM``, reset through ``/proc/self/clear_refs``).

``--cuda``: the same workloads on ``fusion(torch:cuda)`` (the Triton runtime) beside torch
eager and ``torch.compile`` on the GPU: GELU on 256M float32 (with GB/s: 8 bytes moved per
element, one read and one write), softmax and layer norm over ``[4096, 1024]`` rows
(``--cuda-rows`` changes the row count). Without a GPU or triton it prints why and exits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fusion_kernels import COLS, GELU_N, ROWS, blocks, compile_torch, torch_gelu
from timing import interleaved_seconds, median_seconds, pin_threads, print_table

SQRT2 = math.sqrt(2.0)


def gelu(x):
    """Burn's README GELU in Tensor ops (five element-wise ops the decorator fuses)."""
    return x * 0.5 * ((x / SQRT2).erf() + 1.0)


def inputs():
    """The host arrays every side reads: the GELU's ``[GELU_N]`` and the rows'
    ``[ROWS, COLS]``."""
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.standard_normal(GELU_N).astype(np.float32),
            rng.standard_normal((ROWS, COLS)).astype(np.float32))  # fmt: skip


def workloads(device, replayed: bool = False, arrays=None):
    """``{name: call}`` for the three workloads on ``device``, each running to the end;
    ``replayed``: each workload's function through ``fusion.replay``. ``arrays`` (from
    :func:`inputs`, default new ones): on a fusion device the tensors are these arrays
    themselves, not copies, so that a peer given the same arrays reads the same memory (a
    row that straddles two pages reads measurably slower than one on a page: where two
    sides' inputs lay differently, the ratio moved by up to 10% from run to run)."""
    from ember import Tensor
    from ember.backends.fusion import replay
    from ember.backends.fusion.backend import Fusion
    from ember.nn.norm import LayerNormConfig
    from ember.tensor import activation

    host_x, host_rows = inputs() if arrays is None else arrays
    if isinstance(device.backend, Fusion):
        x, rows = (Tensor.from_primitive(device.backend.wrap(a), device) for a in (host_x, host_rows))
    else:
        x, rows = Tensor.from_data(host_x, device), Tensor.from_data(host_rows, device)
    norm = LayerNormConfig(COLS).init(device)

    def run(fn, arg):
        if replayed:
            fn = replay(fn)

        def call():
            y = fn(arg)
            device.sync()
            return y

        return call

    return {
        "gelu": run(gelu, x),
        "softmax": run(lambda t: activation.softmax(t, 1), rows),
        "layer_norm": run(norm, rows),
    }


def _first_calls() -> dict[str, float]:
    """Seconds of the first and second call of each workload on ``fusion(ndarray)`` (run in
    a fresh process; the kernel cache is ``EMBER_FUSION_CACHE``)."""
    import ember

    times = {}
    for name, call in workloads(ember.device("ndarray").fusion()).items():
        for label in ("first", "second"):
            start = time.perf_counter()
            call()
            times[f"{name} {label}"] = time.perf_counter() - start
    return times


def _child_first_calls(cache: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--first-calls"],
        check=True, capture_output=True, text=True,
        env={**os.environ, "EMBER_FUSION_CACHE": cache, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1))


def peak_mib(call, settle=None) -> float | None:
    """MiB the process's resident set grew to during ``call`` above where it stood before
    (after a warm-up call, then ``settle()``); None where the peak cannot be reset."""
    call()
    if settle is not None:
        settle()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
        before = _status_kib("VmRSS")
    except OSError:
        return None
    call()
    return (_status_kib("VmHWM") - before) / 1024


CUDA_GELU_N = 1 << 28
"""256M float32: 1 GiB in, 1 GiB out."""


def cuda_main(repeat: int, rows_count: int) -> None:
    """The ``--cuda`` rows (see the module doc); prints why they cannot run, if so."""
    import torch

    from ember.backends.fusion import triton_runtime

    reason = triton_runtime.unavailable_reason()
    if not torch.cuda.is_available():
        reason = "no CUDA GPU (torch.cuda.is_available() is False)"
    if reason is not None:
        print(f"benchmarks/fusion.py --cuda skipped: {reason}")
        return
    import ember
    from ember import Tensor
    from ember.backends.fusion import reset_stats, stats
    from ember.nn.norm import LayerNormConfig
    from ember.tensor import activation

    device = ember.device("torch", "cuda").fusion(runtime="triton")
    x = torch.randn(CUDA_GELU_N, device="cuda")
    rows = torch.randn(rows_count, COLS, device="cuda")
    gamma, beta = torch.ones(COLS, device="cuda"), torch.zeros(COLS, device="cuda")
    # The torch tensors themselves, made on the GPU (not copied from host memory).
    fx = Tensor.from_primitive(device.backend.wrap(x), device)
    frows = Tensor.from_primitive(device.backend.wrap(rows), device)
    norm = LayerNormConfig(COLS).init(device)
    compiled_gelu, compile_note = compile_torch(torch_gelu, x)
    compiled_softmax, _ = compile_torch(lambda v: torch.softmax(v, 1), rows)

    def synced(fn):
        def call():
            out = fn()
            torch.cuda.synchronize()
            return out

        return call

    peers = {
        ("gelu", "fusion(torch:cuda)"): lambda: (gelu(fx), device.sync()),
        ("gelu", "torch eager"): lambda: torch_gelu(x),
        ("gelu", "torch.compile"): compiled_gelu and (lambda: compiled_gelu(x)),
        ("softmax", "fusion(torch:cuda)"): lambda: (activation.softmax(frows, 1), device.sync()),
        ("softmax", "torch eager"): lambda: torch.softmax(rows, 1),
        ("softmax", "torch.compile"): compiled_softmax and (lambda: compiled_softmax(rows)),
        ("layer_norm", "fusion(torch:cuda)"): lambda: (norm(frows), device.sync()),
        ("layer_norm", "torch eager"): lambda: torch.nn.functional.layer_norm(
            rows, (COLS,), gamma, beta, 1e-5),
    }
    reset_stats()
    moved = {"gelu": 8 * CUDA_GELU_N, "softmax": 8 * rows.numel(), "layer_norm": 8 * rows.numel()}
    table = []
    for (work, impl), fn in peers.items():
        if not fn:
            continue
        t = median_seconds(synced(fn), repeat)
        eager = median_seconds(synced(peers[(work, "torch eager")]), repeat)
        table.append([work, impl, f"{t * 1e3:.3f}", f"{moved[work] / t / 1e9:.0f}",
                      f"{t / eager:.2f}x"])  # fmt: skip
    print(f"torch={torch.__version__}  triton={triton_runtime.triton.__version__}  "
          f"gpu={torch.cuda.get_device_name()}")  # fmt: skip
    print_table("fusion(torch:cuda) on the Triton runtime (ms, median)",
                ["workload", "impl", "ms", "GB/s", "vs torch eager"], table)  # fmt: skip
    if compile_note:
        print(compile_note)
    print(f"fusion stats over the timed runs: {stats()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each --cuda row")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--first-calls", action="store_true", help=argparse.SUPPRESS)  # child
    parser.add_argument("--cuda", action="store_true", help="the GPU rows (Triton runtime)")
    parser.add_argument("--cuda-rows", type=int, default=ROWS)
    args = parser.parse_args()
    if args.cuda:
        cuda_main(args.repeat, args.cuda_rows)
        return
    if args.first_calls:
        print(json.dumps(_first_calls()))
        return
    pin_threads(max(args.threads))

    import numba
    import numpy as np
    import torch

    import ember
    from ember.backends.fusion import reset_stats, stats
    from ember.backends.fusion.executor import runtime_named
    from ember.backends.fusion.numba_runtime import NumbaRuntime

    cache = tempfile.mkdtemp(prefix="ember-fusion-e2e-")
    cold = _child_first_calls(cache)
    warm = _child_first_calls(cache)

    x, host_rows = arrays = inputs()
    nd, fu = ember.device("ndarray"), ember.device("ndarray").fusion()
    on_nd = workloads(nd, arrays=arrays)
    on_fu, on_replay = workloads(fu, arrays=arrays), workloads(fu, replayed=True, arrays=arrays)
    xt, copy_out = torch.from_numpy(x), np.empty_like(x)
    rows = torch.from_numpy(host_rows)
    gamma, beta = torch.ones(COLS), torch.zeros(COLS)
    compiled_gelu, compile_note = compile_torch(torch_gelu, xt)
    kernel_runtime, gelu_block = NumbaRuntime(cache=cache), blocks()["gelu"]

    peers = {  # (workload, implementation): call
        ("gelu", "ndarray"): on_nd["gelu"],
        ("gelu", "fusion(ndarray)"): on_fu["gelu"],
        ("gelu", "fusion(ndarray), replayed"): on_replay["gelu"],
        ("gelu", "fused kernel alone"): lambda: kernel_runtime.run(gelu_block, [x], [copy_out]),
        ("gelu", "torch eager"): lambda: torch_gelu(xt),
        ("gelu", "torch.compile"): compiled_gelu and (lambda: compiled_gelu(xt)),
        ("gelu", "copy into reused"): lambda: np.copyto(copy_out, x),
        ("softmax", "ndarray"): on_nd["softmax"],
        ("softmax", "fusion(ndarray)"): on_fu["softmax"],
        ("softmax", "fusion(ndarray), replayed"): on_replay["softmax"],
        ("softmax", "torch eager"): lambda: torch.softmax(rows, 1),
        ("layer_norm", "ndarray"): on_nd["layer_norm"],
        ("layer_norm", "fusion(ndarray)"): on_fu["layer_norm"],
        ("layer_norm", "fusion(ndarray), replayed"): on_replay["layer_norm"],
        ("layer_norm", "torch eager"): lambda: torch.nn.functional.layer_norm(
            rows, (COLS,), gamma, beta, 1e-5
        ),
    }
    table = []
    reset_stats()
    for threads in args.threads:
        torch.set_num_threads(threads)
        # pin_threads set EMBER_FUSION_THREADS, which the runtimes read once: set each row's.
        runtime_named("numba").threads = kernel_runtime.threads = threads
        # Each workload's sides alternate call by call (a loaded minute lands on all alike).
        ms, cpu = {}, {}
        for workload in ("gelu", "softmax", "layer_norm"):
            calls = {impl: fn for (work, impl), fn in peers.items() if work == workload and fn}
            for impl, (wall, thread_cpu) in interleaved_seconds(calls, args.rounds).items():
                ms[(workload, impl)], cpu[(workload, impl)] = wall * 1e3, thread_cpu
        for (work, impl), t in ms.items():
            eager, plain = ms[(work, "torch eager")], ms[(work, "ndarray")]
            notes = []
            fused = impl.startswith("fusion(ndarray)")
            if fused and (work, "torch.compile") in ms:
                notes.append(f"{t / ms[(work, 'torch.compile')]:.2f}x torch.compile")
            if fused and work == "gelu":
                notes.append(f"{t / ms[(work, 'copy into reused')]:.2f}x copy")
                notes.append(f"{t / ms[(work, 'fused kernel alone')]:.2f}x kernel alone")
                if threads == 1:  # one thread does all the work: its CPU time
                    ratio = cpu[(work, impl)] / cpu[(work, "copy into reused")]
                    notes.append(f"{ratio:.2f}x copy in thread CPU time")
            table.append([str(threads), work, impl, f"{t:.2f}", f"{t / eager:.2f}x",
                          f"{t / plain:.2f}x", ", ".join(notes)])  # fmt: skip
    loop = "runs that prefetch" if runtime_named("numba").prefetches() else "plain loop"
    print(f"numpy={np.__version__}  torch={torch.__version__}  numba={numba.__version__}  "
          f"cpus={os.cpu_count()}  element-wise kernels: {loop} (EMBER_FUSION_PREFETCH)")  # fmt: skip
    print_table(
        "end to end through the Tensor API (ms, median; ratios vs torch eager and ndarray)",
        ["threads", "workload", "impl", "ms", "vs torch eager", "vs ndarray", "notes"],
        table,
    )
    if compile_note:
        print(compile_note)
    print(f"fusion stats over the timed runs: {stats()}")

    print_table(
        "first call in a fresh process (s): empty kernel cache, then the warmed cache",
        ["workload", "first call, cold", "first call, warm cache", "second call"],
        [[w, f"{cold[w + ' first']:.2f}", f"{warm[w + ' first']:.3f}",
          f"{warm[w + ' second']:.3f}"] for w in ("gelu", "softmax", "layer_norm")],
    )  # fmt: skip

    torch.set_num_threads(max(args.threads))
    runtime_named("numba").threads = max(args.threads)
    memory = []
    pool = runtime_named("numba").pool
    for (work, impl), fn in peers.items():
        if work == "gelu" and fn is not None:
            memory.append([impl, peak_mib(fn)])
            if impl == "fusion(ndarray)":  # its output pages come from the pool's idle ones
                memory.append([f"{impl}, pool emptied first", peak_mib(fn, pool.clear)])
    memory = [[impl, "n/a" if peak is None else f"{peak:.0f}"] for impl, peak in memory]
    print_table(
        f"peak memory of one GELU call on {GELU_N * 4 >> 20} MiB of input "
        "(MiB above the resident size before the call)",
        ["impl", "peak MiB"],
        memory,
    )


if __name__ == "__main__":
    main()
