"""Conformance of the functional module ops (``ember.tensor.module``) with ``torch.nn.functional``.

Convolutions, transposed convolutions, pooling (average, max with indices,
adaptive), embedding, interpolation and ``unfold4d`` run through the public
API on the ``device`` fixture. The reference is PyTorch on CPU, computed in
float64 from the very same (rounded) inputs and cast to the dtype under test:
float64 is compared tightly, float32 with rtol 1e-4 / atol 1e-5, f16 / bf16
loosely; copies (embedding, unfold, indices) exactly.

The backward helpers (``avg_pool2d_backward``, ``max_pool2d_with_indices_backward``,
``adaptive_avg_pool2d_backward``, ``interpolate_backward``, ``embedding_backward``)
and the convolution gradients (``conv_x_backward``, ``conv_weight_backward`` and
their ``conv_transpose`` pair) are protocol-level ops that autodiff decorators
call: they are tested through ``device.backend`` on primitives against PyTorch
autograd.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import FLOAT_DTYPES, TORCH_DTYPE, assert_close, from_torch

import ember
from ember import DType, Tensor
from ember.backend import Backend, conv_grad
from ember.backend.options import ConvOptions, ConvTransposeOptions, InterpolateOptions, PoolOptions
from ember.tensor import module

FLOATS = [DType.F64, DType.F32]
HALF = [DType.F16, DType.BF16]
TOL = {  # (rtol, atol) of the results of arithmetic (sums of products, averages)
    DType.F64: (1e-10, 1e-12),
    DType.F32: (1e-4, 1e-5),
    DType.F16: (1e-2, 1e-2),
    DType.BF16: (4e-2, 4e-2),
}
EXACT = (0.0, 0.0)


def _id(value) -> str:
    return value.value if isinstance(value, DType) else str(value)


def _randn(dtype: DType, *shapes, seed: int = 0) -> list[torch.Tensor]:
    """Standard-normal reference tensors of ``dtype``, one per shape."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(s, generator=gen, dtype=torch.float64).to(TORCH_DTYPE[dtype]) for s in shapes
    ]


def _weights(dtype: DType, shape, seed: int = 1) -> torch.Tensor:
    """Normal weights scaled by 1/sqrt(fan in), as layers initialize them: outputs stay near 1."""
    (w,) = _randn(DType.F64, shape, seed=seed)
    return (w / math.sqrt(math.prod(shape[1:]))).to(TORCH_DTYPE[dtype])


def _ember(device, tensors) -> list[Tensor | None]:
    return [None if t is None else from_torch(t, device) for t in tensors]


def _reference(torch_fn: Callable, tensors, dtype: DType) -> torch.Tensor:
    """``torch_fn`` in float64 on the reference tensors, cast to ``dtype``."""
    out = torch_fn(
        *[None if t is None or not t.is_floating_point() else t.double() for t in tensors]
    )
    return out.to(TORCH_DTYPE[dtype])


def _check(device, dtype, ember_fn, torch_fn, *tensors, tol=None) -> Tensor:
    """Runs ``ember_fn`` on ember copies of ``tensors`` and compares it with ``torch_fn``."""
    actual = ember_fn(*_ember(device, tensors))
    assert_close(actual, _reference(torch_fn, tensors, dtype), *(tol or TOL[dtype]))
    return actual


def _torch_kwargs(kwargs: dict) -> dict:
    """ember's keyword arguments spelled as torch's."""
    out = dict(kwargs)
    if "padding_out" in out:
        out["output_padding"] = out.pop("padding_out")
    return out


# ============================================================================ convolution
CONV_CASES = [
    pytest.param(2, [2, 3, 7, 6], [4, 3, 3, 3], {}, id="2d-plain"),
    pytest.param(2, [2, 3, 9, 8], [4, 3, 2, 3], dict(stride=(2, 1), padding=(1, 2), dilation=(2, 1)),
                 id="2d-nonsquare-stride-pad-dilation"),
    pytest.param(2, [1, 4, 6, 6], [6, 2, 3, 3], dict(groups=2, padding=1), id="2d-groups2-batch1"),
    pytest.param(2, [2, 3, 6, 5], [3, 1, 3, 3], dict(groups=3, stride=2, padding=1), id="2d-depthwise"),
    pytest.param(2, [2, 3, 6, 5], [6, 1, 2, 2], dict(groups=3), id="2d-depthwise-x2"),
    pytest.param(2, [1, 2, 3, 4], [5, 2, 3, 4], {}, id="2d-kernel-equals-input"),
    pytest.param(2, [2, 5, 4, 4], [3, 5, 1, 1], dict(stride=3), id="2d-1x1-stride3"),
    pytest.param(2, [2, 2, 3, 3], [2, 2, 3, 3], dict(padding=2, dilation=2), id="2d-dilation-pad"),
    pytest.param(2, [0, 2, 5, 5], [3, 2, 3, 3], {}, id="2d-empty-batch"),
    pytest.param(1, [2, 3, 10], [4, 3, 3], dict(stride=2, padding=1, dilation=2), id="1d-stride-pad-dil"),
    pytest.param(1, [1, 4, 7], [4, 1, 3], dict(groups=4, padding=2), id="1d-depthwise"),
    pytest.param(1, [2, 2, 5], [3, 2, 5], {}, id="1d-kernel-equals-input"),
    pytest.param(3, [2, 2, 5, 6, 4], [3, 2, 2, 3, 2],
                 dict(stride=(1, 2, 1), padding=(1, 0, 1), dilation=(1, 1, 2)), id="3d-nonsquare"),
    pytest.param(3, [1, 4, 4, 4, 4], [4, 2, 3, 3, 3], dict(groups=2, padding=1), id="3d-groups2"),
    pytest.param(3, [1, 3, 3, 4, 5], [3, 1, 1, 2, 3], dict(groups=3, stride=2), id="3d-depthwise"),
]  # fmt: skip

