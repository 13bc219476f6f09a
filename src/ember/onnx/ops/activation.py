"""Activation ops: the ReLU and ELU families, sigmoid-shaped and smooth activations,
PRelu (an ember ``PRelu`` layer for constant per-channel slopes) and Dropout (an ember
``Dropout`` layer: it drops while training and is the identity at inference).

Attributes at their defaults map to the functions of :mod:`ember.tensor.activation`;
other values are written out as tensor expressions.
"""

from __future__ import annotations

import math

import numpy as np

from ember.onnx.context import NodeContext
from ember.onnx.ops.math import number
from ember.onnx.registry import converter
from ember.tensor import DType

# Opset 1 to 5 nodes carry ``consumed_inputs``, a memory hint with no effect on results.
_LEGACY = ("consumed_inputs",)


def _f32(value: float) -> float:
    """``value`` as ONNX stores a float attribute: rounded to float32."""
    return float(np.float32(value))


# ---------------------------------------------------------------------------- ReLU family
@converter("LeakyRelu", since=1, attrs=("alpha", *_LEGACY))
def leaky_relu(node: NodeContext) -> str:
    alpha = node.attr("alpha", 0.01)
    return f"{node.outputs[0]} = activation.leaky_relu({node.input(0).expr}, {number(alpha)})"


@converter("ThresholdedRelu", since=10, attrs=("alpha",))
def thresholded_relu(node: NodeContext) -> str:
    """``x`` where ``x > alpha``, else 0."""
    x, alpha = node.input(0).expr, number(node.attr("alpha", 1.0))
    return f"{node.outputs[0]} = {x}.mask_fill({x}.greater({alpha}).bool_not(), 0)"


@converter("PRelu", since=1, attrs=_LEGACY)
def prelu(node: NodeContext) -> str:
    """``x`` where ``x >= 0``, ``slope * x`` elsewhere; the slope broadcasts to ``x``.

    A constant f32 slope with one value, or one per channel (dim 1), becomes an ember
    ``PRelu`` layer; other slopes are written as a masked product.
    """
    x, slope = node.input(0), node.input(1)
    channels = _slope_channels(slope.const, x.rank) if x.dtype is DType.F32 else None
    if channels is not None:
        layer = node.layer(node.name, "PRelu", f"PReluConfig(num_parameters={channels}).init(device)",
                           {"alpha": slope.const.reshape(-1)},
                           ("from ember.nn.activation import PRelu, PReluConfig",))
        return f"{node.outputs[0]} = {layer}({x.expr})"
    return (f"{node.outputs[0]} = {x.expr}.mask_where({x.expr}.lower(0), "
            f"{x.expr} * {slope.expr})")


def _slope_channels(slope: np.ndarray | None, rank: int | None) -> int | None:
    """How many slopes a constant f32 PRelu slope holds when ember's layer fits it: 1 for a
    single value, ``C`` for one per channel of a ``[N, C, ...]`` input; None otherwise."""
    if slope is None or slope.dtype != np.float32 or rank is None or slope.ndim > rank:
        return None
    if slope.size == 1:
        return 1
    aligned = (1,) * (rank - slope.ndim) + slope.shape
    if rank >= 2 and aligned[1] == slope.size:
        return slope.size
    return None


# ---------------------------------------------------------------------------- ELU family
@converter("Elu", since=1, attrs=("alpha", *_LEGACY))
def elu(node: NodeContext) -> str:
    alpha = node.attr("alpha", 1.0)
    return f"{node.outputs[0]} = activation.elu({node.input(0).expr}, {number(alpha)})"


# ember's selu constants, as ONNX's float32 attribute defaults hold them.
_SELU_ALPHA, _SELU_GAMMA = _f32(1.6732632423543772), _f32(1.0507009873554805)


@converter("Selu", since=1, attrs=("alpha", "gamma", *_LEGACY))
def selu(node: NodeContext) -> str:
    """``gamma * elu(x, alpha)``; ember's ``selu`` at the default constants."""
    x = node.input(0).expr
    alpha, gamma = node.attr("alpha", _SELU_ALPHA), node.attr("gamma", _SELU_GAMMA)
    if _f32(alpha) == _SELU_ALPHA and _f32(gamma) == _SELU_GAMMA:
        return f"{node.outputs[0]} = activation.selu({x})"
    return f"{node.outputs[0]} = activation.elu({x}, {number(alpha)}) * {number(gamma)}"


@converter("Celu", since=12, attrs=("alpha",))
def celu(node: NodeContext) -> str:
    alpha = node.attr("alpha", 1.0)
    return f"{node.outputs[0]} = activation.celu({node.input(0).expr}, {number(alpha)})"


# ---------------------------------------------------------------------------- sigmoid-shaped
@converter("HardSigmoid", since=1, attrs=("alpha", "beta", *_LEGACY))
def hard_sigmoid(node: NodeContext) -> str:
    """``clamp(alpha * x + beta, 0, 1)``. ONNX's default slope is 0.2, not PyTorch's 1/6
    (which ember's ``hard_sigmoid`` uses, and serves when the attributes say so)."""
    x = node.input(0).expr
    alpha, beta = node.attr("alpha", 0.2), node.attr("beta", 0.5)
    if _f32(alpha) == _f32(1 / 6) and _f32(beta) == 0.5:
        return f"{node.outputs[0]} = activation.hard_sigmoid({x})"
    return f"{node.outputs[0]} = ({x} * {number(alpha)} + {number(beta)}).clamp(0.0, 1.0)"


