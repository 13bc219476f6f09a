"""Partial gradients: the gradient of a slice, kept as a piece and assembled once.

The gradient a slice sends to its source is zero outside the region it took. Made
into a zero tensor of the source's size for every slice, taking ``T`` pieces of one
tensor (every time step of a sequence, every gate block of fused gates) would cost
``T`` full-size tensors in the backward pass: quadratic in ``T``. Instead a rule
returns a :class:`Partial` (the piece and where it goes), the engine collects a
node's gradients in a :class:`Pending` sum, and :meth:`Accumulator.resolve` builds
the full gradient once, when the node's own rule needs it or the node is a leaf:

* pieces side by side along a dim become one ``cat`` (gaps are zeros), so splits,
  chunks and per-step slices cost one pass over the source;
* pieces that overlap add (the overlap is cut out of each and summed);
* pieces that differ from the source along several dims are placed dim by dim;
* strided pieces (``step > 1``) and few pieces on top of a full gradient are added
  into place with ``slice_assign``;
* full gradients (from any other rule) are added as they come, as before.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

# A (lo, hi) bound per dim: where a step-1 piece lies in the region being assembled.
Box = tuple[tuple[int, int], ...]
Ranges = tuple[tuple[int, int, int], ...]  # (start, stop, step) per leading dim


class Partial:
    """A gradient that is ``grad`` on the region ``ranges`` of a ``shape`` tensor, zero elsewhere.

    Args:
        grad: the gradient of the region (an inner primitive of the region's shape).
        ranges: normalized ``(start, stop, step)`` per leading dim, as the ``slice`` op takes.
        shape: the shape of the whole tensor.
    """

    __slots__ = ("grad", "ranges", "shape")

    def __init__(self, grad: Any, ranges: Ranges, shape: tuple[int, ...]) -> None:
        self.grad = grad
        self.ranges = ranges
        self.shape = shape

    def __repr__(self) -> str:
        return f"Partial(ranges={self.ranges}, shape={self.shape})"


class Pending:
    """The gradient of one node while the backward pass still adds to it: a full part
    (None until a full gradient arrives) and the partial pieces."""

    __slots__ = ("full", "parts", "shape")

    def __init__(self, shape: tuple[int, ...], full: Any, parts: list[Partial]) -> None:
        self.shape = shape
        self.full = full
        self.parts = parts


INCOMPLETE = (Partial, Pending)


class Accumulator:
    """How the engine adds gradients, with the inner backend's ops bound once.

    Args:
        inner: the backend whose primitives the gradients are.
    """

    __slots__ = ("_cat", "_device_of", "_dtype", "_full", "_slice", "_slice_assign", "add")

    def __init__(self, inner: Any) -> None:
        self.add = inner.float_add
        self._cat = inner.float_cat
        self._slice = inner.float_slice
        self._slice_assign = inner.float_slice_assign
        self._full = inner.float_full
        self._device_of = inner.device_of
        self._dtype = inner.dtype

    def merge(self, previous: Any, g: Any) -> Any:
        """The sum of two gradients of one node, either of which may be incomplete."""
        tp, partial = type(previous), type(g) is Partial
        if tp is Pending:
            if partial:
                previous.parts.append(g)
            else:
                previous.full = g if previous.full is None else self.add(previous.full, g)
            return previous
        if tp is Partial:
            if partial:
                return Pending(previous.shape, None, [previous, g])
            return Pending(previous.shape, g, [previous])
        if partial:
            return Pending(g.shape, previous, [g])
        return self.add(previous, g)

    def resolve(self, grad: Any) -> Any:
        """The complete gradient: ``grad`` itself unless it is a Partial or a Pending sum."""
        tp = type(grad)
        if tp is Partial:
            full, parts, shape = None, (grad,), grad.shape
        elif tp is Pending:
            full, parts, shape = grad.full, grad.parts, grad.shape
        else:
            return grad
        items: list[tuple[Box, Any]] = []
        into_place: list[Partial] = []  # added with slice_assign, one at a time
        for part in parts:
            box = _box(part.ranges, shape)
            if type(box) is tuple:
                items.append((box, part.grad))
            elif box == "strided":
                into_place.append(part)
            elif box == "whole":
                full = part.grad if full is None else self.add(full, part.grad)
            # an empty region adds nothing
        out = full
        if items:
            if out is not None and len(items) <= 2:
                # A copy of the full gradient per piece beats assembling the rest of it.
                into_place.extend(Partial(g, _ranges(box), shape) for box, g in items)
            else:
                built = self._assemble(shape, items, 0)
                out = built if out is None else self.add(out, built)
        for part in into_place:
            if out is None:
                out = self._slice_assign(self._zeros(shape, part.grad), part.grad, part.ranges)
            else:
                region = self.add(self._slice(out, part.ranges), part.grad)
                out = self._slice_assign(out, region, part.ranges)
        return self._zeros(shape, parts[0].grad) if out is None else out

    # ------------------------------------------------------------ assembly
    def _zeros(self, shape: tuple[int, ...], like: Any) -> Any:
        return self._full(shape, 0.0, self._device_of(like), self._dtype(like))

    def _assemble(self, shape: tuple[int, ...], items: list[tuple[Box, Any]], dim: int) -> Any:
        """The sum of ``items`` (step-1 pieces in a region of ``shape`` that every piece covers
        whole along the dims before ``dim``), built one dim at a time."""
        if len(items) == 1:
            box, g = items[0]
            if all(lo == 0 and hi == size for (lo, hi), size in zip(box, shape)):
                return g
            return self._slice_assign(self._zeros(shape, g), g, _ranges(box))
        rank = len(shape)
        while dim < rank and all(box[dim] == (0, shape[dim]) for box, _ in items):
            dim += 1
        if dim == rank:  # every piece covers the whole region
            total = items[0][1]
            for _, g in items[1:]:
                total = self.add(total, g)
            return total
        # Sweep along ``dim``: between two consecutive piece bounds the same pieces are present.
        items = sorted(items, key=lambda item: item[0][dim][0])
        bounds = sorted({0, shape[dim], *(b for box, _ in items for b in box[dim])})
        before = tuple((0, size, 1) for size in shape[:dim])
        parts, present, next_item = [], [], 0
        for lo, hi in pairwise(bounds):
            while next_item < len(items) and items[next_item][0][dim][0] <= lo:
                present.append(items[next_item])
                next_item += 1
            present = [item for item in present if item[0][dim][1] > lo]
            segment = (*shape[:dim], hi - lo, *shape[dim + 1 :])
            if not present:
                parts.append(self._zeros(segment, items[0][1]))
                continue
            inside = []
            for box, g in present:
                start, stop = box[dim]
                if start != lo or stop != hi:  # only part of this piece lies in the segment
                    g = self._slice(g, (*before, (lo - start, hi - start, 1)))
                inside.append(((*box[:dim], (0, hi - lo), *box[dim + 1 :]), g))
            parts.append(self._assemble(segment, inside, dim + 1))
        return parts[0] if len(parts) == 1 else self._cat(parts, dim)


def _ranges(box: Box) -> Ranges:
    return tuple((lo, hi, 1) for lo, hi in box)


def _box(ranges: Ranges, shape: tuple[int, ...]) -> Box | str:
    """Where a slice lies, as a step-1 box, or "whole", "empty" or "strided"."""
    box, whole = [], True
    for d, size in enumerate(shape):
        if d < len(ranges):
            start, stop, step = ranges[d]
            count = len(range(start, stop, step))
            if count == 0:
                return "empty"
            if count > 1 and step != 1:
                return "strided"
            lo, hi = start, start + count
        else:
            lo, hi = 0, size
        whole = whole and lo == 0 and hi == size
        box.append((lo, hi))
    return "whole" if whole else tuple(box)
