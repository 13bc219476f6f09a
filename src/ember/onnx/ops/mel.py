"""MelWeightMatrix: the triangular filter bank mapping linear DFT bins to mel bins."""

from __future__ import annotations

import math

from ember.onnx.context import NodeContext, Value
from ember.onnx.ops.math import dtype_attr
from ember.onnx.registry import converter
from ember.tensor import DType


def _int(value: Value) -> str:
    """A Python int expression of an integer scalar input (a literal when it is a constant)."""
    if value.is_const:
        return repr(int(value.const.reshape(-1)[0]))
    return f"int({value.expr}.to_numpy().reshape(-1)[0])"


@converter("MelWeightMatrix", since=17, attrs=("output_datatype",))
def mel_weight_matrix(node: NodeContext) -> list[str]:
    """The ``[dft_length // 2 + 1, num_mel_bins]`` matrix of triangles peaking at 1.

    As ONNX's reference does, ``num_mel_bins + 2`` edges are spread over the mel range in
    steps of its width divided by ``num_mel_bins + 2`` (so the last edge stops short of
    ``upper_edge_hertz``), mapped back to hertz and floored to DFT bins; triangle ``i``
    rises from edge ``i`` to edge ``i + 1`` and falls to edge ``i + 2``.
    """
    mels, dft, rate = (_int(node.input(i)) for i in range(3))
    dtype = dtype_attr(node, "output_datatype") or DType.F32
    n, size, f, j = node.tmp("mels"), node.tmp("bins"), node.tmp("edges"), node.tmp("j")
    left, mid, right = node.tmp("left"), node.tmp("mid"), node.tmp("right")
    rise, fall = node.tmp("rise"), node.tmp("fall")

    def mel(i: int) -> str:
        hz = node.input(i)
        if hz.is_const:
            return repr(2595.0 * math.log10(1.0 + float(hz.const.reshape(-1)[0]) / 700.0))
        return (f'(({hz.expr}.cast("f64").reshape([1]) / 700.0 + 1.0).log() * '
                f"{2595.0 / math.log(10)!r})")

    lines = [
        f"{n} = {mels}",
        f"{size} = {dft} // 2 + 1",
        f'{f} = Tensor.arange({n} + 2, device={_device(node)}).cast("f64") * '
        f"(({mel(4)} - {mel(3)}) / ({n} + 2)) + {mel(3)}",
        f"{f} = (({f} * {math.log(10) / 2595!r}).exp() - 1.0) * 700.0",
        f"{f} = ({f} * ({dft} + 1) / {rate}).floor()",
        f'{j} = Tensor.arange({size}, device={f}.device).cast("f64").reshape([-1, 1])',
        f"{left} = {f}.narrow(0, 0, {n}).reshape([1, -1])",
        f"{mid} = {f}.narrow(0, 1, {n}).reshape([1, -1])",
        f"{right} = {f}.narrow(0, 2, {n}).reshape([1, -1])",
        # A triangle without a rising side is 1 at its peak.
        f"{rise} = (({j} - {left}) / ({mid} - {left}).clamp_min(1.0)).mask_fill("
        f"{mid}.equal({left}).bool_and({j}.equal({mid})), 1.0)",
        f"{rise} = {rise}.mask_fill({j}.lower({left}).bool_or({j}.greater({mid})), 0.0)",
        f"{fall} = ({right} - {j}) / ({right} - {mid}).clamp_min(1.0)",
        f"{node.outputs[0]} = {rise}.mask_where({j}.greater_equal({mid}).bool_and("
        f'{j}.lower({right})), {fall}).cast("{dtype.value}")',
    ]
    return lines


def _device(node: NodeContext) -> str:
    for value in node.inputs:
        if value.present and not value.is_const:
            return f"{value.expr}.device"
    return "None"
