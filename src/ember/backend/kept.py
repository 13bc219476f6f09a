"""Values made once per set of live objects: a backend's prepared form of a constant.

A kernel may want a weight in a form of its own (PyTorch's packed int8 weight, a numba
kernel's panels, column sums). Backend primitives never change, so an object's identity
names its contents: :meth:`Kept.get` makes the form on first use and keeps it while the
objects live (weak references; an entry whose object died is dropped on the next call).

Example:
    >>> import numpy as np
    >>> from ember.backend.kept import Kept
    >>> kept, weight = Kept(), np.arange(6).reshape(2, 3)
    >>> sums = kept.get("column_sums", (weight,), lambda w: w.sum(0))
    >>> kept.get("column_sums", (weight,), lambda w: None) is sums   # made once
    True
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Kept", "immutable", "owner", "seal"]

# id -> array: buffers whose memory only ember's loaders reach, through them (see seal)
_sealed: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _none() -> None:
    return None


class Kept:
    """A cache of ``make(*objects, *args)`` keyed by ``what`` and the objects' identities."""

    def __init__(self) -> None:
        # (what, ids of its objects) -> (weak references to them, what was made of them)
        self.entries: dict[tuple, tuple[tuple, Any]] = {}
        self._dead: deque[tuple] = deque()  # keys whose objects died (see drop)
        self._lock = threading.Lock()

    def get(self, what: str, objects: tuple, make: Callable, *args: Any) -> Any:
        """``make(*objects, *args)``, made once and kept while ``objects`` live (a None among
        them stands for itself)."""
        key = (what, *map(id, objects))
        with self._lock:
            while self._dead:
                dead = self._dead.popleft()
                entry = self.entries.get(dead)
                if entry is not None and any(r is not _none and r() is None for r in entry[0]):
                    del self.entries[dead]  # not a later entry that reuses the ids
            hit = self.entries.get(key)
            if hit is not None and all(r() is o for r, o in zip(hit[0], objects)):
                return hit[1]
        made = make(*objects, *args)
        dead = self._dead

        def drop(_ref, key=key) -> None:
            # A weak-reference callback may run inside this cache's own locked work (the
            # garbage collector runs anywhere): it takes no lock, the next call purges.
            dead.append(key)

        refs = tuple(_none if o is None else weakref.ref(o, drop) for o in objects)
        with self._lock:
            self.entries[key] = (refs, made)
        return made


def immutable(array: Any) -> bool:
    """Whether a NumPy ``array`` and every array it views are read-only, through read-only
    memoryviews, down to memory that owns itself, to ``bytes`` or to a :func:`seal`-ed
    buffer (loaded records and imported models are): nothing can change its values, so a
    form made of them may be kept (:class:`Kept`)."""
    import numpy as np

    base = array
    while True:
        if type(base) is memoryview:
            if not base.readonly:
                return False
            base = base.obj
        elif type(base) is np.ndarray:
            if base.flags.writeable:
                return False
            if _sealed.get(id(base)) is base:
                return True
            base = base.base
        else:
            return base is None or type(base) is bytes


def seal(array: Any) -> Any:
    """Makes ``array`` and the arrays it views read-only and marks their memory as reachable
    only through them, so that :func:`immutable` holds for every read-only array that views
    it, whatever memory lies below (a loader's private ``bytearray`` or anonymous map).
    For a buffer a loader made and filled itself and hands out only as read-only views;
    returns ``array``."""
    root = owner(array)  # NumPy points a view's view at the last array: mark that one
    array.flags.writeable = root.flags.writeable = False
    _sealed[id(root)] = root
    return array


def owner(array: Any) -> Any:
    """The last NumPy array of the chain ``array`` views (the one that owns its memory, or
    views ``bytes``): an object that lives as long as the memory, for :class:`Kept` keys
    that name a view (``Wᵀ`` made anew on each call) by its owner and geometry."""
    import numpy as np

    while type(array.base) is np.ndarray:
        array = array.base
    return array
