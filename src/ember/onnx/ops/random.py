"""Random ops: RandomNormal, RandomUniform (and their ``Like`` forms) and Multinomial.

Samples come from the generator of the device the model runs on (``ember.seed`` seeds
it), so the ``seed`` attribute is ignored: no ONNX runtime's stream of numbers could be
reproduced anyway. None of these nodes is folded at import time, so every call of the
model draws fresh samples.
"""

from __future__ import annotations

from ember.onnx.context import NodeContext, literal
from ember.onnx.ops.math import dtype_attr
from ember.onnx.registry import converter
from ember.tensor import DType

_SEED = "the seed attribute is ignored: samples come from the device's generator (ember.seed)"
# The device of a node without tensor inputs: that of the model's weights, else the default.
_MODEL_DEVICE = "(self.devices() or [None])[0]"


def _float_dtype(node: NodeContext, dtype: DType | None) -> DType:
    if dtype is None:
        return DType.F32
    if not dtype.is_float:
        node.unsupported(f"the dtype attribute must name a float type, got {dtype.value}")
    return dtype


def _sample(node: NodeContext, shape: str, device: str, dtype: DType) -> list[str]:
    """Lines assigning output 0 a tensor of ``shape`` drawn from the node's distribution.

    The draw runs in f32 (f64 for f64 outputs) and is cast to ``dtype``.
    """
    y = node.outputs[0]
    work = "f64" if dtype is DType.F64 else "f32"
    if node.op_type.startswith("RandomNormal"):
        mean, scale = float(node.attr("mean", 0.0)), float(node.attr("scale", 1.0))
        if scale < 0:
            node.unsupported(f"the scale attribute must be >= 0, got {scale}")
        distribution = f"Distribution.normal({mean!r}, {scale!r})"
    else:
        low, high = float(node.attr("low", 0.0)), float(node.attr("high", 1.0))
        if low > high:
            node.unsupported(f"the low attribute ({low}) must not exceed high ({high})")
        # Distribution.uniform needs low < high: a point is a constant draw.
        distribution = (f"Distribution.uniform({low!r}, {high!r})" if low < high
                        else None)  # fmt: skip
        if distribution is None:
            return [f'{y} = Tensor.full({shape}, {low!r}, device={device}, dtype="{dtype.value}")']
    draw = f'Tensor.random({shape}, {distribution}, device={device}, dtype="{work}")'
    return [f'{y} = {draw}.cast("{dtype.value}")']


def _random(node: NodeContext) -> list[str]:
    dtype = _float_dtype(node, dtype_attr(node, "dtype"))
    shape = [int(d) for d in node.attr("shape")]
    if any(d < 0 for d in shape):
        node.unsupported(f"the shape attribute must not hold negative sizes, got {shape}")
    return _sample(node, literal(shape), _MODEL_DEVICE, dtype)


def _random_like(node: NodeContext) -> list[str]:
    x = node.input(0)
    dtype = _float_dtype(node, dtype_attr(node, "dtype") or x.dtype)
    expr = x.expr
    return _sample(node, f"{expr}.shape", f"{expr}.device", dtype)


converter("RandomNormal", since=1, attrs=("dtype", "mean", "scale", "seed", "shape"),
          limits=_SEED, foldable=False)(_random)  # fmt: skip
converter("RandomUniform", since=1, attrs=("dtype", "high", "low", "seed", "shape"),
          limits=_SEED, foldable=False)(_random)  # fmt: skip
converter("RandomNormalLike", since=1, attrs=("dtype", "mean", "scale", "seed"),
          limits=_SEED, foldable=False)(_random_like)  # fmt: skip
converter("RandomUniformLike", since=1, attrs=("dtype", "high", "low", "seed"),
          limits=_SEED, foldable=False)(_random_like)  # fmt: skip


@converter("Multinomial", since=7, attrs=("dtype", "sample_size", "seed"), limits=_SEED,
           foldable=False)  # fmt: skip
def multinomial(node: NodeContext) -> list[str]:
    """``sample_size`` class indices per row of ``[batch, classes]`` unnormalized
    log-probabilities: a uniform sample's position in the row's cumulative probabilities
    (the number of classes whose cumulative probability does not exceed it)."""
    x = node.input(0)
    if x.rank is not None and x.rank != 2:
        node.unsupported(f"the input must be [batch, classes], got rank {x.rank}")
    dtype = dtype_attr(node, "dtype") or DType.I32
    if dtype not in (DType.I32, DType.I64):
        node.unsupported(f"the dtype attribute must be int32 or int64, got {dtype.value}")
    count = int(node.attr("sample_size", 1))
    expr = x.expr
    cdf, u = node.tmp("cdf"), node.tmp("u")
    return [
        f'{cdf} = activation.softmax({expr}.cast("f64"), 1).cumsum(1)',
        f'{u} = Tensor.random([{expr}.shape[0], {count}, 1], device={expr}.device, dtype="f64")',
        # Rounding can leave the last cumulative value just below a sample: clamp to a class.
        f"{node.outputs[0]} = {cdf}.unsqueeze_dim(1).lower_equal({u}).int().sum_dim(2)"
        f'.squeeze(2).clamp_max({expr}.shape[1] - 1).cast("{dtype.value}")',
    ]