CONV_TRANSPOSE_CASES = [
    pytest.param(2, [2, 3, 4, 5], [3, 2, 3, 3], {}, id="2d-plain"),
    pytest.param(2, [2, 3, 4, 5], [3, 2, 3, 2], dict(stride=2, padding=1, padding_out=1), id="2d-padding-out"),
    pytest.param(2, [1, 2, 3, 4], [2, 3, 2, 3],
                 dict(stride=(3, 2), padding=(1, 0), padding_out=(2, 1), dilation=(1, 2)), id="2d-nonsquare"),
    pytest.param(2, [2, 4, 3, 3], [4, 1, 3, 3], dict(groups=4, stride=2), id="2d-depthwise"),
    pytest.param(2, [1, 4, 3, 3], [4, 3, 2, 2], dict(groups=2, dilation=2, padding_out=1),
                 id="2d-groups-dilation-padding-out"),
    pytest.param(2, [0, 2, 3, 3], [2, 2, 3, 3], {}, id="2d-empty-batch"),
    pytest.param(1, [2, 3, 6], [3, 2, 3], dict(stride=2, padding=1, padding_out=1), id="1d-padding-out"),
    pytest.param(1, [1, 4, 5], [4, 2, 4], dict(groups=2, dilation=2), id="1d-groups-dilation"),
    pytest.param(3, [1, 2, 3, 2, 3], [2, 3, 2, 3, 2],
                 dict(stride=(2, 1, 2), padding=(1, 1, 0), padding_out=(1, 0, 1)), id="3d-padding-out"),
    pytest.param(3, [2, 4, 2, 3, 2], [4, 1, 2, 2, 2], dict(groups=2, dilation=(1, 2, 1)), id="3d-groups"),
]  # fmt: skip


def _check_conv(device, dtype, name, x_shape, w_shape, kwargs, bias, transpose=False):
    c_out = w_shape[1] * kwargs.get("groups", 1) if transpose else w_shape[0]
    x, b = _randn(dtype, x_shape, [c_out])
    w = _weights(dtype, w_shape)
    ember_op, torch_op = getattr(module, name), getattr(F, name)
    torch_kwargs = _torch_kwargs(kwargs)
    return _check(
        device, dtype,
        lambda x, w, b: ember_op(x, w, b, **kwargs),
        lambda x, w, b: torch_op(x, w, b, **torch_kwargs),
        x, w, b if bias else None,
    )  # fmt: skip


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("n", "x_shape", "w_shape", "kwargs"), CONV_CASES)
def test_conv(device, n, x_shape, w_shape, kwargs, dtype, bias):
    _check_conv(device, dtype, f"conv{n}d", x_shape, w_shape, kwargs, bias)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("n", "x_shape", "w_shape", "kwargs"), CONV_TRANSPOSE_CASES)
def test_conv_transpose(device, n, x_shape, w_shape, kwargs, dtype, bias):
    _check_conv(
        device, dtype, f"conv_transpose{n}d", x_shape, w_shape, kwargs, bias, transpose=True
    )


@pytest.mark.parametrize("dtype", HALF, ids=_id)
@pytest.mark.parametrize(("n", "x_shape", "w_shape", "kwargs"),
                         [c for c in CONV_CASES if c.values[0] == 2][:5])  # fmt: skip
def test_conv2d_half_precision(device, n, x_shape, w_shape, kwargs, dtype):
    _check_conv(device, dtype, "conv2d", x_shape, w_shape, kwargs, bias=True)


@pytest.mark.parametrize("dtype", HALF, ids=_id)
def test_conv_transpose2d_half_precision(device, dtype):
    _check_conv(device, dtype, "conv_transpose2d", [2, 3, 4, 5], [3, 2, 3, 2],
                dict(stride=2, padding=1, padding_out=1), bias=True, transpose=True)  # fmt: skip


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
def test_conv2d_guide_shapes(device, dtype):
    """The guide's MNIST model: [64, 1, 28, 28] -> 8 channels 3x3 -> 16 channels 3x3."""
    x, b1, b2 = _randn(dtype, [64, 1, 28, 28], [8], [16])
    tensors = x, _weights(dtype, [8, 1, 3, 3]), b1, _weights(dtype, [16, 8, 3, 3]), b2

    def ember_fn(x, w1, b1, w2, b2):
        return module.conv2d(module.conv2d(x, w1, b1), w2, b2)

    def torch_fn(x, w1, b1, w2, b2):
        return F.conv2d(F.conv2d(x, w1, b1), w2, b2)

    out = _check(device, dtype, ember_fn, torch_fn, *tensors)
    assert out.shape == (64, 16, 24, 24)


def test_conv2d_casts_weights_to_the_input_dtype(device):
    """A weight and bias of another float dtype are cast to the input's dtype."""
    x, w, b = _randn(DType.F32, [1, 2, 5, 5], [3, 2, 3, 3], [3])
    out = module.conv2d(
        from_torch(x, device), from_torch(w.double(), device), from_torch(b.double(), device)
    )
    assert_close(out, F.conv2d(x, w, b), *TOL[DType.F32])


