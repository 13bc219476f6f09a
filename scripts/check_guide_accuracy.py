"""Trains the guide with its default settings and checks its test accuracy (>= 98%).

Run: ``.venv/bin/python scripts/check_guide_accuracy.py [--artifact-dir DIR] [--backend torch]``

The run is ``ember guide train`` with the plain renderer: 10 epochs of the guide's CNN
on MNIST's 60 000 training digits, batches of 64, Adam at 1e-4, seed 42. The trained
model is then read back from the artifact folder (as ``ember guide infer`` reads it,
half-precision weights included) and classifies the 10 000 test digits. The script
prints the accuracy and the time per epoch (training and validation), and exits with
status 1 when the accuracy is below the threshold.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import ember
from ember.data.vision.mnist import MnistDataset
from ember.guide.inference import load_trained, predict
from ember.guide.training import default_config, train
from ember.train.renderer.plain import PlainRenderer

THRESHOLD = 98.0
"""The issue's bar: the guide's default run reaches at least this test accuracy, in percent."""


def test_accuracy(artifact_dir: str, device: ember.Device, batch_size: int = 1000) -> float:
    """The accuracy, in percent, of the saved model on MNIST's test digits."""
    _, model = load_trained(artifact_dir, device)
    test = MnistDataset.test()
    correct = 0
    for start in range(0, len(test), batch_size):
        items = [test[i] for i in range(start, min(start + batch_size, len(test)))]
        predicted = predict(model, items, device.inner())
        correct += sum(p == item.label for p, item in zip(predicted, items))
    return 100.0 * correct / len(test)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact-dir", help="where the run's files go (default: a temp folder)")
    parser.add_argument("--backend", choices=("ndarray", "torch"), default="ndarray")
    parser.add_argument("--device", default="cpu", help="cpu, cuda:0, ... (default: cpu)")
    args = parser.parse_args()

    artifact_dir = args.artifact_dir or tempfile.mkdtemp(prefix="ember-guide-")
    device = ember.device(args.backend, args.device)
    config = default_config()
    print(f"training the guide on {device} for {config.num_epochs} epochs, in {artifact_dir}")

    start = time.perf_counter()
    train(artifact_dir, config, device, renderer=PlainRenderer(every=200))
    per_epoch = (time.perf_counter() - start) / config.num_epochs

    accuracy = test_accuracy(artifact_dir, device)
    verdict = "passes" if accuracy >= THRESHOLD else "FAILS"
    print(
        f"test accuracy {accuracy:.2f}% ({verdict} the {THRESHOLD:.0f}% bar); "
        f"{per_epoch:.1f} s per epoch (training and validation) on {device}"
    )
    return 0 if accuracy >= THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
