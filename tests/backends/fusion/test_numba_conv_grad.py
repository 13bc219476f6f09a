"""The numba conv2d gradients against NdArray's backward ops and a float64 reference.

The float64 reference is NdArray's ``conv_x_backward`` / ``conv_weight_backward`` on the
inputs cast to float64 (NdArray's ops are tested against PyTorch). Every case must agree
with it up to a bound on rounding: ``TOL[dtype]`` times the same gradient of the
magnitudes (``|x|``, ``|w|``, ``|grad|``), which bounds how far any order of adding the
products can stray; and with NdArray's ops in the same dtype within twice that bound.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conv_cases import random_case

import ember
from ember import Tensor, activation
from ember.backend.errors import ShapeError, UnsupportedError
from ember.backend.options import ConvOptions
from ember.backends.fusion import autotune, op_kernels, reset_stats, stats
from ember.backends.ndarray import NdArray
from ember.tensor import module

grad_kernels = pytest.importorskip("ember.backends.fusion.numba_conv_grad")
pytest.importorskip("numba")

TOL = {np.float32: 4e-6, np.float64: 1e-14}
NDARRAY = NdArray()
GRADIENTS = {
    "x": (grad_kernels.conv2d_x_backward, NDARRAY.conv_x_backward),
    "weight": (grad_kernels.conv2d_weight_backward, NDARRAY.conv_weight_backward),
}


def output_grad(x, w, options, rng):
    """A random gradient of the convolution's output shape."""
    shape = NDARRAY.conv2d(x[:, :, :, :], w, None, options).shape
    return rng.standard_normal(shape).astype(x.dtype)


def check(x, w, g, options, dtype, which=("x", "weight")):
    for name in which:
        ours, ndarray_op = GRADIENTS[name]
        got = ours(x, w, g, options)
        assert got.dtype == dtype and got.flags.c_contiguous
        exact = ndarray_op(*(a.astype(np.float64) for a in (x, w, g)), options)
        assert got.shape == exact.shape == (x.shape if name == "x" else w.shape)
        bound = ndarray_op(*(np.abs(a).astype(np.float64) for a in (x, w, g)), options)
        limit = TOL[dtype] * bound + np.finfo(dtype).tiny
        np.testing.assert_array_less(np.abs(got - exact), limit, err_msg=name)
        same_dtype = ndarray_op(x, w, g, options).astype(np.float64)
        np.testing.assert_array_less(np.abs(got - same_dtype), 2 * limit, err_msg=name)


@pytest.fixture(params=["phases", "zero-inserted"])
def strided_x_grad(request, monkeypatch):
    """Runs a test once on each way of computing a strided input gradient: per phase, and
    as one convolution of the zero-spread gradient (every size of the tests)."""
    limit = -1 if request.param == "phases" else 1 << 62
    monkeypatch.setattr(grad_kernels, "ZERO_INSERT_MAX_MACS", limit)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_sweep(dtype, strided_x_grad):
    rng = np.random.default_rng(14)
    for _ in range(60):
        xs, ws, stride, padding, dilation, groups = random_case(rng, max_padding=4)
        x = rng.standard_normal(xs).astype(dtype)
        w = rng.standard_normal(ws).astype(dtype)
        options = ConvOptions(stride, padding, dilation, groups)
        check(x, w, output_grad(x, w, options, rng), options, dtype)


CASES = [
    # (input, weight, stride, padding, dilation, groups)
    ((3, 1, 28, 28), (8, 1, 3, 3), (1, 1), (0, 0), (1, 1), 1),  # guide CNN, first layer
    ((2, 8, 26, 26), (16, 8, 3, 3), (1, 1), (0, 0), (1, 1), 1),  # guide CNN, second layer
    ((2, 32, 16, 16), (64, 32, 3, 3), (2, 2), (1, 1), (1, 1), 1),  # stride 2
    ((2, 32, 12, 12), (64, 32, 1, 1), (2, 2), (0, 0), (1, 1), 1),  # 1x1, stride 2
    ((2, 16, 7, 7), (8, 16, 1, 1), (1, 1), (0, 0), (1, 1), 1),  # 1x1
    ((1, 3, 10, 10), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),  # batch 1
    ((2, 12, 9, 9), (12, 1, 3, 3), (1, 1), (1, 1), (1, 1), 12),  # depthwise
    ((2, 6, 9, 9), (12, 1, 3, 3), (2, 1), (1, 2), (1, 1), 6),  # depthwise, multiplier 2
    ((1, 3, 2, 3), (5, 3, 5, 5), (1, 1), (2, 2), (1, 1), 1),  # kernel larger than input
    ((1, 2, 6, 6), (4, 2, 3, 3), (1, 1), (4, 3), (1, 1), 1),  # padding beyond the kernel
    ((2, 4, 11, 10), (6, 2, 3, 3), (2, 3), (1, 0), (2, 2), 2),  # stride and dilation
    ((1, 2, 5, 40), (4, 2, 1, 7), (1, 3), (0, 3), (1, 2), 1),  # asymmetric everything
    ((1, 4, 70, 3), (6, 4, 3, 1), (1, 1), (1, 0), (1, 1), 1),  # many short rows, many tiles
]