@st.composite
def _conv2d_configs(draw):
    groups = draw(st.integers(1, 3))
    c_in, c_out = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(2)]
    stride = [draw(st.integers(1, 3)) for _ in range(2)]
    padding = [draw(st.integers(0, 2)) for _ in range(2)]
    dilation = [draw(st.integers(1, 2)) for _ in range(2)]
    spatial = [
        draw(st.integers(max(1, d * (k - 1) + 1 - 2 * p), 7))
        for k, p, d in zip(kernel, padding, dilation)
    ]
    batch = draw(st.integers(1, 2))
    return ([batch, c_in, *spatial], [c_out, c_in // groups, *kernel],
            dict(stride=stride, padding=padding, dilation=dilation, groups=groups))  # fmt: skip


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=_conv2d_configs(), bias=st.booleans())
def test_conv2d_random_configs(device, config, bias):
    x_shape, w_shape, kwargs = config
    _check_conv(device, DType.F64, "conv2d", x_shape, w_shape, kwargs, bias)


# ============================================================================ pooling
AVG_POOL_CASES = [
    pytest.param(2, [2, 3, 6, 7], dict(kernel_size=2), id="2d-plain"),
    pytest.param(2, [2, 3, 7, 6], dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1)), id="2d-nonsquare"),
    pytest.param(2, [1, 2, 7, 7], dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                 id="2d-exclude-pad"),
    pytest.param(2, [1, 2, 6, 7], dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), id="2d-ceil"),
    pytest.param(2, [1, 2, 6, 7], dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                       count_include_pad=False), id="2d-ceil-exclude-pad"),
    pytest.param(2, [2, 1, 5, 8], dict(kernel_size=(2, 4), stride=3, ceil_mode=True), id="2d-ceil-no-pad"),
    pytest.param(2, [1, 1, 3, 3], dict(kernel_size=3), id="2d-global"),
    pytest.param(2, [0, 2, 4, 4], dict(kernel_size=2), id="2d-empty-batch"),
    pytest.param(1, [2, 3, 9], dict(kernel_size=3), id="1d-plain"),
    pytest.param(1, [2, 3, 10], dict(kernel_size=4, stride=3, padding=2, ceil_mode=True), id="1d-ceil"),
    pytest.param(1, [1, 2, 8], dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                 id="1d-exclude-pad"),
]  # fmt: skip

MAX_POOL_CASES = [
    pytest.param(2, [2, 3, 6, 7], dict(kernel_size=2), id="2d-plain"),
    pytest.param(2, [2, 3, 7, 6], dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1)), id="2d-nonsquare"),
    pytest.param(2, [1, 2, 9, 9], dict(kernel_size=3, stride=2, padding=1, dilation=2), id="2d-dilation"),
    pytest.param(2, [1, 2, 6, 7], dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), id="2d-ceil"),
    pytest.param(2, [2, 1, 5, 8], dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1), ceil_mode=True),
                 id="2d-ceil-dilation"),
    pytest.param(2, [1, 1, 3, 3], dict(kernel_size=3, stride=1, padding=1), id="2d-same-size"),
    pytest.param(2, [0, 2, 4, 4], dict(kernel_size=2), id="2d-empty-batch"),
    pytest.param(1, [2, 3, 9], dict(kernel_size=3), id="1d-plain"),
    pytest.param(1, [2, 3, 10], dict(kernel_size=4, stride=3, padding=2, ceil_mode=True), id="1d-ceil"),
    pytest.param(1, [1, 2, 11], dict(kernel_size=2, stride=1, padding=1, dilation=3), id="1d-dilation"),
]  # fmt: skip

ADAPTIVE_CASES = [
    pytest.param(2, [2, 3, 7, 9], (3, 4), id="2d-uneven"),
    pytest.param(2, [1, 2, 5, 5], (5, 5), id="2d-identity"),
    pytest.param(2, [1, 2, 4, 6], (1, 1), id="2d-global"),
    pytest.param(2, [1, 2, 3, 4], (5, 7), id="2d-larger-output"),
    pytest.param(2, [2, 1, 10, 6], 3, id="2d-int-size"),
    pytest.param(1, [2, 3, 10], 4, id="1d-uneven"),
    pytest.param(1, [2, 3, 5], 7, id="1d-larger-output"),
    pytest.param(1, [1, 2, 6], 1, id="1d-global"),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("n", "x_shape", "kwargs"), AVG_POOL_CASES)
def test_avg_pool(device, n, x_shape, kwargs, dtype):
    op, ref = getattr(module, f"avg_pool{n}d"), getattr(F, f"avg_pool{n}d")
    _check(
        device,
        dtype,
        lambda x: op(x, **kwargs),
        lambda x: ref(x, **kwargs),
        *_randn(dtype, x_shape),
    )


def _check_max_pool(device, dtype, n, x, kwargs):
    """Values of max_pool and max_pool_with_indices, and the indices (exact)."""
    ref_values, ref_indices = getattr(F, f"max_pool{n}d")(x.double(), return_indices=True, **kwargs)
    ex = from_torch(x, device)
    values, indices = getattr(module, f"max_pool{n}d_with_indices")(ex, **kwargs)
    assert_close(values, ref_values.to(x.dtype), *EXACT)
    assert_close(indices, ref_indices)
    assert_close(getattr(module, f"max_pool{n}d")(ex, **kwargs), ref_values.to(x.dtype), *EXACT)


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("n", "x_shape", "kwargs"), MAX_POOL_CASES)
def test_max_pool(device, n, x_shape, kwargs, dtype):
    _check_max_pool(device, dtype, n, *_randn(dtype, x_shape), kwargs)


