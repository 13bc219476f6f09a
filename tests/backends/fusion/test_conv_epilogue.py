"""The convolution epilogue: the numba kernel's ``Epilogue`` against the ops run after the
convolution (exactly) and NumPy float64, and the fuser's segments on ``fusion(ndarray)``
against the same ops unfused."""

from __future__ import annotations

import numpy as np
import pytest
from test_numba_conv import TOL, reference

import ember
from ember import Tensor, activation
from ember.backend.errors import ShapeError
from ember.backend.options import ConvOptions
from ember.backends.fusion import autotune, reset_stats, stats
from ember.backends.fusion.autotune import UNFUSED, Choice

numba_conv = pytest.importorskip("ember.backends.fusion.numba_conv")
pytest.importorskip("numba")
Epilogue = numba_conv.Epilogue


def _clamp(v: np.ndarray, lo, hi) -> np.ndarray:
    """NdArray's clamp."""
    if lo is not None:
        v = np.maximum(v, lo)
    if hi is not None:
        v = np.minimum(v, hi)
    return v


def _case(dtype, groups=1, stride=(1, 1), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 6 * groups, 11, 9)).astype(dtype)
    w = rng.standard_normal((12 * groups, 6, 3, 3)).astype(dtype)
    b = rng.standard_normal(12 * groups).astype(dtype)
    options = ConvOptions(stride, (1, 1), (1, 1), groups)
    return x, w, b, options


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("groups", "stride", "threads"), [(1, (1, 1), 1), (2, (2, 1), 3)])
def test_epilogue_equals_the_ops_after_the_convolution(dtype, groups, stride, threads):
    x, w, b, options = _case(dtype, groups, stride)
    plain = numba_conv.conv2d(x, w, b, options)
    residual = np.random.default_rng(1).standard_normal(plain.shape).astype(dtype)
    first, second = (0.0, None), (-0.5, 1.25)
    after_first = _clamp(plain, *first)
    after_add = after_first + residual
    want = _clamp(after_add, *second)
    epilogue = Epilogue(first, residual, second)
    got = numba_conv.conv2d(x, w, b, options, threads=threads, epilogue=epilogue)
    np.testing.assert_array_equal(got, want)  # each step rounds as the op alone does
    # And the whole against float64 (the convolution's rounding bound, carried through).
    args = (options.stride, options.padding, options.dilation, options.groups)
    exact = np.minimum(np.maximum(np.maximum(reference(x, w, b, *args), 0.0)
                                  + residual.astype(np.float64), -0.5), 1.25)  # fmt: skip
    bound = reference(np.abs(x), np.abs(w), np.abs(b), *args) + np.abs(residual)
    np.testing.assert_array_less(np.abs(got - exact), TOL[dtype] * bound + 1e-30)


def test_epilogue_keeps_numpys_nan_and_bound_order():
    x, w, b, options = _case(np.float32)
    x[0, 0, 3, 3] = np.nan
    plain = numba_conv.conv2d(x, w, b, options)
    assert np.isnan(plain).any()
    # lo above hi: NumPy's maximum-then-minimum gives hi; a NaN passes both.
    got = numba_conv.conv2d(x, w, b, options, epilogue=Epilogue((1.0, -1.0)))
    np.testing.assert_array_equal(got, _clamp(plain, 1.0, -1.0))
    got = numba_conv.conv2d(x, w, b, options, epilogue=Epilogue((0, None)))
    np.testing.assert_array_equal(got, _clamp(plain, 0, None))


def test_epilogue_refusals():
    x, w, b, options = _case(np.float32)
    few = w[:3]  # 3 output channels: the one-channel kernel, which has no epilogue
    with pytest.raises(numba_conv.KernelUnsupported, match="epilogue"):
        numba_conv.conv2d(x, few, None, options, epilogue=Epilogue((0.0, None)))
    wrong = np.zeros((2, 12, 11, 8), np.float32)
    with pytest.raises(ShapeError, match="epilogue"):
        numba_conv.conv2d(x, w, b, options, epilogue=Epilogue(residual=wrong))


