"""Pooling: AveragePool, MaxPool (with its Indices), LpPool and the global poolings.

A window that ember's pooling ops take as is (1-d or 2-d, the same padding at both ends,
no dilation for averages) becomes ``F.avg_pool2d`` / ``F.max_pool2d``. Other windows are
composed: a maximum is taken one group of dims at a time (max over a box is separable)
on an input padded with ``-inf``; an average is a sum over the window (a convolution with
a kernel of ones) divided by the number of values each window counts, which ONNX's rules
(``count_include_pad``, ``ceil_mode``) fix at import time. The number of spatial dims
comes from ``kernel_shape`` where the input's rank is unknown; the global poolings of
such an input reduce whatever spatial dims it has when the model runs.
"""

from __future__ import annotations

import math

import numpy as np

from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.ops.conv import pad_args, spatial_rank, spatial_sizes, window
from ember.onnx.registry import converter
from ember.tensor import DType

# Attributes added over the opsets (count_include_pad at 7, storage_order at 8, ceil_mode at
# 10, dilations at 10 / 18 / 19) only extend the op: one converter serves every version.
_POOL_ATTRS = ("auto_pad", "ceil_mode", "kernel_shape", "pads", "strides")


class _Window:
    """The window of a pooling node: kernel, strides, dilations, pads, ceil mode."""

    def __init__(self, node: NodeContext, x: Value) -> None:
        self.node, self.x = node, x
        self.n = spatial_rank(node, x)
        self.kernel = [int(k) for k in node.attr("kernel_shape")]
        if len(self.kernel) != self.n:
            node.unsupported(f"kernel_shape {self.kernel} does not match the input's "
                             f"{self.n} spatial dims")
        self.strides, self.dilations, self.begin, self.end = window(node, x, self.kernel)
        self.ceil = bool(node.attr("ceil_mode", 0))

    @property
    def reach(self) -> list[int]:
        """The span of each window: ``dilation * (kernel - 1) + 1``."""
        return [d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilations)]

    @property
    def symmetric(self) -> bool:
        """Whether ember's pooling ops pad as ONNX asks: alike at both ends, at most half
        the kernel."""
        return self.begin == self.end and all(2 * p <= k for p, k in zip(self.begin, self.kernel))

    def sizes(self) -> list[int]:
        """The input's spatial dims (needed for composed windows)."""
        sizes = spatial_sizes(self.x)
        if sizes is None:
            self.node.unsupported("this window is composed from other ops and needs the "
                                  "input's spatial dims at import time")
        return sizes

    def out_sizes(self) -> list[int]:
        """The output's spatial dims by ONNX's rule (PyTorch's): in ceil mode, the last
        window must start inside the input or its begin padding."""
        out = []
        for size, r, s, b, e in zip(self.sizes(), self.reach, self.strides, self.begin,
                                    self.end):  # fmt: skip
            span = size + b + e - r
            o = (-(-span // s) if self.ceil else span // s) + 1
            if self.ceil and (o - 1) * s >= size + b:
                o -= 1
            out.append(o)
        return out

    def exact_pads(self) -> tuple[list[int], list[int]]:
        """Pads after which a floor-mode, unpadded window gives exactly ``out_sizes``."""
        end = [max((o - 1) * s + r - size - b, 0) for o, s, r, size, b in
               zip(self.out_sizes(), self.strides, self.reach, self.sizes(), self.begin)]  # fmt: skip
        return self.begin, end

    def counts(self, include_pad: bool) -> np.ndarray:
        """How many values each window averages, ``[*out_sizes]``: the taps inside the
        input, or (``include_pad``) inside the input and its explicit pads."""
        per_dim = []
        for size, o, k, s, d, b, e in zip(self.sizes(), self.out_sizes(), self.kernel,
                                          self.strides, self.dilations, self.begin, self.end):  # fmt: skip
            taps = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d
            low, high = (0, size + b + e) if include_pad else (b, b + size)
            per_dim.append(((taps >= low) & (taps < high)).sum(axis=1))
        counts = per_dim[0]
        for c in per_dim[1:]:
            counts = np.multiply.outer(counts, c)
        return counts


def _call(function: str, source: str, w: _Window, **options: object) -> str:
    """``F.<function>(source, kernel, strides, ...)`` with the options that differ from
    ember's defaults as keywords (zero padding, no dilation, floor mode)."""
    defaults = {"padding": [0] * w.n, "dilation": [1] * w.n, "ceil_mode": False,
                "count_include_pad": True}  # fmt: skip
    extra = "".join(f", {k}={v!r}" for k, v in options.items() if v != defaults[k])
    return f"F.{function}({source}, {w.kernel}, {w.strides}{extra})"


def _window_sum(node: NodeContext, w: _Window, source: str) -> list[str]:
    """Lines that set ``node.outputs[0]`` to the window sums of ``source`` (the input, or
    a function of it): a convolution with a kernel of ones over each plane."""
    n, y = w.n, node.outputs[0]
    begin, end = w.exact_pads()
    padded = [size + b + e for size, b, e in zip(w.sizes(), begin, end)]
    out = w.out_sizes()
    planes = node.tmp("planes")
    lines = [f"{planes} = {source}.pad({pad_args(begin, end)})" if any(begin + end) else
             f"{planes} = {source}"]  # fmt: skip
    ones = f"Tensor.ones({[1, 1, *w.kernel]}, {planes}.device)"
    lines.append(f"{y} = F.conv{n}d({planes}.reshape({[-1, 1, *padded]}), {ones}, None, "
                 f"{w.strides}, 0, {w.dilations}).reshape([*{w.x.expr}.shape[:2], "
                 f"{', '.join(map(str, out))}])")
    return lines


def _window_mean(node: NodeContext, w: _Window, include_pad: bool) -> list[str]:
    """Lines that set ``node.outputs[0]`` to the window averages of the input: the sums
    divided by the number of values each window counts."""
    y = node.outputs[0]
    lines = _window_sum(node, w, w.x.expr)
    counts = w.counts(include_pad)
    if counts.min() == counts.max():
        lines.append(f"{y} = {y} / {float(counts.flat[0])!r}")
    else:
        dtype = np.float64 if w.x.dtype is DType.F64 else np.float32
        divisor = node.param(counts.astype(dtype), f"{node.name}_counts", trainable=False)
        lines.append(f"{y} = {y} / {divisor}")
    return lines


@converter("AveragePool", since=1, attrs=(*_POOL_ATTRS, "count_include_pad", "dilations"))
def average_pool(node: NodeContext) -> str | list[str]:
    x = node.input(0)
    w = _Window(node, x)
    include_pad = bool(node.attr("count_include_pad", 0))
    if w.n <= 2 and w.symmetric and all(d == 1 for d in w.dilations):
        return (f"{node.outputs[0]} = " + _call(f"avg_pool{w.n}d", x.expr, w, padding=w.begin,
                                                ceil_mode=w.ceil, count_include_pad=include_pad))
    return _window_mean(node, w, include_pad)


@converter("LpPool", since=1, attrs=(*_POOL_ATTRS, "p", "dilations"))
def lp_pool(node: NodeContext) -> list[str]:
    """``(sum |x|^p)^(1/p)`` over each window (padding adds zeros)."""
    x = node.input(0)
    w = _Window(node, x)
    p = node.attr("p", 2)
    y = node.outputs[0]
    power = f"({x.expr} * {x.expr})" if p == 2 else f"{x.expr}.abs().pow({float(p)!r})"
    root = ".sqrt()" if p == 2 else f".pow({1 / p!r})"
    return [*_window_sum(node, w, power), f"{y} = {y}{root}"]


def _max_window(node: NodeContext, w: _Window, source: str) -> list[str]:
    """Lines that set ``node.outputs[0]`` to the window maxima of float ``source``."""
    n, y = w.n, node.outputs[0]
    if n <= 2 and w.symmetric:
        return [f"{y} = " + _call(f"max_pool{n}d", source, w, padding=w.begin,
                                  dilation=w.dilations, ceil_mode=w.ceil)]
    begin, end = w.exact_pads()
    padded = node.tmp("padded")
    lines = [f"{padded} = {source}.pad({pad_args(begin, end)}, {literal(-math.inf)})"
             if any(begin + end) else f"{padded} = {source}"]  # fmt: skip
    if n <= 2:
        return [*lines, f"{y} = " + _call(f"max_pool{n}d", padded, w, dilation=w.dilations)]
    if n != 3:
        node.unsupported(f"ember pools 1 to 3 spatial dims, not {n}")
    # 3-d: the maximum over (height, width) with depth as channels, then over depth.
    d, h, wd = (size + b + e for size, b, e in zip(w.sizes(), begin, end))
    out_d, out_h, out_w = w.out_sizes()
    planes = node.tmp("planes")
    lines += [
        f"{planes} = F.max_pool2d({padded}.reshape([-1, {d}, {h}, {wd}]), {w.kernel[1:]}, "
        f"{w.strides[1:]}, 0, {w.dilations[1:]})",
        f"{planes} = {planes}.reshape([-1, {d}, {out_h * out_w}]).swap_dims(1, 2)",
        f"{planes} = F.max_pool1d({planes}, {w.kernel[0]}, {w.strides[0]}, 0, "
        f"{w.dilations[0]})",
        f"{y} = {planes}.swap_dims(1, 2).reshape([*{w.x.expr}.shape[:2], {out_d}, {out_h}, "
        f"{out_w}])",
    ]
    return lines


@converter("MaxPool", since=1, attrs=(*_POOL_ATTRS, "dilations", "storage_order"),
           limits="the Indices output needs a 1-d or 2-d window padded alike at both ends")
def max_pool(node: NodeContext) -> list[str]:
    x = node.input(0)
    w = _Window(node, x)
    y = node.outputs[0]
    # ember pools floats; other dtypes pool as f32 (exact for 8- and 16-bit ints) and back.
    cast = x.dtype is not None and not x.dtype.is_float
    source = f"{x.expr}.float()" if cast else x.expr
    if node.output_used(1):
        lines = _max_with_indices(node, w, source)
    else:
        lines = _max_window(node, w, source)
    if cast:
        lines.append(f"{y} = {y}.cast({x.dtype.value!r})")
    return lines


def _max_with_indices(node: NodeContext, w: _Window, source: str) -> list[str]:
    """Maxima and ONNX's Indices: flat positions in the whole input (row-major, or
    column-major within each plane for ``storage_order=1``)."""
    if w.n > 2 or not w.symmetric:
        node.unsupported("the Indices output is supported for 1-d and 2-d windows padded "
                         "alike at both ends (at most half the kernel)")
    y, indices = node.outputs[0], node.outputs[1]
    within = node.tmp("within")
    lines = [f"{y}, {within} = " + _call(f"max_pool{w.n}d_with_indices", source, w,
                                         padding=w.begin, dilation=w.dilations,
                                         ceil_mode=w.ceil)]  # fmt: skip
    x = w.x.expr
    if int(node.attr("storage_order", 0)) == 1:
        if w.n == 1:
            pass  # one spatial dim: both orders agree
        else:
            lines.append(f"{within} = {within}.remainder({x}.shape[3]) * {x}.shape[2] + "
                         f"{within}.div({x}.shape[3])")
    plane = f"{x}.shape[2]" if w.n == 1 else f"{x}.shape[2] * {x}.shape[3]"
    lines.append(f"{indices} = {within} + Tensor.arange({x}.shape[0] * {x}.shape[1], "
                 f"device={x}.device).reshape([*{x}.shape[:2]{', 1' * w.n}]) * ({plane})")
    lines.append(f"{indices} = {indices}.cast('i64')")
    return lines


def _over_spatial(node: NodeContext, x: Value, source: str, reduce: str) -> str:
    """``source`` (``x`` or a function of it) reduced over every spatial dim of ``x``: by
    ``rt.global_pool`` (all of them as one) where there are several or their number is
    only known at run time."""
    if x.rank is None or spatial_rank(node, x) > 1:
        return f"rt.global_pool({source}, {reduce!r})"
    return f"{source}.{reduce}(2)"


def _global(node: NodeContext, reduce: str) -> str:
    x = node.input(0)
    return f"{node.outputs[0]} = {_over_spatial(node, x, x.expr, reduce)}"


@converter("GlobalAveragePool", since=1, attrs=())
def global_average_pool(node: NodeContext) -> str:
    return _global(node, "mean_dim")


@converter("GlobalMaxPool", since=1, attrs=())
def global_max_pool(node: NodeContext) -> str:
    return _global(node, "max_dim")


@converter("GlobalLpPool", since=2, attrs=("p",))
def global_lp_pool(node: NodeContext) -> str:
    """``(sum |x|^p)^(1/p)`` over all spatial dims."""
    x, p = node.input(0), node.attr("p", 2)
    power = f"({x.expr} * {x.expr})" if p == 2 else f"{x.expr}.abs().pow({float(p)!r})"
    root = ".sqrt()" if p == 2 else f".pow({1 / p!r})"
    return f"{node.outputs[0]} = {_over_spatial(node, x, power, 'sum_dim')}{root}"