@pytest.mark.parametrize(
    ("n", "x_shape", "kwargs"), [c for c in MAX_POOL_CASES if "empty" not in c.id]
)
def test_max_pool_ties_pick_the_first_maximum(device, n, x_shape, kwargs):
    """Among equal maxima the index is the first in the window, in row-major order."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(-1, 2, x_shape, generator=gen).double()
    _check_max_pool(device, DType.F64, n, x, kwargs)


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize(("n", "x_shape", "size"), ADAPTIVE_CASES)
def test_adaptive_pool(device, n, x_shape, size, kind, dtype):
    op, ref = getattr(module, f"adaptive_{kind}_pool{n}d"), getattr(F, f"adaptive_{kind}_pool{n}d")
    _check(device, dtype, lambda x: op(x, size), lambda x: ref(x, size), *_randn(dtype, x_shape))


@pytest.mark.parametrize("dtype", HALF, ids=_id)
@pytest.mark.parametrize(
    "name", ["avg_pool2d", "max_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d"]
)
def test_pool2d_half_precision(device, name, dtype):
    args = (3,) if name.startswith("adaptive") else (3, 2, 1)
    op, ref = getattr(module, name), getattr(F, name)
    _check(
        device, dtype, lambda x: op(x, *args), lambda x: ref(x, *args), *_randn(dtype, [2, 3, 7, 8])
    )


@st.composite
def _pool2d_configs(draw):
    kernel = [draw(st.integers(1, 4)) for _ in range(2)]
    stride = [draw(st.integers(1, 3)) for _ in range(2)]
    padding = [draw(st.integers(0, k // 2)) for k in kernel]
    spatial = [draw(st.integers(max(1, k - 2 * p), 8)) for k, p in zip(kernel, padding)]
    kwargs = dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=draw(st.booleans()))
    return [draw(st.integers(1, 2)), 2, *spatial], kwargs


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=_pool2d_configs(), count_include_pad=st.booleans())
def test_pool2d_random_configs(device, config, count_include_pad):
    x_shape, kwargs = config
    (x,) = _randn(DType.F64, x_shape)
    _check_max_pool(device, DType.F64, 2, x, kwargs)
    avg = dict(kwargs, count_include_pad=count_include_pad)
    _check(
        device,
        DType.F64,
        lambda x: module.avg_pool2d(x, **avg),
        lambda x: F.avg_pool2d(x, **avg),
        x,
    )


# ============================================================================ embedding
@pytest.mark.parametrize("index_dtype", [DType.I64, DType.I32], ids=_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=_id)
@pytest.mark.parametrize("index_shape", [[5], [2, 3], [], [0], [2, 0, 3]], ids=str)
def test_embedding(device, index_shape, dtype, index_dtype):
    (weights,) = _randn(dtype, [10, 4])
    indices = torch.randint(0, 10, index_shape, generator=torch.Generator().manual_seed(2))
    out = module.embedding(
        from_torch(weights, device), from_torch(indices.to(TORCH_DTYPE[index_dtype]), device)
    )
    assert_close(out, F.embedding(indices, weights), *EXACT)


# ============================================================================ interpolation
INTERPOLATE_MODES = [
    pytest.param("nearest", False, id="nearest"),
    pytest.param("bilinear", False, id="bilinear"),
    pytest.param("bilinear", True, id="bilinear-align"),
    pytest.param("bicubic", False, id="bicubic"),
    pytest.param("bicubic", True, id="bicubic-align"),
]
INTERPOLATE_CASES = [
    pytest.param([2, 3, 4, 5], (7, 9), id="up"),
    pytest.param([2, 3, 8, 6], (3, 4), id="down"),
    pytest.param([1, 2, 4, 3], (8, 6), id="double"),
    pytest.param([1, 2, 5, 5], (5, 5), id="same"),
    pytest.param([1, 1, 4, 4], (1, 1), id="to-1x1"),
    pytest.param([1, 2, 1, 1], (3, 4), id="from-1x1"),
    pytest.param([1, 2, 3, 7], (6, 2), id="mixed"),
    pytest.param([1, 1, 6, 10], (4, 6), id="inexact-scale"),
]


def _torch_interpolate(x, size, mode, align_corners):
    """torch's interpolate; ember's 1-d bilinear is torch's linear, its 1-d bicubic a bicubic
    resize of height 1."""
    corners = None if mode == "nearest" else align_corners
    if x.dim() == 4:
        return F.interpolate(x, size=size, mode=mode, align_corners=corners)
    if mode == "bicubic":
        return F.interpolate(
            x.unsqueeze(2), size=(1, size), mode=mode, align_corners=corners
        ).squeeze(2)
    return F.interpolate(
        x, size=size, mode="linear" if mode == "bilinear" else mode, align_corners=corners
    )


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("mode", "align_corners"), INTERPOLATE_MODES)
@pytest.mark.parametrize(("x_shape", "size"), INTERPOLATE_CASES)
def test_interpolate(device, x_shape, size, mode, align_corners, dtype):
    _check(device, dtype,
           lambda x: module.interpolate(x, size, mode, align_corners),
           lambda x: _torch_interpolate(x, size, mode, align_corners), *_randn(dtype, x_shape))  # fmt: skip


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("mode", "align_corners"), INTERPOLATE_MODES)
@pytest.mark.parametrize(
    ("x_shape", "size"), [([2, 3, 5], 8), ([2, 3, 9], 4), ([1, 2, 6], 12)], ids=str
)
def test_interpolate_1d(device, x_shape, size, mode, align_corners, dtype):
    _check(device, dtype,
           lambda x: module.interpolate(x, size, mode, align_corners),
           lambda x: _torch_interpolate(x, size, mode, align_corners), *_randn(dtype, x_shape))  # fmt: skip


@pytest.mark.parametrize("dtype", HALF, ids=_id)
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_interpolate_half_precision(device, mode, dtype):
    _check(device, dtype,
           lambda x: module.interpolate(x, (7, 9), mode),
           lambda x: _torch_interpolate(x, (7, 9), mode, False), *_randn(dtype, [2, 3, 4, 5]))  # fmt: skip


# ============================================================================ unfold
UNFOLD_CASES = [
    pytest.param([2, 3, 6, 7], dict(kernel_size=3), id="plain"),
    pytest.param([1, 2, 7, 6], dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 2), dilation=(2, 1)),
                 id="nonsquare-all-options"),
    pytest.param([2, 1, 4, 4], dict(kernel_size=4), id="one-block"),
    pytest.param([1, 3, 3, 5], dict(kernel_size=1, stride=2), id="1x1"),
    pytest.param([0, 2, 4, 4], dict(kernel_size=2), id="empty-batch"),
]  # fmt: skip


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=_id)
@pytest.mark.parametrize(("x_shape", "kwargs"), UNFOLD_CASES)
def test_unfold4d(device, x_shape, kwargs, dtype):
    """A copy of the input's elements: exact in every float dtype."""
    _check(device, dtype, lambda x: module.unfold4d(x, **kwargs), lambda x: F.unfold(x, **kwargs),
           *_randn(dtype, x_shape), tol=EXACT)  # fmt: skip


