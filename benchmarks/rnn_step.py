"""Training steps of recurrent layers: ember's whole-sequence ops beside PyTorch, same weights.

Run: ``.venv/bin/python benchmarks/rnn_step.py [--threads 1] [--repeat 5] [--cuda]``

An LSTM and a GRU, d_input 256, d_hidden 256, batch first, input ``[16, 128, 256]``, and a
bidirectional LSTM of half the width (d_hidden 128). Each row is the median time of one
step: the forward pass, ``sum()`` of the output sequence, and the backward pass to every
parameter and the input:

* ``torch autograd``: ``nn.LSTM`` / ``nn.GRU`` (oneDNN's fused LSTM on the CPU, aten's
  per-step GRU cell; cuDNN on CUDA);
* ``ember ... sequence op``: the layers as they run now, the time loop one op
  (``lstm_sequence`` / ``gru_sequence``, see ``ember.nn.rnn_sequence``);
* ``ember ... cell scan``: the same layers on the per-step fused cell ops scanned in Python
  (``ember.nn.rnn._SEQUENCE_OPS = False``), what they ran before.

ember's layers load the PyTorch modules' weights through the PyTorch adapter; before
timing, each ember row's output and input gradient are checked against PyTorch's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import pin_threads, print_table

BATCH, SEQ, D = 16, 128, 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cuda", action="store_true", help="also time the steps on a CUDA GPU")
    args = parser.parse_args()
    pin_threads(args.threads, alternating=True)  # the rows are timed call by call

    import numpy as np
    import torch

    import ember
    from ember import Tensor, TensorData
    from ember.nn import BiLstmConfig, GruConfig, LstmConfig, rnn
    from ember.record import ImportedRecord
    from ember.record.adapter import PYTORCH

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x_host = np.random.default_rng(0).standard_normal((BATCH, SEQ, D), dtype=np.float32)

    models = {
        f"LSTM ({D} -> {D}, seq {SEQ}, batch {BATCH})": (
            torch.nn.LSTM(D, D, batch_first=True), lambda: LstmConfig(D, D)),
        f"GRU ({D} -> {D}, seq {SEQ}, batch {BATCH})": (
            torch.nn.GRU(D, D, batch_first=True), lambda: GruConfig(D, D)),
        f"BiLSTM ({D} -> 2 x {D // 2}, seq {SEQ}, batch {BATCH})": (
            torch.nn.LSTM(D, D // 2, batch_first=True, bidirectional=True),
            lambda: BiLstmConfig(D, D // 2)),
    }  # fmt: skip

    def torch_step(module: torch.nn.Module, where: str):
        module = module.to(where)
        params = list(module.parameters())
        x = torch.from_numpy(x_host).to(where).requires_grad_(True)
        sync = torch.cuda.synchronize if where == "cuda" else (lambda: None)

        def step():
            grads = torch.autograd.grad(module(x)[0].sum(), [x, *params])
            sync()
            return grads

        return step

    def ember_step(reference: torch.nn.Module, config, device: ember.Device, sequence_ops: bool):
        state = {k: TensorData(v.detach().cpu().numpy()) for k, v in reference.state_dict().items()}
        model = config().init(device).load_record(ImportedRecord(state, adapter=PYTORCH))
        params = [p.val() for _, p in model.params()]
        x = Tensor.from_data(x_host, device).require_grad()

        def step():
            rnn._SEQUENCE_OPS = sequence_ops
            try:
                out = model(x)[0]
                grads = out.sum().backward()
                result = [out, *(t.grad(grads) for t in (x, *params))]
            finally:
                rnn._SEQUENCE_OPS = True
            device.sync()
            return result

        return step

    places = [("cpu", "cpu", ember.device("torch"))]
    if args.cuda:
        if not torch.cuda.is_available():
            raise SystemExit("--cuda: torch sees no CUDA device")
        places.append(("cuda", "cuda", ember.device("torch", "cuda:0")))

    print(f"threads={args.threads}  torch={torch.__version__}")
    for title, (reference, config) in models.items():
        rows = []
        for label, where, torch_device in places:
            reference_step = torch_step(reference, where)
            x_ref = torch.from_numpy(x_host).to(where).requires_grad_(True)
            out_ref = reference(x_ref)[0]
            (grad_ref,) = torch.autograd.grad(out_ref.sum(), [x_ref])
            out_ref, grad_ref = out_ref.detach().cpu().numpy(), grad_ref.cpu().numpy()
            devices = {f"torch {label}": torch_device.autodiff()}
            if where == "cpu":
                devices = {"ndarray": ember.device("ndarray").autodiff(), **devices}
            steps = {}
            for name, device in devices.items():
                for impl, sequence_ops in (("sequence op", True), ("cell scan", False)):
                    step = ember_step(reference, config, device, sequence_ops)
                    out, grad = step()[:2]
                    what = f"{title}: {impl} on {name}"
                    np.testing.assert_allclose(out.to_numpy(), out_ref, rtol=1e-3, atol=1e-4,
                                               err_msg=f"{what}: output")  # fmt: skip
                    atol = 1e-4 * float(np.abs(grad_ref).max())
                    np.testing.assert_allclose(grad.to_numpy(), grad_ref, rtol=1e-3, atol=atol,
                                               err_msg=f"{what}: input gradient")  # fmt: skip
                    steps[f"ember autodiff({name}), {impl}"] = step
            # Interleaved: each round times every implementation once, so a slow spell of a
            # shared machine hits them all alike; the median over rounds is reported.
            timed = {"torch": reference_step, **steps}
            timings = {name: [] for name in timed}
            reference_step()  # warm-up (the ember steps ran once above)
            for _ in range(args.repeat):
                for name, step in timed.items():
                    start = time.perf_counter()
                    step()
                    timings[name].append(time.perf_counter() - start)
            medians = {name: float(np.median(t)) * 1e3 for name, t in timings.items()}
            t_ref = medians.pop("torch")
            rows.append([f"torch autograd ({label})", f"{t_ref:.1f}", "1.00x"])
            rows += [[name, f"{t:.1f}", f"{t / t_ref:.2f}x"] for name, t in medians.items()]
        print_table(f"{title}: forward + backward, ms", ["impl", "ms", "vs torch"], rows)


if __name__ == "__main__":
    main()
