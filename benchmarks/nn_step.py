"""Training steps of nn layers (forward + backward), ember beside PyTorch autograd, same weights.

Run: ``.venv/bin/python benchmarks/nn_step.py [--threads 1] [--cuda] [--rounds 15]``

* a transformer encoder: 2 layers, d_model 256, 8 heads, d_ff 1024, GELU, dropout 0,
  post-norm; input ``[16, 128, 256]``;
* an LSTM: d_input 256, d_hidden 256, batch first; input ``[16, 128, 256]``.

Each row is the median time of one step (the sides' steps alternate, one of each per round:
``timing.interleaved_seconds``; the calling thread's CPU time beside): the forward pass,
``sum()`` of the output, and
the backward pass to every parameter and the input, on ``autodiff(ndarray)``,
``autodiff(fusion(ndarray))`` (ops recorded lazily, element-wise chains of the forward
and backward passes run as fused numba kernels; the checking step compiles them; from the
third step the backward pass is replayed by its graph's key, ``fusion/keyed.py``), the same
through ``fusion.replay`` (the step's records pushed from a trace, without the Python of
the layers and of the autodiff graph) and ``autodiff(torch)``. Each ember step ends with ``device.sync()``, which runs what a fusion
device still holds, so the lazy work is timed. ember's layers load the PyTorch
modules' weights through the PyTorch adapter, so both sides compute the same numbers.
Before timing, each ember row's output is checked against PyTorch's, and so is its
gradient of the input for the LSTM (the post-norm encoder ends in a layer norm of unit
gain, whose outputs sum to a constant: its input gradient is rounding noise).
``--cuda`` adds the same steps on the GPU (torch autograd vs ember autodiff(torch cuda)).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved_seconds, pin_threads, print_table

BATCH, SEQ, D_MODEL = 16, 128, 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cuda", action="store_true", help="also time the steps on a CUDA GPU")
    args = parser.parse_args()
    pin_threads(args.threads, alternating=True)

    import numpy as np
    import torch

    import ember
    from ember import Tensor, TensorData
    from ember.backends.fusion import replay
    from ember.nn import LstmConfig, TransformerEncoderConfig, TransformerEncoderInput
    from ember.record import ImportedRecord
    from ember.record.adapter import PYTORCH

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x_host = np.random.default_rng(0).standard_normal((BATCH, SEQ, D_MODEL), dtype=np.float32)

    def torch_encoder() -> torch.nn.Module:
        layer = torch.nn.TransformerEncoderLayer(
            D_MODEL, 8, 1024, dropout=0.0, activation="gelu", batch_first=True
        )
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    models = {
        "transformer encoder (2 layers, d_model 256, seq 128, batch 16)": (
            torch_encoder(),
            lambda: TransformerEncoderConfig(D_MODEL, 1024, 8, 2, dropout=0.0),
            lambda model, x: model(TransformerEncoderInput(x)),
            False,  # post-norm: sum() of a layer norm's output (unit gain) is a constant
        ),
        "LSTM (256 -> 256, seq 128, batch 16)": (
            torch.nn.LSTM(D_MODEL, D_MODEL, batch_first=True),
            lambda: LstmConfig(D_MODEL, D_MODEL, bias=True),
            lambda model, x: model(x)[0],
            True,
        ),
    }

    def torch_step(reference: torch.nn.Module, where: str):
        module = reference.to(where)
        params = list(module.parameters())
        x = torch.from_numpy(x_host).to(where).requires_grad_(True)
        sync = torch.cuda.synchronize if where == "cuda" else (lambda: None)

        def step():
            output = module(x)
            output = output[0] if isinstance(output, tuple) else output
            grads = torch.autograd.grad(output.sum(), [x, *params])
            sync()
            return grads

        return step

    def ember_step(reference: torch.nn.Module, config, forward, device: ember.Device,
                   replayed: bool = False):  # fmt: skip
        state = {k: TensorData(v.detach().cpu().numpy()) for k, v in reference.state_dict().items()}
        model = config().init(device).load_record(ImportedRecord(state, adapter=PYTORCH))
        params = [p.val() for _, p in model.params()]
        x = Tensor.from_data(x_host, device).require_grad()

        def body(x):
            grads = forward(model, x).sum().backward()
            return [t.grad(grads) for t in (x, *params)]

        run = replay(body) if replayed else body

        def step():
            result = run(x)
            device.sync()
            return result

        return step, lambda: forward(model, x)

    places = [("cpu", "cpu", ember.device("torch"))]
    if args.cuda:
        if not torch.cuda.is_available():
            raise SystemExit("--cuda: torch sees no CUDA device")
        places.append(("cuda", "cuda", ember.device("torch", "cuda:0")))

    print(f"threads={args.threads}  torch={torch.__version__}")
    for title, (reference, config, forward, grad_has_signal) in models.items():
        rows = []
        for label, where, torch_device in places:
            reference_step = torch_step(reference, where)
            x_ref = torch.from_numpy(x_host).to(where)
            with torch.no_grad():
                out_ref = reference(x_ref)
            out_ref = (out_ref[0] if isinstance(out_ref, tuple) else out_ref).cpu().numpy()
            grad_ref = reference_step()[0].detach().cpu().numpy()  # the input's gradient
            calls = {f"torch autograd ({label})": reference_step}
            devices = {f"ember autodiff(torch {label})": torch_device.autodiff()}
            if where == "cpu":
                devices = {
                    "ember autodiff(ndarray)": ember.device("ndarray").autodiff(),
                    "ember autodiff(fusion(ndarray))": ember.device("ndarray").fusion().autodiff(),
                    "ember autodiff(fusion(ndarray)), replayed":
                        ember.device("ndarray").fusion().autodiff(),
                    **devices,
                }
            for name, device in devices.items():
                step, run_forward = ember_step(reference, config, forward, device,
                                               replayed=name.endswith("replayed"))  # fmt: skip
                for _ in range(2 if name.endswith("replayed") else 0):
                    step()  # the warm-up and the traced call
                np.testing.assert_allclose(run_forward().to_numpy(), out_ref, rtol=1e-3,
                                           atol=1e-4, err_msg=f"{title}: output on {name}")  # fmt: skip
                grad = step()[0].to_numpy()
                if grad_has_signal:
                    np.testing.assert_allclose(
                        grad, grad_ref, rtol=1e-3, atol=1e-4 * float(np.abs(grad_ref).max()),
                        err_msg=f"{title}: input gradient on {name}")  # fmt: skip
                calls[name] = step
            times = interleaved_seconds(calls, args.rounds)
            t_ref = times[f"torch autograd ({label})"][0]
            rows += [[name, f"{wall * 1e3:.2f}", f"{wall / t_ref:.2f}x", f"{cpu * 1e3:.2f}"]
                     for name, (wall, cpu) in times.items()]  # fmt: skip
        print_table(f"{title}: forward + backward", ["impl", "ms", "vs torch", "thread CPU ms"], rows)


if __name__ == "__main__":
    main()
