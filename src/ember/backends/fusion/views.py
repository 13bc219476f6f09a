"""Chains of reshapes, permutes and slices as one strided view, where one exists.

NumPy must copy to reshape ``[128, 8, 256]`` (a slice of a permuted buffer) into ``[128, 32,
64]``: the ``32`` would need two strides. Yet the chain attention's heads go through,
``reshape -> permute -> reshape`` to ``[8, 4, 128, 64]``, ends where every dim has one stride
again. :func:`compose` follows the chain on *layouts* rather than arrays: each dim is a run
of ``(size, stride)`` parts, a reshape regroups (and where needed splits) the parts, a
permute reorders the dims, a slice moves the start and narrows a dim of one stride; at the
end, each dim's parts must merge into one stride, and the result is a view of the source's
memory (no copy, nothing read).

Example:
    >>> import numpy as np
    >>> from ember.backends.fusion.views import compose
    >>> x = np.arange(128 * 8 * 768.0).reshape(128, 8, 768)[:, :, :256]
    >>> chain = [("reshape", (128, 32, 64)), ("permute", (1, 0, 2)), ("reshape", (8, 4, 128, 64))]
    >>> view = compose(x, chain)
    >>> bool(np.shares_memory(view, x)), view.shape
    (True, (8, 4, 128, 64))
    >>> bool((view == np.reshape(np.reshape(x, (128, 32, 64)).transpose(1, 0, 2), (8, 4, 128, 64))).all())
    True
"""

from __future__ import annotations

import math

import numpy as np

from ember.backend.kept import owner

try:  # numba reads an array's address faster than NumPy's interface dict (strided)
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

Layout = list[list[tuple[int, int]]]  # per dim, its (size, stride) parts, outermost first


VIEW_OPS = frozenset(("float_reshape", "float_permute", "float_expand", "float_slice"))
"""The layout ops whose output views its input's memory (a reshape: where the strides allow)."""


def last_two_swapped(rank: int) -> tuple[int, ...]:
    """The permutation of ``rank`` dims that swaps the last two (a matrix transposed)."""
    return (*range(rank - 2), rank - 1, rank - 2)


