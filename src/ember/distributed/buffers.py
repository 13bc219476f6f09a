"""Reused CPU buffers for collectives: fresh pages fault, and a collective's copy is hot.

A collective copies its input once into a buffer the engine overwrites, and hands that
buffer back as the result (``bridge.py``). Into fresh memory that copy costs about as much
as the page faults (about 20 ms per 64 MB here), so buffers are kept and reused once
nothing refers to them any more. Whether anything does is read from the buffer's reference
count: every NumPy view (a reshape, a slice, the array inside a result tensor) and every
torch tensor made by ``torch.from_numpy`` holds a reference to the pool's array, so a
count of the pool's own references means the memory is free.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from ember.backend.environment import whole_number

_MIN_BYTES = 1 << 16  # below 64 KiB a fresh np.empty is as cheap as a lookup


class BufferPool:
    """Byte buffers by exact size, reused when unreferenced; at most ``max_bytes`` in all.

    Args:
        max_bytes: the most bytes the pool keeps (lent or idle); beyond it, buffers are not
            kept. Default: ``EMBER_DIST_POOL_BYTES`` or 1 GiB.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is None:
            max_bytes = whole_number("EMBER_DIST_POOL_BYTES", 1 << 30, "bytes", "0 keeps no buffer")
        self.max_bytes = max_bytes
        self._buffers: list[np.ndarray] = []
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """An uninitialised uint8 array of ``nbytes``: an unreferenced pooled one if any."""
        if nbytes < _MIN_BYTES:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            for buffer in self._buffers:
                # References: the list, the loop variable and getrefcount's argument.
                if buffer.nbytes == nbytes and sys.getrefcount(buffer) <= 3:
                    return buffer
            buffer = np.empty(nbytes, np.uint8)
            if self._bytes + nbytes <= self.max_bytes:
                self._buffers.append(buffer)
                self._bytes += nbytes
            elif self._buffers:  # make room: drop unreferenced buffers of other sizes
                idle = [b for b in self._buffers if sys.getrefcount(b) <= 3]
                for old in idle[: len(idle)]:
                    if self._bytes + nbytes <= self.max_bytes:
                        break
                    self._buffers.remove(old)
                    self._bytes -= old.nbytes
                if self._bytes + nbytes <= self.max_bytes:
                    self._buffers.append(buffer)
                    self._bytes += nbytes
            return buffer


POOL = BufferPool()
