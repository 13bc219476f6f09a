"""Fusion devices that compare equal but differ in runtime: each device's fused blocks run
on its own runtime, whatever another device recorded on the same thread before, and their
tensors still mix (reading one device's pending value from the other makes it)."""

from __future__ import annotations

import ember
from ember import Tensor
from ember.backends.fusion import reset_stats, stats


def _fusion_device_on(runtime) -> ember.Device:
    device = ember.device("ndarray").fusion(runtime="interpreter")
    device.backend.executor.runtime = runtime
    return device


def _chain(device: ember.Device) -> Tensor:
    return ((Tensor.from_data([1.0, -2.0, 3.0], device) * 2.0).abs() + 1.0).exp().log()


def test_each_runtime_runs_its_own_devices_blocks(counting_runtimes):
    first, second = counting_runtimes
    on_first, on_second = _fusion_device_on(first), _fusion_device_on(second)
    assert on_first == on_second  # equal devices: their tensors are interchangeable
    reset_stats()
    assert _chain(on_first).tolist() == [3.0, 5.0, 7.0]
    assert (first.blocks, second.blocks) == (1, 0)
    # The second device's ops went to the first's stream (and runtime) before the fix.
    assert _chain(on_second).tolist() == [3.0, 5.0, 7.0]
    assert (first.blocks, second.blocks) == (1, 1)
    assert stats()["streams"] == 2


def test_equal_devices_on_different_runtimes_mix_their_tensors(counting_runtimes):
    first, second = counting_runtimes
    on_first, on_second = _fusion_device_on(first), _fusion_device_on(second)
    pending = _chain(on_first)  # recorded on the first device's stream, not run
    # An op runs on its first operand's backend: here the second device's, whose stream
    # makes the first's pending value before recording on it.
    mixed = ((Tensor.from_data([1.0, 1.0, 1.0], on_second) + pending) * 2.0).abs()
    assert mixed.tolist() == [8.0, 12.0, 16.0]
    assert (first.blocks, second.blocks) == (1, 1)
