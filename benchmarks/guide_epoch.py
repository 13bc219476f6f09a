"""The guide's training epoch: ember on NdArray and on Torch, beside the same model in PyTorch.

Run: ``.venv/bin/python benchmarks/guide_epoch.py [--threads 1] [--iterations 200] [--repeat 3]``

ember runs on Torch, NdArray and NdArray under the Fusion decorator (``--fusion``: fused
numba kernels, compiled during the warm-up). Every side trains the guide's CNN (conv
1->8, conv 8->16, adaptive pool 8x8, linear 1024->512->10, dropout 0.5, ReLU) on MNIST
with Adam (lr 1e-4, epsilon 1e-5) and batches of 64, on the CPU with the same number of threads. A fixed number of
iterations is timed after a warm-up, ``--repeat`` times (the median is shown); the
epoch time is extrapolated to the 938 iterations of an MNIST epoch. Two measurements:

1. **The training step**, data excluded: the batches are made before the clock starts.
   ember: ``model.train_step(batch)``, ``optimizer.step``, the loss read back (the
   learner reads it every iteration). PyTorch: ``zero_grad``, forward, cross entropy,
   ``backward``, ``step``, ``loss.item()``.
2. **The whole guide iteration**, data included on both sides: ember's ``Learner.fit``
   as ``ember guide train`` runs it (the data loader and the guide's batcher, the
   step, the accuracy and loss metrics, their log files), against a PyTorch loop that
   makes each batch from the same MNIST items with the same NumPy normalization and
   reads the loss and the number of correct predictions back each iteration. No
   validation on either side.

Ratios are ember's time over PyTorch's (lower is better; 1.0 is parity).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import pin_threads, print_table

EPOCH_ITERATIONS = 938  # ceil(60 000 / 64)
WARMUP = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    pin_threads(args.threads)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import ember
    from ember.data.dataset.transform.partial import PartialDataset
    from ember.data.vision.mnist import MnistDataset
    from ember.guide.data import MEAN, STD, MnistBatcher
    from ember.guide.training import default_config, make_loaders
    from ember.optim.adam import AdamConfig
    from ember.train.learner.builder import LearnerBuilder
    from ember.train.metric.accuracy import AccuracyMetric
    from ember.train.metric.loss import LossMetric
    from ember.train.renderer.plain import PlainRenderer

    torch.set_num_threads(args.threads)
    iterations, batch_size = args.iterations, args.batch
    mnist = MnistDataset.train()
    items = PartialDataset(mnist, 0, (WARMUP + iterations) * batch_size)
    chunks = [
        [items[i] for i in range(start, start + batch_size)]
        for start in range(0, len(items), batch_size)
    ]

    def per_iteration(run) -> float:
        """The median over ``--repeat`` runs of ``run()``'s seconds per timed iteration."""
        samples = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            run()
            samples.append((time.perf_counter() - start) / iterations)
        return statistics.median(samples)

    # ---------------------------------------------------------------- PyTorch
    class TorchGuide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 8, 3)
            self.conv2 = torch.nn.Conv2d(8, 16, 3)
            self.pool = torch.nn.AdaptiveAvgPool2d((8, 8))
            self.dropout = torch.nn.Dropout(0.5)
            self.linear1 = torch.nn.Linear(1024, 512)
            self.linear2 = torch.nn.Linear(512, 10)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            x = self.dropout(self.conv1(images.unsqueeze(1)))
            x = F.relu(self.dropout(self.conv2(x)))
            x = self.pool(x).flatten(1)
            return self.linear2(F.relu(self.dropout(self.linear1(x))))

    def torch_batch(chunk):
        pixels = np.stack([item.image for item in chunk]).astype(np.float32)
        images = torch.from_numpy((pixels / 255.0 - MEAN) / STD)
        return images, torch.tensor([item.label for item in chunk])

    torch.manual_seed(42)
    torch_model = TorchGuide().train()
    torch_optimizer = torch.optim.Adam(torch_model.parameters(), lr=1e-4, eps=1e-5)

    def torch_step(images, targets):
        torch_optimizer.zero_grad()
        output = torch_model(images)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        torch_optimizer.step()
        return output, loss

    torch_batches = [torch_batch(chunk) for chunk in chunks]

    def torch_steps(count: int, offset: int = WARMUP) -> None:
        for images, targets in torch_batches[offset : offset + count]:
            torch_step(images, targets)[1].item()

    def torch_loop(count: int, offset: int = WARMUP) -> None:
        for chunk in chunks[offset : offset + count]:
            images, targets = torch_batch(chunk)
            output, loss = torch_step(images, targets)
            loss.item(), (output.argmax(1) == targets).sum().item()

    torch_steps(WARMUP, 0)

    # ---------------------------------------------------------------- ember
    def ember_side(name: str, fusion: bool = False) -> tuple[float, float]:
        """Seconds per iteration of the step and of the learner's run on backend ``name``
        (wrapped in the Fusion decorator with ``fusion``, as ``ember guide train --fusion``)."""
        device = ember.device(name)
        device = (device.fusion() if fusion else device).autodiff()
        ember.seed(device, 42)
        config = default_config()
        model = config.model.init(device)
        optimizer = AdamConfig().init()
        batches = [MnistBatcher().batch(chunk, device) for chunk in chunks]

        def ember_steps(count: int, offset: int = WARMUP) -> None:
            nonlocal model
            for batch in batches[offset : offset + count]:
                output = model.train_step(batch)
                model = optimizer.step(config.learning_rate, model, output.grads)
                output.item.loss.item()

        ember_steps(WARMUP, 0)
        step = per_iteration(lambda: ember_steps(iterations))

        # The learner's run, on the timed iterations' items only (its warm-up is the
        # step's above: the same kernels and caches).
        timed = PartialDataset(mnist, WARMUP * batch_size, (WARMUP + iterations) * batch_size)
        train_loader, _ = make_loaders(config, device, timed, timed)

        def learner_epoch() -> None:
            with tempfile.TemporaryDirectory(prefix="ember-bench-") as artifact_dir:
                learner = (
                    LearnerBuilder(artifact_dir)
                    .metric_train_numeric(AccuracyMetric())
                    .metric_train_numeric(LossMetric())
                    .renderer(PlainRenderer(every=0, stream=io.StringIO()))
                    .num_epochs(1)
                    .build(model, optimizer, config.learning_rate)
                )
                learner.fit(train_loader, None)

        return step, per_iteration(learner_epoch)

    results = {
        "pytorch": (
            per_iteration(lambda: torch_steps(iterations)),
            per_iteration(lambda: torch_loop(iterations)),
        ),
        "ember torch": ember_side("torch"),
        "ember ndarray": ember_side("ndarray"),
        "ember fusion(ndarray)": ember_side("ndarray", fusion=True),
    }

    torch_step_s, torch_whole_s = results["pytorch"]
    for title, index, reference in (
        ("1. training step, data excluded", 0, torch_step_s),
        ("2. whole iteration: data, step, metrics (ember: the Learner)", 1, torch_whole_s),
    ):
        rows = [
            [
                name,
                f"{times[index] * 1e3:.2f}",
                f"{times[index] * EPOCH_ITERATIONS:.1f}",
                f"{times[index] / reference:.2f}x",
            ]
            for name, times in results.items()
        ]
        print_table(
            f"{title} (batch {batch_size}, {args.threads} thread(s), {iterations} iterations)",
            ["side", "ms/iteration", "epoch s (938 it.)", "vs PyTorch"],
            rows,
        )


if __name__ == "__main__":
    main()
