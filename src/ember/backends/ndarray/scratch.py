"""Per-thread scratch arrays reused between calls (NumPy kernels and the numba runtime's).

A kernel's scratch space (a padded input, unrolled patches, a packed GEMM operand) lives
only during one call, so a buffer per named slot can serve every call, as long as a call
never holds the same slot twice. It pays: glibc hands freed blocks of a few MiB back to
the system, and faulting fresh pages in on every call costs as much as the copy that
fills them.
"""

from __future__ import annotations

import math
import threading

import numpy as np

__all__ = ["scratch"]

_local = threading.local()


def scratch(slot: str, shape: tuple[int, ...], dtype: np.dtype,
            max_bytes: int | None = None) -> np.ndarray:  # fmt: skip
    """An uninitialized array of ``shape`` in this thread's buffer ``slot`` (grown as
    needed), valid until this thread's next use of ``slot``; a fresh array above
    ``max_bytes`` (None: no limit)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if max_bytes is not None and nbytes > max_bytes:
        return np.empty(shape, dtype)
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    raw = buffers.get(slot)
    if raw is None or raw.nbytes < nbytes:
        raw = buffers[slot] = np.empty(max(nbytes, 1 << 16), np.uint8)
    return raw[:nbytes].view(dtype).reshape(shape)
