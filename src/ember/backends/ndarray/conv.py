"""Convolutions of the NdArray backend: NumPy kernels over plain arrays.

Every function here is pure (inputs are never written to) and returns a new
C-contiguous array of the input's dtype. Half-precision inputs (float16,
bfloat16) are computed in float32 and cast back: NumPy has no BLAS for them,
and PyTorch's CPU kernels accumulate them in float32 too.

Lowering. A convolution is a matrix product: the input is unrolled ("im2col")
into a matrix whose rows are (input channel, kernel position) and whose
columns are output positions, and the weight ``[out, in * kernel]`` multiplies
it. The unrolled matrix is built by one NumPy copy from a strided view of the
(padded) input, so no Python code runs per pixel, channel or kernel position.

Layout choices, each measured against the alternatives on the guide shapes:

* The unrolled matrix is ``[N, C * K, out]`` and the weight multiplies every
  sample's block in one batched ``np.matmul`` whose result is already in
  ``[N, O, out]`` order, so the output needs no transposing copy. (A single
  ``[C * K, N * out]`` GEMM was slower: OpenBLAS runs this short-and-wide shape
  better in sample-sized panels, and the result must then be transposed.)
* When the last spatial dim has stride 1, the columns span the *whole* padded
  row rather than only the valid outputs. Every (channel, kernel position)
  row of a sample's block is then one contiguous slice of the flat padded
  input, and the copy that builds it runs at memcpy speed instead of paying
  NumPy's per-run overhead on every short output row. The ``d * (k - 1)``
  extra columns per row are computed and dropped in the one copy into the
  result.
* The bias is an extra row of ones in the unrolled matrix and an extra
  column of the weight, so it costs no pass over the output.
* Samples are processed in blocks of about a megabyte of unrolled input, so
  the padded input, the unrolled block and the GEMM result stay in L2 between
  the step that writes them and the one that reads them. The Python loop runs
  once per block, not per sample. Its scratch buffers are reused across calls
  (see :func:`_scratch`).
* Where NumPy's BLAS has several threads, the samples are split over that many threads,
  each unrolling and multiplying its own blocks with the BLAS held to one thread
  (``parallel.py``): NumPy's copies would otherwise run on one core.

The weight gradient (:func:`weight_grad_nd`) reuses the same unrolled blocks, laid out
``[groups, rows, samples, positions]`` so that one product per block sums over all of
its samples and positions at once.

Transposed convolutions have two lowerings, picked per call by their estimated memory
traffic (:func:`_col2im_is_cheaper`):

* by output phase (``position mod stride``): each phase is an ordinary stride-1
  convolution of the input with a flipped sub-kernel, written straight into its strided
  slice of the output. That keeps the single-GEMM lowering, wastes no products on the
  zeros a "dilate the input" formulation would insert, and needs no scatter-add; its
  unrolled input has the input's channels, and every phase pays a convolution call;
* "col2im": one GEMM of the transposed weight with the input gives every (output
  channel, kernel tap) contribution, and one strided add per tap places them. Its
  buffers have the output's channels, so it wins where the output has few channels
  (the input gradient of a first layer: one to three image channels) and where strided
  phases are small enough that their fixed cost per call dominates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np
from numpy.lib.stride_tricks import as_strided

from ember.backends.ndarray.parallel import Claim, run_blocks
from ember.backends.ndarray.scratch import scratch

if TYPE_CHECKING:
    from ember.backend.options import ConvOptions, ConvTransposeOptions

__all__ = [
    "conv2d",
    "conv3d",
    "conv_nd",
    "conv_transpose2d",
    "conv_transpose3d",
    "conv_transpose_nd",
    "unfold4d",
    "weight_grad_nd",
]

_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))

# Full-row columns cost (padded width / output width) more GEMM work; beyond this
# ratio the per-row copy of the plain layout is cheaper than the wasted products.
_MAX_FULL_ROW_WASTE = 1.5

# Bytes of unrolled input per block of samples: about half of a typical L2 cache.
_COLS_BUDGET_BYTES = 1 << 20

# Scratch arrays larger than this are allocated per call instead of kept between calls.
_SCRATCH_MAX_BYTES = 1 << 24

def _scratch(slot: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A reused scratch array (``scratch.py``); a fresh one above :data:`_SCRATCH_MAX_BYTES`."""
    return scratch(f"conv_{slot}", shape, dtype, _SCRATCH_MAX_BYTES)


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float32 for half precision, else the dtype itself."""
    return np.dtype(np.float32) if dtype in _HALF else dtype


def _finish(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return out if out.dtype == dtype else out.astype(dtype)


@dataclass(frozen=True)
class _Unrolled:
    """How one call unrolls its input (see the module docstring), shared by the blocks.

    A block holds ``chunk`` samples; each (group, channel, kernel tap) row of a sample is
    ``length`` columns: ``prod(out[:-1]) * last`` positions, where ``last`` is the padded
    row's width when whole rows are unrolled (``full_row``) and the output's otherwise.
    ``extra`` is 1 when a row of ones (the bias) follows the ``rows`` unrolled ones.
    """

    x: np.ndarray  # cropped where a padding is negative
    pad_lo: tuple[int, ...]
    padded: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    out: tuple[int, ...]
    dtype: np.dtype
    extra: int
    full_row: bool
    last: int
    slack: int  # elements that full rows read past the end of a block
    in_place: bool  # the input is read as it is, without a padded copy
    rows: int  # unrolled rows per group: channels per group times kernel taps
    length: int
    chunk: int


def _unrolled(
    x: np.ndarray,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    pad_lo: tuple[int, ...],
    pad_hi: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
    out: tuple[int, ...],
    dtype: np.dtype,
    extra: int,
) -> _Unrolled:
    """The unrolling of ``x`` ``[N, C, *S]`` for a convolution with ``out`` positions;
    negative pads crop."""
    if min(pad_lo) < 0 or min(pad_hi) < 0:
        x = x[
            (
                slice(None),
                slice(None),
                *(
                    slice(max(0, -lo), s - max(0, -hi))
                    for lo, hi, s in zip(pad_lo, pad_hi, x.shape[2:])
                ),
            )
        ]
        pad_lo = tuple(max(0, p) for p in pad_lo)
        pad_hi = tuple(max(0, p) for p in pad_hi)
    n, c = x.shape[:2]
    padded = tuple(s + lo + hi for s, lo, hi in zip(x.shape[2:], pad_lo, pad_hi))
    full_row = stride[-1] == 1 and padded[-1] <= _MAX_FULL_ROW_WASTE * out[-1]
    last = padded[-1] if full_row else out[-1]
    slack = padded[-1] - out[-1] if full_row else 0
    # An unpadded input is read in place, except for the block holding the end of
    # the input when full rows would read past it.
    in_place = (
        not any(pad_lo)
        and not any(pad_hi)
        and x.dtype == dtype
        and (not slack or x.flags.c_contiguous)
    )
    rows = c // groups * math.prod(kernel)
    length = math.prod(out[:-1]) * last
    per_sample = groups * (rows + extra) * length * dtype.itemsize
    chunk = max(1, min(n, _COLS_BUDGET_BYTES // max(per_sample, 1)))
    return _Unrolled(
        x, pad_lo, padded, kernel, stride, dilation, groups, out, dtype, extra, full_row,
        last, slack, in_place, rows, length, chunk,
    )  # fmt: skip


def _block_filler(u: _Unrolled, rows_outer: bool = False) -> Callable[[int, int], np.ndarray]:
    """This thread's scratch for ``u``'s blocks: ``fill(start, m)`` unrolls samples
    ``start : start + m`` and returns them as ``[m, g, rows + extra, length]``, or with
    ``rows_outer`` as ``[g, rows + extra, m, length]`` (whose last two dims merge)."""
    x, wd, g, rows, length, chunk = u.x, u.dtype, u.groups, u.rows, u.length, u.chunk
    n, c = x.shape[:2]
    cg = c // g
    if rows_outer:
        raw = _scratch("cols", (g, rows + u.extra, chunk, length), wd)
        cols = raw.transpose(2, 0, 1, 3)
    else:
        cols = raw = _scratch("cols", (chunk, g, rows + u.extra, length), wd)
    if u.extra:
        cols[:, :, rows, :] = 1
    # Only splits axes, so this is always a view (merging g with the channels would not be).
    target = cols[:, :, :rows, :].reshape(chunk, g, cg, *u.kernel, *u.out[:-1], u.last)

    # The padded copy of one block is zeroed once; each block then writes only its
    # interior, so the border stays zero.
    pad_buf = pad_inner = None
    if not u.in_place or u.slack:
        flat = _scratch("padded", (chunk * c * math.prod(u.padded) + u.slack,), wd)
        flat.fill(0)
        pad_buf = flat[: flat.size - u.slack].reshape(chunk, c, *u.padded)
        inner = tuple(slice(lo, lo + s) for lo, s in zip(u.pad_lo, x.shape[2:]))
        pad_inner = pad_buf[(slice(None), slice(None), *inner)]

    def window_strides(src: np.ndarray) -> tuple[int, ...]:
        sn, sc, *ss = src.strides
        return (
            sn,
            cg * sc,
            sc,
            *(d * st for d, st in zip(u.dilation, ss)),
            *(s * st for s, st in zip(u.stride[:-1], ss[:-1])),
            ss[-1] if u.full_row else ss[-1] * u.stride[-1],
        )

    # The windows as strided views, built once (as_strided costs microseconds a call).
    window = (g, cg, *u.kernel, *u.out[:-1], u.last)
    x_windows = as_strided(x, (n, *window), window_strides(x)) if u.in_place else None
    pad_windows = None
    if pad_buf is not None:
        pad_windows = as_strided(pad_buf, (chunk, *window), window_strides(pad_buf))

    def fill(start: int, m: int) -> np.ndarray:
        if u.in_place and (not u.slack or start + m < n):
            view = x_windows[start : start + m]
        else:
            np.copyto(pad_inner[:m], x[start : start + m])
            view = pad_windows[:m]
        np.copyto(target[:m], view)
        return raw[:, :, :m] if rows_outer else raw[:m]

    return fill


def _conv_into(
    dest: np.ndarray,
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple[int, ...],
    pad_lo: tuple[int, ...],
    pad_hi: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> None:
    """Writes the cross-correlation of ``x`` ``[N, C, *S]`` with ``weight`` ``[O, C/g, *K]``
    (plus ``bias``) into ``dest`` ``[N, O, *out]``, which may be a strided view.

    ``pad_lo`` / ``pad_hi`` are the zeros added before / after each spatial dim;
    negative values crop instead. ``dest`` has the working dtype (see
    :func:`_work_dtype`); ``x`` may have any float dtype. The module docstring
    explains the layout.
    """
    wd = dest.dtype
    o = weight.shape[0]
    g = groups
    og = o // g
    out = dest.shape[2:]
    extra = 0 if bias is None else 1
    u = _unrolled(x, weight.shape[2:], stride, pad_lo, pad_hi, dilation, g, out, wd, extra)
    n, rows, length = u.x.shape[0], u.rows, u.length
    w = weight.reshape(g, og, rows)
    if extra:
        w = np.concatenate([w, bias.reshape(g, og, 1).astype(w.dtype, copy=False)], axis=2)
    w = w.astype(wd, copy=False)
    if g == 1:
        w = w[0]
    direct = u.last == out[-1] and dest.flags.c_contiguous

    def samples(claim: Claim) -> None:
        fill = _block_filler(u)
        res = None if direct else _scratch("res", (u.chunk, o, length), wd)
        while (block := claim()) is not None:
            start, m = block
            cols = fill(start, m)
            products = dest[start : start + m].reshape(m, o, length) if direct else res[:m]
            if g == 1:
                np.matmul(w, cols.reshape(m, rows + extra, length), out=products)
            else:
                np.matmul(w, cols, out=products.reshape(m, g, og, length))
            if not direct:
                # Drops the columns that ran past the valid width into the next row.
                np.copyto(dest[start : start + m],
                          products.reshape(m, o, *out[:-1], u.last)[..., : out[-1]])  # fmt: skip

    run_blocks(n, u.chunk, n * o * (rows + extra) * length, samples)


def weight_grad_nd(
    x: np.ndarray,
    grad: np.ndarray,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> np.ndarray:
    """Gradient of ``conv(x, w)`` for ``w`` ``[O, C / groups, *kernel]`` given the output's
    gradient ``grad`` ``[N, O, *out]``, any number of spatial dims.

    ``dw[g, o, r] = sum over samples and positions of grad[n, g, o, p] * cols[n, g, r, p]``
    over the forward's unrolled input ``cols``: per block of samples, one product whose
    inner dim runs over the block's samples and positions at once (the unrolled rows are
    laid out ``[g, rows, samples, positions]`` for it). With full rows the gradient gets
    zero columns where the unrolled rows run past the output's width. Measured on the
    guide CNN's second layer (8 -> 16 channels, 26 x 26, batch 64, one thread, minima of
    interleaved calls): 1.35x faster than the generic ``g`` times ``unfold4d``
    (``ember.backend.conv_grad``) and 1.2x PyTorch's oneDNN kernel.
    """
    dtype = x.dtype
    wd = _work_dtype(dtype)
    n, c = x.shape[:2]
    o, out = grad.shape[1], grad.shape[2:]
    g = groups
    og = o // g
    u = _unrolled(x, kernel, stride, padding, padding, dilation, g, out, wd, 0)
    rows, length, chunk = u.rows, u.length, u.chunk
    grad_w = grad.astype(wd, copy=False).reshape(n, g, og, *out)

    samples_last = (1, 2, 0, *range(3, 3 + len(out)))

    sums: dict[int, np.ndarray] = {}  # per block, by its first sample

    def samples(claim: Claim) -> None:
        fill = _block_filler(u, rows_outer=True)
        # The gradient block as [g, og, samples, *out[:-1], last], zero past the width.
        grads = _scratch("grad_rows", (g, og, chunk, *out[:-1], u.last), wd)
        if u.last != out[-1]:
            grads[..., out[-1] :] = 0
        while (block := claim()) is not None:
            start, m = block
            cols = fill(start, m).reshape(g, rows, m * length)
            taken = grads[:, :, :m]
            np.copyto(taken[..., : out[-1]], grad_w[start : start + m].transpose(samples_last))
            sums[start] = np.matmul(taken.reshape(g, og, m * length), cols.transpose(0, 2, 1))

    run_blocks(n, chunk, n * o * rows * length, samples)
    dw = np.zeros((g, og, rows), wd)
    for start in sorted(sums):  # in block order, whichever thread made each sum
        dw += sums[start]
    return _finish(dw.reshape(o, c // g, *kernel), dtype)


def conv_nd(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int = 1,
) -> np.ndarray:
    """Cross-correlation of ``x`` ``[N, C, *S]`` with ``weight`` ``[O, C / groups, *K]`` for
    any number of spatial dims, as ``torch.nn.functional.conv{n}d`` computes it.

    Returns ``[N, O, *out]`` with ``out = (S + 2p - d (K - 1) - 1) // s + 1``.
    """
    dtype = x.dtype
    wd = _work_dtype(dtype)
    out = tuple(
        (s + 2 * p - d * (k - 1) - 1) // st + 1
        for s, p, d, k, st in zip(x.shape[2:], padding, dilation, weight.shape[2:], stride)
    )
    result = np.empty((x.shape[0], weight.shape[0], *out), wd)
    _conv_into(result, x, weight, bias, stride, padding, padding, dilation, groups)
    return _finish(result, dtype)


def conv2d(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, options: ConvOptions
) -> np.ndarray:
    """2-d convolution ``[N, C, H, W] * [O, C/g, kh, kw] -> [N, O, oh, ow]`` (see :func:`conv_nd`)."""
    return conv_nd(
        x, weight, bias, options.stride, options.padding, options.dilation, options.groups
    )


def conv3d(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, options: ConvOptions
) -> np.ndarray:
    """3-d convolution ``[N, C, D, H, W] * [O, C/g, kd, kh, kw]`` (see :func:`conv_nd`)."""
    return conv_nd(
        x, weight, bias, options.stride, options.padding, options.dilation, options.groups
    )


def _phase(
    r: int, size: int, k: int, stride: int, pad: int, dil: int, out: int
) -> tuple[int, int, list[int], int, int, int] | None:
    """One output phase of a transposed convolution along one dim.

    The outputs ``o`` with ``(o + pad) % stride == r`` receive input ``i`` through
    tap ``t`` exactly when ``i * stride + t * dil == o + pad``, which only taps with
    ``t * dil % stride == r`` can satisfy. Those taps, reversed, form an ordinary
    correlation kernel with dilation ``step * dil / stride`` over the input.

    Returns ``(first, count, taps, dilation, pad_lo, pad_hi)``: the phase's
    outputs are ``first, first + stride, ...`` (``count`` of them), and they
    equal the correlation of the input, padded by ``pad_lo`` / ``pad_hi``
    (negative: cropped), with the weight's ``taps`` in that order. ``None``
    when the phase has no outputs.
    """
    first = (r - pad) % stride
    count = max(0, -(-(out - first) // stride))
    if count == 0:
        return None
    taps = [t for t in range(k) if t * dil % stride == r]
    if not taps:
        return first, count, [], 1, 0, 0
    q0 = (first + pad) // stride
    e0 = (taps[0] * dil - r) // stride
    e_step = (taps[1] - taps[0]) * dil // stride if len(taps) > 1 else 1
    span = e_step * (len(taps) - 1)
    lo = span + e0 - q0  # output t reads input t - lo + j * e_step, j over the reversed taps
    hi = count - 1 + span - (size - 1) - lo
    return first, count, taps[::-1], e_step, lo, hi


def conv_transpose_nd(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    padding_out: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int = 1,
) -> np.ndarray:
    """Transposed convolution of ``x`` ``[N, Cin, *S]`` with ``weight`` ``[Cin, Cout/g, *K]``,
    as ``torch.nn.functional.conv_transpose{n}d`` computes it (the gradient of a
    convolution with respect to its input).

    Output size per dim: ``(S - 1) s - 2p + d (K - 1) + padding_out + 1``.

    Computed phase by phase (see the module docstring and :func:`_phase`):
    ``prod(stride)`` stride-1 correlations with flipped sub-kernels, each
    written into the strided slice of the output it owns, so every output
    element is written exactly once and gets the bias exactly once.
    """
    dtype = x.dtype
    wd = _work_dtype(dtype)
    nd = x.ndim - 2
    n, cin = x.shape[:2]
    ks = weight.shape[2:]
    g = groups
    cig, cog = cin // g, weight.shape[1]
    cout = cog * g
    out = tuple(
        (s - 1) * st - 2 * p + d * (k - 1) + po + 1
        for s, st, p, d, k, po in zip(x.shape[2:], stride, padding, dilation, ks, padding_out)
    )
    if _col2im_is_cheaper(n, cin, cout, math.prod(ks), math.prod(x.shape[2:]), math.prod(stride)):
        result = _conv_transpose_col2im(
            x.astype(wd, copy=False), weight.astype(wd, copy=False), bias, stride, padding, out,
            dilation, g,
        )  # fmt: skip
        return _finish(result, dtype)
    # As a correlation weight: [Cout, Cin/g, *K] with in and out channels swapped per group.
    w = weight.reshape(g, cig, cog, *ks).swapaxes(1, 2).reshape(cout, cig, *ks)
    result = np.empty((n, cout, *out), wd)
    per_dim = [
        [
            _phase(r, x.shape[2 + i], ks[i], stride[i], padding[i], dilation[i], out[i])
            for r in range(stride[i])
        ]
        for i in range(nd)
    ]
    for phases in itertools.product(*per_dim):
        if any(ph is None for ph in phases):
            continue
        dest = result[
            (slice(None), slice(None), *(slice(ph[0], None, st) for ph, st in zip(phases, stride)))
        ]
        if any(not ph[2] for ph in phases):
            # No tap reaches these outputs: only the bias does.
            dest[...] = 0 if bias is None else bias.astype(wd).reshape(cout, *(1,) * nd)
            continue
        sub = w[(slice(None), slice(None), *np.ix_(*(ph[2] for ph in phases)))]
        _conv_into(
            dest, x, sub, bias, (1,) * nd, tuple(ph[4] for ph in phases),
            tuple(ph[5] for ph in phases), tuple(ph[3] for ph in phases), g,
        )  # fmt: skip
    return _finish(result, dtype)


# Fixed cost of one phase's convolution call, in elements copied in the same time
# (about 40 us against about 1 ns an element, measured on the guide's shapes).
_PHASE_CALL_ELEMENTS = 40_000


def _col2im_is_cheaper(n: int, cin: int, cout: int, taps: int, positions: int, phases: int) -> bool:
    """Whether col2im moves less memory than the phase lowering for a transposed
    convolution of ``n`` samples of ``positions`` input positions, ``taps`` kernel taps.

    Phases unroll the input: ``n * cin * taps * positions`` elements over all phases,
    plus a fixed cost per phase. col2im's GEMM writes ``n * cout * taps * positions``
    elements, which the per-tap adds read again and add into the output (about three
    passes). Measured on transposed convolutions from 1 to 128 channels, stride 1 and
    2, this picks the faster lowering or one within noise of it.
    """
    unrolled = n * taps * positions
    return 3 * cout * unrolled < cin * unrolled + phases * _PHASE_CALL_ELEMENTS


def _conv_transpose_col2im(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    out: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> np.ndarray:
    """The transposed convolution as one GEMM and one add per kernel tap.

    ``cols[n, (o, tap), i] = sum_c weight[c, o, tap] x[n, c, i]`` is what input position
    ``i`` sends through ``tap`` to output position ``i * stride + tap * dilation``
    (before ``padding`` is cropped); each tap's contributions form one strided slice of
    the uncropped output. ``x`` and ``weight`` have the working dtype already.

    With every stride 1 and many output channels, the input is first padded with zeros to
    the uncropped output's size in every spatial dim but the first (full rows). A tap's
    slice of the output is then one contiguous run of each channel, ``tap`` offset:
    positions past the input's size carry zeros (their input is zero), so where they run
    into the next row they add nothing. Each add is one long run per channel, not one per
    output row: NumPy's cost per run was most of col2im's time on small images.
    """
    n, cin = x.shape[:2]
    spatial = x.shape[2:]
    ks = weight.shape[2:]
    g = groups
    cig, cog = cin // g, weight.shape[1]
    cout = cog * g
    taps = math.prod(ks)
    # Uncropped: every tap's slice fits, and so does the cropped output (padding_out).
    full = tuple(
        max((s - 1) * st + d * (k - 1) + 1, p + o)
        for s, st, d, k, p, o in zip(spatial, stride, dilation, ks, padding, out)
    )
    # Full rows trade one padded copy of the input for fewer, longer adds: worth it where
    # the adds move more than the input does (measured: 1.2-1.7x faster for 16 -> 8 and
    # 32 -> 16 channels of 3 x 3, 10-25% slower for 8 -> 1 and 64 -> 3).
    full_rows = all(st == 1 for st in stride) and len(spatial) > 1 and cout * taps >= 2 * cin
    # Columns of cols: the input's positions, padded to full rows when they are used.
    grid = (spatial[0], *full[1:]) if full_rows else spatial
    positions = math.prod(grid)
    wt = weight.reshape(g, cig, cog * taps).transpose(0, 2, 1)  # [G, Cout/G * taps, Cin/G]
    buf = np.zeros((n, cout, *full), x.dtype)
    every_tap = list(itertools.product(*(range(k) for k in ks)))
    if full_rows:
        target = buf.reshape(n, cout, math.prod(full))
        strides = [math.prod(full[i + 1 :]) for i in range(len(full))]
        # The last positions of cols are zero padding, and would run past a channel's end.
        run = positions - sum(
            (k - 1) * d * st for k, d, st in zip(ks[1:], dilation[1:], strides[1:])
        )
        adds = []  # (index into cols [m, Cout, *K, positions], index into target)
        for tap in every_tap:
            offset = sum(t * d * st for t, d, st in zip(tap, dilation, strides))
            adds.append(((slice(None), slice(None), *tap, slice(run)),
                         (slice(None), slice(None), slice(offset, offset + run))))  # fmt: skip
    else:
        target = buf
        adds = [  # (index into cols [m, Cout, *K, *S], index into target)
            ((slice(None), slice(None), *tap),
             (slice(None), slice(None), *(slice(t * d, t * d + st * (s - 1) + 1, st)
                                          for t, d, st, s in zip(tap, dilation, stride, spatial))))
            for tap in every_tap
        ]  # fmt: skip
    # In blocks of samples whose products stay in cache until their adds read them.
    chunk = max(1, min(n, _COLS_BUDGET_BYTES // max(1, cout * taps * positions * x.itemsize)))

    def samples(claim: Claim) -> None:
        padded = None
        if full_rows:
            padded = _scratch("col2im_in", (chunk, cin, *grid), x.dtype)
            padded.fill(0)  # the interior is overwritten per block, the border stays zero
        while (block := claim()) is not None:
            start, m = block
            xs = x[start : start + m]
            if padded is not None:
                np.copyto(padded[(slice(m), slice(None), *(slice(s) for s in spatial))], xs)
                xs = padded[:m]
            cols = _scratch("col2im", (m, g, cog * taps, positions), x.dtype)
            np.matmul(wt, xs.reshape(m, g, cig, positions), out=cols)
            cols = cols.reshape(m, cout, *ks, *((positions,) if full_rows else spatial))
            sums = target[start : start + m]
            for source, window in adds:
                into = sums[window]
                np.add(into, cols[source], out=into)  # ``+=`` would copy the view onto itself

    run_blocks(n, chunk, n * cout * taps * positions * cig, samples)
    result = buf[(slice(None), slice(None), *(slice(p, p + o) for p, o in zip(padding, out)))]
    if bias is not None:
        return result + bias.astype(x.dtype, copy=False).reshape(cout, *(1,) * len(spatial))
    return np.ascontiguousarray(result)


def conv_transpose2d(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, options: ConvTransposeOptions
) -> np.ndarray:
    """2-d transposed convolution (see :func:`conv_transpose_nd`)."""
    return conv_transpose_nd(
        x, weight, bias, options.stride, options.padding, options.padding_out, options.dilation,
        options.groups,
    )  # fmt: skip


def conv_transpose3d(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, options: ConvTransposeOptions
) -> np.ndarray:
    """3-d transposed convolution (see :func:`conv_transpose_nd`)."""
    return conv_transpose_nd(
        x, weight, bias, options.stride, options.padding, options.padding_out, options.dilation,
        options.groups,
    )  # fmt: skip


def unfold4d(x: np.ndarray, kernel_size: tuple[int, int], options: ConvOptions) -> np.ndarray:
    """Sliding blocks of ``x`` ``[N, C, H, W]`` as ``[N, C * kh * kw, oh * ow]``, the layout
    of ``torch.nn.functional.unfold``: rows ordered (channel, kernel row, kernel
    column), columns ordered (output row, output column). ``options.groups`` is
    ignored. No arithmetic happens, so the copy keeps the input's dtype; it is
    one strided copy from a view of the zero-padded input.
    """
    n, c, h, w = x.shape
    kh, kw = kernel_size
    (sh, sw), (ph, pw), (dh, dw) = options.stride, options.padding, options.dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ph or pw:
        xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), x.dtype)
        xp[:, :, ph : ph + h, pw : pw + w] = x
    else:
        xp = x
    s_n, s_c, s_h, s_w = xp.strides
    view = as_strided(
        xp, (n, c, kh, kw, oh, ow), (s_n, s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w)
    )
    result = np.empty((n, c, kh, kw, oh, ow), x.dtype)
    np.copyto(result, view)
    return result.reshape(n, c * kh * kw, oh * ow)
