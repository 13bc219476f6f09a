"""Importing a ~25M-parameter state dict: ember's readers beside torch.load, in the same run.

Run: ``.venv/bin/python benchmarks/weights_import.py [--params 25] [--repeat 3]``

The weights are 24 square f32 matrices with biases (about 25M parameters,
100 MB), saved once by ``torch.save`` (zip and legacy layouts) and once by
``safetensors.torch.save_file``. Each row is the median wall time of
``--repeat`` reads of the file into host tensors (a state dict of torch
tensors, or ember's ``TensorData`` by name) with the file in the page cache,
and its ratio to ``torch.load`` of the zip file. ember's readers validate the
file and copy it once (into one buffer); none keeps the file mapped. The
safetensors library's default ``mmap`` backend copies nothing up front: its
tensors read the mapped file, so they change when the file is overwritten in
place and the process dies (SIGBUS) when it is truncated; its ``pread``
backend copies like ember. Timings on a busy machine are noisy: compare
ratios from one run only.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import median_of_runs, pin_threads, print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", type=float, default=25.0, help="millions of parameters")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pin_threads(1)

    import safetensors.torch as st_torch
    import torch

    from ember.record import PyTorchFileRecorder, SafetensorsFileRecorder
    from ember.record.pytorch import read_pytorch
    from ember.record.safetensors import read_safetensors

    torch.set_num_threads(1)
    layers = 24
    width = int(math.sqrt(args.params * 1e6 / layers))
    generator = torch.Generator().manual_seed(0)
    state = {}
    for i in range(layers):
        state[f"{i}.weight"] = torch.randn(width, width, generator=generator)
        state[f"{i}.bias"] = torch.randn(width, generator=generator)
    params = sum(t.numel() for t in state.values())
    print(f"weights: {layers} matrices of {width}x{width} + bias = {params / 1e6:.1f}M "
          "parameters (f32)")

    folder = Path(tempfile.mkdtemp())
    zip_path, legacy_path, st_path = folder / "w.pt", folder / "legacy.pt", folder / "w.safetensors"
    torch.save(state, zip_path)
    torch.save(state, legacy_path, _use_new_zipfile_serialization=False)
    st_torch.save_file(state, st_path)

    cases = [
        ("torch.load (zip)", lambda: torch.load(zip_path)),
        ("torch.load (legacy)", lambda: torch.load(legacy_path, weights_only=False)),
        ("safetensors.torch.load_file (pread)",
         lambda: st_torch.load_file(st_path, backend="pread")),
        ("safetensors.torch.load_file (mmap, lazy)", lambda: st_torch.load_file(st_path)),
        ("ember read_safetensors", lambda: read_safetensors(st_path)),
        ("ember read_pytorch (zip)", lambda: read_pytorch(zip_path)),
        ("ember read_pytorch (legacy)", lambda: read_pytorch(legacy_path)),
        ("ember PyTorchFileRecorder().load (zip)", lambda: PyTorchFileRecorder().load(zip_path)),
        ("ember SafetensorsFileRecorder().load", lambda: SafetensorsFileRecorder().load(st_path)),
    ]
    seconds = {name: median_of_runs(fn, args.repeat, warm_up=True) for name, fn in cases}
    baseline = seconds["torch.load (zip)"]
    rows = [[name, f"{s * 1e3:.1f}", f"{s / baseline:.2f}"] for name, s in seconds.items()]
    print_table(f"read seconds (median of {args.repeat}), ratio to torch.load (zip)",
                ["reader", "ms", "ratio"], rows)  # fmt: skip
    for path in (zip_path, legacy_path, st_path):
        path.unlink()
    folder.rmdir()


if __name__ == "__main__":
    main()
