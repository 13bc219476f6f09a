"""The NdArray backend's module kernels (``conv.py``, ``pool.py``, ``resample.py``) on raw arrays.

Each kernel is compared with ``torch.nn.functional`` on the same elements:
float64 tightly (rtol 1e-10), float32 with rtol 1e-4 / atol 1e-5, f16 / bf16
loosely; copies (unfold, indices, max values, padding, embedding) exactly. The
backward helpers are compared with torch autograd of the forward op. The
kernels are also checked to be pure (inputs untouched, fresh outputs) and to
keep the input's dtype.

The kernels are imported from the package; while the package is mid-edit they
are loaded straight from their files (they only need NumPy and ml_dtypes).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

SRC = Path(__file__).resolve().parents[2] / "src"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


try:
    from ember.backend.options import (
        ConvOptions,
        ConvTransposeOptions,
        InterpolateOptions,
        PadOptions,
        PoolOptions,
    )
    from ember.backends.ndarray import conv, pool, resample
except Exception:  # the package does not import right now: use the files themselves
    _opts = _load(SRC / "ember" / "backend" / "options.py", "_kernel_test_options")
    ConvOptions, ConvTransposeOptions = _opts.ConvOptions, _opts.ConvTransposeOptions
    InterpolateOptions, PadOptions, PoolOptions = (
        _opts.InterpolateOptions,
        _opts.PadOptions,
        _opts.PoolOptions,
    )
    _dir = SRC / "ember" / "backends" / "ndarray"
    conv = _load(_dir / "conv.py", "_kernel_test_conv")
    pool = _load(_dir / "pool.py", "_kernel_test_pool")
    resample = _load(_dir / "resample.py", "_kernel_test_resample")

BF16 = np.dtype(ml_dtypes.bfloat16)
TOL = {  # (rtol, atol)
    np.dtype(np.float64): (1e-10, 1e-12),
    np.dtype(np.float32): (1e-4, 1e-5),
    np.dtype(np.float16): (1e-2, 1e-2),
    BF16: (4e-2, 4e-2),
}
FLOATS = [np.float64, np.float32]


def _rand(shape, dtype=np.float64, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _t(a: np.ndarray) -> torch.Tensor:
    """The float64 torch tensor of ``a``'s elements (the reference always runs in float64)."""
    return torch.from_numpy(np.asarray(a, dtype=np.float64).copy())


def _close(actual: np.ndarray, expected, dtype) -> None:
    dtype = np.dtype(dtype)
    expected = (
        expected.detach().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    )
    assert actual.dtype == dtype, f"dtype {actual.dtype} != {dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=rtol, atol=atol)


def _grad(fn, *arrays, seed=1):
    """Forward of ``fn`` on float64 copies of ``arrays`` with a random output gradient:
    returns (output gradient, gradient of each input)."""
    tensors = [_t(a).requires_grad_() for a in arrays]
    out = fn(*tensors)
    g = _rand(tuple(out.shape), seed=seed)
    out.backward(torch.from_numpy(g))
    return g, [t.grad.numpy() for t in tensors]


