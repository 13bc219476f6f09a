"""Saving and loading a ~25M-parameter model: every ember recorder beside torch.save and safetensors.

Run: ``.venv/bin/python benchmarks/records.py [--params 25] [--repeat 3] [--skip-json]``

The model is 24 square f32 weight matrices with biases (about 25M parameters,
100 MB). Each row is the median wall time of ``--repeat`` runs of save (to a
file, fsync'd by ember's atomic writes; ``torch.save`` does not fsync) and of
load (file to tensors on the device: ember's ``load_file`` into the module,
``torch.load`` into a state dict then ``load_state_dict``), the file size, and
the ratios to ``torch.save`` / ``torch.load``.

ember's load is the hostile-file-safe path: every size in the file is checked
before anything is allocated, the file is read once into one private buffer and
the module's parameters are views of it (``ember.record.content``), and gzip is
inflated in bounded pieces. ``benchmarks/record_bombs.py`` measures the other
side: how fast and how cheaply gzip bombs fail.
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
    parser.add_argument("--skip-json", action="store_true", help="leave out the slow JSON recorders")
    args = parser.parse_args()
    pin_threads(1)

    import numpy as np
    import safetensors.torch as st_torch
    import torch

    import ember
    from ember import Tensor
    from ember import record as rec
    from ember.module import Module, Param

    torch.set_num_threads(1)
    layers = 24
    width = int(math.sqrt(args.params * 1e6 / layers))
    device = ember.device("ndarray")
    rng = np.random.default_rng(0)

    class Layer(Module):
        weight: Param
        bias: Param

    class Stack(Module):
        layers: list

    weights = [(rng.standard_normal((width, width), np.float32), rng.standard_normal(width, np.float32))
               for _ in range(layers)]  # fmt: skip
    model = Stack([Layer(Param(Tensor.from_data(w, device)), Param(Tensor.from_data(b, device))) for w, b in weights])
    reference = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    with torch.no_grad():
        for layer, (w, b) in zip(reference, weights):
            layer.weight.copy_(torch.from_numpy(w))
            layer.bias.copy_(torch.from_numpy(b))
    print(f"model: {layers} layers of {width}x{width} + bias = {model.num_params() / 1e6:.1f}M parameters (f32)")

    folder = Path(tempfile.mkdtemp())
    rows: list[list[str]] = []

    torch_path = folder / "torch.pt"
    torch_save = median_of_runs(lambda: torch.save(reference.state_dict(), torch_path), args.repeat)
    torch_load = median_of_runs(lambda: reference.load_state_dict(torch.load(torch_path)), args.repeat)
    size = torch_path.stat().st_size

    def row(name: str, save: float, load: float, nbytes: int) -> list[str]:
        return [name, f"{save:.3f}", f"{load:.3f}", f"{nbytes / 1e6:.1f}",
                f"{save / torch_save:.2f}", f"{load / torch_load:.2f}"]  # fmt: skip

    rows.append(row("torch.save / torch.load", torch_save, torch_load, size))
    st_path = folder / "torch.safetensors"
    st_save = median_of_runs(lambda: st_torch.save_file(reference.state_dict(), st_path), args.repeat)
    st_load = median_of_runs(lambda: reference.load_state_dict(st_torch.load_file(st_path)), args.repeat)
    rows.append(row("safetensors.torch", st_save, st_load, st_path.stat().st_size))

    recorders = [rec.NamedMpkFileRecorder(), rec.NamedMpkGzFileRecorder(), rec.BinFileRecorder(),
                 rec.BinGzFileRecorder(), rec.CompactRecorder(),
                 rec.NamedMpkFileRecorder(rec.HalfPrecision)]  # fmt: skip
    if not args.skip_json:
        recorders += [rec.JsonGzFileRecorder(), rec.PrettyJsonFileRecorder()]
    for recorder in recorders:
        path = recorder.path_for(folder / "model")
        save = median_of_runs(lambda recorder=recorder: model.save_file(folder / "model", recorder), args.repeat)
        load = median_of_runs(lambda recorder=recorder: model.load_file(folder / "model", recorder), args.repeat)
        rows.append(row(f"ember {type(recorder).__name__} ({recorder.precision.name})", save, load,
                        path.stat().st_size))  # fmt: skip
        path.unlink()

    sf = rec.SafetensorsFileRecorder()
    save = median_of_runs(lambda: sf.save(model, folder / "ember"), args.repeat)
    load = median_of_runs(lambda: model.load_record(sf.load(folder / "ember.safetensors")), args.repeat)
    rows.append(row("ember SafetensorsFileRecorder", save, load, (folder / "ember.safetensors").stat().st_size))
    pt = rec.PyTorchFileRecorder()
    load = median_of_runs(lambda: reference_import(model, pt, torch_path), args.repeat)
    rows.append(row("ember PyTorchFileRecorder (import)", float("nan"), load, size))

    print_table("save / load seconds (median), size in MB, ratio to torch",
                ["format", "save s", "load s", "MB", "save/torch", "load/torch"], rows)


def reference_import(model, recorder, path) -> None:
    # torch names the layers 0.weight ...; the ember model nests them under layers.
    record = recorder.load(recorder_args(path)).with_adapter(None)
    model.load_record(record)


def recorder_args(path):
    from ember.record import LoadArgs

    return LoadArgs(path).with_key_remap(r"^(\d+)\.", r"layers.$1.")


if __name__ == "__main__":
    main()
