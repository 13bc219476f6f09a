"""Sums and means over one axis as numba kernels: a candidate beside NdArray's NumPy ones.

:func:`reduce_dim` computes what NdArray's ``float_sum_dim`` and ``float_mean_dim`` compute
(the axis kept, of size 1) for float32 and float64 arrays that are C-contiguous. The array
is seen as ``[outer, axis, inner]``:

* **Over the last axis** (``inner == 1``: a global pooling's mean over a plane's
  positions) each output is one run of contiguous values, summed with ``reassoc`` so
  that the loop keeps a vector of partial sums (equal to NumPy's pairwise sum to
  rounding). Measured in the ONNX CNN of ``benchmarks/onnx_inference.py`` (the mean of
  ``[8, 64, 256]`` over its last axis, right after the convolution that wrote it): 28 us
  on one thread, where ``np.mean`` took 96-144 us.
* **Over another axis** (a bias gradient's sum over the batch) the rows of the axis are
  added one after the other into the output row, as NumPy adds them (the same order, so
  the same bits for a sum), vectorized along ``inner``.

Parts split the outputs (``outer`` rows over the last axis, else stretches of ``inner``)
and run through ``numba_runtime._run_parts`` as the other single-op kernels do; the
executor's tuner chooses between this kernel and the inner op per bucket (``op_kernels``).

Example:
    >>> import numpy as np
    >>> from ember.backends.fusion.numba_reduce import reduce_dim
    >>> x = np.arange(12, dtype=np.float32).reshape(3, 4)
    >>> reduce_dim(x, 1, mean=True).tolist(), reduce_dim(x, 0, mean=False).tolist()
    ([[1.5], [5.5], [9.5]], [[12.0, 15.0, 18.0, 21.0]])
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ember.backends.fusion.numba_runtime import _run_parts
from ember.backends.fusion.numba_source import KernelUnsupported

try:  # numba is optional: reduce_dim raises KernelUnsupported without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["KernelUnsupported", "reduce_dim", "supports"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
LANES_ALIGN = 16
"""A part's stretch of ``inner`` starts on a multiple of this many elements (whole
vectors: no two parts write one cache line)."""


def _jit(**flags):
    def wrap(fn):
        if numba is None:  # pragma: no cover - exercised where numba is missing
            return fn
        return numba.njit(nogil=True, cache=True, error_model="numpy", **flags)(fn)

    return wrap


@_jit(fastmath={"reassoc", "contract"})
def _over_last(x, out, mean, divisor, part, parts):  # pragma: no cover - runs compiled
    """``out[o] = sum(x[o, :])`` (divided by ``divisor``, the length in ``x``'s dtype, for a
    mean), outputs ``o`` of this part; ``x`` is ``[outer, length]``."""
    outer, length = x.shape
    for o in range(outer * part // parts, outer * (part + 1) // parts):
        row = x[o]
        total = row[0]
        for k in range(1, length):
            total += row[np.uintp(k)]
        out[o] = total / divisor if mean else total


@_jit()
def _over_middle(x, out, mean, divisor, part, parts):  # pragma: no cover - runs compiled
    """``out[o, j] = sum(x[o, :, j])`` (divided by ``divisor`` for a mean), columns ``j`` of
    this part's stretch, rows added in order; ``x`` is ``[outer, length, inner]``."""
    outer, length, inner = x.shape
    blocks = -(-inner // LANES_ALIGN)
    lo = min(inner, blocks * part // parts * LANES_ALIGN)
    hi = min(inner, blocks * (part + 1) // parts * LANES_ALIGN)
    for o in range(outer):
        row = out[o]
        first = x[o, 0]
        for j in range(lo, hi):
            row[np.uintp(j)] = first[np.uintp(j)]
        for k in range(1, length):
            add = x[o, k]
            for j in range(lo, hi):
                row[np.uintp(j)] += add[np.uintp(j)]
        if mean:
            for j in range(lo, hi):
                row[np.uintp(j)] = row[np.uintp(j)] / divisor


def supports(x: object, dim: object) -> bool:
    """Whether :func:`reduce_dim` takes these arguments: numba present, a C-contiguous
    float32 or float64 array with no empty dim, and an axis of it."""
    return (numba is not None and type(x) is np.ndarray and x.dtype in _DTYPES
            and x.flags.c_contiguous and x.ndim >= 1 and x.size > 0 and type(dim) is int
            and -x.ndim <= dim < x.ndim)  # fmt: skip


def reduce_dim(x: np.ndarray, dim: int, mean: bool, threads: int = 1,
               empty: Callable = np.empty) -> np.ndarray:  # fmt: skip
    """The sum (or with ``mean``, the mean) of ``x`` over axis ``dim``, kept as an axis of
    size 1, in ``x``'s dtype; the output comes from ``empty(shape, dtype)``, and
    ``threads`` parts compute it.

    Raises:
        KernelUnsupported: arguments :func:`supports` refuses (the caller runs the inner op).
    """
    if not supports(x, dim):
        raise KernelUnsupported(f"numba reduce_dim: {type(x).__name__} over dim {dim!r} is "
                                "not a C-contiguous float32 or float64 array's axis")  # fmt: skip
    dim %= x.ndim
    outer, length = math.prod(x.shape[:dim]), x.shape[dim]
    inner = math.prod(x.shape[dim + 1 :])
    shape = (*x.shape[:dim], 1, *x.shape[dim + 1 :])
    out = empty(shape, x.dtype)
    # NumPy divides a float32 sum by the count in float32.
    divisor = x.dtype.type(length)
    if inner == 1:
        parts = max(1, min(threads, outer))
        _run_parts(_over_last, [x.reshape(outer, length), out.reshape(outer), mean, divisor],
                   parts)  # fmt: skip
    else:
        parts = max(1, min(threads, -(-inner // LANES_ALIGN)))
        _run_parts(_over_middle, [x.reshape(outer, length, inner), out.reshape(outer, inner),
                                  mean, divisor], parts)  # fmt: skip
    return out