@pytest.mark.parametrize("taps", [3, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_both_weight_gradient_loops_on_the_named_shapes(taps, dtype, monkeypatch):
    """The 6-tap loop (AVX-512 hosts) and the 3-tap one (AVX2) on any host."""
    monkeypatch.setattr(grad_kernels, "TB", taps)
    rng = np.random.default_rng(2)
    for xs, ws, stride, padding, dilation, groups in CASES:
        x = rng.standard_normal(xs).astype(dtype)
        w = rng.standard_normal(ws).astype(dtype)
        options = ConvOptions(stride, padding, dilation, groups)
        check(x, w, output_grad(x, w, options, rng), options, dtype, which=("weight",))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}s{c[2]}p{c[3]}g{c[5]}")
def test_named_shapes(case, dtype, strided_x_grad):
    xs, ws, stride, padding, dilation, groups = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    options = ConvOptions(stride, padding, dilation, groups)
    check(x, w, output_grad(x, w, options, rng), options, dtype)


def test_a_large_batch_spans_several_chunks_of_samples(monkeypatch):
    monkeypatch.setattr(grad_kernels, "CHUNK_BYTES", 1)  # one sample per chunk
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 6, 9, 8)).astype(np.float32)
    w = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    check(x, w, output_grad(x, w, options, rng), options, np.float32, which=("weight",))


def test_parts_give_the_results_of_one_part():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 8, 13, 10)).astype(np.float64)
    for w, groups in [
        (rng.standard_normal((9, 8, 3, 3)), 1),
        (rng.standard_normal((8, 1, 3, 3)), 8),
    ]:
        options = ConvOptions((1, 1), (1, 1), (1, 1), groups)
        g = output_grad(x, w, options, rng)
        for ours, _ in GRADIENTS.values():
            one = ours(x, w, g, options, threads=1)
            for parts in (2, 3, 200):  # more parts than samples too
                # Partial sums over samples are added in another order: equal to rounding.
                np.testing.assert_allclose(ours(x, w, g, options, threads=parts), one,
                                           rtol=1e-12, atol=1e-12)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_contiguous_arrays_are_read_in_place(dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 12, 11, 9)).astype(dtype).transpose(0, 1, 3, 2)[:, ::2]
    w = rng.standard_normal((8, 3, 3, 2)).astype(dtype)[:, ::-1]  # negative strides
    options = ConvOptions((1, 2), (1, 1), (2, 1), 2)
    g = output_grad(x, w, options, rng)[:, ::-1]
    assert not (x.flags.c_contiguous or w.flags.c_contiguous or g.flags.c_contiguous)
    check(x, w, g, options, dtype)


def test_inputs_are_not_written():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    options = ConvOptions((2, 1), (1, 1), (1, 1), 1)
    g = output_grad(x, w, options, rng)
    copies = [a.copy() for a in (x, w, g)]
    for ours, _ in GRADIENTS.values():
        ours(x, w, g, options)
    for a, c in zip((x, w, g), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int32])
def test_other_dtypes_raise_a_typed_error(dtype):
    x = np.ones((1, 2, 5, 5), dtype)
    w = np.ones((2, 2, 3, 3), dtype)
    g = np.ones((1, 2, 3, 3), dtype)
    for ours, _ in GRADIENTS.values():
        with pytest.raises(grad_kernels.KernelUnsupported, match="dtype"):
            ours(x, w, g, ConvOptions((1, 1), (0, 0), (1, 1), 1))
    assert issubclass(grad_kernels.KernelUnsupported, UnsupportedError)


def test_shapes_that_do_not_fit_raise_shape_errors():
    x = np.ones((1, 4, 5, 5), np.float32)
    w = np.ones((2, 4, 3, 3), np.float32)
    for ours, _ in GRADIENTS.values():
        with pytest.raises(ShapeError, match="is not the output"):
            ours(x, w, np.ones((1, 2, 4, 4), np.float32), ConvOptions((1, 1), (0, 0), (1, 1), 1))
        with pytest.raises(ShapeError, match="groups=3"):
            ours(x, np.ones((3, 1, 1, 1), np.float32), np.ones((1, 3, 5, 5), np.float32),
                 ConvOptions((1, 1), (0, 0), (1, 1), 3))  # fmt: skip


