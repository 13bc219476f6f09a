"""Gradients of gradients: ember's ``backward(create_graph=True)`` side by side with PyTorch.

Run: ``.venv/bin/python benchmarks/higher_order.py [--threads 1,2] [--batch 32]``

Two workloads, written functionally on both sides with the same weights and inputs:

* **gradient penalty step** (WGAN-GP) of a small convolutional critic (conv 1->8 3x3
  stride 2, leaky ReLU, conv 8->16 3x3 stride 2, leaky ReLU, linear 576->1) on 28x28
  images: the critic's gradient with respect to its mixed input (``create_graph``), the
  penalty ``(|grad| - 1)^2``, and the gradient of score + 10 x penalty with respect to
  the critic's weights;
* **Hessian-vector product** of the guide CNN's cross-entropy loss (no dropout) with
  respect to its weights, along a random direction: the gradient (``create_graph``), then
  the gradient of its dot product with the direction.

ember runs on autodiff(ndarray), autodiff(torch) and autodiff(fusion(ndarray)). The calls
of all sides alternate (``timing.interleaved_seconds``); each row gives the median wall
time of a call and the median CPU time of the calling thread (the steadier figure on a
shared host at one thread), each with its ratio to PyTorch eager in the same run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved_seconds, pin_threads, print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    if len(counts) > 1:
        # One process per thread count: NumPy's BLAS takes its thread count once, at start.
        for threads in counts:
            subprocess.run([sys.executable, __file__, "--threads", str(threads), "--batch",
                            str(args.batch), "--rounds", str(args.rounds)], check=True)  # fmt: skip
        return
    pin_threads(counts[0], alternating=True)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import ember
    from ember import Tensor, activation
    from ember.backends.fusion import replay
    from ember.tensor import module

    rng = np.random.default_rng(0)
    batch = args.batch

    def param(*shape, fan_in=1):
        return (rng.uniform(-1, 1, size=shape) / np.sqrt(fan_in)).astype(np.float32)

    critic = [param(8, 1, 3, 3, fan_in=9), param(8), param(16, 8, 3, 3, fan_in=72), param(16),
              param(576, 1, fan_in=576), param(1)]  # fmt: skip
    cnn = [param(8, 1, 3, 3, fan_in=9), param(8), param(16, 8, 3, 3, fan_in=72), param(16),
           param(1024, 512, fan_in=1024), param(512), param(512, 10, fan_in=512), param(10)]  # fmt: skip
    real, fake = rng.random((batch, 1, 28, 28), np.float32), rng.random((batch, 1, 28, 28), np.float32)
    alpha = rng.random((batch, 1, 1, 1), np.float32)
    mixed = alpha * real + (1 - alpha) * fake
    images = rng.random((batch, 28, 28), np.float32)
    targets = rng.integers(0, 10, batch)
    direction = [rng.standard_normal(w.shape).astype(np.float32) for w in cnn]

    # ---------------------------------------------------------------- ember
    def ember_critic(x, w):
        h = activation.leaky_relu(module.conv2d(x, w[0], w[1], stride=2), 0.2)
        h = activation.leaky_relu(module.conv2d(h, w[2], w[3], stride=2), 0.2)
        return h.reshape([batch, 576]).matmul(w[4]) + w[5]

    def ember_penalty_step(device, replayed=False):
        w = [Tensor.from_data(a, device).require_grad() for a in critic]
        x0 = Tensor.from_data(mixed, device)

        def body(x0, *w):
            x = x0.require_grad()
            score = ember_critic(x, w)
            slope = x.grad(score.sum().backward(create_graph=True, inputs=[x])).reshape([batch, -1])
            norms = (slope * slope).sum_dim(1).sqrt()
            loss = score.mean() + ((norms - 1.0) * (norms - 1.0)).mean() * 10.0
            # The weights' gradients only, as torch.autograd.grad(loss, w) below (the mixed
            # input requires grad too, but no one reads its second gradient).
            grads = loss.backward(inputs=list(w))
            return [p.grad(grads) for p in w]

        run = replay(body) if replayed else body

        def step():
            out = run(x0, *w)
            device.sync()
            return out

        return step

    def ember_cnn_loss(x, labels, w):
        h = module.conv2d(x.reshape([batch, 1, 28, 28]), w[0], w[1])
        h = activation.relu(module.conv2d(h, w[2], w[3]))
        h = module.adaptive_avg_pool2d(h, (8, 8)).reshape([batch, 1024])
        h = activation.relu(h.matmul(w[4]) + w[5])
        logits = h.matmul(w[6]) + w[7]
        return -activation.log_softmax(logits, 1).gather(1, labels.reshape([-1, 1])).mean()

    def ember_hvp(device, replayed=False):
        w = [Tensor.from_data(a, device).require_grad() for a in cnn]
        v = [Tensor.from_data(a, device) for a in direction]
        x, labels = Tensor.from_data(images, device), Tensor.from_data(targets, device)

        def body(x, labels, w, v):
            grads = ember_cnn_loss(x, labels, w).backward(create_graph=True)
            total = None
            for p, d in zip(w, v):
                term = (p.grad(grads) * d).sum()
                total = term if total is None else total + term
            second = total.backward()
            return [p.grad(second) for p in w]

        run = replay(body) if replayed else body

        def step():
            out = run(x, labels, w, v)
            device.sync()
            return out

        return step

    # ---------------------------------------------------------------- torch
    def torch_critic(x, w):
        h = F.leaky_relu(F.conv2d(x, w[0], w[1], stride=2), 0.2)
        h = F.leaky_relu(F.conv2d(h, w[2], w[3], stride=2), 0.2)
        return h.reshape(batch, 576) @ w[4] + w[5]

    def torch_penalty_step():
        w = [torch.from_numpy(a.copy()).requires_grad_(True) for a in critic]
        x0 = torch.from_numpy(mixed)

        def step():
            x = x0.clone().requires_grad_(True)
            score = torch_critic(x, w)
            (slope,) = torch.autograd.grad(score.sum(), x, create_graph=True)
            penalty = ((slope.reshape(batch, -1).norm(dim=1) - 1) ** 2).mean()
            return torch.autograd.grad(score.mean() + 10 * penalty, w)

        return step

    def torch_cnn_loss(x, labels, w):
        h = F.conv2d(x.reshape(batch, 1, 28, 28), w[0], w[1])
        h = torch.relu(F.conv2d(h, w[2], w[3]))
        h = F.adaptive_avg_pool2d(h, (8, 8)).reshape(batch, 1024)
        h = torch.relu(h @ w[4] + w[5])
        return F.cross_entropy(h @ w[6] + w[7], labels)

    def torch_hvp():
        w = [torch.from_numpy(a.copy()).requires_grad_(True) for a in cnn]
        v = [torch.from_numpy(a) for a in direction]
        x, labels = torch.from_numpy(images), torch.from_numpy(targets)

        def step():
            grads = torch.autograd.grad(torch_cnn_loss(x, labels, w), w, create_graph=True)
            total = sum((g * d).sum() for g, d in zip(grads, v))
            return torch.autograd.grad(total, w)

        return step

    devices = {"ember autodiff(ndarray)": ember.device("ndarray").autodiff(),
               "ember autodiff(torch)": ember.device("torch").autodiff(),
               "ember autodiff(fusion(ndarray))": ember.device("ndarray").fusion().autodiff()}  # fmt: skip
    threads = counts[0]
    torch.set_num_threads(threads)
    for title, reference, ours in (("gradient penalty step", torch_penalty_step, ember_penalty_step),
                                   ("Hessian-vector product of the guide CNN", torch_hvp, ember_hvp)):  # fmt: skip
        calls = {"torch eager": reference()}
        calls.update({label: ours(device) for label, device in devices.items()})
        calls["ember autodiff(fusion(ndarray)), replayed"] = ours(
            ember.device("ndarray").fusion().autodiff(), replayed=True)
        times = interleaved_seconds(calls, args.rounds)
        wall_ref, cpu_ref = times["torch eager"]
        rows = [[label, f"{wall * 1e3:.2f}", f"{wall / wall_ref:.2f}x", f"{cpu * 1e3:.2f}",
                 f"{cpu / cpu_ref:.2f}x"] for label, (wall, cpu) in times.items()]  # fmt: skip
        print_table(f"{title}, batch {batch}, {threads} thread(s)",
                    ["impl", "wall ms", "vs torch", "thread CPU ms", "vs torch"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
