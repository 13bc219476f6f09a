"""The convolution epilogue: the numba kernel's ``Epilogue`` against the ops run after the
convolution (exactly) and NumPy float64, and the fuser's segments on ``fusion(ndarray)``
against the same ops unfused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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


def _weights(dtype=np.float32, seed=0, width=12):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8, width, width)).astype(dtype)
    ws = [rng.standard_normal(s).astype(dtype) for s in ((8, 8, 3, 3), (8,), (8, 8, 3, 3), (8,))]
    return x, ws


def _unfused_with_the_kernel(x: np.ndarray, ws: list) -> np.ndarray:
    """What the records compute one by one when the tuner chose the numba convolution."""
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    h = _clamp(numba_conv.conv2d(x, ws[0], ws[1], options), 0.0, None)
    return _clamp(numba_conv.conv2d(h, ws[2], ws[3], options) + x, 0.0, None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [12, 16])  # 16: rows of whole vectors, stored by the tiles
def test_a_residual_block_runs_as_two_convolutions_with_epilogues(dtype, width):
    x, ws = _weights(dtype, width=width)
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


# ---------------------------------------------------------------------------- random graphs
_CNN_STEPS = st.lists(
    st.tuples(st.sampled_from(["conv", "conv", "pointwise", "relu", "residual", "affine", "mean",
                               "sync"]),
              st.integers(0, 3), st.integers(0, 3), st.sampled_from([-0.5, 0.5, 2.0])),
    min_size=2, max_size=8,
)  # fmt: skip


def _cnn_op(values: list, weights: tuple, step: tuple) -> Tensor | None:
    from ember.tensor import module

    kind, i, j, scalar = step
    a, b = values[-1 - i % len(values)], values[-1 - j % len(values)]  # recent ones, mostly
    w3, b3, w1 = weights
    if kind == "conv":  # its epilogue takes what follows: a bias, a ReLU, a residual
        return module.conv2d(a, w3, b3, padding=1)
    if kind == "pointwise":
        return module.conv2d(a, w1)
    if kind == "relu":
        return activation.relu(a)
    if kind == "residual":
        return activation.relu(a + b)
    if kind == "affine":
        return (a * scalar + 0.25).clamp(-3.0, 3.0)
    if kind == "mean":  # a global mean over the image, broadcast back
        return a - a.mean_dim(3).mean_dim(2)
    a.device.sync()
    return None


@settings(max_examples=12, deadline=None, derandomize=True)  # each new epilogue compiles
@given(steps=_CNN_STEPS, kept=st.lists(st.booleans(), min_size=10, max_size=10),
       replayed=st.booleans())  # fmt: skip
def test_random_convolutional_graphs_with_dropped_values_equal_ndarray(steps, kept, replayed):
    """Random chains of convolutions (their epilogues taking biases, ReLUs, clamps and
    residual adds), element-wise ops, global means and syncs, of which the caller keeps
    some values and drops the rest (``replayed``: through ``fusion.replay`` on new inputs,
    launched directly from the fourth call): every kept value equals NdArray's."""
    from ember.backends.fusion import executor, replay

    rng = np.random.default_rng(len(steps))
    host_weights = ((rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32),
                    rng.standard_normal(8).astype(np.float32),
                    (rng.standard_normal((8, 8, 1, 1)) / 3).astype(np.float32))  # fmt: skip
    inputs = [[rng.standard_normal((2, 8, 10, 10)).astype(np.float32) for _ in range(2)]
              for _ in range(5 if replayed else 1)]  # fmt: skip
    results = {}
    for name, on in (("ndarray", ember.device("ndarray")),
                     ("fusion", ember.device("ndarray").fusion(runtime="numba"))):  # fmt: skip
        weights = tuple(Tensor.from_data(w, on) for w in host_weights)

        def graph(x: Tensor, y: Tensor, weights: tuple = weights) -> dict:
            values = [x, y]
            for step in steps:
                made = _cnn_op(values, weights, step)
                if made is not None:
                    values.append(made)
            chosen = [n for n, keep in enumerate(kept[: len(values)]) if keep] or [len(values) - 1]
            return {n: values[n] for n in chosen}

        run = replay(graph) if replayed and name == "fusion" else graph
        results[name] = []
        with pytest.MonkeyPatch.context() as patch, autotune.forcing(Choice("fused", 1)):
            patch.setattr(executor, "LONE_KERNEL_MIN", 1 << 10)  # lone ops: kernels too
            for x, y in inputs:
                held = run(Tensor.from_data(x, on), Tensor.from_data(y, on))
                results[name].append({n: held[n].to_numpy() for n in sorted(held)})
                del held
    for call, (got, wanted) in enumerate(zip(results["fusion"], results["ndarray"], strict=True)):
        for n, want in wanted.items():
            np.testing.assert_allclose(got[n], want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()),
                                       err_msg=f"value {n} of call {call} of {steps}")  # fmt: skip