# ============================================================================ convolution
CONV2D_CASES = [  # x, w, stride, padding, dilation, groups
    pytest.param((2, 3, 9, 8), (4, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1, id="plain"),
    pytest.param((2, 3, 9, 8), (4, 3, 3, 3), (2, 2), (1, 1), (1, 1), 1, id="stride2-pad1"),
    pytest.param((2, 3, 10, 7), (5, 3, 3, 2), (2, 1), (1, 2), (1, 2), 1, id="mixed"),
    pytest.param((1, 2, 11, 12), (3, 2, 3, 3), (1, 3), (2, 0), (3, 1), 1, id="dilation-stride-w"),
    pytest.param((2, 4, 9, 8), (6, 2, 3, 3), (1, 2), (1, 1), (2, 1), 2, id="groups2"),
    pytest.param((2, 4, 9, 8), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), 4, id="depthwise"),
    pytest.param((2, 3, 7, 7), (6, 1, 3, 3), (2, 2), (1, 1), (1, 1), 3, id="depthwise-multiplier"),
    pytest.param((1, 3, 6, 9), (2, 3, 1, 1), (1, 1), (0, 0), (1, 1), 1, id="1x1"),
    pytest.param((2, 2, 5, 6), (3, 2, 5, 6), (1, 1), (0, 0), (1, 1), 1, id="kernel-is-input"),
    pytest.param((1, 2, 3, 4), (3, 2, 3, 3), (1, 1), (3, 3), (1, 1), 1, id="wide-padding"),
    pytest.param((1, 1, 28, 28), (8, 1, 3, 3), (1, 1), (0, 0), (1, 1), 1, id="mnist-1"),
    pytest.param((3, 8, 12, 12), (16, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, id="mnist-2-padded"),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation", "groups"), CONV2D_CASES)
def test_conv2d(xs, ws, stride, padding, dilation, groups, bias, dtype):
    x, w = _rand(xs, dtype), _rand(ws, dtype, seed=1)
    b = _rand(ws[0], dtype, seed=2) if bias else None
    out = conv.conv2d(x, w, b, ConvOptions(stride, padding, dilation, groups))
    ref = F.conv2d(_t(x), _t(w), None if b is None else _t(b), stride, padding, dilation, groups)
    _close(out, ref, dtype)
    assert out.flags.c_contiguous


def test_conv2d_guide_batch_in_blocks(ndarray_threads):
    """A batch spread over several cache blocks, and a partial last block."""
    x, w, b = (
        _rand((37, 8, 26, 26), np.float32),
        _rand((16, 8, 3, 3), np.float32, 1),
        _rand(16, np.float32, 2),
    )
    out = conv.conv2d(x, w, b, ConvOptions((1, 1), (0, 0), (1, 1)))
    _close(out, F.conv2d(_t(x), _t(w), _t(b)), np.float32)


@pytest.mark.parametrize(("stride", "padding", "groups"), [((1, 1), (1, 2), 1), ((2, 1), (1, 1), 2)])
def test_conv2d_padded_in_blocks(monkeypatch, ndarray_threads, stride, padding, groups):
    """Padded inputs over many blocks: each thread zeroes and fills a padded copy of its own."""
    monkeypatch.setattr(conv, "_COLS_BUDGET_BYTES", 60_000)
    x, w, b = _rand((11, 4, 13, 12), np.float32), _rand((6, 4 // groups, 3, 3), np.float32, 1), None
    out = conv.conv2d(x, w, b, ConvOptions(stride, padding, (1, 1), groups))
    _close(out, F.conv2d(_t(x), _t(w), None, stride, padding, 1, groups), np.float32)


@pytest.mark.parametrize(
    ("xs", "ws", "stride", "padding", "dilation", "groups"),
    [
        ((2, 3, 5, 6, 7), (4, 3, 3, 2, 3), (1, 2, 1), (1, 0, 1), (1, 1, 2), 1),
        ((1, 4, 6, 5, 4), (4, 2, 2, 3, 3), (2, 1, 1), (0, 1, 1), (2, 1, 1), 2),
        ((2, 2, 4, 4, 4), (3, 2, 1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1), 1),
    ],
)
@pytest.mark.parametrize("dtype", FLOATS)
def test_conv3d(xs, ws, stride, padding, dilation, groups, dtype):
    x, w, b = _rand(xs, dtype), _rand(ws, dtype, 1), _rand(ws[0], dtype, 2)
    out = conv.conv3d(x, w, b, ConvOptions(stride, padding, dilation, groups))
    _close(out, F.conv3d(_t(x), _t(w), _t(b), stride, padding, dilation, groups), dtype)


CONV3D_GRAD_CASES = [  # x, w, stride, padding, dilation, groups
    pytest.param((2, 3, 5, 6, 7), (4, 3, 3, 2, 3), (1, 2, 1), (1, 0, 1), (1, 1, 2), 1, id="3d-mixed"),
    pytest.param((1, 4, 6, 5, 4), (4, 2, 2, 3, 3), (2, 1, 1), (0, 1, 1), (2, 1, 1), 2, id="3d-groups2"),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation", "groups"),
                         CONV2D_CASES + CONV3D_GRAD_CASES)  # fmt: skip
def test_weight_grad_nd(xs, ws, stride, padding, dilation, groups, dtype):
    x = _rand(xs, dtype)
    w = _rand(ws, dtype, seed=1)
    conv_fn = F.conv2d if len(xs) == 4 else F.conv3d
    g, (_, ref) = _grad(lambda a, b: conv_fn(a, b, None, stride, padding, dilation, groups), x, w)
    dw = conv.weight_grad_nd(x, g.astype(dtype), ws[2:], stride, padding, dilation, groups)
    _close(dw, ref, dtype)


@pytest.mark.parametrize(("groups", "padding"), [(1, (0, 0)), (1, (1, 2)), (2, (1, 1))])
def test_weight_grad_nd_in_blocks(monkeypatch, groups, padding, ndarray_threads):
    """Many blocks of samples, a partial last one, and a gradient that is a strided view."""
    monkeypatch.setattr(conv, "_COLS_BUDGET_BYTES", 60_000)
    x = _rand((11, 4, 13, 12), np.float32)
    w = _rand((6, 4 // groups, 3, 3), np.float32, seed=1)
    g, (_, ref) = _grad(lambda a, b: F.conv2d(a, b, None, 1, padding, 1, groups), x, w)
    strided = np.asfortranarray(g.astype(np.float32))
    dw = conv.weight_grad_nd(x, strided, (3, 3), (1, 1), padding, (1, 1), groups)
    # Each element sums 1716 float32 products in the BLAS's order: its rounding error scales
    # with the largest sums (up to ~115 here), not with an element near zero.
    assert dw.dtype == np.float32 and dw.shape == ref.shape
    np.testing.assert_allclose(dw, ref, rtol=1e-4, atol=2e-6 * np.abs(ref).max())


def test_weight_grad_nd_of_an_empty_batch():
    x, g = np.zeros((0, 3, 6, 6), np.float32), np.zeros((0, 4, 4, 4), np.float32)
    dw = conv.weight_grad_nd(x, g, (3, 3), (1, 1), (0, 0), (1, 1), 1)
    assert dw.shape == (4, 3, 3, 3) and dw.dtype == np.float32 and not dw.any()


def test_conv1d_through_conv_nd():
    x, w, b = _rand((2, 3, 20)), _rand((4, 3, 5), seed=1), _rand(4, seed=2)
    out = conv.conv_nd(x, w, b, (2,), (3,), (2,), 1)
    _close(out, F.conv1d(_t(x), _t(w), _t(b), 2, 3, 2), np.float64)


CONV_T2D_CASES = [  # x, w, stride, padding, padding_out, dilation, groups
    pytest.param((2, 3, 5, 4), (3, 4, 3, 3), (1, 1), (0, 0), (0, 0), (1, 1), 1, id="plain"),
    pytest.param(
        (2, 3, 5, 4), (3, 4, 3, 2), (2, 3), (1, 2), (1, 2), (1, 1), 1, id="stride-out-pad"
    ),
    pytest.param(
        (2, 4, 5, 4), (4, 2, 3, 3), (2, 1), (2, 0), (1, 1), (2, 2), 2, id="groups-dilation"
    ),
    pytest.param(
        (2, 3, 5, 4), (3, 4, 1, 1), (3, 2), (0, 0), (2, 1), (1, 1), 1, id="kernel-below-stride"
    ),
    pytest.param((2, 3, 5, 4), (3, 4, 3, 3), (1, 1), (2, 2), (0, 0), (1, 1), 1, id="pad-k-minus-1"),
    pytest.param(
        (2, 3, 6, 5), (3, 4, 2, 3), (1, 1), (1, 2), (0, 1), (1, 2), 1, id="pad-above-kernel"
    ),
    pytest.param(
        (2, 3, 5, 4), (3, 4, 3, 3), (3, 3), (2, 1), (2, 1), (2, 2), 1, id="stride3-dilation2"
    ),
    pytest.param((2, 6, 5, 4), (6, 1, 3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 6, id="depthwise"),
    pytest.param((1, 8, 6, 6), (8, 4, 4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 1, id="upsample-4x4"),
    pytest.param(
        (2, 4, 6, 5), (4, 3, 3, 2), (1, 1), (1, 0), (0, 0), (2, 1), 2, id="stride1-groups-dilation"
    ),
]


@pytest.fixture(params=["phases", "col2im"])
def lowering(request, monkeypatch):
    """Runs a transposed-convolution test through each of its two lowerings (the kernel
    picks one by size; these small cases would otherwise all take the same one)."""
    monkeypatch.setattr(conv, "_col2im_is_cheaper", lambda *_: request.param == "col2im")
    return request.param


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("xs", "ws", "stride", "padding", "padding_out", "dilation", "groups"), CONV_T2D_CASES
)
def test_conv_transpose2d(xs, ws, stride, padding, padding_out, dilation, groups, bias, dtype,
                          lowering):  # fmt: skip
    x, w = _rand(xs, dtype), _rand(ws, dtype, 1)
    b = _rand(ws[1] * groups, dtype, 2) if bias else None
    options = ConvTransposeOptions(stride, padding, padding_out, dilation, groups)
    out = conv.conv_transpose2d(x, w, b, options)
    ref = F.conv_transpose2d(
        _t(x), _t(w), None if b is None else _t(b), stride, padding, padding_out, groups, dilation
    )
    _close(out, ref, dtype)


@pytest.mark.parametrize(
    ("xs", "ws", "stride", "padding", "padding_out", "dilation", "groups"),
    [
        ((2, 4, 3, 4, 5), (4, 2, 3, 3, 2), (2, 1, 2), (0, 1, 1), (1, 0, 1), (1, 2, 1), 2),
        ((1, 2, 3, 3, 3), (2, 3, 2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0), (1, 1, 1), 1),
        ((2, 2, 4, 3, 5), (2, 3, 2, 3, 2), (1, 1, 1), (0, 1, 0), (0, 0, 0), (1, 2, 1), 1),
    ],
)
@pytest.mark.parametrize("dtype", FLOATS)
def test_conv_transpose3d(xs, ws, stride, padding, padding_out, dilation, groups, dtype, lowering):
    x, w, b = _rand(xs, dtype), _rand(ws, dtype, 1), _rand(ws[1] * groups, dtype, 2)
    options = ConvTransposeOptions(stride, padding, padding_out, dilation, groups)
    out = conv.conv_transpose3d(x, w, b, options)
    ref = F.conv_transpose3d(_t(x), _t(w), _t(b), stride, padding, padding_out, groups, dilation)
    _close(out, ref, dtype)


def test_conv_transpose_in_blocks(monkeypatch, lowering, ndarray_threads):
    """The guide CNN's input gradient shape (16 -> 8 channels, stride 1: col2im with full
    rows) over many blocks of samples, a partial last one, on one thread and on three."""
    monkeypatch.setattr(conv, "_COLS_BUDGET_BYTES", 40_000)
    x, w = _rand((7, 16, 10, 9), np.float32), _rand((16, 8, 3, 3), np.float32, 1)
    out = conv.conv_transpose2d(x, w, None, ConvTransposeOptions((1, 1), (1, 0), (0, 0), (1, 1)))
    _close(out, F.conv_transpose2d(_t(x), _t(w), None, 1, (1, 0)), np.float32)


def test_conv_transpose_is_the_input_gradient_of_conv(lowering, ndarray_threads):
    """What autodiff uses it for: the gradient of a strided, padded conv wrt its input."""
    x, w = _rand((2, 3, 9, 8)), _rand((5, 3, 3, 3), seed=1)
    g, (gx,) = _grad(lambda t: F.conv2d(t, _t(w), None, 2, 1), x)
    out = conv.conv_transpose2d(g, w, None, ConvTransposeOptions((2, 2), (1, 1), (0, 1), (1, 1)))
    _close(out, gx, np.float64)


@pytest.mark.parametrize(
    ("xs", "kernel", "stride", "padding", "dilation"),
    [
        ((2, 3, 6, 7), (2, 3), (1, 1), (0, 0), (1, 1)),
        ((1, 2, 9, 8), (3, 3), (2, 1), (1, 2), (1, 2)),
        ((2, 1, 5, 5), (1, 1), (2, 2), (0, 0), (1, 1)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, BF16])
def test_unfold4d(xs, kernel, stride, padding, dilation, dtype):
    x = _rand(xs, dtype)
    out = conv.unfold4d(x, kernel, ConvOptions(stride, padding, dilation))
    ref = F.unfold(_t(x), kernel, dilation, padding, stride).numpy()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.astype(np.float64), ref)


# ============================================================================ pooling
def _pool(
    kernel, stride, padding, dilation=(1, 1), ceil_mode=False, count_include_pad=True
) -> PoolOptions:
    return PoolOptions(kernel, stride, padding, dilation, ceil_mode, count_include_pad)


MAX_POOL_CASES = [
    pytest.param((2, 3, 6, 7), _pool((2, 2), (2, 2), (0, 0)), id="2x2"),
    pytest.param((2, 3, 9, 8), _pool((3, 3), (2, 2), (1, 1)), id="3x3-s2-p1"),
    pytest.param((2, 3, 7, 6), _pool((3, 2), (2, 1), (1, 1)), id="nonsquare"),
    pytest.param((1, 2, 9, 9), _pool((3, 3), (2, 2), (1, 1), (2, 2)), id="dilation"),
    pytest.param((2, 3, 10, 7), _pool((3, 3), (2, 2), (1, 0), ceil_mode=True), id="ceil"),
    pytest.param((2, 3, 11, 12), _pool((4, 3), (3, 2), (2, 1), (2, 2), True), id="ceil-dilation"),
    pytest.param((1, 2, 5, 5), _pool((2, 2), (2, 2), (0, 0), ceil_mode=True), id="ceil-no-pad"),
    pytest.param((1, 1, 3, 3), _pool((3, 3), (1, 1), (1, 1)), id="same-size"),
    pytest.param((2, 2, 7, 7), _pool((3, 3), (1, 1), (0, 0)), id="overlapping"),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("xs", "options"), MAX_POOL_CASES)
def test_max_pool2d_with_indices(xs, options, dtype):
    x = _rand(xs, dtype)
    values, indices = pool.max_pool2d_with_indices(x, options)
    ref_v, ref_i = F.max_pool2d(_t(x), options.kernel_size, options.stride, options.padding,
                                options.dilation, options.ceil_mode, return_indices=True)  # fmt: skip
    assert values.dtype == np.dtype(dtype) and indices.dtype == np.int64
    np.testing.assert_array_equal(values.astype(np.float64), ref_v.numpy())
    np.testing.assert_array_equal(indices, ref_i.numpy())


@pytest.mark.parametrize(
    "x",
    [
        pytest.param(np.zeros((1, 1, 5, 5)), id="all-ties"),
        pytest.param(
            np.array(
                [
                    [
                        [
                            [0, np.nan, 1, 0],
                            [np.nan, 2, 0, np.nan],
                            [1, 1, -np.inf, 0],
                            [0, np.nan, 0, 0],
                        ]
                    ]
                ]
            ),
            id="nan",
        ),
        pytest.param(
            np.array([[[[-np.inf] * 4] * 3 + [[-np.inf, -np.inf, -np.inf, 1.0]]]]), id="neg-inf"
        ),
    ],
)
def test_max_pool2d_index_rules(x):
    """Ties go to the first maximum, NaN wins (the last NaN scanned), an all -inf window
    reports its first in-bounds position: as PyTorch's CPU kernel."""
    values, indices = pool.max_pool2d_with_indices(x, _pool((3, 3), (1, 1), (1, 1)))
    ref_v, ref_i = F.max_pool2d(_t(x), 3, 1, 1, return_indices=True)
    np.testing.assert_array_equal(values, ref_v.numpy())
    np.testing.assert_array_equal(indices, ref_i.numpy())


AVG_POOL_CASES = [
    pytest.param((2, 3, 6, 7), _pool((2, 2), (2, 2), (0, 0)), id="2x2"),
    pytest.param((2, 3, 7, 6), _pool((3, 2), (2, 1), (1, 1)), id="nonsquare"),
    pytest.param((1, 2, 6, 7), _pool((3, 3), (2, 2), (1, 1), ceil_mode=True), id="ceil"),
    pytest.param((2, 1, 5, 8), _pool((2, 4), (3, 3), (0, 0), ceil_mode=True), id="ceil-no-pad"),
    pytest.param((1, 1, 3, 3), _pool((3, 3), (3, 3), (0, 0)), id="global"),
    pytest.param((2, 2, 8, 9), _pool((3, 3), (1, 2), (1, 1)), id="overlapping"),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize(("xs", "options"), AVG_POOL_CASES)
def test_avg_pool2d(xs, options, count_include_pad, dtype):
    options = PoolOptions(options.kernel_size, options.stride, options.padding, options.dilation,
                          options.ceil_mode, count_include_pad)  # fmt: skip
    x = _rand(xs, dtype)
    out = pool.avg_pool2d(x, options)
    ref = F.avg_pool2d(_t(x), options.kernel_size, options.stride, options.padding, options.ceil_mode,
                       count_include_pad)  # fmt: skip
    _close(out, ref, dtype)


ADAPTIVE_CASES = [
    pytest.param((2, 3, 7, 9), (3, 4), id="uneven"),
    pytest.param((1, 2, 5, 5), (5, 5), id="identity"),
    pytest.param((1, 2, 4, 6), (1, 1), id="global"),
    pytest.param((1, 2, 3, 4), (5, 7), id="larger-output"),
    pytest.param((2, 1, 12, 6), (4, 3), id="divisible"),
    pytest.param((1, 2, 13, 5), (6, 2), id="mixed"),
    pytest.param((2, 3, 24, 24), (8, 8), id="guide-cnn"),
    pytest.param((1, 2, 6, 12), (3, 3), id="divisible-wide"),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("xs", "size"), ADAPTIVE_CASES)
def test_adaptive_pool2d(xs, size, dtype):
    x = _rand(xs, dtype)
    _close(pool.adaptive_avg_pool2d(x, size), F.adaptive_avg_pool2d(_t(x), size), dtype)
    out = pool.adaptive_max_pool2d(x, size)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(
        out.astype(np.float64), F.adaptive_max_pool2d(_t(x), size).numpy()
    )


def test_adaptive_max_pool2d_propagates_nan():
    x = _rand((1, 1, 5, 7))
    x[0, 0, 1, 2] = np.nan
    out = pool.adaptive_max_pool2d(x, (2, 3))
    np.testing.assert_array_equal(out, F.adaptive_max_pool2d(_t(x), (2, 3)).numpy())


# ---------------------------------------------------------------- pooling backward
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("xs", "options"), AVG_POOL_CASES[:4])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d_backward(xs, options, count_include_pad, dtype):
    options = PoolOptions(options.kernel_size, options.stride, options.padding, options.dilation,
                          options.ceil_mode, count_include_pad)  # fmt: skip
    x = _rand(xs, dtype)
    g, (gx,) = _grad(lambda t: F.avg_pool2d(t, options.kernel_size, options.stride, options.padding,
                                            options.ceil_mode, count_include_pad), x)  # fmt: skip
    _close(pool.avg_pool2d_backward(x, g.astype(dtype), options), gx, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("xs", "options"), MAX_POOL_CASES)
def test_max_pool2d_with_indices_backward(xs, options, dtype):
    x = _rand(xs, dtype)
    g, (gx,) = _grad(lambda t: F.max_pool2d(t, options.kernel_size, options.stride, options.padding,
                                            options.dilation, options.ceil_mode), x)  # fmt: skip
    _, indices = pool.max_pool2d_with_indices(x, options)
    _close(pool.max_pool2d_with_indices_backward(x, g.astype(dtype), indices, options), gx, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("xs", "size"), ADAPTIVE_CASES)
def test_adaptive_avg_pool2d_backward(xs, size, dtype):
    x = _rand(xs, dtype)
    g, (gx,) = _grad(lambda t: F.adaptive_avg_pool2d(t, size), x)
    _close(pool.adaptive_avg_pool2d_backward(x, g.astype(dtype)), gx, dtype)


# ============================================================================ interpolation
INTERP_SIZES = [
    pytest.param((2, 3, 5, 7), (9, 4), id="mixed"),
    pytest.param((1, 2, 6, 6), (12, 12), id="up2x"),
    pytest.param((1, 2, 13, 9), (7, 6), id="down"),
    pytest.param((1, 1, 4, 5), (4, 5), id="same"),
    pytest.param((1, 1, 4, 4), (1, 1), id="to-1x1"),
    pytest.param((1, 2, 1, 3), (4, 5), id="from-1-row"),
]
MODES = [
    ("nearest", False),
    ("bilinear", False),
    ("bilinear", True),
    ("bicubic", False),
    ("bicubic", True),
]


def _torch_interp(t, size, mode, align_corners):
    return F.interpolate(
        t, size=size, mode=mode, align_corners=None if mode == "nearest" else align_corners
    )


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("mode", "align_corners"), MODES)
@pytest.mark.parametrize(("xs", "size"), INTERP_SIZES)
def test_interpolate(xs, size, mode, align_corners, dtype):
    x = _rand(xs, dtype)
    out = resample.interpolate(x, size, InterpolateOptions(mode, align_corners))
    _close(out, _torch_interp(_t(x), size, mode, align_corners), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("mode", "align_corners"), MODES)
@pytest.mark.parametrize(("xs", "size"), INTERP_SIZES)
def test_interpolate_backward(xs, size, mode, align_corners, dtype):
    x = _rand(xs, dtype)
    g, (gx,) = _grad(lambda t: _torch_interp(t, size, mode, align_corners), x)
    out = resample.interpolate_backward(
        x, g.astype(dtype), size, InterpolateOptions(mode, align_corners)
    )
    _close(out, gx, dtype)


def test_interpolate_nearest_index_rule():
    """Legacy nearest: src = floor(dst * in / out) in float32, as PyTorch computes it,
    for every pair of sizes up to 40 x 60 (float32 rounding decides a few of them)."""
    for size in range(1, 41):
        x = np.arange(size, dtype=np.float64).reshape(1, 1, 1, size)
        ref = torch.from_numpy(x)
        for out in range(1, 61):
            got = resample.interpolate(x, (1, out), InterpolateOptions("nearest"))
            expected = F.interpolate(ref, size=(1, out), mode="nearest").numpy()
            np.testing.assert_array_equal(got, expected, err_msg=f"{size} -> {out}")


# ============================================================================ padding
PADS = [
    pytest.param(((1, 2),), id="last-dim"),
    pytest.param(((2, 1), (0, 3)), id="two-dims"),
    pytest.param(((1, 1), (2, 2), (1, 0)), id="three-dims"),
    pytest.param(((-1, 2), (2, -1)), id="negative"),
    pytest.param(((0, 0), (-2, 3)), id="crop-and-pad"),
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", PADS)
def test_pad(pads, mode):
    x = _rand((2, 3, 5, 6))
    out = resample.pad(x, PadOptions(pads, mode, 1.5))
    flat = [v for p in reversed(pads) for v in p]
    if mode == "constant":
        ref = F.pad(_t(x), flat, mode="constant", value=1.5)
    else:  # torch's reflect / replicate want exactly one dim before the padded ones
        k = len(pads)
        batched = _t(x).reshape(-1, *x.shape[x.ndim - k :])
        ref = F.pad(batched, flat, mode={"edge": "replicate"}.get(mode, mode)).reshape(out.shape)
    np.testing.assert_array_equal(out, ref.numpy())


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.float16, BF16])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_keeps_any_dtype(dtype, mode):
    x = (np.arange(20).reshape(4, 5) % 3).astype(dtype)
    pads = ((1, 2), (2, 1))
    out = resample.pad(x, PadOptions(pads, mode, 1))
    assert out.dtype == np.dtype(dtype)
    expected = np.pad(x.astype(np.int64), pads, mode={"constant": "constant"}.get(mode, mode),
                      **({"constant_values": 1} if mode == "constant" else {}))  # fmt: skip
    np.testing.assert_array_equal(out.astype(np.int64), expected)


# ============================================================================ embedding
@pytest.mark.parametrize("index_shape", [(3, 5), (7,), (0,), (2, 3, 4)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding_and_backward(index_shape, dtype):
    weights = _rand((10, 4), dtype)
    indices = np.random.default_rng(3).integers(0, 10, index_shape)  # repeats are likely
    out = resample.embedding(weights, indices)
    np.testing.assert_array_equal(
        out, F.embedding(torch.from_numpy(indices), torch.from_numpy(weights)).numpy()
    )
    g, (gw,) = _grad(lambda w: F.embedding(torch.from_numpy(indices), w), weights)
    _close(resample.embedding_backward(weights, g.astype(dtype), indices), gw, dtype)


# ============================================================================ dtypes, purity, layout
def _calls(dtype):
    """One call of every kernel on fresh inputs of ``dtype``: (name, fn, inputs, torch reference)."""
    x = _rand((2, 4, 9, 8), dtype)
    w, b = _rand((6, 2, 3, 3), dtype, 1), _rand(6, dtype, 2)
    wt, bt = _rand((4, 3, 3, 3), dtype, 3), _rand(6, dtype, 4)
    p = _pool((3, 3), (2, 2), (1, 1), ceil_mode=True)
    interp = InterpolateOptions("bicubic", False)
    g_pool = _rand((2, 4, 5, 5), dtype, 5)
    g_interp = _rand((2, 4, 5, 11), dtype, 6)
    weights, idx = _rand((10, 4), dtype, 7), np.array([[1, 3, 1], [9, 0, 3]])
    g_emb = _rand((2, 3, 4), dtype, 8)
    x3, w3, wt3 = (
        _rand((1, 2, 4, 5, 6), dtype, 9),
        _rand((3, 2, 2, 3, 2), dtype, 10),
        _rand((2, 3, 2, 2, 3), dtype, 11),
    )
    p_max = _pool((3, 3), (1, 1), (1, 1))
    max_idx = pool.max_pool2d_with_indices(x, p_max)[1]
    g_max, g_adapt = _rand((2, 4, 9, 8), dtype, 12), _rand((2, 4, 4, 3), dtype, 13)
    g_conv = _rand((2, 6, 9, 8), dtype, 14)
    tx = _t(x)
    return [
        ("conv2d", lambda: conv.conv2d(x, w, b, ConvOptions((1, 2), (1, 1), (1, 1), 2)), (x, w, b),
         F.conv2d(tx, _t(w), _t(b), (1, 2), 1, 1, 2)),
        ("conv_transpose2d", lambda: conv.conv_transpose2d(x, wt, bt, ConvTransposeOptions((2, 2), (1, 1), (1, 0), (1, 1), 2)),
         (x, wt, bt), F.conv_transpose2d(tx, _t(wt), _t(bt), 2, 1, (1, 0), 2)),
        ("avg_pool2d", lambda: pool.avg_pool2d(x, p), (x,), F.avg_pool2d(tx, 3, 2, 1, True)),
        ("max_pool2d", lambda: pool.max_pool2d_with_indices(x, p)[0], (x,), F.max_pool2d(tx, 3, 2, 1, ceil_mode=True)),
        ("adaptive_avg_pool2d", lambda: pool.adaptive_avg_pool2d(x, (4, 3)), (x,), F.adaptive_avg_pool2d(tx, (4, 3))),
        ("adaptive_max_pool2d", lambda: pool.adaptive_max_pool2d(x, (4, 3)), (x,), F.adaptive_max_pool2d(tx, (4, 3))),
        ("avg_pool2d_backward", lambda: pool.avg_pool2d_backward(x, g_pool, p), (x, g_pool),
         _grad_with(lambda t: F.avg_pool2d(t, 3, 2, 1, True), x, g_pool)),
        ("interpolate", lambda: resample.interpolate(x, (5, 11), interp), (x,),
         F.interpolate(tx, size=(5, 11), mode="bicubic", align_corners=False)),
        ("interpolate_backward", lambda: resample.interpolate_backward(x, g_interp, (5, 11), interp), (x, g_interp),
         _grad_with(lambda t: F.interpolate(t, size=(5, 11), mode="bicubic", align_corners=False), x, g_interp)),
        ("embedding_backward", lambda: resample.embedding_backward(weights, g_emb, idx), (weights, g_emb, idx),
         _grad_with(lambda t: F.embedding(torch.from_numpy(idx), t), weights, g_emb)),
        ("embedding", lambda: resample.embedding(weights, idx), (weights, idx),
         F.embedding(torch.from_numpy(idx), _t(weights))),
        ("weight_grad_nd", lambda: conv.weight_grad_nd(x, g_conv, (3, 3), (1, 1), (1, 1), (1, 1), 2),
         (x, g_conv), _grad_with(lambda t: F.conv2d(tx, t, None, 1, 1, 1, 2), w, g_conv)),
        ("conv3d", lambda: conv.conv3d(x3, w3, None, ConvOptions((1, 1, 2), (1, 0, 1), (1, 1, 1))), (x3, w3),
         F.conv3d(_t(x3), _t(w3), None, (1, 1, 2), (1, 0, 1))),
        ("conv_transpose3d", lambda: conv.conv_transpose3d(x3, wt3, None, ConvTransposeOptions((2, 1, 2), (1, 0, 0), (0, 0, 1), (1, 1, 1))),
         (x3, wt3), F.conv_transpose3d(_t(x3), _t(wt3), None, (2, 1, 2), (1, 0, 0), (0, 0, 1))),
        ("unfold4d", lambda: conv.unfold4d(x, (2, 3), ConvOptions((1, 2), (1, 0), (1, 1))), (x,),
         F.unfold(tx, (2, 3), 1, (1, 0), (1, 2))),
        ("max_pool2d_backward", lambda: pool.max_pool2d_with_indices_backward(x, g_max, max_idx, p_max), (x, g_max, max_idx),
         _grad_with(lambda t: F.max_pool2d(t, 3, 1, 1), x, g_max)),
        ("adaptive_avg_pool2d_backward", lambda: pool.adaptive_avg_pool2d_backward(x, g_adapt), (x, g_adapt),
         _grad_with(lambda t: F.adaptive_avg_pool2d(t, (4, 3)), x, g_adapt)),
        ("pad", lambda: resample.pad(x, PadOptions(((1, 2), (2, 1)), "reflect")), (x,),
         F.pad(tx, (2, 1, 1, 2), mode="reflect")),
    ]  # fmt: skip


def _grad_with(fn, x, g):
    t = _t(x).requires_grad_()
    fn(t).backward(_t(g))
    return t.grad


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_half_precision_keeps_dtype(dtype):
    for name, fn, _, ref in _calls(dtype):
        out = fn()
        assert out.dtype == np.dtype(dtype), name
        rtol, atol = TOL[np.dtype(dtype)]
        np.testing.assert_allclose(out.astype(np.float64), ref.detach().numpy(), rtol=rtol, atol=atol * 4,
                                   err_msg=name)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernels_are_pure(dtype):
    """Inputs are never written to, outputs never alias them and are C-contiguous."""
    for name, fn, inputs, ref in _calls(dtype):
        before = [a.copy() for a in inputs]
        out = fn()
        assert out.flags.c_contiguous and out.flags.writeable, name
        for a, b in zip(inputs, before):
            np.testing.assert_array_equal(a, b, err_msg=name)
            assert not np.shares_memory(out, a), name
        _close(out, ref, dtype)


def test_conv2d_casts_weight_and_bias_to_the_input_dtype():
    x, w, b = _rand((1, 2, 5, 5), np.float32), _rand((3, 2, 3, 3), seed=1), _rand(3, seed=2)
    out = conv.conv2d(x, w, b, ConvOptions((1, 1), (1, 1), (1, 1)))
    _close(out, F.conv2d(_t(x), _t(w), _t(b), 1, 1), np.float32)


def test_scratch_reuse_between_calls():
    """Scratch buffers are shared between calls: earlier results must stay intact."""
    x1, w1 = _rand((5, 3, 12, 11), np.float32), _rand((4, 3, 3, 3), np.float32, 1)
    x2, w2 = _rand((3, 2, 20, 20), np.float32, 2), _rand((6, 2, 5, 5), np.float32, 3)
    a = conv.conv2d(x1, w1, None, ConvOptions((1, 1), (1, 1), (1, 1)))
    a_copy = a.copy()
    b = conv.conv2d(x2, w2, None, ConvOptions((1, 1), (2, 2), (1, 1)))
    c = conv.conv2d(x1, w1, None, ConvOptions((1, 1), (1, 1), (1, 1)))
    np.testing.assert_array_equal(a, a_copy)
    np.testing.assert_array_equal(a, c)
    _close(b, F.conv2d(_t(x2), _t(w2), None, 1, 2), np.float32)


def test_non_contiguous_inputs():
    base = _rand((2, 9, 4, 8))
    x = base.transpose(0, 3, 2, 1)[:, :, :, ::2]  # [2, 8, 4, 5], no unit stride anywhere
    w = _rand((3, 8, 3, 3), seed=1)[:, :, ::-1]
    tx, tw = _t(x), _t(w)
    _close(conv.conv2d(x, w, None, ConvOptions((1, 1), (1, 0), (1, 1))), F.conv2d(tx, tw, None, 1, (1, 0)),
           np.float64)  # fmt: skip
    _close(
        conv.conv2d(x, w, None, ConvOptions((1, 1), (0, 0), (1, 1))), F.conv2d(tx, tw), np.float64
    )
    values, indices = pool.max_pool2d_with_indices(x, _pool((2, 2), (1, 2), (1, 0)))
    ref_v, ref_i = F.max_pool2d(tx, (2, 2), (1, 2), (1, 0), return_indices=True)
    np.testing.assert_array_equal(values, ref_v.numpy())
    np.testing.assert_array_equal(indices, ref_i.numpy())
    _close(resample.interpolate(x, (7, 3), InterpolateOptions("bilinear")),
           F.interpolate(tx, size=(7, 3), mode="bilinear", align_corners=False), np.float64)  # fmt: skip


@pytest.mark.parametrize("dtype", FLOATS)
def test_empty_batch(dtype):
    x = np.zeros((0, 3, 6, 6), dtype)
    w = _rand((4, 3, 3, 3), dtype)
    assert conv.conv2d(x, w, None, ConvOptions((1, 1), (1, 1), (1, 1))).shape == (0, 4, 6, 6)
    wt = _rand((3, 2, 3, 3), dtype)
    assert conv.conv_transpose2d(
        x, wt, None, ConvTransposeOptions((2, 2), (0, 0), (0, 0), (1, 1))
    ).shape == (0, 2, 13, 13)
    for stride in ((1, 1), (2, 2)):  # each col2im layout (full rows at stride 1)
        assert conv._conv_transpose_col2im(x, _rand((3, 8, 3, 3), dtype), None, stride, (0, 0),
                                           (8, 8), (1, 1), 1).shape == (0, 8, 8, 8)  # fmt: skip
    values, indices = pool.max_pool2d_with_indices(x, _pool((2, 2), (2, 2), (0, 0)))
    assert values.shape == indices.shape == (0, 3, 3, 3)
    assert (
        pool.max_pool2d_with_indices_backward(
            x, values, indices, _pool((2, 2), (2, 2), (0, 0))
        ).shape
        == x.shape
    )
    assert pool.avg_pool2d(x, _pool((2, 2), (2, 2), (0, 0))).shape == (0, 3, 3, 3)
    assert resample.interpolate(x, (3, 9), InterpolateOptions("bilinear")).shape == (0, 3, 3, 9)
