"""The models of the fusion benchmarks (``benchmarks/nn_step.py``) on fusion devices, at small
sizes: a training step on ``autodiff(fusion(ndarray))`` gives the gradients of
``autodiff(ndarray)``, with element-wise chains fused. Also the recording path's per-thread
stream lookup (it remembers the last stream), ops of two fusion devices interleaved, and a
stream run by the push that fills it (its last record's outputs must be written). Blocks
run on the interpreter runtime (exact, nothing to compile)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor, TensorData
from ember.backend.device import Device
from ember.backends.fusion import reset_stats, stats
from ember.backends.fusion.stream import stream_for

torch = pytest.importorskip("torch")

BATCH, SEQ, D_MODEL = 2, 5, 8


def _torch_encoder() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(
        D_MODEL, 2, 16, dropout=0.0, activation="gelu", batch_first=True
    )
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def _models():
    from ember.nn import LstmConfig, TransformerEncoderConfig, TransformerEncoderInput

    return {
        "transformer": (
            _torch_encoder,
            lambda: TransformerEncoderConfig(D_MODEL, 16, 2, 2, dropout=0.0),
            lambda model, x: model(TransformerEncoderInput(x)),
        ),
        "lstm": (
            lambda: torch.nn.LSTM(D_MODEL, D_MODEL, batch_first=True),
            lambda: LstmConfig(D_MODEL, D_MODEL, bias=True),
            lambda model, x: model(x)[0],
        ),
    }


def _step(name: str, device: ember.Device) -> list[np.ndarray]:
    """The output and the gradients of the input and of every parameter after one step of
    ``(output * weights).sum()`` (weights fixed, so no gradient is rounding noise)."""
    from ember.record import ImportedRecord
    from ember.record.adapter import PYTORCH

    make_torch, config, forward = _models()[name]
    torch.manual_seed(0)
    state = {k: TensorData(v.detach().numpy()) for k, v in make_torch().state_dict().items()}
    model = config().init(device).load_record(ImportedRecord(state, adapter=PYTORCH))
    rng = np.random.default_rng(0)
    x = Tensor.from_data(rng.standard_normal((BATCH, SEQ, D_MODEL), dtype=np.float32), device)
    x = x.require_grad()
    weights = rng.standard_normal((BATCH, SEQ, D_MODEL), dtype=np.float32)
    out = forward(model, x)
    grads = (out * Tensor.from_data(weights, device)).sum().backward()
    params = [p.val() for _, p in model.params()]
    return [out.to_numpy(), *(t.grad(grads).to_numpy() for t in (x, *params))]


@pytest.mark.parametrize("name", ["transformer", "lstm"])
def test_training_step_on_fusion_matches_ndarray(name):
    expected = _step(name, ember.device("ndarray").autodiff())
    reset_stats()
    got = _step(name, ember.device("ndarray").fusion(runtime="interpreter").autodiff())
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        scale = float(np.abs(e).max())
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{name} #{i}")
    if name == "transformer":  # softmax, layer norm, GELU and their gradients fuse
        assert stats()["kernels"] > 0
        assert stats()["fused_ops"] > stats()["kernels"]


def test_stream_lookup_remembers_the_last_stream_per_device_and_executor():
    device = ember.device("ndarray")

    def first(records):
        return None

    def second(records):
        return None

    one = stream_for(device, first)
    two = stream_for(device, second)  # same device object, another executor
    assert one is not two
    assert stream_for(device, first) is one
    assert stream_for(device, second) is two
    assert stream_for(Device(device.backend, device.place, device.index), first) is one


def test_interleaved_ops_of_two_devices_go_to_their_own_streams(counting_runtimes):
    runtimes = list(counting_runtimes)
    devices = []
    for runtime in runtimes:
        device = ember.device("ndarray").fusion(runtime="interpreter")
        device.backend.executor.runtime = runtime
        devices.append(device)
    a, b = (Tensor.from_data([1.0, -2.0, 3.0], d) for d in devices)
    for scalar in (2.0, 3.0):  # a and b's chains interleave op by op
        a, b = a * scalar, b * (scalar + 1.0)
        a, b = a.abs(), b.abs()
        a, b = a + 1.0, b + 2.0
    assert a._prim.slot.stream is not b._prim.slot.stream
    assert len(a._prim.slot.stream) == 6 and len(b._prim.slot.stream) == 6
    assert a.tolist() == [10.0, 16.0, 22.0]  # |(|2x| + 1) * 3| + 1
    assert b.tolist() == [22.0, 34.0, 46.0]  # |(|3x| + 2) * 4| + 2
    assert [r.blocks for r in runtimes] == [1, 1]


@pytest.mark.parametrize("limit", [2, 3, 16])
def test_a_stream_run_at_its_length_limit_writes_the_last_records_outputs(monkeypatch, limit):
    # The record that fills a stream runs inside its own op call. Its outputs had no
    # handle yet, so a fused block took them for intermediates nobody reads and wrote
    # nothing: the transformer step failed when the limit fell on a fused record.
    from ember.backends.fusion import stream

    monkeypatch.setattr(stream, "MAX_RECORDS", limit)
    device = ember.device("ndarray").fusion(runtime="interpreter")
    x = Tensor.from_data([1.0, -2.0, 3.0], device)
    y = x
    for _ in range(7):
        y = (y * 2.0).abs() + 1.0
    expected = np.array([1.0, -2.0, 3.0])
    for _ in range(7):
        expected = np.abs(expected * 2.0) + 1.0
    assert y.tolist() == expected.tolist()


def test_transformer_step_on_fusion_with_a_short_stream_limit(monkeypatch):
    from ember.backends.fusion import stream

    expected = _step("transformer", ember.device("ndarray").autodiff())
    monkeypatch.setattr(stream, "MAX_RECORDS", 16)
    got = _step("transformer", ember.device("ndarray").fusion(runtime="interpreter").autodiff())
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        scale = float(np.abs(e).max())
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 * scale, err_msg=f"#{i}")
