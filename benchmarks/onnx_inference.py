"""Inference of imported ONNX models: ember (NdArray, fusion(NdArray), Torch) vs onnxruntime.

Run: ``.venv/bin/python benchmarks/onnx_inference.py [--threads 1] [--batch 8] [--seq 128]``

Two PyTorch models are exported to ONNX (TorchScript exporter, opset 17, dynamic
batch) and imported with ``ember.onnx.import_onnx``:

1. **cnn**: a small ResNet-like network on 3x32x32 images (a conv stem, two residual
   stages of two basic blocks each, the second one strided, global average pooling, a
   linear classifier). It is exported in eval mode, so batch norms are folded into the
   convolutions, as deployment exports usually are.
2. **encoder**: ``torch.nn.TransformerEncoder`` of 2 layers (d_model 256, 4 heads,
   feed-forward 1024, no dropout, batch first) on sequences of ``--seq`` tokens.

ember runs each model on ``ndarray``, on ``fusion(ndarray)`` (ops recorded lazily,
element-wise chains run as fused numba kernels; the checking calls compile them, so
compilation is not timed) and on ``torch``. On a fusion device a call of an imported
model replays from its third call on (``ember.onnx.imported``: the traced ops pushed
without the Python that made them); the row "recorded" calls ``model.forward`` instead,
every op recorded through the Tensor API each call. Each side runs the forward pass on the CPU
with ``--threads`` threads (NumPy's BLAS, torch and fused kernels through the environment
and ``torch.set_num_threads``; onnxruntime through ``SessionOptions.intra_op_num_threads``,
with one inter-op thread). Outputs are checked against onnxruntime's before timing; each
timed ember call reads its output (``to_numpy``), which on a fusion device runs the
recorded stream, so the lazy work is timed. The sides' calls alternate, one of each per
round (``timing.interleaved_seconds``, ``--rounds``); the table gives each side's median
wall time and median CPU time of the calling thread (the steadier figure on a shared host
at one thread, where every runtime works on the calling thread), each with its ratio to
onnxruntime (lower is better; 1.0 is parity), and PyTorch eager for reference.

At more than one thread, onnxruntime's pool does not spin between calls in the
alternating rounds (``session.intra_op.allow_spinning`` 0): its spinning threads held a
core long after each call and slowed whichever side came next (PyTorch eager's CNN
forward at two threads: 45 ms, against 16 ms with onnxruntime's spinning off). Its
spinning session is then timed alone, in a block of calls after the rounds, on a row of
its own ("onnxruntime, spinning, alone"), so its best figure is in the table too.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved_seconds, pin_threads, print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    pin_threads(args.threads, alternating=True)

    import numpy as np
    import onnxruntime as ort
    import torch

    import ember
    from ember.onnx import import_onnx, load_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(cout)
            self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = torch.nn.BatchNorm2d(cout)
            self.skip = torch.nn.Sequential()
            if stride != 1 or cin != cout:
                self.skip = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(cout))  # fmt: skip

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))

    class ResNetLike(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, 1, 1, bias=False),
                                            torch.nn.BatchNorm2d(32), torch.nn.ReLU())  # fmt: skip
            self.stages = torch.nn.Sequential(Block(32, 32, 1), Block(32, 32, 1),
                                              Block(32, 64, 2), Block(64, 64, 1))  # fmt: skip
            self.fc = torch.nn.Linear(64, 10)

        def forward(self, x):
            x = self.stages(self.stem(x))
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, x):
            # An explicit is_causal: left to its default, torch's tracer fails on it.
            return self.encoder(x, is_causal=False)

    rng = np.random.default_rng(0)
    models = {
        "cnn": (ResNetLike(), rng.standard_normal((args.batch, 3, 32, 32)).astype(np.float32)),
        "encoder": (Encoder(), rng.standard_normal((args.batch, args.seq, 256)).astype(np.float32)),
    }
    def session_options(spinning: bool) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return options

    spinning = args.threads == 1  # one thread: no pool to spin (see the module doc)
    devices = {
        "ember NdArray": ember.device("ndarray"),
        "ember fusion(NdArray)": ember.device("ndarray").fusion(),
        "ember fusion(NdArray), recorded": ember.device("ndarray").fusion(),
        "ember Torch": ember.device("torch"),
    }

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (net, x) in models.items():
            net.eval()
            buffer = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(net, (torch.from_numpy(x),), buffer, dynamo=False,
                                  opset_version=17, input_names=["x"], output_names=["y"],
                                  dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})  # fmt: skip
            data = buffer.getvalue()
            import_onnx(data, Path(tmp) / name, name=name)
            session = ort.InferenceSession(data, session_options(spinning),
                                           providers=["CPUExecutionProvider"])  # fmt: skip
            expected = session.run(None, {"x": x})[0]
            feeds = {"x": x}
            calls = {"onnxruntime": lambda s=session, f=feeds: s.run(None, f)}
            xt = torch.from_numpy(x)

            def torch_forward(net=net, xt=xt):
                with torch.no_grad():
                    return net(xt)

            calls["PyTorch eager"] = torch_forward
            for side, device in devices.items():
                model = load_model(Path(tmp) / name, device, name=name)
                inputs = ember.Tensor.from_data(x, device)
                call = model.forward if side.endswith("recorded") else model
                for _ in range(3):  # on fusion: warm-up, trace, replay
                    got = call(inputs).to_numpy()
                    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4,
                                               err_msg=f"{name} on {side}")  # fmt: skip
                # to_numpy waits for the result, as session.run does (and on a fusion
                # device runs the recorded stream, so the lazy work is timed).
                calls[side] = lambda m=call, i=inputs: m(i).to_numpy()
            times = interleaved_seconds(calls, args.rounds)
            if not spinning:
                alone = ort.InferenceSession(data, session_options(True),
                                             providers=["CPUExecutionProvider"])  # fmt: skip
                times["onnxruntime, spinning, alone"] = interleaved_seconds(
                    {"alone": lambda s=alone, f=feeds: s.run(None, f)}, args.rounds)["alone"]  # fmt: skip
            base, base_cpu = times["onnxruntime"]
            shape = "x".join(map(str, x.shape))
            for side, (seconds, cpu) in times.items():
                rows.append([name, shape, side, f"{seconds * 1e3:.2f}", f"{seconds / base:.2f}",
                             f"{cpu * 1e3:.2f}", f"{cpu / base_cpu:.2f}"])  # fmt: skip

    print_table(f"ONNX model inference, CPU, {args.threads} thread(s)",
                ["model", "input", "runtime", "ms / forward", "x onnxruntime", "thread CPU ms",
                 "x onnxruntime"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