# ============================================================================ errors
def _t(device, *shape, dtype: DType = DType.F32) -> Tensor:
    return Tensor.ones(list(shape), device, dtype=dtype)


def _conv2d(d, x_shape, w_shape, b_shape=None, **kwargs):
    bias = None if b_shape is None else _t(d, *b_shape)
    return module.conv2d(_t(d, *x_shape), _t(d, *w_shape), bias, **kwargs)


def _conv_t2d(d, x_shape, w_shape, b_shape=None, **kwargs):
    bias = None if b_shape is None else _t(d, *b_shape)
    return module.conv_transpose2d(_t(d, *x_shape), _t(d, *w_shape), bias, **kwargs)


SE, KE, AE = ember.ShapeError, ember.KindError, ember.ArgumentError
ERROR_CASES = [
    # --- convolution: rank, channels / groups, bias, size, kind, attributes
    (lambda d: _conv2d(d, [3, 5, 5], [2, 3, 3, 3]), SE, r"conv2d: input must have rank 4 .*\[3, 5, 5\]"),
    (lambda d: _conv2d(d, [1, 3, 5, 5], [2, 3, 3]), SE, r"conv2d: weight .*rank 4.*\[2, 3, 3\]"),
    (lambda d: module.conv2d(_t(d, 3, 5, 5), _t(d, 2, 3, 3)), SE, r"conv2d: .*rank 4.*\[3, 5, 5\]"),
    (lambda d: module.conv1d(_t(d, 1, 3, 5, 5), _t(d, 2, 3, 3)), SE,
     r"conv1d: input must have rank 3 .*\[1, 3, 5, 5\]"),
    (lambda d: module.conv3d(_t(d, 1, 3, 5, 5), _t(d, 2, 3, 3, 3, 3)), SE,
     r"conv3d: input must have rank 5 .*\[1, 3, 5, 5\]"),
    (lambda d: _conv2d(d, [2, 3, 5, 5], [4, 2, 3, 3]), SE,
     r"conv2d: weight \[4, 2, 3, 3\] does not fit input \[2, 3, 5, 5\] with groups=1"),
    (lambda d: _conv2d(d, [2, 4, 5, 5], [6, 2, 3, 3], groups=3), SE,
     r"conv2d: weight \[6, 2, 3, 3\] does not fit input \[2, 4, 5, 5\] with groups=3"),
    (lambda d: _conv2d(d, [1, 4, 5, 5], [3, 2, 3, 3], groups=2), SE,
     r"conv2d: weight \[3, 2, 3, 3\] does not fit input \[1, 4, 5, 5\] with groups=2"),
    (lambda d: _conv2d(d, [1, 3, 5, 5], [4, 3, 3, 3], [3]), SE, r"conv2d: bias must have shape \[4\], got \[3\]"),
    (lambda d: _conv2d(d, [1, 3, 5, 5], [4, 3, 3, 3], [1, 4]), SE,
     r"conv2d: bias must have shape \[4\], got \[1, 4\]"),
    (lambda d: _conv2d(d, [1, 1, 2, 2], [1, 1, 3, 3]), SE,
     r"conv2d: input \[1, 1, 2, 2\] is too small for kernel \[3, 3\]"),
    (lambda d: module.conv1d(_t(d, 1, 1, 5), _t(d, 1, 1, 3), dilation=3), SE,
     r"conv1d: input \[1, 1, 5\] is too small for kernel \[3\]"),
    (lambda d: module.conv2d(_t(d, 1, 1, 4, 4, dtype=DType.I64), _t(d, 1, 1, 3, 3)), KE,
     r"conv2d: .*Float.*Int tensor of shape \[1, 1, 4, 4\] \(i64\)"),
    (lambda d: module.conv2d(_t(d, 1, 1, 4, 4), _t(d, 1, 1, 3, 3, dtype=DType.I32)), KE,
     r"conv2d: .*Int tensor of shape \[1, 1, 3, 3\] \(i32\)"),
    (lambda d: module.conv1d(_t(d, 1, 1, 4, dtype=DType.BOOL), _t(d, 1, 1, 3)), KE,
     r"conv1d: .*Bool tensor of shape \[1, 1, 4\]"),
    (lambda d: _conv2d(d, [1, 2, 5, 5], [2, 2, 3, 3], groups=0), AE, r"conv2d: groups must be >= 1, got 0"),
    (lambda d: _conv2d(d, [1, 2, 5, 5], [2, 2, 3, 3], stride=0), AE, r"conv2d: stride values must be >= 1"),
    (lambda d: _conv2d(d, [1, 2, 5, 5], [2, 2, 3, 3], padding=(1, -1)), AE,
     r"conv2d: padding values must be >= 0, got \[1, -1\]"),
    (lambda d: _conv2d(d, [1, 2, 5, 5], [2, 2, 3, 3], stride=(1, 2, 3)), AE,
     r"conv2d: stride needs 1 or 2 values, got \[1, 2, 3\]"),
    # --- transposed convolution
    (lambda d: _conv_t2d(d, [1, 3, 4, 4], [2, 3, 3, 3]), SE,
     r"conv_transpose2d: weight \[2, 3, 3, 3\] does not fit input \[1, 3, 4, 4\]"),
    (lambda d: _conv_t2d(d, [1, 3, 4, 4], [3, 2, 3, 3], groups=2), SE,
     r"conv_transpose2d: weight \[3, 2, 3, 3\] does not fit input \[1, 3, 4, 4\].*groups=2"),
    (lambda d: _conv_t2d(d, [1, 2, 4, 4], [2, 3, 3, 3], [2]), SE,
     r"conv_transpose2d: bias must have shape \[3\], got \[2\]"),
    (lambda d: _conv_t2d(d, [1, 2, 4, 4], [2, 3, 3, 3], stride=2, padding_out=2), AE,
     r"conv_transpose2d: padding_out .* smaller than stride or dilation"),
    (lambda d: _conv_t2d(d, [1, 1, 1, 1], [1, 1, 1, 1], padding=1), SE,
     r"conv_transpose2d: output size \[-1, -1\] .*not positive.*\[1, 1, 1, 1\]"),
    (lambda d: module.conv_transpose1d(_t(d, 2, 4), _t(d, 2, 3, 3)), SE,
     r"conv_transpose1d: input must have rank 3 .*\[2, 4\]"),
    (lambda d: module.conv_transpose3d(_t(d, 1, 2, 2, 2, 2, dtype=DType.I64), _t(d, 2, 1, 1, 1, 1)), KE,
     r"conv_transpose3d: .*Int tensor of shape \[1, 2, 2, 2, 2\]"),
    # --- pooling
    (lambda d: module.avg_pool2d(_t(d, 3, 4, 4), 2), SE, r"avg_pool2d: input must have rank 4 .*\[3, 4, 4\]"),
    (lambda d: module.max_pool1d(_t(d, 1, 3, 4, 4), 2), SE, r"max_pool1d: input must have rank 3 .*\[1, 3, 4, 4\]"),
    (lambda d: module.avg_pool2d(_t(d, 1, 1, 5, 5), 3, padding=2), AE,
     r"avg_pool2d: padding 2 must be at most half the kernel size 3"),
    (lambda d: module.avg_pool1d(_t(d, 1, 1, 5), 2, padding=2), AE,
     r"avg_pool1d: padding 2 must be at most half the kernel size 2"),
    (lambda d: module.max_pool2d(_t(d, 1, 1, 5, 5), (3, 2), padding=(1, 2)), AE,
     r"max_pool2d: padding 2 must be at most half the kernel size 2"),
    (lambda d: module.max_pool2d_with_indices(_t(d, 1, 1, 5, 5), 3, padding=2), AE,
     r"max_pool2d_with_indices: padding 2 must be at most half the kernel size 3"),
    (lambda d: module.max_pool2d(_t(d, 1, 1, 2, 2), 3), SE,
     r"max_pool2d: input \[1, 1, 2, 2\] is too small for window \[3, 3\]"),
    (lambda d: module.avg_pool1d(_t(d, 1, 1, 2), 3), SE, r"avg_pool1d: input \[1, 1, 2\] is too small for window \[3\]"),
    (lambda d: module.max_pool2d(_t(d, 1, 1, 4, 4, dtype=DType.I64), 2), KE,
     r"max_pool2d: .*Int tensor of shape \[1, 1, 4, 4\]"),
    (lambda d: module.avg_pool1d(_t(d, 1, 1, 4, dtype=DType.U8), 2), KE, r"avg_pool1d: .*Int tensor of shape \[1, 1, 4\]"),
    (lambda d: module.avg_pool2d(_t(d, 1, 1, 4, 4), 0), AE, r"avg_pool2d: kernel_size values must be >= 1"),
    (lambda d: module.adaptive_avg_pool2d(_t(d, 3, 4, 4), 2), SE,
     r"adaptive_avg_pool2d: input must have rank 4 .*\[3, 4, 4\]"),
    (lambda d: module.adaptive_max_pool1d(_t(d, 1, 3, 4), 0), AE, r"adaptive_max_pool1d: output_size values must be >= 1"),
    (lambda d: module.adaptive_max_pool2d(_t(d, 1, 1, 4, 4, dtype=DType.I32), 2), KE,
     r"adaptive_max_pool2d: .*Int tensor of shape \[1, 1, 4, 4\]"),
    # --- embedding
    (lambda d: module.embedding(_t(d, 10, 4), _t(d, 3)), KE,
     r"embedding: indices must be an Int tensor, got a Float tensor of shape \[3\] \(f32\)"),
    (lambda d: module.embedding(_t(d, 10, 4), _t(d, 3, dtype=DType.BOOL)), KE,
     r"embedding: indices must be an Int tensor, got a Bool tensor of shape \[3\]"),
    (lambda d: module.embedding(_t(d, 10, 4, dtype=DType.I64), _t(d, 3, dtype=DType.I64)), KE,
     r"embedding: .*Int tensor of shape \[10, 4\]"),
    (lambda d: module.embedding(_t(d, 2, 3, 4), _t(d, 3, dtype=DType.I64)), SE,
     r"embedding: weights must be \[num_embeddings, dim\], got \[2, 3, 4\]"),
    # --- interpolation
    (lambda d: module.interpolate(_t(d, 1, 1, 4, 4), (2, 2), mode="area"), AE,
     r"interpolate: unknown mode 'area'; expected nearest, bilinear or bicubic"),
    (lambda d: module.interpolate(_t(d, 1, 1, 4), 2, mode="linear"), AE, r"interpolate: unknown mode 'linear'"),
    (lambda d: module.interpolate(_t(d, 1, 1, 2, 2, 2), (2, 2, 2)), SE,
     r"interpolate: .*\[N, C, H, W\].*\[1, 1, 2, 2, 2\]"),
    (lambda d: module.interpolate(_t(d, 1, 1, 4, 4), (2, 0)), AE, r"interpolate: output_size values must be >= 1"),
    (lambda d: module.interpolate(_t(d, 1, 1, 4, 4), (2, 2, 2)), AE,
     r"interpolate: output_size needs 1 or 2 values, got \[2, 2, 2\]"),
    (lambda d: module.interpolate(_t(d, 1, 1, 4, 4, dtype=DType.I64), (2, 2)), KE,
     r"interpolate: .*Int tensor of shape \[1, 1, 4, 4\]"),
    # --- unfold
    (lambda d: module.unfold4d(_t(d, 1, 4, 4), 2), SE, r"unfold4d: input must have rank 4 .*\[1, 4, 4\]"),
    (lambda d: module.unfold4d(_t(d, 1, 1, 2, 2), 3), SE, r"unfold4d: input \[1, 1, 2, 2\] is too small for kernel \[3, 3\]"),
    (lambda d: module.unfold4d(_t(d, 1, 1, 4, 4, dtype=DType.I64), 2), KE, r"unfold4d: .*Int tensor of shape \[1, 1, 4, 4\]"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "message"), ERROR_CASES, ids=[c[2].split(":")[0] for c in ERROR_CASES]
)
def test_errors(device, call, error, message):
    with pytest.raises(error, match=message):
        call(device)


