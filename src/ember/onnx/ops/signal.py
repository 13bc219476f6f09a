"""Signal ops: DFT, STFT and the Hann, Hamming and Blackman windows.

Fourier transforms are matrix products: the transformed axis is moved next to the last
(real/imaginary) dim, the two flattened together, and one matrix of cosines and sines
(computed in double precision) maps those pairs to the output's pairs.
"""

from __future__ import annotations

import math

from ember.onnx.context import NodeContext, Value
from ember.onnx.ops.math import dtype_attr
from ember.onnx.registry import converter
from ember.tensor import DType


def _matrix(node: NodeContext, rows: int | str, bins: int | str, length: int | str,
            complex_in: bool, kind: str, like: str, lines: list[str]) -> str:  # fmt: skip
    """Lines making the ``[rows * c_in, bins * c_out]`` matrix of a transform of ``length``
    points (rows and columns interleave real and imaginary parts), computed in f64 and
    cast to the dtype of ``like``. ``kind``: ``"forward"``, ``"inverse"`` (divided by
    ``length``) or ``"real_inverse"`` (a one-sided spectrum to a real signal, the bins
    between the two ends counted twice). The sizes are ints or expressions."""
    a, b, angle, m = node.tmp("row"), node.tmp("col"), node.tmp("angle"), node.tmp("dft_matrix")
    device = f"device={like}.device"
    lines += [
        f"{a} = Tensor.arange({rows}, {device}).reshape([-1, 1])",
        f"{b} = Tensor.arange({bins}, {device}).reshape([1, -1])",
        # The product modulo the length is exact, so the angles stay within one turn.
        f'{angle} = ({a} * {b}).remainder({length}).cast("f64") * (2 * {math.pi!r} / {length})',
    ]  # fmt: skip
    cos, sin = f"{angle}.cos()", f"{angle}.sin()"
    if kind == "real_inverse":
        twice = node.tmp("twice")
        lines.append(f'{twice} = Tensor.full([{rows}, 1], 2.0, {device}, dtype="f64").mask_fill('
                     f"{a}.equal(0).bool_or(({a} * 2).equal({length})), 1.0) / {length}")
        parts = [[f"{cos} * {twice}"], [f"-{sin} * {twice}"]]
    elif kind == "inverse":
        parts = [[f"{cos} / {length}", f"{sin} / {length}"],
                 [f"-{sin} / {length}", f"{cos} / {length}"]]  # fmt: skip
    else:
        parts = [[cos, f"-{sin}"], [sin, cos]]
    if not complex_in:
        parts = parts[:1]
    blocks = [f"Tensor.stack([{', '.join(p)}], -1)" if len(p) > 1 else f"({p[0]}).unsqueeze_dim(-1)"
              for p in parts]  # fmt: skip
    lines.append(f"{m} = Tensor.stack([{', '.join(blocks)}], 1).reshape([{rows} * {len(parts)}, "
                 f"-1]).cast({like}.dtype)")
    return m


def _float(node: NodeContext, x: Value) -> None:
    if x.dtype is not None and not x.dtype.is_float:
        node.unsupported("the input must be a float tensor")


