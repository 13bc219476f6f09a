"""Data loading with a CPU-heavy per-item transform: ember's loader with no worker, thread
workers and process workers, beside PyTorch's DataLoader doing the same work.

Run: ``.venv/bin/python benchmarks/dataloader.py [--items 384] [--size 64] [--batch 32]
[--repeat 5] [--mnist]``

Each item is a PNG image (RGB, 64x64, every row Paeth-filtered) made by a small encoder
here. The per-item transform decodes it (zlib, then the Paeth unfilter, which is a
byte-by-byte Python loop: it holds the GIL, as much decoding and augmentation code does),
then augments it with NumPy (a random crop after padding and a random flip, seeded by
the item's index so every side makes the same batch) and normalizes it to float32. The
batch stacks the images (``[batch, 3, 64, 64]``) and the labels.

Sides, each over the same items in the same order (checked before timing):

* ember: 0 workers; 1, 2 and 4 thread workers; 1, 2 and 4 process workers (persistent);
* PyTorch: ``DataLoader(num_workers=0, 1, 2, 4)`` (processes, persistent), the same
  dataset and collate function making torch tensors.

``--mnist`` adds a light workload: MNIST's training set through the guide's batcher
(stacking and normalizing 64 images of 28x28: about 0.13 ms per batch), ember with 0
workers, 2 threads and 2 processes, PyTorch with 0 and 2 processes.

Times per side, in seconds per epoch: the first epoch (it includes starting the worker
processes), then the median and the best of ``--repeat`` later epochs, run in rounds that
interleave the sides so that a busy machine disturbs all of them alike (on a shared
machine the best epoch is the closer estimate of what the code costs). The ratios are
ember's 0-worker epoch over each side's (the speed-up: higher is faster), and ember's
process workers over PyTorch's with as many workers (lower is faster; 1.0 is parity).
On a machine shared with other work, more runnable threads or processes also win a
larger share of the cores, so wall times flatter every side with more workers; the CPU
columns depend far less on the load. Per epoch (medians): ``main CPU``, the CPU seconds
of the loader's process (what the training loop loses to data loading; with threads it
includes theirs); ``all CPU``, those of the loader's process and its worker processes
together (the work plus each side's overhead); ``busiest CPU``, those of the busiest
single process, the epoch's length where every process has a core of its own (threads
share their process's, and the GIL serializes their Python work).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import struct
import sys
import time
import warnings
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import pin_threads, print_table

PAD = 4


# ---------------------------------------------------------------------------- PNG
def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def encode_png(image) -> bytes:
    """A PNG file of an ``[height, width, 3]`` uint8 image, every row Paeth-filtered."""
    import numpy as np

    height, width, _ = image.shape
    raw = image.reshape(height, width * 3).astype(np.int16)
    left = np.zeros_like(raw)
    left[:, 3:] = raw[:, :-3]
    up = np.zeros_like(raw)
    up[1:] = raw[:-1]
    corner = np.zeros_like(raw)
    corner[1:, 3:] = raw[:-1, :-3]
    p = left + up - corner
    pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - corner)
    predicted = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, corner))
    filtered = ((raw - predicted) % 256).astype(np.uint8)
    rows = np.concatenate([np.full((height, 1), 4, np.uint8), filtered], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + chunk(b"IEND", b""))  # fmt: skip


def decode_png(data: bytes):
    """The ``[height, width, 3]`` uint8 image of a PNG made by :func:`encode_png`."""
    import numpy as np

    width, height = struct.unpack(">II", data[16:24])
    length = struct.unpack(">I", data[33:37])[0]
    rows = zlib.decompress(data[41 : 41 + length])
    stride = width * 3
    out = bytearray(height * stride)
    for y in range(height):
        line = rows[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]
        base, above = y * stride, (y - 1) * stride
        for x in range(stride):
            a = out[base + x - 3] if x >= 3 else 0
            b = out[above + x] if y else 0
            c = out[above + x - 3] if y and x >= 3 else 0
            out[base + x] = (line[x] + _paeth(a, b, c)) & 0xFF
    return np.frombuffer(bytes(out), np.uint8).reshape(height, width, 3)


# ---------------------------------------------------------------------------- the work
class PngImages:
    """``count`` PNG-encoded random images with labels; ``dataset[i]`` decodes and augments."""

    def __init__(self, count: int, size: int) -> None:
        import numpy as np

        rng = np.random.default_rng(0)
        self.size = size
        self.files = [encode_png(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
                      for _ in range(count)]  # fmt: skip
        self.labels = rng.integers(0, 10, count).tolist()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        import numpy as np

        image = decode_png(self.files[index])
        rng = np.random.default_rng(index)  # the same augmentation on every side
        padded = np.pad(image, ((PAD, PAD), (PAD, PAD), (0, 0)), mode="reflect")
        top, left = rng.integers(0, 2 * PAD + 1, 2)
        crop = padded[top : top + self.size, left : left + self.size]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        chw = crop.transpose(2, 0, 1).astype(np.float32) / 255.0
        return (chw - 0.5) / 0.25, self.labels[index]


def stack(items):
    import numpy as np

    images = np.stack([image for image, _ in items])
    labels = np.array([label for _, label in items], np.int64)
    return images, labels


def make_ember_batcher():
    from ember import Tensor
    from ember.data.dataloader import Batcher

    class ImageBatcher(Batcher):
        def batch(self, items, device):
            images, labels = stack(items)
            return Tensor.from_data(images, device), Tensor.from_data(labels, device)

    return ImageBatcher()


class TorchDataset:
    """The same items for PyTorch (its DataLoader needs only ``len`` and ``[i]``)."""

    def __init__(self, images: PngImages) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.images[index]


def torch_collate(items):
    import torch

    images, labels = stack(items)
    return torch.from_numpy(images), torch.from_numpy(labels)


# ---------------------------------------------------------------------------- the sides
def children_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) used so far by each live child process of this one (the
    worker processes of every side), by process id (Linux ``/proc``; empty elsewhere)."""
    seconds, me, tick = {}, str(os.getpid()), os.sysconf("SC_CLK_TCK")
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:  # the parent's pid; utime and stime follow at 11 and 12
            seconds[int(stat.split("/")[2])] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


