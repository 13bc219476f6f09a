"""Prepares the digit page: the guide's model as ONNX, test digits as JSON, onnxruntime-web.

    python examples/web/build.py [--artifact-dir /tmp/guide] [--epochs 1] [--digits 24]

Writes, beside ``index.html`` (or into ``--site``):

- ``guide.onnx``: the trained guide model of ``--artifact-dir`` (input ``images``
  ``[batch, 28, 28]``, output ``logits`` ``[batch, 10]``, as ``ember onnx export guide``);
  when the folder holds no trained model, trains one first for ``--epochs`` epochs;
- ``digits.json``: the first ``--digits`` MNIST test digits (raw 0-255 pixels and labels)
  and the guide's normalization (``MEAN`` and ``STD`` of :mod:`ember.guide.data`), so the
  page normalizes exactly as the guide's batcher does;
- ``vendor/``: onnxruntime-web from the npm registry (``vendor.sh``; skip with ``--no-vendor``).

Then serve the folder: ``python -m http.server -d examples/web 8000`` and open
http://localhost:8000/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import ember
from ember.atomic import atomic_write
from ember.data.vision.mnist import MnistDataset
from ember.guide.data import MEAN, STD
from ember.guide.inference import NoTrainedModelError, load_trained
from ember.guide.training import default_config, train
from ember.onnx.cli import export_guide
from ember.train.renderer.plain import PlainRenderer

HERE = Path(__file__).resolve().parent

PAGE_FILES = ("index.html", "app.js", "digits.js", "style.css")
"""The page's own files (what a copy of the page needs besides the built ones and vendor/)."""

MODEL_FILE = "guide.onnx"
DIGITS_FILE = "digits.json"


def ensure_trained(artifact_dir: Path, epochs: int) -> None:
    """Trains the guide's model into ``artifact_dir`` unless it already holds a trained one."""
    try:
        load_trained(artifact_dir, ember.device("ndarray"))
        print(f"reusing the trained model in {artifact_dir}")
    except NoTrainedModelError:
        print(f"no trained model in {artifact_dir}: training one ({epochs} epoch(s) on MNIST)")
        config = default_config().with_num_epochs(epochs)
        train(artifact_dir, config, ember.device("ndarray"), renderer=PlainRenderer())


def write_digits(path: Path, count: int) -> list[dict]:
    """Writes the first ``count`` MNIST test digits and the guide's normalization as JSON;
    returns the digits (``index``, ``label``, ``pixels``: 784 ints, row by row)."""
    test = MnistDataset.test()
    digits = [
        {"index": i, "label": test[i].label, "pixels": test[i].image.reshape(-1).tolist()}
        for i in range(count)
    ]
    document = {"normalization": {"mean": MEAN, "std": STD}, "size": 28, "digits": digits}
    atomic_write(path, json.dumps(document, separators=(",", ":")).encode("utf-8"))
    return digits


def vendor() -> None:
    """Installs onnxruntime-web into ``vendor/`` (once; see ``vendor.sh``)."""
    subprocess.run(["bash", str(HERE / "vendor.sh")], check=True)


def build(site: Path, artifact_dir: Path, *, epochs: int = 1, count: int = 24) -> None:
    """Writes ``guide.onnx`` and ``digits.json`` into ``site`` (training first if needed)."""
    ensure_trained(artifact_dir, epochs)
    export_guide(artifact_dir, site / MODEL_FILE, opset=17, dynamic_batch=True)
    print(f"wrote {site / MODEL_FILE}")
    write_digits(site / DIGITS_FILE, count)
    print(f"wrote {site / DIGITS_FILE} ({count} test digits)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact-dir", type=Path, default=Path("/tmp/guide"),
                        help="the guide's artifact folder (default: /tmp/guide, as "
                             "`ember guide train`)")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs to train when the folder has no trained model (default: 1)")  # fmt: skip
    parser.add_argument("--digits", type=int, default=24,
                        help="how many test digits the page offers (default: 24)")  # fmt: skip
    parser.add_argument("--site", type=Path, default=HERE,
                        help="where to write guide.onnx and digits.json (default: beside index.html)")  # fmt: skip
    parser.add_argument("--no-vendor", action="store_true", help="do not run vendor.sh")
    args = parser.parse_args()
    if args.epochs < 1 or not 1 <= args.digits <= 10_000:
        parser.error(
            "--epochs must be at least 1 and --digits from 1 to 10000 (MNIST's test split)"
        )
    build(args.site, args.artifact_dir, epochs=args.epochs, count=args.digits)
    if not args.no_vendor:
        vendor()
    print(f"serve it: python -m http.server -d {args.site} 8000, then open http://localhost:8000/")


if __name__ == "__main__":
    main()