def _dft(node: NodeContext, axis: Value | int) -> list[str]:
    x, length = node.input(0), node.input(1)
    _float(node, x)
    shape = x.shape
    if shape is None or len(shape) < 2 or not isinstance(shape[-1], int):
        node.unsupported("the input's rank and last dim must be known at import time")
    rank = len(shape)
    c_in = shape[-1]
    if c_in not in (1, 2):
        node.unsupported(f"the last dim must be 1 (real) or 2 (complex), got {c_in}")
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    lines: list[str] = []
    if isinstance(axis, Value) and not axis.is_const:
        a: int | str = node.tmp("axis")
        lines.append(f"{a} = rt.axis(rt.ints({axis.expr})[0], {rank})")
    else:
        a = (axis if isinstance(axis, int) else axis.ints()[0]) % rank
        if a == rank - 1:
            node.unsupported("the axis must not be the last (real/imaginary) dim")
    size: int | str = shape[a] if isinstance(a, int) and isinstance(shape[a], int) else \
        f"{x.expr}.shape[{a}]"
    if length.present:
        n: int | str = length.ints()[0] if length.is_const else f"rt.ints({length.expr})[0]"
    elif inverse and onesided:
        n = 2 * (size - 1) if isinstance(size, int) else f"2 * ({size} - 1)"
    else:
        n = size
    if isinstance(n, str):
        n_var = node.tmp("n")
        lines.append(f"{n_var} = {n}")
        n = n_var
    both_static = isinstance(n, int) and isinstance(size, int)
    if inverse and onesided:
        kind, c_out = "real_inverse", 1
        rows = min(size, n // 2 + 1) if both_static else f"min({size}, {n} // 2 + 1)"
        bins: int | str = n
    else:
        kind, c_out = ("inverse" if inverse else "forward"), 2
        rows = min(size, n) if both_static else f"min({size}, {n})"
        bins = (n // 2 + 1 if isinstance(n, int) else f"{n} // 2 + 1") if onesided else n
    if isinstance(rows, str):
        rows_var = node.tmp("rows")
        lines.append(f"{rows_var} = {rows}")
        rows = rows_var
    t = node.tmp("pairs")
    lines.append(f"{t} = {x.expr}.movedim({a}, -2)")
    if not both_static or rows != size:
        lines.append(f"{t} = {t}.narrow(-2, 0, {rows})")
    weights = _matrix(node, rows, bins, n, c_in == 2, kind, t, lines)
    lines += [
        f"{t} = rt.matmul({t}.reshape([*{t}.shape[:-2], -1]), {weights})",
        f"{node.outputs[0]} = {t}.reshape([*{t}.shape[:-1], {bins}, {c_out}]).movedim(-2, {a})",
    ]  # fmt: skip
    return lines


@converter("DFT", since=17, attrs=("axis", "inverse", "onesided"))
def dft_v17(node: NodeContext) -> list[str]:
    """The discrete Fourier transform along the ``axis`` attribute (default 1)."""
    return _dft(node, int(node.attr("axis", 1)))


@converter("DFT", since=20, attrs=("inverse", "onesided"))
def dft(node: NodeContext) -> list[str]:
    """The discrete Fourier transform along the ``axis`` input (default -2). Forward
    transforms of real (``[..., 1]``) or complex (``[..., 2]``) input, inverse ones, and
    one-sided ones both ways (``rfft``, ``irfft``)."""
    axis = node.input(2)
    return _dft(node, axis if axis.present else -2)


@converter("STFT", since=17, attrs=("onesided",))
def stft(node: NodeContext) -> list[str]:
    """Frames of ``frame_length`` samples every ``frame_step``, each weighted by the window
    and transformed: ``[batch, frames, bins, 2]``."""
    x, step, window, length = node.input(0), node.input(1), node.input(2), node.input(3)
    _float(node, x)
    shape = x.shape
    if shape is None or len(shape) != 3 or not isinstance(shape[2], int):
        node.unsupported("the signal must be [batch, length, 1 or 2] with the last dim known")
    lines: list[str] = []
    hop: int | str = step.ints()[0] if step.is_const else f"rt.ints({step.expr})[0]"
    if length.present:
        size: int | str = length.ints()[0] if length.is_const else f"rt.ints({length.expr})[0]"
    elif window.present:
        size = _static(window, 0) or f"{window.expr}.shape[0]"
    else:
        size = _static(x, 1) or f"{x.expr}.shape[1]"
    for name in ("hop", "size"):
        value = hop if name == "hop" else size
        if isinstance(value, str):
            var = node.tmp(name)
            lines.append(f"{var} = {value}")
            hop, size = (var, size) if name == "hop" else (hop, var)
    onesided = bool(node.attr("onesided", 1))
    bins: int | str = size if not onesided else (
        size // 2 + 1 if isinstance(size, int) else f"{size} // 2 + 1")  # fmt: skip
    frames, t = node.tmp("count"), node.tmp("frames")
    device = f"device={x.expr}.device"
    lines += [
        f"{frames} = 1 + ({x.expr}.shape[1] - {size}) // {hop}",
        f"{t} = rt.gather({x.expr}, Tensor.arange({frames}, {device}).reshape([-1, 1]) * {hop}"
        f" + Tensor.arange({size}, {device}).reshape([1, -1]), 1)",
    ]  # fmt: skip
    if window.present:
        lines.append(f"{t} = {t} * {window.expr}.reshape([-1, 1])")
    weights = _matrix(node, size, bins, size, shape[2] == 2, "forward", x.expr, lines)
    lines += [
        f"{t} = rt.matmul({t}.reshape([*{t}.shape[:-2], -1]), {weights})",
        f"{node.outputs[0]} = {t}.reshape([*{t}.shape[:-1], {bins}, 2])",
    ]  # fmt: skip
    return lines


def _static(v: Value, i: int) -> int | None:
    shape = v.shape
    return shape[i] if shape is not None and isinstance(shape[i], int) else None


def _window(node: NodeContext, terms: list[tuple[float, int]]) -> list[str]:
    """``sum(c * cos(2 pi k n / N))`` over ``(c, k)`` in ``terms``, for ``n < size``, with
    ``N = size`` (periodic, the default) or ``size - 1`` (symmetric)."""
    size = node.input(0)
    target = dtype_attr(node, "output_datatype") or DType.F32
    periodic = bool(node.attr("periodic", 1))
    n, ramp = node.tmp("n"), node.tmp("ramp")
    period = n if periodic else f"({n} - 1)"
    out = " + ".join(f"({ramp} * {2 * k * math.pi!r} / {period}).cos() * {c!r}" if k else repr(c)
                     for c, k in terms)  # fmt: skip
    return [
        f"{n} = rt.ints({size.expr})[0]",
        f'{ramp} = Tensor.arange({n}, device={size.expr}.device).cast("f64")',
        f'{node.outputs[0]} = ({out}).cast("{target.value}")',
    ]


_WINDOW_ATTRS = ("output_datatype", "periodic")


@converter("HannWindow", since=17, attrs=_WINDOW_ATTRS)
def hann_window(node: NodeContext) -> list[str]:
    """``sin(pi n / N)^2 = 0.5 - 0.5 cos(2 pi n / N)``."""
    return _window(node, [(0.5, 0), (-0.5, 1)])


@converter("HammingWindow", since=17, attrs=_WINDOW_ATTRS)
def hamming_window(node: NodeContext) -> list[str]:
    """``25/46 - 21/46 cos(2 pi n / N)``."""
    return _window(node, [(25 / 46, 0), (-(1 - 25 / 46), 1)])


@converter("BlackmanWindow", since=17, attrs=_WINDOW_ATTRS)
def blackman_window(node: NodeContext) -> list[str]:
    """``0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)``."""
    return _window(node, [(0.42, 0), (-0.5, 1), (0.08, 2)])