# ============================================================================ backward helpers
def _grad_of(
    torch_fn: Callable, x: torch.Tensor, seed: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """The output gradient fed back (f64) and the gradient of ``torch_fn`` at ``x`` (f64)."""
    xt = x.detach().to(torch.float64, copy=True).requires_grad_()
    out = torch_fn(xt)
    (grad,) = _randn(DType.F64, list(out.shape), seed=seed)
    out.backward(grad)
    return grad, xt.grad


def _prims(device, dtype, *tensors):
    return [from_torch(t.to(TORCH_DTYPE[dtype]) if t.is_floating_point() else t, device).into_primitive()
            for t in tensors]  # fmt: skip


def _assert_backend_result(device, prim, expected: torch.Tensor, dtype: DType) -> None:
    assert_close(Tensor.from_primitive(prim, device), expected.to(TORCH_DTYPE[dtype]), *TOL[dtype])


def _tuple(value, n: int) -> tuple[int, ...]:
    return (value,) * n if isinstance(value, int) else tuple(value)


def _pool_options(kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                  count_include_pad=True) -> PoolOptions:  # fmt: skip
    kernel = _tuple(kernel_size, 2)
    return PoolOptions(kernel, kernel if stride is None else _tuple(stride, 2), _tuple(padding, 2),
                       _tuple(dilation, 2), ceil_mode, count_include_pad)  # fmt: skip


def _cases_2d(cases):
    return [pytest.param(*c.values[1:], id=c.id) for c in cases if c.values[0] == 2]


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("x_shape", "kwargs"), _cases_2d(AVG_POOL_CASES))
def test_avg_pool2d_backward(device, x_shape, kwargs, dtype):
    (x,) = _randn(dtype, x_shape)
    grad, expected = _grad_of(lambda t: F.avg_pool2d(t, **kwargs), x)
    out = device.backend.avg_pool2d_backward(
        *_prims(device, dtype, x, grad), _pool_options(**kwargs)
    )
    _assert_backend_result(device, out, expected, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("x_shape", "kwargs"), _cases_2d(MAX_POOL_CASES))