@converter("HardSwish", since=14, attrs=())
def hard_swish(node: NodeContext) -> str:
    return f"{node.outputs[0]} = activation.hard_swish({node.input(0).expr})"


@converter("Swish", since=24, attrs=("alpha",))
def swish(node: NodeContext) -> str:
    """``x * sigmoid(alpha * x)``; ember's ``silu`` for ``alpha = 1``."""
    x, alpha = node.input(0).expr, node.attr("alpha", 1.0)
    if alpha == 1.0:
        return f"{node.outputs[0]} = activation.silu({x})"
    return f"{node.outputs[0]} = {x} * activation.sigmoid({x} * {number(alpha)})"


# ---------------------------------------------------------------------------- smooth
@converter("Softplus", since=1, attrs=())
def softplus(node: NodeContext) -> str:
    """``log(1 + e^x)``; ember's softplus is linear above 20, where the two differ by less
    than ``e^-20``."""
    return f"{node.outputs[0]} = activation.softplus({node.input(0).expr})"


@converter("Softsign", since=1, attrs=())
def softsign(node: NodeContext) -> str:
    x = node.input(0).expr
    return f"{node.outputs[0]} = {x} / ({x}.abs() + 1.0)"


@converter("Mish", since=18, attrs=())
def mish(node: NodeContext) -> str:
    return f"{node.outputs[0]} = activation.mish({node.input(0).expr})"


@converter("Gelu", since=20, attrs=("approximate",))
def gelu(node: NodeContext) -> str:
    approximate = str(node.attr("approximate", "none"))
    if approximate not in ("none", "tanh"):
        node.unsupported(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    x = node.input(0).expr
    if approximate == "none":
        return f"{node.outputs[0]} = activation.gelu({x})"
    return f'{node.outputs[0]} = activation.gelu({x}, "tanh")'


@converter("Shrink", since=9, attrs=("lambd", "bias"))
def shrink(node: NodeContext) -> list[str]:
    """``x - bias`` above ``lambd``, ``x + bias`` below ``-lambd``, 0 between.

    On Int inputs the thresholds become the equivalent integers; the bias must be a whole
    number there.
    """
    x = node.input(0)
    lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))
    if x.dtype is not None and not x.dtype.is_float:
        if not bias.is_integer():
            node.unsupported(f"bias {bias} on an integer input; a whole number is needed")
        # For integers, |x| <= lambd and x < -lambd hold exactly when they do at floor(lambd).
        low, high, offset = str(-math.floor(lambd)), str(math.floor(lambd)), str(int(bias))
    else:
        low, high, offset = number(-lambd), number(lambd), number(bias)
    shifted, out = node.tmp("shifted"), node.outputs[0]
    return [
        f"{shifted} = ({x.expr} - {offset}).mask_where({x.expr}.lower({low}), {x.expr} + {offset})",
        f"{out} = {shifted}.mask_fill({x.expr}.abs().lower_equal({high}), 0)",
    ]


# ---------------------------------------------------------------------------- dropout
_DROPOUT_IMPORTS = ("from ember.nn.dropout import Dropout, DropoutConfig",)


@converter("Dropout", since=1, attrs=("ratio", "is_test", *_LEGACY))
@converter("Dropout", since=7, attrs=("ratio",))
@converter("Dropout", since=12, attrs=("seed",),
           limits="training_mode, is_test and seed are not read: the device decides the mode")
def dropout(node: NodeContext) -> list[str]:
    """An ember ``Dropout`` layer: the device decides the mode, as everywhere in ember (it
    drops on an autodiff device, and is the identity at inference).

    ``is_test``, ``training_mode`` and ``seed`` are not read: the device decides. A ratio
    known only at run time, or a mask output that something reads, gives the inference
    form: the identity, and a mask of ones.
    """
    x = node.input(0)
    out = node.outputs[0]
    if node.opset < 12:
        ratio: float | None = float(node.attr("ratio", 0.5))
    else:
        given = node.input(1)
        ratio = 0.5 if not given.present else None
        if given.is_const:
            ratio = float(given.const.reshape(-1)[0])
    lines = []
    if node.output_used(1):
        # A bool mask from opset 10; before, a mask of the input's type.
        if node.opset >= 10:
            mask = f"Tensor.full({x.expr}.shape, True, {x.expr}.device)"
        else:
            mask = f"{x.expr}.ones_like()"
        lines.append(f"{node.outputs[1]} = {mask}")
    if ratio is None or ratio == 0.0 or node.output_used(1):
        lines.append(f"{out} = {x.expr}")
    else:
        layer = node.layer(node.name, "Dropout", f"DropoutConfig({number(ratio)}).init(device)",
                           {}, _DROPOUT_IMPORTS)
        lines.append(f"{out} = {layer}({x.expr})")
    return lines
