"""Other ops: Det (determinants) and MaxUnpool."""

from __future__ import annotations

import math

from ember.onnx.context import NodeContext
from ember.onnx.registry import converter


@converter("Det", since=11, attrs=())
def det(node: NodeContext) -> list[str]:
    """Determinants of the ``[*, M, M]`` matrices by Gaussian elimination with partial
    pivoting (one step per column, in f64): the product of the pivots, negated per row swap."""
    x = node.input(0)
    shape = x.shape
    if shape is None or len(shape) < 2 or not isinstance(shape[-1], int):
        node.unsupported("the matrices' size must be known at import time")
    size = shape[-1]
    m, d, rows, j, pick = (node.tmp("m"), node.tmp("det"), node.tmp("rows"), node.tmp("j"),
                           node.tmp("pivot_row"))  # fmt: skip
    order, pivot = node.tmp("order"), node.tmp("pivot")
    return [
        f'{m} = {x.expr}.cast("f64").reshape([-1, {size}, {size}])',
        f'{d} = Tensor.ones([{m}.shape[0]], {m}.device, "f64")',
        f"{rows} = Tensor.arange({size}, device={m}.device).reshape([1, {size}])",
        f"for {j} in range({size}):",
        # The largest remaining entry of column j is the pivot; its row swaps with row j.
        f"    {pick} = {m}.narrow(2, {j}, 1).squeeze(2).abs().mask_fill({rows}.lower({j}), -1.0)"
        f".argmax(-1)",
        f"    {order} = {rows} + ({pick} - {rows}) * {rows}.equal({j}).int() + ({j} - {rows}) * "
        f"{rows}.equal({pick}).int()",
        f"    {m} = {m}.gather(1, {order}.unsqueeze_dim(-1).repeat_dim(2, {size}))",
        f'    {d} = {d} * (1.0 - 2.0 * {pick}.reshape([-1]).not_equal({j}).cast("f64"))',
        f"    {pivot} = {m}.narrow(1, {j}, 1).narrow(2, {j}, 1)",
        f"    {d} = {d} * {pivot}.reshape([-1])",
        # A zero pivot makes the determinant 0; dividing by 1 instead keeps the rest finite.
        f"    {m} = {m} - ({m}.narrow(2, {j}, 1) / {pivot}.mask_fill({pivot}.equal(0.0), 1.0))"
        f".mask_fill({rows}.reshape([1, {size}, 1]).lower_equal({j}), 0.0) * "
        f"{m}.narrow(1, {j}, 1)",
        f"{node.outputs[0]} = {d}.reshape([*{x.expr}.shape[:-2]]).cast({x.expr}.dtype)",
    ]  # fmt: skip


@converter("MaxUnpool", since=9, attrs=("kernel_shape", "pads", "strides"),
           limits="an index given twice sums its values (ONNX keeps one of them)")
def max_unpool(node: NodeContext) -> list[str]:
    """Puts each value at its flat index (MaxPool's second output, counted over the whole
    output tensor) in zeros of the size the pooling attributes imply, then pads at the end
    of each spatial dim up to ``output_shape`` when given."""
    x, indices, output_shape = node.input(0), node.input(1), node.input(2)
    shape = x.shape
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape[2:]):
        node.unsupported("the input's rank and spatial dims must be known at import time")
    n = len(shape) - 2
    kernel = [int(k) for k in node.attr("kernel_shape")]
    strides = [int(s) for s in node.attr("strides", [1] * n)]
    pads = [int(p) for p in node.attr("pads", [0] * (2 * n))]
    spatial = [(shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[n + i]
               for i in range(n)]  # fmt: skip
    x_expr, y = x.expr, node.outputs[0]
    dims = f"[{x_expr}.shape[0], {x_expr}.shape[1], {', '.join(map(str, spatial))}]"
    lines = [
        f"{y} = Tensor.zeros([{x_expr}.shape[0] * {x_expr}.shape[1] * {math.prod(spatial)}], "
        f"{x_expr}.device, {x_expr}.dtype).scatter(0, {indices.expr}.int().reshape([-1]), "
        f"{x_expr}.reshape([-1])).reshape({dims})",
    ]  # fmt: skip
    if output_shape.present:
        if output_shape.is_const:
            wanted = output_shape.ints()[2:]
            extra = [v for want, have in zip(reversed(wanted), reversed(spatial))
                     for v in (0, want - have)]  # fmt: skip
            if any(extra):
                lines.append(f"{y} = {y}.pad({extra})")
        else:
            target = node.tmp("target")
            lines += [f"{target} = rt.ints({output_shape.expr})",
                      f"{y} = {y}.pad([v for d in reversed(range(2, {n + 2})) for v in "
                      f"(0, {target}[d] - {y}.shape[d])])"]  # fmt: skip
    return lines