def test_max_pool2d_with_indices_backward(device, x_shape, kwargs, dtype):
    (x,) = _randn(dtype, x_shape)
    grad, expected = _grad_of(lambda t: F.max_pool2d(t, **kwargs), x)
    _, indices = module.max_pool2d_with_indices(from_torch(x, device), **kwargs)
    x_prim, grad_prim = _prims(device, dtype, x, grad)
    out = device.backend.max_pool2d_with_indices_backward(
        x_prim, grad_prim, indices.into_primitive(), _pool_options(**kwargs)
    )
    _assert_backend_result(device, out, expected, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("x_shape", "size"), _cases_2d(ADAPTIVE_CASES))
def test_adaptive_avg_pool2d_backward(device, x_shape, size, dtype):
    (x,) = _randn(dtype, x_shape)
    grad, expected = _grad_of(lambda t: F.adaptive_avg_pool2d(t, size), x)
    out = device.backend.adaptive_avg_pool2d_backward(*_prims(device, dtype, x, grad))
    _assert_backend_result(device, out, expected, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("mode", "align_corners"), INTERPOLATE_MODES)
@pytest.mark.parametrize(("x_shape", "size"), INTERPOLATE_CASES)
def test_interpolate_backward(device, x_shape, size, mode, align_corners, dtype):
    (x,) = _randn(dtype, x_shape)
    grad, expected = _grad_of(lambda t: _torch_interpolate(t, size, mode, align_corners), x)
    options = InterpolateOptions(mode, align_corners)
    out = device.backend.interpolate_backward(*_prims(device, dtype, x, grad), size, options)
    _assert_backend_result(device, out, expected, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize("index_shape", [[5], [3, 4], [0]], ids=str)
def test_embedding_backward(device, index_shape, dtype):
    """Rows picked several times accumulate their gradients; rows never picked get zeros."""
    (weights,) = _randn(dtype, [6, 3])
    indices = torch.randint(0, 4, index_shape, generator=torch.Generator().manual_seed(4))
    grad, expected = _grad_of(lambda w: F.embedding(indices, w), weights)
    w_prim, grad_prim, idx_prim = _prims(device, dtype, weights, grad, indices)
    out = device.backend.embedding_backward(w_prim, grad_prim, idx_prim)
    _assert_backend_result(device, out, expected, dtype)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: module.adaptive_avg_pool2d(x, (2, 2)),
        lambda x: module.adaptive_max_pool2d(x, (2, 2)),
        lambda x: module.interpolate(x, (2, 2), "bilinear"),
    ],
    ids=["adaptive_avg_pool2d", "adaptive_max_pool2d", "interpolate"],
)
def test_resizing_an_empty_spatial_dim_raises(device, call):
    x = Tensor.zeros([1, 1, 0, 4], device)
    with pytest.raises(ember.ShapeError, match=r"input \[1, 1, 0, 4\] has an empty spatial dim"):
        call(x)