def test_empty_batch():
    x = np.ones((0, 2, 5, 5), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    g = np.ones((0, 3, 3, 3), np.float32)
    options = ConvOptions((1, 1), (0, 0), (1, 1), 1)
    assert grad_kernels.conv2d_x_backward(x, w, g, options).shape == (0, 2, 5, 5)
    dw = grad_kernels.conv2d_weight_backward(x, w, g, options)
    assert dw.shape == (3, 2, 3, 3) and dw.dtype == np.float32 and not dw.any()


def test_supports_names_what_the_gradients_take():
    x, w, g = (np.ones(s, np.float32) for s in [(1, 2, 5, 5), (2, 2, 3, 3), (1, 2, 3, 3)])
    assert grad_kernels.supports(x, w, g)
    assert grad_kernels.supports(*(a.astype(np.float64) for a in (x, w, g)))
    assert not grad_kernels.supports(*(a.astype(np.float16) for a in (x, w, g)))
    assert not grad_kernels.supports(x, w.astype(np.float64), g)
    assert not grad_kernels.supports(x[0], w, g)


def test_op_kernel_entries_take_float_arrays_only():
    x = np.ones((1, 2, 5, 5), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    g = np.ones((1, 3, 3, 3), np.float32)
    options = ConvOptions((1, 1), (0, 0), (1, 1), 1)
    for name in ("conv_x_backward", "conv_weight_backward"):
        kernel = op_kernels.NDARRAY_KERNELS[name]
        assert kernel.supports([x, w, g, options])
        assert not kernel.supports([x.astype(np.float16), w.astype(np.float16),
                                    g.astype(np.float16), options])  # fmt: skip
        assert not kernel.supports([x, w.astype(np.float64), g, options])
        assert kernel.work([x, w, g, options]) == 3 * 3 * 3 * 2 * 3 * 3
        assert kernel.key([x, w, g, options])[0] == name


def _layer_gradients(device, x, w, b):
    """Gradients of a two-convolution layer's loss for input, weights and bias."""
    xt = Tensor.from_data(x, device).require_grad()
    wt = [Tensor.from_data(a, device).require_grad() for a in w]
    bt = Tensor.from_data(b, device).require_grad()
    h = activation.relu(module.conv2d(xt, wt[0], bt, stride=(2, 1), padding=(1, 1)))
    loss = (module.conv2d(h, wt[1], None) ** 2).sum()
    grads = loss.backward()
    return [t.grad(grads).to_numpy() for t in (xt, *wt, bt)]


def test_autodiff_gradients_of_a_conv_layer_run_the_numba_kernels():
    rng = np.random.default_rng(6)
    # Large enough to be tuned (autotune: at least numba_runtime.PARALLEL_MIN multiply-adds).
    x = rng.standard_normal((4, 3, 16, 15)).astype(np.float32)
    w = [rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
         rng.standard_normal((6, 8, 3, 3)).astype(np.float32)]  # fmt: skip
    b = rng.standard_normal(8).astype(np.float32)
    want = _layer_gradients(ember.device("ndarray").autodiff(), x, w, b)
    fused = ember.device("ndarray").fusion(runtime="numba").autodiff()
    reset_stats()
    with autotune.forcing(autotune.Choice("fused", 1)):
        got = _layer_gradients(fused, x, w, b)
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5 * np.abs(e).max())
    # Two forward convolutions, two weight gradients and two input gradients (the hidden
    # layer's and x's, which requires one).
    assert stats()["op_kernels"] == 6


def test_a_small_strided_input_gradient_is_one_zero_spread_convolution(monkeypatch):
    """The gradient-penalty critic's stride-2 layer runs as one stride-1 convolution (its
    kernel called once, not once per phase) and equals the phases' result."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 8, 13, 13)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    options = ConvOptions((2, 2), (0, 0), (1, 1), 1)
    g = output_grad(x, w, options, rng)
    calls = []
    real = grad_kernels.numba_conv.conv2d
    monkeypatch.setattr(
        grad_kernels.numba_conv, "conv2d", lambda *a, **k: calls.append(a[3]) or real(*a, **k)
    )
    spread = grad_kernels.conv2d_x_backward(x, w, g, options)
    assert len(calls) == 1 and calls[0].stride == (1, 1)
    monkeypatch.setattr(grad_kernels, "ZERO_INSERT_MAX_MACS", -1)
    phases = grad_kernels.conv2d_x_backward(x, w, g, options)
    assert len(calls) == 1
    np.testing.assert_allclose(spread, phases, rtol=1e-5, atol=1e-5)
