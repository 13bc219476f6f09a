"""Sums and means over the last axis of a C-contiguous float array as a numba kernel: a
candidate beside NdArray's ``np.sum`` and ``np.mean`` for a reduction no fuser takes.

A lone reduction is no fused block (a fuser computes two records or more in a kernel), so
it ran as NumPy's, which adds each row pairwise with scalar adds: an imported CNN's global
average pooling (a reshape, then a mean over ``[8, 64, 256]``) took 45-70 us alone and
about 200 us inside a replayed call. Here each row's sum is the one loop compiled with
``reassoc``, which LLVM adds in vector lanes; the results equal NumPy's to rounding, not
bit for bit. A mean divides the sum by the row's length, as NumPy's does. Rows are split
among parts (``numba_runtime._run_parts``), each row summed by one of them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ember.backends.fusion.numba_source import KernelUnsupported

try:  # numba is optional: the kernel refuses every array without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["KernelUnsupported", "sum_last", "supports"]

PARALLEL_MIN_ELEMENTS = 1 << 18
"""Reductions over fewer elements run on one thread unless told otherwise."""

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


if numba is not None:
    _row_sums = numba.njit(nogil=True, cache=True, error_model="numpy",
                           fastmath={"reassoc"})(_row_sums)  # fmt: skip


def supports(x: object, dim: int) -> bool:
    """Whether :func:`sum_last` takes ``x`` reduced over ``dim``: numba present, a
    C-contiguous float32 or float64 array with elements, reduced over its last dim."""
    return (numba is not None and type(x) is np.ndarray and x.dtype in _DTYPES
            and x.ndim >= 1 and dim % x.ndim == x.ndim - 1 and x.size > 0
            and x.flags.c_contiguous)  # fmt: skip


def sum_last(x: np.ndarray, mean: bool, threads: int | None = None,
             empty: Callable = np.empty) -> np.ndarray:  # fmt: skip
    """The sums (or, with ``mean``, the means) of ``x`` over its last dim, that dim kept
    with size 1, in an array from ``empty(shape, dtype)`` (a pool's ``take``, say).

    Raises:
        KernelUnsupported: what :func:`supports` refuses.

    Example:
        >>> import numpy as np
        >>> sum_last(np.arange(6, dtype=np.float32).reshape(2, 3), mean=True).tolist()
        [[1.0], [4.0]]
    """
    if not supports(x, -1):
        raise KernelUnsupported(f"numba sum over the last dim: {getattr(x, 'dtype', type(x))} "
                                f"{getattr(x, 'shape', '')} is not a C-contiguous float array "
                                "with elements")  # fmt: skip
    from ember.backends.fusion.numba_runtime import _run_parts, parts_for

    n = x.shape[-1]
    out = empty((*x.shape[:-1], 1), x.dtype)
    divisor = x.dtype.type(n if mean else 1)
    rows = out.size
    parts = min(rows, parts_for(x.size, PARALLEL_MIN_ELEMENTS, threads))
    _run_parts(_row_sums, [x.reshape(-1), n, divisor, out.reshape(-1)], parts)
    return out
