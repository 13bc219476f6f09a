"""Quantized linear layers: ember int8 beside ember f32 and PyTorch's dynamic quantization.

Run: ``.venv/bin/python benchmarks/quantization.py [--threads 2] [--repeat 7]``

A linear layer of 4096 x 4096 on batches of 1 and 64 rows, in one run, each side timed
as the median of repeated calls (``--threads`` threads everywhere):

* **torch f32**: ``torch.nn.Linear`` (no grad);
* **torch int8 dynamic**: ``torch.ao.quantization.quantize_dynamic`` of that layer (int8
  weights, one scale per output channel: ``per_channel_dynamic_qconfig``);
* **ember f32 (Torch)**: ``x @ w + b`` on ember's Torch backend;
* **ember int8 (Torch)**: ``ember.quantization.linear`` with the weight quantized int8
  symmetric per output channel: PyTorch's int8 kernel through the op table;
* **ember f32 (NdArray)** and **ember int8 (NdArray)**: the same on NdArray, whose int8
  linear is the default of the op table (dequantize, then matmul), so it is slower than f32
  there;
* **ember int8 static / dynamic**: the input quantized int8 too, by fixed parameters (as a
  calibrated layer does) or one scale per row computed each call (``QuantizeConfig(dynamic=
  True)``), that quantizing included, then integer products: ``torch._int_mm`` on Torch, the
  VNNI kernel (``numba_int8``) on fusion(NdArray);
* **ember f32 / int8 (fusion(NdArray))**: on the JIT runtime, whose int8 linear is a numba
  GEMM that dequantizes the weight while packing it (tuned against the default; the first
  call tunes, and is not timed).

Then the transformer encoder of ``benchmarks/nn_step.py`` (2 layers, d_model 256, 8 heads,
d_ff 1024, no dropout) on ``[8, 128, 256]``, inference: PyTorch f32 and
``quantize_dynamic`` (which quantizes the feed-forward layers: PyTorch's attention keeps its
projections in float; run in train mode, as its eval fast path fails on quantized layers), ember f32 and ember int8 (``model.quantize(QuantizeConfig())``: every
linear layer, attention included) on the Torch backend, ember int8 static (calibrated on
the input itself) and dynamic, and ember f32 / int8 dynamic on fusion(NdArray).

Ratios are each side's time over torch int8 dynamic (lower is faster).

With ``--guide DIR`` (a folder of ``ember guide train``; trained there for 2 epochs if it
holds no model), the guide's model: accuracy on MNIST's full test split and the size of its
record (the default recorder, full precision) in float, int8 weight-only, int4 weight-only
(the linear layers in blocks of 32, the convolutions per channel) and int8 static (inputs
calibrated on 512 training digits).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import median_seconds, pin_threads, print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--guide", metavar="DIR", help="also the guide model's table")
    parser.add_argument("--skip-speed", action="store_true", help="only the guide's table")
    args = parser.parse_args()
    pin_threads(args.threads)
    if not args.skip_speed:
        _linear(args)
        _encoder(args)
    if args.guide:
        _guide(args.guide)


def _linear(args) -> None:
    import numpy as np
    import torch

    import ember
    from ember import Tensor
    from ember.quantization import QuantScheme, linear, quantize
    from ember.quantization.linear import ROWS
    from ember.quantization.qtensor import quantize_with

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = args.size
    layer = torch.nn.Linear(n, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(layer), {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8)  # fmt: skip
    weight = layer.weight.detach().numpy().T.copy()  # ember's [d_input, d_output]
    bias = layer.bias.detach().numpy().copy()
    scheme = QuantScheme(granularity="axis", axis=1)
    sides = {}
    for name in ("torch", "ndarray", "fusion"):
        device = ember.device("ndarray").fusion() if name == "fusion" else ember.device(name)
        w = Tensor.from_data(weight, device)
        sides[name] = (device, w, w.quantize(scheme), Tensor.from_data(bias, device))

    rows = []
    for batch in (1, 64):
        x_host = np.random.default_rng(batch).standard_normal((batch, n)).astype(np.float32)
        xt = torch.from_numpy(x_host)
        times = {}
        with torch.no_grad():
            times["torch f32"] = median_seconds(lambda xt=xt: layer(xt), repeat=args.repeat)
            times["torch int8 dynamic"] = median_seconds(lambda xt=xt: dynamic(xt),
                                                         repeat=args.repeat)  # fmt: skip
        for name, label in (("torch", "Torch"), ("ndarray", "NdArray"),
                            ("fusion", "fusion(NdArray)")):  # fmt: skip
            device, w, q, b = sides[name]
            x = Tensor.from_data(x_host, device)
            linear(x, q, b).to_numpy()  # compiles and tunes where there is something to tune
            (x.matmul(w) + b).to_numpy()
            times[f"ember f32 ({label})"] = median_seconds(
                lambda x=x, w=w, b=b: (x.matmul(w) + b).to_numpy(), repeat=args.repeat)  # fmt: skip
            times[f"ember int8 ({label})"] = median_seconds(
                lambda x=x, q=q, b=b: linear(x, q, b).to_numpy(), repeat=args.repeat)  # fmt: skip
            if name != "ndarray":  # the input quantized too: by fixed parameters, per row
                scale = Tensor.from_data(np.float32(np.abs(x_host).max() / 127), device)

                def static(x=x, q=q, b=b, scale=scale):
                    return linear(quantize_with(x, QuantScheme(), scale, None), q, b).to_numpy()

                def per_row(x=x, q=q, b=b):
                    return linear(quantize(x, ROWS), q, b).to_numpy()

                for side, run in (("static", static), ("dynamic", per_row)):
                    run()
                    times[f"ember int8 {side} ({label})"] = median_seconds(run, repeat=args.repeat)
        base = times["torch int8 dynamic"]
        for side, seconds in times.items():
            rows.append([f"{batch} x {n}", side, f"{seconds * 1e3:.3f}", f"{seconds / base:.2f}x"])
    print_table(f"linear {n} x {n}, {args.threads} thread(s): ms per call",
                ["input", "side", "ms", "x torch int8 dynamic"], rows)  # fmt: skip


def _encoder(args) -> None:
    import numpy as np
    import torch

    import ember
    from ember import Tensor, nn
    from ember.quantization import ActivationConfig, QuantizeConfig

    layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, activation="gelu",
                                             batch_first=True)  # fmt: skip
    reference = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = torch.ao.quantization.quantize_dynamic(reference, {torch.nn.Linear},
                                                         dtype=torch.qint8)  # fmt: skip
    # In eval mode PyTorch's encoder tries its fused fast path, which fails on quantized
    # linear layers (their weight is a method): train mode runs the layer by layer path
    # (dropout is 0, so the numbers are the same).
    dynamic.train()
    x_host = np.random.default_rng(0).standard_normal((8, 128, 256)).astype(np.float32)
    xt = torch.from_numpy(x_host)
    device = ember.device("torch")
    model = nn.TransformerEncoderConfig(256, 1024, 8, 2, dropout=0.0).init(device)
    quantized = model.quantize(QuantizeConfig())
    static = model.quantize(QuantizeConfig(activations=ActivationConfig()),
                            [nn.TransformerEncoderInput(Tensor.from_data(x_host, device))])  # fmt: skip
    dynamic_rows = model.quantize(QuantizeConfig(dynamic=True))
    x = nn.TransformerEncoderInput(Tensor.from_data(x_host, device))
    times = {}
    with torch.no_grad():
        times["torch f32"] = median_seconds(lambda: reference(xt), repeat=args.repeat)
        times["torch int8 dynamic"] = median_seconds(lambda: dynamic(xt), repeat=args.repeat)
    times["ember f32 (Torch)"] = median_seconds(lambda: model(x).to_numpy(), repeat=args.repeat)
    times["ember int8 (Torch)"] = median_seconds(lambda: quantized(x).to_numpy(), repeat=args.repeat)
    times["ember int8 static (Torch)"] = median_seconds(lambda: static(x).to_numpy(),
                                                        repeat=args.repeat)  # fmt: skip
    times["ember int8 dynamic (Torch)"] = median_seconds(lambda: dynamic_rows(x).to_numpy(),
                                                         repeat=args.repeat)  # fmt: skip
    fusion = ember.device("ndarray").fusion()
    on_fusion = {"f32": model.to_device(fusion), "int8 dynamic": dynamic_rows.to_device(fusion)}
    xf = nn.TransformerEncoderInput(Tensor.from_data(x_host, fusion))
    for side, m in on_fusion.items():
        m(xf).to_numpy()  # compiles and tunes
        times[f"ember {side} (fusion(NdArray))"] = median_seconds(lambda m=m: m(xf).to_numpy(),
                                                                  repeat=args.repeat)  # fmt: skip
    base = times["torch int8 dynamic"]
    rows = [[side, f"{seconds * 1e3:.2f}", f"{seconds / base:.2f}x"] for side, seconds in times.items()]
    print_table(f"transformer encoder inference [8, 128, 256], {args.threads} thread(s): ms",
                ["side", "ms", "x torch int8 dynamic"], rows)  # fmt: skip


def _guide(folder: str) -> None:
    import subprocess
    import tempfile

    import ember
    from ember.data.vision.mnist import MnistDataset
    from ember.guide.inference import QUANTIZE_CHOICES, load_trained, predict, quantized

    if not (Path(folder) / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "ember", "guide", "train", "--epochs", "2",
                        "--artifact-dir", folder, "--renderer", "plain"], check=True)  # fmt: skip
    device = ember.device("ndarray")
    _, model = load_trained(folder, device)
    test = MnistDataset.test()
    items = [test[i] for i in range(len(test))]
    labels = [item.label for item in items]

    def predictions(m) -> list[int]:
        return [p for start in range(0, len(items), 1000)
                for p in predict(m, items[start : start + 1000], device)]  # fmt: skip

    exact = predictions(model)
    rows, float_size = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("f32", *QUANTIZE_CHOICES):
            m = model if variant == "f32" else quantized(model, variant, device)
            got = exact if variant == "f32" else predictions(m)
            size = m.save_file(Path(tmp) / variant).stat().st_size
            float_size = float_size or size
            correct = sum(p == e for p, e in zip(got, labels))
            changed = sum(p != q for p, q in zip(got, exact))
            rows.append([variant, f"{100 * correct / len(labels):.2f}%", str(changed),
                         f"{size:,}", f"{float_size / size:.2f}x"])  # fmt: skip
    print_table("the guide's model on MNIST's test split (10,000 digits)",
                ["model", "accuracy", "predictions changed", "record bytes", "smaller"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
