"""Handles: what a fusion device's tensors are before (and after) their op has run.

A :class:`Slot` is one recorded value: an id, its abstract value (shape and dtype, from the
op table's rules), the inner device, and, once its stream has run, the inner backend's
primitive. The user (the Tensor layer, an Autodiff above) holds a :class:`FusionTensor`,
a thin object pointing at the slot; the stream holds only slots. The slot keeps a weak
reference to its FusionTensor, so at execution time the stream knows which values someone
can still read (Burn's read-only / last use / dropped): a value whose handle is gone and
that no later record reads is an intermediate a fused kernel need not write out.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ember.backend.device import Device
from ember.tensor.dtype import DType

if TYPE_CHECKING:
    from ember.backends.fusion.stream import Stream

_ids = itertools.count()


class Slot:
    """One value of a stream. ``prim`` is None until the record that makes it has run;
    ``stream`` is the stream that will make it (None once made); ``origin`` stays that
    stream, and ``shared`` is set once a record of another stream reads the slot (its last
    use is then not this stream's to know). ``recycle``, when set (by the executor, on a
    fused block's output), is called with the slot when the slot itself is collected: then
    no handle, record or other slot can read the value through it."""

    __slots__ = ("__weakref__", "device", "dtype", "handle", "id", "origin", "prim", "recycle",
                 "shape", "shared", "stream")  # fmt: skip

    def __init__(self, shape: tuple[int, ...], dtype: DType, device: Device,
                 stream: Stream | None = None, prim: Any = None) -> None:  # fmt: skip
        self.id = next(_ids)
        self.shape = shape
        self.dtype = dtype
        self.device = device  # the inner backend's device
        self.stream = self.origin = stream
        self.shared = False
        self.prim = prim
        self.handle: weakref.ref | None = None
        self.recycle: Callable[[Slot], object] | None = None

    def __del__(self) -> None:
        if self.recycle is not None:
            self.recycle(self)

    @property
    def pending(self) -> bool:
        return self.prim is None

    def readable(self) -> bool:
        """Whether a user-held FusionTensor still points here."""
        return self.handle is not None and self.handle() is not None

    def __repr__(self) -> str:
        state = "pending" if self.pending else "ready"
        return f"Slot({self.id}, {list(self.shape)}, {self.dtype}, {state})"


class FusionTensor:
    """A fusion device's primitive: the user's handle on a :class:`Slot`."""

    __slots__ = ("__weakref__", "slot")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        slot.handle = weakref.ref(self)

    def __repr__(self) -> str:
        return f"FusionTensor({self.slot!r})"


def indices_fit(slots: list, attrs) -> bool:
    """Whether an indexed op (``backend.INDEXED``) may be recorded: its indices are made and
    all lie in ``[0, size)`` along its dim, so the inner kernel cannot fail on them.
    ``slots`` are the op's operands (the indexed value, the indices, maybe the values
    added), ``attrs[0]`` its dim. Reads the indices (a min and a max; on a GPU, a sync),
    as running the op at once would."""
    data, indices = slots[0], slots[1]
    if data is None or indices is None or indices.prim is None:
        return False
    if 0 in indices.shape:
        return True
    prim = indices.prim
    return bool(prim.min() >= 0) and bool(prim.max() < data.shape[attrs[0]])
