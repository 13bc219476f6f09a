"""Sums and means over one dim of a C-contiguous float array as numba kernels: a candidate
beside NdArray's ``np.sum`` and ``np.mean`` for a reduction no fuser takes.

A lone reduction is no fused block (a fuser computes two records or more in a kernel), so
it ran as NumPy's, on the calling thread alone. The array is read as ``[outer, n,
inner]``, summed over ``n``:

* **The last dim** (``inner`` 1): NumPy adds each row pairwise with scalar adds (an
  imported CNN's global average pooling, a mean over ``[8, 64, 256]``, took 45-70 us alone
  and about 200 us inside a replayed call). Here each row's sum is the one loop compiled
  with ``reassoc``, which LLVM adds in vector lanes: the results equal NumPy's to
  rounding, not bit for bit.
* **Any other dim** (a bias's gradient, the sum of ``[2048, 1024]`` over its rows): the
  rows are added in order into the output, a chunk of columns at a time, vectorized across
  the columns, which is NumPy's own order: the same bits. At one thread it took 0.65-0.85x
  NumPy's time on a transformer's bias gradients (``[2048, 256]`` to ``[2048, 1024]``);
  parts take chunks of columns, though a sum that large is bound by memory, and two
  threads measured no faster than one.

A mean divides the sum by ``n``, as NumPy's does. The tasks are split among parts
(``numba_runtime._run_parts``), each output computed by one of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ember.backends.fusion.numba_source import KernelUnsupported

try:  # numba is optional: the kernel refuses every array without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["KernelUnsupported", "sum_along", "supports"]

PARALLEL_MIN_ELEMENTS = 1 << 18
"""Reductions over fewer elements run on one thread unless told otherwise."""

COLUMNS = 1024
"""Columns of a task of the kernel over other dims, at most (its sums stay in L1 while the
rows add), and fewer where that leaves a part without a task."""

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _row_sums(flat, n, divisor, out, part, parts):  # pragma: no cover - runs compiled
    """Rows ``part`` of ``parts`` of ``out[r] = sum(flat[r * n : (r + 1) * n]) / divisor``."""
    rows = out.size
    for r in range(rows * part // parts, rows * (part + 1) // parts):
        base = np.uintp(r * n)
        total = flat[base]
        for j in range(1, n):
            total += flat[base + np.uintp(j)]
        out[np.uintp(r)] = total / divisor


def _column_sums(flat, n, inner, columns, divisor, out, part,
                 parts):  # fmt: skip  # pragma: no cover - runs compiled
    """Part ``part`` of ``parts`` of ``out[o, i] = sum_k flat[o, k, i] / divisor`` (``flat``
    ``[outer, n, inner]``, flat), rows added in order: a task is one ``o`` and a chunk of
    ``columns`` columns."""
    chunks = (inner + columns - 1) // columns
    tasks = out.size // inner * chunks
    for task in range(tasks * part // parts, tasks * (part + 1) // parts):
        o = task // chunks
        c0 = task % chunks * columns
        width = min(columns, inner - c0)
        dst = np.uintp(o * inner + c0)
        src = np.uintp(o * n * inner + c0)
        for i in range(width):
            out[dst + np.uintp(i)] = flat[src + np.uintp(i)]
        for k in range(1, n):
            row = src + np.uintp(k * inner)
            for i in range(width):
                out[dst + np.uintp(i)] += flat[row + np.uintp(i)]
        if divisor != 1:
            for i in range(width):
                out[dst + np.uintp(i)] /= divisor


if numba is not None:
    _row_sums = numba.njit(nogil=True, cache=True, error_model="numpy",
                           fastmath={"reassoc"})(_row_sums)  # fmt: skip
    # No fast-math: the rows' order is the result's.
    _column_sums = numba.njit(nogil=True, cache=True, error_model="numpy")(_column_sums)


def supports(x: object, dim: int) -> bool:
    """Whether :func:`sum_along` takes ``x`` reduced over ``dim``: numba present, a
    C-contiguous float32 or float64 array with elements, ``dim`` one of its dims (an int)."""
    return (numba is not None and type(x) is np.ndarray and x.dtype in _DTYPES
            and isinstance(dim, int | np.integer) and not isinstance(dim, bool)
            and x.ndim >= 1 and -x.ndim <= dim < x.ndim and x.size > 0
            and x.flags.c_contiguous)  # fmt: skip


def sum_along(x: np.ndarray, dim: int, mean: bool, threads: int | None = None,
              empty: Callable = np.empty) -> np.ndarray:  # fmt: skip
    """The sums (or, with ``mean``, the means) of ``x`` over ``dim``, that dim kept with
    size 1, in an array from ``empty(shape, dtype)`` (a pool's ``take``, say).

    Raises:
        KernelUnsupported: what :func:`supports` refuses.

    Example:
        >>> import numpy as np
        >>> x = np.arange(6, dtype=np.float32).reshape(2, 3)
        >>> sum_along(x, 1, mean=True).tolist(), sum_along(x, 0, mean=False).tolist()
        ([[1.0], [4.0]], [[3.0, 5.0, 7.0]])
    """
    if not supports(x, dim):
        raise KernelUnsupported(f"numba sum over dim {dim}: {getattr(x, 'dtype', type(x))} "
                                f"{getattr(x, 'shape', '')} is not a C-contiguous float array "
                                "with elements and that dim")  # fmt: skip
    from ember.backends.fusion.numba_runtime import _run_parts, parts_for

    dim %= x.ndim
    n = x.shape[dim]
    inner = math.prod(x.shape[dim + 1 :])
    out = empty((*x.shape[:dim], 1, *x.shape[dim + 1 :]), x.dtype)
    divisor = x.dtype.type(n if mean else 1)
    parts = parts_for(x.size, PARALLEL_MIN_ELEMENTS, threads)
    if inner == 1:
        args, tasks, kernel = [x.reshape(-1), n, divisor, out.reshape(-1)], out.size, _row_sums
    else:
        outer = out.size // inner
        # Whole vectors of columns, enough chunks for every part.
        columns = min(COLUMNS, -(-inner // max(1, parts // outer) // 16) * 16)
        tasks = outer * -(-inner // columns)
        args = [x.reshape(-1), n, inner, columns, divisor, out.reshape(-1)]
        kernel = _column_sums
    _run_parts(kernel, args, min(parts, tasks))
    return out