# ---------------------------------------------------------------- fused on a device
def _block(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """A residual block: relu(conv(relu(conv(x))) + x)."""
    from ember.tensor import module

    h = activation.relu(module.conv2d(x, w1, b1, padding=1))
    return activation.relu(module.conv2d(h, w2, b2, padding=1) + x)


def _weights(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8, 12, 12)).astype(dtype)
    ws = [rng.standard_normal(s).astype(dtype) for s in ((8, 8, 3, 3), (8,), (8, 8, 3, 3), (8,))]
    return x, ws


def _unfused_with_the_kernel(x: np.ndarray, ws: list) -> np.ndarray:
    """What the records compute one by one when the tuner chose the numba convolution."""
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    h = _clamp(numba_conv.conv2d(x, ws[0], ws[1], options), 0.0, None)
    return _clamp(numba_conv.conv2d(h, ws[2], ws[3], options) + x, 0.0, None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_residual_block_runs_as_two_convolutions_with_epilogues(dtype):
    x, ws = _weights(dtype)
    fused = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()
    with autotune.forcing(Choice("fused", 1)):
        y = _block(*(Tensor.from_data(a, fused) for a in (x, *ws)))
        assert stats()["op_kernels"] == 0  # still lazy
        got = y.to_numpy()
    np.testing.assert_array_equal(got, _unfused_with_the_kernel(x, ws))
    counts = stats()
    assert counts["op_kernels"] == 2 and counts["fused_ops"] == 3  # relu, add, relu
    assert counts["kernels"] == 0 and counts["unfused_ops"] == 0


def test_where_the_tuner_chose_im2col_the_records_run_unfused():
    x, ws = _weights()
    eager = ember.device("ndarray")
    want = _block(*(Tensor.from_data(a, eager) for a in (x, *ws))).to_numpy()
    fused = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()
    with autotune.forcing(UNFUSED):
        got = _block(*(Tensor.from_data(a, fused) for a in (x, *ws))).to_numpy()
    np.testing.assert_array_equal(got, want)
    assert stats()["op_kernels"] == 0


def test_a_segment_whose_inner_values_are_read_later_runs_record_by_record():
    from ember.tensor import module

    x, ws = _weights(seed=2)
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    conv = numba_conv.conv2d(x, ws[0], ws[1], options)
    fused = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()
    with autotune.forcing(Choice("fused", 1)):
        xt, w, b = (Tensor.from_data(a, fused) for a in (x, ws[0], ws[1]))
        c = module.conv2d(xt, w, b, padding=1)  # held by the user
        s = c + xt  # read later in the stream only
        y = activation.relu(s)
        z = s * 2.0
        got_c, got_y, got_z = c.to_numpy(), y.to_numpy(), z.to_numpy()
    np.testing.assert_array_equal(got_c, conv)
    np.testing.assert_array_equal(got_y, _clamp(conv + x, 0.0, None))
    np.testing.assert_array_equal(got_z, (conv + x) * np.float32(2.0))
    assert stats()["op_kernels"] == 1 and stats()["fused_ops"] == 0


def test_a_convolution_of_few_channels_is_not_fused(monkeypatch):
    from ember.backends.fusion import executor
    from ember.tensor import module

    def never(*args):
        raise AssertionError("a convolution the kernel has no epilogue for was fused")

    monkeypatch.setattr(executor, "run_conv_epilogue", never)

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)  # large enough to tune
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)  # 2 < OB output channels
    fused = ember.device("ndarray").fusion(runtime="numba")
    eager = ember.device("ndarray")
    want = activation.relu(module.conv2d(Tensor.from_data(x, eager), Tensor.from_data(w, eager)))
    reset_stats()
    with autotune.forcing(Choice("fused", 1)):
        got = activation.relu(module.conv2d(Tensor.from_data(x, fused), Tensor.from_data(w, fused)))
        np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=1e-5, atol=1e-5)
    assert stats()["op_kernels"] == 1 and stats()["unfused_ops"] == 1  # the conv; the relu
