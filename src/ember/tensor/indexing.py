"""Python indexing syntax (``x[1:3, ..., None, -1]``) turned into ember ops.

A key is parsed against a shape into a plan: which dims to slice (with
normalized, positive-step ranges), which to flip (negative steps), which to
select with an index list, which to drop (integer indices) and where to insert
new unit dims (``None``). The Tensor layer then runs the plan with ``slice``,
``flip``, ``select`` and ``reshape``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.backend.errors import ArgumentError, EmberIndexError, fmt_shape


@dataclass
class IndexPlan:
    ranges: list[tuple[int, int, int]] = field(default_factory=list)  # one per input dim
    flips: list[int] = field(default_factory=list)  # input dims to reverse after slicing
    select: tuple[int, Any] | None = None  # (input dim, index tensor or list)
    out_shape: list[int] = field(default_factory=list)  # final shape (after drops and Nones)


def normalize_range(start: int | None, stop: int | None, step: int | None, size: int) -> tuple[int, int, int, bool]:
    """Python slice semantics for one dim: returns (start, stop, step > 0, flipped).

    A negative step is expressed as a positive-step slice followed by a flip, so
    backends only ever see forward ranges.
    """
    if step == 0:
        raise ArgumentError("slice step must not be zero")
    begin, end, stride = slice(start, stop, step).indices(size)
    if stride > 0:
        return begin, max(begin, end), stride, False
    count = len(range(begin, end, stride))
    if count == 0:
        return 0, 0, 1, False
    last = begin + (count - 1) * stride  # smallest index visited
    return last, begin + 1, -stride, True


def _in_bounds(index: int, dim: int, size: int) -> int:
    """``index`` (negative counts from the end) as a position in ``dim``; EmberIndexError outside."""
    if not -size <= index < size:
        raise EmberIndexError(f"index {index} is out of bounds for dim {dim} of size {size}")
    return index + size if index < 0 else index


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ArgumentError(f"an index list holds ints, got {value!r} of type {type(value).__name__}")
    return int(value)


def parse_key(key: Any, shape: tuple[int, ...], is_index_tensor) -> IndexPlan:
    """Plans ``tensor[key]`` for a tensor of ``shape``."""
    items = list(key) if isinstance(key, tuple) else [key]
    if sum(1 for it in items if it is Ellipsis) > 1:
        raise ArgumentError("an index can hold only one ellipsis (...)")
    consuming = sum(1 for it in items if it is not None and it is not Ellipsis)
    if consuming > len(shape):
        raise EmberIndexError(f"too many indices ({consuming}) for a tensor of shape {fmt_shape(shape)}")
    # Identity, not ``in`` / ``index``: those call ``==``, which is element-wise on an index tensor.
    at = next((i for i, it in enumerate(items) if it is Ellipsis), None)
    if at is not None:
        items[at : at + 1] = [slice(None)] * (len(shape) - consuming)
    else:
        items += [slice(None)] * (len(shape) - consuming)

    plan = IndexPlan()
    dim = 0
    for it in items:
        if it is None:
            plan.out_shape.append(1)
            continue
        size = shape[dim]
        if isinstance(it, bool):
            raise ArgumentError("a bool is not a valid index; use a Bool tensor with mask_where")
        if isinstance(it, int):
            i = _in_bounds(it, dim, size)
            plan.ranges.append((i, i + 1, 1))
        elif isinstance(it, slice):
            start, stop, step, flipped = normalize_range(it.start, it.stop, it.step, size)
            plan.ranges.append((start, stop, step))
            if flipped:
                plan.flips.append(dim)
            plan.out_shape.append(len(range(start, stop, step)))
        elif is_index_tensor(it) or isinstance(it, list):
            if plan.select is not None:
                raise ArgumentError("only one index list or Int tensor per index is supported")
            if isinstance(it, list):  # checked and made non-negative here; tensors are data
                it = [_in_bounds(_as_int(i), dim, size) for i in it]
            plan.select = (dim, it)
            plan.ranges.append((0, size, 1))
            plan.out_shape.append(-1)  # filled in once the index length is known
        else:
            raise ArgumentError(f"unsupported index {it!r} of type {type(it).__name__}")
        dim += 1
    return plan