def compose(array: np.ndarray, chain: list[tuple[str, tuple]]) -> np.ndarray | None:
    """``array`` after the chain's ``("reshape", shape)``, ``("permute", axes)`` and
    ``("slice", ((start, stop, step), ...))`` steps (NumPy's C-order semantics; a slice's
    ranges within their dims, steps positive), as a view of its memory, or None where the
    result has no single stride per dim (then the chain must copy)."""
    itemsize = array.itemsize
    layout: Layout = [[(n, s // itemsize)] for n, s in zip(array.shape, array.strides)]
    if any(s % itemsize or s < 0 for s in array.strides):
        return None
    offset = 0  # elements from the array's first one
    for kind, arg in chain:
        if kind == "slice":
            sliced = _slice(layout, arg)
            if sliced is None:
                return None
            layout, moved = sliced
            offset += moved
        elif kind == "permute":
            if sorted(arg) != list(range(len(layout))):
                return None
            layout = [layout[a] for a in arg]
        elif kind == "reshape":
            layout = _reshape(layout, tuple(arg))
            if layout is None:
                return None
        else:
            return None
    shape, strides = [], []
    for parts in layout:
        merged = _merge(parts)
        if merged is None:
            return None
        shape.append(merged[0])
        strides.append(merged[1] * itemsize)
    if 0 in shape:
        return None
    return strided(array, tuple(shape), tuple(strides), offset * itemsize, writeable=False)


def strided(array: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...],
            offset: int = 0, writeable: bool | None = None) -> np.ndarray:  # fmt: skip
    """A view of ``array``'s memory of ``shape`` and ``strides`` (bytes, none negative),
    starting ``offset`` bytes (a multiple of the itemsize) after its first element; as
    writeable as ``array`` unless ``writeable`` says otherwise (it cannot make a read-only
    array writeable).

    Made through the contiguous array that owns the memory where there is one (at
    :func:`byte_offset`), whose buffer NumPy checks the view against: 2.1-2.4 us a call
    warm, where NumPy's ``as_strided`` (the fallback) builds an interface dict and an array
    from it (4.1-5.7 us)."""
    if writeable is None or not array.flags.writeable:
        writeable = array.flags.writeable
    holder = owner(array)
    if holder.flags.c_contiguous:
        start = byte_offset(array, holder) + offset
        if start >= 0:
            try:
                view = np.ndarray(shape, array.dtype, holder, start, strides)
            except (TypeError, ValueError):  # past the holder's end, or its buffer refused
                view = None
            if view is not None and view.flags.writeable >= writeable:
                view.flags.writeable = writeable
                return view
    if offset:
        skip = offset // array.itemsize
        array = np.lib.stride_tricks.as_strided(array, (skip + 1,), (array.itemsize,),
                                                writeable=writeable)[skip:]  # fmt: skip
    return np.lib.stride_tricks.as_strided(array, shape, strides, writeable=writeable)


def read_only(array: np.ndarray, fresh: bool = False) -> np.ndarray:
    """``array`` typed read-only, for a kernel that only reads it: numba compiles a kernel
    for read-only and writable arrays apart (a step's inputs and imported constants are
    read-only, activations are not), and one type for both halves the compiles (on a
    clean clone, about 0.6 s each). ``fresh``: an array the caller has just made, which
    nobody else holds, is marked itself (0.15 us, where a new view costs 0.8)."""
    if array.flags.writeable:
        if not fresh:
            array = array.view()
        array.flags.writeable = False
    return array


def _interface_offset(array: np.ndarray, holder: np.ndarray) -> int:
    return array.__array_interface__["data"][0] - holder.__array_interface__["data"][0]


if numba is None:  # pragma: no cover - exercised where numba is missing
    byte_offset = _interface_offset
else:

    @numba.njit(cache=True, nogil=True)
    def byte_offset(array, holder):  # pragma: no cover - runs compiled
        """Bytes from ``holder``'s first element to ``array``'s (NumPy arrays): numba reads
        the two addresses in 0.4 us, NumPy's ``__array_interface__`` in 2.6 us each."""
        return array.ctypes.data - holder.ctypes.data


def _slice(layout: Layout, ranges: tuple) -> tuple[Layout, int] | None:
    """The layout narrowed to ``ranges`` and the elements its start moves by; None where a
    sliced dim has no single stride or a range is not a forward one within its dim."""
    if len(ranges) != len(layout):
        return None
    out, moved = [], 0
    for parts, (start, stop, step) in zip(layout, ranges):
        merged = _merge(parts)
        size = merged[0] if merged is not None else math.prod(n for n, _ in parts)
        if (start, stop, step) == (0, size, 1):
            out.append(parts)
            continue
        if merged is None or step < 1 or not 0 <= start < stop <= size:
            return None
        out.append([(len(range(start, stop, step)), merged[1] * step)])
        moved += start * merged[1]
    return out, moved


def _reshape(layout: Layout, shape: tuple[int, ...]) -> Layout | None:
    """The parts regrouped into ``shape`` (same element count), splitting a part where a new
    dim ends inside it; None where a split does not divide the part."""
    parts: list[tuple[int, int]] = []
    for n, s in (p for dim in layout for p in dim if p[0] != 1):
        if parts and parts[-1][1] == n * s:  # one run with the part before: merge
            parts[-1] = (parts[-1][0] * n, s)
        else:
            parts.append((n, s))
    if math.prod(n for n, _ in parts) != math.prod(shape):
        return None
    out: Layout = []
    for size in shape:
        dim: list[tuple[int, int]] = []
        need = size
        while need > 1:
            n, s = parts[0]
            if n <= need:
                if need % n:
                    return None
                dim.append(parts.pop(0))
                need //= n
            else:  # the dim ends inside this part: split it, outer piece here
                if n % need:
                    return None
                dim.append((need, s * (n // need)))
                parts[0] = (n // need, s)
                need = 1
        out.append(dim)
    return out


def _merge(parts: list[tuple[int, int]]) -> tuple[int, int] | None:
    """One ``(size, stride)`` for a dim's parts, or None where they are not one stride."""
    if not parts:
        return 1, 0
    size, stride = parts[-1]
    for n, s in reversed(parts[:-1]):
        if s != stride * size:
            return None
        size *= n
    return size, stride