# ------------------------------------------------------------ convolution gradients
# conv_x_backward / conv_weight_backward and their conv_transpose pair, through the
# backend under test ("backend": Torch overrides them with aten.convolution_backward)
# and through the protocol's generic default ("default": ember.backend.conv_grad).
def _conv_grad_cases(cases):
    return [pytest.param(*c.values, id=c.id) for c in cases if c.values[0] in (2, 3)]


def _conv_grad_options(n: int, kwargs: dict, transpose: bool):
    stride, padding = _tuple(kwargs.get("stride", 1), n), _tuple(kwargs.get("padding", 0), n)
    dilation, groups = _tuple(kwargs.get("dilation", 1), n), kwargs.get("groups", 1)
    if transpose:
        return ConvTransposeOptions(stride, padding, _tuple(kwargs.get("padding_out", 0), n), dilation, groups)
    return ConvOptions(stride, padding, dilation, groups)


def _check_conv_grads(device, dtype, impl, n, x_shape, w_shape, kwargs, transpose):
    x, w = _randn(dtype, x_shape, w_shape)
    xt, wt = (t.detach().to(torch.float64, copy=True).requires_grad_() for t in (x, w))
    torch_kwargs = {("output_padding" if k == "padding_out" else k): v for k, v in kwargs.items()}
    torch_fn = getattr(F, f"conv_transpose{n}d" if transpose else f"conv{n}d")
    out = torch_fn(xt, wt, **torch_kwargs)
    (grad,) = _randn(DType.F64, list(out.shape), seed=2)
    out.backward(grad)
    name = "conv_transpose" if transpose else "conv"
    backend = device.backend
    prims = _prims(device, dtype, x, w, grad)
    options = _conv_grad_options(n, kwargs, transpose)
    for which, expected in (("x", xt.grad), ("weight", wt.grad)):
        op = f"{name}_{which}_backward"
        fn = getattr(backend, op) if impl == "backend" else getattr(Backend, op).__get__(backend)
        _assert_backend_result(device, fn(*prims, options), expected, dtype)


@pytest.mark.parametrize("impl", ["backend", "default"])
@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("n", "x_shape", "w_shape", "kwargs"), _conv_grad_cases(CONV_CASES))
def test_conv_backward(device, n, x_shape, w_shape, kwargs, dtype, impl):
    _check_conv_grads(device, dtype, impl, n, x_shape, w_shape, kwargs, transpose=False)


@pytest.mark.parametrize("impl", ["backend", "default"])
@pytest.mark.parametrize("dtype", FLOATS, ids=_id)
@pytest.mark.parametrize(("n", "x_shape", "w_shape", "kwargs"), _conv_grad_cases(CONV_TRANSPOSE_CASES))
def test_conv_transpose_backward(device, n, x_shape, w_shape, kwargs, dtype, impl):
    _check_conv_grads(device, dtype, impl, n, x_shape, w_shape, kwargs, transpose=True)


def test_conv_weight_backward_default_in_blocks(device, monkeypatch):
    """The 2-d default unfolds the input in blocks of samples: one sample per block here."""
    monkeypatch.setattr(conv_grad, "_UNFOLD_BLOCK_BYTES", 1)
    _check_conv_grads(device, DType.F64, "default", 2, [3, 4, 5, 6], [6, 2, 3, 2],
                      dict(stride=(2, 1), padding=1, groups=2), transpose=False)  # fmt: skip
    _check_conv_grads(device, DType.F64, "default", 2, [3, 2, 3, 3], [2, 3, 2, 2],
                      dict(stride=2, padding_out=1), transpose=True)  # fmt: skip
