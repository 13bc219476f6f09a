"""Layout ops on quantized tensors: each dequantizes to the float op of the dequantized
tensor, exactly (values move with their scales), on every scheme that allows it; the others
raise and name the scheme."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError, ShapeError
from ember.quantization import QTensor, QuantScheme

X = np.random.default_rng(2).standard_normal((4, 6, 8)).astype(np.float32)
SCHEMES = [
    QuantScheme(),
    QuantScheme(value="int4", mode="affine"),
    QuantScheme(granularity="axis", axis=1),
    QuantScheme(value="int4", granularity="axis", axis=-1),
    QuantScheme(mode="affine", granularity="block", axis=2, block_size=4),
    QuantScheme(value="int4", granularity="block", axis=1, block_size=2),
]


@pytest.fixture(params=["ndarray", "fusion"])
def device(request):
    if request.param == "fusion":
        return ember.device("ndarray").fusion(runtime="interpreter")
    return ember.device(request.param)


def _q(scheme, device, x=X) -> QTensor:
    return Tensor.from_data(x, device).quantize(scheme)


def _same(q: QTensor, expected: np.ndarray) -> None:
    np.testing.assert_array_equal(q.dequantize().to_numpy(), expected)
    assert q.values.dtype == (ember.DType.U8 if q.scheme.value == "int4" else ember.DType.I8)
    assert tuple(q.scales.shape) == q.scheme.scales_shape(q.shape)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.describe())
def test_permute_moves_the_axis_with_its_dim(scheme, device):
    q = _q(scheme, device)
    for axes in ([2, 0, 1], [1, 2, 0], [0, 2, 1]):
        _same(q.permute(axes), q.dequantize().to_numpy().transpose(axes))


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.describe())
def test_reshape_keeping_the_axis_whole(scheme, device):
    q = _q(scheme, device)
    full = q.dequantize().to_numpy()
    axis = scheme.resolved_axis(3)
    shapes = {None: [2, 2, 6, 8], 1: [4, 6, 2, 4], 2: [24, 8], }
    shape = shapes.get(axis)
    if shape is None:  # a scheme along dim 1: merge the others around it
        shape = [4, 6, 8, 1]
    _same(q.reshape(shape), full.reshape(shape))
    if axis is not None:
        with pytest.raises(ShapeError, match="splits or moves dim"):
            q.reshape([-1])


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.describe())
def test_narrow_slices_the_scales_with_the_values(scheme, device):
    q = _q(scheme, device)
    full = q.dequantize().to_numpy()
    for dim, start, length in ((0, 1, 2), (1, 2, 4), (2, 4, 4), (2, -4, 4)):
        begin = start % X.shape[dim]
        expected = np.take(full, range(begin, begin + length), axis=dim)
        _same(q.narrow(dim, start, length), expected)
    if scheme.granularity == "block":
        with pytest.raises(ShapeError, match="cuts through a block"):
            q.narrow(scheme.axis, 1, 2)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.describe())
def test_cat_joins_the_scales_where_they_run(scheme, device):
    a = _q(scheme, device)
    b = _q(scheme, device, X * 3.0)
    axis = scheme.resolved_axis(3)
    along = axis if axis is not None else 0
    if scheme.granularity == "tensor":
        with pytest.raises(ArgumentError, match="must share their scales"):
            QTensor.cat([a, b], 0)
        _same(QTensor.cat([a, a], 1), np.concatenate([a.dequantize().to_numpy()] * 2, 1))
        return
    joined = QTensor.cat([a, b], along)
    _same(joined, np.concatenate([a.dequantize().to_numpy(), b.dequantize().to_numpy()], along))


def test_careless_layout_calls():
    q = _q(QuantScheme(granularity="axis", axis=0), ember.device("ndarray"))
    with pytest.raises(ArgumentError, match="axes must order the dims"):
        q.permute([0, 0, 1])
    with pytest.raises(ShapeError, match="cannot reshape"):
        q.reshape([5, 5])
    with pytest.raises(ShapeError, match="outside dim 1"):
        q.narrow(1, 4, 4)
    with pytest.raises(ArgumentError, match="different schemes"):
        QTensor.cat([q, _q(QuantScheme(), ember.device("ndarray"))], 0)
    moved = q.to_device(ember.device("ndarray").autodiff())
    np.testing.assert_array_equal(moved.dequantize().to_numpy(), q.dequantize().to_numpy())
