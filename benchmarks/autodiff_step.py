"""One training step (forward + backward) through ember's Autodiff, side by side with PyTorch autograd.

Run: ``.venv/bin/python benchmarks/autodiff_step.py [--threads N] [--batch 64] [--rounds 15]``

Models, written functionally on both sides with the same weights:

* a 3-layer MLP 784 -> 256 -> 256 -> 10 with ReLU;
* the guide CNN of the Burn book: conv 1->8 3x3, dropout, conv 8->16 3x3, dropout,
  ReLU, adaptive average pool to 8x8, linear 1024->512, dropout, ReLU, linear 512->10,
  cross-entropy loss.

ember runs on autodiff(ndarray), autodiff(torch) and autodiff(fusion(ndarray)) (fused
numba kernels, ``ember[jit]``; compiled in the untimed warm-up call), the last also
through ``fusion.replay`` (the step as a function of its tensors; the dropout masks are
drawn anew in each replayed step). The sides' steps
alternate, one of each per round (``timing.interleaved_seconds``): each row gives the median
wall time and the calling thread's median CPU time.

Also prints the host memory (tracemalloc) of the guide CNN step on Autodiff(NdArray)
with and without balanced checkpointing: what the forward pass keeps for the backward
pass, and the peak over the whole step.
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved_seconds, median_seconds, pin_threads, print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    pin_threads(args.threads, alternating=True)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import ember
    from ember import Distribution, Tensor, activation
    from ember.backends.autodiff import Autodiff
    from ember.backends.fusion import replay
    from ember.tensor import module

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    batch = args.batch

    def param(*shape, fan_in=1):
        return (rng.uniform(-1, 1, size=shape) / np.sqrt(fan_in)).astype(np.float32)

    mlp_weights = [param(784, 256, fan_in=784), param(256), param(256, 256, fan_in=256), param(256),
                   param(256, 10, fan_in=256), param(10)]  # fmt: skip
    cnn_weights = [param(8, 1, 3, 3, fan_in=9), param(8), param(16, 8, 3, 3, fan_in=72), param(16),
                   param(1024, 512, fan_in=1024), param(512), param(512, 10, fan_in=512), param(10)]  # fmt: skip
    images = rng.random((batch, 28, 28), dtype=np.float32)
    targets = rng.integers(0, 10, batch)

    # ---------------------------------------------------------------- ember
    def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
        picked = activation.log_softmax(logits, 1).gather(1, labels.reshape([-1, 1]))
        return -picked.mean()

    def dropout(x: Tensor, prob: float = 0.5) -> Tensor:
        keep = Tensor.random(x.shape, Distribution.bernoulli(1 - prob), x.device)
        return x * keep / (1 - prob)

    def ember_mlp(x, labels, w):
        h = activation.relu(x.reshape([batch, 784]).matmul(w[0]) + w[1])
        h = activation.relu(h.matmul(w[2]) + w[3])
        return cross_entropy(h.matmul(w[4]) + w[5], labels)

    def ember_cnn(x, labels, w):
        h = dropout(module.conv2d(x.reshape([batch, 1, 28, 28]), w[0], w[1]))
        h = activation.relu(dropout(module.conv2d(h, w[2], w[3])))
        h = module.adaptive_avg_pool2d(h, (8, 8)).reshape([batch, 1024])
        h = activation.relu(dropout(h.matmul(w[4]) + w[5]))
        return cross_entropy(h.matmul(w[6]) + w[7], labels)

    def ember_step(device, model, weights, replayed=False):
        w = [Tensor.from_data(a, device).require_grad() for a in weights]
        x = Tensor.from_data(images, device)
        labels = Tensor.from_data(targets, device)

        def body(x, labels, w):
            grads = model(x, labels, w).backward()
            return [p.grad(grads) for p in w]

        run = replay(body) if replayed else body

        def step():
            values = run(x, labels, w)
            device.sync()  # a lazy device (fusion) computes them here
            return values

        return step

    # ---------------------------------------------------------------- torch
    def torch_cross_entropy(logits, labels):
        return F.cross_entropy(logits, labels)

    def torch_mlp(x, labels, w):
        h = torch.relu(x.reshape(batch, 784) @ w[0] + w[1])
        h = torch.relu(h @ w[2] + w[3])
        return torch_cross_entropy(h @ w[4] + w[5], labels)

    def torch_cnn(x, labels, w):
        h = F.dropout(F.conv2d(x.reshape(batch, 1, 28, 28), w[0], w[1]), 0.5)
        h = torch.relu(F.dropout(F.conv2d(h, w[2], w[3]), 0.5))
        h = F.adaptive_avg_pool2d(h, (8, 8)).reshape(batch, 1024)
        h = torch.relu(F.dropout(h @ w[4] + w[5], 0.5))
        return torch_cross_entropy(h @ w[6] + w[7], labels)

    def torch_step(model, weights):
        w = [torch.from_numpy(a.copy()).requires_grad_(True) for a in weights]
        x, labels = torch.from_numpy(images), torch.from_numpy(targets)

        def step():
            return torch.autograd.grad(model(x, labels, w), w)

        return step

    devices = {
        "ember autodiff(ndarray)": ember.device("ndarray").autodiff(),
        "ember autodiff(torch)": ember.device("torch").autodiff(),
        "ember autodiff(fusion(ndarray))": ember.device("ndarray").fusion().autodiff(),
    }
    print(f"threads={args.threads}  batch={batch}  torch={torch.__version__}")
    for title, ember_model, torch_model, weights in (
        ("3-layer MLP 784-256-256-10", ember_mlp, torch_mlp, mlp_weights),
        ("guide CNN", ember_cnn, torch_cnn, cnn_weights),
    ):
        calls = {"torch autograd": torch_step(torch_model, weights)}
        calls.update({label: ember_step(device, ember_model, weights) for label, device in devices.items()})
        calls["ember autodiff(fusion(ndarray)), replayed"] = ember_step(
            ember.device("ndarray").fusion().autodiff(), ember_model, weights, replayed=True)
        times = interleaved_seconds(calls, args.rounds)
        t_ref = times["torch autograd"][0]
        rows = [[label, f"{wall * 1e3:.2f}", f"{wall / t_ref:.2f}x", f"{cpu * 1e3:.2f}"]
                for label, (wall, cpu) in times.items()]  # fmt: skip
        print_table(f"{title}: forward + backward", ["impl", "ms", "vs torch", "thread CPU ms"], rows)

    rows = []
    for label, checkpointing in (("no checkpointing", None), ("balanced checkpointing", "balanced")):
        device = ember.device("ndarray").wrap(lambda b, c=checkpointing: Autodiff(b, checkpointing=c))
        w = [Tensor.from_data(a, device).require_grad() for a in cnn_weights]
        x, labels = Tensor.from_data(images, device), Tensor.from_data(targets, device)
        ember_cnn(x, labels, w).backward()  # warm-up
        tracemalloc.start()
        loss = ember_cnn(x, labels, w)
        graph = tracemalloc.get_traced_memory()[0]  # what the forward pass left for backward
        loss.backward()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        step = ember_step(device, ember_cnn, cnn_weights)
        t = median_seconds(step) * 1e3
        rows.append([label, f"{graph / 2**20:.1f}", f"{peak / 2**20:.1f}", f"{t:.2f}"])
    print_table("guide CNN step on autodiff(ndarray): host memory (tracemalloc)",
                ["mode", "graph after forward MiB", "peak MiB", "ms"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
