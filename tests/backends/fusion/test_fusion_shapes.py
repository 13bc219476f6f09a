"""Blocks never compute a result smaller than themselves: an optimizer's update of a bias
beside its weight's is two blocks, not one that repeats the bias at every row."""

from __future__ import annotations

import numpy as np

import ember
from ember import Tensor
from ember.backends.fusion import reset_stats, stats
from ember.backends.fusion.elementwise import ElementwiseFuser


def test_a_weight_and_a_bias_update_are_two_blocks():
    device = ember.device("ndarray").fusion(runtime="interpreter")
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(64, 32)), rng.normal(size=(32,))
    w, b = Tensor.from_data(weight, device), Tensor.from_data(bias, device)
    reset_stats()
    new_w = w - (w * 0.5 + 1.0) * 0.01
    new_b = b - (b * 0.5 + 1.0) * 0.01
    np.testing.assert_allclose(new_w.to_data().to_numpy(), weight - (weight * 0.5 + 1.0) * 0.01)
    np.testing.assert_allclose(new_b.to_data().to_numpy(), bias - (bias * 0.5 + 1.0) * 0.01)
    counts = stats()
    assert counts["kernels"] == 2 and counts["fused_ops"] == 8


def test_a_result_fills_the_block_but_for_its_reduced_axis():
    fills = ElementwiseFuser._fills
    assert fills((4, 8), (4, 8), None) and fills((8,), (4, 8), None) is False
    assert fills((4, 1), (4, 8), -1) and not fills((4, 1), (4, 8), None)
    assert not fills((1, 8), (4, 8), -1)