def as_arrays(batch) -> tuple:
    """A batch of any side as its (images, labels) NumPy arrays."""
    images, labels = (batch.images, batch.targets) if hasattr(batch, "targets") else batch
    if hasattr(images, "into_primitive"):  # ember Tensors on NdArray
        return images.into_primitive(), labels.into_primitive()
    return images.numpy(), labels.numpy()


def compare(title: str, sides: dict, repeat: int) -> None:
    """Times an epoch of every side (after a first, checked one) and prints the table."""
    import numpy as np

    def epoch(loader) -> list:
        return [as_arrays(batch) for batch in loader]

    # First epochs: the worker processes start; every side's batches are checked.
    first, reference = {}, None
    for name, loader in sides.items():
        start = time.perf_counter()
        batches = epoch(loader)
        first[name] = time.perf_counter() - start
        if reference is None:
            reference = batches
        assert len(batches) == len(reference), name
        for (got_x, got_y), (want_x, want_y) in zip(batches, reference):
            np.testing.assert_array_equal(got_x, want_x, err_msg=name)
            np.testing.assert_array_equal(got_y, want_y, err_msg=name)

    steady: dict[str, list[float]] = {name: [] for name in sides}
    main_cpu: dict[str, list[float]] = {name: [] for name in sides}
    total_cpu: dict[str, list[float]] = {name: [] for name in sides}
    busiest_cpu: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeat):
        for name, loader in sides.items():
            before = children_cpu_seconds()
            cpu = time.process_time()
            start = time.perf_counter()
            for _batch in loader:
                pass
            steady[name].append(time.perf_counter() - start)
            main_cpu[name].append(time.process_time() - cpu)
            after = children_cpu_seconds()
            workers = [after[pid] - before.get(pid, 0.0) for pid in after]
            total_cpu[name].append(main_cpu[name][-1] + sum(workers))
            busiest_cpu[name].append(max([main_cpu[name][-1], *workers]))
    for loader in sides.values():
        if hasattr(loader, "close"):
            loader.close()

    base = statistics.median(steady["ember, 0 workers"])
    best_base = min(steady["ember, 0 workers"])
    rows = []
    for name in sides:
        median, best = statistics.median(steady[name]), min(steady[name])
        versus = ""
        torch_name = name.replace("ember", "PyTorch")
        if name.startswith("ember") and "process" in name and torch_name in sides:
            versus = (f"{median / statistics.median(steady[torch_name]):.2f} / "
                      f"{best / min(steady[torch_name]):.2f}")  # fmt: skip
        rows.append([name, f"{first[name]:.3f}", f"{median:.3f}", f"{best:.3f}",
                     f"{base / median:.2f}x / {best_base / best:.2f}x", versus,
                     f"{statistics.median(main_cpu[name]):.3f}",
                     f"{statistics.median(total_cpu[name]):.3f}",
                     f"{statistics.median(busiest_cpu[name]):.3f}"])  # fmt: skip
    print_table(
        title,
        [
            "side",
            "first epoch",
            "median epoch",
            "best epoch",
            "speed-up vs ember 0 (median / best)",
            "ember / PyTorch (median / best)",
            "main CPU s",
            "all CPU s",
            "busiest CPU s",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=384)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--mnist", action="store_true",
                        help="also the guide's MNIST batcher (light work per batch)")  # fmt: skip
    args = parser.parse_args()
    pin_threads(1)

    import torch

    import ember
    from ember.data.dataloader import DataLoaderBuilder

    torch.set_num_threads(1)
    # PyTorch warns when workers outnumber the cores; the 4-worker rows measure exactly that.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    device = ember.device("ndarray")

    def ember_loader(dataset, batcher, batch_size: int, workers: int, kind: str):
        builder = DataLoaderBuilder(batcher).batch_size(batch_size).set_device(device)
        if kind == "process":
            return builder.num_workers(workers, "process", persistent=True).build(dataset)
        return builder.num_workers(workers).build(dataset)

    def torch_loader(dataset, collate, batch_size: int, workers: int):
        return torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, collate_fn=collate, num_workers=workers,
            persistent_workers=workers > 0)  # fmt: skip

    def sides_of(dataset, batcher, collate, batch_size: int, workers: list[int]) -> dict:
        sides = {"ember, 0 workers": ember_loader(dataset, batcher, batch_size, 0, "thread")}
        for k in workers:
            sides[f"ember, {k} thread{'s' * (k > 1)}"] = ember_loader(
                dataset, batcher, batch_size, k, "thread")  # fmt: skip
        for k in workers:
            sides[f"ember, {k} process{'es' * (k > 1)}"] = ember_loader(
                dataset, batcher, batch_size, k, "process")  # fmt: skip
        sides["PyTorch, 0 workers"] = torch_loader(dataset, collate, batch_size, 0)
        for k in workers:
            sides[f"PyTorch, {k} process{'es' * (k > 1)}"] = torch_loader(
                dataset, collate, batch_size, k)  # fmt: skip
        return sides

    images = PngImages(args.items, args.size)
    sides = sides_of(TorchDataset(images), make_ember_batcher(), torch_collate, args.batch,
                     args.workers)  # fmt: skip
    start = time.perf_counter()
    for _ in range(3):
        images[0]
    per_item = (time.perf_counter() - start) / 3 * 1e3
    compare(
        f"{args.items} PNG images ({args.size}x{args.size} RGB, decode + augment, "
        f"{per_item:.2f} ms per item), batches of {args.batch}; seconds per epoch",
        sides,
        args.repeat,
    )
    if args.mnist:
        from ember.data.vision.mnist import MnistDataset
        from ember.guide.data import MnistBatcher

        mnist = MnistDataset.train()
        sides = sides_of(mnist, MnistBatcher(), mnist_collate, 64, [2])
        compare(
            f"MNIST train ({len(mnist)} items), the guide's batcher, batches of 64; "
            "seconds per epoch",
            sides,
            args.repeat,
        )


def mnist_collate(items):
    """The guide's MnistBatcher for PyTorch: the same normalization, torch tensors."""
    import numpy as np
    import torch

    from ember.guide.data import MEAN, STD

    pixels = np.stack([item.image for item in items]).astype(np.float32)
    images = (pixels / 255.0 - MEAN) / STD
    labels = np.array([item.label for item in items], dtype=np.int64)
    return torch.from_numpy(images), torch.from_numpy(labels)


if __name__ == "__main__":
    main()
